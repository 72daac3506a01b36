"""Validate a task set: run every check on every task through the engine and the verifier.

All sandbox work goes through :func:`sandloop.reward.scoring.score_all` (the path ``sandloop
score`` uses) with a verifier per check whose configuration hash names the check and its
parameters, so every result lands in the result store under (task version, completion, check):
a re-run recomputes nothing unchanged. The checks batch all tasks at once so every slot is busy:

0. the determinism probes of ``sandloop env check`` in every environment the tasks run in,
   ``env_repeat`` rounds over the slots (nondeterministic: a probe that differs flags every task
   of that environment and the probe's language);
1. the reference, ``repeat`` times (flaky, reference_fails, slow_reference), the reference under
   each of ``hash_seeds`` (nondeterministic, the repeats counting as the default seed; where the
   seeds disagree, once more per seed), and
   the degenerate completions (trivial_pass);
2. mutants of the reference (weak_tests), only for tasks whose reference passed reliably, with a
   time limit scaled to the reference's own time (an infinite-loop mutant is killed early).

Duplicates and contamination are pure fingerprint comparisons (:mod:`.fingerprints`).
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from sandloop.curation.degenerate import degenerate_completions
from sandloop.curation.fingerprints import contamination, fingerprint, near_duplicates
from sandloop.curation.mutants import Mutant, generate_mutants
from sandloop.curation.problems import Problem, ProblemCode, Severity, TaskReport
from sandloop.envs.probes import PROBES, Probe, ProbeReport, check_determinism
from sandloop.errors import SandloopError
from sandloop.reward.assemble import assemble
from sandloop.reward.scoring import Completion, score_all
from sandloop.reward.verdicts import RewardConfig, Verdict
from sandloop.reward.verifier import CompletionResult, Runner, Verifier
from sandloop.sandbox.models import ExecResult, Limits, Program, Status
from sandloop.store import ResultStore
from sandloop.tasks import Task

__all__ = ["CHECKS_VERSION", "ValidateConfig", "seeded_runner", "validate_tasks"]

# Part of every check's store key: bump it when a check's meaning changes.
# 2: seeded runs keep site-packages (an environment's pinned packages import under every seed).
CHECKS_VERSION = "2"
_ALL_TESTS = RewardConfig(mode="binary", on="all")
# Mutant time limits are rounded up to one of these fractions of the task's own limit, so that
# tasks share a few verifier configurations (and store keys stay stable across runs).
_SCALES = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)


class ValidateConfig(BaseModel):
    """Thresholds and sizes of the checks (every one an option of ``sandloop tasks validate``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repeat: int = Field(5, ge=2, description="reference runs for the flaky check")
    # The range PYTHONHASHSEED accepts (and Task.hash_seed allows): a seed outside it would make
    # every seeded run die at interpreter start-up and look like a verdict.
    hash_seeds: tuple[Annotated[int, Field(ge=0, le=4294967295)], ...] = Field(
        (1, 2, 3), description="PYTHONHASHSEED values tried")
    env_repeat: int = Field(3, ge=1, description="rounds of the environment probes over the slots")
    max_mutants: int = Field(12, ge=0, description="mutants per task (0: no mutation testing)")
    min_mutants: int = Field(3, ge=1, description="fewer mutants than this: no weak_tests verdict")
    min_mutation_score: float = Field(0.6, ge=0, le=1)
    mutant_time_factor: float = Field(10.0, gt=0, description="mutant limit: x reference time")
    mutant_min_time_s: float = Field(0.25, gt=0)
    slow_fraction: float = Field(0.5, gt=0, le=1, description="of the task's time limit")
    shingle: int = Field(5, ge=1, description="prompt word shingle size (duplicates)")
    duplicate_threshold: float = Field(0.8, gt=0, le=1)
    same_solution_threshold: float = Field(0.3, ge=0, le=1)
    ngram: int = Field(13, ge=2, description="n of the contamination n-grams")
    contamination_overlap: float = Field(0.2, gt=0, le=1)
    severity: dict[ProblemCode, Severity] = Field(default_factory=dict)
    checks: frozenset[ProblemCode] = frozenset(ProblemCode)


class _CheckVerifier(Verifier):
    """A verifier whose results are stored apart per check (the salt is in the config hash)."""

    def __init__(self, run: Runner, salt: str, **kw: Any) -> None:
        super().__init__(run, reward=_ALL_TESTS, **kw)
        self.salt = salt

    def config_hash(self) -> str:
        blob = f"{super().config_hash()}|curation/{CHECKS_VERSION}|{self.salt}"
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_SEEDED = """\
import os, sys
# The hash seed is fixed when an interpreter starts, so the run re-executes the interpreter with
# PYTHONHASHSEED set; the result channel (fd 3) and stdin (the plan) carry over. -s, not -S:
# the program must see the site-packages an unseeded run sees, or an environment's packages
# fail to import under every seed and the verdicts differ from the default seed's for no reason.
os.set_inheritable(3, True)
_env = dict(os.environ, PYTHONHASHSEED="{seed}")
_main = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sl_seeded.py")
os.execve(sys.executable, [sys.executable, "-s", _main], _env)
"""


def seeded_runner(run: Runner, seed: int) -> Runner:
    """``run``, but a Python program runs in an interpreter started with ``PYTHONHASHSEED=seed``
    (the program moves to ``_sl_seeded.py`` next to a small launcher)."""

    async def go(program: Program, limits: Limits) -> ExecResult:
        if program.language != "python":
            return await run(program, limits)
        files = {**program.files, "_sl_seeded.py": program.source}
        seeded = Program(language="python", source=_SEEDED.format(seed=int(seed)),
                         stdin=program.stdin, files=files, argv=program.argv,
                         collect=program.collect)
        return await run(seeded, limits)

    return go


def _verdicts(r: CompletionResult) -> dict[str, str]:
    return {o.name: o.verdict.value for o in r.tests}


def _passed(r: CompletionResult) -> bool:
    return r.reward is not None and all(o.verdict is Verdict.PASSED for o in r.tests)


def _slowest(r: CompletionResult) -> float:
    return max((o.time_s or 0.0 for o in r.tests), default=0.0)


def _scale(task: Task, ref_time: float, cfg: ValidateConfig) -> float:
    want = max(cfg.mutant_min_time_s, cfg.mutant_time_factor * ref_time) / task.limits.time_s
    return next((s for s in _SCALES if s >= want), 1.0)


def _given_helpers(task: Task) -> frozenset[str]:
    """Functions the starter code defines in full, besides the entry point (HumanEval/50's
    ``encode_shift``): the tests call them too, so mutating them tests nothing of the answer."""
    try:
        tree = ast.parse(task.starter_code)
    except (SyntaxError, ValueError):
        return frozenset()
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef |
                     ast.AsyncFunctionDef) and n.name != task.entry_point)


class _Batch:
    """Groups completions by check configuration and scores each group through ``score_all``."""

    def __init__(self, run: Runner, store: ResultStore | None, concurrency: int,
                 on_result: Callable[[], None] | None) -> None:
        self.run = run
        self.store = store
        self.concurrency = concurrency
        self.on_result = on_result
        self.groups: dict[str, tuple[Verifier, list[Completion]]] = {}
        self.cached = 0
        self.runs = 0

    def add(self, salt: str, completion: Completion, *, seed: int | None = None,
            time_scale: float = 1.0) -> None:
        if salt not in self.groups:
            run = seeded_runner(self.run, seed) if seed is not None else self.run
            self.groups[salt] = (_CheckVerifier(run, salt, time_scale=time_scale), [])
        self.groups[salt][1].append(completion)

    async def score(self, tasks: Mapping[str, Task]) -> dict[str, list[CompletionResult]]:
        def done(_r: CompletionResult, cached: bool) -> None:
            if cached:
                self.cached += 1
            else:
                self.runs += 1
            if self.on_result:
                self.on_result()

        by_id = dict(tasks)
        salts = list(self.groups)
        results = await asyncio.gather(*(
            score_all(by_id, self.groups[s][1], self.groups[s][0], store=self.store,
                      concurrency=self.concurrency, on_result=done)
            for s in salts))
        return dict(zip(salts, results, strict=True))

    @property
    def size(self) -> int:
        return sum(len(c) for _, c in self.groups.values())


class _ProbeLost(Exception):
    """A probe run failed to run; the environment's check is skipped, not failed."""


_PROBE_LANGUAGES = frozenset(p.language for p in PROBES)


async def _check_environments(
        tasks: Sequence[Task], run: Runner, cfg: ValidateConfig, slots: int,
        environments: dict[str, list[str]],
        flag: Callable[[str, ProblemCode, str], None], skipped: dict[str, list[str]],
        on_phase: Callable[[str, int], None] | None) -> int:
    """Phase 0: ``env check``'s probes in each environment the tasks name (not cached: they
    check the environment as it is now). Returns the number of runs."""
    by_env: dict[str, list[Task]] = {}
    for t in tasks:
        if t.language in _PROBE_LANGUAGES:
            by_env.setdefault(t.environment or "", []).append(t)
    width = max(1, slots)
    if on_phase and by_env:
        on_phase("environment probes", len(by_env) * cfg.env_repeat * width * len(PROBES))
    for env, members in by_env.items():
        label = env or f"the built-in {'/'.join(sorted({t.language for t in members}))}"

        async def one(probe: Probe, env: str = env) -> tuple[str, str]:
            r = await run(Program(language=probe.language, source=probe.source,
                                  environment=env or None), Limits(time_s=10))
            if r.status is Status.SANDBOX_ERROR:  # lost, not an outcome of the environment
                raise _ProbeLost(r.error or "sandbox_error")
            return r.status.value, r.stdout + r.stderr + (r.error or "")

        try:
            reports = await check_determinism(one, repeat=cfg.env_repeat, width=width,
                                              concurrent=True)
        except (SandloopError, _ProbeLost) as e:
            for t in members:
                skipped[t.id].append(f"nondeterministic: the probes of {label} did not run: {e}")
            continue
        differ: list[ProbeReport] = [r for r in reports if not r.deterministic]
        environments[env] = [r.probe.name for r in differ]
        runs = cfg.env_repeat * width
        for t in members:
            mine = [r for r in differ if r.probe.language == t.language]
            if mine:
                flag(t.id, ProblemCode.NONDETERMINISTIC, f"{label} is not deterministic: " +
                     "; ".join(f"probe {r.probe.name} ({r.probe.pins}) gave {len(r.variants)} "
                               f"outcomes in {runs} runs" for r in mine[:3]) +
                     " (sandloop env check shows them)")
    return len(by_env) * cfg.env_repeat * width * len(PROBES)


class ValidationRun(BaseModel):
    """Reports in task order and how much work was done or reused."""

    model_config = ConfigDict(frozen=True)

    reports: list[TaskReport]
    runs: int
    cached: int
    mutants: int
    elapsed_s: float = 0.0
    # Environment (name or id; "" the languages' built-ins) -> its probes that gave more than
    # one outcome ([]: deterministic); absent when the nondeterministic check did not run.
    environments: dict[str, list[str]] = Field(default_factory=dict)
    probe_runs: int = 0


async def validate_tasks(
    tasks: Sequence[Task],
    run: Runner,
    *,
    config: ValidateConfig | None = None,
    against: Sequence[Task] = (),
    store: ResultStore | None = None,
    concurrency: int = 16,
    on_result: Callable[[], None] | None = None,
    on_phase: Callable[[str, int], None] | None = None,
    slots: int = 1,
) -> ValidationRun:
    """Run the configured checks on ``tasks`` (``against``: other sets for duplicates and
    contamination); ``run`` is a sandbox runner, e.g. ``engine.runner(client="curation")``,
    and ``slots`` how many slots it spreads over (each round of environment probes is that
    wide)."""
    cfg = config or ValidateConfig()
    want = cfg.checks
    by_id = {t.id: t for t in tasks}
    problems: dict[str, list[Problem]] = {t.id: [] for t in tasks}
    skipped: dict[str, list[str]] = {t.id: [] for t in tasks}
    extra: dict[str, dict[str, Any]] = {t.id: {} for t in tasks}

    def flag(tid: str, code: ProblemCode, detail: str) -> None:
        problems[tid].append(Problem.of(code, detail, cfg.severity))

    for t in tasks:
        if ProblemCode.NO_TESTS in want and not t.hidden_tests:
            flag(t.id, ProblemCode.NO_TESTS,
                 f"no hidden tests ({len(t.public_tests)} public): the reward can only use "
                 "tests the model may have seen")

    environments: dict[str, list[str]] = {}
    probe_runs = 0
    if ProblemCode.NONDETERMINISTIC in want:
        probe_runs = await _check_environments(tasks, run, cfg, slots, environments, flag,
                                               skipped, on_phase)

    # -- phase 1: references (repeats, seeds) and degenerate completions ------------------------
    ref_checks = want & {ProblemCode.REFERENCE_FAILS, ProblemCode.FLAKY,
                         ProblemCode.SLOW_REFERENCE, ProblemCode.WEAK_TESTS}
    batch = _Batch(run, store, concurrency, on_result)
    with_ref = [t for t in tasks if t.reference_solution is not None]
    for t in tasks:
        if t.reference_solution is None:
            skipped[t.id].append("reference checks: the task has no reference_solution")
    repeat = cfg.repeat if ref_checks else 1 if want & {ProblemCode.NONDETERMINISTIC} else 0
    for i in range(repeat):
        for t in with_ref:
            batch.add(f"repeat:{i}", Completion(task_id=t.id, completion=t.reference_solution or "",
                                                completion_id=f"reference:{i}"))
    if ProblemCode.NONDETERMINISTIC in want:
        for seed in cfg.hash_seeds:
            for t in with_ref:
                if t.language == "python":
                    batch.add(f"seed:{seed}:0", Completion(
                        task_id=t.id, completion=t.reference_solution or "",
                        completion_id=f"seed{seed}:0"), seed=seed)
        for t in tasks:
            if t.language != "python":
                skipped[t.id].append("nondeterministic: hash seeds apply to Python only")
    if ProblemCode.TRIVIAL_PASS in want:
        for t in tasks:
            degenerate = degenerate_completions(t)
            if not degenerate:
                skipped[t.id].append("trivial_pass: no entry-point signature to imitate")
            for d in degenerate:
                batch.add("trivial", Completion(task_id=t.id, completion=d.completion,
                                                completion_id=d.name))
    if on_phase:
        on_phase("references and degenerate completions", batch.size)
    phase1 = await batch.score(by_id)
    runs, cached = batch.runs, batch.cached

    def results_of(prefix: str) -> dict[str, list[CompletionResult]]:
        out: dict[str, list[CompletionResult]] = {}
        for salt, rs in phase1.items():
            if salt.startswith(prefix):
                for r in rs:
                    out.setdefault(r.task_id, []).append(r)
        return out

    repeats, seeded = results_of("repeat:"), results_of("seed:")
    trivial = results_of("trivial")
    # Where the seeds disagree, each seed runs once more: a verdict that also varies under one
    # seed is flaky, one that is stable per seed but differs across seeds depends on the seed.
    # The repeats ran under the default seed: when they agree they are one more seed, so seeds
    # that agree with each other but not with them (expected values recorded under the default
    # seed, wrong under every other) run again too.
    def _outcomes(rs: Sequence[CompletionResult]) -> set[str]:
        return {json.dumps(_verdicts(r), sort_keys=True) for r in rs if r.reward is not None}

    def _unsettled(t: Task) -> bool:
        under_seeds, under_default = _outcomes(seeded.get(t.id, [])), _outcomes(
            repeats.get(t.id, []))
        return len(under_seeds) > 1 or (len(under_default) == 1 and bool(under_seeds)
                                        and under_seeds != under_default)

    again = [t for t in with_ref if _unsettled(t)]
    if again:
        batch = _Batch(run, store, concurrency, on_result)
        for seed in cfg.hash_seeds:
            for t in again:
                batch.add(f"seed:{seed}:1", Completion(
                    task_id=t.id, completion=t.reference_solution or "",
                    completion_id=f"seed{seed}:1"), seed=seed)
        if on_phase:
            on_phase("hash seeds again", batch.size)
        for rs in (await batch.score(by_id)).values():
            for r in rs:
                seeded.setdefault(r.task_id, []).append(r)
        runs, cached = runs + batch.runs, cached + batch.cached
    reliable: dict[str, float] = {}  # task id -> reference's slowest test time (median)
    for t in with_ref:
        rs = [r for r in repeats.get(t.id, []) if r.reward is not None]
        if not rs:
            if repeat:
                skipped[t.id].append("reference checks: every reference run failed to run "
                                     "(sandbox_error)")
            continue
        per_run = [_verdicts(r) for r in rs]
        varying = sorted({n for v in per_run for n in v if len({p.get(n) for p in per_run}) > 1})
        by_seed: dict[str, list[dict[str, str]]] = {}
        for r in seeded.get(t.id, []):
            if r.reward is not None:
                by_seed.setdefault(r.completion_id.split(":")[0], []).append(_verdicts(r))
        within = sorted({n for runs_ in by_seed.values() for v in runs_ for n in v
                         if len({p.get(n) for p in runs_}) > 1})
        # Runs under identical conditions (same seed) that disagree: flaky. Otherwise verdicts
        # that differ across seeds: nondeterministic, which also explains repeats that disagree
        # (each slot's interpreter has a hash seed of its own).
        firsts = {s.removeprefix("seed"): v[0] for s, v in by_seed.items()}
        if by_seed and not varying:
            # The default seed's verdicts count as one seed's (they are stable): without them,
            # expected values that only hold under the default seed pass unnoticed when every
            # --hash-seed fails them alike.
            firsts = {"default": per_run[0], **firsts}
        by_hash = sorted({n for v in firsts.values() for n in v
                          if len({f.get(n) for f in firsts.values()}) > 1})
        flaky = sorted(set(within) | (set() if by_hash else set(varying)))
        if flaky and ProblemCode.FLAKY in want:
            flag(t.id, ProblemCode.FLAKY,
                 f"identical runs of the reference disagree on {len(flaky)} test(s): "
                 f"{', '.join(flaky[:5])} ({len(rs)} repeats, {len(by_seed)} seeds)")
        elif by_hash and ProblemCode.NONDETERMINISTIC in want:
            order = sorted(firsts, key=lambda s: (s != "default", int(s) if s.isdigit() else 0))
            detail = "; ".join(f"{n}: " + ", ".join(
                f"seed {s} {firsts[s].get(n)}" for s in order) for n in by_hash[:3])
            flag(t.id, ProblemCode.NONDETERMINISTIC,
                 f"the reference's verdicts depend on PYTHONHASHSEED: {detail}")
        # Failing in every run, seeded ones included (a test that passes under some seed is the
        # nondeterministic check's business).
        every = per_run + [v for runs_ in by_seed.values() for v in runs_]
        failing = sorted(n for n in per_run[0] if all(v.get(n) != "passed" for v in every))
        if failing and ProblemCode.REFERENCE_FAILS in want:
            details = {o.name: o.detail for o in rs[0].tests if o.name in failing}
            shown = "; ".join(f"{n} ({details.get(n) or rs[0].verdict.value})"
                              for n in failing[:5])
            flag(t.id, ProblemCode.REFERENCE_FAILS,
                 f"the reference fails {len(failing)} of {len(per_run[0])} tests: {shown}")
        ref_time = statistics.median(_slowest(r) for r in rs)
        extra[t.id]["reference_time_s"] = round(ref_time, 6)
        limit = t.limits.time_s
        if ProblemCode.SLOW_REFERENCE in want and ref_time > cfg.slow_fraction * limit:
            flag(t.id, ProblemCode.SLOW_REFERENCE,
                 f"the reference's slowest test takes {ref_time:.2f} s (median of {len(rs)}), "
                 f"over {cfg.slow_fraction:.0%} of the {limit:g} s limit")
        if not failing and not flaky and not by_hash:
            reliable[t.id] = ref_time
    for tid, rs in trivial.items():
        passing = [r.completion_id for r in rs if _passed(r)]
        if passing:
            flag(tid, ProblemCode.TRIVIAL_PASS,
                 f"degenerate completion(s) pass every test: {', '.join(passing)}")

    # -- phase 2: mutants ---------------------------------------------------------------------
    mutants: dict[str, list[Mutant]] = {}
    total_mutants = 0
    if ProblemCode.WEAK_TESTS in want and cfg.max_mutants:
        batch = _Batch(run, store, concurrency, on_result)
        for t in with_ref:
            if t.id not in reliable:
                skipped[t.id].append("weak_tests: the reference does not pass reliably")
                continue
            if t.language != "python":
                skipped[t.id].append("weak_tests: mutants are made of Python only")
                continue
            ms = generate_mutants(assemble(t, t.reference_solution or "").source,
                                  limit=cfg.max_mutants, module_level=t.test_kind == "stdio",
                                  skip=_given_helpers(t))
            mutants[t.id] = ms
            scale = _scale(t, reliable[t.id], cfg)
            for i, m in enumerate(ms):
                batch.add(f"mutants:{scale}", Completion(task_id=t.id, completion=m.source,
                                                         completion_id=f"mutant:{i}"),
                          time_scale=scale)
        total_mutants = batch.size
        if on_phase:
            on_phase("mutants", batch.size)
        phase2 = await batch.score(by_id)
        runs, cached = runs + batch.runs, cached + batch.cached
        outcome: dict[str, dict[str, CompletionResult]] = {}
        for rs in phase2.values():
            for r in rs:
                outcome.setdefault(r.task_id, {})[r.completion_id] = r
        for tid, ms in mutants.items():
            res = outcome.get(tid, {})
            judged = [(m, mr) for i, m in enumerate(ms)
                      if (mr := res.get(f"mutant:{i}")) is not None and mr.reward is not None]
            survivors = [m for m, r in judged if _passed(r)]
            killed = len(judged) - len(survivors)
            extra[tid].update(mutants=len(judged), mutants_killed=killed,
                              surviving_mutants=[m.description for m in survivors][:20])
            if len(judged) < cfg.min_mutants:
                skipped[tid].append(f"weak_tests: only {len(judged)} mutants")
                continue
            score = killed / len(judged)
            extra[tid]["mutation_score"] = round(score, 4)
            if score < cfg.min_mutation_score:
                flag(tid, ProblemCode.WEAK_TESTS,
                     f"the tests kill {killed} of {len(judged)} mutants ({score:.0%} < "
                     f"{cfg.min_mutation_score:.0%}); surviving: "
                     + "; ".join(m.description for m in survivors[:5]))

    # -- pure: duplicates and contamination ----------------------------------------------------
    if want & {ProblemCode.DUPLICATE, ProblemCode.CONTAMINATED}:
        others = [fingerprint(t) for t in against]
        mine = [fingerprint(t) for t in tasks]
        if ProblemCode.DUPLICATE in want:
            for dup in near_duplicates(others + mine, first_new=len(others), shingle=cfg.shingle,
                                     prompt_threshold=cfg.duplicate_threshold,
                                     same_solution_threshold=cfg.same_solution_threshold):
                # By position, not id: a task of the --against set may have the same id.
                where = " (in the --against set)" if dup.other_index < len(others) else ""
                flag(dup.id, ProblemCode.DUPLICATE,
                     f"near-duplicate of {dup.other}{where}: {dup.why}")
        if ProblemCode.CONTAMINATED in want:
            evals = [f for f, t in zip(mine, tasks, strict=True) if t.split == "eval"]
            trains = others + [f for f, t in zip(mine, tasks, strict=True) if t.split == "train"]
            for c in contamination(evals, trains, n=cfg.ngram, overlap=cfg.contamination_overlap):
                where = " (in the --against set)" if c.other_index < len(others) else ""
                flag(c.id, ProblemCode.CONTAMINATED,
                     f"eval task shares {c.why} with train task {c.other}{where}")

    reports = [
        TaskReport.build(
            id=t.id, version=t.version, problems=problems[t.id], skipped=skipped[t.id],
            time_limit_s=t.limits.time_s, difficulty=t.difficulty, split=t.split,
            tags=list(t.tags), **extra[t.id])
        for t in tasks
    ]
    return ValidationRun(reports=reports, runs=runs, cached=cached, mutants=total_mutants,
                         environments=environments, probe_runs=probe_runs)
