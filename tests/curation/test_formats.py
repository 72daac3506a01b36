"""More task formats, each on a small file in that format: EvalPlus (plus inputs verified, not
dropped), LiveCodeBench (public/private stdin and functional tests, release date), Parquet and
gzip for tasks and completions, completions that name their language. Scored for real."""

from __future__ import annotations

import base64
import gzip
import json
import pickle
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from sandloop.curation.sets import released, split_tasks
from sandloop.engine import Engine
from sandloop.reward.scoring import CompletionFileError, read_completions, score_all
from sandloop.reward.verdicts import RewardConfig
from sandloop.reward.verifier import Verifier
from sandloop.tasks import TaskFormatError, load_tasks

EVALPLUS = {
    "task_id": "HumanEval/0", "entry_point": "below_zero",
    "prompt": "def below_zero(ops: list) -> bool:\n    \"\"\"True if the running balance ever "
              "drops below zero.\n    >>> below_zero([1, -2])\n    True\n    \"\"\"\n",
    "canonical_solution": "    b = 0\n    for op in ops:\n        b += op\n        if b < 0:\n"
                          "            return True\n    return False\n",
    "base_input": [[[1, 2]], [[1, -2]]],
    # A plus input the base ones miss: the balance recovers after going negative.
    "plus_input": [[[-1, 5]], [[3, -3, -1]]] + [[[i, -i]] for i in range(25)],
    "atol": 0, "contract": "",
}
# Returns the final balance's sign: passes the base inputs, fails the plus ones.
WRONG = "def below_zero(ops):\n    return sum(ops) < 0\n"

LCB_FUNCTIONAL = {
    "question_id": "2023", "question_title": "add", "platform": "leetcode",
    "question_content": "Return a + b.", "contest_date": "2024-05-04T00:00:00",
    "starter_code": "class Solution:\n    def add(self, a: int, b: int) -> int:\n        ",
    "public_test_cases": json.dumps([{"input": "1\n2", "output": "3", "testtype": "functional"}]),
    "private_test_cases": json.dumps([{"input": "[1]\n[2]", "output": "[1, 2]",
                                       "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "add"}), "difficulty": "easy",
}


def _compressed(cases: list[dict[str, str]]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB_STDIN = {
    "question_id": "abc300_a", "question_title": "echo", "platform": "atcoder",
    "question_content": "Print N doubled.", "contest_date": "2023-04-29T00:00:00",
    "starter_code": "",
    "public_test_cases": json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}]),
    "private_test_cases": _compressed([{"input": "5\n", "output": "10\n", "testtype": "stdin"}]),
    "metadata": "{}", "difficulty": "easy",
}


def _jsonl(path: Path, recs: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[Engine]:
    async with Engine(max_attempts=1) as e:
        yield e


def test_evalplus_keeps_plus_inputs(tmp_path: Path) -> None:
    (t,) = load_tasks(_jsonl(tmp_path / "he_plus.jsonl", [EVALPLUS]))
    names = [x.name for x in t.hidden_tests]
    assert names == ["base0", "plus0", "plus1"]  # 27 plus inputs, 20 per test
    assert t.source == "evalplus" and t.id == "HumanEval/0"
    assert len(t.public_tests) == 1  # the prompt's doctest example


@pytest.mark.asyncio(loop_scope="module")
async def test_evalplus_plus_inputs_are_verified(engine: Engine, tmp_path: Path) -> None:
    (t,) = load_tasks(_jsonl(tmp_path / "he_plus.jsonl", [EVALPLUS]))
    v = Verifier(engine.runner(), reward=RewardConfig(on="all"))
    ref = await v.verify(t, t.reference_solution or "")
    assert ref.reward == 1.0, ref.tests
    bad = await v.verify(t, WRONG)
    verdicts = {o.name: o.verdict.value for o in bad.tests}
    assert verdicts["base0"] == "passed" and verdicts["plus0"] == "wrong_answer"
    assert bad.reward == 0.0
    assert "[-1, 5]" in (next(o for o in bad.tests if o.name == "plus0").detail or "")


def test_livecodebench_functional_and_stdin(tmp_path: Path) -> None:
    f, s = load_tasks(_jsonl(tmp_path / "lcb.jsonl", [LCB_FUNCTIONAL, LCB_STDIN]))
    assert f.id == "2023" and f.test_kind == "function" and f.entry_point == "add"
    assert f.public_tests[0].args == [1, 2] and f.hidden_tests[0].args == [[1], [2]]
    assert released(f) == "2024-05-04" and "leetcode" in f.tags
    assert s.id == "abc300_a" and s.test_kind == "stdio"
    assert s.hidden_tests[0].stdin == "5\n"  # decompressed private test
    train, ev = split_tasks([f, s], released_after="2024-01-01")
    assert [t.id for t in ev] == ["2023"] and [t.id for t in train] == ["abc300_a"]
    # Dates, not strings ("2024-1-5" sorts after "2024-10-01" as text): a non-ISO one is refused.
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        split_tasks([f, s], released_after="2024-1-5")
    odd = f.model_copy(update={"tags": ["released:2024-5-4"]})
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        split_tasks([odd], released_after="2024-01-01")


def test_livecodebench_refuses_pickles_that_name_code(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("pwned",))

    rec = dict(LCB_STDIN, private_test_cases=base64.b64encode(
        zlib.compress(pickle.dumps(Boom()))).decode())
    with pytest.raises(TaskFormatError, match=r"refusing a pickled builtins\.print"):
        load_tasks(_jsonl(tmp_path / "bad.jsonl", [rec]))


@pytest.mark.asyncio(loop_scope="module")
async def test_parquet_and_gzip_tasks_and_completions(engine: Engine, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist([LCB_STDIN]), tmp_path / "lcb.parquet")
    with gzip.open(tmp_path / "lcb.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(LCB_STDIN) + "\n")
    a = load_tasks(tmp_path / "lcb.parquet")
    b = load_tasks(tmp_path / "lcb.jsonl.gz")
    assert a == b and a[0].hidden_tests[0].stdin == "5\n"
    by_id = {t.id: t for t in a}
    rows = [
        {"task_id": "abc300_a", "completion": "print(int(input()) * 2)", "completion_id": "py",
         "language": None},
        {"task_id": "abc300_a", "language": "c", "completion_id": "c",
         "completion": '#include <stdio.h>\nint main(void){int n; scanf("%d",&n);'
                       'printf("%d\\n", 2*n); return 0;}\n'},
        {"task_id": "abc300_a", "language": "bash", "completion_id": "sh",
         "completion": "read n; echo $((n + 1))"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    for path in (tmp_path / "c.parquet", tmp_path / "c.jsonl.gz"):
        items = read_completions(path, by_id)
        assert [c.language for c in items] == [None, "c", "bash"]
        res = await score_all(by_id, items, Verifier(engine.runner()))
        assert [r.reward for r in res] == [1.0, 1.0, 0.0], [r.tests for r in res]


def test_completion_language_must_fit_the_task(tmp_path: Path) -> None:
    (f,) = load_tasks(_jsonl(tmp_path / "lcb.jsonl", [LCB_FUNCTIONAL]))
    comp = _jsonl(tmp_path / "c.jsonl", [{"task_id": "2023", "completion": "x", "language": "c"}])
    with pytest.raises(CompletionFileError, match="only stdin/stdout tasks"):
        read_completions(comp, {f.id: f})
