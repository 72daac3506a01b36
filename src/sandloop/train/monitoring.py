"""The loop's reward monitoring: the monitor layer's ``Monitor`` and hidden-test audit on every
step, alerts to ``alerts.jsonl``, the HTML report at the end, live figures to a server.

* Every rollout goes through a streaming :class:`~sandloop.monitor.Monitor` (per-step
  statistics; the detectors ``reward_hack_suspected`` by hack signatures, ``reward_drift``,
  ``diversity_collapse``, ``infra_degradation``).
* Every ``audit_every`` steps an audit (:mod:`sandloop.monitor.audit`) re-scores up to
  ``audit_sample`` distinct high-reward completions of the last ``audit_every`` steps
  (signature-flagged ones first) on the real task's hidden tests; the monitor's
  ``detect_audit_failures`` decides on the pooled window, so the alert carries the audit step.
  An audit alert is raised once per episode: again only after an audit that did not fire.
* With a server URL the step's rollouts (and audit alerts) are posted to
  ``POST /v1/monitor/rollouts``: the server's ``/dashboard`` and ``/metrics`` show the run live.

Torch-free (the loop itself needs the ``train`` extra; this does not).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sandloop.monitor.analysis import Monitor, RunAnalysis
from sandloop.monitor.audit import AuditSampler, AuditScorer, run_audit
from sandloop.monitor.detectors import Alert, Thresholds, detect_audit_failures
from sandloop.monitor.records import Rollout
from sandloop.monitor.report import render_report
from sandloop.train.records import JsonlWriter

__all__ = ["LivePoster", "RunMonitor", "first_alert_steps"]

log = logging.getLogger(__name__)


class LivePoster:
    """Posts each step's rollouts to a ``sandloop serve`` (its dashboard shows the run).

    A failing server never stops training: the first failure is logged as a warning, and after
    ``give_up`` failures in a row nothing more is sent.
    """

    def __init__(self, url: str, run_id: str, *, api_key: str | None = None,
                 timeout_s: float = 10.0, give_up: int = 3) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/") + "/v1/monitor/rollouts"
        self.run_id = run_id
        self._client = httpx.Client(timeout=timeout_s, headers=headers)
        self.failures = 0
        self.posted = 0
        self.give_up = give_up

    def post(self, rollouts: Sequence[Rollout], alerts: Sequence[Alert] = (), *,
             final: bool = False) -> None:
        if self.failures >= self.give_up or not (rollouts or alerts or final):
            return
        body = {"run_id": self.run_id, "rollouts": [r.to_dict() for r in rollouts],
                "alerts": [a.to_dict() for a in alerts], "final": final}
        try:
            r = self._client.post(self.url, json=body)
            r.raise_for_status()
        except Exception as e:  # the dashboard is a convenience; training goes on
            self.failures += 1
            if self.failures == 1 or self.failures == self.give_up:
                log.warning("posting rollouts to %s failed (%s)%s", self.url, e,
                            "; giving up" if self.failures == self.give_up else "")
            return
        self.failures = 0
        self.posted += len(rollouts)

    def close(self) -> None:
        """Tell the server the run is over (its last steps complete), then close."""
        self.post([], final=True)
        self._client.close()


class RunMonitor:
    """One run's monitor: feed it each step's rollouts with :meth:`observe_step`."""

    def __init__(self, alerts: JsonlWriter, score: AuditScorer, *, known: frozenset[str],
                 audit_every: int = 5, audit_sample: int = 16, seed: int = 0,
                 thresholds: Thresholds | None = None, poster: LivePoster | None = None
                 ) -> None:
        self.thresholds = thresholds or Thresholds()
        self.monitor = Monitor(self.thresholds)
        self.alerts_out = alerts
        self.score = score
        self.known = known
        self.every, self.sample, self.seed = audit_every, audit_sample, seed
        self.poster = poster
        self.alerts: list[Alert] = []
        self.audited = 0
        self._window: list[Rollout] = []
        self._audit_firing = False

    def _raise(self, alerts: Sequence[Alert]) -> None:
        for a in alerts:
            self.alerts.append(a)
            self.alerts_out.write(a.to_dict())

    async def observe_step(self, step: int, rollouts: Sequence[Rollout]) -> dict[str, Any]:
        """One step's rollouts; returns the figures for this step's metrics line (audit steps:
        ``audit_reward_mean``, ``audited``, ``audit_failures``, ``audit_s``)."""
        self._raise(self.monitor.add_many(rollouts))
        self._window.extend(rollouts)
        row: dict[str, Any] = {}
        audit_alerts: list[Alert] = []
        if (step + 1) % self.every == 0:
            t0 = time.perf_counter()
            window, self._window = self._window, []
            # share such that the budget is exactly ``sample`` of the window's rollouts
            share = min(1.0, (self.sample + 0.5) / max(1, len(window)))
            sampler = AuditSampler(share=share, seed=self.seed + step, known=self.known)
            sampler.add_many(window)
            outcomes = await run_audit(sampler.sample(), self.score)
            self.audited += len(outcomes)
            # The monitor's decision on the pooled window (its per-step rule would judge 3 or
            # so completions a step, where one timeout under load is already 20%).
            pooled = [dataclasses.replace(o, step=step) for o in outcomes]
            found = detect_audit_failures(pooled, self.thresholds)
            th = self.thresholds
            failed = [o for o in outcomes if o.train_reward >= th.audit_high
                      and o.audit_reward is not None and o.audit_reward < th.audit_low]
            if found and not self._audit_firing:
                first = step - self.every + 1
                audit_alerts = [dataclasses.replace(
                    a, detail=f"audit at step {step}: {len(failed)} of {len(outcomes)} "
                              f"high-reward completions of steps {first}..{step} fail the "
                              "task's hidden tests under the hardened harness",
                    evidence=[o.to_dict() for o in failed[:5]]) for a in found]
            self._audit_firing = bool(found)
            known = [o.audit_reward for o in outcomes if o.audit_reward is not None]
            row = {"audit_reward_mean": sum(known) / len(known) if known else None,
                   "audited": len(outcomes), "audit_failures": len(failed),
                   "audit_s": time.perf_counter() - t0}
            self._raise(audit_alerts)
        if self.poster is not None:
            self.poster.post(rollouts, audit_alerts)
        return row

    def finish(self, report: Path | None, summary: dict[str, Any],
               title: str = "sandloop train") -> RunAnalysis:
        """Complete the last step, write the HTML report; returns the run's analysis."""
        self._raise(self.monitor.flush())
        alerts = sorted(self.alerts, key=lambda a: a.step)
        result = RunAnalysis(self.monitor.steps, alerts, self.monitor.late)
        if report is not None:
            s = {**result.summary(), "audited": self.audited, **summary}
            report.write_text(render_report(result.steps, alerts, s, title=title),
                              encoding="utf-8")
        if self.poster is not None:
            self.poster.close()
        return result


def first_alert_steps(alerts: Sequence[Alert]) -> dict[str, int]:
    """The first step of each alert code."""
    out: dict[str, int] = {}
    for a in sorted(alerts, key=lambda a: a.step):
        out.setdefault(a.code, a.step)
    return out

