"""Pure parts of curation: vocabulary, mutants, degenerate completions, fingerprints,
difficulty and the sampler — no processes."""

from __future__ import annotations

import ast

import pytest

from sandloop.curation import (
    DEFAULT_SEVERITY,
    Problem,
    ProblemCode,
    TaskReport,
    TaskSampler,
    grade,
    posterior,
    verdict_of,
)
from sandloop.curation.degenerate import degenerate_completions, entry_signature
from sandloop.curation.fingerprints import (
    canonical_code,
    contamination,
    fingerprint,
    near_duplicates,
)
from sandloop.curation.mutants import generate_mutants
from sandloop.tasks import CallTest, IOTest, Task

REF = """\
def clip(xs, lo, hi):
    out = []
    for x in xs:
        if x < lo:
            out.append(lo)
        elif x > hi:
            out.append(hi)
        else:
            out.append(x + 0)
    return out
"""


def _task(id: str = "t", prompt: str = "Clip every value of xs into the range lo to hi, "
          "inclusive, and return the new list in the same order as the input.",
          ref: str = REF, **kw: object) -> Task:
    return Task.model_validate({
        "id": id, "prompt": prompt, "entry_point": "clip", "reference_solution": ref,
        "hidden_tests": [CallTest(name="a", args=[[1, 5, 9], 2, 8],
                                  expected=[2, 5, 8])],
        **kw})


def test_every_code_has_a_severity_and_verdicts_follow_the_worst() -> None:
    assert set(DEFAULT_SEVERITY) == set(ProblemCode)
    assert len(ProblemCode) == 9
    review = Problem.of(ProblemCode.WEAK_TESTS, "score 0.3")
    reject = Problem.of(ProblemCode.FLAKY, "test a varies")
    assert verdict_of([]) == "keep"
    assert verdict_of([review]) == "review"
    assert verdict_of([review, reject]) == "reject"
    downgraded = Problem.of(ProblemCode.FLAKY, "x", {ProblemCode.FLAKY: "review"})
    assert downgraded.severity == "review"
    r = TaskReport.build(id="t", version="v", problems=[reject])
    assert r.verdict == "reject" and r.codes == {"flaky"}
    assert r.model_dump(mode="json")["problems"][0] == {
        "code": "flaky", "severity": "reject", "detail": "test a varies"}


def test_mutants_cover_each_operator_and_are_distinct_valid_programs() -> None:
    ms = generate_mutants(REF, limit=100)
    ops = {m.operator for m in ms}
    assert {"comparison", "arithmetic", "constant", "statement", "branch", "return"} <= ops
    sources = [m.source for m in ms]
    assert len(set(sources)) == len(sources)
    original = ast.unparse(ast.parse(REF))
    for m in ms:
        assert m.source != original
        compile(m.source, "m", "exec")
    assert any("< -> <=" in m.description for m in ms)
    assert len(generate_mutants(REF, limit=5)) == 5
    assert generate_mutants("def f(:") == []
    helper = "def helper(a):\n    return a + 1\n\n" + REF
    assert all("return a + 1" in m.source
               for m in generate_mutants(helper, limit=100, skip=frozenset({"helper"})))


def test_mutants_leave_docstrings_and_module_level_code_alone() -> None:
    src = 'X = 1\ndef f(a):\n    """Doc 3."""\n    return a\n'
    ms = generate_mutants(src)
    assert ms and all("X = 1" in m.source and "Doc 3." in m.source for m in ms)


def test_degenerate_completions_keep_the_signature() -> None:
    t = _task()
    assert entry_signature(t) == ("def clip(xs, lo, hi):", "xs", False)
    names = {d.name for d in degenerate_completions(t)}
    assert {"pass", "return_none", "return_0", "return_true", "return_false", "identity",
            "return_empty_list", "return_empty_str", "exit0"} <= names
    ident = next(d for d in degenerate_completions(t) if d.name == "identity")
    assert "return xs" in ident.completion
    stdio = Task(id="s", test_kind="stdio", hidden_tests=(IOTest(name="a", expected_stdout="1"),))
    assert {d.name for d in degenerate_completions(stdio)} >= {"print_nothing", "exit0"}


def test_canonical_code_survives_renaming_and_reformatting() -> None:
    renamed = ("def limit(values,low,high):\n  'doc'\n  res=[]\n  for v in values:\n"
               "    if v<low: res.append(low)\n    elif v>high: res.append(high)\n"
               "    else: res.append(v+0)\n  return res\n")
    assert canonical_code(renamed) == canonical_code(REF)
    assert canonical_code("def f(x): return len(x)") != canonical_code("def f(x): return sum(x)")


def test_near_duplicates_flag_the_later_copy_only() -> None:
    a = _task("a")
    b = _task("b", prompt="Clip  every value of   XS into the range lo to hi,\ninclusive, and "
              "return the new list in the same order as the input.")
    c = _task("c", prompt="Count vowels in a string, ignoring case and any accents or marks.",
              ref="def clip(s, lo, hi):\n    return sum(ch in 'aeiou' for ch in s.lower())\n")
    ms = near_duplicates([fingerprint(t) for t in (a, b, c)])
    assert [(m.id, m.other) for m in ms] == [("b", "a")]
    # Against a reference set: only the new ones are flagged.
    ms = near_duplicates([fingerprint(t) for t in (a, b)], first_new=1)
    assert [(m.id, m.other) for m in ms] == [("b", "a")]


def test_contamination_needs_long_shared_ngrams() -> None:
    long = ("given a list of integers return the sum of the squares of the odd numbers that "
            "appear at even positions of the list")
    train = fingerprint(_task("train1", prompt=long, split="train"))
    leaked = fingerprint(_task("eval1", prompt="Hint: " + long))
    other = fingerprint(_task("eval2", prompt="Given a list of integers return the product",
                              ref="def clip(a, b, c):\n    return a * b * c\n"))
    ms = contamination([leaked, other], [train])
    assert [(m.id, m.other) for m in ms] == [("eval1", "train1")]


def test_posterior_tiers_and_grade() -> None:
    assert posterior(0, 0).tier == "medium"
    assert posterior(8, 8).tier == "saturated"
    assert posterior(0, 8).tier == "unsolved"
    assert posterior(0, 2).tier == "hard"  # two failures are not proof
    assert posterior(3, 8).tier == "medium"
    g = grade({"a": [1.0, 1.0, 0.0, None], "b": []})
    assert g["a"].trials == 3 and g["a"].passes == 2
    with pytest.raises(ValueError):
        posterior(3, 2)


def test_sampler_follows_curriculum_and_drops_flat_groups() -> None:
    tasks = [_task(f"t{i}") for i in range(4)]
    s = TaskSampler(tasks, curriculum={"saturated": 0.0, "unsolved": 0.0, "medium": 1.0,
                                       "easy": 0.0, "hard": 0.0}, seed=1)
    kept = s.filter_groups([("t0", [1.0] * 8, "g0"), ("t1", [0.0] * 8, "g1"),
                            ("t2", [1.0, 0.0, 1.0, 0.0], "g2")])
    assert kept == ["g2"] and s.dropped_groups == 2 and s.kept_groups == 1
    assert s.tier("t0") == "saturated" and s.tier("t1") == "unsolved"
    drawn = {t.id for t in s.sample(200)}
    assert drawn == {"t2", "t3"}  # only medium tasks (t3 has no observations yet)


def test_difficulty_bars_order_tiers_and_bin_numbers() -> None:
    from sandloop.curation.report import difficulty_bars

    assert difficulty_bars(["hard", "saturated", None, "hard", "weird"]) == [
        ("saturated", 1), ("hard", 2), ("weird", 1), ("ungraded", 1)]
    assert difficulty_bars([1, 2, 2]) == [("1", 1), ("2", 2)]
    many = difficulty_bars([i / 100 for i in range(100)])
    assert len(many) == 10 and sum(n for _, n in many) == 100 and many[0][0] == "0-0.099"


def test_degenerate_bodies_are_the_documented_ones() -> None:
    # docs/curation.md: `pass`, `return None`/`0`/`1`/`''`/`[]`/`True`/`False`, the first
    # argument unchanged, `sys.exit(0)` in the function or on import.
    bodies = {d.name: d.completion.split("\n", 1)[1] for d in degenerate_completions(_task())}
    assert set(bodies) == {"pass", "return_none", "return_0", "return_1", "return_empty_str",
                           "return_empty_list", "return_true", "return_false", "identity",
                           "exit0", "exit0_on_import"}
    assert bodies["return_1"].strip() == "return 1"


ZH = "给定一个整数列表\uff0c返回列表中所有偶数的和。如果列表为空\uff0c返回零。请注意负数也可能是偶数。"
RU = ("Дан список целых чисел. Верните сумму всех чётных чисел списка. "
      "Для пустого списка верните ноль.")
EVEN = "def f(xs):\n    return sum(x for x in xs if x % 2 == 0)\n"


@pytest.mark.parametrize("prompt", [ZH, RU], ids=["chinese", "russian"])
def test_non_ascii_prompts_are_duplicates_and_contamination(prompt: str) -> None:
    a = _task("a", prompt=prompt, ref=EVEN, entry_point="f", split="train")
    b = _task("b", prompt=prompt, ref=EVEN, entry_point="f")
    ms = near_duplicates([fingerprint(a), fingerprint(b)])
    assert [(m.id, m.other, m.similarity) for m in ms] == [("b", "a", 1.0)]
    # Different code, same prompt: only the prompt can show the leak.
    c = _task("c", prompt=prompt, ref="def f(xs):\n    return 0\n", entry_point="f")
    assert [m.id for m in contamination([fingerprint(c)], [fingerprint(a)])] == ["c"]


def test_prompt_words_fold_case_and_split_spaceless_scripts() -> None:
    from sandloop.curation.fingerprints import prompt_words

    assert prompt_words("ЧИСЕЛ Straße café") == ["чисел", "strasse", "café"]
    assert prompt_words("返回列表") == ["返", "回", "列", "表"]
    assert prompt_words("x中y") == ["x", "中", "y"]
    assert prompt_words("नमस्ते दुनिया") == ["नमस्ते", "दुनिया"]  # vowel signs stay in words
    # An unrelated Chinese prompt shares no shingle with the one above.
    other = _task("o", prompt="写一个函数\uff0c把字符串反转后返回\uff0c并且忽略所有空格字符。",
                  ref=EVEN, entry_point="f")
    assert near_duplicates([fingerprint(_task("z", prompt=ZH, ref=EVEN, entry_point="f")),
                            fingerprint(other)]) == []


def test_tiny_solutions_cannot_show_a_leak_but_long_ones_can() -> None:
    add = _task("add", prompt="Return the arithmetic sum of the two integers a and b.",
                ref="def add(a, b):\n    return a + b\n", entry_point="add", split="train")
    concat = _task("concat", prompt="Join two strings: give back the first string followed "
                   "immediately by the second one.", ref="def concat(s, t):\n    return s + t\n",
                   entry_point="concat")
    assert contamination([fingerprint(concat)], [fingerprint(add)]) == []
    # Above the minimum (13 canonical tokens) a copied solution is still found.
    renamed = REF.replace("xs", "values").replace("out", "res")
    leaked = _task("leaked", prompt="Something else entirely, worded in another way.", ref=renamed)
    ms = contamination([fingerprint(leaked)], [fingerprint(_task("train", split="train"))])
    assert [(m.id, m.other, m.why) for m in ms] == [
        ("leaked", "train", "100% of its solution 13-grams")]


def test_a_same_id_task_elsewhere_is_another_task() -> None:
    t = _task("t")
    mine, theirs = fingerprint(t), fingerprint(t)
    ms = contamination([mine], [theirs])
    assert [(m.id, m.other, m.other_index) for m in ms] == [("t", "t", 0)]
    assert contamination([mine], [mine]) == []  # never itself
    dups = near_duplicates([theirs, mine], first_new=1)
    assert [(m.id, m.other, m.other_index) for m in dups] == [("t", "t", 0)]
    assert near_duplicates([mine]) == []


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_hash_seeds_outside_pythonhashseed_range_are_refused(seed: int) -> None:
    from pydantic import ValidationError

    from sandloop.curation.validate import ValidateConfig

    with pytest.raises(ValidationError):
        ValidateConfig(hash_seeds=(1, seed))
    assert ValidateConfig(hash_seeds=(0, 2**32 - 1)).hash_seeds == (0, 2**32 - 1)
