"""Pure scheduling logic: token bucket, weighted-fair priority queue, admission, repeat-k."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sandloop import ExecResult, Status
from sandloop.engine.repeat import aggregate
from sandloop.engine.scheduling import (
    Admission,
    FairQueue,
    QueueFull,
    ResourceTooLarge,
    TokenBucket,
)


@dataclass(eq=False)
class J:
    client: str
    priority: int = 0
    memory_mb: int = 100
    cpus: float = 1.0
    n: int = 0


def drain(q: FairQueue[J], fits: object = None) -> list[J]:
    out = []
    while (j := q.pop(fits)) is not None:  # type: ignore[arg-type]
        out.append(j)
    return out


# -- token bucket --------------------------------------------------------------------------------

def test_bucket_burst_then_rate() -> None:
    b = TokenBucket(rate=10, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(0.0) == pytest.approx(0.1)  # one token every 0.1 s
    assert b.take(0.05) == pytest.approx(0.05)  # refused takes nothing
    assert b.take(0.1) == 0.0
    assert b.take(10.0) == 0.0 and b.available(10.0) == pytest.approx(2.0)  # capped at burst


def test_bucket_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(0, 1, 0.0)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(1, 0.5, 0.0)
    with pytest.raises(ValueError, match="cannot take"):
        TokenBucket(1, 2, 0.0).take(0.0, 3)


# -- fair queue ----------------------------------------------------------------------------------

def test_strict_priority_and_fifo_per_client() -> None:
    q: FairQueue[J] = FairQueue(100)
    low = [J("a", 0, n=i) for i in range(3)]
    high = [J("a", 10, n=i) for i in range(3)]
    for x, y in zip(low, high, strict=True):
        q.push(x)
        q.push(y)
    assert drain(q) == high + low


def test_weighted_fairness_between_clients() -> None:
    q: FairQueue[J] = FairQueue(1000)
    q.set_weight("big", 2.0)
    for i in range(300):
        q.push(J("big", n=i))
        q.push(J("small", n=i))
    first = [q.pop() for _ in range(90)]
    counts = {c: sum(1 for j in first if j is not None and j.client == c) for c in ("big", "small")}
    assert counts == {"big": 60, "small": 30}


def test_flooding_client_cannot_starve_a_late_one() -> None:
    q: FairQueue[J] = FairQueue(10_000)
    for i in range(5000):
        q.push(J("flood", n=i))
    for _ in range(100):
        q.pop()
    for i in range(3):
        q.push(J("late", n=i))
    nxt = [q.pop() for _ in range(6)]
    assert sum(1 for j in nxt if j is not None and j.client == "late") == 3


def test_idle_client_gets_no_credit_for_idling() -> None:
    q: FairQueue[J] = FairQueue(10_000)
    for i in range(1000):
        q.push(J("busy", n=i))
    for _ in range(500):
        q.pop()
    for i in range(100):
        q.push(J("idle", n=i))
    nxt = [q.pop() for _ in range(20)]
    # Alternation, not 100 "idle" jobs in a row to make up for the 500 it did not use.
    assert sum(1 for j in nxt if j is not None and j.client == "idle") == 10


def test_capacity_and_push_front() -> None:
    q: FairQueue[J] = FairQueue(2)
    a, b, c = J("x", n=1), J("x", n=2), J("x", n=3)
    q.push(a)
    q.push(b)
    with pytest.raises(QueueFull, match="max_queued"):
        q.push(c)
    first = q.pop()
    assert first is a
    q.push_front(a)  # a retry goes back first
    q.push_front(c)  # and is never refused for capacity
    assert len(q) == 3 and drain(q) == [c, a, b]


def test_backfill_packs_small_jobs_but_never_starves_the_big_one() -> None:
    q: FairQueue[J] = FairQueue(100, max_bypass=3)
    big = J("a", memory_mb=900)
    q.push(big)
    smalls = [J("b", memory_mb=100, n=i) for i in range(10)]
    for s in smalls:
        q.push(s)
    free = {"mem": 500}

    def fits(j: J) -> bool:
        return j.memory_mb <= free["mem"]

    # The big job does not fit: three small ones go ahead, then the queue holds for it.
    assert [q.pop(fits) for _ in range(4)] == [smalls[0], smalls[1], smalls[2], None]
    free["mem"] = 1000
    assert q.pop(fits) is big
    assert q.pop(fits) is smalls[3]


def test_peek_and_drain() -> None:
    q: FairQueue[J] = FairQueue(10)
    assert q.peek() is None and q.pop() is None
    a = J("x", 5)
    q.push(J("y"))
    q.push(a)
    assert q.peek() is a
    assert len(q.drain()) == 2 and len(q) == 0 and q.pop() is None


def test_bad_weight_rejected() -> None:
    with pytest.raises(ValueError, match="weight"):
        FairQueue[J](10).set_weight("x", 0)


# -- admission -----------------------------------------------------------------------------------

def test_admission_by_slots_memory_and_cpu() -> None:
    adm = Admission(slots=4, memory_mb=1000, cpus=2)
    half = J("x", memory_mb=100, cpus=0.5)
    assert adm.fits(half)
    for _ in range(4):
        adm.acquire(half)
    assert not adm.fits(half)  # slots exhausted (CPU too: 4 x 0.5 = 2)
    adm.release(half)
    assert adm.fits(half)
    assert not adm.fits(J("x", memory_mb=800, cpus=0.1))  # 700 MiB free
    big_cpu = J("x", memory_mb=10, cpus=1.0)
    assert not adm.fits(big_cpu)  # 0.5 CPU free
    for _ in range(3):
        adm.release(half)
    assert adm.idle


def test_admission_rejects_impossible_jobs() -> None:
    adm = Admission(slots=2, memory_mb=1000, cpus=2)
    with pytest.raises(ResourceTooLarge, match="memory_mb"):
        adm.check(J("x", memory_mb=2000))
    with pytest.raises(ResourceTooLarge, match="cpus"):
        adm.check(J("x", cpus=4))
    adm.check(J("x", memory_mb=1000, cpus=2))


# -- repeat-k aggregation ------------------------------------------------------------------------

def _r(status: Status, out: str = "", wall: float = 1.0) -> ExecResult:
    return ExecResult(status=status, stdout=out, wall_time_s=wall)


def test_majority_and_flakiness() -> None:
    agg = aggregate([_r(Status.OK, "1", 1.0), _r(Status.TIMEOUT, "", 3.0), _r(Status.OK, "1", 2.0)])
    assert agg.status is Status.OK and agg.flaky and agg.agreement == pytest.approx(2 / 3)
    assert agg.mean_wall_time_s == pytest.approx(2.0)
    stable = aggregate([_r(Status.OK, "1")] * 3)
    assert not stable.flaky and stable.agreement == 1.0


def test_infra_failures_do_not_vote() -> None:
    agg = aggregate([_r(Status.SANDBOX_ERROR), _r(Status.RUNTIME_ERROR), _r(Status.SANDBOX_ERROR)])
    assert agg.status is Status.RUNTIME_ERROR and not agg.flaky and agg.infra_failures == 2
    allbad = aggregate([_r(Status.SANDBOX_ERROR)] * 2)
    assert allbad.status is Status.SANDBOX_ERROR and allbad.agreement == 0.0


def test_custom_verdict_and_tie() -> None:
    rs = [_r(Status.OK, "a"), _r(Status.OK, "b")]
    assert aggregate(rs).flaky and aggregate(rs).result.stdout == "a"  # tie: first seen
    assert not aggregate(rs, verdict=lambda r: r.status).flaky


def test_reserve_lets_high_priority_in_past_a_saturating_flood() -> None:
    adm = Admission(slots=4, memory_mb=10_000, cpus=2, reserve_slots=1, reserve_cpus=1,
                    reserve_priority=100)
    low, high = J("t", 0), J("e", 100)
    adm.acquire(low)
    adm.acquire(low)
    assert not adm.fits(low)  # CPU budget used up by ordinary jobs
    assert adm.fits(high)  # the reserve: one core of overcommit for high priority
    adm.acquire(high)
    assert not adm.fits(high)
    small = J("t", 0, cpus=0.25)
    adm.release(high)
    adm.release(low)
    adm.acquire(small)
    adm.acquire(small)
    assert adm.free_slots == 1 and not adm.fits(small)  # the last slot is kept for high
    with pytest.raises(ValueError, match="reserve_slots"):
        Admission(slots=1, memory_mb=10, cpus=1, reserve_slots=1)
