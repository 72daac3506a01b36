"""The verifier end to end, in real sandboxes (full isolation)."""

from __future__ import annotations

import ast
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from sandloop.cli.score import score_command
from sandloop.engine import Engine, LocalBackend
from sandloop.reward import RewardConfig, Verdict, Verifier
from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.sandbox.pool import SandboxPool
from sandloop.tasks import CallTest, Checker, Comparison, IOTest, Task, TaskLimits, load_tasks
from sandloop.tasks.values import encode

PoolThread = Any  # the session fixture of conftest.py

HUMANEVAL = load_tasks("humaneval")


def test_all_164_humaneval_references_score_1(sandbox: PoolThread) -> None:
    v = Verifier(sandbox.pool.run)
    start = time.perf_counter()
    results = sandbox.all(v.verify(t, t.reference_solution or "") for t in HUMANEVAL)
    elapsed = time.perf_counter() - start
    bad = [(r.task_id, r.verdict, [o.detail for o in r.tests if o.verdict != "passed"][:1])
           for r in results if r.reward != 1.0]
    assert bad == []
    assert all(r.verdict is Verdict.PASSED for r in results)
    assert elapsed < 60


class _FlipFirstCompare(ast.NodeTransformer):
    """Mutates the first comparison or arithmetic operator of a solution."""

    FLIP: ClassVar[dict[type, type]] = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add}

    def __init__(self) -> None:
        self.done = False

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        if not self.done and type(node.ops[0]) in self.FLIP:
            node.ops[0] = self.FLIP[type(node.ops[0])]()
            self.done = True
        return self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        if not self.done and type(node.op) in self.FLIP:
            node.op = self.FLIP[type(node.op)]()
            self.done = True
        return self.generic_visit(node)


def _mutant(task: Task) -> str | None:
    tree = ast.parse(task.prompt + (task.reference_solution or ""))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == task.entry_point)
    m = _FlipFirstCompare()
    m.visit(fn)
    return ast.unparse(tree) if m.done else None


def test_mutated_humaneval_references_do_not_score_1(sandbox: PoolThread) -> None:
    v = Verifier(sandbox.pool.run, time_scale=0.5)
    pairs = [(t, m) for t in HUMANEVAL if (m := _mutant(t)) is not None]
    assert len(pairs) > 120
    results = sandbox.all(v.verify(t, m) for t, m in pairs)
    caught = [r for r in results if r.reward == 0.0]
    assert all(r.reward in (0.0, 1.0) for r in results)
    # A few single-operator mutants are equivalent (e.g. a flipped guard that never fires).
    assert len(caught) / len(results) > 0.9
    # "return None" instead of the real body is never right.
    nones = [(t, t.prompt + "    return None\n") for t in HUMANEVAL[:40]]
    results = sandbox.all(v.verify(t, c) for t, c in nones)
    assert [r.task_id for r in results if r.reward != 0.0] == []


def _stdio_task(**kw: object) -> Task:
    base: dict[str, object] = dict(
        id="sum", test_kind="stdio", limits=TaskLimits(time_s=1.0),
        public_tests=(IOTest(name="p0", stdin="1 2\n", expected_stdout="3\n"),),
        hidden_tests=(IOTest(name="h0", stdin="5 5\n", expected_stdout="10\n"),
                      IOTest(name="h1", stdin="-1 1\n", expected_stdout="0\n")),
    )
    base.update(kw)
    return Task(**base)  # type: ignore[arg-type]


def test_stdio_python_all_tests_in_one_run(sandbox: PoolThread) -> None:
    v = Verifier(sandbox.pool.run, plain_stdio_max_tests=0)
    task = _stdio_task()
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    wrong = "a, b = map(int, input().split())\nprint(a - b if a == 1 else a + b + 1)\n"
    crash = "raise SystemExit(3)\n"
    hang = "while True: pass\n"
    r_good, r_wrong, r_crash, r_hang = sandbox.all(
        v.verify(task, c) for c in (good, wrong, crash, hang))
    assert r_good.reward == 1.0 and r_good.public.passed == 1 and r_good.hidden.passed == 2
    assert r_wrong.reward == 0.0 and r_wrong.verdict is Verdict.WRONG_ANSWER
    assert r_crash.reward == 0.0 and r_crash.verdict is Verdict.RUNTIME_ERROR
    assert r_hang.reward == 0.0 and r_hang.verdict is Verdict.TIMEOUT


# Completions whose verdicts the two Python stdin/stdout paths (one plain run per test, or
# the harness's one run for all tests) must agree on, test by test.
_STDIO_CATALOGUE = {
    "good": "a, b = map(int, input().split())\nprint(a + b)\n",
    "wrong": "a, b = map(int, input().split())\nprint(a - b)\n",
    "crash": "raise SystemExit(3)\n",
    "exception": "raise ValueError('no')\n",
    "hang": "while True: pass\n",
    "memory": "x = bytearray(1 << 30)\nprint(len(x))\n",
    "flood": "print('9' * 200000)\n",
    "silent exit 0": "import os\nos._exit(0)\n",
    "forged channel": ("import os\n"
                       "os.write(3, b'{\"ev\":\"test\",\"id\":\"p0\",\"status\":\"ok\",'\n"
                       "         b'\"stdout\":\"3\\\\n\"}\\n')\n"),
    "no newline": "a, b = map(int, input().split())\nimport sys\nsys.stdout.write(str(a + b))\n",
}


@pytest.mark.parametrize("n_tests", [1, 3])
def test_stdio_python_few_tests_run_as_plain_programs(sandbox: PoolThread, n_tests: int) -> None:
    runs: list[Program] = []

    async def counting(program: Program, limits: Limits) -> ExecResult:
        runs.append(program)
        return await sandbox.pool.run(program, limits)

    tests = _stdio_task(limits=TaskLimits(time_s=1.0, memory_mb=64)).tests[:n_tests]
    task = _stdio_task(limits=TaskLimits(time_s=1.0, memory_mb=64),
                       public_tests=tests[:1], hidden_tests=tests[1:])
    names = list(_STDIO_CATALOGUE)
    direct = sandbox.all(Verifier(counting).verify(task, _STDIO_CATALOGUE[n]) for n in names)
    # One plain run per test, the completion itself as the program: no harness in the sandbox.
    assert len(runs) == n_tests * len(names)
    assert all("_sl_harness.py" not in p.files for p in runs)
    runs.clear()
    harness = sandbox.all(Verifier(counting, plain_stdio_max_tests=0).verify(
        task, _STDIO_CATALOGUE[n]) for n in names)
    assert len(runs) == len(names) and all("_sl_harness.py" in p.files for p in runs)
    by_path = {n: ([o.verdict for o in d.tests], [o.verdict for o in h.tests], d.reward, h.reward)
               for n, d, h in zip(names, direct, harness, strict=True)}
    # A forged record changes nothing: on fd 3 the plain run's channel goes unread (wrong
    # answer: no output), and in the harness's worker fd 3 is closed (the write fails).
    forged = by_path.pop("forged channel")
    assert forged[2] == forged[3] == 0.0
    assert {n: v for n, v in by_path.items() if v[0] != v[1] or v[2] != v[3]} == {}
    verdict = {n: d.verdict for n, d in zip(names, direct, strict=True)}
    assert verdict == {
        "good": Verdict.PASSED, "wrong": Verdict.WRONG_ANSWER, "crash": Verdict.RUNTIME_ERROR,
        "exception": Verdict.RUNTIME_ERROR, "hang": Verdict.TIMEOUT,
        "memory": Verdict.MEMORY_LIMIT, "flood": Verdict.WRONG_ANSWER,
        "silent exit 0": Verdict.WRONG_ANSWER, "forged channel": Verdict.WRONG_ANSWER,
        "no newline": Verdict.PASSED}
    assert all(d.timings.get("sandbox_cpu_s", 0) > 0 for d in direct)


def test_stdio_python_own_hash_seed_keeps_the_harness(sandbox: PoolThread) -> None:
    runs: list[Program] = []

    async def counting(program: Program, limits: Limits) -> ExecResult:
        runs.append(program)
        return await sandbox.pool.run(program, limits)

    task = _stdio_task(hidden_tests=(), hash_seed=7)
    r = sandbox.run(Verifier(counting).verify(task, _STDIO_CATALOGUE["good"]))
    assert r.reward == 1.0 and len(runs) == 1 and "_sl_harness.py" in runs[0].files


def test_stdio_other_language_and_checker(sandbox: PoolThread) -> None:
    v = Verifier(sandbox.pool.run)
    bash = _stdio_task(language="bash")
    r = sandbox.run(v.verify(bash, "read a b\necho $((a + b))\n"))
    assert r.reward == 1.0, r.tests
    # Any two numbers summing to the answer are accepted: only a checker can judge that.
    checker = Checker(source=(
        "import sys\n"
        "inp, out, ans = (open(p).read().split() for p in sys.argv[1:4])\n"
        "sys.exit(0 if len(out) == 2 and int(out[0]) + int(out[1]) == int(ans[0]) else 1)\n"))
    split = _stdio_task(checker=checker)
    ok = "a, b = map(int, input().split())\nprint(a + b - 1, 1)\n"
    bad = "print(1, 1)\n"
    r_ok, r_bad = sandbox.all([v.verify(split, ok), v.verify(split, bad)])
    assert r_ok.reward == 1.0, r_ok.tests
    assert r_bad.reward == 0.0 and r_bad.verdict is Verdict.WRONG_ANSWER


def test_stdio_compiled_language_compiles_once(sandbox: PoolThread) -> None:
    calls: list[str] = []

    async def counting_run(program: Program, limits: Limits) -> ExecResult:
        calls.append(program.language)
        return await sandbox.pool.run(program, limits)

    v = Verifier(counting_run)
    task = _stdio_task(language="cpp")
    good = "#include <iostream>\nint main(){long a,b;std::cin>>a>>b;std::cout<<a+b<<std::endl;}\n"
    r = sandbox.run(v.verify(task, good))
    assert r.reward == 1.0, r.tests
    assert calls.count("bash") == 4 and len(calls) == 4  # one compile + one run per test
    crash = "#include <cstdlib>\nint main(){std::abort();}\n"
    broken = "int main(){ return undefined; }\n"
    r_crash, r_broken = sandbox.all([v.verify(task, crash), v.verify(task, broken)])
    assert r_crash.verdict is Verdict.RUNTIME_ERROR and r_crash.reward == 0.0
    assert r_broken.verdict is Verdict.COMPILE_ERROR and r_broken.reward == 0.0
    assert "undefined" in (r_broken.tests[0].detail or "")


def test_unittest_and_pytest_style_scripts(sandbox: PoolThread) -> None:
    source = (
        "import unittest\n"
        "class TestAdd(unittest.TestCase):\n"
        "    def test_small(self):\n"
        "        self.assertEqual(add(1, 2), 3)\n"
        "    def test_raises(self):\n"
        "        with self.assertRaises(TypeError):\n"
        "            add(1, None)\n"
        "def test_plain():\n"
        "    assert candidate(-1, 1) == 0\n"
    )
    from sandloop.tasks.convert import expand_script
    task = Task(id="add", entry_point="add", test_kind="script",
                hidden_tests=tuple(expand_script(source)))
    assert [t.name for t in task.hidden_tests] == ["TestAdd.test_small", "TestAdd.test_raises",
                                                    "test_plain"]
    v = Verifier(sandbox.pool.run)
    honest = "def add(a, b):\n    return a + b\n"
    skip = "import unittest\ndef add(a, b):\n    raise unittest.SkipTest('no')\n"
    r_ok, r_skip = sandbox.all([v.verify(task, honest), v.verify(task, skip)])
    assert r_ok.reward == 1.0, r_ok.tests
    assert r_skip.reward == 0.0 and r_skip.hidden.passed == 0


async def _always_broken(program: Program, limits: Limits) -> ExecResult:
    return ExecResult.sandbox_error("injected: slot lost")


def test_injected_sandbox_error_gives_null_reward_and_is_not_retried_by_the_verifier() -> None:
    calls = 0

    async def broken(program: Program, limits: Limits) -> ExecResult:
        nonlocal calls
        calls += 1
        return await _always_broken(program, limits)

    v = Verifier(broken)
    r = asyncio.run(v.verify(HUMANEVAL[0], HUMANEVAL[0].reference_solution or ""))
    assert calls == 1  # only the engine retries (engine/retry.py): no stacked attempts
    assert r.reward is None and r.verdict is Verdict.SANDBOX_ERROR
    assert r.reward_reason is not None and "injected: slot lost" in r.reward_reason


def test_injected_transient_sandbox_error_is_retried_by_the_engine() -> None:
    class FailsOnceBackend(LocalBackend):
        """Fault injection: the first run is lost to an infrastructure failure."""

        failed = False

        async def execute(self, program: Program, limits: Limits, *,
                          on_end: Callable[[], None] | None = None) -> ExecResult:
            if not self.failed:
                self.failed = True
                return ExecResult.sandbox_error("injected: transient")
            return await super().execute(program, limits, on_end=on_end)

    async def go() -> tuple[float | None, int]:
        async with Engine(FailsOnceBackend(SandboxPool(1)), retry_backoff_s=0.0) as e:
            r = await Verifier(e.runner()).verify(HUMANEVAL[0],
                                                   HUMANEVAL[0].reference_solution or "")
            return r.reward, e.stats.retried

    assert asyncio.run(go()) == (1.0, 1)


def test_hidden_expected_values_never_enter_the_sandbox() -> None:
    seen: list[Program] = []

    async def spy(program: Program, limits: Limits) -> ExecResult:
        seen.append(program)
        return ExecResult.sandbox_error("spy only")

    task = Task(id="t", entry_point="f", hidden_tests=(
        CallTest(name="h", args=["input-marker"], expected="SECRET-EXPECTED-VALUE"),))
    asyncio.run(Verifier(spy).verify(task, "def f(x):\n    return x\n"))
    (program,) = seen
    files = b"".join(v.encode() if isinstance(v, str) else v for v in program.files.values())
    everything = str(program.stdin).encode() + program.source.encode() + files
    assert b"input-marker" in everything
    assert b"SECRET-EXPECTED-VALUE" not in everything


def test_score_command_resumes_from_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    comps = tmp_path / "c.jsonl"
    lines = [{"task_id": t.id, "completion": t.reference_solution} for t in HUMANEVAL[:6]]
    lines.append({"task_id": "HumanEval/0", "completion": "    return 42\n", "completion_id": "bad"})
    comps.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out, db = tmp_path / "out.jsonl", tmp_path / "r.db"
    rc = score_command("humaneval", comps, out=out, db=db, as_json=True, progress=False, k=(1,))
    assert rc == 0
    first = json.loads(capsys.readouterr().out)
    assert first["cached"] == 0 and first["completions"] == 7
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["completion_id"] for r in rows] == ["0", "0", "0", "0", "0", "0", "bad"]
    assert {"task_id", "completion_id", "reward", "verdict", "tests", "public", "hidden",
            "timings"} <= set(rows[0])
    assert rows[-1]["reward"] == 0.0 and rows[-1]["verdict"] == "wrong_answer"
    assert first["pass_at_k"]["pass@1"] == pytest.approx((5 + 0.5) / 6)
    rc = score_command("humaneval", comps, out=out, db=db, as_json=True, progress=False, k=(1,))
    second = json.loads(capsys.readouterr().out)
    assert rc == 0 and second["cached"] == 7
    assert [json.loads(x) for x in out.read_text().splitlines()] == rows


def test_score_command_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    comps = tmp_path / "c.jsonl"
    comps.write_text('{"task_id": "HumanEval/0", "completion": "x"}\n{"task_id": "nope", "completion": ""}\n')
    assert score_command("humaneval", comps, no_db=True, progress=False) == 2
    assert "c.jsonl:2: field 'task_id': 'nope' is not in the task set" in capsys.readouterr().err


def _bool_task(mode: str = "strict") -> Task:
    return Task(
        id="bools", entry_point="classify", comparison=Comparison(values=mode),  # type: ignore[arg-type]
        public_tests=(CallTest(name="even", args=[4], expected=True),),
        hidden_tests=(
            CallTest(name="odd", args=[3], expected=False),
            CallTest(name="list", args=[[1, 2, 3]], expected=[False, True, False]),
            CallTest(name="dict", args=[[2, 5]],
                     expected=encode({"2": True, "5": False, "all": False})),
        ),
    )


_BOOLS_GOOD = """\
def classify(x):
    if isinstance(x, int):
        return x % 2 == 0
    if len(x) == 3:
        return [v % 2 == 0 for v in x]
    out = {str(v): v % 2 == 0 for v in x}
    out["all"] = all(out.values())
    return out
"""


def test_functions_returning_bools_score_1_through_the_sandbox(sandbox: PoolThread) -> None:
    """A correct bool (or list or dict of bools) was a wrong answer in strict and json modes."""
    v = Verifier(sandbox.pool.run)
    wrong = _BOOLS_GOOD.replace("== 0", "== 1")
    as_ints = _BOOLS_GOOD.replace("v % 2 == 0", "int(v % 2 == 0)").replace(
        "x % 2 == 0", "int(x % 2 == 0)")
    for mode in ("strict", "json", "python"):
        task = _bool_task(mode)
        good_r, wrong_r, ints_r = sandbox.all(v.verify(task, c) for c in (_BOOLS_GOOD, wrong, as_ints))
        assert good_r.reward == 1.0 and good_r.verdict is Verdict.PASSED, (mode, good_r.tests)
        assert wrong_r.reward == 0.0, mode
        assert all(o.verdict is Verdict.WRONG_ANSWER for o in wrong_r.tests), (mode, wrong_r.tests)
        # 1 for True: right only where Python == is the rule.
        assert ints_r.reward == (1.0 if mode == "python" else 0.0), (mode, ints_r.tests)


def test_completion_sees_no_module_entry_left_by_the_harness(sandbox: PoolThread) -> None:
    """The harness's stub puts a None ``sandloop`` entry in sys.modules while it loads the value
    codec (so that its ``from sandloop.errors import`` fails at once); none may be left for the
    completion, whose ``import sandloop`` must fail as in any interpreter without sandloop."""
    task = Task(id="modules", entry_point="probe",
                public_tests=(CallTest(name="t", args=[], expected=[False, "ModuleNotFoundError"]),))
    probe = """\
import sys
def probe():
    try:
        import sandloop
        err = None
    except ImportError as e:
        err = type(e).__name__
    return ["sandloop" in sys.modules, err]
"""
    r = sandbox.all([Verifier(sandbox.pool.run).verify(task, probe)])[0]
    assert r.reward == 1.0, r.tests


# Typed values that must cross the sandbox boundary intact, and, per mode, a look-alike.
_TRICKY: list[tuple[str, str, str]] = [  # (name, the value's literal, a look-alike's literal)
    ("none", "None", "0"),
    ("true", "True", "1"),
    ("neg_zero", "-0.0", "0"),
    ("nan", "float('nan')", "'nan'"),
    ("inf", "float('-inf')", "-1e308"),
    ("tuple", "(1, [2.0, (None,)])", "[1, [2.0, [None]]]"),
    ("dict", "{'a': {1, 2}, b'k': frozenset({'x'})}", "{'a': frozenset({1, 2}), b'k': {'x'}}"),
    ("bytes", "b'\\x00\\xff'", "'\\x00\\xff'"),
    ("tuple_key", "{(1, 2): [True, None]}", "{(1, 2): [1, None]}"),
    ("complex", "1+2j", "(1, 2)"),
    ("big_int", "2**100", "float(2**100)"),
    ("float_int", "3.0", "3"),
]
# Which look-alikes each mode accepts (the documented merges: json ints/floats and lists/tuples;
# python's ==, under which -0.0 == 0, True == 1 and {1, 2} == frozenset({1, 2})).
_LOOKALIKE_PASSES = {
    "strict": set(),
    "json": {"neg_zero", "tuple", "big_int", "float_int"},
    "python": {"true", "neg_zero", "dict", "tuple_key", "big_int", "float_int"},
}


def test_typed_values_survive_the_sandbox_in_every_mode(sandbox: PoolThread) -> None:
    v = Verifier(sandbox.pool.run, reward=RewardConfig(mode="fraction", on="all"))
    names = [n for n, _, _ in _TRICKY]

    def program(column: int) -> str:
        table = ",\n    ".join(f"{n!r}: {row[column]}" for n, *row in _TRICKY)
        return f"def f(name):\n    return {{\n    {table}\n    }}[name]\n"

    expected = {n: eval(lit) for n, lit, _ in _TRICKY}  # our own literals
    for mode in ("strict", "json", "python"):
        task = Task(
            id="tricky", entry_point="f", comparison=Comparison(values=mode),  # type: ignore[arg-type]
            hidden_tests=tuple(CallTest(name=n, args=[n], expected=encode(expected[n]))
                               for n in names),
        )
        same_r, alike_r = sandbox.all([v.verify(task, program(0)), v.verify(task, program(1))])
        assert same_r.reward == 1.0, (mode, [o for o in same_r.tests if o.verdict != "passed"])
        passed = {o.name for o in alike_r.tests if o.verdict is Verdict.PASSED}
        assert passed == _LOOKALIKE_PASSES[mode], mode
        assert all(o.verdict in (Verdict.PASSED, Verdict.WRONG_ANSWER) for o in alike_r.tests)


def test_compile_step_follows_the_task_limits(sandbox: PoolThread) -> None:
    """The verifier compiles C/C++ within limits derived from the task's (64 MiB, 1 s here:
    512 MiB, 20 s), not a fixed 1 GiB / 30 s: a compile bomb is a compile error, never more."""
    seen: list[tuple[Program, Limits, ExecResult]] = []

    async def recording_run(program: Program, limits: Limits) -> ExecResult:
        r = await sandbox.pool.run(program, limits)
        seen.append((program, limits, r))
        return r

    v = Verifier(recording_run)
    task = _stdio_task(language="cpp", limits=TaskLimits(time_s=1.0, memory_mb=64))
    bomb = "".join([
        "#define A 1,1,1,1,1,1,1,1,1,1,\n",
        *(f"#define {b} {(a + ' ') * 10}\n" for a, b in zip("ABCDEFG", "BCDEFGH", strict=True)),
        "int x[] = { H };\nint main(){ return x[0]; }\n",
    ])
    r = sandbox.run(v.verify(task, bomb))
    assert r.verdict is Verdict.COMPILE_ERROR and r.reward == 0.0, r.tests
    assert "sandloop: the compile step hit its" in (r.tests[0].detail or ""), r.tests[0].detail
    ((_, limits, compiled),) = seen
    assert (limits.time_s, limits.memory_mb) == (20.0, 512)
    assert compiled.peak_memory_mb <= 513
    seen.clear()
    good = "#include <iostream>\nint main(){ long a, b; std::cin >> a >> b; std::cout << a + b; }\n"
    r = sandbox.run(v.verify(task, good))
    assert r.reward == 1.0, r.tests


def test_identical_completions_run_once_per_batch_and_once_across_batches_with_a_cache(
        sandbox: PoolThread, tmp_path: Path) -> None:
    from sandloop.reward.scoring import Completion, ResultCache, score_all
    from sandloop.store import ResultStore

    runs: list[Program] = []

    async def counting(program: Program, limits: Limits) -> ExecResult:
        runs.append(program)
        return await sandbox.pool.run(program, limits)

    task = _stdio_task()
    good = "a, b = map(int, input().split())\nprint(a + b)\n"
    wrong = "print(0)\n"
    comps = [Completion(task_id=task.id, completion=c, completion_id=str(i))
             for i, c in enumerate((good, wrong, good, good, wrong))]
    cache = ResultCache(16)
    with ResultStore(tmp_path / "r.db") as store:
        first = sandbox.all([score_all({task.id: task}, comps, Verifier(counting), store=store,
                                       cache=cache)])[0]
        per = len(task.tests)  # plain runs: one per test (PLAIN_STDIO_MAX_TESTS)
        assert len(runs) == 2 * per  # the tests of each distinct completion, once
        assert [r.completion_id for r in first] == ["0", "1", "2", "3", "4"]
        assert [r.reward for r in first] == [1.0, 0.0, 1.0, 1.0, 0.0]
        assert len(store) == 2
        seen: list[bool] = []
        again = sandbox.all([score_all({task.id: task}, comps[:3], Verifier(counting),
                                       cache=cache, on_result=lambda _r, c: seen.append(c))])[0]
    assert len(runs) == 2 * per and seen == [True, True, True]  # answered by the cache
    assert [r.model_dump() for r in again] == [r.model_dump() for r in first[:3]]


def test_harness_taken_warm_only_when_its_hashes_match() -> None:
    """The harness is a warm module of the pools (sandbox/warm.py). A pool without it, and one
    whose ``_sl_harness`` is another module (not this harness's hash), score exactly as the
    warm pool: the stub loads the run's own copy."""
    import sandloop.reward.verifier as verifier

    impostor = "def _bootstrap():\n    print('impostor')\n    raise SystemExit(0)\n"
    tasks = HUMANEVAL[:12]
    hacks = [(t, "import sys\nsys.exit(0)\n") for t in tasks[:3]]

    async def score(warm_modules: dict[str, str] | None) -> list[tuple[str, float | None, str]]:
        async with SandboxPool(2, warm_modules=warm_modules) as pool:
            v = Verifier(pool.run)
            pairs = [(t, t.reference_solution or "") for t in tasks] + hacks
            rs = await asyncio.gather(*(v.verify(t, c) for t, c in pairs))
        return [(r.task_id, r.reward, r.verdict.value) for r in rs]

    warm = asyncio.run(score(None))
    assert [w[1] for w in warm] == [1.0] * len(tasks) + [0.0] * len(hacks)
    assert asyncio.run(score({})) == warm
    assert asyncio.run(score({"_sl_values": verifier._VALUES, "_sl_harness": impostor})) == warm
