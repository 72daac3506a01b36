"""Replaying a recorded episode: the same task, the same tool calls, no model; report every
observation that differs from the recording.

Timings (``wall_time_s``) and pytest's "in 0.12s" durations are ignored; everything else must
match, so a difference means the environment changed (a new interpreter, a different task
version, a flaky test) or the episode depended on time or randomness.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from sandloop.engine import Engine
from sandloop.episodes.episode import Episode, EpisodeConfig
from sandloop.errors import EpisodeError
from sandloop.store.episodes import EpisodeLog
from sandloop.tasks.loaders import TaskFormatError
from sandloop.tasks.repo import parse_repo_record

__all__ = ["ReplayDiff", "ReplayError", "ReplayReport", "replay"]

VOLATILE = frozenset({"wall_time_s"})
_DURATION = re.compile(r" in \d+(\.\d+)?s\b")


class ReplayError(EpisodeError):
    """The episode cannot be replayed (unknown id, or its record is unreadable)."""


@dataclass(frozen=True)
class ReplayDiff:
    """One field of one call's observation that differs (``seq`` -1: the initial one)."""

    seq: int
    tool: str
    field: str
    recorded: Any
    replayed: Any


@dataclass
class ReplayReport:
    episode_id: str
    task_id: str
    calls: int
    recorded_reward: float | None
    replayed_reward: float | None
    diffs: list[ReplayDiff] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.diffs

    def to_json(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "task_id": self.task_id, "calls": self.calls,
                "recorded_reward": self.recorded_reward, "replayed_reward": self.replayed_reward,
                "identical": self.identical,
                "diffs": [{"seq": d.seq, "tool": d.tool, "field": d.field,
                           "recorded": d.recorded, "replayed": d.replayed} for d in self.diffs]}


def _norm(v: Any) -> Any:
    return _DURATION.sub(" in <t>s", v) if isinstance(v, str) else v


def _compare(seq: int, tool: str, a: Any, b: Any, path: str, out: list[ReplayDiff]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in VOLATILE:
                continue
            _compare(seq, tool, a.get(k), b.get(k), f"{path}.{k}" if path else k, out)
    elif _norm(a) != _norm(b):
        out.append(ReplayDiff(seq, tool, path, a, b))


async def replay(engine: Engine, log: EpisodeLog, episode_id: str) -> ReplayReport:
    """Re-run episode ``episode_id`` from ``log`` (not recorded again) and compare."""
    rec = log.get(episode_id)
    if rec is None:
        raise ReplayError(f"no episode {episode_id!r} in {log.path}; list them with "
                          "`sandloop episodes list --db FILE`")
    try:
        task = parse_repo_record(json.loads(rec.task))
        config = EpisodeConfig.from_json(rec.config)
    except (ValueError, TaskFormatError) as e:
        raise ReplayError(f"episode {episode_id}: cannot read its task or config: {e}") from None
    report = ReplayReport(episode_id, task.id, len(rec.calls), rec.reward, None)
    ep = Episode(engine, task, config)
    await ep.reset()
    try:
        for call in rec.calls:
            if ep.done:
                report.diffs.append(ReplayDiff(call.seq, call.tool, "(episode)",
                                               "call made", "episode already ended"))
                break
            obs = await ep.call(call.tool, call.arguments)
            _compare(call.seq, call.tool, call.observation, obs, "", report.diffs)
        report.replayed_reward = ep.reward
    finally:
        await ep.close()
    return report
