"""The interface the sandbox uses to run programs in a built environment.

An :class:`Environment` is everything a slot needs, and nothing about how it was built: the
host directory holding the read-only tree (``root``), where that tree appears inside the sandbox
(``mount_point``, always ``/opt/env``: a neutral path, never the host's), the interpreter to run
Python with (a path inside the sandbox), the modules its zygotes preload, and the variables every
run gets (determinism settings first). See docs/environments.md, "Mounting an environment".
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sandloop.envs.spec import Determinism

MOUNT_POINT = "/opt/env"
PYTHON_DIR = "python"  # the interpreter's prefix under the tree: /opt/env/python
NODE_DIR = "node"


@dataclass(frozen=True)
class Mount:
    """Bind ``source`` (a host directory) read-only, nosuid, nodev at ``target`` in the
    sandbox."""

    source: Path
    target: str


@dataclass(frozen=True)
class Environment:
    """A built environment, as the sandbox sees it."""

    id: str
    name: str
    root: Path
    python: str | None
    preload: tuple[str, ...] = ()
    determinism: Determinism = field(default_factory=Determinism)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = ()
    mount_point: str = MOUNT_POINT

    @property
    def short_id(self) -> str:
        return self.id[:12]

    @property
    def host_python(self) -> Path | None:
        """The interpreter's file on the host (to run it outside a sandbox: build checks,
        tests). Inside a sandbox, use :attr:`python`."""
        if self.python is None:
            return None
        return self.root / Path(self.python).relative_to(self.mount_point)

    def mounts(self) -> tuple[Mount, ...]:
        """What the sandbox binds, in order. Only the tree: the host's /usr (system
        libraries, compilers) stays bound as it is today."""
        return (Mount(self.root, self.mount_point),)

    def env_vars(self, hash_seed: int | None = None) -> dict[str, str]:
        """Variables for every run in this environment, on top of the sandbox's own (PATH,
        HOME, ...): the spec's [env], then the determinism settings (which win).
        ``hash_seed`` overrides the spec's PYTHONHASHSEED (a seed per task)."""
        return {**self.extra_env, **self.determinism.env_vars(hash_seed)}

    def missing_modules(self, modules: Sequence[str]) -> list[str]:
        """The ``modules`` that this environment's interpreter cannot find: the ones a sandboxed
        program (or a slot's preload) could not import. Asked of the tree's interpreter run
        isolated (``-I``, a clean environment), never of the supervisor's, whose virtualenv
        the sandbox does not see. An environment without Python has none of them."""
        exe = self.host_python
        if exe is None:
            return list(modules)
        probe = ("import importlib.util, json, sys\n"
                 "def found(m):\n"
                 "    try:\n"
                 "        return importlib.util.find_spec(m) is not None\n"
                 "    except (ImportError, ValueError):\n"
                 "        return False\n"
                 "print(json.dumps([m for m in sys.argv[1:] if not found(m)]))")
        r = subprocess.run([str(exe), "-I", "-c", probe, *modules], capture_output=True,
                           text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
        if r.returncode != 0:
            raise OSError(f"the interpreter of environment {self.name} ({exe}) does not start: "
                          f"{r.stderr.strip()[-500:]}")
        missing: list[str] = json.loads(r.stdout)
        return missing

    def search_path(self, host_path: str) -> str:
        """PATH inside the sandbox: the environment's bin directories, then ``host_path``
        (so ``python3`` in a shell run is the environment's)."""
        return ":".join([*self.path, host_path])
