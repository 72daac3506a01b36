"""Repeat-k aggregation (pure): majority verdict, mean measurements, and a flakiness flag."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from sandloop.sandbox.models import ExecResult, Status

__all__ = ["RepeatedResult", "aggregate", "default_verdict"]


def default_verdict(r: ExecResult) -> Hashable:
    """What must agree between repeats: the status and the program's stdout."""
    return (r.status.value, r.stdout)


@dataclass(frozen=True)
class RepeatedResult:
    """``k`` runs of one program, aggregated.

    ``result`` is the first run whose verdict is the majority verdict (ties: the verdict seen
    first). ``flaky`` is True when runs that completed disagree. ``agreement`` is the majority's
    share of completed runs. Means are over completed runs; runs that failed for infrastructure
    reasons (``sandbox_error``) do not vote and are counted in ``infra_failures``; when every run
    failed that way, ``result`` is the first of them.
    """

    result: ExecResult
    results: tuple[ExecResult, ...]
    flaky: bool
    agreement: float
    infra_failures: int
    mean_wall_time_s: float
    mean_cpu_time_s: float
    mean_peak_memory_mb: float

    @property
    def status(self) -> Status:
        return self.result.status


def aggregate(results: Sequence[ExecResult],
              verdict: Callable[[ExecResult], Hashable] | None = None) -> RepeatedResult:
    """Aggregate repeated runs of one program (see RepeatedResult)."""
    if not results:
        raise ValueError("aggregate needs at least one result")
    key = verdict or default_verdict
    voters = [r for r in results if r.status is not Status.SANDBOX_ERROR]
    infra = len(results) - len(voters)
    if not voters:
        return RepeatedResult(results[0], tuple(results), False, 0.0, infra, 0.0, 0.0, 0.0)
    votes = Counter(key(r) for r in voters)
    best = max(votes.values())
    # Ties go to the verdict seen first, so the choice is deterministic.
    winner = next(key(r) for r in voters if votes[key(r)] == best)
    chosen = next(r for r in voters if key(r) == winner)
    n = len(voters)
    return RepeatedResult(
        result=chosen, results=tuple(results), flaky=len(votes) > 1, agreement=best / n,
        infra_failures=infra,
        mean_wall_time_s=sum(r.wall_time_s for r in voters) / n,
        mean_cpu_time_s=sum(r.cpu_time_s for r in voters) / n,
        mean_peak_memory_mb=sum(r.peak_memory_mb for r in voters) / n,
    )
