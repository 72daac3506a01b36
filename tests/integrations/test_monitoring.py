"""The adapters tag each score with its training step and rollout group, called the way each
trainer calls them: in-process scoring appends the rollouts to a real SQLite rollout log, remote
scoring tells a real server (which records them in its own log and on /dashboard/data)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys
import threading
import types
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))

from live import LiveServer

from sandloop.integrations import ScoreItem, Scorer, _common
from sandloop.integrations import openrlhf as openrlhf_adapter
from sandloop.integrations import verl as verl_adapter
from sandloop.integrations._common import AdapterSettingError, StepClock, run_groups
from sandloop.integrations.trl import sandloop_reward
from sandloop.monitor import Rollout
from sandloop.monitor.rolloutlog import RolloutLog
from sandloop.server import ServerConfig

T = TypeVar("T")
SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
IO = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
IO2 = json.dumps({"inputs": ["5\n"], "outputs": ["5\n"]})
ECHO = "print(input())"


def logged(path: Path, run: str | None = None) -> list[Rollout]:
    with RolloutLog(path) as log:
        return list(log.rollouts(run))


def on_trainer_loop(coro: Coroutine[Any, Any, T]) -> T:
    """TRL gathers async reward functions on its own event loop, in another thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(120)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def trl_call(f: Any, step: int, prompts: list[str], completions: list[str],
             labels: list[str]) -> list[float | None]:
    # GRPOTrainer._calculate_rewards: keyword arguments, dataset columns repeated per
    # generation, the prompts of one group consecutive, trainer_state = its TrainerState.
    return on_trainer_loop(f(
        prompts=prompts, completions=completions, completion_ids=[[1]] * len(prompts),
        trainer_state=types.SimpleNamespace(global_step=step, epoch=0.0),
        log_extra=lambda *a, **k: None, log_metric=lambda *a: None, task_id=labels))


@pytest.fixture
def env_scorers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """In-process scoring configured by the environment, as verl/OpenRLHF workers get it; the
    process-wide scorers made meanwhile are closed afterwards."""
    path = tmp_path / "rollouts.db"
    monkeypatch.setenv("SANDLOOP_ROLLOUT_LOG", str(path))
    monkeypatch.setenv("SANDLOOP_RUN_ID", "env-run")
    monkeypatch.setenv("SANDLOOP_TASK_SETS", "")
    monkeypatch.delenv("SANDLOOP_URL", raising=False)
    before = set(_common._scorers)
    yield path
    for key in set(_common._scorers) - before:
        _common._scorers.pop(key).close()


def test_trl_records_global_step_and_prompt_groups(tmp_path: Path) -> None:
    path = tmp_path / "trl.db"
    with Scorer(task_sets=(), slots=2, rollout_log=path, run_id="grpo") as scorer:
        f = sandloop_reward(scorer)
        assert trl_call(f, 3, ["sum", "sum", "echo", "echo"], [SUM, "print(0)", ECHO, ECHO],
                        [IO, IO, IO2, IO2]) == [1.0, 0.0, 1.0, 1.0]
        trl_call(f, 4, ["echo", "echo"], [ECHO, "print(1)"], [IO2, IO2])
    rows = logged(path)
    assert [r.step for r in rows] == [3, 3, 3, 3, 4, 4]
    assert {r.run_id for r in rows} == {"grpo"}
    assert [r.reward for r in rows] == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    g = [r.group for r in rows]
    assert g[0] == g[1] != g[2] == g[3] and g[4] == g[5] == g[2]  # one id per prompt
    assert rows[0].verdict == "passed" and rows[1].verdict == "wrong_answer"
    assert rows[0].completion == SUM and rows[0].hidden_total == 2


def test_without_a_step_nothing_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "none.db"
    with Scorer(task_sets=(), slots=1, rollout_log=path) as scorer:
        f = sandloop_reward(scorer)
        on_trainer_loop(f(prompts=["p"], completions=[ECHO], task_id=[IO2]))  # no trainer_state
        scorer.score([ScoreItem(label=IO2, completion=ECHO)])
    assert not path.exists() or logged(path) == []


def test_trl_remote_sends_step_run_and_groups_to_the_server(tmp_path: Path) -> None:
    cfg = ServerConfig(slots=2, task_sets=(), rollout_log=tmp_path / "server.db")
    with LiveServer(cfg) as srv:
        f = sandloop_reward(Scorer(url=srv.url, run_id="grpo-remote"))
        for step in range(3):
            trl_call(f, step, ["sum", "sum", "echo"], [SUM, SUM, ECHO], [IO, IO, IO2])
        data = httpx.get(f"{srv.url}/dashboard/data", params={"run": "grpo-remote"}).json()
    rows = logged(tmp_path / "server.db", "grpo-remote")
    assert [r.step for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert rows[0].group == rows[1].group != rows[2].group and rows[0].group is not None
    assert rows[0].group == rows[3].group  # the same prompt keeps its id from step to step
    # the live monitor waits one step for stragglers: step 0 is complete once step 2 arrives
    assert data["run"] == "grpo-remote" and [s["step"] for s in data["steps"]] == [0]
    assert data["steps"][0]["groups"] == 2  # the groups the adapter sent, not one per task


def test_verl_batch_and_per_sample_calls_are_recorded(env_scorers: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verl_adapter, "_batches", 0)
    # verl repeats a prompt's row rollout.n times with np.repeat: the n rollouts of a prompt
    # share one extra_info dict; its agent loop adds the weights' step as global_steps.
    info0 = {"index": 0, "split": "train", "global_steps": 5}
    info1 = {"index": 1, "split": "train", "global_steps": 5}
    infos = np.repeat(np.array([info0, info1], dtype=object), 2)
    outs = verl_adapter.compute_score_batch(
        data_sources=np.array(["codecontests"] * 4, dtype=object),
        solution_strs=[SUM, "print(0)", ECHO, ECHO], ground_truths=[IO, IO, IO2, IO2],
        extra_infos=infos)
    assert [o["score"] for o in outs] == [1.0, 0.0, 1.0, 1.0]
    # validation (split test) is scored but not recorded
    verl_adapter.compute_score_batch(data_sources=["x"], solution_strs=[ECHO],
                                     ground_truths=[IO2], extra_infos=[{"split": "test"}])
    # the batch reward manager without a step in extra_info: one call, one step
    verl_adapter.compute_score_batch(data_sources=["x", "x"], solution_strs=[ECHO, ECHO],
                                     ground_truths=[IO2, IO2],
                                     extra_infos=[{"index": 7}, {"index": 7}])
    # the naive (per-sample) reward manager
    out = verl_adapter.compute_score(data_source="x", solution_str=ECHO, ground_truth=IO2,
                                     extra_info={"index": 9, "global_steps": 6})
    assert out["score"] == 1.0
    rows = logged(env_scorers, "env-run")
    assert [(r.step, r.group) for r in rows] == [
        (5, "index:0"), (5, "index:0"), (5, "index:1"), (5, "index:1"),
        (0, "index:7"), (0, "index:7"), (6, "index:9")]
    assert [r.reward for r in rows[:4]] == [1.0, 0.0, 1.0, 1.0]


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        pytest.skip(f"{name} is not installed (make test installs it with --no-deps)")
    return Path(spec.origin).parent


def test_openrlhf_executor_calls_are_counted_into_steps(
        env_scorers: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _package_dir("openrlhf")
    pytest.importorskip("aiohttp")
    utils = types.ModuleType("openrlhf.utils")  # agent.py without the torch-importing __init__
    utils.__path__ = [str(root / "utils")]
    monkeypatch.setitem(sys.modules, "openrlhf.utils", utils)
    monkeypatch.delitem(sys.modules, "openrlhf.utils.agent", raising=False)
    agent = importlib.import_module("openrlhf.utils.agent")
    monkeypatch.setenv("SANDLOOP_ROLLOUTS_PER_STEP", "3")
    monkeypatch.setattr(openrlhf_adapter, "_clock", None)
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=openrlhf_adapter.__file__)
    prompts = ["<|im_start|>user\nsum<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\necho<|im_end|>\n<|im_start|>assistant\n"]

    async def generation_round(texts: list[tuple[int, str]]) -> list[Any]:
        # execute() scores each sample as it finishes: one reward_func call per query
        return list(await executor._fetch_rewards_via_func(
            [prompts[p] + t + "<|im_end|>" for p, t in texts], [prompts[p] for p, _ in texts],
            [[IO, IO2][p] for p, _ in texts]))

    asyncio.run(generation_round([(0, SUM), (0, "print(0)"), (1, ECHO)]))
    asyncio.run(generation_round([(1, ECHO), (1, "print(2)"), (0, SUM)]))
    rows = logged(env_scorers, "env-run")
    assert sorted(r.step for r in rows) == [0, 0, 0, 1, 1, 1]
    by_prompt = {(r.step, r.completion): r.group for r in rows}
    assert by_prompt[0, SUM] == by_prompt[0, "print(0)"] == by_prompt[1, SUM]
    assert by_prompt[0, ECHO] == by_prompt[1, ECHO] != by_prompt[0, SUM]


def test_step_clock_counts_rollouts_or_waits_for_a_pause() -> None:
    counted = StepClock(per_step=4)
    assert [counted.tick(2) for _ in range(5)] == [0, 0, 1, 1, 2]
    now = [0.0]
    timed = StepClock(gap_s=10, clock=lambda: now[0])
    steps = []
    for t in (0, 1, 2, 30, 31, 32, 33, 80):
        now[0] = t
        steps.append(timed.tick())
    assert steps == [0, 0, 0, 1, 1, 1, 1, 2]
    with pytest.raises(AdapterSettingError, match="positive integer"):
        StepClock(per_step=0)


def test_step_clock_setting_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDLOOP_ROLLOUTS_PER_STEP", "many")
    with pytest.raises(AdapterSettingError, match="SANDLOOP_ROLLOUTS_PER_STEP"):
        StepClock.from_env()


def test_run_groups_follow_trl_layout() -> None:
    chat = [{"role": "user", "content": "q"}]
    g = run_groups(["a", "a", "b", "b", "a", "a", chat, chat])
    assert g[0] == g[1] != g[2] == g[3]
    assert g[4] == g[5] == g[0] + "#2"  # the same prompt again later: another group
    assert g[6] == g[7] and g[6] not in g[:6]
    assert run_groups(["b"]) == [g[2]]  # stable across calls and processes


def test_concurrent_first_calls_start_one_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenRLHF scores each sample on its own thread: the first calls race to start the
    embedded engine, and only one may (the others would hold slots, never closed)."""
    from sandloop.integrations import scorer as scorer_module

    started: list[object] = []

    class CountedEngine(scorer_module.Engine):  # a real engine that counts its starts
        async def start(self) -> None:
            started.append(self)
            await super().start()

    monkeypatch.setattr(scorer_module, "Engine", CountedEngine)
    with Scorer(task_sets=(), slots=1) as scorer:
        threads = [threading.Thread(target=scorer.score,
                                    args=([ScoreItem(label=IO2, completion=ECHO)],))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert len(started) == 1
