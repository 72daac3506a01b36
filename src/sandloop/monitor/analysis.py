"""The streaming monitor: rollouts in, per-step statistics and alerts out, step by step."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sandloop.monitor.detectors import DETECTORS, Alert, Thresholds
from sandloop.monitor.records import Rollout
from sandloop.monitor.stats import Scanner, StepAggregator, StepStats

__all__ = ["Monitor", "RunAnalysis", "analyze"]


class Monitor:
    """Feeds rollouts through a ``StepAggregator`` and runs every detector on each step as it
    completes. An alert is raised when its detector starts firing, and again only after it has
    been quiet for ``thresholds.rearm`` steps (one alert per episode, not one per step).

    ``on_step`` / ``on_alert`` are called as steps complete (the dashboard and Prometheus hang
    here). All steps' statistics are kept (a few hundred bytes each). ``scanner`` finds hack
    signatures (a ``signatures.TaskScanner`` when the task set is known).
    """

    def __init__(self, thresholds: Thresholds | None = None, *, lag: int = 0,
                 on_step: Callable[[StepStats], None] | None = None,
                 on_alert: Callable[[Alert], None] | None = None,
                 scanner: Scanner | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        self.steps: list[StepStats] = []
        self.alerts: list[Alert] = []
        self._agg = StepAggregator(lag, scanner)
        th = self.thresholds
        self._history: deque[StepStats] = deque(maxlen=th.window + th.recent)
        self._quiet: dict[str, int] = dict.fromkeys(DETECTORS, th.rearm)
        self._on_step, self._on_alert = on_step, on_alert

    @property
    def late(self) -> int:
        """Rollouts that arrived after their step was complete (dropped)."""
        return self._agg.late

    def add(self, rollout: Rollout) -> list[Alert]:
        """One rollout; returns the alerts of the steps it completed."""
        return self._steps_done(self._agg.add(rollout))

    def add_many(self, rollouts: Iterable[Rollout]) -> list[Alert]:
        out: list[Alert] = []
        for r in rollouts:
            out.extend(self._steps_done(self._agg.add(r)))
        return out

    def flush(self) -> list[Alert]:
        """Complete the open steps (end of the log or of the run)."""
        return self._steps_done(self._agg.flush())

    def _steps_done(self, done: list[StepStats]) -> list[Alert]:
        out: list[Alert] = []
        for stats in done:
            out.extend(self.observe(stats))
        return out

    def observe(self, stats: StepStats) -> list[Alert]:
        """Run the detectors on a completed step's statistics."""
        self.steps.append(stats)
        self._history.append(stats)
        if self._on_step is not None:
            self._on_step(stats)
        hist = list(self._history)
        raised: list[Alert] = []
        for name, detect in DETECTORS.items():
            alert = detect(hist, self.thresholds)
            if alert is None:
                self._quiet[name] += 1
                continue
            if self._quiet[name] >= self.thresholds.rearm:
                raised.append(alert)
            self._quiet[name] = 0
        for a in raised:
            self.alerts.append(a)
            if self._on_alert is not None:
                self._on_alert(a)
        return raised


@dataclass
class RunAnalysis:
    """The result of analysing a whole log: per-step statistics and alerts (in step order)."""

    steps: list[StepStats]
    alerts: list[Alert]
    late: int = 0
    audit: list[dict[str, object]] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """A one-object summary (rollouts, steps, reward trend, alerts by code)."""
        n = sum(s.rollouts for s in self.steps)
        means = [s.reward_mean for s in self.steps if s.reward_mean is not None]
        codes: dict[str, int] = {}
        for a in self.alerts:
            codes[a.code] = codes.get(a.code, 0) + 1
        return {
            "steps": len(self.steps), "rollouts": n,
            "first_step": self.steps[0].step if self.steps else None,
            "last_step": self.steps[-1].step if self.steps else None,
            "reward_mean_first": means[0] if means else None,
            "reward_mean_last": means[-1] if means else None,
            "null_rewards": sum(s.null_rewards for s in self.steps),
            "late_rollouts": self.late, "alerts": codes, "audited": len(self.audit),
        }


def analyze(rollouts: Iterable[Rollout], thresholds: Thresholds | None = None, *,
            lag: int = 0, scanner: Scanner | None = None) -> RunAnalysis:
    """Analyse a run's rollouts, streaming (each step as it completes)."""
    mon = Monitor(thresholds, lag=lag, scanner=scanner)
    mon.add_many(rollouts)
    mon.flush()
    return RunAnalysis(mon.steps, mon.alerts, mon.late)
