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
        """The rewards each task's group got at ``step`` (``None``: infrastructure failure)."""
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
    """Easy tiers first; the next tier opens when the open ones pass often enough.

    Within the open tiers a task is drawn with weight ``p(1-p) + floor`` where ``p`` is its pass
    rate (``prior`` before it was tried): tasks the policy always or never solves give GRPO no
    signal, so they are drawn rarely; ``floor`` keeps every task reachable. A task whose whole
    group got the same reward is counted as a dropped group.
    """

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0, unlock_at: float = 0.5,
                 floor: float = 0.02, prior: float = 0.5, min_tried: int = 8) -> None:
        if not tasks:
            raise ValueError("the curriculum needs at least one training task")
        self.tiers: dict[int, list[str]] = {}
        for t in tasks:
            self.tiers.setdefault(tier_of(t), []).append(t.id)
        self.order = sorted(self.tiers)
        self.open = 1
        self.unlock_at, self.floor, self.prior, self.min_tried = unlock_at, floor, prior, min_tried
        self.rng = random.Random(seed)
        self._dropped = 0
        self._groups = 0

    def open_tiers(self) -> list[int]:
        """The tiers drawn from now."""
        return self.order[:self.open]

    def draw(self, n: int, pass_rates: Mapping[str, float]) -> list[str]:
        self._maybe_unlock(pass_rates)
        pool = [tid for tier in self.open_tiers() for tid in self.tiers[tier]]
        weights = []
        for tid in pool:
            p = pass_rates.get(tid, self.prior)
            weights.append(p * (1 - p) + self.floor)
        return self.rng.choices(pool, weights=weights, k=n)

    def _maybe_unlock(self, pass_rates: Mapping[str, float]) -> None:
        while self.open < len(self.order):
            ids = [tid for tier in self.open_tiers() for tid in self.tiers[tier]]
            seen = [pass_rates[t] for t in ids if t in pass_rates]
            if len(seen) < self.min_tried or sum(seen) / len(seen) < self.unlock_at:
                return
            self.open += 1

    def update(self, step: int, rewards: Mapping[str, Sequence[float | None]]) -> None:
        for values in rewards.values():
            known = [r for r in values if r is not None]
            self._groups += 1
            if len(known) > 1 and max(known) == min(known):
                self._dropped += 1

    def dropped(self) -> int:
        return self._dropped

    def groups(self) -> int:
        """How many groups were reported so far."""
        return self._groups
