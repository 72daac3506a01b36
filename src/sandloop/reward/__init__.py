"""Rewards: verifiers (function calls, stdin/stdout, test scripts), verdicts and reward shaping."""

from sandloop.reward.compare import output_equal, values_equal
from sandloop.reward.verdicts import (
    RewardConfig,
    ScoreSummary,
    TestOutcome,
    Verdict,
    overall_verdict,
    pass_at_k,
    shape_reward,
    summarize,
)
from sandloop.reward.verifier import CompletionResult, Runner, Verifier, completion_hash

__all__ = [
    "CompletionResult",
    "RewardConfig",
    "Runner",
    "ScoreSummary",
    "TestOutcome",
    "Verdict",
    "Verifier",
    "completion_hash",
    "output_equal",
    "overall_verdict",
    "pass_at_k",
    "shape_reward",
    "summarize",
    "values_equal",
]
