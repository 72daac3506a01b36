"""Per-step statistics of a training run's rollouts, computed as each step completes.

``StepAggregator`` buffers the rollouts of the steps still open and turns a step into a
``StepStats`` as soon as a rollout of a later step arrives (``lag`` steps later, for trainers
whose workers finish steps out of order), or at ``flush``. The statistics are all the detectors
ever see: they are small, JSON-able, and the only thing kept per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sandloop.monitor.records import Rollout
from sandloop.monitor.signatures import scan_cached

__all__ = ["HIST_EDGES", "INFRA_VERDICTS", "Scanner", "StepAggregator", "StepStats", "compute_step_stats",
           "normalized", "tier_of"]

# Ten bins over [0, 1] (rewards outside are counted in the first or last bin).
HIST_EDGES = tuple(i / 10 for i in range(11))
INFRA_VERDICTS = frozenset({"sandbox_error", "timeout", "memory_limit"})
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
MAX_EXAMPLES = 5
# (task id, completion) -> hack signatures; the default ignores the task (``scan_cached``),
# a ``signatures.TaskScanner`` also matches literal branches against the task's tests.
Scanner = Callable[[str, str], frozenset[str]]


@dataclass(frozen=True, slots=True)
class StepStats:
    """What the monitor knows about one training step. Counts are of rollouts.

    ``group_diversity``: the mean, over groups of two or more rollouts, of (distinct completions
    - 1) / (group size - 1) after normalisation (whitespace and comments removed): 1 when every
    rollout of a group differs, 0 when all are the same. ``infra_bad``: rollouts whose verdict is
    ``sandbox_error``/``timeout``/``memory_limit`` or whose reward is null.
    """

    step: int
    rollouts: int
    scored: int
    null_rewards: int
    reward_mean: float | None
    reward_std: float | None
    reward_min: float | None
    reward_max: float | None
    quantiles: dict[str, float]
    histogram: list[int]
    passed: int
    pass_by_tier: dict[str, list[int]]
    pass_by_source: dict[str, list[int]]
    groups: int
    multi_groups: int
    zero_var_groups: int
    verdicts: dict[str, int]
    infra_bad: int
    sandbox_time_total_s: float
    sandbox_time_p95_s: float | None
    length_mean: float
    length_p50: float
    distinct: int
    group_diversity: float | None
    signatures: dict[str, int]
    hacked: int
    hacked_rewarded: int
    hack_examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.rollouts if self.rollouts else 0.0

    @property
    def infra_share(self) -> float:
        return self.infra_bad / self.rollouts if self.rollouts else 0.0

    @property
    def hack_share(self) -> float:
        return self.hacked / self.rollouts if self.rollouts else 0.0

    @property
    def zero_var_share(self) -> float:
        return self.zero_var_groups / self.multi_groups if self.multi_groups else 0.0

    @property
    def distinct_share(self) -> float:
        return self.distinct / self.rollouts if self.rollouts else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, with the derived shares."""
        d = asdict(self)
        d.update(pass_rate=self.pass_rate, infra_share=self.infra_share,
                 hack_share=self.hack_share, zero_var_share=self.zero_var_share,
                 distinct_share=self.distinct_share)
        return d


def normalized(text: str) -> str:
    """The text with comments and all whitespace removed (near-identical completions match)."""
    if "#" in text:
        text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return "".join(text.split())


def tier_of(difficulty: str | float | None) -> str | None:
    """A difficulty tier name: strings as they are; numbers in [0, 1] as easy/medium/hard
    (thirds); other numbers as their value."""
    if difficulty is None or isinstance(difficulty, str):
        return difficulty
    if 0.0 <= difficulty <= 1.0:
        return "easy" if difficulty < 1 / 3 else "medium" if difficulty < 2 / 3 else "hard"
    return f"{difficulty:g}"


def _excerpt(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def compute_step_stats(step: int, rollouts: Sequence[Rollout],
                       scanner: Scanner | None = None) -> StepStats:
    """The statistics of one step's rollouts (a pure function; ``scanner`` finds the hack
    signatures, default: ``signatures.scan_cached`` of the text alone)."""
    n = len(rollouts)
    rewards = [r.reward for r in rollouts if r.reward is not None]
    arr = np.asarray(rewards, dtype=np.float64)
    mean: float | None
    std: float | None
    lo: float | None
    hi: float | None
    if arr.size:
        qs = np.quantile(arr, QUANTILES)
        quantiles = {f"p{round(q * 100):02d}": float(v) for q, v in zip(QUANTILES, qs,
                                                                         strict=True)}
        hist = np.histogram(np.clip(arr, 0.0, 1.0), bins=HIST_EDGES)[0].tolist()
        mean, std = float(arr.mean()), float(arr.std())
        lo, hi = float(arr.min()), float(arr.max())
    else:
        quantiles, hist = {}, [0] * (len(HIST_EDGES) - 1)
        mean = std = lo = hi = None
    passed = 0
    by_tier: dict[str, list[int]] = {}
    by_source: dict[str, list[int]] = {}
    verdicts: dict[str, int] = {}
    infra = 0
    groups: dict[str, list[Rollout]] = {}
    norms: dict[str, str] = {}
    lengths = np.empty(n, dtype=np.float64)
    times: list[float] = []
    sigs: dict[str, int] = {}
    hacked = hacked_rewarded = 0
    examples: list[dict[str, Any]] = []
    for i, r in enumerate(rollouts):
        v = r.verdict
        ok = (v == "passed") if v is not None else (r.reward is not None and r.reward >= 1.0)
        passed += ok
        vkey = v if v is not None else ("null" if r.reward is None else "unknown")
        verdicts[vkey] = verdicts.get(vkey, 0) + 1
        if r.reward is None or v in INFRA_VERDICTS:
            infra += 1
        tier = tier_of(r.difficulty)
        if tier is not None:
            t = by_tier.setdefault(tier, [0, 0])
            t[0] += ok
            t[1] += 1
        if r.source is not None:
            s = by_source.setdefault(r.source, [0, 0])
            s[0] += ok
            s[1] += 1
        groups.setdefault(r.group_key, []).append(r)
        text = r.completion
        if text not in norms:
            norms[text] = normalized(text)
        lengths[i] = len(text)
        if r.wall_time_s is not None:
            times.append(r.wall_time_s)
        found = scan_cached(text) if scanner is None else scanner(r.task_id, text)
        if found:
            hacked += 1
            rewarded = r.reward is not None and r.reward > 0.5
            hacked_rewarded += rewarded
            for name in found:
                sigs[name] = sigs.get(name, 0) + 1
            if len(examples) < MAX_EXAMPLES or (rewarded and not all(
                    e["reward"] is not None and e["reward"] > 0.5 for e in examples)):
                ex = {"step": step, "task_id": r.task_id, "group": r.group_key,
                      "completion_id": r.completion_id, "reward": r.reward,
                      "signatures": sorted(found), "completion": _excerpt(text)}
                if len(examples) < MAX_EXAMPLES:
                    examples.append(ex)
                else:  # replace an unrewarded example: rewarded hacks are the evidence
                    j = next(k for k, e in enumerate(examples)
                             if e["reward"] is None or e["reward"] <= 0.5)
                    examples[j] = ex
    multi = zero_var = 0
    div_sum = 0.0
    for members in groups.values():
        if len(members) < 2:
            continue
        multi += 1
        rs = {m.reward for m in members if m.reward is not None}
        zero_var += len(rs) <= 1
        div_sum += (len({norms[m.completion] for m in members}) - 1) / (len(members) - 1)
    return StepStats(
        step=step, rollouts=n, scored=len(rewards), null_rewards=n - len(rewards),
        reward_mean=mean, reward_std=std, reward_min=lo, reward_max=hi, quantiles=quantiles,
        histogram=hist, passed=passed, pass_by_tier=by_tier, pass_by_source=by_source,
        groups=len(groups), multi_groups=multi, zero_var_groups=zero_var, verdicts=verdicts,
        infra_bad=infra, sandbox_time_total_s=float(sum(times)),
        sandbox_time_p95_s=float(np.quantile(times, 0.95)) if times else None,
        length_mean=float(lengths.mean()) if n else 0.0,
        length_p50=float(np.median(lengths)) if n else 0.0,
        distinct=len(set(norms.values())),
        group_diversity=div_sum / multi if multi else None,
        signatures=sigs, hacked=hacked, hacked_rewarded=hacked_rewarded, hack_examples=examples)


class StepAggregator:
    """Streams rollouts into per-step statistics.

    A step is complete when a rollout of step ``s + lag + 1`` or later arrives (or at
    ``flush``). Rollouts of a step already completed are counted in ``late`` and dropped: the
    step's statistics have been published.
    """

    def __init__(self, lag: int = 0, scanner: Scanner | None = None) -> None:
        if lag < 0:
            raise ValueError("lag must be >= 0")
        self.lag = lag
        self.scanner = scanner
        self.late = 0
        self._open: dict[int, list[Rollout]] = {}
        self._closed_upto = -1

    def add(self, rollout: Rollout) -> list[StepStats]:
        """Buffer one rollout; returns the statistics of the steps it completes (in order)."""
        s = rollout.step
        if s <= self._closed_upto:
            self.late += 1
            return []
        bucket = self._open.get(s)
        if bucket is None:
            self._open[s] = bucket = []
        bucket.append(rollout)
        return self._close_before(s - self.lag)

    def add_many(self, rollouts: Iterable[Rollout]) -> list[StepStats]:
        out: list[StepStats] = []
        for r in rollouts:
            out.extend(self.add(r))
        return out

    def flush(self) -> list[StepStats]:
        """Complete every open step."""
        return self._close_before(math.inf)

    @property
    def open_steps(self) -> list[int]:
        return sorted(self._open)

    def _close_before(self, bound: float) -> list[StepStats]:
        if not self._open or min(self._open) >= bound:
            return []
        done = sorted(s for s in self._open if s < bound)
        # Every statistic first, then the buckets dropped: should one rollout make the
        # computation raise, no step is lost (all stay open with their rollouts, and a later
        # add or flush computes them again).
        out = [compute_step_stats(s, self._open[s], self.scanner) for s in done]
        for s in done:
            del self._open[s]
        self._closed_upto = max(self._closed_upto, done[-1])
        return out
