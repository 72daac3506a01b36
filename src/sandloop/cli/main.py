"""The ``sandloop`` entry point: the script, ``python -m sandloop`` and this module's ``-m``.

The whole command line (``cli/commands.py``: typer and every command's options) is imported
only when it is needed: ``sandloop --help`` (``cli/root_help.py``), ``--version`` and a plain
``sandloop exec`` line (``cli/exec_one.py``) run without it, for a start-up in a blink, and the
script (:func:`script`) ends those without the interpreter's tear-down. ``app`` is importable
from here, as it always was.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any, NoReturn

__all__ = ["main", "script"]  # and `app`, loaded on demand (__getattr__)

# Set by the paths of main() that hold nothing when they return (help, version, a plain exec:
# its pool closed, its event loop and executor shut down; at most a daemon thread finishing an
# import is left): script() may then skip the tear-down.
_released = False


def main() -> None:  # pragma: no cover - console entry point
    """Run the command line in ``sys.argv``: exit codes 0-3 (``SystemExit``), never a
    traceback."""
    global _released
    from sandloop.cli.exits import guarded

    if sys.argv[1:] == ["--version"]:  # as the root's eager --version callback prints it
        from sandloop import __version__

        print(f"sandloop {__version__}")
        _released = True
        sys.exit(0)
    if sys.argv[1:] == ["--help"]:
        from sandloop.cli.root_help import print_root_help

        def root_help() -> int:
            print_root_help()
            return 0

        code = guarded(root_help)
        _released = True
        sys.exit(code)
    from sandloop.cli.exec_one import parse_plain

    plain = parse_plain(sys.argv[1:])
    if plain is not None:
        from sandloop.cli.exec_one import run_plain

        code = guarded(lambda: run_plain(plain))
        _released = True
        sys.exit(code)
    from sandloop.cli.commands import app
    from sandloop.cli.exits import run_guarded

    sys.exit(run_guarded(app))


def script() -> NoReturn:  # pragma: no cover - console entry point
    """The ``sandloop`` script and ``python -m sandloop``: :func:`main`, and where it released
    everything it held, an exit without the interpreter's tear-down.

    Why: freeing every module and object of a process that imported pydantic and the sandbox
    takes ~40 ms here, more than a plain ``exec``'s run; nothing of it is observable (no file,
    process or lock is left: the paths that set ``_released`` closed theirs). Output is flushed
    first, with a reader that has gone treated as everywhere else (exit 0, quietly).
    """
    code: str | int | None = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    if not _released:
        sys.exit(code)  # as main() ended it, the interpreter's tear-down included
    from sandloop.cli.exits import guarded

    def flushed() -> int:
        sys.stdout.flush()
        return code if isinstance(code, int) else (0 if code is None else 1)

    final = guarded(flushed)
    with contextlib.suppress(OSError, ValueError):  # nowhere left to report it
        sys.stderr.flush()
    os._exit(final)


def __getattr__(name: str) -> Any:
    # ``from sandloop.cli.main import app`` (tests, embedding tools): the typer app, on demand.
    if name == "app":
        return getattr(importlib.import_module("sandloop.cli.commands"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    script()
