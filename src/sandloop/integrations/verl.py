"""verl: ``compute_score`` (per sample) and ``compute_score_batch`` (``reward_manager=batch``).

    custom_reward_function.path=$(python -c 'import sandloop.integrations.verl as m; print(m.__file__)')
    custom_reward_function.name=compute_score            # or compute_score_batch

``ground_truth`` is a task id from the served task sets or the tests (verl's
``{"inputs", "outputs"[, "fn_name"]}`` JSON, or any task record); ``extra_info["language"]``
picks the language of stdin/stdout tasks. Configure with ``reward_kwargs`` (``url``, ``api_key``,
``reward_mode``, ``on_infra_failure``) or ``SANDLOOP_*`` environment variables (see
``_common.default_scorer``). Returns a dict: ``score`` plus logged ``pass_fraction``,
``compile_error``, ``timeout``. An infrastructure failure raises ``InfraFailure`` by default
(verl has no way to mask a sample); ``on_infra_failure="zero"`` scores it 0 instead.
"""

from __future__ import annotations

from typing import Any

from sandloop.integrations._common import default_scorer, pass_fraction, reward_of
from sandloop.integrations.scorer import ScoreItem
from sandloop.reward import CompletionResult

__all__ = ["compute_score", "compute_score_batch"]


def _item(solution: str, ground_truth: Any, extra_info: dict[str, Any] | None) -> ScoreItem:
    lang = (extra_info or {}).get("language") if isinstance(extra_info, dict) else None
    return ScoreItem(label=ground_truth, completion=solution, language=lang)


def _out(r: CompletionResult, on_infra_failure: str) -> dict[str, Any]:
    return {"score": reward_of(r, on_infra_failure), "pass_fraction": pass_fraction(r),
            "compile_error": float(r.verdict.value == "compile_error"),
            "timeout": float(r.verdict.value == "timeout")}


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict[str, Any] | None = None, *, url: str | None = None,
                  api_key: str | None = None, reward_mode: str | None = None,
                  on_infra_failure: str = "raise", **_: Any) -> dict[str, Any]:
    """verl's per-sample reward function."""
    s = default_scorer(url, api_key, reward_mode=reward_mode)
    (r,) = s.score([_item(solution_str, ground_truth, extra_info)])
    return _out(r, on_infra_failure)


def compute_score_batch(data_sources: list[str], solution_strs: list[str],
                        ground_truths: list[Any], extra_infos: list[Any] | None = None, *,
                        url: str | None = None, api_key: str | None = None,
                        reward_mode: str | None = None, on_infra_failure: str = "raise",
                        **_: Any) -> list[dict[str, Any]]:
    """verl's batch reward function: the whole batch runs on all slots at once."""
    s = default_scorer(url, api_key, reward_mode=reward_mode)
    infos = extra_infos or [None] * len(solution_strs)
    results = s.score([_item(sol, gt, info)
                       for sol, gt, info in zip(solution_strs, ground_truths, infos, strict=True)])
    return [_out(r, on_infra_failure) for r in results]
