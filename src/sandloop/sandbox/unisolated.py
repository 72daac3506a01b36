"""The explicit opt-out (``isolation="none"``): a plain subprocess with rlimits and a deadline.

Only for hosts that cannot isolate and callers who said so. Results carry ``isolation: "none"``
so that nothing downstream mistakes them for isolated runs.

No namespaces, no seccomp, no cgroups: the program sees the host. But never as root: when
sandloop runs as root, every program runs as an unprivileged uid of the pool's own (claimed like
the isolated slots' uids) with no supplementary groups, so that it cannot rename the host, write
its sysctls, kill its processes or read root's files (``UnisolatedIdentity``). Not root,
sandloop has no other uid to switch to: programs then run as the caller's own user
(``sandloop doctor`` says which).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sandloop.sandbox.host import host_rlimit
from sandloop.sandbox.languages import WORK_DIR, LanguageSpec, Step, sandbox_env
from sandloop.sandbox.models import ExecResult, Limits, Status, with_compile_limit_note


@dataclass(frozen=True)
class UnisolatedIdentity:
    """Who unisolated programs run as: ``uid``/``gid`` to switch to (root only), or ``None``
    (not root: the caller's own user). ``python_error``: why the pool's interpreter cannot
    run as that uid (e.g. it lives under /root, mode 0700), or ``None``."""

    uid: int | None
    gid: int | None
    python_error: str | None = None

    def describe(self) -> str:
        if self.uid is None:
            return (f"as the caller's own user (uid {os.geteuid()}): sandloop is not root, so "
                    "it has no other uid to switch to")
        return (f"as unprivileged uids from {self.uid} up (one per concurrent run, claimed per "
                "pool), no groups: sandloop is root, so it drops root for them")


def unisolated_identity(python: str, uid: int | None) -> UnisolatedIdentity:
    """The identity for ``uid`` (root only; ``None`` when not root), after checking that the
    interpreter runs as that user."""
    if uid is None or os.geteuid() != 0:
        return UnisolatedIdentity(None, None)
    error = None
    try:
        subprocess.run([python, "-I", "-S", "-c", "pass"], check=True, capture_output=True,
                       timeout=30, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                       preexec_fn=lambda: _become(uid, uid))
    except (OSError, subprocess.SubprocessError) as e:
        error = (f"the interpreter {python} does not run as uid {uid}, the unprivileged user "
                 f"isolation='none' runs programs as ({e}); it probably lives in a directory "
                 "other users cannot enter (/root is 0700): pass python= (or set SANDLOOP_PYTHON "
                 "to) an interpreter installed for all users (e.g. /usr/bin/python3), or use "
                 "full isolation")
    return UnisolatedIdentity(uid, uid, error)


def _become(uid: int, gid: int) -> None:
    """Drop root for good: no groups, then gid, then uid (the order that still has the right)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _argv(step: Step, workdir: str, python: str) -> list[str]:
    if step.mode == "python":
        return [python, "-I", step.path.replace(WORK_DIR, workdir), *step.argv]
    return [a.replace(WORK_DIR, workdir) for a in step.argv]


async def _run_step(argv: list[str], cwd: str, stdin: bytes, limits: Limits, wall_s: float,
                    env: dict[str, str], who: UnisolatedIdentity) -> tuple[ExecResult, float]:
    rlimits = [(r, host_rlimit(r, v)) for r, v in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_CPU, int(limits.cpu_limit_s) + 1),
        (resource.RLIMIT_FSIZE, limits.workdir_mb << 20),
        (resource.RLIMIT_NOFILE, limits.open_files),
    )]

    def preexec() -> None:
        for r, v in rlimits:
            resource.setrlimit(r, (v, v))
        if who.uid is not None and who.gid is not None:
            _become(who.uid, who.gid)

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


def _read_collected(root: str, name: str, cap: int, owner: int | None) -> bytes | None:
    """Read ``root/name`` without following any symlink the program planted, and (when the
    program ran as another uid) only a file that uid owns: the supervisor is root, the program
    is not, so ``out.txt -> /etc/shadow`` or a hard link to a root file must not be read back."""
    parts = name.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode) or (owner is not None and st.st_uid != owner):
            return None
        return os.read(f, cap)
    finally:
        os.close(f)


def _sweep_uid(uid: int) -> None:
    """Kill every process left running as ``uid`` (ones that left the run's process group)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            pidfd = os.pidfd_open(int(entry))
        except OSError:
            continue
        try:
            # Checked after the pidfd is held: the pid cannot be reused under us.
            if os.stat(f"/proc/{entry}").st_uid == uid:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)


async def run_unisolated(program: object, limits: Limits, spec: LanguageSpec, python: str,
                         who: UnisolatedIdentity | None = None) -> ExecResult:
    """Run ``program`` without isolation (the caller opted out explicitly), as ``who``."""
    from sandloop.sandbox.models import Program

    assert isinstance(program, Program)
    who = who or UnisolatedIdentity(None, None)
    steps = [s for s in (spec.compile, spec.run) if s is not None]
    if who.python_error and any(s.mode == "python" or python in s.argv for s in steps):
        return ExecResult.sandbox_error(who.python_error, isolation="none")
    env = sandbox_env(spec.name)
    with tempfile.TemporaryDirectory(prefix="sandloop-none-") as d:
        for name, data in {**program.files, spec.main_file: program.source}.items():
            p = Path(d, name)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data.encode() if isinstance(data, str) else data)
        if who.uid is not None and who.gid is not None:
            for dirpath, _dirs, names in os.walk(d):
                os.chown(dirpath, who.uid, who.gid)
                for f in names:
                    os.chown(os.path.join(dirpath, f), who.uid, who.gid)
        try:
            compile_result = None
            if spec.compile is not None:
                for name, data in spec.compile_files.items():
                    Path(d, name).write_bytes(data)
                compile_result, _ = await _run_step(_argv(spec.compile, d, python), d, b"",
                                                    limits, limits.compile_time_limit_s,
                                                    {**env, **spec.compile_env}, who)
                compile_result = with_compile_limit_note(compile_result, limits)
                if compile_result.status is not Status.OK:
                    return ExecResult(status=Status.COMPILE_ERROR, compile=compile_result,
                                      isolation="none")
            stdin = (program.stdin.encode() if isinstance(program.stdin, str)
                     else (program.stdin or b""))
            result, _ = await _run_step(_argv(spec.run, d, python), d, stdin, limits,
                                        limits.time_s, {**env, **spec.run_env}, who)
            files: dict[str, bytes] = {}
            for name in program.collect:
                got = _read_collected(d, name, limits.stdout_bytes, who.uid)
                if got is not None:
                    files[name] = got
            missing = [n for n in program.collect if n not in files]
            return result.model_copy(update={"compile": compile_result, "files": files,
                                             "missing_files": missing})
        finally:
            if who.uid is not None:
                await asyncio.get_running_loop().run_in_executor(None, _sweep_uid, who.uid)
