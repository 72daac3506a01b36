"""Multi-turn, tool-using episodes over repository tasks (see docs/episodes.md).

``async with episode(engine, task) as ep: obs = await ep.call("run_tests")`` — an episode is one
:class:`~sandloop.tasks.repo.RepoTask` in one engine session; the model reads, writes, patches
and runs through tools, and the final state is graded by hidden tests.
"""

from sandloop.episodes.episode import Episode, EpisodeConfig, EpisodeFinished, episode
from sandloop.episodes.grading import Grade, Shaping, shape_reward
from sandloop.episodes.snapshots import SetupFailed, Snapshots, snapshots_of
from sandloop.episodes.tools import TOOL_NAMES, TOOLS, check_arguments, tool_schemas

__all__ = [
    "TOOLS",
    "TOOL_NAMES",
    "Episode",
    "EpisodeConfig",
    "EpisodeFinished",
    "Grade",
    "SetupFailed",
    "Shaping",
    "Snapshots",
    "check_arguments",
    "episode",
    "shape_reward",
    "snapshots_of",
    "tool_schemas",
]
