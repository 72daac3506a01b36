"""The monitor of a running service: rollouts recorded as scores come back, per run.

``LiveMonitor.record`` takes the scored completions of one request with their training step;
each run (``run_id``) has its own streaming ``Monitor`` (``lag=1``: a trainer's requests for one
step may still be in flight when the next step's first one arrives). Completed steps update the
Prometheus gauges and the dashboard's data; rollouts go to the SQLite rollout log when one is
configured.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandloop.monitor.analysis import Monitor
from sandloop.monitor.capture import rollouts_of
from sandloop.monitor.detectors import ALERT_CODES, Alert, Thresholds
from sandloop.monitor.records import Rollout
from sandloop.monitor.rolloutlog import RolloutLog
from sandloop.monitor.stats import Scanner, StepStats
from sandloop.reward.verifier import CompletionResult

__all__ = ["LiveMonitor", "MonitorMetrics"]

MAX_RUNS = 64  # runs kept in memory (oldest dropped): the dashboard is for runs in progress


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
                 scanner: Scanner | None = None) -> None:
        """``scanner``: finds hack signatures (a ``signatures.TaskScanner`` over the tasks
        the service knows, so that ``hardcoded_outputs`` sees their tests; None: ``scan``)."""
        self.scanner = scanner
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
                del self._runs[next(iter(self._runs))]
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
            return raised + mon.flush() if final else raised

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
