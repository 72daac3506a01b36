"""Reward monitoring: the rollout log, per-step statistics, detectors and alerts.

Sits above ``reward`` and ``store``; it never knows how runs are executed (audits take a scoring
callable from the caller).
"""

from sandloop.monitor.analysis import Monitor, RunAnalysis, analyze
from sandloop.monitor.detectors import ALERT_CODES, Alert, AuditOutcome, Thresholds
from sandloop.monitor.records import LogFormatError, Rollout, read_log, write_log
from sandloop.monitor.stats import StepAggregator, StepStats, compute_step_stats

__all__ = ["ALERT_CODES", "Alert", "AuditOutcome", "LogFormatError", "Monitor", "Rollout",
           "RunAnalysis", "StepAggregator", "StepStats", "Thresholds", "analyze",
           "compute_step_stats", "read_log", "write_log"]
