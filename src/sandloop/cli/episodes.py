"""``sandloop episodes``: list recorded episodes and replay one without a model.

Registered by cli/main.py with ``app.add_typer(episodes_app, name="episodes")``. The engine is
imported inside the commands, so ``sandloop --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

if TYPE_CHECKING:
    from sandloop.episodes.replay import ReplayReport
    from sandloop.store.episodes import EpisodeLog

episodes_app = typer.Typer(help="Multi-turn episodes: list and replay recorded ones.",
                           no_args_is_help=True)
err = Console(stderr=True)

DbOpt = Annotated[Path, typer.Option(
    "--db", help="The SQLite file episodes were recorded in (sandloop serve --db, or "
                 "EpisodeLog(path)).")]


def _log(db: Path) -> EpisodeLog:
    from sandloop.store.episodes import EpisodeLog

    if not db.is_file():
        err.print(f"[red]no such file: {db}[/red]")
        raise typer.Exit(2)
    return EpisodeLog(db)


@episodes_app.command("list")
def list_command(db: DbOpt, limit: Annotated[int, typer.Option(help="At most this many.")] = 20,
                 ) -> None:
    """The most recent episodes: id, task, turns, how they ended, reward."""
    log = _log(db)
    try:
        for eid in log.ids(limit):
            rec = log.get(eid)
            if rec is not None:
                print(f"{rec.id}\t{rec.task_id}\t{len(rec.calls)} calls\t"
                      f"{rec.ended_by or 'open'}\t{rec.reward}")
    finally:
        log.close()


@episodes_app.command("replay")
def replay_command(
    episode_id: Annotated[str, typer.Argument(help="The episode's id.")],
    db: DbOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    slots: Annotated[int | None, typer.Option("--slots", help="Sandbox slots.")] = None,
) -> None:
    """Re-run a recorded episode's tool calls without a model; report any observation that
    differs (exit 1), or none (exit 0)."""
    from sandloop.engine import Engine
    from sandloop.episodes.replay import ReplayError, replay

    log = _log(db)

    async def go() -> ReplayReport:
        async with Engine(slots=slots or 2) as engine:
            return await replay(engine, log, episode_id)

    try:
        report = asyncio.run(go())
    except ReplayError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    finally:
        log.close()
    if as_json:
        print(json.dumps(report.to_json()))
    else:
        print(f"episode {report.episode_id} ({report.task_id}): {report.calls} calls replayed; "
              f"reward recorded {report.recorded_reward}, replayed {report.replayed_reward}")
        for d in report.diffs:
            print(f"  call {d.seq} {d.tool}: {d.field}: recorded {str(d.recorded)[:200]!r} "
                  f"!= replayed {str(d.replayed)[:200]!r}")
        print("identical" if report.identical else f"{len(report.diffs)} difference(s)")
    raise typer.Exit(0 if report.identical else 1)
