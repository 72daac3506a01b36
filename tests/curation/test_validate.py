"""``validate_tasks`` end to end: real sandboxed runs through the engine and the verifier, on the
bundled set with one planted defect per problem code, and a real SQLite result store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sandloop.curation.problems import ProblemCode
from sandloop.curation.validate import ValidateConfig, ValidationRun, seeded_runner, validate_tasks
from sandloop.engine import Engine
from sandloop.sandbox.models import Limits, Program
from sandloop.store import ResultStore
from sandloop.tasks import Task, load_tasks

DEMO = Path(str(resources.files("sandloop.data").joinpath("curation_demo.jsonl")))

# The planted defect of each task of the bundled set; the others are clean.
PLANTED = {
    "demo/no_hidden": ProblemCode.NO_TESTS,
    "demo/bad_reference": ProblemCode.REFERENCE_FAILS,
    "demo/flaky": ProblemCode.FLAKY,
    "demo/all_true": ProblemCode.TRIVIAL_PASS,
    "demo/weak": ProblemCode.WEAK_TESTS,
    "demo/slow": ProblemCode.SLOW_REFERENCE,
    "demo/add_copy": ProblemCode.DUPLICATE,
    "demo/vowel_positions": ProblemCode.CONTAMINATED,
    "demo/set_order": ProblemCode.NONDETERMINISTIC,
}
CLEAN = {"demo/add", "demo/clip", "demo/sum_io", "demo/vowels"}

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[Engine]:
    async with Engine(max_attempts=1) as e:
        yield e


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def demo_run(engine: Engine, tmp_path_factory: pytest.TempPathFactory
                   ) -> tuple[ValidationRun, ValidationRun]:
    db = tmp_path_factory.mktemp("store") / "results.db"
    tasks = load_tasks(DEMO)
    with ResultStore(db) as store:
        first = await validate_tasks(tasks, engine.runner(client="test"), store=store)
    with ResultStore(db) as store:
        again = await validate_tasks(tasks, engine.runner(client="test"), store=store)
    return first, again


async def test_the_set_covers_all_nine_codes() -> None:
    ids = {t.id for t in load_tasks(DEMO)}
    assert set(PLANTED.values()) == set(ProblemCode)
    assert set(PLANTED) | CLEAN == ids


async def test_each_planted_defect_is_flagged_and_clean_tasks_are_kept(
        demo_run: tuple[ValidationRun, ValidationRun]) -> None:
    reports = {r.id: r for r in demo_run[0].reports}
    for tid, code in PLANTED.items():
        # Exactly the planted defect: a check that also fires on other tasks' defects (a flaky
        # reference reported as failing, a seed-dependent one as flaky) is a wrong diagnosis.
        assert reports[tid].codes == {code.value}, (tid, reports[tid])
        assert reports[tid].verdict != "keep"
    for tid in CLEAN:
        assert reports[tid].verdict == "keep", reports[tid]
        assert reports[tid].problems == []
    # Named evidence in the details.
    assert "h2" in next(p.detail for p in reports["demo/bad_reference"].problems)
    assert "return_true" in next(p.detail for p in reports["demo/all_true"].problems)
    assert "demo/add" in next(p.detail for p in reports["demo/add_copy"].problems)
    assert "demo/vowels" in next(p.detail for p in reports["demo/vowel_positions"].problems)
    weak = reports["demo/weak"]
    assert weak.verdict == "review" and weak.mutation_score is not None
    assert weak.mutation_score < 0.6 and weak.surviving_mutants
    assert reports["demo/add"].mutants >= 3 and reports["demo/add"].mutation_score == 1.0


async def test_a_rerun_recomputes_nothing(demo_run: tuple[ValidationRun, ValidationRun]) -> None:
    first, again = demo_run
    assert first.runs > 100 and first.cached == 0
    assert again.runs == 0 and again.cached == first.runs
    strip = [r.model_dump(exclude={"reference_time_s"}) for r in first.reports]
    # Same verdicts and problems from stored results (flaky details name the tests that varied).
    assert [(r["id"], r["verdict"]) for r in strip] == [
        (r.id, r.verdict) for r in again.reports]


async def test_seeded_runner_fixes_the_hash_seed(engine: Engine) -> None:
    prog = Program(source="print(hash('sandloop'))")
    outs = set()
    for _ in range(2):
        r = await seeded_runner(engine.runner(), 7)(prog, Limits(time_s=10))
        outs.add(r.stdout)
    other = await seeded_runner(engine.runner(), 8)(prog, Limits(time_s=10))
    assert len(outs) == 1 and other.stdout not in outs


async def test_against_set_flags_copies_and_contamination(engine: Engine) -> None:
    tasks = {t.id: t for t in load_tasks(DEMO)}
    mine = [tasks["demo/add_copy"], tasks["demo/vowel_positions"]]
    against = [tasks["demo/add"], tasks["demo/vowels"]]
    only = frozenset({ProblemCode.DUPLICATE, ProblemCode.CONTAMINATED})
    res = await validate_tasks(mine, engine.runner(), against=against,
                               config=ValidateConfig(checks=only))
    codes = {r.id: r.codes for r in res.reports}
    assert codes == {"demo/add_copy": {"duplicate"}, "demo/vowel_positions": {"contaminated"}}
    assert res.runs == 0  # pure checks only


async def test_stdio_and_no_reference_tasks(engine: Engine) -> None:
    t = Task.model_validate({"id": "x", "test_kind": "stdio", "prompt": "print the input",
                             "hidden_tests": [{"kind": "io", "name": "a", "stdin": "",
                                               "expected_stdout": ""}]})
    res = await validate_tasks([t], engine.runner())
    r = res.reports[0]
    # An empty expected output: printing nothing passes it.
    assert r.codes == {"trivial_pass"}
    assert any("no reference_solution" in s for s in r.skipped)


async def test_probes_that_differ_flag_the_environments_tasks_injected_hash_seeds(
        engine: Engine) -> None:
    """Fault injected: each probe run gets a hash seed of its own, as slots whose interpreters
    are not pinned would; the honest runner's probes agree and flag nothing."""
    from itertools import count

    from sandloop.envs.probes import PROBES

    python_probes = {p.source for p in PROBES if p.language == "python"}
    seeds = count(1)
    honest = engine.runner(client="test")

    async def unpinned(program: Program, limits: Limits) -> Any:
        if program.source in python_probes:
            return await seeded_runner(honest, next(seeds))(program, limits)
        return await honest(program, limits)

    tasks = [t for t in load_tasks(DEMO) if t.id in ("demo/add", "demo/sum_io")]
    cfg = ValidateConfig(checks=frozenset({ProblemCode.NONDETERMINISTIC}), env_repeat=2)
    bad = await validate_tasks(tasks, unpinned, config=cfg, slots=2)
    assert {"set_order", "str_hash"} <= set(bad.environments[""])
    assert "shell_python" not in bad.environments[""]  # bash probes ran honestly
    assert bad.probe_runs == 2 * 2 * len(PROBES)
    for r in bad.reports:
        assert r.codes == {"nondeterministic"}, r
        assert "probe set_order" in r.problems[0].detail
    good = await validate_tasks(tasks, honest, config=cfg, slots=2)
    assert good.environments == {"": []}
    assert all(r.problems == [] for r in good.reports), good.reports


def _uniq(id: str, **kw: Any) -> Task:
    # Expected values recorded by running the reference once under the default hash seed (0).
    return Task.model_validate({
        "id": id, "prompt": "Give back the unique strings of the words list.",
        "entry_point": "uniq",
        "reference_solution": "def uniq(words):\n    return list(set(words))\n",
        "hidden_tests": [
            {"kind": "call", "name": "h1", "args": [["apple", "banana", "cherry", "date", "elder",
                                                     "fig"]],
             "expected": ["banana", "apple", "cherry", "fig", "date", "elder"]},
            {"kind": "call", "name": "h2", "args": [["a"]], "expected": ["a"]}], **kw})


async def test_expected_values_of_the_default_seed_only_are_nondeterministic(
        engine: Engine) -> None:
    """Every --hash-seed fails h1 alike, so the seeds agree with each other: only the repeats
    (default seed) tell that the expected value depends on the seed. Pinned to seed 0, the same
    task is deterministic."""
    cfg = ValidateConfig(repeat=2, max_mutants=0, checks=frozenset({
        ProblemCode.NONDETERMINISTIC, ProblemCode.FLAKY, ProblemCode.REFERENCE_FAILS}))
    res = await validate_tasks([_uniq("unpinned"), _uniq("pinned", hash_seed=0)],
                               engine.runner(client="test"), config=cfg)
    unpinned, pinned = res.reports
    assert unpinned.codes == {"nondeterministic"}, unpinned
    assert ("h1: seed default passed, seed 1 wrong_answer, seed 2 wrong_answer, "
            "seed 3 wrong_answer") in unpinned.problems[0].detail
    assert pinned.problems == [], pinned


async def test_return_1_is_a_degenerate_completion(engine: Engine) -> None:
    t = Task.model_validate({
        "id": "ones", "prompt": "Count the truthy elements of xs.", "entry_point": "count",
        "reference_solution": "def count(xs):\n    return sum(1 for x in xs if x)\n",
        "hidden_tests": [{"kind": "call", "name": f"h{i}", "args": [xs], "expected": 1}
                         for i, xs in enumerate([[1], [0, 2], [None, "a", ""]])]})
    res = await validate_tasks([t], engine.runner(client="test"),
                               config=ValidateConfig(checks=frozenset({ProblemCode.TRIVIAL_PASS})))
    assert res.reports[0].codes == {"trivial_pass"}
    assert "return_1" in res.reports[0].problems[0].detail


async def test_a_set_validated_against_itself_is_all_copies(engine: Engine) -> None:
    tasks = load_tasks(DEMO)
    only = frozenset({ProblemCode.DUPLICATE, ProblemCode.CONTAMINATED})
    res = await validate_tasks(tasks, engine.runner(), against=load_tasks(DEMO),
                               config=ValidateConfig(checks=only))
    for t, r in zip(tasks, res.reports, strict=True):
        dup = [p.detail for p in r.problems if p.code == "duplicate"]
        assert len(dup) == 1 and "(in the --against set)" in dup[0], r
        if t.split == "eval":
            assert "contaminated" in r.codes, r
            assert all("(in the --against set)" in p.detail for p in r.problems), r
    # Without --against no task is its own duplicate.
    alone = await validate_tasks(tasks, engine.runner(), config=ValidateConfig(checks=only))
    assert {r.id for r in alone.reports if r.codes} == {"demo/add_copy", "demo/vowel_positions"}


async def test_seeded_runs_see_the_site_packages_unseeded_runs_see(engine: Engine) -> None:
    prog = Program(source="import sys\nprint('\\n'.join(sys.path))")
    plain = await engine.runner()(prog, Limits(time_s=10))
    seeded = await seeded_runner(engine.runner(), 3)(prog, Limits(time_s=10))
    site = [p for p in plain.stdout.split() if p.endswith("site-packages")]
    assert site and set(site) <= set(seeded.stdout.split()), (plain.stdout, seeded.stdout)


async def test_hash_seed_out_of_range_is_bad_input() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    for seed in ("4294967296", "-1"):
        r = subprocess.run([sys.executable, "-m", "sandloop", "tasks", "validate", str(DEMO),
                            "--no-db", f"--hash-seed={seed}"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2, (seed, r.stdout, r.stderr)
        assert "hash_seeds" in r.stderr and r.stdout == ""
