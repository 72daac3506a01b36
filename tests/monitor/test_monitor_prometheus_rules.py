"""deploy/prometheus/alerts.yml: valid rule groups over metrics the monitor really exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sandloop.monitor.detectors import ALERT_CODES
from sandloop.monitor.live import MonitorMetrics

yaml = pytest.importorskip("yaml", reason="PyYAML parses the rules file")
RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "alerts.yml"


def test_rules_parse_and_name_exported_metrics_and_every_code() -> None:
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert all({"alert", "expr", "labels", "annotations"} <= set(r) for r in rules)
    reg = CollectorRegistry()
    m = MonitorMetrics(reg)
    for code in ALERT_CODES:
        m.alerts.labels("r", code).inc()
    m.infra_share.labels("r").set(0.1)
    exported = set(re.findall(r"^(sandloop_\w+?)(?:\{| )", generate_latest(reg).decode(), re.M))
    for r in rules:
        for name in re.findall(r"\bsandloop_\w+", r["expr"]):
            assert name in exported, (r["alert"], name)
    assert {c for r in rules for c in ALERT_CODES if f'"{c}"' in r["expr"]} == set(ALERT_CODES)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_checks_the_rules() -> None:
    r = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
