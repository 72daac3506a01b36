"""The trainer-shaped episode adapters over real sandboxes: chat messages in, rewards out; verl's
own tool-dispatch code and TRL's environment protocol driving a `sandloop serve`."""

from __future__ import annotations

import ast
import asyncio
import functools
import importlib.util
import inspect
import json
import logging
import sys
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))

from live import LiveServer

from sandloop.engine import Engine
from sandloop.integrations.episodes import ToolEnv, TrlEpisodeEnv, VerlEpisodeTool, verl_tools
from sandloop.server import ServerConfig
from sandloop.tasks.repo import load_repo_tasks

pytestmark = pytest.mark.asyncio(loop_scope="module")
TASK = next(t for t in load_repo_tasks("repo-demo") if t.id == "spanlib-touching-intervals")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "episode_rollout.py"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine() -> AsyncIterator[Engine]:
    async with Engine(slots=2) as e:
        yield e


@pytest.fixture(scope="module")
def repo_server() -> Iterator[LiveServer]:
    with LiveServer(ServerConfig(slots=2, task_sets=("repo-demo",))) as s:
        yield s


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


# -- verl ----------------------------------------------------------------------------------------


def _verl_dir() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (make test installs it with --no-deps)")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def verl_loop() -> types.SimpleNamespace:
    """verl's own pieces, without its torch stack: ``verl/tools/schemas.py`` (pydantic only)
    loaded by path, and ``ToolAgentLoop._call_tool`` (how the agent loop runs one tool call:
    create -> execute -> release, response text truncation) compiled from the installed
    tool_agent_loop.py, whose module imports torch and PIL."""
    root = _verl_dir()
    spec = importlib.util.spec_from_file_location("verl_tools_schemas", root / "tools" / "schemas.py")
    assert spec is not None and spec.loader is not None
    schemas = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(schemas)
    source = (root / "experimental" / "agent_loop" / "tool_agent_loop.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.AsyncFunctionDef) and n.name == "_call_tool")
    fn.decorator_list = []
    fn.args.args = [ast.arg(arg=a.arg) for a in fn.args.args]  # drop its type annotations
    fn.returns = None
    module = ast.Module(body=[fn], type_ignores=[])
    ns: dict[str, Any] = {"json": json, "logger": logging.getLogger("verl-test"),
                          "ToolResponse": schemas.ToolResponse,
                          "FunctionTool": type("FunctionTool", (), {}),
                          "normalize_function_tool_return": None, "Any": Any}
    exec(compile(ast.fix_missing_locations(module), "tool_agent_loop.py", "exec"), ns)
    return types.SimpleNamespace(schemas=schemas, call_tool=ns["_call_tool"])


def _verl_tools(verl_loop: types.SimpleNamespace, url: str) -> dict[str, VerlEpisodeTool]:
    """As verl's initialize_tools_from_config builds them from a tools YAML."""
    from sandloop.episodes import TOOLS
    out = {}
    for schema in TOOLS:
        tool_schema = verl_loop.schemas.OpenAIFunctionToolSchema.model_validate(schema)
        t = VerlEpisodeTool(config={"type": "native", "url": url, "task_set": "repo-demo"},
                            tool_schema=tool_schema)
        out[t.name] = t
    return out


class AgentData:
    """The parts of verl's AgentData a tool sees."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.extra_fields: dict[str, Any] = {}


async def test_verls_agent_loop_drives_an_episode(verl_loop: types.SimpleNamespace,
                                                  repo_server: LiveServer) -> None:
    tools = _verl_tools(verl_loop, repo_server.url)
    loop = types.SimpleNamespace(tools=tools, max_tool_response_length=100_000,
                                 tool_response_truncate_side="middle")
    kwargs = {name: {"create_kwargs": {"task_id": TASK.id}} for name in tools}

    async def call(data: AgentData, name: str, **args: Any) -> tuple[dict[str, Any], float]:
        fc = types.SimpleNamespace(name=name, arguments=json.dumps(args))
        resp, reward, _metrics = await verl_loop.call_tool(loop, fc, kwargs, data)
        return json.loads(resp.text), reward

    a, b = AgentData("traj-a"), AgentData("traj-b")
    first, step = await call(a, "run_tests")
    assert first["failed"] >= 1 and step == 0.0
    # Two trajectories, two episodes: b's patch does not reach a; parallel calls of one
    # trajectory (verl's max_parallel_calls) share its episode.
    await call(b, "apply_patch", patch=TASK.patch)
    reads = await asyncio.gather(*(call(a, "read_file", path="spanlib/core.py")
                                   for _ in range(3)))
    assert all("start < out[-1][1]" in r[0]["content"] for r in reads)  # a is still unfixed
    assert a.extra_fields["sandloop_episode_id"] != b.extra_fields["sandloop_episode_id"]
    done_b, reward_b = await call(b, "submit")
    assert done_b["verdict"] == "resolved" and reward_b == 1.0  # the final reward as step reward
    assert b.extra_fields["sandloop_reward"] == 1.0
    done_a, reward_a = await call(a, "submit")
    assert reward_a == 0.0 and done_a["verdict"] == "unresolved"
    after, _ = await call(a, "run_tests")
    assert after == {"error": "the episode has ended"}
    # Unknown tool names and bad JSON are verl's to answer; a call without a task says so.
    resp, _r, _m = await verl_loop.call_tool(
        loop, types.SimpleNamespace(name="run", arguments="{}"), {}, AgentData("traj-c"))
    assert "task_id" in resp.text


async def test_verl_tools_over_an_in_process_engine(engine: Engine) -> None:
    tools = {t.name: t for t in verl_tools(engine, [TASK])}
    assert tools["run"].get_openai_tool_schema().model_dump()["function"]["name"] == "run"
    data = AgentData("rollout-1")
    iid, _ = await tools["apply_patch"].create(create_kwargs={"task_id": TASK.id})
    resp, step, metrics = await tools["apply_patch"].execute(iid, {"patch": TASK.patch},
                                                             agent_data=data)
    assert json.loads(resp.text)["ok"] and step == 0.0 and not metrics["done"]
    await tools["apply_patch"].release(iid)
    iid, _ = await tools["submit"].create(create_kwargs={"task_id": TASK.id})
    await tools["submit"].execute(iid, {}, agent_data=data)
    assert await tools["submit"].calc_reward(iid) == 1.0
    await tools["submit"].release(iid)


# -- TRL -----------------------------------------------------------------------------------------


def _trl_source() -> str:
    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        pytest.skip("trl is not installed (make test installs it with --no-deps)")
    return (Path(spec.origin).parent / "trainer" / "grpo_trainer.py").read_text()


async def test_trl_drives_environments_as_our_adapter_expects() -> None:
    """GRPOTrainer imports torch: read how its installed source uses an environment."""
    src = _trl_source()
    assert "environment.reset(**reset_kwargs)" in src  # reset(**row), row holds task_id
    assert 'if member_name not in ("reset", "get_reward") and not member_name.startswith("_")' \
        in src  # every other public function is a tool
    assert "e.get_reward()" in src  # the environment's own reward, once per rollout
    assert 'sync_tool_dict[name](**function["arguments"])' in src  # tools get keyword args


async def test_trl_environment_factory_episode(repo_server: LiveServer) -> None:
    factory = functools.partial(TrlEpisodeEnv, repo_server.url, "repo-demo")
    env = factory()
    tools = {n: getattr(env, n) for n, _ in inspect.getmembers(type(env), inspect.isfunction)
             if n not in ("reset", "get_reward") and not n.startswith("_")}
    assert set(tools) == {"read_file", "write_file", "apply_patch", "list_dir", "run",
                          "run_tests", "submit"}
    for name, fn in tools.items():  # what transformers' get_json_schema needs of a tool
        doc = inspect.getdoc(fn) or ""
        params = [p for p in inspect.signature(fn).parameters if p != "self"]
        assert doc and "Returns:" in doc, name
        assert all(f"    {p}:" in doc or f"{p}:" in doc for p in params), name
        assert all(inspect.signature(fn).parameters[p].annotation is not inspect._empty
                   for p in params), name
    prompt = env.reset(task_id=TASK.id, prompt="fix it")
    assert "spanlib/core.py" in prompt and "merge" in prompt
    assert json.loads(tools["run_tests"]())["failed"] >= 1
    src = json.loads(tools["read_file"](path="spanlib/core.py"))["content"]
    fixed = src.replace("start < out[-1][1]", "start <= out[-1][1]")
    assert json.loads(tools["write_file"](path="spanlib/core.py", content=fixed))["ok"]
    assert env.get_reward() == 1.0  # submitted for the model, which never called submit
    env.reset(task_id=TASK.id)  # the pool reuses instances: a fresh episode
    assert json.loads(env.submit())["reward"] == 0.0
    assert env.get_reward() == 0.0
    assert "ended" in json.loads(env.run_tests())["error"]
