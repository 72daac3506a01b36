"""Stdin/stdout tasks in Java, Go, Rust and TypeScript through the verifier: compile once (one
compile run, one run per test on the same artifact), compile errors with the compiler's
message, and the same through the engine's job graphs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandloop.engine import Engine, Graph
from sandloop.reward import Verdict, Verifier
from sandloop.sandbox.graph import GraphResult
from sandloop.sandbox.languages import LanguageUnavailable, spec_for
from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.tasks import IOTest, Task, TaskLimits

PoolThread = Any  # the session fixture of conftest.py

SUM = {
    "java": """import java.util.*;
public class Main { public static void main(String[] a) {
    Scanner s = new Scanner(System.in); long x = s.nextLong(), y = s.nextLong();
    System.out.println(x + y); } }
""",
    "go": """package main
import "fmt"
func main() { var a, b int64; fmt.Scan(&a, &b); fmt.Println(a + b) }
""",
    "rust": """use std::io::Read;
fn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap();
    let v: Vec<i64> = s.split_whitespace().map(|t| t.parse().unwrap()).collect();
    println!("{}", v[0] + v[1]); }
""",
    "typescript": """const [a, b]: number[] = require("fs").readFileSync(0, "utf8").trim().split(/\\s+/).map(Number);
console.log(a + b);
""",
}
WRONG = {k: v.replace("+ b", "- b").replace("x + y", "x - y").replace("v[0] + v[1]", "v[0] - v[1]")
         for k, v in SUM.items()}
BROKEN = {
    "java": "public class Main { public static void main(String[] a) { undefinedName(); } }",
    "go": "package main\nfunc main() { undefinedName() }\n",
    "rust": "fn main() { undefined_name(); }\n",
    "typescript": "const n: number = undefinedName;\n",
}


def _task(language: str) -> Task:
    return Task(id=f"sum-{language}", test_kind="stdio", language=language,
                limits=TaskLimits(time_s=5.0, memory_mb=256),
                public_tests=(IOTest(name="p0", stdin="1 2\n", expected_stdout="3\n"),),
                hidden_tests=(IOTest(name="h0", stdin="5 5\n", expected_stdout="10\n"),
                              IOTest(name="h1", stdin="1 1\n", expected_stdout="2\n")))


def _require(lang: str) -> None:
    try:
        spec_for(lang).check_available()
    except LanguageUnavailable as e:  # pragma: no cover - `make` installs the toolchains
        pytest.skip(str(e))


@pytest.mark.parametrize("lang", ["java", "go", "rust", "typescript"])
def test_stdio_task_compiles_once_and_judges_each_test(sandbox: PoolThread, lang: str) -> None:
    _require(lang)
    calls: list[Program] = []

    async def counting_run(program: Program, limits: Limits) -> ExecResult:
        calls.append(program)
        return await sandbox.pool.run(program, limits)

    v = Verifier(counting_run)
    task = _task(lang)
    r = sandbox.run(v.verify(task, SUM[lang]))
    assert r.reward == 1.0, r.tests
    assert len(calls) == 4 and len([p for p in calls if p.collect]) == 1  # compile + 3 tests
    calls.clear()
    r_wrong, r_broken = sandbox.all([v.verify(task, WRONG[lang]), v.verify(task, BROKEN[lang])])
    assert r_wrong.reward == 0.0 and r_wrong.verdict is Verdict.WRONG_ANSWER, r_wrong.tests
    assert r_broken.reward == 0.0 and r_broken.verdict is Verdict.COMPILE_ERROR
    assert "undefined" in (r_broken.tests[0].detail or "").lower(), r_broken.tests[0].detail
    # A failed compile cancels the test runs: one run only.
    assert len(calls) == 4 + 1


def test_the_verifier_runs_its_graph_through_the_engine() -> None:
    _require("go")
    graphs: list[GraphResult] = []

    async def go() -> tuple[float | None, Verdict, int]:
        async with Engine(slots=2) as e:
            engine_graph = e.graph_runner(priority="eval")

            async def recording(graph: Graph) -> GraphResult:
                graphs.append(await engine_graph(graph))
                return graphs[-1]

            v = Verifier(e.runner(), run_graph=recording)
            ok = await v.verify(_task("go"), SUM["go"])
            broken = await v.verify(_task("go"), BROKEN["go"])
            return ok.reward, broken.verdict, e.stats.submitted

    reward, verdict, submitted = asyncio.run(go())
    assert reward == 1.0 and verdict is Verdict.COMPILE_ERROR
    assert submitted == 4 + 1 and len(graphs) == 2
    cancelled = [n for n in graphs[1].nodes.values() if n.state == "cancelled"]
    assert len(cancelled) == 3
    assert all("parent 'compile' ended runtime_error" in (n.reason or "") for n in cancelled)


def test_checker_runs_in_the_graph_after_each_test(sandbox: PoolThread) -> None:
    """compile -> test i -> checker i: the checker reads the test's output as a file, and a
    test that did not run ok has no checker run."""
    _require("go")
    from sandloop.tasks import Checker

    calls: list[Program] = []

    async def counting_run(program: Program, limits: Limits) -> ExecResult:
        calls.append(program)
        return await sandbox.pool.run(program, limits)

    checker = Checker(source=(
        "import sys\n"
        "inp, out, ans = (open(p).read().split() for p in sys.argv[1:4])\n"
        "sys.exit(0 if len(out) == 2 and int(out[0]) + int(out[1]) == int(ans[0]) else 1)\n"))
    task = _task("go").model_copy(update={"checker": checker, "version": ""})
    task = Task.model_validate(task.model_dump())
    split = """package main
import ("fmt"; "os")
func main() { var a, b int64; fmt.Scan(&a, &b); if a == 5 { os.Exit(4) }; fmt.Println(a+b-1, 1) }
"""
    r = sandbox.run(Verifier(counting_run).verify(task, split))
    verdicts = {t.name: t.verdict for t in r.tests}
    assert verdicts == {"p0": Verdict.PASSED, "h0": Verdict.RUNTIME_ERROR,
                        "h1": Verdict.PASSED}, r.tests
    checks = [p for p in calls if p.argv == ["input.txt", "output.txt", "answer.txt"]]
    assert len(calls) == 1 + 3 + 2 and len(checks) == 2
    wrong = split.replace("a+b-1, 1", "a+b, 1")
    r = sandbox.run(Verifier(counting_run).verify(task, wrong))
    assert r.reward == 0.0 and r.tests[0].verdict is Verdict.WRONG_ANSWER
    assert "checker: runtime_error, exit 1" in (r.tests[0].detail or "")
