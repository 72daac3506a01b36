"""``sandloop score``: score model completions against a task set (registered by cli/main.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sandloop import _aio as aio
from sandloop.cli.exits import ExitCode, one_line
from sandloop.cli.output import Progress, info, results_stdout
from sandloop.cli.store_open import open_result_store
from sandloop.engine import Engine
from sandloop.engine.cluster import ClusterUnavailable
from sandloop.errors import MonitorError
from sandloop.monitor.capture import rollouts_of
from sandloop.monitor.records import MAX_INT, LogFormatError, rollout_from_dict
from sandloop.monitor.rolloutlog import RolloutLog
from sandloop.reward.scoring import (
    Completion,
    CompletionFileError,
    read_completions,
    score_all,
)
from sandloop.reward.verdicts import RewardConfig, ScoreSummary, summarize
from sandloop.reward.verifier import CompletionResult, Verifier
from sandloop.sandbox.slot import preload_with
from sandloop.settings import Settings, load_settings
from sandloop.settings import default_db_path as project_db_path
from sandloop.store import StoreError
from sandloop.tasks import Task, TaskFormatError, load_tasks

__all__ = ["DEMO_COMPLETIONS", "default_db_path", "demo_completions_path", "open_result_store",
           "score_command"]

DEMO_COMPLETIONS = "humaneval_demo.jsonl"


DEFAULT_K = (1, 10, 100)


def default_db_path() -> Path:
    """``$SANDLOOP_DB``, the config file's ``db``, else one store per project in the cache
    (:func:`sandloop.settings.default_db_path`)."""
    return project_db_path()


def demo_completions_path() -> Path:
    """The bundled HumanEval demo completions (references, wrong and cheating ones)."""
    return Path(str(resources.files("sandloop.data").joinpath(DEMO_COMPLETIONS)))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_jsonl_atomic(path: Path, results: Sequence[CompletionResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file 0600; an output file gets the mode any new file would
        # (0666 less the umask), like a shell redirection.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for r in results:
                fh.write(r.model_dump_json() + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _print_summary(console: Console, s: ScoreSummary, elapsed: float, cached: int) -> None:
    table = Table(title="sandloop score", show_header=False)
    table.add_row("completions", f"{s.completions} over {s.tasks} tasks")
    table.add_row("scored / null reward", f"{s.scored} / {s.null_rewards}")
    table.add_row("from store (not rerun)", str(cached))
    table.add_row("mean reward", "-" if s.mean_reward is None else f"{s.mean_reward:.4f}")
    for name, value in s.pass_at_k.items():
        table.add_row(name, f"{value:.4f}")
    table.add_row("verdicts", ", ".join(f"{k} {v}" for k, v in s.verdicts.items()))
    table.add_row("test verdicts", ", ".join(f"{k} {v}" for k, v in s.test_verdicts.items()))
    table.add_row("time", f"{elapsed:.2f} s")
    console.print(table)


def _fail(message: str) -> int:
    import sys

    sys.stderr.write(f"sandloop: error: {one_line(message)}\n")
    return ExitCode.BAD_INPUT


def _check_k(k: Sequence[int] | None, items: Sequence[object]) -> tuple[int, ...] | str:
    """The ks to report, or why an explicit ``--k`` cannot be: pass@k needs at least k
    completions of every task. Defaults above that are dropped silently."""
    per_task = Counter(getattr(c, "task_id", "") for c in items)
    fewest, task = min((n, t) for t, n in per_task.items()) if per_task else (0, "")
    if k is None:
        return tuple(x for x in DEFAULT_K if x <= max(fewest, 1))
    too_big = sorted(x for x in set(k) if x > fewest)
    if too_big:
        return (f"--k {too_big[0]}: pass@{too_big[0]} needs at least {too_big[0]} completions "
                f"of every task; {task} has {fewest}")
    return tuple(sorted(set(k)))


def score_command(
    tasks: str,
    completions: Path,
    out: Path | None = None,
    format: str | None = None,
    db: Path | None = None,
    no_db: bool = False,
    k: Sequence[int] | None = None,
    reward_mode: str = "binary",
    reward_on: str = "hidden",
    time_scale: float = 1.0,
    slots: int | None = None,
    no_isolation: bool = False,
    as_json: bool = False,
    progress: bool | None = None,
    by_kind: bool = False,
    priority: str = "train",
    preload_extra: Sequence[str] = (),
    step: int | None = None,
    group: str | None = None,
    run_id: str | None = None,
    rollout_log: Path | None = None,
    settings: Settings | None = None,
    ray_address: str | None = None,
) -> int:
    """Score ``completions`` against ``tasks``; returns the process exit code.

    With ``rollout_log`` (default ``$SANDLOOP_ROLLOUT_LOG``) the scored completions are appended
    to that SQLite rollout log as rollouts of training step ``step`` (a line's own ``step``
    wins), group ``group`` (a line's own ``group`` wins; default: the task id), run ``run_id``.

    0: scored (even if rewards are low); 2: bad input (task set, completions file, options, an
    output path that cannot be written) or the store cannot be opened; 3: some rewards are null
    (infrastructure failures). Everything is checked before the first run.
    ``progress``: None shows it unless ``--quiet`` (a bar on a terminal, else periodic lines).
    """
    settings = settings or load_settings()
    started = time.perf_counter()
    try:
        reward = RewardConfig.model_validate({"mode": reward_mode, "on": reward_on})
    except ValueError as e:
        return _fail(f"--reward/--reward-on: {e}")
    try:
        task_list = load_tasks(tasks, format)
        by_id = {t.id: t for t in task_list}
        items = read_completions(completions, by_id)
    except (TaskFormatError, CompletionFileError) as e:
        return _fail(str(e))
    if not items:
        return _fail(f"{completions}: no completions in it")
    ks = _check_k(k, items)
    if isinstance(ks, str):
        return _fail(ks)
    problem = _time_limit_problem(items, by_id, time_scale, settings)
    if problem:
        return _fail(problem)
    if rollout_log is None and os.environ.get("SANDLOOP_ROLLOUT_LOG"):
        rollout_log = Path(os.environ["SANDLOOP_ROLLOUT_LOG"])
    problem = _rollout_options_problem(items, step, rollout_log, group=group, run_id=run_id,
                                       completions=completions)
    if problem:
        return _fail(problem)
    log: RolloutLog | None = None
    if rollout_log is not None:
        # Opened (and so checked: writable, a rollout log) before any scoring, like --out:
        # else an unusable path would be found only once every completion had been scored.
        try:
            rollout_log.parent.mkdir(parents=True, exist_ok=True)
            log = RolloutLog(rollout_log)
        except (MonitorError, OSError) as e:
            return _fail(f"--rollout-log: {e}")
    try:
        return _score_and_report(items, by_id, ks, reward, log, store_args=(db, no_db),
                                 out=out, slots=slots, no_isolation=no_isolation,
                                 as_json=as_json, by_kind=by_kind, preload_extra=preload_extra,
                                 time_scale=time_scale, priority=priority, step=step,
                                 group=group, run_id=run_id, ray_address=ray_address,
                                 settings=settings, progress=progress, started=started)
    finally:
        if log is not None:
            log.close()


def _score_and_report(items: list[Completion], by_id: dict[str, Task], ks: tuple[int, ...],
                      reward: RewardConfig, log: RolloutLog | None, *,
                      store_args: tuple[Path | None, bool], out: Path | None, slots: int | None,
                      no_isolation: bool, as_json: bool, by_kind: bool,
                      preload_extra: Sequence[str], time_scale: float, priority: str,
                      step: int | None, group: str | None, run_id: str | None,
                      ray_address: str | None, settings: Settings, progress: bool | None,
                      started: float) -> int:
    """Everything after the checks: the store, the scoring, the outputs, the summary."""
    console = Console()
    try:
        store = open_result_store(*store_args, settings)
    except StoreError as e:
        return _fail(str(e))
    cached = 0

    async def run() -> list[CompletionResult]:
        nonlocal cached
        # Through the engine, like every surface: scheduling, admission, fairness and the retry
        # of infrastructure failures apply (a failure that persists is a null reward).
        async with Engine(slots=slots, isolation="none" if no_isolation else "full",
                          preload=preload_with(preload_extra),
                          cluster="ray" if ray_address else None, address=ray_address,
                          ) as engine:
            verifier = Verifier(engine.runner(priority=priority, client="score"), reward=reward,
                                time_scale=time_scale)
            with Progress("scoring", len(items), interval_s=settings.progress_interval_s,
                          enabled=progress) as bar:

                def done(_res: CompletionResult, from_store: bool) -> None:
                    nonlocal cached
                    cached += from_store
                    bar.advance()

                return await score_all(by_id, items, verifier, store=store,
                                       concurrency=4 * engine.backend.slots, on_result=done)

    try:
        with results_stdout(ray_address is not None):
            results = aio.run(run())
    except KeyboardInterrupt:
        info("scoring: interrupted"
             + (f"; finished results are kept in {store.path}: rerun the same command to "
                "score only the rest" if store is not None else ""))
        return 130
    except ClusterUnavailable as e:
        return _fail(str(e))
    finally:
        if store is not None:
            store.close()
    if out is not None:
        try:
            _write_jsonl_atomic(out, results)
        except OSError as e:  # checked before scoring; the disk may still fill up
            _fail(f"--out {out}: {e.strerror or e}"
                  + ("; the results are in the store: rerun to write them without rescoring"
                     if store is not None else ""))
            return ExitCode.INFRASTRUCTURE
    if log is not None:
        try:
            n = _append_rollouts(log, items, results, step, group, run_id, by_id)
        except (MonitorError, OSError, ValueError, OverflowError, sqlite3.Error) as e:
            # Checked before scoring; a task's own difficulty or source could still be
            # unstorable, and that is the input's fault, not a crash.
            return _fail(f"--rollout-log {log.path}: {e}")
        info(f"{n} rollouts -> {log.path} (run {run_id or 'default'})")
    summary = summarize(
        ((r.task_id, r.reward, r.verdict, r.tests) for r in results), ks=ks
    )
    elapsed = time.perf_counter() - started
    if as_json:
        data = {**summary.model_dump(mode="json"), "cached": cached, "time_s": round(elapsed, 3)}
        print(json.dumps(data))
    else:
        _print_summary(console, summary, elapsed, cached)
        if by_kind:
            _print_by_kind(console, results)
    return ExitCode.INFRASTRUCTURE if summary.null_rewards else ExitCode.OK


def _time_limit_problem(items: Sequence[Completion], tasks: dict[str, Task],
                        time_scale: float, settings: Settings) -> str | None:
    """Why a task's per-test time limit times ``--time-scale`` exceeds the project's
    ``max_time_s`` (the most one run may ask), or None. Checked before anything runs, like
    ``exec-batch`` lines: else a scaled limit far above the project's maximum would be found
    only by a run that takes that long."""
    for task_id in dict.fromkeys(c.task_id for c in items):
        task = tasks.get(task_id)
        if task is None:
            continue
        scaled = task.limits.time_s * time_scale
        if scaled > settings.max_time_s:
            return (f"task {task_id}: limits.time_s {task.limits.time_s:g} x --time-scale "
                    f"{time_scale:g} = {scaled:g} s is over the project's max_time_s="
                    f"{settings.max_time_s:g} (lower --time-scale, or raise max_time_s in "
                    "sandloop.toml)")
    return None


def _rollout_options_problem(items: Sequence[Completion], step: int | None,
                             rollout_log: Path | None, *, group: str | None = None,
                             run_id: str | None = None,
                             completions: Path | None = None) -> str | None:
    if step is not None and not 0 <= step <= MAX_INT:
        return f"--step must be an integer in [0, 2**63 - 1], got {step}"
    if rollout_log is None:
        if step is not None:
            return ("--step tags the rollouts of a rollout log: add --rollout-log PATH (or set "
                    "SANDLOOP_ROLLOUT_LOG)")
        return None
    if step is None and any(c.step is None for c in items):
        return ("--rollout-log needs the training step of every completion: pass --step N "
                "or give each completions line a 'step' field")
    # What the log will record of each completion passes the log's own line check now: a step
    # over SQLite's integer range or a lone surrogate would otherwise fail only at the append,
    # after every completion had been scored.
    for i, c in enumerate(items, 1):
        try:
            rollout_from_dict({"step": c.step if c.step is not None else step,
                               "task_id": c.task_id, "completion": c.completion,
                               "reward": None, "group": c.group if c.group is not None
                               else group, "run_id": run_id,
                               "completion_id": c.completion_id},
                              f"{completions or 'completions'}: record {i}")
        except LogFormatError as e:
            return str(e)
    return None


def _append_rollouts(log: RolloutLog, items: Sequence[Completion],
                     results: Sequence[CompletionResult], step: int | None, group: str | None,
                     run_id: str | None, tasks: dict[str, Task]) -> int:
    rollouts = []
    for c, r in zip(items, results, strict=True):
        st = c.step if c.step is not None else step
        assert st is not None  # checked before scoring (_rollout_options_problem)
        rollouts.extend(rollouts_of([r], [c.completion], step=st,
                                    groups=[c.group if c.group is not None else group],
                                    run_id=run_id, tasks=tasks))
    return log.append(rollouts, run_id or "default")


def _print_by_kind(console: Console, results: Sequence[CompletionResult]) -> None:
    """Mean reward per kind of completion (the part of completion_id before ':')."""
    groups: dict[str, list[CompletionResult]] = {}
    for r in results:
        groups.setdefault(str(r.completion_id).split(":", 1)[0], []).append(r)
    table = Table(title="reward by kind of completion")
    for col in ("kind", "completions", "reward 1", "reward 0", "null", "mean reward"):
        table.add_column(col)
    for kind, rs in sorted(groups.items()):
        rewards = [r.reward for r in rs if r.reward is not None]
        table.add_row(kind, str(len(rs)), str(sum(1 for x in rewards if x == 1.0)),
                      str(sum(1 for x in rewards if x == 0.0)), str(len(rs) - len(rewards)),
                      f"{sum(rewards) / len(rewards):.3f}" if rewards else "-")
    console.print(table)
