"""Difficulty from observed pass rates: a Beta posterior per task and a tier (pure).

The prior is Jeffreys' Beta(1/2, 1/2): with few observations the posterior mean stays away from
0 and 1, so one lucky or unlucky sample does not mark a task ``saturated`` or ``unsolved``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TIERS", "Difficulty", "Tier", "TierThresholds", "grade", "posterior", "tier_of"]

Tier = Literal["saturated", "easy", "medium", "hard", "unsolved"]
TIERS: tuple[Tier, ...] = ("saturated", "easy", "medium", "hard", "unsolved")


class TierThresholds(BaseModel):
    """Lower bounds of the posterior mean pass rate for each tier (``unsolved`` is the rest)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    saturated: float = Field(0.9, gt=0, le=1)
    easy: float = Field(0.6, gt=0, le=1)
    medium: float = Field(0.3, gt=0, le=1)
    hard: float = Field(0.07, gt=0, le=1)


class Difficulty(BaseModel):
    """The Beta posterior of one task's pass rate and the tier it falls in."""

    model_config = ConfigDict(frozen=True)

    alpha: float
    beta: float
    passes: float
    trials: float
    mean: float
    sd: float
    tier: Tier

    def updated(self, passes: float, trials: float,
                thresholds: TierThresholds | None = None) -> Difficulty:
        """The posterior after ``passes`` more successes in ``trials`` more attempts."""
        return posterior(self.passes + passes, self.trials + trials, thresholds)


def tier_of(mean: float, thresholds: TierThresholds | None = None) -> Tier:
    """The tier of a posterior mean pass rate."""
    t = thresholds or TierThresholds()
    if mean >= t.saturated:
        return "saturated"
    if mean >= t.easy:
        return "easy"
    if mean >= t.medium:
        return "medium"
    if mean >= t.hard:
        return "hard"
    return "unsolved"


def posterior(passes: float, trials: float, thresholds: TierThresholds | None = None,
              prior: tuple[float, float] = (0.5, 0.5)) -> Difficulty:
    """The posterior after ``passes`` successes in ``trials`` attempts (rewards in [0, 1] count
    fractionally)."""
    if trials < 0 or passes < 0 or passes > trials:
        raise ValueError(f"need 0 <= passes <= trials, got {passes} of {trials}")
    a, b = prior[0] + passes, prior[1] + trials - passes
    mean = a / (a + b)
    sd = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
    return Difficulty(alpha=a, beta=b, passes=passes, trials=trials, mean=round(mean, 6),
                      sd=round(sd, 6), tier=tier_of(mean, thresholds))


def grade(rewards: Mapping[str, Iterable[float | None]],
          thresholds: TierThresholds | None = None) -> dict[str, Difficulty]:
    """Posteriors from observed rewards per task id (null rewards — unknown — are skipped;
    a reward counts as that fraction of a pass)."""
    out: dict[str, Difficulty] = {}
    for tid, rs in rewards.items():
        known = [min(1.0, max(0.0, r)) for r in rs if r is not None]
        out[tid] = posterior(sum(known), len(known), thresholds)
    return out
