"""The trusted pid 1 that collects a run's files cannot be disturbed by the program, and a
collection it could not finish is never a silent ``ok`` with a file missing."""

from __future__ import annotations

import signal

import pytest
from sec_helpers import PoolInfo, limits

from sandloop.sandbox.models import Program, Status
from sandloop.sandbox.outcome import classify
from sandloop.sandbox.slot import StepOutcome

ASYNC = pytest.mark.asyncio(loop_scope="session")

# The program runs as the same uid as pid 1, in its pid namespace: it signals pid 1 with every
# signal there is, before it exits and (from an orphan that pid 1 inherits) all through the
# collection of its files.
SIGNAL_PID1 = """
import os, signal, time
sigs = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
sigs += [signal.SIGSTOP, signal.SIGKILL]
for i in range(4):
    with open(f"out{i}.bin", "wb") as f:
        f.write(os.urandom(1 << 16))
def storm():
    for s in sigs:
        try:
            os.kill(1, s)
        except OSError:
            pass
storm()
if os.fork() == 0:  # outlives the program: pid 1 collects while it keeps signalling
    os.setsid()
    end = time.monotonic() + 3
    while time.monotonic() < end:
        storm()
    os._exit(0)
time.sleep(0.05)
storm()
print("done", flush=True)
"""


@ASYNC
async def test_program_cannot_disturb_the_collector(sandbox: PoolInfo) -> None:
    names = [f"out{i}.bin" for i in range(4)]
    for _ in range(3):
        r = await sandbox.pool.run(Program(source=SIGNAL_PID1, collect=names),
                                   limits(time_s=10))
        assert r.status is Status.OK, (r.status, r.error, r.stderr[-1000:])
        assert r.stdout == "done\n"
        assert sorted(r.files) == names and r.missing_files == []
        assert all(len(b) == 1 << 16 for b in r.files.values())


@ASYNC
async def test_absent_files_are_named(sandbox: PoolInfo) -> None:
    src = "import os\nopen('here.txt', 'w').write('x')\nos.symlink('/etc/passwd', 'link.txt')\n"
    r = await sandbox.pool.run(Program(source=src, collect=["here.txt", "gone.txt", "link.txt"]),
                               limits(time_s=5))
    assert r.status is Status.OK and r.files == {"here.txt": b"x"}
    assert r.missing_files == ["gone.txt", "link.txt"]


def test_unfinished_collection_is_a_sandbox_error_fault_injected() -> None:
    # Fault injection: what the supervisor sees when pid 1 died after the program's status
    # ("P") and one file, but before its "C" record.
    o = StepOutcome(wait_status=0, collect_expected=True, collect_done=False,
                    files={"a.txt": b"x"})
    r = classify(o, cpu_limit_s=1.0, isolation="full")
    assert r.status is Status.SANDBOX_ERROR and r.error and "collector" in r.error
    killed = StepOutcome(wait_status=signal.SIGKILL, collect_expected=True, killed_for="wall")
    assert classify(killed, cpu_limit_s=1.0, isolation="full").status is Status.TIMEOUT
    done = StepOutcome(wait_status=0, collect_expected=True, collect_done=True,
                       missing_files=["b.txt"])
    r = classify(done, cpu_limit_s=1.0, isolation="full")
    assert r.status is Status.OK and r.missing_files == ["b.txt"]


FORK_COUNT = """
import os
made = 0
try:
    for _ in range(8):
        if os.fork() == 0:
            import time; time.sleep(2); os._exit(0)
        made += 1
except OSError:
    pass
open("made.txt", "w").write(str(made))
print(made)
"""


@ASYNC
async def test_the_collector_does_not_take_the_programs_process_budget(sandbox: PoolInfo) -> None:
    # The collector is a process of the run's group: with max_processes=1 it could not fork the
    # program and the run was a sandbox_error any request could cause (found by the server's
    # integrity fuzzing). The program keeps exactly its own budget: no more, no less.
    r = await sandbox.pool.run(Program(source="open('a', 'w').write('x')", collect=["a"]),
                               limits(time_s=10, max_processes=1))
    assert r.status is Status.OK, (r.status, r.error)
    assert r.files == {"a": b"x"}
    for budget in (1, 3):
        r = await sandbox.pool.run(Program(source=FORK_COUNT, collect=["made.txt"]),
                                   limits(time_s=10, max_processes=budget))
        assert r.status is Status.OK, (r.status, r.error, r.stderr[-500:])
        assert r.stdout == f"{budget - 1}\n" and r.files == {"made.txt": str(budget - 1).encode()}
