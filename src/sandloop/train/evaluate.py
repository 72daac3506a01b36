"""Held-out evaluation: pass@1 on the eval split, with a 95% confidence interval.

Each eval task gets ``n`` sampled completions; a task's pass@1 estimate is the share that pass
(the unbiased estimator for k=1); the run's pass rate is the mean over tasks, and the interval is
the normal one over tasks (tasks are the independent units, not samples), clipped to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["generate", "pass_rate_ci"]


def pass_rate_ci(per_task: Sequence[float], z: float = 1.96) -> dict[str, Any]:
    """``{"pass_rate", "ci95": [lo, hi], "tasks"}`` from per-task pass fractions."""
    n = len(per_task)
    if n == 0:
        return {"pass_rate": None, "ci95": None, "tasks": 0}
    mean = sum(per_task) / n
    var = sum((x - mean) ** 2 for x in per_task) / (n - 1) if n > 1 else 0.0
    half = z * math.sqrt(var / n)
    return {"pass_rate": mean, "ci95": [max(0.0, mean - half), min(1.0, mean + half)],
            "tasks": n}


def generate(model: Any, tokenizer: Any, prompts: Sequence[str], *, n: int, max_new_tokens: int,
             temperature: float, seed: int, batch_size: int = 256) -> list[list[str]]:
    """``n`` sampled completions per prompt (text after the prompt, special tokens removed)."""
    import torch

    torch.manual_seed(seed)
    flat = [p for p in prompts for _ in range(n)]
    texts: list[str] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for i in range(0, len(flat), batch_size):
            chunk = flat[i:i + batch_size]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=True,
                                 temperature=temperature, top_k=0, top_p=1.0,
                                 pad_token_id=tokenizer.pad_token_id,
                                 eos_token_id=tokenizer.eos_token_id)
            width = enc["input_ids"].shape[1]
            texts.extend(tokenizer.decode(o[width:], skip_special_tokens=True) for o in out)
    if was_training:
        model.train()
    return [texts[j * n:(j + 1) * n] for j in range(len(prompts))]
