"""``sandloop score``: score model completions against a task set (registered by cli/main.py)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sandloop import _aio as aio
from sandloop.cli.cluster import results_stdout
from sandloop.engine import Engine
from sandloop.engine.cluster import ClusterUnavailable
from sandloop.reward.scoring import CompletionFileError, read_completions, score_all
from sandloop.reward.verdicts import RewardConfig, ScoreSummary, summarize
from sandloop.reward.verifier import CompletionResult, Verifier
from sandloop.sandbox.slot import preload_with
from sandloop.store import ResultStore, StoreError
from sandloop.tasks import TaskFormatError, load_tasks

__all__ = ["DEMO_COMPLETIONS", "default_db_path", "demo_completions_path", "score_command"]

DEMO_COMPLETIONS = "humaneval_demo.jsonl"


def default_db_path() -> Path:
    """``$SANDLOOP_DB``, else ``~/.cache/sandloop/results.db``."""
    env = os.environ.get("SANDLOOP_DB")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sandloop" / "results.db"


def demo_completions_path() -> Path:
    """The bundled HumanEval demo completions (references, wrong and cheating ones)."""
    return Path(str(resources.files("sandloop.data").joinpath(DEMO_COMPLETIONS)))


def _write_jsonl_atomic(path: Path, results: Sequence[CompletionResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
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


def score_command(
    tasks: str,
    completions: Path,
    out: Path | None = None,
    format: str | None = None,
    db: Path | None = None,
    no_db: bool = False,
    k: Sequence[int] = (1, 10, 100),
    reward_mode: str = "binary",
    reward_on: str = "hidden",
    time_scale: float = 1.0,
    slots: int | None = None,
    no_isolation: bool = False,
    as_json: bool = False,
    progress: bool = True,
    by_kind: bool = False,
    priority: str = "train",
    preload_extra: Sequence[str] = (),
    ray_address: str | None = None,
) -> int:
    """Score ``completions`` against ``tasks``; returns the process exit code.

    0: scored (even if rewards are low); 1: some rewards are null (infrastructure failures);
    2: bad input (task set, completions file, options) or the store cannot be opened.
    """
    console, err = Console(), Console(stderr=True)
    started = time.perf_counter()
    try:
        reward = RewardConfig.model_validate({"mode": reward_mode, "on": reward_on})
    except ValueError as e:
        err.print(f"[red]error:[/] invalid reward options: {e}", soft_wrap=True)
        return 2
    try:
        task_list = load_tasks(tasks, format)
        by_id = {t.id: t for t in task_list}
        items = read_completions(completions, by_id)
    except (TaskFormatError, CompletionFileError) as e:
        err.print(f"[red]error:[/] {e}", soft_wrap=True)
        return 2
    store = None
    if not no_db:
        path = db or default_db_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            store = ResultStore(path)
        except (StoreError, OSError) as e:
            err.print(f"[red]error:[/] {e}", soft_wrap=True)
            return 2
    cached = 0

    async def run() -> list[CompletionResult]:
        nonlocal cached
        # Through the engine, like every surface: scheduling, admission and fairness apply.
        # The verifier retries infrastructure failures itself (then reports a null reward).
        async with Engine(slots=slots, isolation="none" if no_isolation else "full",
                          max_attempts=1,
                          preload=preload_with(preload_extra),
                          cluster="ray" if ray_address else None, address=ray_address,
                          ) as engine:
            verifier = Verifier(engine.runner(priority=priority, client="score"), reward=reward,
                                time_scale=time_scale)
            with Progress(
                TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=err, disable=not progress, transient=True,
            ) as bar:
                job = bar.add_task("scoring", total=len(items))

                def done(_res: CompletionResult, from_store: bool) -> None:
                    nonlocal cached
                    cached += from_store
                    bar.advance(job)

                return await score_all(by_id, items, verifier, store=store,
                                       concurrency=4 * engine.backend.slots, on_result=done)

    try:
        with results_stdout(ray_address is not None):
            results = aio.run(run())
    except ClusterUnavailable as e:
        err.print(f"[red]error:[/] {e}", soft_wrap=True)
        return 2
    finally:
        if store is not None:
            store.close()
    if out is not None:
        _write_jsonl_atomic(out, results)
    summary = summarize(
        ((r.task_id, r.reward, r.verdict, r.tests) for r in results), ks=tuple(k)
    )
    elapsed = time.perf_counter() - started
    if as_json:
        data = {**summary.model_dump(mode="json"), "cached": cached, "time_s": round(elapsed, 3)}
        print(json.dumps(data))
    else:
        _print_summary(console, summary, elapsed, cached)
        if by_kind:
            _print_by_kind(console, results)
    return 1 if summary.null_rewards else 0


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
