"""The curation layer's ``TaskSampler`` as each trainer's data sampler (torch-free).

* TRL: :class:`CurriculumIndices` yields dataset indices, per step ``prompts`` tasks drawn from
  the sampler, each repeated ``generations`` times (one GRPO group). Return it from
  ``GRPOTrainer._get_train_sampler`` (``sandloop train`` does); feed rewards back with
  ``sandloop_reward(curriculum=sampler)``.
* verl: :class:`~sandloop.integrations.verl_curriculum.VerlCurriculumSampler` implements verl's curriculum-sampler interface
  (``AbstractCurriculumSampler``: ``__init__(data_source, data_config)``, ``__iter__``,
  ``__len__``, ``update(batch)``).
* OpenRLHF has no sampler hook: draw prompts through ``POST /v1/tasks/sample`` of a
  ``sandloop serve`` and report rewards to ``/v1/tasks/feedback`` (docs/curation.md).

Draws are lazy: each step's tasks are drawn when the data loader asks for them, so they see the
rewards reported up to then.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from sandloop.curation.sampler import TaskSampler

__all__ = ["CurriculumIndices", "groups_of", "task_id_of_row"]


class CurriculumIndices:
    """Dataset indices for ``steps`` steps of ``prompts`` tasks times ``generations`` repeats.

    ``index_of`` maps a task id to its dataset row (or rows: one is picked at random). Any
    object with ``__iter__`` and ``__len__`` is a sampler to torch's ``DataLoader``; this one
    needs no torch.
    """

    def __init__(self, sampler: TaskSampler, index_of: Mapping[str, int | Sequence[int]], *,
                 prompts: int, generations: int = 1, steps: int, seed: int = 0) -> None:
        missing = [tid for tid in sampler.tasks if tid not in index_of]
        if missing:
            raise ValueError(f"{len(missing)} sampler tasks have no dataset row "
                             f"(e.g. {missing[0]!r}); build the sampler from the dataset's tasks")
        if prompts < 1 or generations < 1 or steps < 0:
            raise ValueError("prompts and generations must be >= 1, steps >= 0")
        self.sampler, self.index_of = sampler, index_of
        self.prompts, self.generations, self.steps = prompts, generations, steps
        self._rng = random.Random(seed)

    def _row(self, task_id: str) -> int:
        rows = self.index_of[task_id]
        return rows if isinstance(rows, int) else self._rng.choice(list(rows))

    def __iter__(self) -> Iterator[int]:
        for _ in range(self.steps):
            for tid in self.sampler.sample_ids(self.prompts):
                row = self._row(tid)
                for _ in range(self.generations):
                    yield row

    def __len__(self) -> int:
        return self.steps * self.prompts * self.generations


def groups_of(task_ids: Sequence[str], rewards: Sequence[float | None],
              groups: Sequence[Any] | None = None) -> list[tuple[str, list[float | None], Any]]:
    """``(task_id, rewards, group)`` per group: ``groups`` names each sample's group (verl's
    ``uid``); without it, each run of consecutive samples of one task is a group (GRPO's
    layout)."""
    if groups is None:
        runs: list[tuple[str, list[float | None], Any]] = []
        for tid, r in zip(task_ids, rewards, strict=True):
            if runs and runs[-1][0] == tid:
                runs[-1][1].append(r)
            else:
                runs.append((tid, [r], len(runs)))
        return runs
    by_key: dict[tuple[str, Any], tuple[str, list[float | None], Any]] = {}
    for tid, r, key in zip(task_ids, rewards, groups, strict=True):
        by_key.setdefault((tid, key), (tid, [], key))[1].append(r)
    return list(by_key.values())


def task_id_of_row(row: Any, index: int) -> str:
    """A verl dataset row's task id: ``reward_model.ground_truth`` when it is a task id (not
    tests), else ``extra_info.task_id``, else ``row:<extra_info.index>`` or ``row:<index>``."""
    if isinstance(row, Mapping):
        info = row.get("extra_info")
        if isinstance(info, Mapping) and isinstance(info.get("task_id"), str):
            return str(info["task_id"])
        rm = row.get("reward_model")
        gt = rm.get("ground_truth") if isinstance(rm, Mapping) else None
        if isinstance(gt, str) and gt.strip() and not gt.lstrip().startswith(("{", "[")):
            return gt
        if isinstance(info, Mapping) and isinstance(info.get("index"), int):
            return f"row:{info['index']}"
    return f"row:{index}"
