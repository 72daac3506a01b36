"""The toy tasks and the hidden-test audit against real sandboxed scoring."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import pytest

from sandloop.integrations.scorer import ScoreItem, Scorer
from sandloop.train.audit import REWARD_HACK, AuditRow, HiddenTestAudit
from sandloop.train.curriculum import tier_of
from sandloop.train.toyset import build_toy_tasks, weaken

TASKS = build_toy_tasks()
SAMPLE = [next(t for t in TASKS if tier_of(t) == k) for k in (1, 2, 3)]


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


def _audit(scorer: Scorer, every: int) -> HiddenTestAudit:
    async def proper(pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        rs = await scorer.ascore([ScoreItem(label=tid, completion=c) for tid, c in pairs])
        return [r.reward for r in rs]

    return HiddenTestAudit(proper, every=every, sample=8, min_audited=1)


def test_audit_alerts_on_gamed_rewards_within_its_window(scorer: Scorer) -> None:
    audit = _audit(scorer, every=2)
    t = SAMPLE[2]
    gamed = [AuditRow(s, t.id, "def f(x): return 0", 1.0) for s in (0, 1)]
    assert asyncio.run(audit.observe(0, gamed[:1])) is None  # not an audit step
    record = asyncio.run(audit.observe(1, gamed[1:]))
    assert record is not None and record["alert"] is not None
    alert = record["alert"]
    assert alert["code"] == REWARD_HACK and alert["step"] == 1
    assert alert["evidence"][0]["audit_reward"] == 0.0


def test_audit_stays_quiet_on_honest_rewards(scorer: Scorer) -> None:
    audit = _audit(scorer, every=1)
    rows = [AuditRow(0, t.id, t.reference_solution or "", 1.0) for t in SAMPLE]
    record = asyncio.run(audit.observe(0, rows))
    assert record is not None and record["alert"] is None
    assert record["audit_reward_mean"] == 1.0
