"""The figures trainers log beside rewards (reward/trainer_logs.py): pure functions."""

from __future__ import annotations

from sandloop.reward import CompletionResult, TestOutcome, Verdict
from sandloop.reward.trainer_logs import (
    EXTRA_LOGS,
    extra_logs,
    mean_logs,
    openrlhf_answer,
    pass_fraction,
)
from sandloop.reward.verifier import PassCount


def result(verdicts: list[tuple[Verdict, bool]], reward: float | None,
           overall: Verdict) -> CompletionResult:
    tests = [TestOutcome(name=f"t{i}", verdict=v, hidden=h) for i, (v, h) in enumerate(verdicts)]
    pub = [t for t in tests if not t.hidden]
    hid = [t for t in tests if t.hidden]
    return CompletionResult(
        task_id="t", task_version="v", completion_id="c", completion_hash="h", reward=reward,
        verdict=overall, tests=tests,
        public=PassCount(passed=sum(t.verdict is Verdict.PASSED for t in pub), total=len(pub)),
        hidden=PassCount(passed=sum(t.verdict is Verdict.PASSED for t in hid), total=len(hid)))


P, W = Verdict.PASSED, Verdict.WRONG_ANSWER


def test_pass_fraction_counts_public_and_hidden_tests_whatever_the_reward_counts() -> None:
    # The reward counts hidden tests only (binary: 0); the fraction is over all four tests.
    r = result([(P, False), (P, False), (P, True), (W, True)], 0.0, W)
    assert pass_fraction(r) == 0.75
    assert pass_fraction(result([], 0.0, Verdict.COMPILE_ERROR)) == 0.0  # a format error


def test_extra_logs_per_sample_and_batch_means_leave_unknown_rewards_out() -> None:
    ok = result([(P, True)], 1.0, P)
    slow = result([(Verdict.TIMEOUT, True)], 0.0, Verdict.TIMEOUT)
    broken = result([(Verdict.SANDBOX_ERROR, True)], None, Verdict.SANDBOX_ERROR)
    logs = extra_logs([ok, slow, broken], ["```python\nx\n```", "x", "x"])
    assert tuple(logs) == EXTRA_LOGS
    assert logs == {"pass_fraction": [1.0, 0.0, 0.0], "compile_error": [0.0, 0.0, 0.0],
                    "timeout": [0.0, 1.0, 0.0], "fenced_code": [1.0, 0.0, 0.0]}
    means = mean_logs([ok, slow, broken], ["```python\nx\n```", "x", "x"])
    assert means == {"pass_fraction": 0.5, "compile_error": 0.0, "timeout": 0.5,
                     "fenced_code": 0.5, "infra_failures": 1.0}
    assert mean_logs([broken], ["x"]) == {"infra_failures": 1.0}


def test_openrlhf_answer_clips_scores_to_the_unit_interval() -> None:
    penalised = result([(Verdict.COMPILE_ERROR, True)], -0.5, Verdict.COMPILE_ERROR)
    answer = openrlhf_answer([penalised], ["x"])
    assert answer["rewards"] == [-0.5] and answer["scores"] == [0.0]
    assert answer["extra_logs"]["compile_error"] == [1.0]
