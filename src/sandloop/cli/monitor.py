"""``sandloop monitor``: analyse a run's rollout log, render its report, export the SQLite log.

Registered by cli/main.py with ``app.add_typer(monitor_app, name="monitor")``. Heavy imports
(numpy, the engine) happen inside the commands, so ``sandloop --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from sandloop.cli.exits import ExitCode, print_error
from sandloop.errors import InputError, MonitorError

if TYPE_CHECKING:
    from sandloop.monitor.analysis import RunAnalysis
    from sandloop.monitor.records import Rollout
    from sandloop.reward.scoring import Completion
    from sandloop.reward.verifier import CompletionResult
    from sandloop.tasks import Task

monitor_app = typer.Typer(
    help="Reward monitoring: per-step statistics, reward-hack/drift/diversity/infra alerts, "
         "audits, HTML report.",
    no_args_is_help=True,
)
err = Console(stderr=True)

LogArg = Annotated[Path, typer.Argument(
    help="Rollout log: JSON lines (optionally .gz) or a SQLite rollout log (sandloop serve "
         "--rollout-log).")]
TasksOpt = Annotated[str | None, typer.Option(
    "--tasks", help="Task set (built-in name or JSONL): audit high-reward completions against "
                    "its hidden tests under the hardened harness.")]
RunOpt = Annotated[str | None, typer.Option(
    "--run", help="Run id: the run to read, required when the log holds several.")]
AuditShareOpt = Annotated[float, typer.Option(
    "--audit-share", help="Audit at most this share of the run's scoring work.")]
DbOpt = Annotated[Path | None, typer.Option(
    "--db", help="Result store that caches audits; default $SANDLOOP_DB or "
                 "~/.cache/sandloop/results.db.")]
NoDbOpt = Annotated[bool, typer.Option("--no-db", help="Do not cache audits.")]
SlotsOpt = Annotated[int | None, typer.Option("--slots", help="Sandbox slots for the audit.")]
NoIsoOpt = Annotated[bool, typer.Option(
    "--no-isolation", help="Explicit opt-out: audit WITHOUT isolation (trusted code only).")]
LagOpt = Annotated[int, typer.Option(
    "--lag", help="A step is complete when a rollout this many steps later arrives.")]


class RunChoiceError(MonitorError, InputError):
    """The log's runs and ``--run`` do not single out one run."""


def _check_run(log: Path, run: str | None, runs: Sequence[str | None]) -> None:
    """RunChoiceError unless ``run`` (None: the only one) singles out one of ``runs``."""
    shown = ", ".join("(no run_id)" if i is None else repr(i) for i in runs[:20])
    shown += f" and {len(runs) - 20} more" if len(runs) > 20 else ""
    if run is not None and run not in runs:
        raise RunChoiceError(f"{log}: --run {run!r}: no such run; the log holds "
                             f"{shown or 'no rollouts'}")
    if run is None and len(runs) > 1:
        raise RunChoiceError(f"{log} holds {len(runs)} runs: {shown}; choose one with --run")


def _rollouts(log: Path, run: str | None) -> Iterator[Rollout]:
    """The rollouts of one run of the log. Several runs' steps interleaved would be one
    nonsense series, so a log holding several needs ``--run`` (a RunChoiceError lists them);
    ``--run`` naming none of them is an error too, not an empty analysis."""
    from sandloop.monitor.records import read_log
    from sandloop.monitor.rolloutlog import RolloutLog, is_sqlite

    if is_sqlite(log):
        with RolloutLog(log, readonly=True) as db:
            _check_run(log, run, list(db.runs()))
            yield from db.rollouts(run)
        return
    seen: dict[str | None, None] = {}  # the runs, in order of appearance
    for r in read_log(log):
        seen.setdefault(r.run_id)
        if r.run_id == run if run is not None else len(seen) == 1:
            yield r
    # The rest of the file was still read (and checked), so the error names every run.
    _check_run(log, run, list(seen))


def _scorer(tasks: str, db: Path | None, no_db: bool, slots: int | None,
            no_isolation: bool) -> tuple[dict[str, Task], object]:
    """(tasks by id, async scoring function) through the ``sandloop score`` path."""
    from sandloop.cli.store_open import open_result_store
    from sandloop.engine import Engine
    from sandloop.reward.scoring import score_all
    from sandloop.reward.verdicts import RewardConfig
    from sandloop.reward.verifier import Verifier
    from sandloop.tasks import load_tasks

    by_id = {t.id: t for t in load_tasks(tasks)}

    async def score(items: Sequence[Completion]) -> list[CompletionResult]:
        store = open_result_store(db, no_db)
        try:
            async with Engine(slots=slots, isolation="none" if no_isolation else "full"
                              ) as engine:
                verifier = Verifier(engine.runner(priority="background", client="audit"),
                                    reward=RewardConfig.model_validate({"on": "hidden"}))
                return await score_all(by_id, items, verifier, store=store,
                                       concurrency=4 * engine.backend.slots)
        finally:
            if store is not None:
                store.close()

    return by_id, score


def _analyse(log: Path, run: str | None, tasks: str | None, audit_share: float, db: Path | None,
             no_db: bool, slots: int | None, no_isolation: bool, lag: int) -> RunAnalysis:
    from sandloop import _aio as aio
    from sandloop.monitor.analysis import Monitor, RunAnalysis
    from sandloop.monitor.audit import AuditSampler, run_audit
    from sandloop.monitor.detectors import AuditRearm, detect_audit_failures
    from sandloop.monitor.signatures import TaskScanner

    sampler = None
    score = None
    scanner = None
    if tasks is not None:
        by_id, score = _scorer(tasks, db, no_db, slots, no_isolation)
        # With the tasks known, a branch that answers a test's own inputs with its expected
        # output is a hack signature by itself.
        scanner = TaskScanner(by_id)
        sampler = AuditSampler(share=audit_share, known=frozenset(by_id), scanner=scanner)
    mon = Monitor(lag=lag, scanner=scanner)
    for r in _rollouts(log, run):
        mon.add(r)
        if sampler is not None:
            sampler.add(r)
    mon.flush()
    result = RunAnalysis(mon.steps, list(mon.alerts), mon.late)
    if mon.late:
        err.print(f"[yellow]warning: {mon.late} rollouts arrived after their step was complete "
                  f"and were dropped from the statistics (--lag N waits N more steps)[/]")
    if sampler is not None and score is not None:
        sample = sampler.sample()
        outcomes = aio.run(run_audit(sample, score, scanner))  # type: ignore[arg-type]
        result.audit = [o.to_dict() for o in outcomes]
        # The audit obeys the rearm rule like every detector: a sustained hack is one alert.
        audit_alerts = AuditRearm(mon.thresholds.rearm).admit(
            detect_audit_failures(outcomes, mon.thresholds))
        result.alerts = sorted(result.alerts + audit_alerts, key=lambda a: a.step)
        if sampler.unknown_tasks:
            err.print(f"[yellow]{sampler.unknown_tasks} high-reward rollouts name tasks that are "
                      f"not in {tasks}: not audited[/]")
    return result


def _load_errors() -> tuple[type[Exception], ...]:
    from sandloop.monitor.records import LogFormatError
    from sandloop.monitor.rolloutlog import RolloutLogError
    from sandloop.store import StoreError
    from sandloop.tasks import TaskFormatError

    return (LogFormatError, RolloutLogError, RunChoiceError, TaskFormatError, StoreError,
            OSError, ValueError)


@monitor_app.command("analyze")
def analyze(
    log: LogArg,
    tasks: TasksOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per alert, then "
                                                         "{\"summary\": ...}.")] = False,
    run: RunOpt = None,
    audit_share: AuditShareOpt = 0.1,
    db: DbOpt = None,
    no_db: NoDbOpt = False,
    slots: SlotsOpt = None,
    no_isolation: NoIsoOpt = False,
    lag: LagOpt = 0,
    fail_on_alert: Annotated[bool, typer.Option("--fail-on-alert",
                                                help="Exit 1 when any alert is raised.")] = False,
) -> None:
    """Per-step statistics and alerts of a run: {"code", "step", "detail", "evidence"}."""
    try:
        result = _analyse(log, run, tasks, audit_share, db, no_db, slots, no_isolation, lag)
    except _load_errors() as e:
        print_error(e)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    if as_json:
        out = sys.stdout
        for a in result.alerts:
            out.write(json.dumps(a.to_dict(), default=str) + "\n")
        out.write(json.dumps({"summary": result.summary()}, default=str) + "\n")
    else:
        from rich.table import Table

        console = Console()
        t = Table(title=f"sandloop monitor: {len(result.alerts)} alerts")
        for col in ("step", "code", "detail"):
            t.add_column(col, overflow="fold")
        for a in result.alerts:
            t.add_row(str(a.step), a.code, a.detail)
        console.print(t)
        console.print(json.dumps(result.summary(), default=str))
    raise typer.Exit(1 if fail_on_alert and result.alerts else 0)


@monitor_app.command("report")
def report(
    log: LogArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")],
    tasks: TasksOpt = None,
    run: RunOpt = None,
    audit_share: AuditShareOpt = 0.1,
    db: DbOpt = None,
    no_db: NoDbOpt = False,
    slots: SlotsOpt = None,
    no_isolation: NoIsoOpt = False,
    lag: LagOpt = 0,
) -> None:
    """A self-contained HTML report (opens offline): reward band, histograms, verdicts, alerts."""
    from sandloop.monitor.report import render_report

    try:
        result = _analyse(log, run, tasks, audit_share, db, no_db, slots, no_isolation, lag)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(render_report(result.steps, result.alerts, result.summary(),
                                        title=f"sandloop monitor: {log.name}"),
                          encoding="utf-8")
    except _load_errors() as e:
        print_error(e)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    err.print(f"report: {output} ({len(result.steps)} steps, {len(result.alerts)} alerts)")


@monitor_app.command("export")
def export(
    db_path: Annotated[Path, typer.Argument(help="SQLite rollout log.")],
    output: Annotated[Path, typer.Option("-o", "--output",
                                         help="FILE.jsonl, FILE.jsonl.gz or FILE.parquet.")],
    run: RunOpt = None,
) -> None:
    """Export a SQLite rollout log to the JSON-lines log format or Parquet."""
    from sandloop.monitor.rolloutlog import ParquetUnavailable, RolloutLog, is_sqlite

    if not is_sqlite(db_path):
        print_error(f"{db_path} is not a SQLite rollout log")
        raise typer.Exit(ExitCode.BAD_INPUT)
    errors: tuple[type[Exception], ...] = (ParquetUnavailable, *_load_errors())
    try:
        with RolloutLog(db_path, readonly=True) as db:
            if run is not None:  # export without --run takes every run
                _check_run(db_path, run, list(db.runs()))
            n = (db.export_parquet(output, run) if output.suffix == ".parquet"
                 else db.export_jsonl(output, run))
    except errors as e:
        print_error(e)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    err.print(f"{n} rollouts -> {output}")
