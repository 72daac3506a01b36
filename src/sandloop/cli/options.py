"""Options shared by several ``sandloop`` commands, each with its range checked where it is parsed.

A value out of range is a usage error (exit 2) naming the option, before any work starts; nothing
here imports the engine or the sandbox, so ``sandloop --help`` stays fast.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "Db",
    "MemoryMb",
    "NoIsolation",
    "Out",
    "Preload",
    "Slots",
    "TimeLimit",
    "check_out_path",
    "positive",
]

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def positive(value: float | None) -> float | None:
    """Callback: a number that must be > 0 (click's ranges cannot exclude their bound)."""
    if value is not None and not value > 0:  # also refuses NaN
        raise typer.BadParameter(f"must be > 0, got {value}")
    return value


def check_preload(modules: list[str] | None) -> list[str] | None:
    """Callback: every ``--preload`` module must be importable by the interpreter that runs
    Python programs, the default ``python`` environment's (not sandloop's own, whose
    virtualenv the sandbox does not see): else every slot would fail to start, which would
    surface as sandbox errors on every run."""
    if not modules:
        return modules
    for m in modules:
        if not _MODULE.fullmatch(m):
            raise typer.BadParameter(f"{m!r} is not a module name (like unittest or numpy.linalg)")
    from sandloop.envs import EnvStore
    from sandloop.errors import EnvError

    try:
        env = EnvStore().ensure("python").environment()
        missing = env.missing_modules(modules)
    except (EnvError, OSError, subprocess.SubprocessError) as e:
        raise typer.BadParameter(f"cannot check the modules in the python environment: {e}"
                                 ) from None
    if missing:
        raise typer.BadParameter(f"{', '.join(missing)}: no such module in the python "
                                 "environment (docs/environments.md: add it to a spec's "
                                 "[python] packages)")
    return modules


def check_out_path(path: Path | None) -> Path | None:
    """Callback: an output file must be creatable *before* the work starts, so that a typo in
    ``--out`` is not found after an hour of scoring. Creates missing parent directories."""
    if path is None or str(path) == "-":
        return path
    if path.is_dir():
        raise typer.BadParameter(f"{path} is a directory; name a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # The file is written as a temp file in its directory, then renamed over: try exactly
        # that (an existing read-only file can still be replaced if the directory is writable).
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise typer.BadParameter(f"cannot write {path}: {e.strerror or e}") from None
    return path


RayAddress = Annotated[
    str | None,
    typer.Option("--ray", metavar="ADDRESS",
                 help="Run on the Ray cluster whose head is at HOST:PORT (pip install "
                      "'sandloop[ray]'; docs/cluster.md)."),
]
NoIsolation = Annotated[
    bool,
    typer.Option("--no-isolation",
                 help="Explicit opt-out: run WITHOUT isolation (only for hosts that cannot "
                      "isolate and code you trust). Results say isolation='none'."),
]
Preload = Annotated[
    list[str] | None,
    typer.Option("--preload", callback=check_preload,
                 help="Also keep MODULE imported in every slot, e.g. unittest for "
                      "unittest-based suites (repeatable; it must be importable)."),
]
Slots = Annotated[
    int | None,
    typer.Option("--slots", min=1, max=4096,
                 help="Parallel slots; default: the config file's, else cores."),
]
TimeLimit = Annotated[
    float, typer.Option("--time-limit", callback=positive, help="Wall-clock seconds (> 0).")]
MemoryMb = Annotated[int, typer.Option("--memory-mb", min=1, help="Memory + swap, MiB.")]
Db = Annotated[
    Path | None,
    typer.Option("--db", dir_okay=False,
                 help="Result store; default $SANDLOOP_DB, the config's db, else one per "
                      "project in ~/.cache/sandloop/projects/."),
]
Out = Annotated[
    Path | None,
    typer.Option("--out", callback=check_out_path, dir_okay=False,
                 help="Write one result line per completion (checked writable first)."),
]
