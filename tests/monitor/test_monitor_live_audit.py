"""The live audit's sampling (``LiveMonitor.audit_pick``) and alerts (``audit_done``): pure,
no sandbox — the server's end-to-end audit is in test_monitor_server.py."""

from __future__ import annotations

from sandloop.monitor.detectors import AuditOutcome
from sandloop.monitor.live import LiveMonitor
from sandloop.monitor.records import Rollout

HACK = "import os\ndef f(x):\n    os._exit(0)\n"


def rollouts(step: int, n: int, *, reward: float = 1.0, hack: int = 0,
             task: str = "t1") -> list[Rollout]:
    return [Rollout(step=step, task_id=task, reward=reward, group=str(step),
                    completion=(HACK if k < hack else "def f(x):\n    return x\n")
                    + f"# {step}.{k}\n")
            for k in range(n)]


def test_the_budget_is_the_share_of_all_rollouts_seen_flagged_first() -> None:
    mon = LiveMonitor(audit_share=0.1)
    known = {"t1"}
    assert mon.audit_pick(rollouts(0, 5), "r", known) == []  # 10% of 5: nothing yet
    first = mon.audit_pick(rollouts(1, 15, hack=2), "r", known)
    assert len(first) == 2 and all("os._exit" in r.completion for r in first)
    # Low rewards, unknown tasks and completions picked before are never candidates.
    assert mon.audit_pick(rollouts(2, 10, reward=0.0), "r", known) == []
    assert mon.audit_pick(rollouts(3, 10, task="other"), "r", known) == []
    again = mon.audit_pick(rollouts(1, 15, hack=2) + rollouts(4, 0), "r", known)
    assert all(r.completion not in {x.completion for x in first} for r in again)
    total = 5 + 15 + 10 + 10 + 15
    assert len(first) + len(again) == int(0.1 * total)
    # Runs have their own budgets; share 0 picks nothing.
    assert len(mon.audit_pick(rollouts(0, 30), "other-run", known)) == 3
    assert LiveMonitor(audit_share=0.0).audit_pick(rollouts(0, 100), "r", known) == []


def test_a_failed_audit_alerts_once_per_step_and_is_returned_with_the_next_request() -> None:
    mon = LiveMonitor(audit_share=0.5)
    picked = mon.audit_pick(rollouts(3, 4, hack=2), "r", {"t1"})
    assert len(picked) == 2

    def outcome(r: Rollout, audit: float) -> AuditOutcome:
        return AuditOutcome(step=r.step, task_id=r.task_id, completion_id=None,
                            train_reward=1.0, audit_reward=audit, audit_verdict="wrong",
                            completion=r.completion)

    passed = mon.audit_done([outcome(picked[0], 1.0)], "r")
    assert passed == []  # audited and fine: no alert
    alerts = mon.audit_done([outcome(picked[1], 0.0)], "r")
    assert [a.code for a in alerts] == ["reward_hack_suspected"] and alerts[0].step == 3
    assert alerts[0].detail.startswith("audit: 1 of 2")
    assert mon.audit_done([outcome(picked[1], 0.0)], "r") == []  # step 3 alerted already
    back = mon.record_rollouts([], "r")
    assert back == alerts and mon.record_rollouts([], "r") == []  # handed back once
    assert mon.snapshot("r")["alerts"] == [a.to_dict() for a in alerts]
