"""Shared pieces of the trainer adapters: one lazily built Scorer per configuration."""

from __future__ import annotations

import os
import threading
from typing import Any

from sandloop.errors import IntegrationError
from sandloop.integrations.scorer import Scorer
from sandloop.reward import CompletionResult, RewardConfig

__all__ = ["InfraFailure", "default_scorer", "pass_fraction", "reward_of"]

_scorers: dict[tuple[Any, ...], Scorer] = {}
_lock = threading.Lock()


class InfraFailure(IntegrationError, RuntimeError):
    """The sandbox infrastructure failed after retries: the reward is unknown (not 0)."""


def default_scorer(url: str | None = None, api_key: str | None = None,
                   task_sets: tuple[str, ...] | None = None, reward_mode: str | None = None,
                   ) -> Scorer:
    """A process-wide Scorer. Unset arguments come from ``SANDLOOP_URL``, ``SANDLOOP_API_KEY``,
    ``SANDLOOP_TASK_SETS`` (comma-separated, default ``humaneval``) and ``SANDLOOP_REWARD``
    (``binary`` | ``fraction``)."""
    url = url or os.environ.get("SANDLOOP_URL") or None
    api_key = api_key or os.environ.get("SANDLOOP_API_KEY") or None
    if task_sets is None:
        env = os.environ.get("SANDLOOP_TASK_SETS", "humaneval")
        task_sets = tuple(x for x in env.split(",") if x)
    mode = reward_mode or os.environ.get("SANDLOOP_REWARD", "binary")
    key = (url, api_key, task_sets, mode)
    with _lock:
        s = _scorers.get(key)
        if s is None:
            s = Scorer(url=url, api_key=api_key, task_sets=task_sets,
                       reward=RewardConfig.model_validate({"mode": mode}))
            _scorers[key] = s
        return s


def pass_fraction(r: CompletionResult) -> float:
    return sum(t.verdict.value == "passed" for t in r.tests) / len(r.tests) if r.tests else 0.0


def reward_of(r: CompletionResult, on_infra_failure: str) -> float | None:
    if r.reward is not None:
        return r.reward
    if on_infra_failure == "none":
        return None
    if on_infra_failure == "zero":
        return 0.0
    raise InfraFailure(f"task {r.task_id}: {r.reward_reason or 'sandbox infrastructure failed'}")
