"""The monitor of a running service: rollouts recorded as scores come back, per run.

``LiveMonitor.record`` takes the scored completions of one request with their training step;
each run (``run_id``) has its own streaming ``Monitor`` (``lag=1``: a trainer's requests for one
step may still be in flight when the next step's first one arrives). Completed steps update the
Prometheus gauges and the dashboard's data; rollouts go to the SQLite rollout log when one is
configured.

Rollouts scored elsewhere (posted by a trainer with its own rewards) can also be audited live:
``audit_pick`` draws, per request, the distinct high-reward completions of known tasks that the
audit budget allows (``audit_share`` of the run's rollouts so far, signature-flagged ones
first); the caller scores them on the hidden tests and hands the outcomes to ``audit_done``,
whose alerts join the run's (and are returned by its next ``record_rollouts``).
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandloop.monitor.analysis import Monitor
from sandloop.monitor.capture import rollouts_of
from sandloop.monitor.detectors import (
    ALERT_CODES,
    Alert,
    AuditOutcome,
    AuditRearm,
    Thresholds,
    detect_audit_failures,
)
from sandloop.monitor.records import Rollout
from sandloop.monitor.rolloutlog import RolloutLog
from sandloop.monitor.signatures import scan_cached
from sandloop.monitor.stats import Scanner, StepStats
from sandloop.reward.verifier import CompletionResult

__all__ = ["LiveMonitor", "MonitorMetrics"]

MAX_RUNS = 64  # runs kept in memory (oldest dropped): the dashboard is for runs in progress


@dataclass
class _RunAudit:
    """A run's live audit: its budget so far and the outcomes per step."""

    seed: str
    seen: int = 0
    picked: int = 0
    keys: set[tuple[str, str]] = field(default_factory=set)  # (task, sha256) picked already
    outcomes: dict[int, list[AuditOutcome]] = field(default_factory=dict)
    alerted: set[int] = field(default_factory=set)  # steps whose audits fired (raised or not)
    pending: list[Alert] = field(default_factory=list)  # for the run's next record_rollouts
    rearm: int = 5

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.rearmed = AuditRearm(self.rearm)


class MonitorMetrics:
    """Per-step reward and detector series for Prometheus (labelled by run)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def g(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["run"], registry=registry)

        self.step = g("sandloop_monitor_step", "Last completed training step")
        self.reward_mean = g("sandloop_monitor_reward_mean", "Reward mean of the last step")
        self.reward_std = g("sandloop_monitor_reward_std", "Reward std of the last step")
        self.pass_rate = g("sandloop_monitor_pass_rate", "Share of passed rollouts, last step")
        self.hack_share = g("sandloop_monitor_hack_signature_share",
                            "Share of the last step's completions with a hack signature")
        self.infra_share = g("sandloop_monitor_infra_share",
                             "Share of sandbox_error/timeout/memory_limit/null, last step")
        self.diversity = g("sandloop_monitor_group_diversity",
                           "Within-group diversity of the last step (1 all differ, 0 identical)")
        self.zero_var = g("sandloop_monitor_zero_variance_group_share",
                          "Share of groups whose rewards are all equal, last step")
        self.alerts = Counter("sandloop_monitor_alerts", "Alerts raised", ["run", "code"],
                              registry=registry)
        self.rewards = Histogram("sandloop_monitor_reward", "Rewards of recorded rollouts",
                                 ["run"], buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8,
                                                   0.9, 0.99, 1.0), registry=registry)
        self.rollouts = Counter("sandloop_monitor_rollouts", "Rollouts recorded", ["run"],
                                registry=registry)

    def on_step(self, run: str, s: StepStats) -> None:
        self.step.labels(run).set(s.step)
        if s.reward_mean is not None:
            self.reward_mean.labels(run).set(s.reward_mean)
            self.reward_std.labels(run).set(s.reward_std or 0.0)
        self.pass_rate.labels(run).set(s.pass_rate)
        self.hack_share.labels(run).set(s.hack_share)
        self.infra_share.labels(run).set(s.infra_share)
        if s.group_diversity is not None:
            self.diversity.labels(run).set(s.group_diversity)
        self.zero_var.labels(run).set(s.zero_var_share)

    def on_alert(self, run: str, a: Alert) -> None:
        self.alerts.labels(run, a.code).inc()


class LiveMonitor:
    """Thread-safe: handlers record from the event loop, readers poll from anywhere."""

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 log_path: Path | None = None, thresholds: Thresholds | None = None,
                 scanner: Scanner | None = None, audit_share: float = 0.1) -> None:
        """``scanner``: finds hack signatures (a ``signatures.TaskScanner`` over the tasks
        the service knows, so that ``hardcoded_outputs`` sees their tests; None: ``scan``).
        ``audit_share``: the most of a run's rollouts ``audit_pick`` hands out (0: none)."""
        if not 0.0 <= audit_share <= 1.0:
            raise ValueError(f"audit_share {audit_share} must be within [0, 1]")
        self.scanner = scanner
        self.audit_share = audit_share
        self._audits: dict[str, _RunAudit] = {}
        self.metrics = MonitorMetrics(registry) if registry is not None else None
        self.log = RolloutLog(log_path) if log_path is not None else None
        self.thresholds = thresholds
        self._runs: dict[str, Monitor] = {}
        self._lock = threading.Lock()
        if self.metrics is not None:
            for code in ALERT_CODES:  # every code visible (at 0) before its first alert
                self.metrics.alerts.labels("default", code)

    def _monitor(self, run: str) -> Monitor:
        mon = self._runs.get(run)
        if mon is None:
            if len(self._runs) >= MAX_RUNS:
                oldest = next(iter(self._runs))
                del self._runs[oldest]
                self._audits.pop(oldest, None)
            m = self.metrics
            mon = Monitor(self.thresholds, lag=1, scanner=self.scanner,
                          on_step=(lambda s: m.on_step(run, s)) if m else None,
                          on_alert=(lambda a: m.on_alert(run, a)) if m else None)
            self._runs[run] = mon
        return mon

    def record(self, results: Sequence[CompletionResult], completions: Sequence[str], *,
               step: int, group: str | None = None, run_id: str | None = None,
               tasks: dict[str, Any] | None = None,
               groups: Sequence[str | None] | None = None) -> list[Alert]:
        """Record one request's scored completions (same order); returns new alerts.

        ``groups`` gives each completion its group (None: ``group``); ``group`` defaults to the
        task id (the rollouts of one prompt); ``tasks`` (id -> Task) supplies each task's
        difficulty and data source.
        """
        run = run_id or "default"
        gs = ([g if g is not None else group for g in groups] if groups is not None
              else [group] * len(results))
        rollouts = rollouts_of(results, completions, step=step, groups=gs, run_id=run,
                               tasks=tasks)
        return self.record_rollouts(rollouts, run)

    def record_rollouts(self, rollouts: Sequence[Rollout], run_id: str | None = None, *,
                        alerts: Sequence[Alert] = (), final: bool = False) -> list[Alert]:
        """Record rollouts scored elsewhere (a trainer posting its own, e.g. ``sandloop
        train --server``) and alerts its own monitor raised (shown with the run's, counted in
        the metrics); ``final``: the run is over, complete its open steps. Returns the alerts
        the detectors raised here."""
        run = run_id or "default"
        if self.log is not None and rollouts:
            self.log.append(rollouts, run)
        with self._lock:
            mon = self._monitor(run)
            for a in alerts:
                mon.alerts.append(a)
                if self.metrics is not None:
                    self.metrics.on_alert(run, a)
            if self.metrics is not None:
                self.metrics.rollouts.labels(run).inc(len(rollouts))
                for r in rollouts:
                    if r.reward is not None:
                        self.metrics.rewards.labels(run).observe(r.reward)
            raised = mon.add_many(rollouts)
            if final:
                raised += mon.flush()
            audit = self._audits.get(run)
            if audit is not None and audit.pending:
                raised, audit.pending = audit.pending + raised, []
            return raised

    def audit_pick(self, rollouts: Sequence[Rollout], run_id: str | None,
                   known: Container[str]) -> list[Rollout]:
        """The rollouts of one request to audit now: distinct completions rewarded at least
        ``thresholds.audit_high`` whose task is in ``known``, within the run's budget
        (``audit_share`` of all its rollouts so far, less those already picked),
        signature-flagged first, the rest drawn at random (seeded by the run's name)."""
        run = run_id or "default"
        th = self.thresholds or Thresholds()
        with self._lock:
            st = self._audits.get(run)
            if st is None:
                st = self._audits[run] = _RunAudit(run, rearm=th.rearm)
            st.seen += len(rollouts)
            budget = int(self.audit_share * st.seen) - st.picked
            if budget <= 0:
                return []
            flagged: list[tuple[tuple[str, str], Rollout]] = []
            plain: list[tuple[tuple[str, str], Rollout]] = []
            keys: set[tuple[str, str]] = set()
            for r in rollouts:
                if r.reward is None or r.reward < th.audit_high or r.task_id not in known:
                    continue
                key = (r.task_id, hashlib.sha256(r.completion.encode()).hexdigest())
                if key in st.keys or key in keys:
                    continue
                keys.add(key)
                found = (self.scanner(r.task_id, r.completion) if self.scanner is not None
                         else scan_cached(r.completion))
                (flagged if found else plain).append((key, r))
            st.rng.shuffle(plain)
            chosen = (flagged + plain)[:budget]
            st.picked += len(chosen)
            st.keys.update(k for k, _ in chosen)
            return [r for _, r in chosen]

    def audit_done(self, outcomes: Sequence[AuditOutcome], run_id: str | None) -> list[Alert]:
        """Outcomes of audits ``audit_pick`` handed out: the alerts they raise (at most one
        per step, and none within ``thresholds.rearm`` steps of a step whose audits failed
        before), added to the run's alerts and returned by its next ``record_rollouts``."""
        run = run_id or "default"
        th = self.thresholds or Thresholds()
        with self._lock:
            st = self._audits.get(run)
            if st is None:  # the run was dropped meanwhile
                return []
            for o in outcomes:
                st.outcomes.setdefault(o.step, []).append(o)
            steps = {o.step for o in outcomes} - st.alerted
            fired = detect_audit_failures(
                [o for s in sorted(steps) for o in st.outcomes[s]], th)
            st.alerted.update(a.step for a in fired)
            # A sustained hack fails the audits of step after step: one alert per episode.
            alerts = st.rearmed.admit(fired)
            mon = self._monitor(run)
            for a in alerts:
                mon.alerts.append(a)
                if self.metrics is not None:
                    self.metrics.on_alert(run, a)
            st.pending += alerts
            return alerts

    def run_names(self) -> list[str]:
        """The runs watched now, oldest first."""
        with self._lock:
            return list(self._runs)

    def snapshot(self, run: str | None = None, since: int = -1) -> dict[str, Any]:
        """The dashboard's data: the runs, and for ``run`` (default: the latest) its steps
        after ``since`` and all its alerts."""
        with self._lock:
            runs = list(self._runs)
            name = run if run is not None else (runs[-1] if runs else None)
            mon = self._runs.get(name) if name is not None else None
            steps = [s.to_dict() for s in mon.steps if s.step > since] if mon else []
            for s in steps:
                s.pop("hack_examples", None)
            alerts = [a.to_dict() for a in mon.alerts] if mon else []
        return {"runs": runs, "run": name, "steps": steps, "alerts": alerts}

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
