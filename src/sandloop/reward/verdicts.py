"""Verdicts, reward shaping and pass@k: pure functions over per-test outcomes.

A reward is a float, or ``None`` when the infrastructure failed (a ``sandbox_error`` that
persisted through retries): that is "unknown", never 0, and the reason travels with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "RewardConfig",
    "ScoreSummary",
    "TestOutcome",
    "Verdict",
    "counted_tests",
    "overall_verdict",
    "pass_at_k",
    "shape_reward",
    "summarize",
]


class Verdict(StrEnum):
    """Outcome of one test (and, aggregated, of one completion)."""

    PASSED = "passed"
    WRONG_ANSWER = "wrong_answer"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    COMPILE_ERROR = "compile_error"
    SANDBOX_ERROR = "sandbox_error"


class TestOutcome(BaseModel):
    """The verdict of one test, with a short reason for anything but ``passed``."""

    model_config = ConfigDict(frozen=True)
    __test__ = False  # not a pytest test class

    name: str
    verdict: Verdict
    hidden: bool
    weight: float = 1.0
    time_s: float | None = None
    detail: str | None = None


class RewardConfig(BaseModel):
    """How per-test verdicts become one reward.

    ``mode``: ``binary`` (1 if every counted test passed), ``fraction`` (share passed), ``weighted``
    (share of test weight passed). ``on``: which tests count — ``hidden`` (falls back to all tests
    when a task has no hidden ones), ``public`` or ``all``. ``compile_error_reward`` and
    ``format_error_reward`` replace the reward when the completion does not compile or has no
    usable code (a negative value penalises them more than a wrong answer).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["binary", "fraction", "weighted"] = "binary"
    on: Literal["hidden", "public", "all"] = "hidden"
    compile_error_reward: float = 0.0
    format_error_reward: float = 0.0


# Order in which a completion's overall verdict is chosen when tests disagree: infrastructure
# first (the score is unknown), then "did not build", then the first failing test.
_PRIORITY = (Verdict.SANDBOX_ERROR, Verdict.COMPILE_ERROR)


def overall_verdict(outcomes: Sequence[TestOutcome]) -> Verdict:
    """``passed`` if every test passed; otherwise the most telling failure."""
    verdicts = [o.verdict for o in outcomes]
    for v in _PRIORITY:
        if v in verdicts:
            return v
    for v in verdicts:
        if v is not Verdict.PASSED:
            return v
    return Verdict.PASSED


def counted_tests(outcomes: Sequence[TestOutcome], on: str) -> list[TestOutcome]:
    """The outcomes that a reward ``on`` ``hidden``/``public``/``all`` tests counts (``hidden``
    falls back to all tests when there are no hidden ones)."""
    if on == "all":
        return list(outcomes)
    hidden = [o for o in outcomes if o.hidden]
    if on == "hidden":
        return hidden or list(outcomes)
    return [o for o in outcomes if not o.hidden]


def shape_reward(
    outcomes: Sequence[TestOutcome],
    config: RewardConfig | None = None,
    *,
    format_error: bool = False,
) -> tuple[float | None, str | None]:
    """Reward for one completion and, when it is ``None``, the reason.

    Any ``sandbox_error`` among the counted tests makes the reward ``None``: part of the evidence
    is missing, and guessing 0 would punish the model for the infrastructure's fault.
    """
    cfg = config or RewardConfig()
    if format_error:
        return cfg.format_error_reward, None
    counted = counted_tests(outcomes, cfg.on)
    if not counted:
        return None, f"no {cfg.on} tests to score"
    broken = [o for o in counted if o.verdict is Verdict.SANDBOX_ERROR]
    if broken:
        return None, f"sandbox_error: {broken[0].detail or 'infrastructure failure'}"
    if any(o.verdict is Verdict.COMPILE_ERROR for o in counted):
        return cfg.compile_error_reward, None
    passed = [o for o in counted if o.verdict is Verdict.PASSED]
    if cfg.mode == "binary":
        return (1.0 if len(passed) == len(counted) else 0.0), None
    if cfg.mode == "fraction":
        return len(passed) / len(counted), None
    total = sum(o.weight for o in counted)
    if total <= 0:
        return (1.0 if len(passed) == len(counted) else 0.0), None
    return sum(o.weight for o in passed) / total, None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator (Chen et al. 2021): 1 - C(n-c, k) / C(n, k).

    ``n`` samples, ``c`` of them correct. Computed as a product, which stays exact-ish for large n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if k < 1 or k > n:
        raise ValueError(f"k must be in 1..n (n={n}), got {k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


class ScoreSummary(BaseModel):
    """Aggregate over many scored completions."""

    model_config = ConfigDict(frozen=True)

    completions: int
    tasks: int
    scored: int = Field(description="completions with a non-null reward")
    null_rewards: int
    mean_reward: float | None
    pass_at_k: dict[str, float] = Field(description="'pass@1', 'pass@k' ... averaged over tasks")
    verdicts: dict[str, int] = Field(description="overall verdict -> completions")
    test_verdicts: dict[str, int] = Field(description="per-test verdict -> tests")


def summarize(
    rows: Iterable[tuple[str, float | None, Verdict, Sequence[TestOutcome]]],
    ks: Sequence[int] = (1, 10, 100),
) -> ScoreSummary:
    """Summarise (task id, reward, overall verdict, outcomes) rows.

    A completion counts as correct for pass@k when its reward is exactly 1.0. Completions with a
    null reward are left out of pass@k (their result is unknown) and counted separately. pass@k is
    reported for each k that does not exceed the number of scored samples of every task.
    """
    per_task: dict[str, list[bool]] = {}
    verdicts: dict[str, int] = {}
    tests: dict[str, int] = {}
    rewards: list[float] = []
    n_rows = nulls = 0
    for task_id, reward, verdict, outcomes in rows:
        n_rows += 1
        verdicts[verdict.value] = verdicts.get(verdict.value, 0) + 1
        for o in outcomes:
            tests[o.verdict.value] = tests.get(o.verdict.value, 0) + 1
        per_task.setdefault(task_id, [])
        if reward is None:
            nulls += 1
            continue
        rewards.append(reward)
        per_task[task_id].append(reward == 1.0)
    scored_tasks = {t: v for t, v in per_task.items() if v}
    pk: dict[str, float] = {}
    if scored_tasks:
        n_min = min(len(v) for v in scored_tasks.values())
        for k in ks:
            if k <= n_min:
                vals = [pass_at_k(len(v), sum(v), k) for v in scored_tasks.values()]
                pk[f"pass@{k}"] = math.fsum(vals) / len(vals)
    return ScoreSummary(
        completions=n_rows,
        tasks=len(per_task),
        scored=len(rewards),
        null_rewards=nulls,
        mean_reward=(math.fsum(rewards) / len(rewards)) if rewards else None,
        pass_at_k=pk,
        verdicts=dict(sorted(verdicts.items())),
        test_verdicts=dict(sorted(tests.items())),
    )
