"""A multi-turn rollout over a sandloop episode, driven by a scripted policy instead of a model.

    PYTHONPATH=src python examples/episode_rollout.py

The policy plays what a trained model would: run the tests, read the failing test and the code,
fix the bug with a patch, check the tests, submit. Replace ``scripted_policy`` with a call to
your model (its answer: an OpenAI-style assistant message with ``tool_calls``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sandloop.engine import Engine
from sandloop.integrations.episodes import ToolEnv
from sandloop.tasks.patches import make_patch
from sandloop.tasks.repo import load_repo_tasks

Message = dict[str, Any]


def tool_call(n: int, name: str, **arguments: Any) -> Message:
    return {"role": "assistant", "content": None, "tool_calls": [{
        "id": f"call{n}", "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)}}]}


async def scripted_policy(messages: list[Message], tools: list[dict[str, Any]]) -> Message:
    turn = sum(1 for m in messages if m["role"] == "assistant")
    if turn == 0:
        return tool_call(turn, "run_tests")
    if turn == 1:
        return tool_call(turn, "read_file", path="tests/test_merge.py")
    if turn == 2:
        return tool_call(turn, "read_file", path="spanlib/core.py")
    if turn == 3:
        source = json.loads(messages[-1]["content"])["content"]
        fixed = source.replace("start < out[-1][1]", "start <= out[-1][1]")
        return tool_call(turn, "apply_patch",
                         patch=make_patch({"spanlib/core.py": source}, {"spanlib/core.py": fixed}))
    if turn == 4:
        return tool_call(turn, "run_tests")
    return tool_call(turn, "submit")


async def main() -> None:
    task = next(t for t in load_repo_tasks("repo-demo") if t.id == "spanlib-touching-intervals")
    async with Engine(slots=2) as engine:
        env = ToolEnv(engine)
        rollout = await env.rollout(scripted_policy, task)
    for m in rollout.messages:
        text = m.get("content") or json.dumps(m.get("tool_calls"))
        print(f"{m['role']:>9}: {text[:110]!s}")
    print(f"reward={rollout.reward} verdict={rollout.verdict} turns={rollout.turns}")


if __name__ == "__main__":
    asyncio.run(main())
