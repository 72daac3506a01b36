"""Which tasks the next training batch asks about: the ``Curriculum`` protocol and a tiered one.

The loop talks to a curriculum through three calls only, so a richer sampler (the curation
layer's ``TaskSampler``) plugs in without touching the loop: ``draw`` picks a batch of task ids
given the per-task pass rates observed so far, ``update`` reports the rewards of one step's
groups, ``dropped`` says how many zero-variance groups (every completion got the same reward, so
GRPO has no signal there) were seen and left out of the tasks drawn next.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from sandloop.tasks import Task

__all__ = ["Curriculum", "TieredCurriculum", "tier_of"]


@runtime_checkable
class Curriculum(Protocol):
    """A task sampler the training loop can steer by observed rewards."""

    def draw(self, n: int, pass_rates: Mapping[str, float]) -> list[str]:
        """``n`` task ids for the next step (repeats allowed when the pool is small)."""
        ...

    def update(self, step: int, rewards: Mapping[str, Sequence[float | None]]) -> None:
        """The rewards of ``step``'s groups, by task id (``None``: infrastructure failure)."""
        ...

    def dropped(self) -> int:
        """How many zero-variance groups have been seen (and steered away from) so far."""
        ...


def tier_of(task: Task) -> int:
    """A task's tier: its numeric ``difficulty`` (rounded), else a ``tierN`` tag, else 1."""
    if isinstance(task.difficulty, int | float):
        return max(1, round(task.difficulty))
    for tag in task.tags:
        if tag.startswith("tier") and tag[4:].isdigit():
            return int(tag[4:])
    return 1


class TieredCurriculum:
    """Easy tiers first, the easier ones kept in the mix; zero-variance groups steered away from.

    The next tier opens when the newest open tier's recent groups pass often enough: an
    exponential average (weight ``alpha``) of its groups' mean rewards ≥ ``unlock_at`` after at
    least ``min_groups`` groups. Within the open tiers a task is drawn with weight 1, or
    ``dropped_weight`` while its last group had zero variance (every completion got the same
    reward, so GRPO had no signal there: always solved or never); such groups are counted.
    """

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0, unlock_at: float = 0.4,
                 min_groups: int = 3, alpha: float = 0.3, dropped_weight: float = 0.25) -> None:
        if not tasks:
            raise ValueError("the curriculum needs at least one training task")
        self.tiers: dict[int, list[str]] = {}
        self.tier: dict[str, int] = {}
        for t in tasks:
            self.tiers.setdefault(tier_of(t), []).append(t.id)
            self.tier[t.id] = tier_of(t)
        self.order = sorted(self.tiers)
        self.open = 1
        self.unlock_at, self.min_groups, self.alpha = unlock_at, min_groups, alpha
        self.dropped_weight = dropped_weight
        self.rng = random.Random(seed)
        self._flat: set[str] = set()
        self._recent: dict[int, float] = {}
        self._seen: dict[int, int] = {}
        self._dropped = 0
        self._groups = 0

    def open_tiers(self) -> list[int]:
        """The tiers drawn from now."""
        return self.order[:self.open]

    def draw(self, n: int, pass_rates: Mapping[str, float]) -> list[str]:
        pool = [tid for tier in self.open_tiers() for tid in self.tiers[tier]]
        weights = [self.dropped_weight if tid in self._flat else 1.0 for tid in pool]
        return self.rng.choices(pool, weights=weights, k=n)

    def update(self, step: int, rewards: Mapping[str, Sequence[float | None]]) -> None:
        for tid, values in rewards.items():
            known = [r for r in values if r is not None]
            self._groups += 1
            if not known:
                continue
            if len(known) > 1 and max(known) == min(known):
                self._dropped += 1
                self._flat.add(tid)
            else:
                self._flat.discard(tid)
            tier = self.tier.get(tid)
            if tier is None:
                continue
            mean = sum(known) / len(known)
            old = self._recent.get(tier)
            self._recent[tier] = mean if old is None else (1 - self.alpha) * old + self.alpha * mean
            self._seen[tier] = self._seen.get(tier, 0) + 1
        while self.open < len(self.order):
            newest = self.order[self.open - 1]
            if (self._seen.get(newest, 0) < self.min_groups
                    or self._recent.get(newest, 0.0) < self.unlock_at):
                break
            self.open += 1

    def dropped(self) -> int:
        return self._dropped

    def groups(self) -> int:
        """How many groups were reported so far."""
        return self._groups
