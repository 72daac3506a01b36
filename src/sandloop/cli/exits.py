"""Exit codes of every ``sandloop`` command, and how whatever escapes a command becomes one.

A script or CI job running sandloop tells outcomes apart by the exit code alone:

====  =====================================================================================
0     the work was done (a low reward or a failing program in a batch is a result, not an error)
1     the work itself found failures (``exec``: the program failed; ``tasks validate``: rejects)
2     bad input: an option, a file, a record, a config file; nothing or only the good part ran
3     infrastructure: the sandbox, the store or the host failed (``sandbox_error``, null rewards)
====  =====================================================================================

Every error is one line on stderr naming the input, the field and the problem; ``--verbose``
adds the traceback for errors that are sandloop's own fault. A command whose stdout's reader
goes away (``sandloop tasks list humaneval | head -1``) stops quietly with 0: the reader had
what it wanted.
"""

from __future__ import annotations

import os
import select
import sys
import traceback
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from sandloop.errors import InputError, SandloopError

if TYPE_CHECKING:
    import typer

__all__ = ["ExitCode", "guarded", "one_line", "print_error", "run_guarded"]


class ExitCode(IntEnum):
    """The four outcomes a ``sandloop`` command can end with."""

    OK = 0
    FAILURES = 1
    BAD_INPUT = 2
    INFRASTRUCTURE = 3


def one_line(text: object) -> str:
    """``text`` on one line: a multi-line message (pydantic's, say) joined with '; '."""
    parts = [p.strip() for p in str(text).splitlines() if p.strip()]
    return "; ".join(parts)


def print_error(message: object) -> None:
    """The one error line every command prints: ``sandloop: error: <message>`` on stderr,
    ``message`` joined onto one line (no markup: a path with brackets stays as it is)."""
    sys.stderr.write(f"sandloop: error: {one_line(message)}\n")
    sys.stderr.flush()


def _stdout_id() -> tuple[int, int] | None:
    try:
        st = os.fstat(sys.__stdout__.fileno())  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError):
        return None
    return st.st_dev, st.st_ino


def stdout_closed(before: tuple[int, int] | None = None) -> bool:
    """Whether stdout's reader has gone: a pipe whose reader closed it (poll reports an error
    on the write end), or — ``before`` being what stdout was when the command started — a
    stdout that has been swapped for /dev/null since (rich does that on a broken pipe, then
    exits 1). A BrokenPipeError, or an exit 1 after one, then means ``| head`` had enough,
    not that anything failed."""
    try:
        p = select.poll()
        p.register(sys.__stdout__.fileno(), select.POLLOUT)  # type: ignore[union-attr]
        if any(ev & select.POLLERR for _, ev in p.poll(0)):
            return True
        null = os.stat(os.devnull)
    except (OSError, ValueError, AttributeError):
        return False
    now = _stdout_id()
    return before is not None and now != before and now == (null.st_dev, null.st_ino)


def _reader_gone() -> int:
    # Nothing more reaches stdout (the interpreter's own flush at exit would raise again).
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())  # type: ignore[union-attr]
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return ExitCode.OK


def _click_exceptions() -> Any:
    """click's exception classes as typer raises them: typer >= 0.20 vendors its own click."""
    import importlib

    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # an older typer on the real click
        return importlib.import_module("click.exceptions")


def run_guarded(app: typer.Typer, argv: Sequence[str] | None = None) -> int:
    """Run ``app`` and return its exit code; nothing escapes as a traceback.

    Usage errors (click's) and :class:`~sandloop.errors.InputError` are 2; other sandloop
    errors and OS errors are 3 (something underneath failed); anything else is a bug in
    sandloop, reported in one line (with the traceback under ``--verbose``) and exit 3.
    """
    import typer

    click = _click_exceptions()

    args = list(sys.argv[1:] if argv is None else argv)
    stdout_was = _stdout_id()

    def invoke() -> int:
        try:
            rv = app(args=args, prog_name="sandloop", standalone_mode=False)
        except click.NoArgsIsHelpError as e:
            e.show()
            return ExitCode.BAD_INPUT
        except click.ClickException as e:
            where = e.ctx.command_path if isinstance(e, click.UsageError) and e.ctx else "sandloop"
            print_error(f"{e.format_message()} (see '{where} --help')")
            return e.exit_code if e.exit_code in (1, 2) else ExitCode.BAD_INPUT
        except typer.Abort:
            print_error("aborted")
            return 130
        except SystemExit as e:  # typer and rich turn a broken pipe into exit 1 themselves
            if e.code == 1 and stdout_closed(stdout_was):
                return _reader_gone()
            raise
        return int(rv) if isinstance(rv, int) else ExitCode.OK

    return guarded(invoke)


def guarded(work: Callable[[], int]) -> int:
    """``work()``'s exit code, or the one for what escaped it (see :func:`run_guarded`)."""
    from sandloop.cli import output

    try:
        return work()
    except BrokenPipeError:
        if stdout_closed():
            return _reader_gone()
        print_error("BrokenPipeError: a pipe sandloop was writing to closed")
        return ExitCode.INFRASTRUCTURE
    except (InputError, UnicodeDecodeError) as e:
        # Raised by a command that did not catch its own input error: still the caller's input.
        print_error(str(e))
        if output.state.verbose:
            traceback.print_exc()
        return ExitCode.BAD_INPUT
    except (SandloopError, OSError) as e:
        print_error(f"{type(e).__name__}: {e}")
        if output.state.verbose:
            traceback.print_exc()
        return ExitCode.INFRASTRUCTURE
    except Exception as e:
        print_error(f"internal error {type(e).__name__}: {e} (a bug in sandloop; --verbose shows "
             "the traceback to report)")
        if output.state.verbose:
            traceback.print_exc()
        return ExitCode.INFRASTRUCTURE
