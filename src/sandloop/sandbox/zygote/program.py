"""The locked-down child's last steps: leave the zygote's frames (``RunProgram``), forget what
names the host, and become the program (exec, or Python in this warm interpreter, started at
its top level by ``_RUNNER``), or fork it and stay as the trusted pid 1 that collects its files.

No logging: the child has no handlers, and fds 1 and 2 are the program's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import sys
from typing import Any

from ..protocol import SETUP_FAILED_EXIT, Record, RunSpec, write_record

ProgramRun = tuple[int, RunSpec, int, int, int, int]  # run_locked_down's arguments


class RunProgram(BaseException):
    """Raised in a locked-down child to unwind every frame of the zygote before the program
    starts (``main`` catches it and returns ``run`` to ``BOOTSTRAP``, which calls
    ``program_entry``; a Python program then starts once those return too: see ``_RUNNER``).
    A Python program runs in this process: from its first frame, ``sys._getframe().f_back``
    would otherwise walk up into the zygote's frames and reach its state (the slot's host
    directory, its host cgroup paths, the jail library's path), which is the host layout the
    mount and cgroup namespaces hide.

    The frames it unwinds must not clean up (no ``finally`` or ``with`` between ``main`` and
    a ``spawn``): in the child, their descriptors' numbers may be the child's own by now.
    """

    def __init__(self, run: ProgramRun) -> None:
        super().__init__()
        self.run = run



def program_entry(run: ProgramRun) -> None:
    """The child's life after the zygote's frames are gone (BOOTSTRAP calls it): forget what
    is left of the zygote that names host paths, then become or run the program. Returns only
    in a Python run, once the program is set to start at the interpreter's top level (see
    ``_RUNNER``); every failure ends the child here."""
    try:
        # Every module of the zygote: BOOTSTRAP registered them under one root package and
        # listed them there (not found by a walk of sys.modules: touching every module's name
        # cost each run tens of copy-on-write faults).
        root = sys.modules.get((__package__ or "").rpartition(".")[0])
        for name in getattr(root, "zygote_modules", ()):
            sys.modules.pop(name, None)
        # The command line the zygote was started with names this file on the host.
        sys.argv = [""]
        if hasattr(sys, "orig_argv"):
            sys.orig_argv = [sys.executable]
        # No gc.collect() here (~0.25 ms of copy-on-write faults per run): the cycles the
        # unwinding leaves (the jail's ctypes handle and types) name nothing of the host (see
        # Jail and Zygote.setup), and the program's first collection takes them.
        run_locked_down(*run)
        # Returns: the program starts once BOOTSTRAP's frames are gone too (see _RUNNER).
        # Their code and globals stay referenced here, in a module no program can reach but
        # through the collector: freeing them would cost each run ~25 copy-on-write faults.
        global _BOOTSTRAP
        _BOOTSTRAP = (sys._getframe(1).f_code, sys._getframe(1).f_globals,
                      sys._getframe(2).f_code)
    except BaseException:
        os._exit(SETUP_FAILED_EXIT)


def run_locked_down(stdin_fd: int, spec: RunSpec, out_fd: int, err_fd: int, chan_fd: int,
                    status_fd: int) -> None:
    """The locked-down child (slot uid, seccomp, files written) becomes or runs the program
    (returns in the process that runs a Python program: see ``run_python``)."""
    collect: list[str] = spec.get("collect") or []
    if collect:
        # Stay as a trusted pid 1: fork the program, report its status and collect its files
        # (inside the jail, as the slot user, so the files cannot point at anything of the host).
        # The program runs as the same uid and can signal pid 1: every signal stays blocked
        # across the fork, until pid 1 ignores them all (see _ignore_signals).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKABLE)
        pid = os.fork()
        if pid == 0:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(status_fd)
            _become_program(stdin_fd, out_fd, err_fd, chan_fd, spec)
            return
        _ignore_signals()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in (stdin_fd, out_fd, err_fd, chan_fd):
            os.close(fd)
        _supervise_and_collect(pid, status_fd, collect, int(spec.get("collect_max", 1 << 20)))
    os.close(status_fd)
    _become_program(stdin_fd, out_fd, err_fd, chan_fd, spec)


def _become_program(stdin_fd: int, out_fd: int, err_fd: int, chan_fd: int,
                    spec: RunSpec) -> None:
    # Standard streams: stdin is a sealed memfd, out/err and the result channel are pipes.
    os.dup2(stdin_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.dup2(chan_fd, 3)
    os.set_inheritable(3, True)
    os.closerange(4, 1 << 20)  # drops the zygote's sockets, the status pipe and every other fd
    env = spec["env"]
    run = spec["exec"]
    if run["mode"] == "exec":
        argv = run["argv"]
        try:
            os.execve(argv[0], argv, env)
        except OSError as e:  # e.g. a compiled program that is not executable
            os.write(2, f"cannot execute {argv[0]}: {e.strerror}\n".encode())
            os._exit(126)
    run_python(run["path"], run["argv"], env)


_BLOCKABLE = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}


def _ignore_signals() -> None:
    """Make the collecting pid 1 deaf to the program, which runs as the same uid in its pid
    namespace. The kernel already drops a signal sent to a namespace's init from inside unless
    init handles it, but this process is a fork of the interpreter and handles SIGINT
    (KeyboardInterrupt): one ``kill(1, SIGINT)`` from the program interrupted the collection, and
    a file the caller asked for was silently missing. SIGCHLD keeps its default: ignoring it
    would make the kernel reap the program before pid 1 could read its status."""
    for sig in _BLOCKABLE - {signal.SIGCHLD}:
        with contextlib.suppress(OSError, ValueError):  # glibc's reserved real-time signals
            signal.signal(sig, signal.SIG_IGN)


def _supervise_and_collect(pid: int, status_fd: int, collect: list[str], cap: int) -> None:
    """pid 1's loop: wait for the program (reaping orphans), then report status and files,
    and last a ``C`` record naming the files that were not there: without it the supervisor
    knows the collection did not finish and says so (a sandbox_error), rather than return a
    result that silently lacks a file."""
    while True:
        try:
            got, status, ru = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(SETUP_FAILED_EXIT)
        except InterruptedError:
            continue
        if got == pid:
            break
    rec = {"status": status, "utime": ru.ru_utime, "stime": ru.ru_stime, "maxrss_kb": ru.ru_maxrss}
    write_record(status_fd, Record.PROGRAM, json.dumps(rec).encode())
    missing = []
    for name in collect:
        data = _read_collected(name, cap)
        if data is None:
            missing.append(name)
        else:
            raw = name.encode()
            write_record(status_fd, Record.FILE, struct.pack("<H", len(raw)) + raw + data)
    write_record(status_fd, Record.COLLECTED, json.dumps(missing).encode())
    os._exit(0)


def _read_collected(name: str, cap: int) -> bytes | None:
    import stat

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], cap
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)



def run_python(path: str, argv: list[str], env: dict[str, str]) -> None:
    """Set up a Python run as ``python path argv...`` would, in this pre-warmed interpreter:
    the program starts once this returns, at the interpreter's top level (``_RUNNER``)."""
    import builtins
    import types

    # The zygote already runs with the usual sandbox environment: apply only the differences,
    # if any (compared in C first: os.environ's Python methods, run for the first time in
    # each child, cost ~50 copy-on-write faults). (The random module needs no reseeding here:
    # its at-fork hook, run by clone_fork, did it.)
    if env != _ENVIRON:
        for name in [n for n in os.environ if n not in env]:
            del os.environ[name]
        for name, value in env.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
    # The zygote started with -I, which ignores the environment: apply what it would have set.
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    sys.argv = [path, *argv]
    # The program's directory, as os.path.dirname(os.path.abspath(path)) (Python functions
    # too) gives it for a plain absolute path such as /sandbox/main.py.
    head, _, _ = path.rpartition("/")
    if not head.startswith("/") or "/." in path or "//" in path:
        head = os.path.dirname(os.path.abspath(path))
    sys.path[0] = head
    if os.getcwd() != head:  # a workspace run: its files are importable too
        sys.path.insert(1, os.getcwd())
    assert _STREAMS is not None  # built by main() before the first child
    if (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__,
            sys.__stderr__) != _STREAMS * 2:  # (they are: see prepare_std_streams)
        sys.stdin, sys.stdout, sys.stderr = _STREAMS
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = _STREAMS  # type: ignore[misc]
    try:
        # What `python path` does: compile the file and run it as a fresh __main__ module.
        with open(path, "rb") as f:
            source = f.read()
        code = compile(source, path, "exec", dont_inherit=True)
    except BaseException as e:  # a SyntaxError, as the interpreter prints it: no frame of ours
        _RUNNER["finish"](e.with_traceback(None))
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    _RUNNER["start"](code, main.__dict__)


# The program's own top level. A Python program runs in this process, and the frames under
# its first one would be the zygote's: ``sys._getframe().f_back`` reaches their globals, and
# through them every module, function and object of the zygote (issue 23). So the program does
# not start from here: ``start`` registers it as an atexit callback (``exec`` of its code,
# through a C ``partial``), every frame returns (this module's, BOOTSTRAP's), and the
# interpreter, ending its -c command, calls it from C: its frame is the bottom one, as in
# ``python main.py``. Its uncaught exception then reaches ``sys.unraisablehook`` (the C atexit
# loop catches it), which ``unraisable`` turns back into the interpreter's top-level report;
# ``finish`` then does what the interpreter's exit does (join threads, the program's atexit
# callbacks, flush) and ends the process without the interpreter's teardown (its decrefs
# would copy-on-write most of the heap).
#
# These functions live in a namespace of their own (compiled once, frozen with the warm heap,
# under a neutral name): what a program can find of them (``sys.unraisablehook`` while it
# runs, and through the collector) names nothing of the zygote or the host.
#
# Python 3.9 prints an atexit callback's exception itself, and 3.12 refuses threads and forks
# in atexit callbacks (gh-104690; 3.13 allows them again): there the program runs under
# ``start``'s frame, with the zygote's under it.
_RUNNER_SOURCE = """
import atexit, os, sys
from _collections import deque
from _functools import partial
from _thread import get_ident
from operator import methodcaller

program = None  # the atexit callback that runs the program
program_code = None
main_thread = None
returned = []
AT_TOP_LEVEL = sys.version_info[:2] not in ((3, 9), (3, 12))


def start(code, namespace):
    global program, program_code, main_thread
    if not AT_TOP_LEVEL:
        try:
            exec(code, namespace)
        except BaseException as e:
            finish(e.with_traceback(e.__traceback__.tb_next))  # from the program's frame
        finish()
    program_code, main_thread = code, get_ident()
    # Calls, in C: put back a threading module the warm interpreter imported (it leaves
    # sys.modules until the program starts, or the interpreter would shut it down before
    # atexit: its main thread marked stopped, new executors refused), run the program, and
    # note that it returned (finish then knows that it raised even when its exception went
    # to a hook of the program's own).
    threading = sys.modules.pop("threading", None)
    steps = [partial(exec, code, namespace), partial(returned.append, True)]
    if threading is not None:
        steps.insert(0, partial(sys.modules.__setitem__, "threading", threading))
    program = partial(deque, map(methodcaller("__call__"), steps), 0)
    sys.unraisablehook = unraisable
    atexit.register(finish)
    atexit.register(program)  # last in, first called


def unraisable(args):
    # The program's uncaught exception: raised out of its top-level frame, with no frame left
    # under this one, in the main thread. Anything else is reported as usual.
    tb = args.exc_traceback
    if (program is not None and sys._getframe().f_back is None and get_ident() == main_thread
            and tb is not None and tb.tb_frame.f_code is program_code):
        finish(args.exc_value)
    sys.__unraisablehook__(args)


def finish(error=None):
    # What the interpreter does once its main program ended, then the process ends.
    global program
    atexit.unregister(finish)
    if program is not None:
        atexit.unregister(program)
        program = None
    if sys.unraisablehook is unraisable:
        sys.unraisablehook = sys.__unraisablehook__
    code = 0 if returned or not AT_TOP_LEVEL else 1
    if isinstance(error, SystemExit):
        code = exit_code(error)
    elif error is not None:
        try:
            sys.excepthook(type(error), error, error.__traceback__)
        except BaseException:
            sys.__excepthook__(type(error), error, error.__traceback__)
        code = 1
    error = None
    try:
        # Non-daemon threads hold the exit, as in `python main.py` (only a program that
        # imported threading can have any).
        threading = sys.modules.get("threading")
        if threading is not None:
            main = threading.main_thread()
            for t in threading.enumerate():
                if t is not main and not t.daemon:
                    t.join()
        atexit._run_exitfuncs()
    except SystemExit as e:
        code = exit_code(e)
    except BaseException:
        sys.__excepthook__(*sys.exc_info())
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            code = code or 120
    os._exit(code)


def exit_code(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        print(e.code, file=sys.stderr)
    except BaseException:
        pass
    return 1
"""
_RUNNER: dict[str, Any] = {}
_ENVIRON: dict[str, str] = {}  # os.environ as the zygote left it for its children
_BOOTSTRAP: tuple[Any, ...] = ()


def _std_streams() -> tuple[Any, Any, Any]:
    """Text streams over fds 0, 1 and 2, as a run's program sees them."""
    import io

    return (io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                             encoding="utf-8", errors="surrogateescape"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                             encoding="utf-8", errors="backslashreplace"),
            io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                             encoding="utf-8", errors="backslashreplace", line_buffering=True))


_STREAMS: tuple[Any, Any, Any] | None = None


def prepare_std_streams() -> None:
    """Build the run's std streams once, here, over fds of the kinds a run gets (a memfd for
    stdin, a pipe for stdout and stderr), so that each child only dup2()s its own fds under
    them instead of building three stream stacks (~0.3 ms of copy-on-write faults per run).
    The pipe's read end stays open (and leaks into children until they close all fds) so that
    a stray write by the zygote never raises EPIPE; it is non-blocking, so it never hangs."""
    global _STREAMS
    stdin = os.memfd_create("stdin", os.MFD_CLOEXEC)
    _keep_read_end, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    os.dup2(stdin, 0)
    os.dup2(w, 1)
    os.dup2(w, 2)
    os.close(stdin)
    os.close(w)
    _STREAMS = _std_streams()
    # They are the zygote's own std streams already (it writes nothing to them; what stderr
    # gets is flushed at once, line-buffered): replaced in each child, the interpreter's
    # first streams were freed there, ~35 copy-on-write faults per run.
    sys.stdin, sys.stdout, sys.stderr = _STREAMS
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = _STREAMS  # type: ignore[misc]
    _ENVIRON.update(os.environ)
    import builtins

    _RUNNER["__builtins__"] = builtins
    exec(compile(_RUNNER_SOURCE, "<run>", "exec", dont_inherit=True), _RUNNER)
