"""The adapters driven by the trainers' own code (installed from PyPI without their torch stacks).

* OpenRLHF: its real ``SingleTurnAgentExecutor`` (``openrlhf/utils/agent.py``) loads our reward
  file the way ``--reward.remote_url file.py`` does and calls it (``asyncio.to_thread(reward_func,
  queries, prompts, labels)``), and posts to ``sandloop serve``'s ``/get_reward`` with its own
  aiohttp client.
* TRL: ``GRPOTrainer`` imports torch, so the test reads from the installed source how
  ``_calculate_rewards`` calls reward functions (keyword names and the extra ``reward_kwargs`` it
  adds) and calls our adapter exactly so, from another thread's event loop, as TRL does for
  async reward functions.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.util
import json
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))

from live import LiveServer

from sandloop.integrations import Scorer
from sandloop.integrations import openrlhf as openrlhf_adapter
from sandloop.integrations.trl import sandloop_reward

SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
IO = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        pytest.skip(f"{name} is not installed (make test installs it with --no-deps)")
    return Path(spec.origin).parent


@pytest.fixture
def openrlhf_agent(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """openrlhf.utils.agent, the real module. The package's utils/__init__.py imports torch and
    transformers, which agent.py does not need: its modules are loaded without that __init__."""
    root = _package_dir("openrlhf")
    pytest.importorskip("aiohttp")
    utils = types.ModuleType("openrlhf.utils")
    utils.__path__ = [str(root / "utils")]
    monkeypatch.setitem(sys.modules, "openrlhf.utils", utils)
    monkeypatch.delitem(sys.modules, "openrlhf.utils.agent", raising=False)
    return importlib.import_module("openrlhf.utils.agent")


def test_openrlhf_executor_loads_and_calls_our_reward_file(
        openrlhf_agent: types.ModuleType, server: LiveServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDLOOP_URL", server.url)
    executor = openrlhf_agent.SingleTurnAgentExecutor(remote_rm_url=openrlhf_adapter.__file__)
    query = "<|im_start|>user\nQ:<|im_end|>\n<|im_start|>assistant\n" + SUM + "<|im_end|>"

    async def rollout() -> list[Any]:
        # What execute() does after generation, for one query.
        return list(await executor._fetch_rewards_via_func([query], ["Q:"], [IO]))

    (info,) = asyncio.run(rollout())
    assert list(info["rewards"]) == [1.0] and list(info["scores"]) == [1.0]
    assert "pass_fraction" in info["extra_logs"]


def test_openrlhf_executor_posts_to_get_reward(openrlhf_agent: types.ModuleType,
                                               server: LiveServer) -> None:
    executor = openrlhf_agent.SingleTurnAgentExecutor(remote_rm_url=server.url + "/get_reward")

    async def rollout() -> list[Any]:
        return list(await executor._fetch_rewards_via_http(
            ["Q:" + SUM, "Q:print(0)"], ["Q:", "Q:"], [IO, IO]))

    (info,) = asyncio.run(rollout())
    assert info["rewards"] == [1.0, 0.0] and info["scores"] == [1.0, 0.0]
    assert set(info["extra_logs"]) >= {"pass_fraction", "compile_error", "timeout"}


def _trl_reward_call() -> tuple[set[str], set[str]]:
    """From TRL's installed grpo_trainer.py: the keywords of its calls to reward functions
    (besides ``**reward_kwargs``) and the names it adds to ``reward_kwargs``."""
    source = (_package_dir("trl") / "trainer" / "grpo_trainer.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.FunctionDef) and n.name == "_calculate_rewards")
    keywords: set[str] = set()
    extra: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and any(k.arg == "completions" for k in node.keywords):
            keywords |= {k.arg for k in node.keywords if k.arg is not None}
            assert any(k.arg is None for k in node.keywords), "reward_kwargs no longer passed"
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                        and t.value.id == "reward_kwargs" and isinstance(t.slice, ast.Constant)):
                    extra.add(str(t.slice.value))
    return keywords, extra


def test_trl_calls_reward_functions_as_our_adapter_expects() -> None:
    keywords, extra = _trl_reward_call()
    assert {"prompts", "completions"} <= keywords, keywords
    assert "trainer_state" in extra and "log_metric" in extra, extra
    logged: dict[str, float] = {}
    stand_ins: dict[str, Any] = {
        "trainer_state": types.SimpleNamespace(global_step=3, epoch=0.1),
        "log_extra": lambda *a, **k: None,
        "log_metric": lambda name, value: logged.__setitem__(name, value),
        "environments": None,
    }
    with Scorer(task_sets=(), slots=2) as scorer:
        f = sandloop_reward(scorer)
        args: dict[str, Any] = {
            "prompts": ["p1", "p2"],
            "completions": [[{"role": "assistant", "content": SUM}], "print(0)"],
            "completion_ids": [[1], [2]],
        }
        assert set(args) >= keywords - {"completion_ids"}, keywords
        kwargs = {name: stand_ins[name] for name in extra if name in stand_ins}
        kwargs["task_id"] = [IO, IO]  # a dataset column, repeated per generation by TRL

        # TRL gathers async reward functions on its own loop, in another thread.
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            call = f(**{k: v for k, v in args.items() if k in keywords}, **kwargs)
            rewards = asyncio.run_coroutine_threadsafe(call, loop).result(120)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
    assert rewards == [1.0, 0.0]
    assert "sandloop/pass_fraction" in logged
