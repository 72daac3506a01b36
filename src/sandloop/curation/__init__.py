"""Task governance: validation (problem codes), mutation testing, near-duplicate and
contamination checks, difficulty tiers, curriculum sampling and versioned task sets.

See docs/curation.md. Imports only point down: tasks, store, reward and engine.
"""

from sandloop.curation.difficulty import TIERS, Difficulty, TierThresholds, grade, posterior
from sandloop.curation.problems import (
    DEFAULT_SEVERITY,
    Problem,
    ProblemCode,
    TaskReport,
    verdict_of,
)
from sandloop.curation.sampler import TaskSampler

__all__ = [
    "DEFAULT_SEVERITY",
    "TIERS",
    "Difficulty",
    "Problem",
    "ProblemCode",
    "TaskReport",
    "TaskSampler",
    "TierThresholds",
    "grade",
    "posterior",
    "verdict_of",
]
