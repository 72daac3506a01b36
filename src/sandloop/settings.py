"""Defaults a project sets once: ``sandloop.toml`` or ``[tool.sandloop]`` in ``pyproject.toml``.

Looked up from the working directory upwards; the first directory holding ``sandloop.toml``, or a
``pyproject.toml`` with a ``[tool.sandloop]`` table, is the project. ``SANDLOOP_*`` environment
variables override the file, and command-line options override both::

    # sandloop.toml
    db = ".sandloop/results.db"     # the result store (relative paths: to this file's directory)
    slots = 8                       # parallel slots of exec-batch / score (default: cores)
    max_time_s = 300                # the most one run may ask for, wall seconds
    max_memory_mb = 8192            # the most one run may ask for, MiB
    max_batch = 1024                # the most programs in one request (serve)
    progress_interval_s = 10        # a progress line this often when stderr is not a terminal

A bad file is an :class:`~sandloop.errors.InputError` naming the file, the field and the problem.
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandloop.errors import InputError

__all__ = ["ConfigError", "Settings", "default_db_path", "find_config", "load_settings",
           "project_root"]


class ConfigError(InputError):
    """A config file (sandloop.toml, [tool.sandloop]) or a SANDLOOP_* variable is invalid."""


class Settings(BaseModel):
    """Project defaults (see the module docstring for the file format); :func:`load_settings`
    reads them from the config file and the ``SANDLOOP_*`` variables."""

    # A plain model, not pydantic-settings' BaseSettings: importing that cost every command
    # ~50 ms of start-up, for the one thing load_settings does below (read SANDLOOP_*).
    model_config = ConfigDict(extra="forbid", frozen=True)

    db: Path | None = Field(None, description="result store; default: per project in the cache")
    slots: int | None = Field(None, ge=1, le=4096, description="parallel slots; default: cores")
    max_time_s: float = Field(300.0, gt=0, le=86400, description="the most one run may ask")
    max_memory_mb: int = Field(8192, ge=1, le=1 << 22, description="the most one run may ask")
    max_batch: int = Field(1024, ge=1, le=1 << 20, description="programs per request (serve)")
    progress_interval_s: float = Field(10.0, gt=0, le=3600,
                                       description="plain progress lines this often (no TTY)")


def find_config(start: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The nearest config file from ``start`` (default: the working directory) upwards and its
    table, or None. Raises :class:`ConfigError` for a file that is not valid TOML."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        for name in ("sandloop.toml", "pyproject.toml"):
            f = d / name
            if not f.is_file():
                continue
            try:
                data = tomllib.loads(f.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
                raise ConfigError(f"{f}: cannot read it as TOML: {e}") from None
            if name == "sandloop.toml":
                return f, data
            table = data.get("tool", {}).get("sandloop")
            if isinstance(table, dict):
                return f, table
    return None


def project_root(start: Path | None = None) -> Path:
    """The project a command runs in: the directory of the nearest config file, else of the
    nearest ``.git``, else the working directory."""
    here = (start or Path.cwd()).resolve()
    found = find_config(here)
    if found is not None:
        return found[0].parent
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d
    return here


def load_settings(start: Path | None = None) -> Settings:
    """The project's settings: config file, then ``SANDLOOP_*`` variables over it."""
    found = find_config(start)
    table: dict[str, Any] = dict(found[1]) if found else {}
    where = str(found[0]) if found else "SANDLOOP_* environment"
    if found and isinstance(table.get("db"), str):
        table["db"] = found[0].parent / table["db"]
    # Environment over file: a SANDLOOP_<FIELD> variable (any case, as pydantic-settings read
    # them) wins over the file's key unless it is empty.
    env = _environment()
    env_set = {k for k, v in env.items() if v}
    try:
        return Settings(**{**env, **{k: v for k, v in table.items() if k not in env_set}})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in d['loc']) or '(table)'}: {d['msg']}"
                             for d in e.errors()[:3])
        raise ConfigError(f"{where}: {problems}") from None


def _environment() -> dict[str, str]:
    """The ``SANDLOOP_<FIELD>`` variables that name a setting, by field name."""
    fields = {f"sandloop_{name}": name for name in Settings.model_fields}
    return {fields[k.lower()]: v for k, v in os.environ.items() if k.lower() in fields}


def default_db_path(settings: Settings | None = None, start: Path | None = None) -> Path:
    """Where results are stored unless ``--db`` says: ``$SANDLOOP_DB`` or the config's ``db``,
    else one store per project under the user's cache,
    ``$XDG_CACHE_HOME/sandloop/projects/<project dir name>-<hash of its path>/results.db``.

    Per project, so that two projects (or two clones) never share results or lock each other,
    and outside the project's tree, so that nothing has to be git-ignored.
    """
    s = settings if settings is not None else load_settings(start)
    if s.db is not None:
        return s.db
    root = project_root(start)
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sandloop" / "projects" / f"{root.name or 'root'}-{tag}" / "results.db"
