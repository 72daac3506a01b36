"""Shared pieces of the trainer adapters: one lazily built Scorer per configuration."""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from sandloop.integrations.scorer import Scorer
from sandloop.reward import CompletionResult, RewardConfig

__all__ = ["InfraFailure", "close_default_scorers", "default_scorer", "pass_fraction",
           "reward_of"]

_scorers: dict[tuple[Any, ...], Scorer] = {}
_lock = threading.Lock()


class InfraFailure(RuntimeError):
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
            if not _scorers:
                atexit.register(close_default_scorers)
            s = Scorer(url=url, api_key=api_key, task_sets=task_sets,
                       reward=RewardConfig.model_validate({"mode": mode}))
            _scorers[key] = s
        return s


def close_default_scorers() -> None:
    """Close every scorer :func:`default_scorer` made (their engines and slots); registered to
    run at interpreter exit, so adapters used without an explicit close leave nothing behind."""
    with _lock:
        scorers = list(_scorers.values())
        _scorers.clear()
    for s in scorers:
        s.close()


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
