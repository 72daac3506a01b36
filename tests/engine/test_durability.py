"""Durability: the journal answers finished jobs after a restart and runs unfinished ones once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import assert_none_left, sandbox_processes, until

from sandloop import ExecResult, Limits, Program, Status
from sandloop.engine import Engine, IdempotencyConflict, Journal, LocalBackend
from sandloop.sandbox.pool import SandboxPool

HERE = Path(__file__).parent
FAST = Limits(time_s=5, memory_mb=256)
NONCE = Program(source="import os\nprint(os.urandom(8).hex())")


async def test_finished_job_is_answered_from_the_journal(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Engine(slots=1, journal=db) as e:
        first = await e.run(NONCE, FAST, key="k1")
        again = await e.run(NONCE, FAST, key="k1")
        assert again == first and e.stats.executed == 1 and e.stats.from_journal == 1
        other = await e.run(NONCE, FAST, key="k2")  # same program, another key: runs
        assert other.stdout != first.stdout
    async with Engine(slots=1, journal=db) as e:
        assert (await e.run(NONCE, FAST, key="k1")) == first
        # Without a key, the program and limits are the key.
        a = await e.run(NONCE, FAST)
        assert (await e.run(NONCE, FAST)) == a and e.stats.executed == 1


async def test_binary_inputs_are_journaled_and_resumed_byte_for_byte(tmp_path: Path) -> None:
    # Bytes that are not UTF-8 (a binary input file, a native task's encoded values) once made
    # pydantic's JSON refuse the program: every such job failed on a journaled engine (a 500 on
    # `sandloop serve --journal`). They are written base64-tagged; UTF-8 content keeps its form.
    from sandloop.engine.journal import content_digest, model_from_json, model_json

    blob = bytes(range(256))
    prog = Program(source="import sys\nd = open('b.bin', 'rb').read()\n"
                          "print(len(d), d == bytes(range(256)), sys.stdin.buffer.read().hex())",
                   files={"b.bin": blob, "t.txt": "héllo"}, stdin=b"\xff\x00")
    again = model_from_json(Program, model_json(prog))
    assert again.files["b.bin"] == blob and again.stdin == b"\xff\x00" and again == prog
    text = Program(source="pass", files={"a": b"ok"})
    assert model_json(text) == text.model_dump_json()  # unchanged where pydantic could write it
    assert content_digest(prog, FAST) != content_digest(prog.model_copy(
        update={"files": {**prog.files, "b.bin": blob[::-1]}}), FAST)
    db = tmp_path / "j.db"
    async with Engine(BrokenBackend(SandboxPool(1)), journal=db, retry_backoff_s=0.01) as e:
        assert (await e.run(prog, FAST, key="bin")).status is Status.SANDBOX_ERROR
    async with Engine(slots=1, journal=db) as e:
        got = [x async for x in e.resume()]
        assert [k for k, _ in got] == ["bin"]
        assert got[0][1].ok and got[0][1].stdout == "256 True ff00\n", got[0][1]
        assert (await e.run(prog, FAST)).stdout == "256 True ff00\n"


async def test_concurrent_submissions_of_one_key_run_once(tmp_path: Path) -> None:
    async with Engine(slots=2, journal=tmp_path / "j.db") as e:
        rs = await asyncio.gather(*(e.run(NONCE, FAST, key="same") for _ in range(5)))
        assert len({r.stdout for r in rs}) == 1 and e.stats.executed == 1


def _says(text: str) -> Program:
    return Program(source=f"import os\nprint({text!r}, os.urandom(4).hex())")


async def test_keys_are_scoped_by_client_in_either_order(tmp_path: Path) -> None:
    """One tenant's key never answers another's: alice and bob both use key "k"."""
    db = tmp_path / "j.db"
    async with Engine(slots=2, journal=db) as e:
        a = await e.run(_says("alice"), FAST, key="k", client="alice")
        b = await e.run(_says("bob"), FAST, key="k", client="bob")  # after alice's is done
        assert a.stdout.startswith("alice") and b.stdout.startswith("bob")
        # At the same time (one in flight while the other is submitted), bob first this time.
        b2, a2 = await asyncio.gather(e.run(_says("bob"), FAST, key="k2", client="bob"),
                                      e.run(_says("alice"), FAST, key="k2", client="alice"))
        assert a2.stdout.startswith("alice") and b2.stdout.startswith("bob")
        assert e.stats.executed == 4
        # Without keys too: the default key (the program's hash) is per client.
        n = await e.run(NONCE, FAST, client="alice")
        assert (await e.run(NONCE, FAST, client="bob")) != n and e.stats.executed == 6
    async with Engine(slots=1, journal=db) as e:  # and across a restart
        assert (await e.run(_says("bob"), FAST, key="k", client="bob")) == b
        assert (await e.run(_says("alice"), FAST, key="k", client="alice")) == a
        assert e.stats.executed == 0


async def test_a_key_reused_for_another_program_is_a_conflict(tmp_path: Path) -> None:
    async with Engine(slots=1, journal=tmp_path / "j.db") as e:
        first = await e.run(_says("one"), FAST, key="k")
        with pytest.raises(IdempotencyConflict, match="different program"):
            await e.run(_says("two"), FAST, key="k")  # done: in the journal
        with pytest.raises(IdempotencyConflict):
            await e.run(_says("one"), Limits(time_s=6, memory_mb=256), key="k")  # other limits
        assert (await e.run(_says("one"), FAST, key="k")) == first  # a true retry is answered
        slow = Program(source="import time\ntime.sleep(0.5)")
        running = asyncio.ensure_future(e.run(slow, FAST, key="busy"))
        await until(lambda: e.stats.running == 1, "the first run in flight")
        with pytest.raises(IdempotencyConflict):  # while the first is still in flight
            await e.run(_says("two"), FAST, key="busy")
        assert (await running).ok
    async with Engine(slots=1) as e:  # without a journal, in flight only
        running = asyncio.ensure_future(e.run(slow, FAST, key="busy"))
        await until(lambda: e.stats.running == 1, "the first run in flight")
        with pytest.raises(IdempotencyConflict):
            await e.run(_says("two"), FAST, key="busy")
        assert (await running).ok


class BrokenBackend(LocalBackend):
    """Fault injection: every execution is an infrastructure failure."""

    async def execute(self, program: Program, limits: Limits, *,
                      on_end: Callable[[], None] | None = None) -> ExecResult:
        return ExecResult.sandbox_error("injected: no sandbox")


async def test_infra_failures_stay_pending_for_a_later_run(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Engine(BrokenBackend(SandboxPool(1)), journal=db, retry_backoff_s=0.01) as e:
        r = await e.run(NONCE, FAST, key="k")
        assert r.status is Status.SANDBOX_ERROR
    with Journal(db) as j:
        assert j.counts() == {"pending": 1} and j.attempts("k") == 3
    async with Engine(slots=1, journal=db) as e:
        got = [x async for x in e.resume()]
        assert [k for k, _ in got] == ["k"] and got[0][1].ok and e.stats.executed == 1


def test_crash_mid_batch_then_resume_runs_each_unfinished_job_exactly_once(tmp_path: Path) -> None:
    before = sandbox_processes()
    db = tmp_path / "crash.db"
    child = subprocess.Popen([sys.executable, str(HERE / "crash_child.py"), str(db)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        done_n = 0
        while time.monotonic() < deadline and child.poll() is None:
            if db.exists():
                with Journal(db) as j:
                    done_n = j.counts().get("done", 0)
                if done_n >= 6:
                    break
            time.sleep(0.05)
        assert child.poll() is None and done_n >= 6, child.stderr.read() if child.stderr else ""
        os.kill(child.pid, signal.SIGKILL)  # the engine dies mid-batch, no cleanup at all
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert_none_left(before)  # its fork-servers and runs died with it

    keys = [f"job{i}" for i in range(24)]
    with Journal(db) as j:
        finished = j.done(keys)
        pending = {p.key for p in j.pending()}
    assert 6 <= len(finished) < 24 and pending == set(keys) - set(finished)

    async def restart() -> tuple[dict[str, ExecResult], dict[str, ExecResult], int]:
        async with Engine(slots=2, journal=db) as e:
            resumed = {k: r async for k, r in e.resume()}
            executed = e.stats.executed
            # The trainer, restarted too, resubmits its whole batch: nothing runs again.
            again = {}
            prog = Program(source="import os, time\ntime.sleep(0.25)\nprint(os.urandom(8).hex())")
            async for i, r in e.stream([prog] * 24, Limits(time_s=10), keys=keys):
                again[keys[i]] = r
            assert e.stats.executed == executed
            return resumed, again, executed

    resumed, again, executed = asyncio.run(restart())
    assert set(resumed) == pending and executed == len(pending)  # each unfinished one, once
    assert all(r.ok for r in resumed.values())
    for k in keys:  # finished before the crash: the very same result (not recomputed)
        assert again[k] == (finished[k] if k in finished else resumed[k])
    with Journal(db) as j:
        assert j.counts() == {"done": 24}
        assert all(j.attempts(k) == 1 for k in finished)
    assert_none_left(before)


@pytest.mark.slow
def test_crash_and_resume_soak(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / str(i)).mkdir()
        test_crash_mid_batch_then_resume_runs_each_unfinished_job_exactly_once(tmp_path / str(i))
