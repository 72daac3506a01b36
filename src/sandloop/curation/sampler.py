"""``TaskSampler``: draw training tasks by a curriculum over difficulty tiers, learn difficulty
from live pass rates, and drop reward groups that carry no learning signal.

Used by trainers (the TRL/verl/OpenRLHF adapters and the server) through this Python API. A group
whose rewards are all equal (all 0 or all 1) gives every sample the same advantage, zero, under
group-relative methods (GRPO, DAPO): it costs a step's compute and teaches nothing, so
:meth:`TaskSampler.filter_groups` drops it and counts it.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence
from typing import TypeVar

from sandloop.curation.difficulty import TIERS, Difficulty, Tier, TierThresholds, posterior
from sandloop.tasks import Task

__all__ = ["DEFAULT_CURRICULUM", "TaskSampler"]

# Most weight where learning happens (tasks solved sometimes), little on what is always or never
# solved. Unknown tasks (no observations yet) are drawn like medium ones.
DEFAULT_CURRICULUM: Mapping[Tier, float] = {
    "saturated": 0.05, "easy": 0.2, "medium": 0.45, "hard": 0.25, "unsolved": 0.05,
}

G = TypeVar("G")


class TaskSampler:
    """Draws tasks by tier weight, updates each task's Beta posterior from observed rewards.

    ``curriculum`` maps tiers to relative weights (a tier with no tasks is skipped); ``prior``
    seeds difficulties (e.g. from ``sandloop tasks grade``). Thread-safe; ``seed`` makes draws
    reproducible.
    """

    def __init__(self, tasks: Sequence[Task], *, curriculum: Mapping[Tier, float] | None = None,
                 prior: Mapping[str, Difficulty] | None = None,
                 thresholds: TierThresholds | None = None, seed: int | None = None) -> None:
        if not tasks:
            raise ValueError("TaskSampler needs at least one task")
        self.tasks = {t.id: t for t in tasks}
        self.curriculum = dict(curriculum or DEFAULT_CURRICULUM)
        unknown = set(self.curriculum) - set(TIERS)
        if unknown:
            raise ValueError(f"unknown tiers {sorted(unknown)}; use {', '.join(TIERS)}")
        self.thresholds = thresholds
        self.difficulty: dict[str, Difficulty] = {
            tid: (prior or {}).get(tid) or posterior(0, 0, thresholds) for tid in self.tasks
        }
        self.dropped_groups = 0
        self.kept_groups = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def tier(self, task_id: str) -> Tier:
        """The task's current tier."""
        return self.difficulty[task_id].tier

    def sample(self, n: int) -> list[Task]:
        """``n`` tasks drawn (with replacement) by curriculum weight of their current tier."""
        with self._lock:
            by_tier: dict[Tier, list[str]] = {}
            for tid, d in self.difficulty.items():
                by_tier.setdefault(d.tier, []).append(tid)
            tiers = [t for t in TIERS if by_tier.get(t) and self.curriculum.get(t, 0) > 0]
            if not tiers:  # every populated tier has weight 0: fall back to uniform
                return [self.tasks[self._rng.choice(list(self.tasks))] for _ in range(n)]
            weights = [self.curriculum[t] for t in tiers]
            out: list[Task] = []
            for tier in self._rng.choices(tiers, weights=weights, k=n):
                out.append(self.tasks[self._rng.choice(by_tier[tier])])
            return out

    def update(self, task_id: str, rewards: Sequence[float | None]) -> Difficulty:
        """Fold live rewards of ``task_id`` into its posterior (null rewards are skipped)."""
        known = [min(1.0, max(0.0, r)) for r in rewards if r is not None]
        with self._lock:
            d = self.difficulty[task_id].updated(sum(known), len(known), self.thresholds)
            self.difficulty[task_id] = d
            return d

    def filter_groups(self, groups: Sequence[tuple[str, Sequence[float | None], G]]
                      ) -> list[G]:
        """Update difficulties from ``(task_id, rewards, payload)`` groups and return the payloads
        of the groups whose known rewards vary; the others are counted in ``dropped_groups``."""
        kept: list[G] = []
        for task_id, rewards, payload in groups:
            self.update(task_id, rewards)
            known = [r for r in rewards if r is not None]
            if len(known) >= 2 and max(known) > min(known):
                kept.append(payload)
                self.kept_groups += 1
            else:
                self.dropped_groups += 1
        return kept

    def stats(self) -> dict[str, object]:
        """Tier counts and the dropped/kept group counts."""
        with self._lock:
            tiers = {t: 0 for t in TIERS}
            for d in self.difficulty.values():
                tiers[d.tier] += 1
        return {"tiers": tiers, "dropped_groups": self.dropped_groups,
                "kept_groups": self.kept_groups}
