"""verl: ``compute_score`` (per sample) and ``compute_score_batch`` (``reward_manager=batch``).

    custom_reward_function.path=$(python -c 'import sandloop.integrations.verl as m; print(m.__file__)')
    custom_reward_function.name=compute_score            # or compute_score_batch

``ground_truth`` is a task id from the served task sets or the tests (verl's
``{"inputs", "outputs"[, "fn_name"]}`` JSON, or any task record); ``extra_info["language"]``
picks the language of stdin/stdout tasks. Configure with ``reward_kwargs`` (``url``, ``api_key``,
``reward_mode``, ``on_infra_failure``) or ``SANDLOOP_*`` environment variables (see
``_common.default_scorer``). Returns a dict: ``score`` plus the logged
``reward.trainer_logs.EXTRA_LOGS`` (``pass_fraction``, ``compile_error``, ``timeout``,
``fenced_code``). An infrastructure failure raises ``InfraFailure`` by default
(verl has no way to mask a sample); ``on_infra_failure="zero"`` scores it 0 instead.

For the reward monitor each score is a rollout. Its step is the first integer among
``extra_info["step"]``, ``["global_step"]``, ``["global_steps"]`` (verl's agent loop puts the
weights' step there), ``["max_global_steps"]``; without one, each ``compute_score_batch`` call is
a step, and per-sample calls use ``StepClock`` (``SANDLOOP_ROLLOUTS_PER_STEP``, else a pause of
``SANDLOOP_STEP_GAP_S``). Its group (the rollouts of one prompt: verl repeats a prompt's row
``rollout.n`` times) is ``extra_info["uid"]``, else ``["index"]``, else the prompt
(``raw_prompt``), else the ground truth. Validation samples (``extra_info["split"]`` ``test``,
``val``, ``validation``) are not recorded.
"""

from __future__ import annotations

import threading
from typing import Any

from sandloop.integrations._common import (
    StepClock,
    as_step,
    default_scorer,
    prompt_group,
    reward_of,
)
from sandloop.integrations.scorer import ScoreItem
from sandloop.reward import CompletionResult
from sandloop.reward.trainer_logs import sample_logs

__all__ = ["compute_score", "compute_score_batch"]

STEP_KEYS = ("step", "global_step", "global_steps", "max_global_steps")
VALIDATION_SPLITS = frozenset({"test", "val", "valid", "validation", "eval"})

_lock = threading.Lock()
_clock: StepClock | None = None  # per-sample calls without a step (made on first use)
_batches = 0  # compute_score_batch calls without a step


def _info(extra_info: Any) -> dict[str, Any]:
    return extra_info if isinstance(extra_info, dict) else {}


def _item(solution: str, ground_truth: Any, extra_info: Any) -> ScoreItem:
    info = _info(extra_info)
    if info.get("uid") is not None:
        group = f"uid:{info['uid']}"
    elif info.get("index") is not None:
        group = f"index:{info['index']}"
    else:
        group = prompt_group(info.get("raw_prompt") or ground_truth)
    return ScoreItem(label=ground_truth, completion=solution, language=info.get("language"),
                     group=group)


def _given_step(infos: list[dict[str, Any]]) -> int | None:
    for info in infos:
        for key in STEP_KEYS:
            step = as_step(info.get(key))
            if step is not None:
                return step
    return None


def _is_validation(infos: list[dict[str, Any]]) -> bool:
    return bool(infos) and all(str(i.get("split", "")).lower() in VALIDATION_SPLITS
                               for i in infos)


def _sample_step(info: dict[str, Any]) -> int | None:
    global _clock
    if _is_validation([info]):
        return None
    given = _given_step([info])
    if given is not None:
        return given
    with _lock:
        if _clock is None:
            _clock = StepClock.from_env()
        clock = _clock
    return clock.tick()


def _batch_step(infos: list[dict[str, Any]]) -> int | None:
    global _batches
    if _is_validation(infos):
        return None
    given = _given_step(infos)
    if given is not None:
        return given
    with _lock:  # verl's batch reward manager calls once per training step
        _batches += 1
        return _batches - 1


def _out(r: CompletionResult, completion: str, on_infra_failure: str) -> dict[str, Any]:
    return {"score": reward_of(r, on_infra_failure), **sample_logs(r, completion)}


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict[str, Any] | None = None, *, url: str | None = None,
                  api_key: str | None = None, reward_mode: str | None = None,
                  on_infra_failure: str = "raise", **_: Any) -> dict[str, Any]:
    """verl's per-sample reward function."""
    s = default_scorer(url, api_key, reward_mode=reward_mode)
    (r,) = s.score([_item(solution_str, ground_truth, extra_info)],
                   step=_sample_step(_info(extra_info)))
    return _out(r, solution_str, on_infra_failure)


def compute_score_batch(data_sources: list[str], solution_strs: list[str],
                        ground_truths: list[Any], extra_infos: list[Any] | None = None, *,
                        url: str | None = None, api_key: str | None = None,
                        reward_mode: str | None = None, on_infra_failure: str = "raise",
                        **_: Any) -> list[dict[str, Any]]:
    """verl's batch reward function: the whole batch runs on all slots at once."""
    s = default_scorer(url, api_key, reward_mode=reward_mode)
    infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    results = s.score([_item(sol, gt, info)
                       for sol, gt, info in zip(solution_strs, ground_truths, infos, strict=True)],
                      step=_batch_step([_info(i) for i in infos]))
    return [_out(r, sol, on_infra_failure)
            for r, sol in zip(results, solution_strs, strict=True)]
