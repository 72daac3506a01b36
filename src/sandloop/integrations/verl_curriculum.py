"""verl: the curation layer's ``TaskSampler`` as verl's curriculum data sampler.

verl (the versions with ``verl.experimental.dataset.sampler.AbstractCurriculumSampler``) builds
the sampler named by ``data.sampler.class_path`` / ``class_name`` as ``cls(data_source=dataset,
data_config=config.data)`` and calls ``update(batch)`` after every step::

    data.sampler.class_path=$(python -c 'import sandloop.integrations.verl_curriculum as m; print(m.__file__)')
    data.sampler.class_name=VerlCurriculumSampler
    data.dataloader_num_workers=0          # verl requires it for curriculum samplers

Rows are grouped by task id (``reward_model.ground_truth`` when it is a task id,
``extra_info.task_id``, else the row); tiers are learnt from the rewards of each step (read from
``non_tensor_batch["score"]``, which sandloop's ``compute_score`` fills, else the summed
``token_level_scores``), groups by verl's ``uid``. Importing this module imports no torch; it
subclasses verl's abstract class when that can be imported.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Iterator
from typing import Any

from sandloop.curation.sampler import TaskSampler
from sandloop.integrations.curriculum import CurriculumIndices, groups_of, task_id_of_row

__all__ = ["VerlCurriculumSampler"]


def _verl_base() -> type:
    # verl's abstract class when this verl has it (it imports torch); else a plain base with
    # the same interface, so the sampler also loads where verl is absent or newer.
    try:
        mod = importlib.import_module("verl.experimental.dataset.sampler")
        base: type = mod.AbstractCurriculumSampler
    except Exception:  # no verl, no torch, or a verl without the interface
        return object
    return base


def _cfg(config: Any, key: str, default: Any) -> Any:
    getter = getattr(config, "get", None)
    value = getter(key, default) if callable(getter) else getattr(config, key, default)
    return default if value is None else value


def _rewards_of(batch: Any) -> list[float | None]:
    extra = getattr(batch, "non_tensor_batch", {}) or {}
    if "score" in extra:  # our compute_score's dict lands here (verl's reward_extra_info)
        return [None if v is None else float(v) for v in list(extra["score"])]
    tensors = getattr(batch, "batch", None)
    for key in ("token_level_scores", "token_level_rewards"):
        if tensors is not None and key in tensors:
            return [float(x) for x in tensors[key].sum(-1).tolist()]
    raise ValueError("the batch has no rewards (non_tensor_batch 'score' or token_level_scores)")


class VerlCurriculumSampler(_verl_base()):  # type: ignore[misc]
    """verl's curriculum sampler over a :class:`TaskSampler` (tiers learnt from live rewards).

    Rows are grouped by task id (:func:`task_id_of_row`); each batch of
    ``data_config.train_batch_size`` prompts is drawn when the data loader asks for it; verl
    repeats each prompt ``rollout.n`` times itself. ``update(batch)`` (verl calls it after each
    step) feeds the step's rewards back, grouped by verl's ``uid``.
    """

    def __init__(self, data_source: Any, data_config: Any) -> None:
        rows = getattr(data_source, "dataframe", data_source)
        self.size = len(data_source)
        self.index_of: dict[str, list[int]] = {}
        for i in range(self.size):
            self.index_of.setdefault(task_id_of_row(rows[i], i), []).append(i)
        seed = int(_cfg(data_config, "seed", 0))
        self.batch_size = max(1, int(_cfg(data_config, "train_batch_size", 1)))
        self.sampler = TaskSampler(list(self.index_of), seed=seed)
        self._indices = CurriculumIndices(self.sampler, self.index_of, prompts=self.batch_size,
                                          steps=-(-self.size // self.batch_size), seed=seed)

    def __iter__(self) -> Iterator[int]:
        yield from itertools.islice(self._indices, self.size)

    def __len__(self) -> int:
        return self.size

    def update(self, batch: Any) -> None:
        """Fold one step's rewards into the curriculum (zero-variance groups are counted)."""
        extra = getattr(batch, "non_tensor_batch", {}) or {}
        ids: list[str] = []
        for i, rm in enumerate(extra.get("reward_model", [])):
            info = extra["extra_info"][i] if "extra_info" in extra else None
            ids.append(task_id_of_row({"reward_model": rm, "extra_info": info}, -1))
        if not ids:
            return
        uids = list(extra["uid"]) if "uid" in extra else None
        self.sampler.filter_groups(groups_of(ids, _rewards_of(batch), uids))
