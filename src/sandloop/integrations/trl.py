"""TRL: an async ``reward_funcs`` entry for ``GRPOTrainer``.

TRL calls reward functions as ``f(prompts=..., completions=..., completion_ids=...,
trainer_state=..., log_extra=..., log_metric=..., **dataset_columns)`` and gathers async ones
concurrently. The dataset column named ``label_column`` (default: the first of ``task_id``,
``task``, ``tests``, ``ground_truth``, ``verification_info`` present) carries a task id or the
tests. An infrastructure failure gives ``None`` (TRL excludes that sample), never 0. Each call
logs (``log_metric``) ``sandloop/<name>`` for ``reward.trainer_logs.mean_logs``: the batch means
of the figures the other adapters log per sample, and ``sandloop/infra_failures``.

For the reward monitor each score is a rollout of step ``trainer_state.global_step``, grouped by
prompt (TRL lays out the ``num_generations`` completions of one prompt consecutively; a group
split over several processes keeps one id, derived from the prompt text). They are recorded by
the server (remote scoring) and in the scorer's rollout log (``SANDLOOP_ROLLOUT_LOG``).

    from sandloop.integrations.trl import sandloop_reward
    trainer = GRPOTrainer(model, reward_funcs=[sandloop_reward()], train_dataset=ds, ...)

A curriculum (the curation layer's ``TaskSampler``) plugs in through
:class:`sandloop.integrations.curriculum.CurriculumIndices` and ``sandloop_reward(curriculum=)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from sandloop.integrations._common import as_step, default_scorer, run_groups
from sandloop.integrations.scorer import ScoreItem, Scorer
from sandloop.reward.trainer_logs import mean_logs

if TYPE_CHECKING:
    from sandloop.curation.sampler import TaskSampler

__all__ = ["LABEL_COLUMNS", "completion_text", "sandloop_reward"]

LABEL_COLUMNS = ("task_id", "task", "tests", "ground_truth", "verification_info")


def completion_text(c: Any) -> str:
    """A completion in TRL's standard (str) or conversational (list of messages) format."""
    if isinstance(c, str):
        return c
    if isinstance(c, Sequence) and c and isinstance(c[-1], dict):
        return str(c[-1].get("content") or "")
    return str(c)


def sandloop_reward(scorer: Scorer | None = None, *, label_column: str | None = None,
                    language_column: str = "language", curriculum: TaskSampler | None = None,
                    ) -> Callable[..., Awaitable[list[float | None]]]:
    """The reward function (named ``sandloop_reward`` in TRL's logs). With ``curriculum`` each
    prompt group's rewards are reported to that ``TaskSampler`` (the one behind the trainer's
    :class:`~sandloop.integrations.curriculum.CurriculumIndices`)."""

    async def sandloop_reward(prompts: list[Any] | None = None,
                              completions: list[Any] | None = None,
                              completion_ids: list[Any] | None = None,
                              **kwargs: Any) -> list[float | None]:
        comps = completions or []
        col = label_column or next((c for c in LABEL_COLUMNS if c in kwargs), None)
        if col is None or col not in kwargs:
            raise KeyError(f"no label column among the dataset columns {sorted(kwargs)}; "
                           f"add one of {LABEL_COLUMNS} or pass label_column=")
        labels = kwargs[col]
        langs = kwargs.get(language_column) or [None] * len(comps)
        step = as_step(getattr(kwargs.get("trainer_state"), "global_step", None))
        groups = run_groups(prompts if prompts is not None else labels)
        s = scorer or default_scorer()
        items = [ScoreItem(label=lab, completion=completion_text(c), language=lang, group=g)
                 for lab, c, lang, g in zip(labels, comps, langs, groups, strict=True)]
        results = await s.ascore(items, step=step)
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and results:
            for name, value in mean_logs(results, [i.completion for i in items]).items():
                log_metric(f"sandloop/{name}", value)
        rewards = [r.reward for r in results]
        if curriculum is not None:
            from sandloop.integrations.curriculum import groups_of

            curriculum.filter_groups(groups_of([str(lab) for lab in labels], rewards, groups))
        return rewards

    return sandloop_reward
