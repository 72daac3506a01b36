"""Trainer adapters, called the way each trainer calls them (real sandboxes, real server)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "server"))

from live import LiveServer

from sandloop.integrations import Scorer
from sandloop.integrations import verl as verl_adapter
from sandloop.integrations.openrlhf import reward_func
from sandloop.integrations.trl import sandloop_reward
from sandloop.server import ServerConfig

SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
IO = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
HE0 = ("def has_close_elements(numbers, threshold):\n    return any(abs(a - b) < threshold "
       "for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")


def test_trl_async_reward_local() -> None:
    metrics: dict[str, float] = {}
    with Scorer(task_sets=("humaneval",), slots=2) as scorer:
        f = sandloop_reward(scorer)
        assert f.__name__ == "sandloop_reward"

        async def trainer_calls() -> list[float | None]:
            # As GRPOTrainer._calculate_rewards does: keyword arguments, dataset columns as lists.
            return await f(prompts=["p1", "p2", "p3"],
                           completions=[[{"role": "assistant", "content": SUM}], "print(0)",
                                        HE0],
                           completion_ids=[[1], [2], [3]], trainer_state=None,
                           log_extra=lambda *a: None,
                           log_metric=lambda k, v: metrics.__setitem__(k, v),
                           task_id=[IO, IO, "HumanEval/0"])

        assert asyncio.run(trainer_calls()) == [1.0, 0.0, 1.0]
    assert "sandloop/pass_fraction" in metrics


def test_scorer_runs_a_repeated_completion_once_within_and_across_calls() -> None:
    from sandloop.integrations import ScoreItem

    with Scorer(slots=2) as scorer:
        batch = [ScoreItem(label=IO, completion=c) for c in (SUM, "print(0)", SUM, SUM)]
        first = scorer.score(batch, step=0)
        assert [r.reward for r in first] == [1.0, 0.0, 1.0, 1.0]
        # One verification per distinct completion of the batch; a Python stdio task of up to
        # PLAIN_STDIO_MAX_TESTS tests runs each of its 2 tests as a plain program: 2 x 2 runs.
        assert scorer.runs == 4
        again = scorer.score([ScoreItem(label=IO, completion="print(0)"),
                              ScoreItem(label=IO, completion=SUM, completion_id="x")], step=1)
        assert scorer.runs == 4  # both answered by the cache
        assert [r.reward for r in again] == [0.0, 1.0] and again[1].completion_id == "x"
    with Scorer(slots=2, cache_size=0) as scorer:
        scorer.score(batch[:2])
        scorer.score(batch[:2])
        assert scorer.runs == 8  # no cache: the second call runs again


def test_verl_and_openrlhf_via_server(server: LiveServer, monkeypatch: Any) -> None:
    monkeypatch.setenv("SANDLOOP_URL", server.url)
    # verl NaiveRewardManager: compute_score(data_source=, solution_str=, ground_truth=, extra_info=)
    out = verl_adapter.compute_score(data_source="codecontests", solution_str=SUM,
                                     ground_truth=IO, extra_info={"index": 0})
    assert out["score"] == 1.0 and out["pass_fraction"] == 1.0
    # verl BatchRewardManager: plural keyword names.
    outs = verl_adapter.compute_score_batch(
        data_sources=["apps", "humaneval"], solution_strs=["print(1)", HE0],
        ground_truths=[IO, "HumanEval/0"], extra_infos=[{}, {}])
    assert [o["score"] for o in outs] == [0.0, 1.0]
    # OpenRLHF reward function file: reward_func(queries, prompts, labels).
    res = reward_func(queries=["Q:" + SUM + "<|im_end|>"], prompts=["Q:"], labels=[IO])
    assert list(res["rewards"]) == [1.0] and "pass_fraction" in res["extra_logs"]


def test_remote_scorer_uses_score_endpoint() -> None:
    with LiveServer(ServerConfig(slots=2, task_sets=())) as srv:
        s = Scorer(url=srv.url)
        (r,) = s.score([__import__("sandloop.integrations", fromlist=["ScoreItem"])
                        .ScoreItem(label=IO, completion=SUM)])
        assert r.reward == 1.0 and r.verdict.value == "passed"


def test_remote_scorer_with_the_server_down_says_so_in_one_error() -> None:
    # A port nothing listens on (bound, then closed): the adapters' remote client must raise
    # sandloop's own error naming the URL, not httpx's ConnectError.
    import socket

    from sandloop.errors import IntegrationError
    from sandloop.integrations.scorer import RemoteScoringError, ScoreItem, Scorer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scorer = Scorer(url=f"http://127.0.0.1:{port}", request_timeout_s=5)
    with pytest.raises(RemoteScoringError, match="cannot reach the sandloop server") as info:
        scorer.score([ScoreItem("HumanEval/0", "    return False\n")])
    assert isinstance(info.value, IntegrationError) and f":{port}/v1/score" in str(info.value)

    # The blocking call from code that runs an event loop (a sync reward function called by an
    # async trainer): the same error, not asyncio.run's "cannot be called from a running loop".
    async def from_a_loop() -> None:
        with pytest.raises(RemoteScoringError, match="cannot reach the sandloop server"):
            scorer.score([ScoreItem("HumanEval/0", "    return False\n")])

    asyncio.run(from_a_loop())
    scorer.close()


def test_server_and_adapters_log_the_same_figures(server: LiveServer, monkeypatch: Any) -> None:
    # One definition of the extra logs (reward/trainer_logs.py): POST /get_reward, OpenRLHF's
    # reward file, verl's compute_score_batch and TRL's batch means agree on the same samples:
    # all tests pass (fenced), half pass (unfenced), and a syntax error (compile_error).
    monkeypatch.setenv("SANDLOOP_URL", server.url)
    half = "a, b = map(int, input().split())\nprint(3)\n"  # right on "1 2", wrong on "3 4"
    broken = "```python\ndef has_close_elements(:\n```"
    prompts = ["Q1:", "Q2:", "Q3:"]
    completions = [SUM, half, broken]
    labels = [IO, IO, "HumanEval/0"]
    queries = [p + c + "<|im_end|>" for p, c in zip(prompts, completions, strict=True)]
    r = httpx.post(f"{server.url}/get_reward", timeout=60,
                   json={"query": queries, "prompts": prompts, "labels": labels})
    assert r.status_code == 200, r.text
    http = r.json()
    assert http["extra_logs"] == {"pass_fraction": [1.0, 0.5, 0.0],
                                  "compile_error": [0.0, 0.0, 1.0],
                                  "timeout": [0.0, 0.0, 0.0],
                                  "fenced_code": [1.0, 0.0, 1.0]}

    file_answer = reward_func(queries=queries, prompts=prompts, labels=labels)
    assert {k: [float(x) for x in v] for k, v in file_answer["extra_logs"].items()} \
        == http["extra_logs"]
    assert [float(x) for x in file_answer["rewards"]] == http["rewards"]

    outs = verl_adapter.compute_score_batch(data_sources=["x"] * 3, solution_strs=completions,
                                            ground_truths=labels, extra_infos=[{}] * 3)
    for key, values in http["extra_logs"].items():
        assert [o[key] for o in outs] == values, key

    metrics: dict[str, float] = {}
    with Scorer(url=server.url) as scorer:
        asyncio.run(sandloop_reward(scorer)(
            prompts=prompts, completions=completions, task_id=labels,
            log_metric=lambda k, v: metrics.__setitem__(k, v)))
    for key, values in http["extra_logs"].items():
        assert metrics[f"sandloop/{key}"] == pytest.approx(sum(values) / len(values)), key
    assert metrics["sandloop/infra_failures"] == 0.0


@pytest.mark.parametrize(("header", "seconds"), [
    (None, 1.0), ("2", 2.0), ("0.5", 0.5), ("-3", 0.0), ("1e9", 30.0), ("nan", 1.0),
    ("inf", 1.0), ("Wed, 21 Oct 2026 07:28:00 GMT", 1.0),
])
def test_retry_after_is_bounded_seconds(header: str | None, seconds: float) -> None:
    # A server's Retry-After (or a proxy's HTTP-date one) never makes the client sleep for ever
    # or crash on a header it cannot read.
    from sandloop.integrations.scorer import _retry_after_s

    assert _retry_after_s(header) == seconds
