"""``TaskSampler``: draw training tasks by a curriculum over difficulty tiers, learn difficulty
from live pass rates, and drop reward groups that carry no learning signal.

The one curriculum of the project: ``sandloop train`` draws its steps from it, the TRL and verl
adapters wrap it as their trainers' samplers (``sandloop.integrations.curriculum``), and the
server answers ``POST /v1/tasks/sample`` / ``/v1/tasks/feedback`` with it.

Two things steer a draw:

* **tiers** (always): each task's Beta posterior of its pass rate puts it in a tier
  (saturated … unsolved); ``curriculum`` weights the tiers. A group whose rewards are all equal
  (all 0 or all 1) gives every sample the same advantage, zero, under group-relative methods
  (GRPO, DAPO): it costs a step's compute and teaches nothing, so :meth:`TaskSampler.filter_groups`
  drops it, counts it, and (``flat_weight`` < 1) draws that task less until a later group of it
  varies.
* **levels** (``levels=True``): a task's static level (its numeric ``difficulty``, else a
  ``tierN`` tag, else 1) opens in order. Level 1 is open from the start; the next opens when an
  exponential average (weight ``alpha``) of the newest open level's group mean rewards reaches
  ``unlock_at`` after at least ``min_groups`` groups. Opened levels stay in the mix (training on
  the newest level alone made a tiny model forget the others, docs/training.md).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence
from typing import Literal, TypeVar

from sandloop.curation.difficulty import TIERS, Difficulty, Tier, TierThresholds, posterior
from sandloop.tasks import Task

__all__ = ["DEFAULT_CURRICULUM", "UNIFORM_CURRICULUM", "TaskSampler", "level_of"]

# Most weight where learning happens (tasks solved sometimes), little on what is always or never
# solved. Unknown tasks (no observations yet) are drawn like medium ones.
DEFAULT_CURRICULUM: Mapping[Tier, float] = {
    "saturated": 0.05, "easy": 0.2, "medium": 0.45, "hard": 0.25, "unsolved": 0.05,
}
# Every tier alike: with ``weighting="task"`` a uniform draw over the open tasks.
UNIFORM_CURRICULUM: Mapping[Tier, float] = dict.fromkeys(TIERS, 1.0)

G = TypeVar("G")


def level_of(task: Task | str) -> int:
    """A task's static level: its numeric ``difficulty`` (rounded, at least 1), else a ``tierN``
    tag, else 1 (a bare task id is level 1)."""
    if isinstance(task, str):
        return 1
    if isinstance(task.difficulty, int | float) and not isinstance(task.difficulty, bool):
        return max(1, round(task.difficulty))
    for tag in task.tags:
        if tag.startswith("tier") and tag[4:].isdigit():
            return int(tag[4:])
    return 1


class TaskSampler:
    """Draws tasks by tier weight (and open level), updates each task's Beta posterior from
    observed rewards.

    ``tasks``: tasks, or bare task ids (level 1, no difficulty). ``curriculum`` maps tiers to
    relative weights (a tier with no tasks is skipped); ``prior`` seeds difficulties (e.g. from
    ``sandloop tasks grade``). ``weighting``: ``"tier"`` draws a tier by its weight, then a task
    of it (a tier's share does not depend on its size); ``"task"`` weighs each task by its
    tier's weight (with ``UNIFORM_CURRICULUM``: uniform over the tasks). ``flat_weight``: the
    factor on a task whose last group had zero variance. ``levels``: open static levels in order
    (module docstring). Thread-safe; ``seed`` makes draws reproducible.
    """

    def __init__(self, tasks: Sequence[Task | str], *,
                 curriculum: Mapping[Tier, float] | None = None,
                 prior: Mapping[str, Difficulty] | None = None,
                 thresholds: TierThresholds | None = None, seed: int | None = None,
                 weighting: Literal["tier", "task"] = "tier", flat_weight: float = 1.0,
                 levels: bool = False, unlock_at: float = 0.4, min_groups: int = 3,
                 alpha: float = 0.3) -> None:
        if not tasks:
            raise ValueError("TaskSampler needs at least one task")
        if weighting not in ("tier", "task"):
            raise ValueError(f"weighting {weighting!r}: use 'tier' or 'task'")
        if not 0.0 <= flat_weight <= 1.0:
            raise ValueError("flat_weight must be within [0, 1]")
        self.tasks: dict[str, Task | str] = {(t if isinstance(t, str) else t.id): t
                                             for t in tasks}
        self.curriculum = dict(curriculum or DEFAULT_CURRICULUM)
        unknown = set(self.curriculum) - set(TIERS)
        if unknown:
            raise ValueError(f"unknown tiers {sorted(unknown)}; use {', '.join(TIERS)}")
        self.thresholds = thresholds
        self.difficulty: dict[str, Difficulty] = {
            tid: (prior or {}).get(tid) or posterior(0, 0, thresholds) for tid in self.tasks
        }
        self.weighting = weighting
        self.flat_weight = flat_weight
        self.level = {tid: (level_of(t) if levels else 1) for tid, t in self.tasks.items()}
        self.levels = sorted(set(self.level.values()))
        self.unlock_at, self.min_groups, self.alpha = unlock_at, min_groups, alpha
        self.opened = 1
        self.dropped_groups = 0
        self.kept_groups = 0
        self._flat: set[str] = set()
        self._level_mean: dict[int, float] = {}
        self._level_groups: dict[int, int] = {}
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def tier(self, task_id: str) -> Tier:
        """The task's current tier."""
        return self.difficulty[task_id].tier

    def open_levels(self) -> list[int]:
        """The static levels drawn from now (all of them without ``levels=True``)."""
        return self.levels[:self.opened]

    def sample_ids(self, n: int) -> list[str]:
        """``n`` task ids drawn (with replacement) by the curriculum."""
        with self._lock:
            open_ = set(self.open_levels())
            pool = [tid for tid in self.tasks if self.level[tid] in open_]
            factor = {tid: self.flat_weight if tid in self._flat else 1.0 for tid in pool}
            if self.weighting == "task":
                weights = [self.curriculum.get(self.difficulty[tid].tier, 0.0) * factor[tid]
                           for tid in pool]
                if sum(weights) <= 0:  # every open task has weight 0: fall back to uniform
                    return [self._rng.choice(pool) for _ in range(n)]
                return self._rng.choices(pool, weights=weights, k=n)
            by_tier: dict[Tier, list[str]] = {}
            for tid in pool:
                by_tier.setdefault(self.difficulty[tid].tier, []).append(tid)
            tiers = [t for t in TIERS if by_tier.get(t) and self.curriculum.get(t, 0) > 0]
            if not tiers:  # every populated tier has weight 0: fall back to uniform
                return [self._rng.choice(pool) for _ in range(n)]
            out: list[str] = []
            for tier in self._rng.choices(tiers, weights=[self.curriculum[t] for t in tiers],
                                          k=n):
                members = by_tier[tier]
                out.extend(self._rng.choices(members, weights=[factor[m] for m in members]))
            return out

    def sample(self, n: int) -> list[Task]:
        """``n`` tasks drawn (with replacement) by the curriculum (needs ``Task`` objects)."""
        out = []
        for tid in self.sample_ids(n):
            t = self.tasks[tid]
            if isinstance(t, str):
                raise TypeError("this sampler holds task ids only; use sample_ids()")
            out.append(t)
        return out

    def update(self, task_id: str, rewards: Sequence[float | None]) -> Difficulty:
        """Fold live rewards of ``task_id`` into its posterior (null rewards are skipped)."""
        known = [min(1.0, max(0.0, r)) for r in rewards if r is not None]
        with self._lock:
            d = self.difficulty[task_id].updated(sum(known), len(known), self.thresholds)
            self.difficulty[task_id] = d
            if known:
                self._observe_level(self.level[task_id], sum(known) / len(known))
            return d

    def _observe_level(self, level: int, mean: float) -> None:
        old = self._level_mean.get(level)
        self._level_mean[level] = mean if old is None else \
            (1 - self.alpha) * old + self.alpha * mean
        self._level_groups[level] = self._level_groups.get(level, 0) + 1
        while self.opened < len(self.levels):
            newest = self.levels[self.opened - 1]
            if (self._level_groups.get(newest, 0) < self.min_groups
                    or self._level_mean.get(newest, 0.0) < self.unlock_at):
                break
            self.opened += 1

    def filter_groups(self, groups: Sequence[tuple[str, Sequence[float | None], G]]
                      ) -> list[G]:
        """Update difficulties from ``(task_id, rewards, payload)`` groups and return the payloads
        of the groups whose known rewards vary; the others are counted in ``dropped_groups``.
        Task ids this sampler does not hold are skipped (not counted)."""
        kept: list[G] = []
        for task_id, rewards, payload in groups:
            if task_id not in self.tasks:
                continue
            self.update(task_id, rewards)
            known = [r for r in rewards if r is not None]
            with self._lock:
                if len(known) >= 2 and max(known) > min(known):
                    kept.append(payload)
                    self.kept_groups += 1
                    self._flat.discard(task_id)
                else:
                    self.dropped_groups += 1
                    if len(known) >= 2:  # one known reward says nothing about variance
                        self._flat.add(task_id)
        return kept

    def stats(self) -> dict[str, object]:
        """Tier counts, the open levels and the dropped/kept group counts."""
        with self._lock:
            tiers = {t: 0 for t in TIERS}
            for d in self.difficulty.values():
                tiers[d.tier] += 1
        return {"tiers": tiers, "open_levels": self.open_levels(),
                "dropped_groups": self.dropped_groups, "kept_groups": self.kept_groups}
