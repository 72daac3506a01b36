"""``sandloop tasks``: look at, validate, curate, grade, split and diff task sets.

Registered by cli/main.py. Heavy modules (engine, curation) are imported inside the commands so
that ``sandloop --help`` stays fast.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sandloop.cli.exits import ExitCode, print_error
from sandloop.cli.options import check_out_path

if TYPE_CHECKING:
    from sandloop.curation.difficulty import Difficulty
    from sandloop.curation.validate import ValidationRun
    from sandloop.tasks import Task

app = typer.Typer(help="Task governance: inspect, validate, curate, grade, split and diff task "
                       "sets.", no_args_is_help=True, add_completion=False)
# Task data and paths reach these consoles escaped (rich.markup.escape) or as Text; without
# emoji codes too, so a prompt's ":smile:" is printed as written.
err = Console(stderr=True, emoji=False)


def _console() -> Console:
    return Console(emoji=False)


DEMO_SET = "curation_demo.jsonl"
# The sets this CLI bundles itself, besides the loader's (BUILTIN_SETS) and the repository sets.
CLI_SETS = {"curation-demo": DEMO_SET}

TasksArg = Annotated[str, typer.Argument(
    help="Task set: a JSONL/Parquet file in any supported format, 'humaneval', "
         "'curation-demo' (the bundled set with planted defects), or for validate a "
         "repository set ('repo-demo', kind 'repo').")]
Format = Annotated[str | None, typer.Option(
    "--format", help="native|humaneval|mbpp|codecontests|apps|taco|stdio|... (default: detect).")]
Grades = Annotated[Path | None, typer.Option(
    "--grades", help="Difficulty grades from `sandloop tasks grade` (default: TASKS.grades.json "
                     "when it exists).")]


class _BadInput(Exception):
    """Input the user must fix; exit code 2."""


def _resolve(tasks: str) -> str:
    if tasks in CLI_SETS:
        from importlib import resources

        return str(resources.files("sandloop.data").joinpath(CLI_SETS[tasks]))
    return tasks


def _load(tasks: str, fmt: str | None) -> list[Task]:
    from sandloop.tasks import TaskFormatError, load_tasks
    from sandloop.tasks.loaders import BUILTIN_SETS
    from sandloop.tasks.repo import REPO_BUILTIN_SETS

    source = _resolve(tasks)
    # The loader knows only its own built-in names; this CLI also takes CLI_SETS and, in
    # validate, the repository sets, so it names them all itself.
    if tasks in REPO_BUILTIN_SETS:
        raise _BadInput(f"{tasks}: a repository set; only `sandloop tasks validate` takes it, "
                        "as its TASKS")
    if source not in BUILTIN_SETS and not Path(source).exists():
        raise _BadInput(f"{tasks}: no such file, and not a built-in set ("
                        + ", ".join((*BUILTIN_SETS, *CLI_SETS)) + "; for validate also "
                        + ", ".join(REPO_BUILTIN_SETS) + ")")
    try:
        return load_tasks(source, fmt)
    except TaskFormatError as e:
        raise _BadInput(str(e)) from None


_SET_SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet", ".gz")


def _sidecar(path: Path, kind: str) -> Path:
    """``NAME.jsonl`` -> ``NAME.KIND.json``. Only the file type's suffix goes, not everything
    after the first dot: mbpp.train.jsonl and mbpp.eval.jsonl must not share one file."""
    name = path.name
    for suffix in _SET_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return path.with_name(f"{name}.{kind}.json")


def _grades_path(tasks: str) -> Path | None:
    """The grades file next to a task file (None for a name no file has: the loader says why)."""
    p = Path(_resolve(tasks))
    if not p.name:
        return None
    return _sidecar(p, "grades")


def _out_path(path: Path) -> Path:
    """``path`` checked writable before any work (as ``--out`` is), a problem being bad input."""
    try:
        checked = check_out_path(path)
    except typer.BadParameter as e:
        raise _BadInput(e.message) from None
    assert checked is not None
    return checked


def _load_grades(tasks: str, path: Path | None) -> dict[str, Difficulty] | None:
    from sandloop.curation.difficulty import Difficulty

    p = path or _grades_path(tasks)
    if p is None or not p.is_file():
        if path is not None:
            raise _BadInput(f"{path}: no such grades file; make one with `sandloop tasks grade`")
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        return {k: Difficulty.model_validate(v) for k, v in data["tasks"].items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _BadInput(f"{p}: not a grades file ({e}); remake it with `sandloop tasks grade`"
                        ) from None


def _run(fn: Any) -> None:
    """Call ``fn()``; turn _BadInput into exit code 2 with its message."""
    try:
        code = fn()
    except _BadInput as e:
        print_error(e)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    raise typer.Exit(code or 0)


def _write_jsonl(path: Path, lines: Sequence[str]) -> None:
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- looking at a set -----------------------------------------------------------------------------

@app.command("ls")
def ls(tasks: TasksArg, format: Format = None,
       long: Annotated[bool, typer.Option("--long", "-l", help="Split, language, tests, tags.")]
       = False) -> None:
    """List the task ids (one per line)."""
    def go() -> int:
        for t in _load(tasks, format):
            if long:
                print(f"{t.id}\t{t.split}\t{t.language}\t{t.test_kind}\t"
                      f"{len(t.public_tests)}+{len(t.hidden_tests)} tests\t{','.join(t.tags)}")
            else:
                print(t.id)
        return 0
    _run(go)


@app.command("show")
def show(tasks: TasksArg, task_id: Annotated[str, typer.Argument(help="The task's id.")],
         format: Format = None,
         as_json: Annotated[bool, typer.Option("--json", help="The task's native JSON.")] = False
         ) -> None:
    """Show one task: prompt, reference, tests, limits."""
    def go() -> int:
        by_id = {t.id: t for t in _load(tasks, format)}
        if task_id not in by_id:
            raise _BadInput(f"no task {task_id!r} in {tasks}; list ids with `sandloop tasks ls`")
        t = by_id[task_id]
        if as_json:
            print(t.to_json())
            return 0
        from rich.panel import Panel
        from rich.syntax import Syntax

        out = _console()
        out.print(Text.assemble(
            (t.id, "bold"), f"  version {t.version}  {t.language}/{t.test_kind}  split "
            f"{t.split}  limit {t.limits.time_s:g} s, {t.limits.memory_mb} MiB  tags "
            f"{', '.join(t.tags) or '-'}  source {t.source or '-'}"))
        out.print(Panel(Text(t.prompt or t.starter_code or "(empty)"), title="prompt"))
        if t.reference_solution is not None:
            out.print(Panel(Syntax(t.reference_solution, t.language if t.language != "cpp"
                                   else "cpp"), title="reference solution"))
        table = Table(title="tests")
        for col in ("name", "visibility", "kind", "test"):
            table.add_column(col)
        for test in t.tests:
            d = test.model_dump(mode="json", exclude={"name", "kind", "weight"})
            text = json.dumps(d, ensure_ascii=False)
            table.add_row(Text(test.name), "hidden" if t.is_hidden(test.name) else "public",
                          test.kind, Text(text if len(text) < 200 else text[:197] + "..."))
        out.print(table)
        return 0
    _run(go)


@app.command("stats")
def stats(tasks: TasksArg, format: Format = None, grades: Grades = None,
          as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False
          ) -> None:
    """The set's make-up: splits, tiers, tags, languages, test counts."""
    def go() -> int:
        from sandloop.curation.sets import make_up, set_version

        ts = _load(tasks, format)
        data = {"set_version": set_version(ts), **make_up(ts, _load_grades(tasks, grades))}
        if as_json:
            print(json.dumps(data))
            return 0
        out = _console()
        table = Table(title=Text(f"{tasks}: {len(ts)} tasks, version {data['set_version']}"),
                      show_header=False)
        for key in ("split", "tier", "language", "test_kind", "tag"):
            counts: dict[str, int] = data[key]
            table.add_row(key, Text(", ".join(f"{k} {v}" for k, v in list(counts.items())[:20])
                                    or "-"))
        table.add_row("with reference", str(data["with_reference"]))
        for key in ("hidden_tests", "public_tests"):
            d = data[key]
            table.add_row(key.replace("_", " "), f"min {d['min']}, median {d['median']}, max "
                          f"{d['max']}, total {d['total']}" if d else "-")
        out.print(table)
        return 0
    _run(go)


# -- validation -----------------------------------------------------------------------------------

def _validate(task_list: list[Task], against: Sequence[Task], cfg: Any, db: Path | None,
              no_db: bool, slots: int | None, no_isolation: bool) -> ValidationRun:
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sandloop import _aio as aio
    from sandloop.cli.store_open import open_result_store
    from sandloop.curation.validate import validate_tasks
    from sandloop.engine import Engine
    from sandloop.store import StoreError

    try:
        store = open_result_store(db, no_db)
    except StoreError as e:
        raise _BadInput(str(e)) from None
    started = time.perf_counter()

    async def run() -> ValidationRun:
        async with Engine(slots=slots, isolation="none" if no_isolation else "full",
                          max_attempts=1) as engine:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=err, disable=not sys.stderr.isatty(),
                          transient=True) as bar:
                job = bar.add_task("validating", total=0)

                def phase(name: str, n: int) -> None:
                    bar.update(job, description=name, total=n, completed=0)

                return await validate_tasks(
                    task_list, engine.runner(priority="background", client="curation"),
                    config=cfg, against=against, store=store,
                    concurrency=4 * engine.backend.slots,
                    on_result=lambda: bar.advance(job), on_phase=phase,
                    slots=engine.backend.slots)

    try:
        result = aio.run(run())
    finally:
        if store is not None:
            store.close()
    return result.model_copy(update={"elapsed_s": round(time.perf_counter() - started, 3)})


def _validate_repo(tasks: str, against: Sequence[str] | None, check: Sequence[str] | None,
                   slots: int | None, no_isolation: bool) -> ValidationRun:
    from sandloop.cli.repo_validate import run_repo_validation
    from sandloop.tasks import TaskFormatError

    if against or check:
        raise _BadInput("--against and --check apply to code tasks; a repository set is "
                        "checked by running its gold patch and the empty patch")
    try:
        return run_repo_validation(tasks, slots, no_isolation)
    except TaskFormatError as e:
        raise _BadInput(str(e)) from None


def _print_validation(res: ValidationRun, title: str) -> None:
    out = _console()
    table = Table(title=Text(title))
    for col in ("task", "verdict", "problems", "mutation score"):
        table.add_column(col)
    colour = {"keep": "green", "review": "yellow", "reject": "red"}
    for r in res.reports:
        if r.verdict == "keep":
            continue
        table.add_row(Text(r.id), Text(r.verdict, style=colour[r.verdict]),
                      Text("\n".join(f"{p.code.value}: {p.detail}" for p in r.problems)),
                      "-" if r.mutation_score is None else f"{r.mutation_score:.2f}")
    if table.row_count:
        out.print(table)
    verdicts = Counter(r.verdict for r in res.reports)
    codes = Counter(p.code.value for r in res.reports for p in r.problems)
    out.print(f"[bold]{len(res.reports)} tasks[/]: keep {verdicts['keep']}, review "
              f"{verdicts['review']}, reject {verdicts['reject']}")
    out.print("problems: " + (", ".join(f"{c} {n}" for c, n in codes.most_common()) or "none"))
    for env, differ in res.environments.items():
        name = escape(env or "built-in environments")
        out.print(f"{name}: " + (f"[red]probes differ[/]: {escape(', '.join(differ))}" if differ
                                 else "determinism probes agree"))
    out.print(f"{res.runs} sandbox runs (+{res.probe_runs} probe runs), {res.cached} results "
              f"reused from the store, {res.mutants} mutants, {res.elapsed_s:.1f} s")


def _severity(specs: Sequence[str] | None) -> dict[str, str]:
    """``CODE=reject|review`` pairs, checked (an unknown code or level is bad input)."""
    from sandloop.curation.problems import ProblemCode

    out: dict[str, str] = {}
    for spec in specs or ():
        code, sep, level = spec.partition("=")
        if not sep or level not in ("reject", "review"):
            raise _BadInput(f"--severity {spec!r}: expected CODE=reject or CODE=review")
        try:
            out[ProblemCode(code).value] = level
        except ValueError:
            raise _BadInput(f"--severity {spec!r}: unknown problem code {code!r}; codes: "
                            + ", ".join(c.value for c in ProblemCode)) from None
    return out


def _config(*, hash_seeds: list[int] | None, checks: list[str] | None,
            severity: list[str] | None, **thresholds: Any) -> Any:
    """A ValidateConfig from the command's options (``thresholds``: its field names)."""
    from pydantic import ValidationError

    from sandloop.curation.problems import ProblemCode
    from sandloop.curation.validate import ValidateConfig

    try:
        chosen = frozenset(ProblemCode(c) for c in checks) if checks else frozenset(ProblemCode)
    except ValueError as e:
        raise _BadInput(f"--check: {e}; codes: "
                        + ", ".join(c.value for c in ProblemCode)) from None
    try:
        return ValidateConfig(hash_seeds=tuple(hash_seeds or (1, 2, 3)), checks=chosen,
                              severity=_severity(severity), **thresholds)
    except (ValidationError, ValueError) as e:
        raise _BadInput(f"invalid validation options: {e}") from None


Against = Annotated[list[str] | None, typer.Option(
    "--against", help="Another task set: duplicates of it and eval tasks sharing n-grams with it "
                      "are flagged (repeatable).")]
Repeat = Annotated[int, typer.Option("--repeat", help="Reference runs for the flaky check.")]
EnvRepeat = Annotated[int, typer.Option(
    "--env-repeat", help="Rounds of `sandloop env check`'s probes over the slots, in each "
                         "environment the tasks use (nondeterministic).")]
MaxMutants = Annotated[int, typer.Option("--max-mutants", help="Mutants per task (0: none).")]
MinScore = Annotated[float, typer.Option("--min-mutation-score",
                                         help="weak_tests below this share of mutants killed.")]
SlowFraction = Annotated[float, typer.Option(
    "--slow-fraction", help="slow_reference above this share of the time limit.")]
DupThreshold = Annotated[float, typer.Option(
    "--duplicate-threshold", help="Prompt shingle Jaccard similarity for `duplicate`.")]
Ngram = Annotated[int, typer.Option("--ngram", help="n of the contamination n-grams.")]
Overlap = Annotated[float, typer.Option(
    "--contamination-overlap", help="Share of an eval task's n-grams found in one train task.")]
Seeds = Annotated[list[int] | None, typer.Option(
    "--hash-seed", help="PYTHONHASHSEED values for `nondeterministic` (repeatable; default 1 2 3).")]
Checks = Annotated[list[str] | None, typer.Option(
    "--check", help="Run only these problem codes' checks (repeatable; default: all).")]
SeverityOpt = Annotated[list[str] | None, typer.Option(
    "--severity", help="Override a code's severity: CODE=reject or CODE=review (repeatable).")]
MinMutants = Annotated[int, typer.Option(
    "--min-mutants", help="Fewer mutants than this: no weak_tests verdict.")]
MutantTimeFactor = Annotated[float, typer.Option(
    "--mutant-time-factor", help="A mutant's time limit: this x the reference's slowest test.")]
MutantMinTime = Annotated[float, typer.Option(
    "--mutant-min-time", help="A mutant's time limit is at least this many seconds.")]
Shingle = Annotated[int, typer.Option(
    "--shingle", help="Prompt word shingle size for `duplicate`.")]
SameSolution = Annotated[float, typer.Option(
    "--same-solution-threshold",
    help="Prompt similarity from which an identical canonical solution is a `duplicate`.")]
Db = Annotated[Path | None, typer.Option(
    "--db", help="Result store; default $SANDLOOP_DB or ~/.cache/sandloop/results.db.")]
NoDb = Annotated[bool, typer.Option("--no-db", help="Neither read nor write the result store.")]
Slots = Annotated[int | None, typer.Option("--slots", min=1, max=4096,
                                           help="Parallel slots; default: cores.")]
NoIsolation = Annotated[bool, typer.Option(
    "--no-isolation", help="Explicit opt-out: run WITHOUT isolation (trusted code only).")]


@app.command("validate")
def validate(
    tasks: TasksArg,
    against: Against = None,
    repeat: Repeat = 5,
    env_repeat: EnvRepeat = 3,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per task.")] = False,
    report: Annotated[Path | None, typer.Option(
        "--report", callback=check_out_path, dir_okay=False,
        help="Write an HTML quality report (checked writable first).")] = None,
    exit_zero: Annotated[bool, typer.Option(
        "--exit-zero", help="Exit 0 even when tasks are rejected (demos, dashboards).")] = False,
    format: Format = None,
    max_mutants: MaxMutants = 12,
    min_mutation_score: MinScore = 0.6,
    slow_fraction: SlowFraction = 0.5,
    duplicate_threshold: DupThreshold = 0.8,
    ngram: Ngram = 13,
    contamination_overlap: Overlap = 0.2,
    hash_seed: Seeds = None,
    check: Checks = None,
    severity: SeverityOpt = None,
    min_mutants: MinMutants = 3,
    mutant_time_factor: MutantTimeFactor = 10.0,
    mutant_min_time: MutantMinTime = 0.25,
    shingle: Shingle = 5,
    same_solution_threshold: SameSolution = 0.3,
    grades: Grades = None,
    db: Db = None,
    no_db: NoDb = False,
    slots: Slots = None,
    no_isolation: NoIsolation = False,
) -> None:
    """Check every task (reference, flakiness, degenerate answers, mutation testing, slow
    reference, duplicates, contamination, hash-seed dependence): keep, review or reject.
    Repository sets (repo-demo, kind 'repo'): the gold patch must make every fail-to-pass test
    pass and keep every pass-to-pass one; the empty patch must fail a fail-to-pass test.

    Exit 0 when nothing is rejected, 1 otherwise, 2 on bad input.
    """
    def go() -> int:
        from sandloop.cli.repo_validate import is_repo_set

        graded = _load_grades(tasks, grades)  # before the run: a bad grades file fails fast
        if is_repo_set(_resolve(tasks)):
            res = _validate_repo(tasks, against, check, slots, no_isolation)
        else:
            cfg = _config(
                hash_seeds=hash_seed, checks=check, severity=severity, repeat=repeat, env_repeat=env_repeat,
                max_mutants=max_mutants, min_mutants=min_mutants,
                min_mutation_score=min_mutation_score, mutant_time_factor=mutant_time_factor,
                mutant_min_time_s=mutant_min_time, slow_fraction=slow_fraction,
                shingle=shingle, duplicate_threshold=duplicate_threshold,
                same_solution_threshold=same_solution_threshold, ngram=ngram,
                contamination_overlap=contamination_overlap)
            task_list = _load(tasks, format)
            others = [t for a in against or () for t in _load(a, None)]
            res = _validate(task_list, others, cfg, db, no_db, slots, no_isolation)
        if graded:
            # A graded set's tier is its difficulty, in the JSON and the report's histogram.
            res = res.model_copy(update={"reports": [
                r.model_copy(update={"difficulty": graded[r.id].tier}) if r.id in graded else r
                for r in res.reports]})
        if as_json:
            for r in res.reports:
                print(r.model_dump_json())
        else:
            _print_validation(res, f"sandloop tasks validate {tasks}")
        if report is not None:
            from sandloop.curation.report import write_report

            write_report(report, res, title=f"Task quality: {tasks}")
            err.print(Text(f"report written to {report}"))
        rejected = any(r.verdict == "reject" for r in res.reports)
        return 1 if rejected and not exit_zero else 0
    _run(go)


@app.command("curate")
def curate(
    tasks: TasksArg,
    out: Annotated[Path, typer.Option(
        "-o", "--out", callback=check_out_path, dir_okay=False,
        help="Where the kept tasks go (JSONL); the manifest goes next to it (both checked "
             "writable first).")],
    against: Against = None,
    drop_review: Annotated[bool, typer.Option(
        "--drop-review", help="Also leave out tasks marked for review.")] = False,
    format: Format = None,
    grades: Grades = None,
    repeat: Repeat = 5,
    env_repeat: EnvRepeat = 3,
    max_mutants: MaxMutants = 12,
    min_mutation_score: MinScore = 0.6,
    slow_fraction: SlowFraction = 0.5,
    duplicate_threshold: DupThreshold = 0.8,
    ngram: Ngram = 13,
    contamination_overlap: Overlap = 0.2,
    hash_seed: Seeds = None,
    check: Checks = None,
    severity: SeverityOpt = None,
    min_mutants: MinMutants = 3,
    mutant_time_factor: MutantTimeFactor = 10.0,
    mutant_min_time: MutantMinTime = 0.25,
    shingle: Shingle = 5,
    same_solution_threshold: SameSolution = 0.3,
    db: Db = None,
    no_db: NoDb = False,
    slots: Slots = None,
    no_isolation: NoIsolation = False,
) -> None:
    """Validate, then write the kept tasks and a manifest (set version, make-up, changelog of
    what was removed and why) to OUT and OUT's .manifest.json."""
    def go() -> int:
        from sandloop.curation.sets import make_manifest

        # Everything that can be wrong with the input fails before the (long) validation run.
        mpath = _out_path(manifest_path(out))
        graded = _load_grades(tasks, grades)
        cfg = _config(
            hash_seeds=hash_seed, checks=check, severity=severity, repeat=repeat, env_repeat=env_repeat,
            max_mutants=max_mutants, min_mutants=min_mutants,
            min_mutation_score=min_mutation_score, mutant_time_factor=mutant_time_factor,
            mutant_min_time_s=mutant_min_time, slow_fraction=slow_fraction, shingle=shingle,
            duplicate_threshold=duplicate_threshold,
            same_solution_threshold=same_solution_threshold, ngram=ngram,
            contamination_overlap=contamination_overlap)
        task_list = _load(tasks, format)
        others = [t for a in against or () for t in _load(a, None)]
        res = _validate(task_list, others, cfg, db, no_db, slots, no_isolation)
        kept, manifest = make_manifest(tasks, task_list, res.reports, drop_review=drop_review,
                                       grades=graded, validation=cfg.model_dump(mode="json"))
        _write_jsonl(out, [t.to_json() for t in kept])
        mpath.write_text(manifest.model_dump_json(indent=2, by_alias=True) + "\n",
                         encoding="utf-8")
        _print_validation(res, f"sandloop tasks curate {tasks}")
        _console().print(Text(f"kept {manifest.kept} of {len(task_list)} tasks -> {out} "
                              f"(version {manifest.set_version}); manifest {mpath}"))
        return 0
    _run(go)


def manifest_path(tasks_file: Path) -> Path:
    """``CLEAN.jsonl`` -> ``CLEAN.manifest.json``; ``clean.v2.jsonl`` ->
    ``clean.v2.manifest.json``."""
    return _sidecar(tasks_file, "manifest")


@app.command("diff")
def diff(a: Annotated[str, typer.Argument(help="The older set.")],
         b: Annotated[str, typer.Argument(help="The newer set.")],
         as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False
         ) -> None:
    """What changed between two versions of a task set (ids added, removed, changed), with the
    removal reasons from B's manifest when it has one."""
    def go() -> int:
        from sandloop.curation.sets import diff_sets

        d = diff_sets(_load(a, None), _load(b, None))
        reasons: dict[str, list[str]] = {}
        mp = manifest_path(Path(_resolve(b)))
        if mp.is_file():
            try:
                for rm in json.loads(mp.read_text(encoding="utf-8")).get("removed", []):
                    reasons[rm["id"]] = rm.get("codes", [])
            except (ValueError, KeyError, TypeError):
                err.print(f"[yellow]warning:[/] {escape(str(mp))} is not a manifest; reasons "
                          "not shown")
        if as_json:
            print(json.dumps({**d.model_dump(), "removal_reasons": reasons}))
            return 0
        out = _console()
        out.print(Text(f"{a} ({d.a_version}) -> {b} ({d.b_version}): {len(d.added)} added, "
                       f"{len(d.removed)} removed, {len(d.changed)} changed, {d.unchanged} "
                       "unchanged"))
        for tid in d.added:
            out.print(Text(f"+ {tid}", style="green"))
        for tid in d.removed:
            why = f"  ({', '.join(map(str, reasons[tid]))})" if tid in reasons else ""
            out.print(Text.assemble((f"- {tid}", "red"), why))
        for tid in d.changed:
            out.print(Text(f"~ {tid}", style="yellow"))
        return 0
    _run(go)


def _observed_rewards(path: Path) -> Iterator[tuple[str, float | None]]:
    """``(task_id, reward)`` of each line of a rollouts file: ``sandloop score
    --out`` results or a rollout log, as JSON lines (``.gz`` too), Parquet (``sandloop monitor
    export``) or the SQLite rollout log that ``--rollout-log`` writes."""
    from sandloop.monitor.rolloutlog import RolloutLog, RolloutLogError, is_sqlite
    from sandloop.tasks import TaskFormatError
    from sandloop.tasks.loaders import read_parquet

    if is_sqlite(path):
        try:
            with RolloutLog(path) as log:
                for n, ro in enumerate(log.rollouts(), 1):
                    yield ro.task_id, _checked_reward(ro.reward, f"{path}: rollout {n}")
        except RolloutLogError as e:
            raise _BadInput(str(e)) from None
        return
    try:
        with path.open("rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
    except OSError as e:
        raise _BadInput(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        if path.suffix == ".parquet":
            records: Iterator[tuple[int, dict[str, Any]]] = read_parquet(path)
        else:
            records = _json_lines(path, gz)
        for lineno, rec in records:
            tid, r = rec.get("task_id"), rec.get("reward")
            if not isinstance(tid, str) or isinstance(r, bool) or not (
                    r is None or isinstance(r, int | float)):
                raise _BadInput(f"{path}:{lineno}: needs 'task_id' (string) and 'reward' "
                                "(number or null)")
            yield tid, _checked_reward(r, f"{path}:{lineno}")
    except TaskFormatError as e:
        raise _BadInput(str(e)) from None


def _checked_reward(r: float | None, where: str) -> float | None:
    """A reward is a share of a pass, in [0, 1] (docs/curation.md); anything else (NaN, 5, -3)
    is a broken rollouts file, not something to clamp into a grade."""
    if r is None:
        return None
    if not (math.isfinite(r) and 0 <= r <= 1):
        raise _BadInput(f"{where}: reward {r!r} is not in [0, 1]")
    return float(r)


def _json_lines(path: Path, gz: bool) -> Iterator[tuple[int, dict[str, Any]]]:
    import gzip

    from sandloop.jsonl import JsonLineError, json_objects

    try:
        with (gzip.open(path, "rt", encoding="utf-8") if gz
              else path.open(encoding="utf-8")) as fh:
            yield from json_objects(fh)
    except JsonLineError as e:
        raise _BadInput(f"{path}:{e.line}: {e.reason}") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise _BadInput(f"{path}: cannot read ({e}); expected JSON lines (.gz too), Parquet "
                        "or a SQLite rollout log") from None


@app.command("grade")
def grade(
    tasks: TasksArg,
    rollouts: Annotated[list[Path], typer.Option(
        "--rollouts", help="task_id and reward per record: `sandloop score --out` results or "
                           "rollout logs; JSON lines (.gz too), Parquet or a SQLite rollout "
                           "log (repeatable).")],
    out: Annotated[Path | None, typer.Option(
        "-o", "--out", callback=check_out_path, dir_okay=False,
        help="Grades file; default TASKS.grades.json next to the set.")] = None,
    format: Format = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the grades as JSON.")] = False,
) -> None:
    """Turn observed pass rates into a Beta posterior and a tier per task (saturated, easy,
    medium, hard, unsolved), stored next to the task set."""
    def go() -> int:
        from sandloop.curation.difficulty import grade as grade_rewards
        from sandloop.curation.sets import set_version

        ts = _load(tasks, format)
        dest = out or _grades_path(tasks)
        if dest is None:
            raise _BadInput(f"{tasks!r}: no file to put the grades next to; name one with --out")
        dest = _out_path(dest)
        ids = {t.id for t in ts}
        rewards: dict[str, list[float | None]] = {t.id: [] for t in ts}
        unknown: Counter[str] = Counter()
        for path in rollouts:
            for tid, r in _observed_rewards(path):
                if tid not in ids:
                    unknown[tid] += 1
                    continue
                rewards[tid].append(r)
        if unknown:
            err.print(f"[yellow]warning:[/] {sum(unknown.values())} lines name tasks not in the "
                      f"set (e.g. {escape(repr(next(iter(unknown))))}); ignored")
        graded = grade_rewards(rewards)
        data = {"schema": "sandloop.grades/v1", "set_version": set_version(ts),
                "tasks": {k: v.model_dump() for k, v in graded.items()}}
        dest.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        if as_json:
            print(json.dumps(data))
        else:
            tiers = Counter(v.tier for v in graded.values())
            _console().print(Text(f"graded {len(graded)} tasks -> {dest}: "
                                  + ", ".join(f"{t} {tiers[t]}" for t in
                                              ("saturated", "easy", "medium", "hard",
                                               "unsolved"))))
        return 0
    _run(go)


def _iso_date(option: str, value: str) -> str:
    """``value`` as a ``YYYY-MM-DD`` date, the one spelling under which the release dates'
    string order is their date order."""
    import datetime

    try:
        return datetime.date.fromisoformat(value).isoformat()
    except ValueError:
        raise _BadInput(f"{option} {value!r}: not a date; expected YYYY-MM-DD") from None


def _check_release_dates(ts: Sequence[Task]) -> None:
    """Every ``released:`` tag must be a ``YYYY-MM-DD`` date: split_tasks orders them as
    strings, and ``2024-1-5`` would sort after ``2024-10-01``."""
    import datetime

    from sandloop.curation.sets import released

    for t in ts:
        day = released(t)
        if day is None:
            continue
        try:
            ok = datetime.date.fromisoformat(day).isoformat() == day
        except ValueError:
            ok = False
        if not ok:
            raise _BadInput(f"task {t.id!r}: tag 'released:{day}' is not a YYYY-MM-DD date")


@app.command("split")
def split(
    tasks: TasksArg,
    eval_fraction: Annotated[float | None, typer.Option(
        "--eval-fraction", help="Share of tasks in eval.")] = None,
    released_after: Annotated[str | None, typer.Option(
        "--released-after", help="Instead: eval = tasks released on or after this date "
                                 "(YYYY-MM-DD, from their released: tag, e.g. LiveCodeBench).")]
    = None,
    out_dir: Annotated[Path, typer.Option("-o", "--out-dir", help="Writes train.jsonl, "
                                          "eval.jsonl and split.json here.")] = Path("."),
    seed: Annotated[int, typer.Option("--seed", help="Shuffle seed (same seed, same split).")]
    = 0,
    format: Format = None,
    grades: Grades = None,
    ngram: Ngram = 13,
    contamination_overlap: Overlap = 0.2,
) -> None:
    """A train/eval split stratified by tier and tag, with no eval task sharing long n-grams
    with (or near-duplicating) a train task; the eval set is pinned by its hash in split.json."""
    def go() -> int:
        from sandloop.curation.sets import set_version, split_tasks

        if (eval_fraction is None) == (released_after is None):
            raise _BadInput("give one of --eval-fraction and --released-after")
        after = None if released_after is None else _iso_date("--released-after", released_after)
        ts = _load(tasks, format)
        if after is not None:
            _check_release_dates(ts)
        graded = _load_grades(tasks, grades)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _BadInput(f"cannot make {out_dir}: {e.strerror or e}") from None
        for name in ("train.jsonl", "eval.jsonl", "split.json"):
            _out_path(out_dir / name)
        try:
            train, evals = split_tasks(ts, eval_fraction, seed=seed, grades=graded, ngram=ngram,
                                       overlap=contamination_overlap, released_after=after)
        except ValueError as e:
            raise _BadInput(str(e)) from None
        _write_jsonl(out_dir / "train.jsonl", [t.to_json() for t in train])
        _write_jsonl(out_dir / "eval.jsonl", [t.to_json() for t in evals])
        info = {"schema": "sandloop.split/v1", "source": tasks, "source_version": set_version(ts),
                "seed": seed, "eval_fraction": eval_fraction,
                "released_after": after, "train": len(train),
                "eval": len(evals), "train_version": set_version(train),
                "eval_version": set_version(evals)}
        (out_dir / "split.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        _console().print(Text(f"train {len(train)} ({info['train_version']}), eval "
                              f"{len(evals)} (pinned: {info['eval_version']}) -> {out_dir}"))
        return 0
    _run(go)
