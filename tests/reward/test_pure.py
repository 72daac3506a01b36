"""Pure reward logic: comparators, verdict aggregation, shaping, pass@k, assembly."""

from __future__ import annotations

from math import comb

import pytest

from sandloop.reward import (
    RewardConfig,
    TestOutcome,
    Verdict,
    output_equal,
    overall_verdict,
    pass_at_k,
    shape_reward,
    summarize,
    values_equal,
)
from sandloop.reward.assemble import assemble, extract_code
from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.tasks import CallTest, IOTest, Task
from sandloop.tasks.values import Opaque

V = Verdict


def test_strict_values_keep_types_apart() -> None:
    assert values_equal([1, (2.0, "x")], [1, (2.0, "x")])
    assert not values_equal(1, True)
    assert values_equal(True, True) and values_equal([False], [False], "json")
    assert not values_equal(True, False)
    assert not values_equal(1, 1.0)
    assert not values_equal((1, 2), [1, 2])
    assert not values_equal({1: "a"}, {True: "a"})
    assert not values_equal({1, 2}, frozenset({1, 2}))
    assert values_equal(0.1 + 0.2, 0.3)
    assert not values_equal(0.1, 0.2)
    assert values_equal(float("nan"), float("nan"))
    assert not values_equal(1.0, float("nan"))


def test_python_mode_is_assert_equality() -> None:
    assert values_equal(1, True, "python")
    assert values_equal(2, 2.0, "python")
    assert values_equal({1, 2}, frozenset({1, 2}), "python")
    assert not values_equal((1,), [1], "python")
    assert not values_equal("1", 1, "python")
    assert not values_equal(0.5, 0.5000001, "python", rel_tol=0, abs_tol=0)


def test_json_mode_merges_sequences_and_numbers() -> None:
    assert values_equal([1, 2], (1, 2), "json")
    assert values_equal(3, 3.0, "json")
    assert not values_equal(1, True, "json")


def test_opaque_never_equal() -> None:
    o = Opaque("AlwaysEqual")
    for mode in ("strict", "python", "json"):
        assert not values_equal(o, o, mode)  # type: ignore[arg-type]
        assert not values_equal(True, o, mode)  # type: ignore[arg-type]
        assert not values_equal([1], [o], mode)  # type: ignore[arg-type]


def test_float_tolerance_configurable() -> None:
    assert values_equal(1.0, 1.001, rel_tol=1e-2)
    assert not values_equal(1.0, 1.001, rel_tol=1e-6, abs_tol=0)


def test_output_comparators() -> None:
    assert output_equal("1 2\n", "1 2", "exact")
    assert not output_equal("1 2\n", "1  2\n", "exact")
    assert output_equal("1 2\n3\n", " 1\t2 3 \n\n", "whitespace")
    assert not output_equal("1 2", "1 2 3", "whitespace")
    assert output_equal("0.3333333\n", "0.33333331", "float", rel_tol=1e-6)
    assert not output_equal("0.3", "0.4", "float")
    assert not output_equal("yes", "no", "float")


def _o(name: str, v: Verdict, hidden: bool = True, weight: float = 1.0) -> TestOutcome:
    return TestOutcome(name=name, verdict=v, hidden=hidden, weight=weight)


def test_overall_verdict_priority() -> None:
    assert overall_verdict([_o("a", V.PASSED)]) is V.PASSED
    assert overall_verdict([_o("a", V.PASSED), _o("b", V.TIMEOUT), _o("c", V.WRONG_ANSWER)]) is V.TIMEOUT
    assert overall_verdict([_o("a", V.WRONG_ANSWER), _o("b", V.COMPILE_ERROR)]) is V.COMPILE_ERROR
    assert overall_verdict([_o("a", V.COMPILE_ERROR), _o("b", V.SANDBOX_ERROR)]) is V.SANDBOX_ERROR


def test_shaping_modes() -> None:
    tests = [_o("p", V.WRONG_ANSWER, hidden=False), _o("h1", V.PASSED, weight=3),
             _o("h2", V.WRONG_ANSWER, weight=1)]
    assert shape_reward(tests) == (0.0, None)
    assert shape_reward(tests, RewardConfig(mode="fraction")) == (0.5, None)
    assert shape_reward(tests, RewardConfig(mode="weighted")) == (0.75, None)
    assert shape_reward(tests, RewardConfig(mode="fraction", on="all")) == (1 / 3, None)
    assert shape_reward(tests, RewardConfig(on="public")) == (0.0, None)
    visible_only = [_o("p", V.PASSED, hidden=False)]
    assert shape_reward(visible_only) == (1.0, None)  # no hidden tests: all tests count


def test_compile_and_format_signals() -> None:
    cfg = RewardConfig(mode="fraction", compile_error_reward=-1.0, format_error_reward=-0.5)
    assert shape_reward([_o("a", V.COMPILE_ERROR)], cfg) == (-1.0, None)
    assert shape_reward([_o("a", V.PASSED)], cfg, format_error=True) == (-0.5, None)


def test_sandbox_error_gives_null_never_zero() -> None:
    reward, reason = shape_reward([_o("a", V.WRONG_ANSWER), _o("b", V.SANDBOX_ERROR)])
    assert reward is None and reason is not None and "sandbox_error" in reason


@pytest.mark.parametrize("n,c,k", [(10, 0, 1), (10, 3, 1), (10, 3, 5), (20, 19, 10), (5, 5, 5), (200, 13, 100)])
def test_pass_at_k_matches_definition(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-9)


def test_pass_at_k_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_summarize() -> None:
    rows = [("t1", 1.0, V.PASSED, [_o("a", V.PASSED)]), ("t1", 0.0, V.WRONG_ANSWER, [_o("a", V.WRONG_ANSWER)]),
            ("t2", None, V.SANDBOX_ERROR, [_o("a", V.SANDBOX_ERROR)]), ("t2", 1.0, V.PASSED, [_o("a", V.PASSED)])]
    s = summarize(rows, ks=(1, 2))
    assert s.completions == 4 and s.tasks == 2 and s.null_rewards == 1 and s.scored == 3
    assert s.pass_at_k == {"pass@1": pytest.approx((0.5 + 1.0) / 2)}  # t2 has 1 scored sample
    assert s.verdicts == {"passed": 2, "sandbox_error": 1, "wrong_answer": 1}


def _task(**kw: object) -> Task:
    base: dict[str, object] = dict(id="t", entry_point="f", starter_code="def f(x):\n    \"\"\"doc\"\"\"\n",
                                   hidden_tests=(CallTest(name="a", args=[1], expected=1),))
    base.update(kw)
    return Task(**base)  # type: ignore[arg-type]


def test_assemble_appends_body_to_prompt() -> None:
    a = assemble(_task(), "    return x\n")
    assert a.how == "appended" and a.source.endswith('"""doc"""\n    return x\n')


def test_assemble_keeps_full_definition_after_starter() -> None:
    a = assemble(_task(), "```python\ndef f(x):\n    return x\n```\nExplanation...")
    assert a.fenced and a.how == "standalone+starter"
    assert a.source.endswith("def f(x):\n    return x\n")


def test_assemble_format_error_and_stdio() -> None:
    assert assemble(_task(), "  \n").format_error is not None
    stdio = _task(test_kind="stdio", entry_point=None,
                  hidden_tests=(IOTest(name="a", stdin="", expected_stdout="1"),))
    assert assemble(stdio, "print(1)").source == "print(1)"
    assert extract_code("no fence") == ("no fence", False)


def test_stored_results_are_keyed_by_the_judging_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # A fix to the comparison (outside the sandbox) must not leave old verdicts in the store.
    from sandloop.reward import verifier as verifier_module

    async def never(program: Program, limits: Limits) -> ExecResult:
        raise AssertionError("not run")

    before = verifier_module.Verifier(never).config_hash()
    monkeypatch.setattr(verifier_module, "_JUDGE_HASH", "changed")
    assert verifier_module.Verifier(never).config_hash() != before
