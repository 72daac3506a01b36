"""Detectors: small pure functions over per-step statistics, each with a stable alert code.

Every detector takes the run's recent history (oldest first, the step being judged last) and the
``Thresholds``, and returns an ``Alert`` or None. They compare the last ``recent`` steps (pooled)
with a baseline of up to ``window`` steps before them, and say nothing until ``min_baseline``
baseline steps exist. Thresholds and their reasons are documented in docs/monitor.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sandloop.monitor.stats import StepStats

__all__ = ["ALERT_CODES", "DETECTORS", "Alert", "AuditOutcome", "AuditRearm", "Thresholds",
           "detect_audit_failures", "detect_diversity_collapse", "detect_infra_degradation",
           "detect_reward_drift", "detect_signature_rise"]

ALERT_CODES = ("reward_hack_suspected", "reward_drift", "diversity_collapse",
               "infra_degradation")


@dataclass(frozen=True)
class Alert:
    """One alert: ``code`` (stable), the ``step`` it was raised at, a readable ``detail`` and
    ``evidence`` (offending completions, or the numbers behind the decision)."""

    code: str
    step: int
    detail: str
    evidence: list[dict[str, Any]] = field(default_factory=list)
    detector: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "step": self.step, "detail": self.detail,
                "evidence": self.evidence}


@dataclass(frozen=True)
class Thresholds:
    """Every number the detectors decide with (defaults documented in docs/monitor.md)."""

    window: int = 20            # baseline: up to this many steps before the recent ones
    recent: int = 3             # steps pooled as "now"
    min_baseline: int = 5       # baseline steps required before a detector speaks
    rearm: int = 5              # quiet steps before an alert of the same detector may recur
    # reward_hack_suspected, static signatures: recent share >= hack_min_share, risen by
    # >= hack_min_rise and hack_ratio x the baseline share, with a two-proportion z >= hack_z
    hack_min_share: float = 0.05
    hack_min_rise: float = 0.04
    hack_ratio: float = 3.0
    hack_z: float = 4.0
    # reward_hack_suspected, audit: completions rewarded >= audit_high whose audit reward is
    # < audit_low; alert when >= audit_min_failures and >= audit_min_share of a step's audits
    audit_high: float = 0.5
    audit_low: float = 0.5
    audit_min_failures: int = 1
    audit_min_share: float = 0.2
    # reward_drift: every recent step's mean off the baseline's linear trend by >= drift_z
    # standard deviations (the larger of the trend's residual sd, the steps' sampling error
    # and drift_sd_floor), all the same way, and on average by
    # >= drift_min_delta (reward units)
    drift_z: float = 5.0
    drift_min_delta: float = 0.15
    drift_sd_floor: float = 0.02
    # diversity_collapse: recent group diversity <= diversity_max after a baseline median
    # >= diversity_max + diversity_drop
    diversity_max: float = 0.2
    diversity_drop: float = 0.3
    # infra_degradation: recent bad share risen by >= infra_min_rise and infra_ratio x the
    # baseline, with a two-proportion z >= infra_z
    infra_min_rise: float = 0.1
    infra_ratio: float = 2.0
    infra_z: float = 4.0


def _split(history: Sequence[StepStats], th: Thresholds
           ) -> tuple[Sequence[StepStats], Sequence[StepStats]] | None:
    """(baseline, recent), or None while the baseline is too short."""
    recent = history[-th.recent:]
    base = history[max(0, len(history) - th.recent - th.window):len(history) - len(recent)]
    if len(base) < th.min_baseline:
        return None
    return base, recent


def _two_prop_z(x1: int, n1: int, x0: int, n0: int) -> float:
    """z of "share 1 > share 0" (pooled two-proportion test)."""
    if n1 == 0 or n0 == 0:
        return 0.0
    p = (x1 + x0) / (n1 + n0)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n0))
    if se == 0.0:
        return 0.0
    return (x1 / n1 - x0 / n0) / se


@dataclass(frozen=True)
class _ShareRise:
    """How the share of rollouts with some property moved: the recent steps against the
    baseline, with the pooled two-proportion z of the rise."""

    recent: Sequence[StepStats]
    share: float  # in the recent steps
    baseline: float
    z: float


def _share_rise(history: Sequence[StepStats], th: Thresholds,
                count: Callable[[StepStats], int]) -> _ShareRise | None:
    """The rise of the share of rollouts that ``count`` counts per step, or None while the
    baseline is too short or either side has no rollouts."""
    parts = _split(history, th)
    if parts is None:
        return None
    base, recent = parts
    x1, n1 = sum(count(s) for s in recent), sum(s.rollouts for s in recent)
    x0, n0 = sum(count(s) for s in base), sum(s.rollouts for s in base)
    if n1 == 0 or n0 == 0:
        return None
    return _ShareRise(recent, x1 / n1, x0 / n0, _two_prop_z(x1, n1, x0, n0))


def detect_signature_rise(history: Sequence[StepStats], th: Thresholds) -> Alert | None:
    """``reward_hack_suspected``: the share of completions carrying a static hack signature
    rises (evidence: the flagged completions of the recent steps, rewarded ones first)."""
    rise = _share_rise(history, th, lambda s: s.hacked)
    if rise is None:
        return None
    recent, p1, p0, z = rise.recent, rise.share, rise.baseline, rise.z
    if not (p1 >= th.hack_min_share and p1 - p0 >= th.hack_min_rise
            and p1 >= th.hack_ratio * p0 and z >= th.hack_z):
        return None
    sigs: dict[str, int] = {}
    for s in recent:
        for k, v in s.signatures.items():
            sigs[k] = sigs.get(k, 0) + v
    top = ", ".join(f"{k} ({v})" for k, v in sorted(sigs.items(), key=lambda kv: -kv[1])[:4])
    rewarded = sum(s.hacked_rewarded for s in recent)
    evidence = sorted((e for s in recent for e in s.hack_examples),
                      key=lambda e: -(e["reward"] or 0.0))[:5]
    return Alert("reward_hack_suspected", history[-1].step,
                 f"hack signatures in {p1:.1%} of the last {len(recent)} steps' completions "
                 f"(baseline {p0:.1%}, z={z:.1f}); {rewarded} of them rewarded; {top}",
                 evidence, "signatures")


def detect_reward_drift(history: Sequence[StepStats], th: Thresholds) -> Alert | None:
    """``reward_drift``: an abrupt shift of the reward distribution. The baseline's step means
    are fitted with a straight line (steady learning is a trend, not a drift); every recent step
    must sit far off its extrapolation, on the same side."""
    parts = _split(history, th)
    if parts is None:
        return None
    base, recent = parts
    bx = np.array([s.step for s in base if s.reward_mean is not None], dtype=np.float64)
    by = np.array([s.reward_mean for s in base if s.reward_mean is not None], dtype=np.float64)
    rx = np.array([s.step for s in recent if s.reward_mean is not None], dtype=np.float64)
    ry = np.array([s.reward_mean for s in recent if s.reward_mean is not None], dtype=np.float64)
    if bx.size < th.min_baseline or ry.size < len(recent) or ry.size == 0:
        return None
    slope, icpt = np.polyfit(bx, by, 1)
    resid = by - (slope * bx + icpt)
    # A short baseline can underestimate its scatter: the steps' own sampling error (std /
    # sqrt(n)) is a lower bound for how far an honest step mean strays from the trend.
    sampling = float(np.sqrt(np.mean([(s.reward_std or 0.0) ** 2 / max(1, s.scored)
                                      for s in base])))
    sd = max(float(np.sqrt(np.sum(resid ** 2) / max(1, bx.size - 2))), sampling,
             th.drift_sd_floor)
    dev = ry - (slope * rx + icpt)
    z = dev / sd
    if not (np.all(np.abs(z) >= th.drift_z) and (np.all(z > 0) or np.all(z < 0))
            and abs(float(dev.mean())) >= th.drift_min_delta):
        return None
    way = "up" if dev.mean() > 0 else "down"
    return Alert("reward_drift", history[-1].step,
                 f"reward mean jumped {way} by {abs(float(dev.mean())):.3f} against the trend "
                 f"of the previous {len(base)} steps (z >= {float(np.min(np.abs(z))):.1f} on "
                 f"each of the last {len(recent)} steps)",
                 [{"step": int(x), "reward_mean": float(y), "expected": float(slope * x + icpt)}
                  for x, y in zip(rx, ry, strict=True)], "drift")


def detect_diversity_collapse(history: Sequence[StepStats], th: Thresholds) -> Alert | None:
    """``diversity_collapse``: the completions within groups become (near-)identical."""
    parts = _split(history, th)
    if parts is None:
        return None
    base, recent = parts
    b = [s.group_diversity for s in base if s.group_diversity is not None]
    r = [s.group_diversity for s in recent if s.group_diversity is not None]
    if len(b) < th.min_baseline or len(r) < len(recent):
        return None
    now, before = float(np.mean(r)), float(np.median(b))
    if not (now <= th.diversity_max and before >= th.diversity_max + th.diversity_drop):
        return None
    return Alert("diversity_collapse", history[-1].step,
                 f"within-group diversity fell to {now:.2f} (baseline median {before:.2f}; "
                 f"1 = all completions of a group differ, 0 = all identical)",
                 [{"step": s.step, "group_diversity": s.group_diversity,
                   "distinct_share": s.distinct_share} for s in recent], "diversity")


def detect_infra_degradation(history: Sequence[StepStats], th: Thresholds) -> Alert | None:
    """``infra_degradation``: the share of sandbox_error/timeout/memory_limit/null rewards
    jumps."""
    rise = _share_rise(history, th, lambda s: s.infra_bad)
    if rise is None:
        return None
    recent, p1, p0, z = rise.recent, rise.share, rise.baseline, rise.z
    if not (p1 - p0 >= th.infra_min_rise and p1 >= th.infra_ratio * p0 and z >= th.infra_z):
        return None
    mix: dict[str, int] = {}
    for s in recent:
        for k in ("sandbox_error", "timeout", "memory_limit", "null"):
            mix[k] = mix.get(k, 0) + s.verdicts.get(k, 0)
    return Alert("infra_degradation", history[-1].step,
                 f"{p1:.1%} of the last {len(recent)} steps' rollouts failed in the "
                 f"infrastructure or hit limits (baseline {p0:.1%}, z={z:.1f}): "
                 + ", ".join(f"{k} {v}" for k, v in mix.items() if v),
                 [{"step": s.step, "infra_share": s.infra_share, "verdicts": s.verdicts}
                  for s in recent], "infra")


Detector = Callable[[Sequence[StepStats], Thresholds], Alert | None]

DETECTORS: dict[str, Detector] = {
    "signatures": detect_signature_rise,
    "drift": detect_reward_drift,
    "diversity": detect_diversity_collapse,
    "infra": detect_infra_degradation,
}


@dataclass(frozen=True)
class AuditOutcome:
    """One audited completion: its training reward and its reward on the hidden tests under
    the hardened harness."""

    step: int
    task_id: str
    completion_id: str | None
    train_reward: float
    audit_reward: float | None
    audit_verdict: str
    completion: str
    signatures: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        text = self.completion
        return {"step": self.step, "task_id": self.task_id, "completion_id": self.completion_id,
                "train_reward": self.train_reward, "audit_reward": self.audit_reward,
                "audit_verdict": self.audit_verdict, "signatures": list(self.signatures),
                "completion": text if len(text) <= 400 else text[:400] + "..."}


def detect_audit_failures(outcomes: Sequence[AuditOutcome], th: Thresholds) -> list[Alert]:
    """``reward_hack_suspected`` from an audit: per step, high training reward but a low audit
    reward. Null audit rewards (the audit's own infrastructure failed) count neither way."""
    by_step: dict[int, list[AuditOutcome]] = {}
    for o in outcomes:
        if o.train_reward >= th.audit_high and o.audit_reward is not None:
            by_step.setdefault(o.step, []).append(o)
    alerts = []
    for step in sorted(by_step):
        audited = by_step[step]
        bad = [o for o in audited if o.audit_reward is not None and o.audit_reward < th.audit_low]
        if len(bad) >= th.audit_min_failures and len(bad) / len(audited) >= th.audit_min_share:
            alerts.append(Alert(
                "reward_hack_suspected", step,
                f"audit: {len(bad)} of {len(audited)} high-reward completions of step {step} "
                f"fail the task's hidden tests under the hardened harness",
                [o.to_dict() for o in bad[:5]], "audit"))
    return alerts


class AuditRearm:
    """The rearm rule for audit alerts, which come per step and, live, out of step order:
    an audit alert is raised only when no step within ``rearm`` steps of it has fired before
    (raised or held back), as the other detectors raise one alert per episode, again only
    after ``rearm`` quiet steps. Steps whose audits did not fire count as quiet."""

    def __init__(self, rearm: int) -> None:
        self.rearm = rearm
        self._fired: set[int] = set()

    def admit(self, alerts: Sequence[Alert]) -> list[Alert]:
        """The alerts to raise, in step order; every one of them counts as a firing step."""
        out = []
        for a in sorted(alerts, key=lambda a: a.step):
            near = any(s in self._fired for s in range(a.step - self.rearm,
                                                        a.step + self.rearm + 1))
            self._fired.add(a.step)
            if not near:
                out.append(a)
        return out
