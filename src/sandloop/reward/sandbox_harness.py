"""The in-sandbox test harness (runs as the sandbox's main program; standard library only).

Trust split inside the one sandbox run:

* The *driver* (this process) never executes the completion. It reads the test plan from stdin,
  runs test scripts (asserts, unittest, pytest-style functions) against a proxy ``candidate``, and
  writes one JSON line per test on file descriptor 3, the result channel.
* A *worker* process imports the completion and calls its entry point when asked; it only ever
  sends back typed plain data (see ``_sl_values``). It is forked before the driver reads the plan,
  so no test source or expected value is in its memory; it has no stdin and no channel fd; both
  processes are non-dumpable (no /proc/<pid>/mem or /proc/<pid>/fd access) and ptrace is denied by
  seccomp. Whatever the completion does to its own process (patching builtins, unittest, the
  encoder; sys.exit; os._exit; raising SkipTest; printing "OK") it can only change the values it
  returns, and only the driver or the host decides what those values mean.
* Expected values of function-call and stdin/stdout tests never enter the sandbox at all: the
  host compares them. Only script tests carry expectations in, and they stay in the driver.

For stdin/stdout tests the worker is a clean zygote: it forks one fresh child per test that runs
the completion as ``__main__`` with that test's input.

A worker that times out or dies is killed and replaced by a freshly executed interpreter (not a
fork of the driver, whose memory now holds the plan).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import marshal
import os
import select
import signal
import socket
import sys
import time
import traceback
import types
from collections.abc import Callable
from typing import Any, NoReturn

CHANNEL_FD = 3
MAX_FRAME = 16 << 20
MEMORY_EXIT = 101  # exit code of a stdin/stdout child that ran out of memory

@functools.cache
def _rebuildable() -> dict[str, type[Exception]]:
    """What the driver may re-raise for a completion's exception, so that tests such as
    ``with self.assertRaises(ValueError): candidate(-1)`` work. Never SystemExit,
    KeyboardInterrupt, SkipTest or anything else that could stop a test from failing.

    Built on first use, which most runs never have: the walk over every builtin bumps each one's
    reference count, ~56 copy-on-write faults (~0.17 ms) in every run when done at start-up."""
    return {
        name: obj
        for name, obj in vars(builtins).items()
        if isinstance(obj, type) and issubclass(obj, Exception) and obj is not StopIteration
    }


class CandidateError(Exception):
    """The completion raised an exception that is not re-raised as its own type."""


class WorkerLost(Exception):
    """The worker died, hung or broke the protocol during a call."""

    def __init__(self, status: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class TestTimeout(BaseException):
    """The test ran past its deadline (raised in the driver by the interval timer)."""


# ----------------------------------------------------------------------------------------------
# Framing: 4-byte big-endian length + body, on the raw descriptors of a socket pair (no socket
# objects: fewer syscalls and fewer pages touched per call; a run's CPU is mostly page faults).
# Driver to worker: marshal, read only by the worker (the driver is trusted, and marshal is
# the cheapest to build and to read). Worker to driver: JSON, which the driver can read safely
# whatever the worker sends (marshal cannot: a crafted stream may crash the reader).


# json.dumps with arguments builds a new encoder for every call (~15 per run); this one serves all.
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view):]


def _send(fd: int, obj: Any) -> None:
    """Worker to driver (JSON)."""
    _write_all(fd, _dumps(obj).encode())


def _send_trusted(fd: int, obj: Any) -> None:
    """Driver to worker (marshal: the worker's own reader, see above)."""
    _write_all(fd, marshal.dumps(obj))


class _Reader:
    """Frames read from one descriptor; bytes read past a frame wait for the next one."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def frame(self, deadline: float | None) -> bytes:
        buf = self.buf
        while True:
            need = 4
            if len(buf) >= 4:
                n = int.from_bytes(buf[:4], "big")
                if n > MAX_FRAME:
                    raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME}-byte limit")
                if len(buf) >= 4 + n:
                    data = bytes(buf[4:4 + n])
                    del buf[:4 + n]
                    return data
                need = 4 + n
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                ready, _, _ = select.select([self.fd], [], [], left)
                if not ready:
                    raise TimeoutError
            # One read takes a small frame whole (length and body): a call is one read a side.
            chunk = os.read(self.fd, min(max(need - len(buf), 4096), 1 << 20))
            if not chunk:
                raise EOFError
            buf += chunk


def _recv(reader: _Reader, deadline: float | None) -> Any:
    """Driver side: a frame from the (untrusted) worker."""
    return json.loads(reader.frame(deadline))


# ----------------------------------------------------------------------------------------------
# Worker side (untrusted once the completion is imported).


def _describe(e: BaseException) -> dict[str, Any]:
    try:
        msg = str(e)[:2000]
    except BaseException:
        msg = "<unprintable>"
    builtin = None
    try:
        for klass in type(e).__mro__:
            if klass.__module__ == "builtins" and klass.__name__ in _rebuildable():
                builtin = klass.__name__
                break
        name = type(e).__qualname__
    except BaseException:
        name = "?"
    return {"exc": str(name)[:200], "msg": msg, "builtin": builtin}


def _load_solution(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        source = f.read()
    module = types.ModuleType("solution")
    module.__file__ = path
    sys.modules["solution"] = module
    code = compile(source, "solution.py", "exec")
    exec(code, module.__dict__)
    return module.__dict__


def _resolve(ns: dict[str, Any], entry_point: str) -> Callable[..., Any] | None:
    fn = ns.get(entry_point)
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    # LeetCode-style tasks (APPS/TACO call-based) put the entry point on class Solution.
    klass = ns.get("Solution")
    if isinstance(klass, type) and callable(getattr(klass, entry_point, None)):
        return getattr(klass(), entry_point)  # type: ignore[no-any-return]
    return None


def worker_main(fd: int, solution: str) -> NoReturn:
    """Serve calls to the completion's entry point until the driver closes the socket."""
    values = sys.modules["_sl_values"]
    reader = _Reader(fd)
    init = marshal.loads(reader.frame(None))
    mode, entry_point = init["mode"], init.get("entry_point")
    if mode == "stdio":
        _zygote_main(fd, reader, solution)
    fn = None
    try:
        ns = _load_solution(solution)
        fn = _resolve(ns, entry_point)
        if fn is None:
            ready: dict[str, Any] = {"import": "missing", "detail": f"no function {entry_point!r}"}
        else:
            ready = {"import": "ok"}
    except SyntaxError as e:
        ready = {"import": "syntax", "detail": f"{type(e).__name__}: {e}"[:2000]}
    except MemoryError:
        ready = {"import": "memory", "detail": "MemoryError while importing"}
    except BaseException as e:
        d = _describe(e)
        ready = {"import": "error", "detail": f"{d['exc']}: {d['msg']}"}
    _send(fd, ready)
    if fn is None:
        os._exit(0)
    while True:
        try:
            req = marshal.loads(reader.frame(None))
        except EOFError:
            os._exit(0)
        try:
            args = [values.decode(a) for a in req["args"]]
            kwargs = {k: values.decode(v) for k, v in req["kwargs"].items()}
            result = fn(*args, **kwargs)
            reply: dict[str, Any] = {"value": values.encode(result)}
        except MemoryError:
            reply = {"memory": True}
        except RecursionError as e:
            reply = _describe(e)
        except BaseException as e:
            reply = _describe(e)
        try:
            _send(fd, reply)
        except (ValueError, RecursionError, MemoryError) as e:
            _send(fd, {"exc": "UnencodableResult", "msg": str(e)[:500], "builtin": None})


def _zygote_main(fd: int, reader: _Reader, solution: str) -> NoReturn:
    """stdin/stdout mode: run the completion as __main__ in a fresh child per test.

    The completion is compiled here, once, not in every child (compiling runs none of its
    code); a child of a completion that does not compile raises the SyntaxError itself."""
    code = None
    with contextlib.suppress(Exception), open(solution, encoding="utf-8") as f:
        code = compile(f.read(), solution, "exec", dont_inherit=True)
    while True:
        try:
            req = marshal.loads(reader.frame(None))
        except EOFError:
            os._exit(0)
        _send(fd, _run_io_child(solution, code, req["stdin"].encode(), req["cap"],
                                req["timeout"]))


def _run_io_child(solution: str, code: types.CodeType | None, stdin: bytes, cap: int,
                  timeout: float) -> dict[str, Any]:
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    start = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            for fd in (in_r, in_w, out_r, out_w):
                os.close(fd)
            _exec_main(solution, code)
        finally:
            os._exit(1)
    os.close(in_r)
    os.close(out_w)
    os.set_blocking(in_w, False)
    pending = memoryview(stdin)
    if not pending:
        os.close(in_w)
    out = bytearray()
    truncated = False
    deadline = start + timeout
    timed_out = False
    open_out = True
    while open_out:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        wfds = [in_w] if pending else []
        r, w, _ = select.select([out_r], wfds, [], left)
        if w:
            try:
                n = os.write(in_w, pending[: 1 << 16])
                pending = pending[n:]
            except BrokenPipeError:
                pending = memoryview(b"")
            if not pending:
                os.close(in_w)
        if r:
            chunk = os.read(out_r, 1 << 16)
            if not chunk:
                open_out = False
            elif len(out) < cap:
                out += chunk[: cap - len(out)]
                truncated = truncated or (len(out) >= cap and len(chunk) > 0)
            else:
                truncated = True
    if pending:
        os.close(in_w)
    os.close(out_r)
    # Output closed: wait for the exit, still within the deadline.
    status = None
    while status is None:
        wpid, st = os.waitpid(pid, os.WNOHANG)
        if wpid:
            status = st
            break
        if timed_out or time.monotonic() >= deadline:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.001)
    elapsed = time.monotonic() - start
    text = out.decode("utf-8", errors="replace")
    if timed_out:
        return {"status": "timeout", "stdout": text, "time": elapsed}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        kind = "memory" if sig == signal.SIGKILL else "crash"
        return {"status": kind, "stdout": text, "time": elapsed, "detail": f"killed by signal {sig}"}
    exit_code = os.WEXITSTATUS(status)
    if exit_code == MEMORY_EXIT:
        return {"status": "memory", "stdout": text, "time": elapsed, "detail": "MemoryError"}
    if exit_code != 0:
        return {"status": "error", "stdout": text, "time": elapsed,
                "detail": f"exit code {exit_code}"}
    return {"status": "ok", "stdout": text, "truncated": truncated, "time": elapsed}


def _exec_main(solution: str, code: types.CodeType | None) -> NoReturn:
    """Run the completion as ``__main__`` (what ``runpy.run_path`` does for a file, without
    importing runpy in every child: ~1 ms each)."""
    import io

    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding="utf-8", errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                  encoding="utf-8", errors="backslashreplace")
    exit_code = 0
    try:
        if code is None:
            with open(solution, encoding="utf-8") as f:
                code = compile(f.read(), solution, "exec", dont_inherit=True)
        main = types.ModuleType("__main__")
        main.__file__ = solution
        main.__builtins__ = builtins  # type: ignore[attr-defined]
        sys.modules["__main__"] = main
        sys.argv[:] = [solution]
        exec(code, main.__dict__)
    except SystemExit as e:
        exit_code = 0 if e.code is None else (e.code & 0xFF if isinstance(e.code, int) else 1)
    except MemoryError:
        exit_code = MEMORY_EXIT
    except BaseException:
        traceback.print_exc()
        exit_code = 1
    try:
        sys.stdout.flush()
    except BaseException:
        exit_code = exit_code or 1
    os._exit(exit_code)


def _worker_entry(fd: int, solution: str) -> NoReturn:
    """Child side right after fork/exec: shed everything before any completion code runs."""
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # Keep stdin/stdout/stderr and the socket; drop every other descriptor (the driver's
        # copy of the result channel in particular) before any completion code runs.
        os.closerange(3, fd)
        os.closerange(fd + 1, 1 << 16)
        worker_main(fd, solution)
    except BaseException:
        os._exit(1)


# ----------------------------------------------------------------------------------------------
# Driver side (trusted).


class Worker:
    """One worker process and the driver's end of its socket."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd
        self.reader = _Reader(fd)
        self.killed = False
        self.closed = False

    def kill(self) -> None:
        if not self.killed:
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def death(self) -> tuple[str, str]:
        """Reap the worker after EOF; classify how it ended."""
        status = None
        try:
            # It closed its socket; give it a moment to exit, then make sure it does.
            for _ in range(200):
                pid, st = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    status = st
                    break
                time.sleep(0.0025)
            if status is None:
                self.kill()
                _, status = os.waitpid(self.pid, 0)
                return "crash", "closed its connection during the call"
        except ChildProcessError:
            return "crash", "worker exited"
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig == signal.SIGKILL and not self.killed:
                # Nobody here sent it: the cgroup's OOM killer did.
                return "memory", "killed by the out-of-memory killer"
            return "crash", f"killed by signal {sig}"
        return "crash", f"exited with code {os.WEXITSTATUS(status)} during the call"


class Driver:
    def __init__(self, solution: str, chan: int) -> None:
        self.solution = solution
        self.chan = chan
        self.plan: dict[str, Any] = {}
        self.worker: Worker | None = None
        self.fatal: tuple[str, str] | None = None  # import failure: applies to every test
        self.lost: WorkerLost | None = None  # last worker loss during the current test
        self.values = sys.modules["_sl_values"]

    # -- workers ----------------------------------------------------------------------------

    def fork_first_worker(self) -> Worker:
        parent, child = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            parent.close()
            _worker_entry(child.detach(), self.solution)
        child.close()
        return Worker(pid, parent.detach())

    def spawn_worker(self) -> Worker:
        parent, child = socket.socketpair()
        fd = child.fileno()
        os.set_inheritable(fd, True)
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        try:
            # The replacement keeps the run's hash seed (a set's order must not change after a
            # timed-out test), so not -I, whose -E drops PYTHONHASHSEED; -s -P keep the rest
            # of its isolation, and its environment holds nothing else of ours.
            env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
            seed = os.environ.get("PYTHONHASHSEED")
            if seed is not None:
                env["PYTHONHASHSEED"] = seed
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-s", "-P", "-S", os.path.abspath(__file__), "--worker",
                 str(fd), self.solution],
                env,
                file_actions=actions,
            )
        finally:
            child.close()
        return Worker(pid, parent.detach())

    def start_worker(self, first: Worker | None) -> Worker:
        w = first if first is not None else self.spawn_worker()
        _send_trusted(w.fd, {"mode": self.plan["mode"], "entry_point": self.plan.get("entry_point")})
        if self.plan["mode"] == "stdio":
            return w
        deadline = time.monotonic() + float(self.plan["import_timeout"])
        try:
            ready = _recv(w.reader, deadline)
        except TimeoutError:
            w.kill()
            self.fatal = ("timeout", "importing the completion timed out")
            raise WorkerLost(*self.fatal) from None
        except (EOFError, OSError, ValueError):
            status, detail = w.death()
            self.fatal = (status, f"while importing the completion: {detail}")
            raise WorkerLost(*self.fatal) from None
        state = ready.get("import") if isinstance(ready, dict) else None
        if state != "ok":
            w.kill()
            status = {"syntax": "syntax", "memory": "memory", "missing": "missing"}.get(
                str(state), "import_error"
            )
            self.fatal = (status, str(ready.get("detail", ""))[:2000] if isinstance(ready, dict)
                          else "protocol error")
            raise WorkerLost(*self.fatal)
        self.record({"ev": "import", "status": "ok"})
        return w

    def ensure_worker(self, first: Worker | None = None) -> Worker:
        if self.fatal is not None:
            raise WorkerLost(*self.fatal)
        if self.worker is None:
            try:
                self.worker = self.start_worker(first)
            except OSError as e:
                # Fork/exec failed after the completion already ran (it may hold the pids): the
                # completion's doing, so a failure of the remaining tests, not an infrastructure one.
                self.fatal = ("crash", f"could not start a worker: {e}")
                raise WorkerLost(*self.fatal) from None
        return self.worker

    def request(self, msg: dict[str, Any], deadline: float) -> Any:
        try:
            return self._request(msg, deadline)
        except WorkerLost as e:
            self.lost = e
            raise

    def _request(self, msg: dict[str, Any], deadline: float) -> Any:
        w = self.ensure_worker()
        try:
            _send_trusted(w.fd, msg)
            return _recv(w.reader, deadline)
        except TimeoutError:
            w.kill()
            self.worker = None
            raise WorkerLost("timeout", "time limit exceeded") from None
        except (EOFError, OSError, ValueError) as e:
            if isinstance(e, EOFError | OSError):
                status, detail = w.death()
            else:
                w.kill()
                status, detail = "crash", f"protocol violation: {e}"
            self.worker = None
            raise WorkerLost(status, detail) from None

    # -- calls ------------------------------------------------------------------------------

    def call(self, args: list[Any], kwargs: dict[str, Any], deadline: float) -> dict[str, Any]:
        reply = self.request({"args": args, "kwargs": kwargs}, deadline)
        if not isinstance(reply, dict):
            raise WorkerLost("crash", "protocol violation: reply is not an object")
        return reply

    def make_candidate(self, deadline_box: list[float]) -> Callable[..., Any]:
        values = self.values

        def candidate(*args: Any, **kwargs: Any) -> Any:
            try:
                enc_args = [values.encode(a, strict=True) for a in args]
                enc_kwargs = {k: values.encode(v, strict=True) for k, v in kwargs.items()}
            except values.ValueCodecError as e:
                raise CandidateError(f"argument cannot be sent to the completion: {e}") from None
            reply = self.call(enc_args, enc_kwargs, deadline_box[0])
            if "value" in reply:
                try:
                    return values.decode(reply["value"])
                except values.ValueCodecError as e:
                    raise WorkerLost("crash", f"malformed return value: {e}") from None
            if reply.get("memory"):
                raise WorkerLost("memory", "MemoryError")
            builtin = reply.get("builtin")
            msg = str(reply.get("msg", ""))
            rebuildable = _rebuildable()
            if isinstance(builtin, str) and builtin in rebuildable:
                raise rebuildable[builtin](msg)
            raise CandidateError(f"{reply.get('exc', '?')}: {msg}")

        return candidate

    # -- tests ------------------------------------------------------------------------------

    def record(self, rec: dict[str, Any]) -> None:
        data = (_dumps(rec) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.chan, view)
            view = view[n:]

    def run_call(self, test: dict[str, Any], deadline: float) -> dict[str, Any]:
        reply = self.call(test["args"], test.get("kwargs", {}), deadline)
        if "value" in reply:
            try:
                self.values.validate_encoded(reply["value"])
            except self.values.ValueCodecError as e:
                return {"status": "crash", "detail": f"malformed return value: {e}"}
            return {"status": "ok", "value": reply["value"]}
        if reply.get("memory"):
            return {"status": "memory", "detail": "MemoryError"}
        return {"status": "error", "detail": f"{reply.get('exc', '?')}: {reply.get('msg', '')}"[:2000]}

    def run_script(self, test: dict[str, Any], deadline: float) -> dict[str, Any]:
        box = [deadline]
        self.lost = None
        cand = self.make_candidate(box)
        ns: dict[str, Any] = {"__name__": "__sl_test__", "__builtins__": builtins}
        prelude = self.plan.get("prelude") or ""
        if prelude:
            try:
                exec(compile(prelude, "prompt.py", "exec"), ns)
            except Exception:
                ns = {"__name__": "__sl_test__", "__builtins__": builtins}
        entry = self.plan.get("entry_point")
        if entry:
            ns[entry] = cand
        ns["candidate"] = cand
        self.ensure_worker()
        signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))
        try:
            exec(compile(test["source"], "test.py", "exec"), ns)
            target = test.get("call")
            if target == "check":
                ns["check"](cand)
            elif target and "." in target:
                cls_name, method = target.split(".", 1)
                case = ns[cls_name](method)
                # Imported here, in the driver, only for unittest-style suites: most runs never
                # need it, and every run would pay for it at start-up.
                import unittest

                result = unittest.TestResult()
                case.run(result)
                problems = result.failures + result.errors
                if problems:
                    # unittest catches everything, our timeout and lost workers included.
                    if self.lost is not None:
                        return {"status": self.lost.status, "detail": self.lost.detail}
                    text = problems[0][1]
                    if "TestTimeout" in text:
                        return {"status": "timeout", "detail": "time limit exceeded"}
                    kind = "failed" if result.failures else "error"
                    return {"status": kind, "detail": text[-2000:]}
                if result.skipped or result.testsRun != 1:
                    return {"status": "failed", "detail": "test was skipped or did not run"}
            elif target:
                ns[target]()
        except TestTimeout:
            # The driver's own deadline fired; a call in flight is cut off like a timeout.
            if self.worker is not None:
                self.worker.kill()
                self.worker = None
            return {"status": "timeout", "detail": "time limit exceeded"}
        except WorkerLost as e:
            return {"status": e.status, "detail": e.detail}
        except AssertionError as e:
            return {"status": "failed", "detail": f"AssertionError: {e}"[:2000]}
        except BaseException as e:
            return {"status": "error", "detail": f"{type(e).__name__}: {e}"[:2000]}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return {"status": "passed"}

    def run_io(self, test: dict[str, Any], deadline: float) -> dict[str, Any]:
        timeout = max(deadline - time.monotonic(), 0.001)
        # The zygote enforces the test's limit; the driver allows a margin on top of it in case
        # the zygote itself is stuck.
        reply = self.request(
            {"stdin": test.get("stdin", ""), "cap": int(test.get("cap", 1 << 20)),
             "timeout": timeout},
            deadline + 1.0,
        )
        if not isinstance(reply, dict) or not isinstance(reply.get("stdout", ""), str):
            raise WorkerLost("crash", "protocol violation")
        return reply

    def run(self, first: Worker) -> None:
        budget_end = time.monotonic() + float(self.plan["budget"])
        # After this many timeouts the remaining tests are not run: each would likely burn its
        # whole limit too (an infinite loop), and a timeout already fails the completion.
        max_timeouts = int(self.plan.get("max_timeouts") or 0)
        timeouts = 0
        with contextlib.suppress(WorkerLost):
            self.ensure_worker(first)
        for test in self.plan["tests"]:
            tid = test["id"]
            start = time.monotonic()
            deadline = min(start + float(test["timeout"]), budget_end)
            if self.fatal is not None:
                res = {"status": self.fatal[0], "detail": self.fatal[1]}
            elif max_timeouts and timeouts >= max_timeouts:
                res = {"status": "timeout", "detail": "not run: an earlier test timed out"}
            elif deadline <= start:
                res = {"status": "timeout", "detail": "time budget of the run exhausted"}
            else:
                try:
                    kind = test["kind"]
                    if kind == "call":
                        res = self.run_call(test, deadline)
                    elif kind == "script":
                        res = self.run_script(test, deadline)
                    else:
                        res = self.run_io(test, deadline)
                except TestTimeout:
                    # The alarm fired between a test's own handlers; same verdict.
                    if self.worker is not None:
                        self.worker.kill()
                        self.worker = None
                    res = {"status": "timeout", "detail": "time limit exceeded"}
                except WorkerLost as e:
                    res = {"status": e.status, "detail": e.detail}
                    if self.fatal is not None:
                        res = {"status": self.fatal[0], "detail": self.fatal[1]}
            timeouts += res["status"] == "timeout"
            self.record({"ev": "test", "id": tid, **res, "time": round(time.monotonic() - start, 6)})
        self.record({"ev": "done", "count": len(self.plan["tests"])})


def _on_alarm(signum: int, frame: Any) -> None:
    raise TestTimeout


def driver_main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    solution = os.path.join(here, "solution.py")
    # The channel stays with the driver: not inherited by exec'd workers, closed in forked ones.
    chan = os.dup(CHANNEL_FD)
    os.set_inheritable(chan, False)
    os.close(CHANNEL_FD)
    # The worker may write files next to us; nothing the driver imports from now on may come
    # from the work dir (``import random`` inside a test must be the real one).
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != here]
    sys.dont_write_bytecode = True
    drv = Driver(solution, chan)
    # Fork the first worker before reading the plan: its memory never holds test code.
    first = drv.fork_first_worker()
    drv.plan = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGALRM, _on_alarm)
    drv.run(first)
    if drv.worker is not None:
        drv.worker.kill()
    os._exit(0)


def _bootstrap() -> None:
    if "_sl_values" not in sys.modules:  # run from source rather than through the stub
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, here)
        import _sl_values  # type: ignore[import-not-found]  # noqa: F401 - before any completion code runs
    if len(sys.argv) >= 4 and sys.argv[1] == "--worker":
        _worker_entry(int(sys.argv[2]), sys.argv[3])
    driver_main()


if __name__ == "__main__":
    _bootstrap()
