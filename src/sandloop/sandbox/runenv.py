"""What a run sees of its environment: the variables of each run and the zygote's start.

An environment (``sandloop.envs.Environment``) is mounted at ``/opt/env`` by the zygote
(``ZygoteConfig.mounts``), which then re-executes itself on the environment's interpreter there
(``ZygoteConfig.exec``). This module says with which variables: the sandbox's own
(``languages.sandbox_env``), the environment's (its ``[env]``, then its determinism settings,
which win), and ``PATH`` with the environment's bin directories first, so that ``python3`` in
a shell run is the environment's. docs/environments.md, "Mounting an environment".
"""

from __future__ import annotations

import asyncio
import logging
import posixpath

from sandloop.envs import BUILTIN_LANGUAGES, EnvInfo, Environment, EnvStore
from sandloop.errors import EnvError
from sandloop.sandbox.languages import HOST_PATH, TOOLS_DIR, sandbox_env
from sandloop.sandbox.zygote import BOOTSTRAP, MODULES

logger = logging.getLogger(__name__)


def run_env(language: str, environment: Environment | None) -> dict[str, str]:
    """The whole environment of a ``language`` run in ``environment`` (None: the sandbox's
    own, as runs without an environment had)."""
    env = sandbox_env(language)
    if environment is None:
        return env
    env.update(environment.env_vars())
    env["PATH"] = f"{TOOLS_DIR}:{environment.search_path(HOST_PATH)}"
    return env


def zygote_config(environment: Environment) -> dict[str, object]:
    """The ``ZygoteConfig`` keys that start a slot's zygote on ``environment``'s interpreter.

    Its variables are a Python run's (so a run's child changes none of them), PYTHONHASHSEED
    among them: the hash secret is fixed when the interpreter starts, so every slot and every
    run shares the environment's seed. LD_BIND_NOW (dropped again by the zygote) resolves the
    interpreter's symbols once, not lazily in every child.

    LD_LIBRARY_PATH (dropped too) names the interpreter's own lib directory: its binary finds
    libpython through ``$ORIGIN/../lib``, which the dynamic linker resolves by reading
    /proc/self/exe, and the zygote's root has no /proc (each child mounts its own). Without it
    the linker fell back to its cache and loaded the host's /usr/lib libpython (another patch
    release, with its own frozen ``site``) under the environment's standard library."""
    if environment.python is None:
        raise ValueError(f"environment {environment.name} has no Python interpreter")
    lib = posixpath.join(posixpath.dirname(posixpath.dirname(environment.python)), "lib")
    return {
        "python": environment.python,
        "mounts": [[str(m.source), m.target] for m in environment.mounts()],
        "exec": environment.python,
        "exec_env": {**run_env("python", environment), "LD_BIND_NOW": "1",
                     "LD_LIBRARY_PATH": lib},
        "bootstrap": BOOTSTRAP,
        "modules": [[name, rel] for name, rel in MODULES if rel is not None],
    }


class EnvResolver:
    """Names and ids of environments to built ones (``EnvStore.ensure``: a built-in is built
    from the host on first use), each looked up once per pool: runs then cost a dict lookup."""

    def __init__(self, store: EnvStore | None = None) -> None:
        self._store = store
        self._infos: dict[str, EnvInfo] = {}
        self._envs: dict[str, Environment] = {}  # by id
        self._builtin: dict[str, str | None] = {}

    @property
    def store(self) -> EnvStore:
        if self._store is None:
            self._store = EnvStore()
        return self._store

    async def info(self, ref: str) -> EnvInfo:
        """The environment ``ref`` names (EnvNotFound, EnvBuildError)."""
        got = self._infos.get(ref)
        if got is None:
            got = await asyncio.get_running_loop().run_in_executor(None, self.store.ensure, ref)
            self._infos[ref] = got
        return got

    def environment(self, info: EnvInfo) -> Environment:
        """``info.environment()``, made once per id."""
        env = self._envs.get(info.id)
        if env is None:
            env = self._envs[info.id] = info.environment()
        return env

    async def builtin_id(self, language: str) -> str | None:
        """The id of ``language``'s built-in environment (recorded by its runs), or None when
        it cannot be built here (the run itself does not need it: its toolchain is /usr)."""
        if language in self._builtin:
            return self._builtin[language]
        env_id: str | None = None
        if language in BUILTIN_LANGUAGES:
            try:
                env_id = (await self.info(language)).id
            except EnvError as e:
                logger.debug("built-in environment %s unavailable: %s", language, e)
        self._builtin[language] = env_id
        return env_id
