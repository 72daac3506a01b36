"""OpenRLHF: a reward-function file (``--reward.remote_url /path/to/this/openrlhf.py``).

OpenRLHF calls ``reward_func(queries, prompts, labels)``; ``queries`` are prompt + response with
special tokens kept, ``labels`` come from ``--data.label_key`` (a task id or the tests as JSON).
Returns ``{"rewards", "scores", "extra_logs"}`` (tensors when torch is importable). The HTTP form
of the same protocol is ``sandloop serve``'s ``POST /get_reward``. Configure with ``SANDLOOP_*``
environment variables (``_common.default_scorer``); an infrastructure failure raises.
"""

from __future__ import annotations

import importlib
from typing import Any

from sandloop.integrations._common import default_scorer, pass_fraction, reward_of
from sandloop.integrations.scorer import ScoreItem
from sandloop.reward.assemble import response_after_prompt as response_of

__all__ = ["response_of", "reward_func"]

def _tensor(xs: list[float]) -> Any:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return xs
    return torch.tensor(xs, dtype=torch.float)


def reward_func(queries: list[str], prompts: list[str], labels: list[Any],
                **kwargs: Any) -> dict[str, Any]:
    s = default_scorer()
    results = s.score([ScoreItem(label=lab, completion=response_of(q, p))
                       for q, p, lab in zip(queries, prompts, labels, strict=True)])
    rewards = [float(reward_of(r, "raise") or 0.0) for r in results]
    return {
        "rewards": _tensor(rewards),
        "scores": _tensor([min(1.0, max(0.0, x)) for x in rewards]),
        "extra_logs": {"pass_fraction": _tensor([pass_fraction(r) for r in results])},
    }
