"""The engine over real sandboxes: runs, streams, priorities, backpressure, deadlines, retries."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
from engine_helpers import assert_none_left, sandbox_processes, until

from sandloop import ExecResult, Limits, Program, Status
from sandloop.engine import (
    DeadlineExceeded,
    Engine,
    EngineClosed,
    LocalBackend,
    QueueFull,
    RateLimited,
    ResourceTooLarge,
)
from sandloop.sandbox.pool import SandboxPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAST = Limits(time_s=5, memory_mb=256)


def sleeper(s: float, tag: str = "") -> Program:
    return Program(source=f"import time\ntime.sleep({s})\nprint({tag!r})")


async def test_run_and_program_failures_are_results(engine: Engine) -> None:
    r = await engine.run(Program(source="print(6 * 7)"), FAST)
    assert r.status is Status.OK and r.stdout == "42\n"
    r = await engine.run(Program(source="raise SystemExit(3)"), FAST)
    assert r.status is Status.RUNTIME_ERROR and r.exit_code == 3
    r = await engine.run(Program(source="while True: pass"), Limits(time_s=0.5))
    assert r.status is Status.TIMEOUT


async def test_an_unknown_environment_is_the_callers_error(engine: Engine) -> None:
    # A request naming an environment that is not built is an input error raised to the
    # caller: it was a sandbox_error ("backend failed: EnvNotFound"), retried, then scored null.
    from sandloop.envs import EnvNotFound
    before = engine.stats.retried
    with pytest.raises(EnvNotFound, match="no environment 'no-such-env'"):
        await engine.run(Program(source="print(1)", environment="no-such-env"), FAST)
    assert engine.stats.retried == before
    r = await engine.run(Program(source="print(1)"), FAST)  # the engine goes on
    assert r.status is Status.OK


async def test_stream_yields_every_job_once_as_they_finish(engine: Engine) -> None:
    progs = [sleeper(0.4 if i == 0 else 0.0, str(i)) for i in range(12)]
    seen = []
    async for i, r in engine.stream(progs, FAST, client="stream-test"):
        assert r.status is Status.OK and r.stdout == f"{i}\n"
        seen.append(i)
    assert sorted(seen) == list(range(12))
    assert seen[0] != 0  # the slow first job did not hold back the others


async def test_stream_accepts_lazy_async_input_and_per_job_limits(engine: Engine) -> None:
    async def gen() -> Any:
        for i in range(5):
            yield Program(source=f"print({i})"), Limits(time_s=2 + i)

    got = {i: r.stdout async for i, r in engine.stream(gen())}
    assert got == {i: f"{i}\n" for i in range(5)}


async def test_high_priority_overtakes_a_low_priority_flood(engine: Engine) -> None:
    order: list[str] = []

    async def one(tag: str, prio: str) -> None:
        r = await engine.run(sleeper(0.15, tag), FAST, priority=prio, client=tag[0])
        order.append(r.stdout.strip())

    flood = [asyncio.create_task(one(f"l{i}", "train")) for i in range(12)]
    await until(lambda: engine.stats.running == 2 and engine.snapshot().queued == 10,
                "the slots busy and the rest of the flood queued")
    evals = [asyncio.create_task(one(f"e{i}", "eval")) for i in range(2)]
    await asyncio.gather(*flood, *evals)
    # Both evals run in the first free slots: no more than the 2 running + 2 more lows first.
    assert max(order.index("e0"), order.index("e1")) <= 5, order


async def test_rate_limit_reject_and_wait(engine: Engine) -> None:
    engine.configure_client("limited", rate=5, burst=2, on_limit="reject")
    p = Program(source="pass")
    await engine.run(p, FAST, client="limited")
    await engine.run(p, FAST, client="limited")
    with pytest.raises(RateLimited, match="limited") as err:
        await engine.run(p, FAST, client="limited")
    assert 0 < err.value.retry_after_s <= 0.2 + 1e-6
    # Another client is not affected.
    assert (await engine.run(p, FAST, client="other")).ok
    engine.configure_client("waiting", rate=10, burst=1, on_limit="wait")
    t0 = time.monotonic()
    rs = await asyncio.gather(*(engine.run(p, FAST, client="waiting") for _ in range(5)))
    assert all(r.ok for r in rs)
    assert time.monotonic() - t0 >= 0.35  # 4 waits of 0.1 s after the first token


async def test_deadline_while_running_and_while_queued(engine: Engine) -> None:
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await engine.run(sleeper(5), FAST, timeout_s=0.5)
    assert time.monotonic() - t0 < 2.0
    # Fill both slots, then a queued job's deadline passes before a slot frees.
    busy = [asyncio.create_task(engine.run(sleeper(1.0), FAST)) for _ in range(2)]
    await until(lambda: engine.stats.running == 2, "both slots busy")
    with pytest.raises(DeadlineExceeded, match="timeout_s"):
        await engine.run(Program(source="print(1)"), FAST, timeout_s=0.3)
    assert all(r.ok for r in await asyncio.gather(*busy))


async def test_cancelled_queued_job_never_runs(engine: Engine) -> None:
    busy = [asyncio.create_task(engine.run(sleeper(0.5), FAST)) for _ in range(2)]
    await until(lambda: engine.stats.running == 2, "both slots busy")
    before = engine.stats.executed
    h = await engine.submit(Program(source="print('never')"), FAST)
    assert h.cancel()
    with pytest.raises(asyncio.CancelledError):
        await h.result()
    await asyncio.gather(*busy)
    # A job queued after it runs after it (same client and priority: first in, first out), so
    # once this one has run, the cancelled one has had its turn, and must not have taken it.
    assert (await engine.run(Program(source="print('after')"), FAST)).stdout == "after\n"
    assert engine.stats.executed == before + 1


async def test_impossible_resources_rejected_up_front(engine: Engine) -> None:
    with pytest.raises(ResourceTooLarge, match="memory_mb"):
        await engine.run(Program(source="pass"), Limits(memory_mb=65536))


async def test_queue_overflow_is_explicit_and_loses_nothing() -> None:
    before = sandbox_processes()
    async with Engine(slots=1, max_queued=3) as e:
        handles = [await e.submit(sleeper(0.2, str(i)), FAST) for i in range(4)]  # 1 runs
        await until(lambda: e.stats.running == 1, "the first job running, three queued")
        with pytest.raises(QueueFull, match="max_queued"):
            e.submit_nowait(Program(source="print('x')"), FAST)
        with pytest.raises(QueueFull):
            await e.submit(Program(source="print('x')"), FAST, block=False)
        # Blocking submission waits for room instead.
        late = await e.submit(Program(source="print('late')"), FAST)
        results = [await h.result() for h in handles] + [await late.result()]
        assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n", "late\n"]
        assert e.stats.rejected == 2 and e.stats.completed == 5
    assert_none_left(before)


async def test_killed_fork_server_mid_run_loses_and_duplicates_nothing() -> None:
    before = sandbox_processes()
    async with Engine(slots=1) as e:
        assert isinstance(e.backend, LocalBackend)
        pool = e.backend.pool
        progs = [sleeper(0.3, str(i)) for i in range(4)]
        results: dict[int, list[ExecResult]] = {}

        async def consume() -> None:
            async for i, r in e.stream(progs, FAST):
                results.setdefault(i, []).append(r)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.15)  # the first job is running
        zygote = pool._slots[0].proc
        assert zygote is not None
        os.kill(zygote.pid, 9)  # fault injection: the fork-server dies under a run
        await task
        assert sorted(results) == [0, 1, 2, 3]
        assert all(len(v) == 1 for v in results.values())
        assert [results[i][0].stdout for i in range(4)] == ["0\n", "1\n", "2\n", "3\n"]
        assert all(v[0].status is Status.OK for v in results.values())
    assert_none_left(before)


class FlakyInfraBackend(LocalBackend):
    """Fault injection: the first ``fail`` executions report an infrastructure failure."""

    def __init__(self, pool: SandboxPool, fail: int) -> None:
        super().__init__(pool)
        self.fail = fail
        self.calls = 0

    async def execute(self, program: Program, limits: Limits, *,
                      on_end: Callable[[], None] | None = None) -> ExecResult:
        self.calls += 1
        if self.calls <= self.fail:
            return ExecResult.sandbox_error("injected: slot broke")
        return await super().execute(program, limits, on_end=on_end)


async def test_infra_failures_retried_with_backoff_then_reported() -> None:
    before = sandbox_processes()
    backend = FlakyInfraBackend(SandboxPool(1), fail=2)
    async with Engine(backend, max_attempts=3, retry_backoff_s=0.05) as e:
        t0 = time.monotonic()
        r = await e.run(Program(source="print('ok')"), FAST)
        assert r.ok and r.stdout == "ok\n" and backend.calls == 3 and e.stats.retried == 2
        assert time.monotonic() - t0 >= 0.05 * 0.5 + 0.1 * 0.5  # backed off twice
        backend.fail, backend.calls = 10, 0
        r = await e.run(Program(source="print('ok')"), FAST)
        assert r.status is Status.SANDBOX_ERROR and "injected" in (r.error or "")
        assert backend.calls == 3 and e.stats.infra_failures == 1
    assert_none_left(before)


async def test_repeat_k_flags_flaky_programs(engine: Engine) -> None:
    stable = await engine.run_repeated(Program(source="print(1)"), FAST, k=3)
    assert not stable.flaky and stable.result.stdout == "1\n" and len(stable.results) == 3
    noisy = await engine.run_repeated(
        Program(source="import os\nprint(os.urandom(8).hex())"), FAST, k=3)
    assert noisy.flaky and noisy.agreement == pytest.approx(1 / 3)


async def test_closed_engine_refuses_and_cancels_queued() -> None:
    before = sandbox_processes()
    e = Engine(slots=1)
    await e.start()
    running = await e.submit(sleeper(0.3), FAST)
    queued = await e.submit(sleeper(0.3), FAST)
    await until(lambda: e.stats.running == 1, "the first job running")
    await e.close()
    assert (await running.result()).ok  # a running job finishes
    with pytest.raises(EngineClosed):
        await queued.result()
    with pytest.raises(EngineClosed):
        await e.run(Program(source="pass"))
    assert_none_left(before)



async def test_preload_reaches_the_engines_slots() -> None:
    probe = Program(source="import sys\nprint('unittest' in sys.modules)")
    async with Engine(slots=1, preload=("unittest",)) as e:
        r = await e.run(probe, Limits(time_s=5))
    assert r.status is Status.OK and r.stdout == "True\n", r


class SlowCleanupBackend(LocalBackend):
    """Fault injection: after the program has ended (``on_end``), the backend takes another
    half second to tidy up before its result comes back."""

    async def execute(self, program: Program, limits: Limits, *,
                      on_end: Callable[[], None] | None = None) -> ExecResult:
        r = await super().execute(program, limits, on_end=on_end)
        await asyncio.sleep(0.5)
        return r


async def test_the_next_job_runs_during_a_finished_runs_cleanup_slow_cleanup_injected() -> None:
    # One CPU of budget, two slots: the second job's program needs the first's CPU, which
    # comes back when the first program ends, not after its cleanup.
    async with Engine(SlowCleanupBackend(SandboxPool(2)), cpus=1) as e:
        t0 = time.monotonic()
        first, second = await asyncio.gather(e.run(sleeper(0.1, "a"), FAST),
                                             e.run(sleeper(0.1, "b"), FAST))
        assert first.ok and second.ok
        assert time.monotonic() - t0 < 0.9  # serial cleanups would take >= 1.2 s


async def test_programs_never_share_the_cpu_budget_while_cleanups_overlap() -> None:
    # Each program writes when it started and ended; with one CPU of budget no two overlap,
    # although the next one starts during the last one's cleanup.
    prog = Program(source="import time\na = time.time()\nx = 0\nfor i in range(300000): x += i\n"
                          "print(a, time.time())")
    async with Engine(slots=3, cpus=1) as e:
        rs = await asyncio.gather(*(e.run(prog, FAST) for _ in range(8)))
    spans = sorted(tuple(map(float, r.stdout.split())) for r in rs)
    assert all(r.ok for r in rs), rs
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, spans
