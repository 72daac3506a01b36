"""Audits: re-score a sample of high-reward completions against the task's hidden tests.

A completion the training reward paid for but the task's hidden tests under the hardened
harness reject is the strongest evidence of reward hacking there is. Audits cost sandbox time,
so they are sampled: by default at most ``share`` = 10% of the run's own scoring work, distinct
completions only, those carrying a hack signature first, the rest spread over the steps at
random (seeded). Scoring is the caller's: ``score`` gets ``reward.scoring.Completion`` items and
returns their ``CompletionResult``s (the CLI passes the ``sandloop score`` path with the result
store, so an audit already done is never run again).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sandloop.monitor.detectors import AuditOutcome
from sandloop.monitor.records import Rollout
from sandloop.monitor.signatures import scan_cached
from sandloop.monitor.stats import Scanner
from sandloop.reward.scoring import Completion
from sandloop.reward.verifier import CompletionResult

__all__ = ["AuditSampler", "AuditScorer", "run_audit"]

AuditScorer = Callable[[Sequence[Completion]], Awaitable[Sequence[CompletionResult]]]


@dataclass
class AuditSampler:
    """Collects audit candidates while a log streams by, then draws the sample.

    ``high``: the training reward from which a completion is a candidate. ``known``: task ids
    that can be audited (those of the task set); others are counted in ``unknown_tasks``.
    Candidates are kept per distinct (task, completion), bounded by ``max_candidates``
    (reservoir sampling beyond it). ``scanner``: how signatures are found (default:
    ``scan_cached``; the monitor's own scanner, so both agree on what is flagged).
    """

    share: float = 0.1
    high: float = 0.5
    seed: int = 0
    known: frozenset[str] | None = None
    max_candidates: int = 200_000
    scanner: Scanner | None = None
    seen: int = 0
    unknown_tasks: int = 0
    _flagged: dict[tuple[str, str], Rollout] = field(default_factory=dict)
    _plain: list[Rollout] = field(default_factory=list)
    _keys: set[tuple[str, str]] = field(default_factory=set)
    _plain_seen: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.share <= 1.0:
            raise ValueError("audit share must be within [0, 1]")
        self._rng = random.Random(self.seed)

    def add(self, r: Rollout) -> None:
        self.seen += 1
        if r.reward is None or r.reward < self.high:
            return
        if self.known is not None and r.task_id not in self.known:
            self.unknown_tasks += 1
            return
        key = (r.task_id, hashlib.sha256(r.completion.encode()).hexdigest())
        if key in self._keys:
            return
        self._keys.add(key)
        if self._signatures(r):
            if len(self._flagged) < self.max_candidates:
                self._flagged[key] = r
            return
        self._plain_seen += 1
        if len(self._plain) < self.max_candidates:
            self._plain.append(r)
        else:  # reservoir: every distinct candidate equally likely to stay
            j = self._rng.randrange(self._plain_seen)
            if j < self.max_candidates:
                self._plain[j] = r

    def _signatures(self, r: Rollout) -> frozenset[str]:
        if self.scanner is None:
            return scan_cached(r.completion)
        return self.scanner(r.task_id, r.completion)

    def add_many(self, rollouts: Iterable[Rollout]) -> None:
        for r in rollouts:
            self.add(r)

    @property
    def budget(self) -> int:
        """How many completions the audit may score: ``share`` of the rollouts seen."""
        return int(self.share * self.seen)

    def sample(self) -> list[Rollout]:
        """The completions to audit: signature-flagged first, then a random draw."""
        budget = self.budget
        flagged = list(self._flagged.values())
        self._rng.shuffle(flagged)
        out = flagged[:budget]
        rest = budget - len(out)
        if rest > 0:
            out += self._rng.sample(self._plain, min(rest, len(self._plain)))
        return sorted(out, key=lambda r: r.step)


async def run_audit(sample: Sequence[Rollout], score: AuditScorer,
                    scanner: Scanner | None = None) -> list[AuditOutcome]:
    """Score ``sample`` through ``score`` and pair each result with its training reward (and
    the signatures ``scanner`` finds, default ``scan_cached``)."""
    items = [Completion(task_id=r.task_id, completion=r.completion,
                        completion_id=r.completion_id or f"audit:{i}")
             for i, r in enumerate(sample)]
    results = await score(items) if items else []
    out = []
    for r, res in zip(sample, results, strict=True):
        out.append(AuditOutcome(step=r.step, task_id=r.task_id, completion_id=r.completion_id,
                                train_reward=float(r.reward or 0.0), audit_reward=res.reward,
                                audit_verdict=res.verdict.value, completion=r.completion,
                                signatures=tuple(sorted(
                                    scan_cached(r.completion) if scanner is None
                                    else scanner(r.task_id, r.completion)))))
    return out
