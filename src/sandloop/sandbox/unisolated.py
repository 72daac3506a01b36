"""The explicit opt-out (``isolation="none"``): a plain subprocess with rlimits and a deadline.

Only for hosts that cannot isolate and callers who said so. Results carry ``isolation: "none"``
so that nothing downstream mistakes them for isolated runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import tempfile
import time
from pathlib import Path

from sandloop.sandbox.host import host_rlimit
from sandloop.sandbox.languages import WORK_DIR, LanguageSpec, Step, sandbox_env
from sandloop.sandbox.models import ExecResult, Limits, Status


def _argv(step: Step, workdir: str, python: str) -> list[str]:
    if step.mode == "python":
        return [python, "-I", step.path.replace(WORK_DIR, workdir), *step.argv]
    return [a.replace(WORK_DIR, workdir) for a in step.argv]


async def _run_step(argv: list[str], cwd: str, stdin: bytes, limits: Limits, wall_s: float,
                    env: dict[str, str]) -> tuple[ExecResult, float]:
    rlimits = [(r, host_rlimit(r, v)) for r, v in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, int(limits.cpu_limit_s) + 1),
        (resource.RLIMIT_FSIZE, limits.workdir_mb << 20),
        (resource.RLIMIT_NOFILE, limits.open_files),
    )]

    def preexec() -> None:
        for r, v in rlimits:
            resource.setrlimit(r, (v, v))

    start = time.monotonic()
    env = {**env, "HOME": cwd, "TMPDIR": cwd}
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, preexec_fn=preexec, start_new_session=True,
    )
    timed_out = False
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), wall_s)
    except TimeoutError:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = await proc.communicate()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    wall = time.monotonic() - start
    rc = proc.returncode
    exit_code = rc if rc is not None and rc >= 0 else None
    sig = -rc if rc is not None and rc < 0 else None
    if timed_out or sig == signal.SIGXCPU:
        status = Status.TIMEOUT
    elif rc == 0:
        status = Status.OK
    else:
        status = Status.RUNTIME_ERROR
    return ExecResult(
        status=status, exit_code=exit_code, signal=sig,
        stdout=out[: limits.stdout_bytes].decode(errors="replace"),
        stderr=err[: limits.stderr_bytes].decode(errors="replace"),
        stdout_truncated=len(out) > limits.stdout_bytes,
        stderr_truncated=len(err) > limits.stderr_bytes,
        wall_time_s=round(wall, 6), isolation="none",
    ), wall


async def run_unisolated(program: object, limits: Limits, spec: LanguageSpec, python: str) -> ExecResult:
    """Run ``program`` without isolation (the caller opted out explicitly)."""
    from sandloop.sandbox.models import Program

    assert isinstance(program, Program)
    env = sandbox_env(spec.name)
    with tempfile.TemporaryDirectory(prefix="sandloop-none-") as d:
        for name, data in {**program.files, spec.main_file: program.source}.items():
            p = Path(d, name)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data.encode() if isinstance(data, str) else data)
        compile_result = None
        if spec.compile is not None:
            compile_result, _ = await _run_step(_argv(spec.compile, d, python), d, b"", limits,
                                                limits.compile_time_s, env)
            if compile_result.status is not Status.OK:
                return ExecResult(status=Status.COMPILE_ERROR, compile=compile_result,
                                  isolation="none")
        stdin = program.stdin.encode() if isinstance(program.stdin, str) else (program.stdin or b"")
        result, _ = await _run_step(_argv(spec.run, d, python), d, stdin, limits, limits.time_s, env)
        files = {}
        for name in program.collect:
            p = Path(d, name)
            if p.is_file() and not p.is_symlink():
                files[name] = p.read_bytes()[: limits.stdout_bytes]
        return result.model_copy(update={"compile": compile_result, "files": files})
