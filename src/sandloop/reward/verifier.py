"""Verify one completion of one task in the sandbox and turn the evidence into a reward.

Python function, script and stdin/stdout tests run in ONE sandbox run per completion through the
harness in :mod:`sandloop.reward.sandbox_harness` (per-test time limits inside). Return values and
program outputs come back on the result channel (fd 3) and are compared here, outside the sandbox;
exit codes and printed text are never evidence. Other languages' stdin/stdout tests run as a job
graph: ``compile -> [test 1..n]`` for compiled languages (compile once, one sandbox run per test
on a copy of the artifact), ``[test 1..n]`` otherwise. Java, Go, Rust and TypeScript
function-call tests are a graph too: the completion and a generated harness
(:mod:`sandloop.reward.call_harness`) compiled once, then one run per test, its typed return
value on the result channel. Custom checkers run in their own sandbox runs.

A ``sandbox_error`` (the infrastructure's failure) gives the affected tests the ``sandbox_error``
verdict and the reward ``None`` with the reason. The verifier only classifies: retrying is the
engine's job (``sandloop.engine.RetryPolicy``), so pass an engine's runner (``engine.runner()``)
to have infrastructure failures retried.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandloop.reward.assemble import assemble
from sandloop.reward.call_harness import call_harness
from sandloop.reward.compare import output_equal, values_equal
from sandloop.reward.verdicts import (
    RewardConfig,
    TestOutcome,
    Verdict,
    counted_tests,
    overall_verdict,
    shape_reward,
)
from sandloop.sandbox import warm
from sandloop.sandbox.graph import (
    Graph,
    GraphResult,
    GraphRunner,
    Input,
    Node,
    NodeResult,
    NodeState,
    execute_graph,
)
from sandloop.sandbox.languages import spec_for
from sandloop.sandbox.models import ExecResult, Limits, Program, Status, with_compile_limit_note
from sandloop.tasks import CallTest, Checker, Comparison, IOTest, ScriptTest, Task
from sandloop.tasks.values import ValueCodecError, decode

__all__ = ["HARNESS_VERSION", "PLAIN_STDIO_MAX_TESTS", "CompletionResult", "Runner", "Verifier", "completion_hash"]

HARNESS_VERSION = "1"

# A Python stdin/stdout task with at most this many tests runs each test as a program of its
# own, in its own sandbox, like the other languages: the harness's run holds a driver, a worker
# and a child per test, ~9 ms of CPU for one test where a plain run costs ~4 ms, each further
# test ~3 ms against ~5 (benchmarks/bench_stdio_paths.py: plain/harness 0.37 at 1 test, 0.85
# at 4, 1.16 at 8). Beyond it the harness's one sandbox for all tests is cheaper.
PLAIN_STDIO_MAX_TESTS = 4

Runner = Callable[[Program, Limits], Awaitable[ExecResult]]


def _harness_files() -> tuple[str, str]:
    pkg = resources.files("sandloop.reward")
    harness = pkg.joinpath("sandbox_harness.py").read_text(encoding="utf-8")
    values = resources.files("sandloop.tasks").joinpath("values.py").read_text(encoding="utf-8")
    return harness, values


_HARNESS, _VALUES = _harness_files()
_HARNESS_HASH = hashlib.sha256((_HARNESS + _VALUES).encode()).hexdigest()[:12]


def _judge_hash() -> str:
    """Hash of the code that judges outside the sandbox (comparison, assembly, verdicts, reward
    shaping, this module) and of the call harness that compiled languages' function tests
    run. Stored results are keyed by it, so a fix there (e.g. a comparison that called correct
    booleans wrong) invalidates the results it would change instead of reusing them forever."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("compare.py", "assemble.py", "verdicts.py", "verifier.py", "call_harness.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:12]


_JUDGE_HASH = _judge_hash()

# The harness and its value codec are warm modules (sandbox/warm.py): each zygote of a pool
# started after this import holds them loaded, which saves a run loading them (~1.8 ms, ~230 page
# faults, measured in the sandbox; docs/rewards.md). The stub uses them when their hashes are this harness's, else loads the run's copies:
# compiled (marshal) when the sandbox's Python is this interpreter (compiling the source took
# ~20 ms of every run), from the source otherwise.
warm.register("_sl_values", _VALUES)
warm.register("_sl_harness", _HARNESS)
_STUB = f"""\
import gc, marshal, os, sys, types
# Objects inherited from the fork-server stay out of the collector: a collection would touch, and
# so copy-on-write copy, the whole inherited heap (~8 ms per run measured).
gc.freeze()
_here = os.path.dirname(os.path.abspath(__file__))
_v, _h = sys.modules.get("_sl_values"), sys.modules.get("_sl_harness")
if (getattr(_v, "__warm_hash__", None) == {warm.source_hash(_VALUES)!r}
        and getattr(_h, "__warm_hash__", None) == {warm.source_hash(_HARNESS)!r}):
    _h.__file__ = os.path.join(_here, "_sl_harness.py")
    _h._bootstrap()
def _load(name):
    path = os.path.join(_here, name)
    if sys.implementation.cache_tag == {sys.implementation.cache_tag!r}:
        with open(path + "c", "rb") as f:
            return marshal.loads(f.read())
    with open(path, encoding="utf-8") as f:
        return compile(f.read(), name, "exec")
_m = types.ModuleType("_sl_values")
_m.__file__ = os.path.join(_here, "_sl_values.py")
exec(_load("_sl_values.py"), _m.__dict__)
sys.modules["_sl_values"] = _m
exec(_load("_sl_harness.py"), globals())
"""
_FILES: dict[str, str | bytes] = {
    "_sl_harness.py": _HARNESS,
    "_sl_harness.pyc": marshal.dumps(compile(_HARNESS, "_sl_harness.py", "exec")),
    "_sl_values.py": _VALUES,
    "_sl_values.pyc": marshal.dumps(compile(_VALUES, "_sl_values.py", "exec")),
}


# A task's own hash seed (Task.hash_seed): the seed is fixed when an interpreter starts and a
# run is a fork of its slot's zygote (the environment's seed), so the run re-executes the
# interpreter with PYTHONHASHSEED set, stdin (the plan) and the result channel (fd 3) carried
# over, and the harness's stub runs there. Costs one interpreter start (~20 ms) per run.
_SEEDED = """\
import os, sys
os.set_inheritable(3, True)
_main = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sl_main.py")
os.execve(sys.executable, [sys.executable, "-s", _main],
          dict(os.environ, PYTHONHASHSEED="{seed}"))
"""


def completion_hash(completion: str) -> str:
    """Content hash of a completion's text (the store key part)."""
    return hashlib.sha256(completion.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class PassCount(BaseModel):
    """Passed and total counts of one group of tests."""

    model_config = ConfigDict(frozen=True)
    passed: int
    total: int


class CompletionResult(BaseModel):
    """The score of one completion (one line of ``sandloop score`` output)."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    task_version: str
    completion_id: str
    completion_hash: str
    reward: float | None
    reward_reason: str | None = None
    verdict: Verdict
    tests: list[TestOutcome]
    public: PassCount
    hidden: PassCount
    timings: dict[str, float] = Field(default_factory=dict)
    environment: str | None = Field(
        None, description="id of the environment the completion's programs ran in")
    assembled: str | None = Field(None, description="how the program was built from the completion")
    format_error: str | None = None


_STATUS_TO_VERDICT = {
    "timeout": Verdict.TIMEOUT,
    "memory": Verdict.MEMORY_LIMIT,
    "syntax": Verdict.COMPILE_ERROR,
}


def _missing_verdict(r: ExecResult) -> Verdict:
    """Verdict of a test with no record on the channel: the run ended before it reported."""
    if r.status is Status.SANDBOX_ERROR:
        return Verdict.SANDBOX_ERROR
    if r.status is Status.TIMEOUT:
        return Verdict.TIMEOUT
    if r.status is Status.MEMORY_LIMIT:
        return Verdict.MEMORY_LIMIT
    if r.status is Status.COMPILE_ERROR:
        return Verdict.COMPILE_ERROR
    return Verdict.RUNTIME_ERROR


def parse_channel(data: bytes | None) -> dict[str, dict[str, Any]]:
    """Test records from the harness's channel, by test id (the first record of an id counts)."""
    out: dict[str, dict[str, Any]] = {}
    for line in (data or b"").split(b"\n"):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a record cut off by the end of the run
        if isinstance(rec, dict) and rec.get("ev") == "test" and isinstance(rec.get("id"), str):
            out.setdefault(rec["id"], rec)
    return out


class Verifier:
    """Scores completions against tasks through a sandbox runner (``SandboxPool.run`` fits).

    ``comparison`` overrides each task's own comparison settings; ``max_run_s`` caps one run's wall time;
    ``time_scale`` multiplies every per-test time limit; after ``max_timeouts`` timed-out tests the
    rest of a completion's tests are not run and count as timeouts (0: run them all).
    ``plain_stdio_max_tests``: a Python stdin/stdout task with at most this many tests runs each
    test as a plain program in a sandbox of its own instead of all in one harness run (cheaper
    for few tests: see ``PLAIN_STDIO_MAX_TESTS``; 0: always the harness).
    """

    def __init__(
        self,
        run: Runner,
        *,
        reward: RewardConfig | None = None,
        comparison: Comparison | None = None,
        max_run_s: float = 120.0,
        time_scale: float = 1.0,
        max_timeouts: int = 1,
        run_graph: GraphRunner | None = None,
        plain_stdio_max_tests: int = PLAIN_STDIO_MAX_TESTS,
    ) -> None:
        self.run = run
        self.run_graph = run_graph
        self.reward = reward or RewardConfig()
        self.comparison = comparison
        self.max_run_s = max_run_s
        self.time_scale = time_scale
        self.max_timeouts = max_timeouts
        self.plain_stdio_max_tests = plain_stdio_max_tests
        # The harness's plan (stdin) and limits of each task version: built once, not per
        # completion (a training step scores many completions of few tasks).
        self._plans: dict[tuple[str, str, str, float, float, int], tuple[str, Limits]] = {}

    def config_hash(self) -> str:
        """Hash of everything besides task and completion that affects a result."""
        blob = json.dumps(
            {
                "harness": HARNESS_VERSION,
                "harness_src": _HARNESS_HASH,
                "judge_src": _JUDGE_HASH,
                "reward": self.reward.model_dump(mode="json"),
                "comparison": self.comparison.model_dump(mode="json") if self.comparison else None,
                "max_run_s": self.max_run_s,
                "time_scale": self.time_scale,
                "max_timeouts": self.max_timeouts,
                "plain_stdio_max_tests": self.plain_stdio_max_tests,
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    async def verify(
        self, task: Task, completion: str, completion_id: str | None = None
    ) -> CompletionResult:
        """Score one completion of ``task``."""
        t0 = time.perf_counter()
        cmp = self.comparison or task.comparison
        asm = assemble(task, completion)
        timings: dict[str, float] = {}
        env_id: str | None = None
        if asm.format_error is not None:
            outcomes = [
                TestOutcome(name=t.name, verdict=Verdict.COMPILE_ERROR, hidden=task.is_hidden(t.name),
                            weight=t.weight, detail=asm.format_error)
                for t in task.tests
            ]
        else:
            checked: dict[str, ExecResult] = {}
            if task.language == "python" and not _runs_directly(task, self.plain_stdio_max_tests):
                judged, timings, env_id = await self._verify_harness(task, asm.source, cmp)
            elif task.test_kind == "function":
                judged, timings, env_id = await self._verify_calls(task, asm.source, cmp)
            else:
                judged, timings, checked, env_id = await self._verify_per_test(
                    task, asm.source, cmp)
            outcomes = await self._apply_checker(task, judged, checked)
        reward, reason = shape_reward(
            outcomes, self.reward, format_error=asm.format_error is not None
        )
        timings["total_s"] = round(time.perf_counter() - t0, 6)
        pub = [o for o in outcomes if not o.hidden]
        hid = [o for o in outcomes if o.hidden]
        return CompletionResult(
            task_id=task.id,
            task_version=task.version,
            completion_id=completion_id or completion_hash(completion)[:12],
            completion_hash=completion_hash(completion),
            reward=reward,
            reward_reason=reason,
            # Over the tests the reward counts, so verdict and reward never disagree.
            verdict=overall_verdict(counted_tests(outcomes, self.reward.on) or outcomes),
            tests=outcomes,
            public=PassCount(passed=sum(o.verdict is Verdict.PASSED for o in pub), total=len(pub)),
            hidden=PassCount(passed=sum(o.verdict is Verdict.PASSED for o in hid), total=len(hid)),
            timings=timings,
            environment=env_id,
            assembled=asm.how,
            format_error=asm.format_error,
        )

    # -- python: one harness run (stdin/stdout tasks with few tests: one run per test) -------

    def _plan(self, task: Task) -> tuple[dict[str, Any], Limits]:
        per_test = task.limits.time_s * self.time_scale
        tests: list[dict[str, Any]] = []
        for t in task.tests:
            if isinstance(t, CallTest):
                tests.append({"id": t.name, "kind": "call", "args": t.args, "kwargs": t.kwargs,
                              "timeout": per_test})
            elif isinstance(t, ScriptTest):
                tests.append({"id": t.name, "kind": "script", "source": t.source,
                              "call": t.call, "timeout": per_test})
            else:
                tests.append({"id": t.name, "kind": "io", "stdin": t.stdin,
                              "cap": _output_cap(t), "timeout": per_test})
        import_timeout = per_test + 2.0
        budget = min(import_timeout + per_test * len(tests) + 1.0, self.max_run_s)
        has_scripts = any(isinstance(t, ScriptTest) for t in task.tests)
        plan = {
            "mode": "stdio" if task.test_kind == "stdio" else "function",
            "entry_point": task.entry_point,
            # Helpers of the prompt (HumanEval's ``poly``) for test scripts, run by the driver.
            "prelude": task.starter_code if has_scripts else "",
            "import_timeout": import_timeout,
            "budget": budget,
            "max_timeouts": self.max_timeouts,
            "tests": tests,
        }
        limits = Limits(
            time_s=budget + 3.0,
            memory_mb=task.limits.memory_mb,
            # A stdin/stdout test forks a child per test; they run one at a time.
            max_processes=64,
        )
        return plan, limits

    async def _verify_harness(
        self, task: Task, source: str, cmp: Comparison
    ) -> tuple[list[_Judged], dict[str, float], str | None]:
        # ``version`` is a hash of the task's content, tests and limits included; the settings
        # are public attributes, so they are part of the key too.
        pkey = (task.id, task.version, task.test_kind, self.time_scale, self.max_run_s,
                self.max_timeouts)
        planned = self._plans.get(pkey)
        if planned is None:
            if len(self._plans) >= 4096:
                self._plans.clear()
            plan, limits = self._plan(task)
            planned = self._plans[pkey] = (json.dumps(plan, separators=(",", ":")), limits)
        stdin, limits = planned
        files: dict[str, str | bytes] = {"solution.py": source, **_FILES}
        main = _STUB
        if task.hash_seed is not None:
            files["_sl_main.py"] = _STUB
            main = _SEEDED.format(seed=int(task.hash_seed))
        program = Program(
            language="python",
            source=main,
            stdin=stdin,
            files=files,
            environment=task.environment,
        )
        r = await self.run(program, limits)
        records = parse_channel(r.channel)
        outcomes = [self._judge(task, t, records.get(t.name), r, cmp) for t in task.tests]
        timings = {"sandbox_wall_s": round(r.wall_time_s, 6), "sandbox_cpu_s": round(r.cpu_time_s, 6)}
        return outcomes, timings, r.environment

    def _judge(
        self, task: Task, test: CallTest | IOTest | ScriptTest, rec: dict[str, Any] | None,
        r: ExecResult, cmp: Comparison,
    ) -> _Judged:
        hidden = task.is_hidden(test.name)

        def out(v: Verdict, detail: str | None = None, t: float | None = None) -> TestOutcome:
            return TestOutcome(name=test.name, verdict=v, hidden=hidden, weight=test.weight,
                               time_s=t, detail=detail[:500] if detail else None)

        if rec is None:
            why = r.error if r.status is Status.SANDBOX_ERROR else f"run ended ({r.status.value})"
            return out(_missing_verdict(r), f"no result recorded: {why}"), None
        status = rec.get("status")
        detail = rec.get("detail") if isinstance(rec.get("detail"), str) else None
        t = rec.get("time") if isinstance(rec.get("time"), int | float) else None
        if status in _STATUS_TO_VERDICT:
            return out(_STATUS_TO_VERDICT[status], detail, t), None
        if isinstance(test, ScriptTest):
            if status == "passed":
                return out(Verdict.PASSED, None, t), None
            if status == "failed":
                return out(Verdict.WRONG_ANSWER, detail, t), None
            return out(Verdict.RUNTIME_ERROR, detail or str(status), t), None
        if status != "ok":
            return out(Verdict.RUNTIME_ERROR, detail or str(status), t), None
        if isinstance(test, CallTest):
            try:
                actual = decode(rec.get("value"))
            except ValueCodecError as e:
                return out(Verdict.RUNTIME_ERROR, f"malformed value: {e}", t), None
            ok = values_equal(decode(test.expected), actual, cmp.values,
                              rel_tol=cmp.rel_tol, abs_tol=cmp.abs_tol)
            return out(Verdict.PASSED if ok else Verdict.WRONG_ANSWER,
                       None if ok else f"returned {_short(actual)}", t), None
        stdout = rec.get("stdout")
        if not isinstance(stdout, str):
            return out(Verdict.RUNTIME_ERROR, "no output recorded", t), None
        if rec.get("truncated"):
            return out(Verdict.WRONG_ANSWER, "output longer than twice the expected output", t), None
        return _judge_output(test, stdout, cmp, out(Verdict.PASSED, None, t), task.checker)

    # -- other languages: a job graph, compile -> one run per stdin/stdout test ---------------

    async def _verify_per_test(
        self, task: Task, source: str, cmp: Comparison
    ) -> tuple[list[_Judged], dict[str, float], dict[str, ExecResult], str | None]:
        per_test = task.limits.time_s * self.time_scale
        limits = Limits(time_s=per_test, memory_mb=task.limits.memory_mb)
        tests = [t for t in task.tests if isinstance(t, IOTest)]
        graph = self._test_graph(task.language, source, tests, limits, task.environment,
                                 capped=task.checker is None)
        if task.checker is not None:
            # compile -> test i -> checker i: the checker gets the test's output as a file,
            # and runs only when the test ran ok.
            graph = Graph(nodes=(*graph.nodes, *(
                Node(id=_check_node(i), limits=self._checker_limits(task),
                     program=self._checker_program(task, t, None),
                     inputs=(Input(node=_test_node(i), stdout=True, to="output.txt"),))
                for i, t in enumerate(tests))))
        done = await self.graph(graph)
        compiled = done.nodes.get(_COMPILE_NODE)
        if compiled is not None and not compiled.ok:
            # Nothing ran: every test fails as the compile step did.
            failed = self._compile_failure(compiled, limits)
            return self._all_failed(task, tests, failed), {
                "sandbox_wall_s": round(failed.wall_time_s, 6)}, {}, failed.environment
        checked = {t.name: r for i, t in enumerate(tests)
                   if (r := done.nodes.get(_check_node(i), _NOT_RUN).result) is not None}
        runs: list[ExecResult] = []
        for i in range(len(tests)):
            node = done[_test_node(i)]
            runs.append(node.result if node.result is not None else ExecResult(
                status=node.cause or Status.SANDBOX_ERROR, error=node.reason))
        outcomes: list[_Judged] = []
        for t, r in zip(tests, runs, strict=True):
            hidden = task.is_hidden(t.name)

            def out(v: Verdict, detail: str | None = None, tm: float | None = None,
                    _t: IOTest = t, _h: bool = hidden) -> TestOutcome:
                return TestOutcome(name=_t.name, verdict=v, hidden=_h, weight=_t.weight,
                                   time_s=tm, detail=detail[:500] if detail else None)

            if r.status is Status.OK and r.stdout_truncated:
                # Beyond the cap (twice the expected output, see _output_cap) it cannot match.
                outcomes.append((out(Verdict.WRONG_ANSWER,
                                     "output longer than twice the expected output",
                                     r.wall_time_s), None))
            elif r.status is Status.OK:
                outcomes.append(_judge_output(t, r.stdout, cmp, out(Verdict.PASSED, None, r.wall_time_s),
                                              task.checker))
            elif r.status is Status.OUTPUT_LIMIT:
                outcomes.append((out(Verdict.WRONG_ANSWER, "output limit exceeded", r.wall_time_s),
                                 None))
            else:
                v = _missing_verdict(r)
                detail = r.error or (r.compile.stderr[-300:] if r.compile else r.stderr[-300:])
                outcomes.append((out(v, detail or r.status.value, r.wall_time_s), None))
        wall = sum(r.wall_time_s for r in runs)
        cpu = sum(r.cpu_time_s for r in runs)
        if compiled is not None and compiled.result is not None:
            wall += compiled.result.wall_time_s
            cpu += compiled.result.cpu_time_s
        env_id = next((r.environment for r in runs if r.environment), None)
        return outcomes, {"sandbox_wall_s": round(wall, 6), "sandbox_cpu_s": round(cpu, 6)}, \
            checked, env_id

    # -- java, go, rust, typescript function calls: compile the harness once, a run per test --

    async def _verify_calls(
        self, task: Task, source: str, cmp: Comparison
    ) -> tuple[list[_Judged], dict[str, float], str | None]:
        """``compile -> [call 1..n]``: the completion and a generated harness
        (reward/call_harness.py) compiled once; each test a run of the artifact with its index
        as argv, whose typed return value comes back on the result channel."""
        sig = task.signature
        assert sig is not None and task.entry_point is not None  # Task checks both
        tests = [t for t in task.tests if isinstance(t, CallTest)]
        harness = call_harness(task.language, source, task.entry_point, sig.params,
                               sig.returns, [t.args for t in tests])
        per_test = task.limits.time_s * self.time_scale
        limits = Limits(time_s=per_test, memory_mb=task.limits.memory_mb)
        spec = spec_for(task.language, limits=limits, sources=harness.sources)
        compile_node = Node(
            id=_COMPILE_NODE, limits=_compile_limits(limits),
            program=Program(language="bash", source=spec.compile_script(),
                            files={**harness.files, **spec.compile_files},
                            collect=[spec.binary], environment=task.environment))
        artifact = (Input(node=_COMPILE_NODE, file=spec.binary),)
        graph = Graph(nodes=(compile_node, *(
            Node(id=_test_node(i), inputs=artifact, limits=limits,
                 program=Program(language="bash", environment=task.environment,
                                 source=harness.run_prefix + spec_for(
                                     task.language, argv=(str(i),), limits=limits).run_script()))
            for i in range(len(tests)))))
        done = await self.graph(graph)
        compiled = done[_COMPILE_NODE]
        if not compiled.ok:
            failed = self._compile_failure(compiled, limits)
            return self._all_failed(task, tests, failed), {
                "sandbox_wall_s": round(failed.wall_time_s, 6)}, failed.environment
        outcomes: list[_Judged] = []
        wall = compiled.result.wall_time_s if compiled.result is not None else 0.0
        env_id: str | None = None
        for i, t in enumerate(tests):
            node = done[_test_node(i)]
            r = node.result if node.result is not None else ExecResult(
                status=node.cause or Status.SANDBOX_ERROR, error=node.reason)
            wall += r.wall_time_s
            env_id = env_id or r.environment
            outcomes.append((self._judge_call(task, t, r, cmp), None))
        return outcomes, {"sandbox_wall_s": round(wall, 6)}, env_id

    @staticmethod
    def _judge_call(task: Task, test: CallTest, r: ExecResult, cmp: Comparison) -> TestOutcome:
        def out(v: Verdict, detail: str | None = None) -> TestOutcome:
            return TestOutcome(name=test.name, verdict=v, hidden=task.is_hidden(test.name),
                               weight=test.weight, time_s=r.wall_time_s,
                               detail=detail[:500] if detail else None)

        if r.status is not Status.OK:
            v = (Verdict.RUNTIME_ERROR if r.status is Status.OUTPUT_LIMIT
                 else _missing_verdict(r))
            return out(v, r.error or r.stderr[-300:] or r.status.value)
        # The last record counts: the harness writes it after the call returned.
        value: Any = _NO_VALUE
        for line in (r.channel or b"").split(b"\n"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "value" in rec:
                value = rec["value"]
        if value is _NO_VALUE:
            return out(Verdict.RUNTIME_ERROR, "the call returned no value")
        try:
            actual = decode(value)
        except ValueCodecError as e:
            return out(Verdict.RUNTIME_ERROR, f"malformed value: {e}")
        ok = values_equal(decode(test.expected), actual, cmp.values, rel_tol=cmp.rel_tol,
                          abs_tol=cmp.abs_tol)
        return out(Verdict.PASSED) if ok else out(Verdict.WRONG_ANSWER,
                                                   f"returned {_short(actual)}")

    async def graph(self, graph: Graph) -> GraphResult:
        """Run a job graph: through the graph runner given (the engine's, which admits and
        journals it as one job), else node by node through ``run``."""
        if self.run_graph is not None:
            return await self.run_graph(graph)
        return await execute_graph(graph, self.run)

    @staticmethod
    def _test_graph(language: str, source: str, tests: Sequence[IOTest],
                    limits: Limits, environment: str | None = None, *,
                    capped: bool = False) -> Graph:
        """``compile -> [test 1..n]`` for a compiled language (compile once, then each test in
        its own fresh sandbox on a copy of the same artifact: a test cannot touch another's
        output, and the compiler runs once, not once per test); ``[test 1..n]`` otherwise.

        The compiler runs as a program of its own, within the compile limits that the test
        runs' limits derive (``Limits.compile_time_limit_s``/``compile_memory_limit_mb``).
        ``capped``: each test keeps only the stdout that could still match (``_output_cap``)."""
        spec = spec_for(language, limits=limits)

        def test_limits(t: IOTest) -> Limits:
            if not capped:
                return limits
            return limits.model_copy(update={"stdout_bytes": _output_cap(t)})

        if spec.compile is None:
            return Graph(nodes=tuple(
                Node(id=_test_node(i), program=Program(language=language, source=source,
                                                       stdin=t.stdin, environment=environment),
                     limits=test_limits(t))
                for i, t in enumerate(tests)))
        compile_node = Node(
            id=_COMPILE_NODE, limits=_compile_limits(limits),
            program=Program(language="bash", source=spec.compile_script(),
                            files={spec.main_file: source, **spec.compile_files},
                            collect=[spec.binary], environment=environment))
        artifact = (Input(node=_COMPILE_NODE, file=spec.binary),)
        run_script = spec.run_script()
        return Graph(nodes=(compile_node, *(
            Node(id=_test_node(i), inputs=artifact, limits=test_limits(t),
                 program=Program(language="bash", source=run_script, stdin=t.stdin,
                                 environment=environment))
            for i, t in enumerate(tests))))

    @staticmethod
    def _compile_failure(compiled: NodeResult, run: Limits) -> ExecResult:
        """The failed (or infrastructure-failed) compile run, as a compile_error result."""
        r = compiled.result
        assert r is not None
        if r.status is Status.SANDBOX_ERROR:
            return r
        r = with_compile_limit_note(r, run)
        return r.model_copy(update={"status": Status.COMPILE_ERROR,
                                    "stderr": r.stderr or "the compiler produced no program"})

    @staticmethod
    def _all_failed(task: Task, tests: Sequence[CallTest | IOTest], r: ExecResult) -> list[_Judged]:
        verdict = _missing_verdict(r)
        detail = (r.error or r.stderr[-300:] or r.status.value)[:500]
        return [(TestOutcome(name=t.name, verdict=verdict, hidden=task.is_hidden(t.name),
                             weight=t.weight, detail=detail), None) for t in tests]

    # -- checkers ---------------------------------------------------------------------------

    async def _apply_checker(self, task: Task, judged: list[_Judged],
                             checked: dict[str, ExecResult]) -> list[TestOutcome]:
        """Judge every output waiting for the task's checker: by the checker run the test's
        graph already made (``checked``, by test name), else in a graph of checker runs, each
        in its own sandbox."""
        checker = task.checker
        if checker is None:
            return [o for o, _ in judged]
        by_name = {t.name: t for t in task.tests if isinstance(t, IOTest)}
        pending = [(o, out) for o, out in judged if out is not None and o.name not in checked]
        if pending:
            done = await self.graph(Graph(nodes=tuple(
                Node(id=_check_node(k), limits=self._checker_limits(task),
                     program=self._checker_program(task, by_name[o.name], out))
                for k, (o, out) in enumerate(pending))))
            checked = dict(checked)
            for k, (o, _) in enumerate(pending):
                r = done[_check_node(k)].result
                assert r is not None  # no parents: every node runs
                checked[o.name] = r
        return [o if out is None else self._checker_verdict(o, checked[o.name])
                for o, out in judged]

    @staticmethod
    def _checker_limits(task: Task) -> Limits:
        return Limits(time_s=max(10.0, task.limits.time_s * 2), memory_mb=1024)

    @staticmethod
    def _checker_program(task: Task, test: IOTest, stdout: str | None) -> Program:
        """The task's checker on one test: argv ``input.txt output.txt answer.txt``
        (``output.txt`` comes from the test run's node when ``stdout`` is None)."""
        checker = task.checker
        assert checker is not None
        files: dict[str, str | bytes] = {"input.txt": test.stdin,
                                         "answer.txt": test.expected_stdout}
        if stdout is not None:
            files["output.txt"] = stdout
        return Program(language=checker.language, source=checker.source, files=files,
                       argv=["input.txt", "output.txt", "answer.txt"])

    @staticmethod
    def _checker_verdict(o: TestOutcome, r: ExecResult) -> TestOutcome:
        if r.status is Status.SANDBOX_ERROR:
            return o.model_copy(update={"verdict": Verdict.SANDBOX_ERROR,
                                        "detail": f"checker: {r.error}"})
        if r.status is Status.OK:
            return o
        # A checker that rejects, or fails on this output, does not accept it. Its failure is
        # recorded, never turned into a null reward that a completion could provoke.
        tail = (r.stdout or r.stderr)[-200:]
        why = f"checker: {r.status.value}, exit {r.exit_code}: {tail}"
        return o.model_copy(update={"verdict": Verdict.WRONG_ANSWER, "detail": why})


_COMPILE_NODE = "compile"
_NO_VALUE = object()




def _runs_directly(task: Task, max_tests: int) -> bool:
    """A Python task whose tests run as plain programs, one sandbox run each (no harness):
    stdin/stdout tests only, few of them, and no hash seed of its own (the harness re-executes
    the interpreter for that)."""
    return (task.test_kind == "stdio" and task.hash_seed is None
            and len(task.tests) <= max_tests
            and all(isinstance(t, IOTest) for t in task.tests))


def _output_cap(test: IOTest) -> int:
    """The stdout worth keeping for a stdin/stdout test: output beyond twice the expected
    length cannot match, and the cap keeps floods small. Leaks only the expected length, which
    decides nothing."""
    return min(max(4096, 2 * len(test.expected_stdout.encode()) + 1024), 4 << 20)


def _compile_limits(limits: Limits) -> Limits:
    """The compile run's limits, derived from the test runs' (``Limits.compile_*``)."""
    return Limits(
        time_s=limits.compile_time_limit_s, memory_mb=limits.compile_memory_limit_mb,
        max_processes=max(64, limits.max_processes),
        workdir_mb=limits.compile_workdir_limit_mb,
        workdir_inodes=limits.compile_workdir_inodes,
        stdout_bytes=limits.compile_output_mb << 20, stderr_bytes=1 << 16)


def _test_node(i: int) -> str:
    return f"test:{i}"


def _check_node(i: int) -> str:
    return f"check:{i}"


_NOT_RUN = NodeResult(id="", state=NodeState.CANCELLED)


# A judged test, and the program output still waiting for the task's checker (if any).
_Judged = tuple[TestOutcome, str | None]


def _judge_output(
    test: IOTest, stdout: str, cmp: Comparison, passed: TestOutcome, checker: Checker | None
) -> _Judged:
    if checker is not None:
        return passed, stdout
    if output_equal(test.expected_stdout, stdout, cmp.output, rel_tol=cmp.rel_tol,
                    abs_tol=cmp.abs_tol):
        return passed, None
    return passed.model_copy(update={"verdict": Verdict.WRONG_ANSWER,
                                     "detail": f"output {_short(stdout)}"}), None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


def task_set_hash(tasks: Sequence[Task]) -> str:
    """Hash of a task set's ids and versions."""
    return hashlib.sha256("\n".join(f"{t.id}@{t.version}" for t in tasks).encode()).hexdigest()[:16]
