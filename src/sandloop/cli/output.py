"""How the CLI talks to the user on stderr: verbosity (``--quiet`` / ``--verbose``) and progress.

Progress is shown wherever work is long: on a terminal a bar with the rate and the time left; in a
log (no TTY) a plain line every ``interval_s`` seconds, even while nothing finishes, so a long run
is never silent. ``--quiet`` turns both off (errors are still printed).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

__all__ = ["DEFAULT_INTERVAL_S", "Progress", "State", "info", "results_stdout", "state"]

DEFAULT_INTERVAL_S = 10.0


@dataclass
class State:
    """Process-wide verbosity, set once by the top-level ``--quiet`` / ``--verbose`` options."""

    quiet: bool = False
    verbose: bool = False


state = State()


def info(message: str) -> None:
    """A note on stderr (not an error): hidden by ``--quiet``."""
    if not state.quiet:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """Counts finished items of ``total``; use as a context manager and call :meth:`advance`.

    ``tty``: None decides from ``stream.isatty()``. Not thread-safe for ``advance`` from several
    threads (the CLI calls it from its one event loop).
    """

    def __init__(self, what: str, total: int, *, interval_s: float = DEFAULT_INTERVAL_S,
                 stream: TextIO | None = None, tty: bool | None = None,
                 enabled: bool | None = None) -> None:
        self.what, self.total, self.interval_s = what, total, interval_s
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.enabled = (not state.quiet) if enabled is None else enabled
        self.done = 0
        self.started = time.monotonic()
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._ticks = 0

    def line(self) -> str:
        """The plain status line: ``scoring: 120/164 (73%), 41.2/s, ETA 0:00:01``."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        pct = 100 * self.done // self.total if self.total else 100
        eta = _clock((self.total - self.done) / rate) if rate > 0 else "?"
        return (f"{self.what}: {self.done}/{self.total} ({pct}%), {rate:.1f}/s, ETA {eta}, "
                f"elapsed {_clock(elapsed)}")

    def __enter__(self) -> Progress:
        self.started = time.monotonic()
        if not self.enabled or self.total == 0:
            return self
        if self.tty:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn(self.what), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(file=self.stream), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.what, total=self.total, rate="")
        else:
            self._ticker = threading.Thread(target=self._tick, name="sandloop-progress",
                                            daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._ticks += 1
            self._write(self.line())

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed log must not fail the work
            pass

    def advance(self, n: int = 1) -> None:
        """``n`` more items are finished."""
        self.done += n
        if self._bar is not None and self._task is not None:
            elapsed = max(time.monotonic() - self.started, 1e-9)
            self._bar.update(self._task, advance=n, rate=f"{self.done / elapsed:.1f}/s")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(exc_type, exc, tb)
            self._bar = None
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
            # A log that got progress lines gets the last one too, without waiting for the next
            # tick (a short run stays quiet).
            elapsed = time.monotonic() - self.started
            if self._ticks or exc_type is not None:
                    self._write(f"{self.what}: {self.done}/{self.total} in {elapsed:.1f} s"
                            + (" (interrupted)" if exc_type is not None else ""))


@contextlib.contextmanager
def results_stdout(on_ray: bool) -> Iterator[TextIO]:
    """Yield the stream a command's results go to (stdout).

    On Ray, ``sys.stdout`` points at stderr meanwhile: Ray's driver prints cluster events ("the
    node ... has been marked dead", raylet log tails) with ``print`` to ``sys.stdout`` whatever
    ``log_to_driver`` says, and stdout must carry the results only.
    """
    real = sys.stdout
    if not on_ray:
        yield real
        return
    sys.stdout = sys.stderr
    try:
        yield real
    finally:
        sys.stdout = real
