"""Trainer integrations: TRL reward functions, verl ``compute_score``, OpenRLHF reward functions.

All of them score completions with sandloop's verifiers, either in this process (an embedded
engine) or through a ``sandloop serve`` endpoint (``url=...``). Infrastructure failures give
``None`` (TRL: excluded), never a reward of 0 presented as the model's fault.
"""

from sandloop.integrations.scorer import ScoreItem, Scorer
from sandloop.tasks import LabelError, resolve_task

__all__ = ["LabelError", "ScoreItem", "Scorer", "resolve_task"]
