"""The ``sandloop`` entry point: the script, ``python -m sandloop`` and this module's ``-m``.

The whole command line (``cli/commands.py``: typer and every command's options) is imported
only when it is needed: ``sandloop --help`` (``cli/root_help.py``), ``--version`` and a plain
``sandloop exec`` line (``cli/exec_one.py``) run without it, for a start-up in a blink. ``app`` is importable from here, as it always was.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["main"]  # and `app`, loaded on demand (__getattr__)


def main() -> None:  # pragma: no cover - console entry point
    """The ``sandloop`` script and ``python -m sandloop``: exit codes 0-3, never a traceback."""
    from sandloop.cli.exits import guarded

    if sys.argv[1:] == ["--version"]:  # as the root's eager --version callback prints it
        from sandloop import __version__

        print(f"sandloop {__version__}")
        sys.exit(0)
    if sys.argv[1:] == ["--help"]:
        from sandloop.cli.root_help import print_root_help

        def root_help() -> int:
            print_root_help()
            return 0

        sys.exit(guarded(root_help))
    from sandloop.cli.exec_one import parse_plain

    plain = parse_plain(sys.argv[1:])
    if plain is not None:
        from sandloop.cli.exec_one import run_plain

        sys.exit(guarded(lambda: run_plain(plain)))
    from sandloop.cli.commands import app
    from sandloop.cli.exits import run_guarded

    sys.exit(run_guarded(app))


def __getattr__(name: str) -> Any:
    # ``from sandloop.cli.main import app`` (tests, embedding tools): the typer app, on demand.
    if name == "app":
        return getattr(importlib.import_module("sandloop.cli.commands"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    main()
