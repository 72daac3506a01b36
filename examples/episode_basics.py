"""A multi-turn episode on a repository task, driven by hand: run the public tests, submit.

    python examples/episode_basics.py

The unfixed repository fails its tests, so the reward is 0; examples/episode_rollout.py plays a
whole episode that fixes the bug (reward 1) through the trainer-style ToolEnv adapter.
"""

import asyncio

from sandloop.engine import Engine
from sandloop.tasks.repo import load_repo_tasks


async def main() -> None:
    task = next(t for t in load_repo_tasks("repo-demo") if t.id == "spanlib-touching-intervals")
    async with Engine(slots=2) as engine, engine.episode(task) as ep:  # task: a RepoTask
        obs = await ep.call("run_tests")   # read_file, write_file, apply_patch, list_dir, run
        print("run_tests: failed", obs["failed"])
        obs = await ep.call("submit")      # {"reward", "verdict", "tests": {...}}
        print("submit:", obs["reward"], obs["verdict"])


if __name__ == "__main__":
    asyncio.run(main())
