"""Shared pieces of the trainer adapters: one lazily built Scorer per configuration, and the
training step and rollout group of each scored completion (for the reward monitor)."""

from __future__ import annotations

import atexit
import hashlib
import json
import operator
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sandloop.errors import InputError, IntegrationError
from sandloop.integrations.scorer import Scorer
from sandloop.reward import CompletionResult, RewardConfig

__all__ = ["AdapterSettingError", "InfraFailure", "StepClock", "as_step", "close_default_scorers",
           "default_scorer", "prompt_group", "reward_of", "run_groups"]

_scorers: dict[tuple[Any, ...], Scorer] = {}
_lock = threading.Lock()


class InfraFailure(IntegrationError, RuntimeError):
    """The sandbox infrastructure failed after retries: the reward is unknown (not 0)."""


class AdapterSettingError(IntegrationError, InputError):
    """An adapter setting (a ``SANDLOOP_*`` environment variable) has an invalid value."""


def default_scorer(url: str | None = None, api_key: str | None = None,
                   task_sets: tuple[str, ...] | None = None, reward_mode: str | None = None,
                   ) -> Scorer:
    """A process-wide Scorer. Unset arguments come from ``SANDLOOP_URL``, ``SANDLOOP_API_KEY``,
    ``SANDLOOP_TASK_SETS`` (comma-separated, default ``humaneval``) and ``SANDLOOP_REWARD``
    (``binary`` | ``fraction``). ``SANDLOOP_ROLLOUT_LOG`` (a SQLite file) records the scored
    rollouts of each training step there; ``SANDLOOP_RUN_ID`` names the run (in that log and
    on the server's monitor)."""
    url = url or os.environ.get("SANDLOOP_URL") or None
    api_key = api_key or os.environ.get("SANDLOOP_API_KEY") or None
    if task_sets is None:
        env = os.environ.get("SANDLOOP_TASK_SETS", "humaneval")
        task_sets = tuple(x for x in env.split(",") if x)
    mode = reward_mode or os.environ.get("SANDLOOP_REWARD", "binary")
    rollout_log = os.environ.get("SANDLOOP_ROLLOUT_LOG") or None
    run_id = os.environ.get("SANDLOOP_RUN_ID") or None
    key = (url, api_key, task_sets, mode, rollout_log, run_id)
    with _lock:
        s = _scorers.get(key)
        if s is None:
            if not _scorers:
                atexit.register(close_default_scorers)
            s = Scorer(url=url, api_key=api_key, task_sets=task_sets,
                       reward=RewardConfig.model_validate({"mode": mode}),
                       rollout_log=rollout_log, run_id=run_id)
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


def reward_of(r: CompletionResult, on_infra_failure: str) -> float | None:
    if r.reward is not None:
        return r.reward
    if on_infra_failure == "none":
        return None
    if on_infra_failure == "zero":
        return 0.0
    raise InfraFailure(f"task {r.task_id}: {r.reward_reason or 'sandbox infrastructure failed'}")


def as_step(value: Any) -> int | None:
    """``value`` as a training step (a non-negative integer, numpy's included), else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        step = operator.index(value)
    except TypeError:
        return None
    return step if step >= 0 else None


def prompt_group(prompt: Any) -> str:
    """A short id of a prompt (text or chat messages), the same in every process: the group of
    the rollouts generated from it (GRPO's group), even when a trainer spreads one group over
    several processes."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return "p" + hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=6).hexdigest()


def run_groups(prompts: Sequence[Any]) -> list[str]:
    """Groups of a batch laid out as TRL lays it out: the completions of one prompt are
    consecutive. Each run of one prompt is a group; a prompt that comes back later in the same
    batch (a duplicate dataset row) is another group (suffix ``#2``, ``#3``, ...)."""
    out: list[str] = []
    seen: dict[str, int] = {}
    prev: Any = object()
    current = ""
    for p in prompts:
        if not out or p != prev:
            base = prompt_group(p)
            seen[base] = seen.get(base, 0) + 1
            current = base if seen[base] == 1 else f"{base}#{seen[base]}"
            prev = p
        out.append(current)
    return out


class StepClock:
    """The training step for trainers that do not tell their reward function (OpenRLHF).

    With ``per_step`` (the rollouts of one step: rollout batch size x samples per prompt) the
    step is the count of rollouts seen so far divided by it. Otherwise a new step starts after
    ``gap_s`` seconds without rollouts: a synchronous trainer scores a step's rollouts in one
    burst, then trains. Thread-safe (reward functions run on worker threads).
    """

    def __init__(self, per_step: int | None = None, gap_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if per_step is not None and per_step < 1:
            raise AdapterSettingError(f"rollouts per step must be a positive integer, got "
                                      f"{per_step}")
        self.per_step = per_step
        self.gap_s = gap_s
        self._clock = clock
        self._count = 0
        self._step = 0
        self._last: float | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> StepClock:
        """``SANDLOOP_ROLLOUTS_PER_STEP``, else ``SANDLOOP_STEP_GAP_S`` (default 30)."""
        per = os.environ.get("SANDLOOP_ROLLOUTS_PER_STEP")
        gap = os.environ.get("SANDLOOP_STEP_GAP_S")
        try:
            return cls(per_step=int(per) if per else None, gap_s=float(gap) if gap else 30.0)
        except ValueError as e:  # AdapterSettingError is one too
            raise AdapterSettingError(
                f"SANDLOOP_ROLLOUTS_PER_STEP={per!r} / SANDLOOP_STEP_GAP_S={gap!r}: {e}; set a "
                f"positive integer / a number of seconds") from None

    def tick(self, n: int = 1) -> int:
        """The step of the next ``n`` rollouts (counted as seen)."""
        with self._lock:
            if self.per_step is not None:
                step = self._count // self.per_step
                self._count += n
                return step
            now = self._clock()
            if self._last is not None and now - self._last >= self.gap_s:
                self._step += 1
            self._last = now
            return self._step
