"""The toy tasks, and the loop's monitoring (the monitor layer's detectors and hidden-test
audit, ``RunMonitor``) against real sandboxed scoring."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sandloop.curation.sampler import level_of
from sandloop.integrations.scorer import ScoreItem, Scorer
from sandloop.monitor.detectors import Thresholds
from sandloop.monitor.records import Rollout
from sandloop.reward import CompletionResult
from sandloop.reward.scoring import Completion
from sandloop.train.monitoring import RunMonitor
from sandloop.train.records import JsonlWriter
from sandloop.train.toyset import build_toy_tasks, weaken

TASKS = build_toy_tasks()
SAMPLE = [next(t for t in TASKS if level_of(t) == k) for k in (1, 2, 3)]


@pytest.fixture(scope="module")
def scorer() -> Iterator[Scorer]:
    with Scorer(tasks=[*SAMPLE, *(weaken(t) for t in SAMPLE)], slots=2) as s:
        yield s


def test_references_pass_and_wrong_programs_fail(scorer: Scorer) -> None:
    refs = [ScoreItem(label=t.id, completion=t.reference_solution or "") for t in SAMPLE]
    assert [r.reward for r in scorer.score(refs)] == [1.0, 1.0, 1.0]
    wrong = ["print(1234)", "print(1234)", "def f(x): return 0"]
    rs = scorer.score([ScoreItem(label=t.id, completion=w) for t, w in zip(SAMPLE, wrong,
                                                                         strict=True)])
    assert [r.reward for r in rs] == [0.0, 0.0, 0.0]


def test_weak_twins_reward_any_program_that_runs(scorer: Scorer) -> None:
    runs = ["print(1234)", "print(1234)", "def f(x): return 0"]
    crash = ["print(", "1/0", "def f(x): return x/0"]
    ok = scorer.score([ScoreItem(label="weak:" + t.id, completion=c)
                       for t, c in zip(SAMPLE, runs, strict=True)])
    bad = scorer.score([ScoreItem(label="weak:" + t.id, completion=c)
                        for t, c in zip(SAMPLE, crash, strict=True)])
    assert [r.reward for r in ok] == [1.0, 1.0, 1.0]
    assert [r.reward for r in bad] == [0.0, 0.0, 0.0]


def _monitor(scorer: Scorer, out: Path, every: int) -> RunMonitor:
    async def proper(items: Sequence[Completion]) -> list[CompletionResult]:
        return await scorer.ascore([ScoreItem(label=c.task_id, completion=c.completion)
                                    for c in items])

    return RunMonitor(JsonlWriter(out / "alerts.jsonl"), proper,
                      known=frozenset(t.id for t in SAMPLE), audit_every=every, audit_sample=8,
                      thresholds=Thresholds(audit_min_failures=2))


def _rollouts(step: int, texts: Sequence[str], reward: float) -> list[Rollout]:
    t = SAMPLE[2]
    return [Rollout(step=step, task_id=t.id, completion=c, reward=reward, group=str(step))
            for c in texts]


def test_audit_alerts_on_gamed_rewards_at_its_audit_step(scorer: Scorer, tmp_path: Path) -> None:
    mon = _monitor(scorer, tmp_path, every=2)
    gamed = [f"def f(x): return {k}" for k in range(4)]  # runs, and is wrong
    assert asyncio.run(mon.observe_step(0, _rollouts(0, gamed, 1.0))) == {}  # no audit yet
    row = asyncio.run(mon.observe_step(1, _rollouts(1, gamed[::-1], 1.0)))
    assert row["audited"] == 4 and row["audit_failures"] == 4 and row["audit_reward_mean"] == 0
    audit = [a for a in mon.alerts if a.code == "reward_hack_suspected"]
    assert len(audit) == 1 and audit[0].step == 1
    assert all(e["audit_reward"] < e["train_reward"] for e in audit[0].evidence)
    # an audit alert is raised once per episode, not at every audit
    asyncio.run(mon.observe_step(2, _rollouts(2, gamed, 1.0)))
    asyncio.run(mon.observe_step(3, _rollouts(3, gamed, 1.0)))
    assert len([a for a in mon.alerts if a.code == "reward_hack_suspected"]) == 1
    mon.alerts_out.close()
    lines = [json.loads(x) for x in (tmp_path / "alerts.jsonl").read_text().splitlines()]
    assert [a["step"] for a in lines if a["code"] == "reward_hack_suspected"] == [1]
    report = tmp_path / "report.html"
    result = mon.finish(report, {})
    assert len(result.steps) == 4 and "reward_hack_suspected" in report.read_text()


def test_audit_stays_quiet_on_honest_rewards(scorer: Scorer, tmp_path: Path) -> None:
    mon = _monitor(scorer, tmp_path, every=1)
    rows = [Rollout(step=0, task_id=t.id, completion=t.reference_solution or "", reward=1.0)
            for t in SAMPLE]
    row = asyncio.run(mon.observe_step(0, rows))
    assert row["audited"] == 3 and row["audit_reward_mean"] == 1.0
    assert row["audit_failures"] == 0 and mon.alerts == []
