"""The server's curriculum (/v1/tasks/sample, /v1/tasks/feedback) and the live monitor fed with
rollouts scored elsewhere (/v1/monitor/rollouts, what `sandloop train --server` posts), against
a real server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import httpx
import pytest
from live import LiveServer

from sandloop.monitor.records import Rollout
from sandloop.reward import CompletionResult
from sandloop.reward.scoring import Completion
from sandloop.server import ServerConfig
from sandloop.train.monitoring import LivePoster, RunMonitor
from sandloop.train.records import JsonlWriter
from sandloop.train.toyset import build_toy_tasks, toy_path

TOY = str(toy_path())
TRAIN = {t.id for t in build_toy_tasks() if t.split == "train"}


@pytest.fixture(scope="module")
def srv() -> Iterator[LiveServer]:
    with LiveServer(ServerConfig(slots=1, task_sets=("humaneval", TOY))) as s:
        yield s


def test_sample_and_feedback_steer_the_curriculum(srv: LiveServer) -> None:
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/tasks/sample", json={"task_set": TOY, "n": 50})
        assert r.status_code == 200, r.text
        ids = r.json()["task_ids"]
        assert len(ids) == 50 and set(ids) <= TRAIN  # the train split only
        a, b, d = sorted(set(ids))[:3]
        r = c.post("/v1/tasks/feedback", json={"task_set": TOY, "rewards": {
            a: [1.0] * 8, b: [0.0] * 8, d: [1.0, 0.0, None, 1.0]}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["kept"] == 1 and body["dropped"] == 2 and body["dropped_groups"] == 2
        assert body["tiers"]["saturated"] == 1 and body["tiers"]["unsolved"] == 1
        # a set without a train split: all its tasks
        r = c.post("/v1/tasks/sample", json={"task_set": "humaneval", "n": 3})
        assert r.status_code == 200 and all(t.startswith("HumanEval/")
                                            for t in r.json()["task_ids"])


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/v1/tasks/sample", {"task_set": "nope", "n": 1}, 400, "not served"),
    ("/v1/tasks/sample", {"task_set": TOY, "n": 0}, 422, "body.n"),
    ("/v1/tasks/feedback", {"task_set": TOY, "rewards": {"no/such": [1.0]}}, 400, "no/such"),
    ("/v1/tasks/feedback", {"task_set": TOY, "rewards": {}}, 422, "rewards"),
    ("/v1/monitor/rollouts", {"rollouts": [{"step": -1, "task_id": "t", "completion": "",
                                            "reward": 1}]}, 400, "rollouts[0]: field 'step'"),
    ("/v1/monitor/rollouts", {"alerts": [{"code": "made_up", "step": 1}]}, 422, "code"),
])
def test_bad_requests_are_refused_and_say_what(srv: LiveServer, path: str, body: dict[str, object],
                                           status: int, needle: str) -> None:
    r = httpx.post(srv.url + path, json=body, timeout=30)
    assert r.status_code == status, r.text
    assert needle in r.json()["error"]


def test_a_training_run_posts_its_steps_to_the_dashboard(srv: LiveServer, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def score(items: Sequence[Completion]) -> list[CompletionResult]:
        raise AssertionError("no audit in this test")

    poster = LivePoster(srv.url, "train-live")
    mon = RunMonitor(JsonlWriter(tmp_path / "alerts.jsonl"), score, known=frozenset(),
                     audit_every=1000, poster=poster)
    import asyncio

    for step in range(6):
        rs = [Rollout(step=step, task_id="toy/1", completion=f"print({k})",
                      reward=float(k % 2), group="g") for k in range(8)]
        asyncio.run(mon.observe_step(step, rs))
    mon.finish(None, {})
    assert poster.posted == 48 and poster.failures == 0
    data = httpx.get(srv.url + "/dashboard/data", params={"run": "train-live"}).json()
    # the run's end completes its last steps there (the server waits a step for stragglers)
    assert [s["step"] for s in data["steps"]] == [0, 1, 2, 3, 4, 5]
    assert data["steps"][0]["rollouts"] == 8 and data["steps"][0]["reward_mean"] == 0.5
    # an alert of the trainer's own audit shows on the dashboard and in /metrics
    r = httpx.post(srv.url + "/v1/monitor/rollouts", json={
        "run_id": "train-live", "alerts": [{"code": "reward_hack_suspected", "step": 5,
                                            "detail": "audit: 4 of 16 fail"}]})
    assert r.status_code == 200, r.text
    data = httpx.get(srv.url + "/dashboard/data", params={"run": "train-live"}).json()
    assert [a["code"] for a in data["alerts"]] == ["reward_hack_suspected"]
    metrics = httpx.get(srv.url + "/metrics").text
    assert 'sandloop_monitor_alerts_total{code="reward_hack_suspected",run="train-live"} 1.0' \
        in metrics


def test_a_server_that_is_gone_does_not_stop_training(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from live import free_port

    poster = LivePoster(f"http://127.0.0.1:{free_port()}", "gone", timeout_s=1.0)
    rs = [Rollout(step=0, task_id="t", completion="x", reward=1.0)]
    for _ in range(5):
        poster.post(rs)
    assert poster.failures == 3 and poster.posted == 0  # gave up after 3, no exception
    poster.close()
