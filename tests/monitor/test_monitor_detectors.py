"""Each detector on synthetic per-step series: fires on its event, stays quiet otherwise."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from sandloop.monitor.detectors import (
    AuditOutcome,
    Thresholds,
    detect_audit_failures,
    detect_diversity_collapse,
    detect_infra_degradation,
    detect_reward_drift,
    detect_signature_rise,
)
from sandloop.monitor.stats import StepStats, compute_step_stats

TH = Thresholds()
BASE = compute_step_stats(0, [])


def step(i: int, *, n: int = 256, mean: float = 0.5, std: float = 0.5, hacked: int = 0,
         infra: int = 0, diversity: float | None = 0.9) -> StepStats:
    return replace(BASE, step=i, rollouts=n, scored=n - infra, reward_mean=mean,
                   reward_std=std, hacked=hacked, infra_bad=infra, group_diversity=diversity,
                   verdicts={"passed": n // 2, "sandbox_error": infra},
                   signatures={"os_exit": hacked} if hacked else {})


def noisy_learning(steps: int, *, start: float = 0.2, end: float = 0.8, n: int = 256,
                   seed: int = 0) -> list[StepStats]:
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        p = start + (end - start) * i / (steps - 1)
        m = sum(rng.random() < p for _ in range(n)) / n
        out.append(step(i, n=n, mean=m, std=(m * (1 - m)) ** 0.5))
    return out


# --- reward_drift ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_drift_is_quiet_on_steady_learning(seed: int) -> None:
    series = noisy_learning(80, seed=seed)
    for i in range(1, len(series) + 1):
        assert detect_reward_drift(series[:i], TH) is None, i


def test_drift_fires_on_an_abrupt_jump_within_recent_steps() -> None:
    series = noisy_learning(40, start=0.3, end=0.4)
    jumped = series[:30] + [replace(s, reward_mean=(s.reward_mean or 0) + 0.4)
                            for s in series[30:]]
    fired = [i for i in range(1, 41) if detect_reward_drift(jumped[:i], TH) is not None]
    assert fired and fired[0] == 30 + TH.recent  # needs `recent` steps off the trend
    alert = detect_reward_drift(jumped[:33], TH)
    assert alert is not None and alert.code == "reward_drift" and "up" in alert.detail


def test_drift_needs_every_recent_step_on_the_same_side() -> None:
    series = noisy_learning(30, start=0.5, end=0.5)
    spiky = [*series[:27], replace(series[27], reward_mean=0.95), series[28],
             replace(series[29], reward_mean=0.95)]
    assert detect_reward_drift(spiky, TH) is None


def test_drift_waits_for_a_baseline() -> None:
    series = [step(i, mean=0.1) for i in range(4)] + [step(i, mean=0.9) for i in range(4, 7)]
    assert detect_reward_drift(series, TH) is None


# --- reward_hack_suspected (signatures) ------------------------------------------------------

def test_signature_rise_fires_on_a_rising_share_and_not_on_a_steady_one() -> None:
    steady = [step(i, hacked=5) for i in range(30)]
    assert all(detect_signature_rise(steady[:i], TH) is None for i in range(1, 31))
    rising = steady[:20] + [step(i, hacked=60) for i in range(20, 23)]
    alert = detect_signature_rise(rising, TH)
    assert alert is not None and alert.code == "reward_hack_suspected"
    assert "os_exit" in alert.detail


def test_signature_rise_ignores_a_rise_below_the_minimum_share() -> None:
    series = [step(i, hacked=0) for i in range(20)] + [step(i, hacked=8) for i in range(20, 23)]
    assert detect_signature_rise(series, TH) is None  # 3% < hack_min_share


# --- diversity_collapse ----------------------------------------------------------------------

def test_diversity_collapse() -> None:
    diverse = [step(i, diversity=0.85) for i in range(20)]
    assert detect_diversity_collapse(diverse, TH) is None
    collapsed = diverse + [step(i, diversity=0.05) for i in range(20, 23)]
    alert = detect_diversity_collapse(collapsed, TH)
    assert alert is not None and alert.code == "diversity_collapse"
    # a run that was never diverse did not collapse
    assert detect_diversity_collapse([step(i, diversity=0.1) for i in range(25)], TH) is None
    # groups of one (no diversity to measure) say nothing
    assert detect_diversity_collapse([step(i, diversity=None) for i in range(25)], TH) is None


# --- infra_degradation -----------------------------------------------------------------------

def test_infra_degradation() -> None:
    calm = [step(i, infra=3) for i in range(20)]
    assert detect_infra_degradation(calm, TH) is None
    bad = calm + [step(i, infra=80) for i in range(20, 23)]
    alert = detect_infra_degradation(bad, TH)
    assert alert is not None and alert.code == "infra_degradation"
    assert "sandbox_error" in alert.detail
    # a steady high failure rate is the host's normal, not a degradation
    assert detect_infra_degradation([step(i, infra=40) for i in range(25)], TH) is None


# --- reward_hack_suspected (audit) -----------------------------------------------------------

def outcome(step: int, train: float, audit: float | None) -> AuditOutcome:
    return AuditOutcome(step=step, task_id="t", completion_id=None, train_reward=train,
                        audit_reward=audit, audit_verdict="passed" if audit else "wrong_answer",
                        completion="import os\nos._exit(0)\n")


def test_audit_high_train_low_audit_is_an_alert_with_evidence() -> None:
    outcomes = [outcome(3, 1.0, 1.0)] * 4 + [outcome(3, 1.0, 0.0)] * 2 + [outcome(4, 1.0, 1.0)]
    alerts = detect_audit_failures(outcomes, TH)
    assert [(a.code, a.step) for a in alerts] == [("reward_hack_suspected", 3)]
    assert len(alerts[0].evidence) == 2 and alerts[0].evidence[0]["audit_reward"] == 0.0


def test_audit_null_and_low_train_rewards_count_neither_way() -> None:
    outcomes = [outcome(1, 1.0, None), outcome(1, 0.0, 0.0), outcome(1, 1.0, 1.0)]
    assert detect_audit_failures(outcomes, TH) == []
