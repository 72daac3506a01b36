"""The trainer-shaped episode adapters over a real engine: chat messages in, rewards out."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sandloop.engine import Engine
from sandloop.integrations.episodes import ToolEnv, verl_tools
from sandloop.tasks.repo import load_repo_tasks

pytestmark = pytest.mark.asyncio(loop_scope="module")
TASK = next(t for t in load_repo_tasks("repo-demo") if t.id == "spanlib-touching-intervals")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "episode_rollout.py"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[Engine]:
    async with Engine(slots=2) as e:
        yield e


async def test_the_examples_scripted_policy_earns_1(engine: Engine) -> None:
    spec = importlib.util.spec_from_file_location("episode_rollout", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rollout = await ToolEnv(engine).rollout(example.scripted_policy, TASK)
    assert rollout.reward == 1.0 and rollout.verdict == "resolved" and rollout.turns == 6
    tool_msgs = [m for m in rollout.messages if m["role"] == "tool"]
    assert tool_msgs[0]["tool_call_id"] == "call0" and len(tool_msgs) == 6


async def test_a_policy_that_stops_calling_tools_is_submitted(engine: Engine) -> None:
    async def quitter(messages: list[dict[str, Any]], tools: Any) -> dict[str, Any]:
        return {"role": "assistant", "content": "I give up"}

    rollout = await ToolEnv(engine).rollout(quitter, TASK)
    assert rollout.reward == 0.0 and rollout.turns == 1
    assert json.loads(rollout.messages[-1]["content"])["ended_by"] == "submit"


async def test_verl_tool_shape(engine: Engine) -> None:
    tools = {t.name: t for t in verl_tools(engine, [TASK])}
    assert tools["run"].get_openai_tool_schema()["function"]["name"] == "run"
    for t in tools.values():
        await t.create("rollout-1", task_id=TASK.id)
    text, step, metrics = await tools["apply_patch"].execute("rollout-1", {"patch": TASK.patch})
    assert json.loads(text)["ok"] and step == 0.0 and not metrics["done"]
    assert await tools["submit"].calc_reward("rollout-1") == 1.0
    await tools["submit"].release("rollout-1")
