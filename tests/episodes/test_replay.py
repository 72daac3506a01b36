"""Record and replay: an episode written to the store re-runs without a model; a changed
observation is reported, by the API and by `sandloop episodes replay`."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sandloop.engine import Engine
from sandloop.episodes import episode
from sandloop.episodes.replay import ReplayError, replay
from sandloop.store.episodes import EpisodeLog
from sandloop.tasks.repo import RepoTask

pytestmark = pytest.mark.asyncio(loop_scope="module")
SRC = str(Path(__file__).resolve().parents[2] / "src")


async def _recorded(engine: Engine, task: RepoTask, db: Path) -> str:
    log = EpisodeLog(db)
    async with episode(engine, task, log=log) as ep:
        await ep.call("run_tests")
        await ep.call("read_file", path="spanlib/core.py")
        await ep.call("apply_patch", patch=task.patch)
        await ep.call("run", command="ls spanlib && echo done")
        await ep.call("submit")
        eid = ep.id
    rec = log.get(eid)
    assert rec is not None and rec.reward == 1.0 and rec.ended_by == "submit"
    assert [c.tool for c in rec.calls] == ["run_tests", "read_file", "apply_patch", "run", "submit"]
    assert all(c.wall_s > 0 for c in rec.calls)
    log.close()
    return eid


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "sandloop", "episodes", *args],
                          capture_output=True, text=True, env=env, timeout=300)


async def test_replay_reproduces_and_reports_differences(engine: Engine, spanlib: RepoTask,
                                                         tmp_path: Path) -> None:
    db = tmp_path / "episodes.db"
    eid = await _recorded(engine, spanlib, db)
    log = EpisodeLog(db)
    same = await replay(engine, log, eid)
    assert same.identical, same.diffs
    assert same.replayed_reward == same.recorded_reward == 1.0
    # The recording says `run` printed something else: the replay must notice.
    with sqlite3.connect(db) as c:
        obs = json.loads(c.execute("SELECT observation FROM episode_calls WHERE episode_id=? "
                                   "AND seq=3", (eid,)).fetchone()[0])
        obs["stdout"] = "something else\n"
        c.execute("UPDATE episode_calls SET observation=? WHERE episode_id=? AND seq=3",
                  (json.dumps(obs), eid))
    changed = await replay(engine, log, eid)
    assert [(d.seq, d.field) for d in changed.diffs] == [(3, "stdout")]
    with pytest.raises(ReplayError, match="no episode"):
        await replay(engine, log, "nope")
    log.close()
    out = _cli("replay", eid, "--db", str(db), "--json")
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)["diffs"][0]["field"] == "stdout"
    listed = _cli("list", "--db", str(db))
    assert listed.returncode == 0 and eid in listed.stdout
