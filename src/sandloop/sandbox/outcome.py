"""Turning what the supervisor observed into an ExecResult status (pure functions).

Order matters: the infrastructure's failures first (never blamed on the program), then what the
supervisor itself did (killed for wall time, CPU or output), then what the kernel reported
(OOM kill), then the program's own exit.
"""

from __future__ import annotations

import os
import signal as signal_module

from sandloop.sandbox.models import ExecResult, Status
from sandloop.sandbox.protocol import Isolation
from sandloop.sandbox.slot import StepOutcome


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def classify(o: StepOutcome, *, cpu_limit_s: float, isolation: Isolation,
             environment: str | None = None) -> ExecResult:
    exit_code: int | None = None
    sig: int | None = None
    if o.wait_status is not None:
        if os.WIFSIGNALED(o.wait_status):
            sig = os.WTERMSIG(o.wait_status)
        elif os.WIFEXITED(o.wait_status):
            exit_code = os.WEXITSTATUS(o.wait_status)
    stats = o.stats
    cpu = stats.cpu_s if stats else o.rusage.get("utime", 0.0) + o.rusage.get("stime", 0.0)
    peak = (stats.peak_memory_bytes if stats else int(o.rusage.get("maxrss_kb", 0)) * 1024) / (1 << 20)

    stderr = _text(o.stderr)
    if o.infra_error is not None or o.setup_error is not None:
        status = Status.SANDBOX_ERROR
    elif o.files_error is not None:
        # The run's files could not be written: they do not fit its work dir, or an earlier
        # program of the session made the path unusable (a directory where a file goes, a
        # read-only directory). The request's or the program's doing, never the
        # infrastructure's: a verdict, so that no program can turn its run into a
        # sandbox_error (excluded from training) on purpose.
        status = Status.RUNTIME_ERROR
        exit_code = None
        stderr = f"sandloop: the run's files could not be written: {o.files_error}\n"
    elif o.killed_for == "output":
        status = Status.OUTPUT_LIMIT
    elif o.killed_for in ("wall", "cpu"):
        status = Status.TIMEOUT
    elif stats is not None and stats.oom_killed:
        status = Status.MEMORY_LIMIT
    elif o.collect_expected and not o.collect_done and o.wait_status is not None:
        # The trusted pid 1 died before it said the collection was complete (it ignores every
        # signal the program could send): files may be missing through no fault of the
        # program, so the result cannot be trusted, and is not blamed on the program either.
        status = Status.SANDBOX_ERROR
    elif sig == signal_module.SIGXCPU or (sig == signal_module.SIGKILL and cpu > cpu_limit_s):
        status = Status.TIMEOUT
    elif exit_code == 0:
        status = Status.OK
    elif (
        stats is not None
        and stats.memory_failcnt > 0
        and (b"MemoryError" in o.stderr[-4096:] or b"bad_alloc" in o.stderr[-4096:]
             or b"out of memory" in o.stderr[-4096:].lower())
    ):
        # The allocation failed at the limit and the runtime reported it instead of dying.
        status = Status.MEMORY_LIMIT
    else:
        status = Status.RUNTIME_ERROR
    error = None
    if status is Status.SANDBOX_ERROR:
        if o.infra_error is None and o.setup_error is None:
            error = ("the sandbox's collector ended before it had collected the run's files "
                     f"(wait status {o.wait_status}); the run can be retried")
        else:
            error = o.infra_error or f"sandbox setup failed: {o.setup_error}"
    return ExecResult(
        status=status,
        exit_code=exit_code,
        signal=sig,
        stdout=_text(o.stdout),
        stderr=stderr,
        stdout_truncated=o.stdout_truncated,
        stderr_truncated=o.stderr_truncated,
        wall_time_s=round(o.wall_s, 6),
        cpu_time_s=round(cpu, 6),
        peak_memory_mb=round(peak, 3),
        error=error,
        isolation=isolation,
        environment=environment,
        files=o.files,
        missing_files=o.missing_files,
        channel=o.channel or None,
    )
