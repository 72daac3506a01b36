"""OpenRLHF: a reward-function file (``--reward.remote_url /path/to/this/openrlhf.py``).

OpenRLHF calls ``reward_func(queries, prompts, labels)``; ``queries`` are prompt + response with
special tokens kept, ``labels`` come from ``--data.label_key`` (a task id or the tests as JSON).
Returns ``{"rewards", "scores", "extra_logs"}`` (tensors when torch is importable; the extra logs
are ``reward.trainer_logs.EXTRA_LOGS``, as over HTTP). The HTTP form
of the same protocol is ``sandloop serve``'s ``POST /get_reward``. Configure with ``SANDLOOP_*``
environment variables (``_common.default_scorer``); an infrastructure failure raises.

For the reward monitor each score is a rollout grouped by its prompt (the
``n_samples_per_prompt`` samples of one prompt). OpenRLHF does not tell a reward function the
training step, so ``StepClock`` counts it: set ``SANDLOOP_ROLLOUTS_PER_STEP`` to
``rollout_batch_size x n_samples_per_prompt`` for exact steps; otherwise a new step starts after
``SANDLOOP_STEP_GAP_S`` (default 30) seconds without rewards (generation and training alternate).
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from sandloop.integrations._common import (
    StepClock,
    default_scorer,
    prompt_group,
    reward_of,
)
from sandloop.integrations.scorer import ScoreItem
from sandloop.reward.assemble import response_after_prompt as response_of
from sandloop.reward.trainer_logs import openrlhf_answer

__all__ = ["response_of", "reward_func"]

_lock = threading.Lock()
_clock: StepClock | None = None  # made on first use, from the environment


def _step(n: int) -> int:
    global _clock
    with _lock:
        if _clock is None:
            _clock = StepClock.from_env()
        clock = _clock
    return clock.tick(n)


def _tensor(xs: list[float]) -> Any:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return xs
    return torch.tensor(xs, dtype=torch.float)


def reward_func(queries: list[str], prompts: list[str], labels: list[Any],
                **kwargs: Any) -> dict[str, Any]:
    s = default_scorer()
    items = [ScoreItem(label=lab, completion=response_of(q, p), group=prompt_group(p))
             for q, p, lab in zip(queries, prompts, labels, strict=True)]
    results = s.score(items, step=_step(len(queries)))
    for r in results:
        reward_of(r, "raise")  # OpenRLHF cannot mask a sample: an unknown reward is an error
    # The answer of ``POST /get_reward`` (the same protocol over HTTP), as tensors.
    answer = openrlhf_answer(results, [i.completion for i in items])
    return {"rewards": _tensor(answer["rewards"]), "scores": _tensor(answer["scores"]),
            "extra_logs": {k: _tensor(v) for k, v in answer["extra_logs"].items()}}
