"""What trainers log beside each reward: pass fraction and failure flags, one definition.

The server's OpenRLHF endpoint (``/get_reward``) and the trainer adapters (OpenRLHF's reward
file, verl's ``compute_score``, TRL's reward function) all report these figures; they are computed
here once, so the same results give the same numbers whichever path scored them.

- ``pass_fraction``: the share of all the completion's tests (public and hidden, whatever the
  reward counts) whose verdict is ``passed``; 0.0 when no test ran (a format error).
- ``compile_error``, ``timeout``: 1.0 when the completion's overall verdict is that, else 0.0.
- ``fenced_code``: 1.0 when the completion's code came from a Markdown fence.

Means over a batch (:func:`mean_logs`, what TRL logs) leave out results whose reward is null:
their outcome is unknown, as in :func:`~sandloop.reward.verdicts.summarize`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sandloop.reward.assemble import extract_code
from sandloop.reward.verdicts import Verdict
from sandloop.reward.verifier import CompletionResult

__all__ = ["EXTRA_LOGS", "extra_logs", "mean_logs", "openrlhf_answer", "pass_fraction",
           "sample_logs"]

EXTRA_LOGS = ("pass_fraction", "compile_error", "timeout", "fenced_code")


def pass_fraction(r: CompletionResult) -> float:
    """The share of all of ``r``'s tests that passed (0.0 when none ran)."""
    return (sum(t.verdict is Verdict.PASSED for t in r.tests) / len(r.tests)) if r.tests else 0.0


def sample_logs(r: CompletionResult, completion: str) -> dict[str, float]:
    """The figures of one scored completion (keys :data:`EXTRA_LOGS`, in that order)."""
    return {
        "pass_fraction": pass_fraction(r),
        "compile_error": float(r.verdict is Verdict.COMPILE_ERROR),
        "timeout": float(r.verdict is Verdict.TIMEOUT),
        "fenced_code": float(extract_code(completion)[1]),
    }


def extra_logs(results: Sequence[CompletionResult],
               completions: Sequence[str]) -> dict[str, list[float]]:
    """Per-sample figures of a batch, one list per key (OpenRLHF's ``extra_logs``)."""
    rows = [sample_logs(r, c) for r, c in zip(results, completions, strict=True)]
    return {k: [row[k] for row in rows] for k in EXTRA_LOGS}


def mean_logs(results: Sequence[CompletionResult],
              completions: Sequence[str]) -> dict[str, float]:
    """The batch means of :func:`extra_logs` over results with a known reward, plus
    ``infra_failures`` (how many rewards are null). Without a known reward only
    ``infra_failures`` is given."""
    known = [(r, c) for r, c in zip(results, completions, strict=True) if r.reward is not None]
    out: dict[str, float] = {}
    if known:
        logs = extra_logs([r for r, _ in known], [c for _, c in known])
        out = {k: math.fsum(v) / len(v) for k, v in logs.items()}
    out["infra_failures"] = float(len(results) - len(known))
    return out


def openrlhf_answer(results: Sequence[CompletionResult],
                    completions: Sequence[str]) -> dict[str, Any]:
    """OpenRLHF's reward answer ``{"rewards", "scores", "extra_logs"}``; ``scores`` are the
    rewards clipped to [0, 1]. OpenRLHF cannot mask a sample, so callers refuse a batch with a
    null reward before answering (a null reward would read 0.0 here)."""
    rewards = [float(r.reward or 0.0) for r in results]
    return {"rewards": rewards,
            "scores": [min(1.0, max(0.0, x)) for x in rewards],
            "extra_logs": extra_logs(results, completions)}
