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

from sandloop.cli.exits import ExitCode, print_error

if TYPE_CHECKING:
    from sandloop.episodes.replay import ReplayReport
    from sandloop.store.episodes import EpisodeLog

episodes_app = typer.Typer(help="Multi-turn episodes: list and replay recorded ones.",
                           no_args_is_help=True)
_SQLITE_MAGIC = b"SQLite format 3\x00"

DbOpt = Annotated[Path | None, typer.Option(
    "--db", help="The SQLite file episodes were recorded in (`sandloop serve --episode-db`/"
                 "`--db`, or EpisodeLog(path)); default: the project's result store, where "
                 "`sandloop serve` records them.")]


def _log(db: Path | None) -> EpisodeLog:
    from sandloop.settings import default_db_path
    from sandloop.store.episodes import EpisodeLog

    if db is None:
        db = default_db_path()
        if not db.is_file():
            print_error(f"no episodes recorded for this project yet (no {db}); pass --db FILE "
                        "where they were recorded")
            raise typer.Exit(ExitCode.BAD_INPUT)
    if not db.is_file():
        print_error(f"--db {db}: no such file")
        raise typer.Exit(ExitCode.BAD_INPUT)
    # A file that is not SQLite at all is the caller's mistake (exit 2); a SQLite file that
    # cannot be opened is a store failure (StoreError: exit 3, by cli/exits.py).
    try:
        with db.open("rb") as fh:
            magic = fh.read(len(_SQLITE_MAGIC))
    except OSError as e:
        print_error(f"--db {db}: cannot read: {e.strerror or e}")
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    if magic != _SQLITE_MAGIC:
        print_error(f"--db {db}: not an episode log (not a SQLite file); pass the file "
                    "`sandloop serve --db` recorded episodes in")
        raise typer.Exit(ExitCode.BAD_INPUT)
    return EpisodeLog(db)


@episodes_app.command("list")
def list_command(db: DbOpt = None,
                 limit: Annotated[int, typer.Option(min=1, help="At most this many.")] = 20,
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
    db: DbOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    slots: Annotated[int | None, typer.Option("--slots", min=1, max=4096, help="Sandbox slots.")] = None,
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
        print_error(e)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
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
