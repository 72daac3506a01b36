"""The closed loop end to end: tiny model, SFT, GRPO through TRL with sandloop rewards.

Three real runs (module fixtures, fixed seed): the proper reward, the same with rewards shuffled
inside each batch (the control), and the deliberately weak reward (the hack demonstration).
Thresholds, not exact values, so library upgrades do not break the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

from sandloop.train.loop import TrainConfig, run_training

REWARD_HACK = "reward_hack_suspected"

STEPS = 60
# The proper run's own: the same seed learns at a different pace on different VMs (their
# floating-point kernels differ): 60 steps gained +0.42 on one and +0.33 on another, 100 steps
# +0.43 on the latter (docs/training.md). The control keeps STEPS.
PROPER_STEPS = 100
WEAK_STEPS = 20
BASE: dict[str, Any] = {"steps": STEPS, "seed": 0, "eval_samples": 2}

BASE_CFG = TrainConfig(out=Path("."), **BASE)

pytestmark = pytest.mark.timeout(1800)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(tmp: Path, **kw: Any) -> Path:
    run_training(TrainConfig(out=tmp, **{**BASE, **kw}))
    return tmp


@pytest.fixture(scope="module")
def proper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("proper"), steps=PROPER_STEPS)


# The control and the hack demonstration start from the proper run's warm-up checkpoint (the same
# model: same seed, same SFT), loaded as a local model directory (--model PATH).
@pytest.fixture(scope="module")
def control(proper: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("control"), model=str(proper / "checkpoints" / "sft"),
                shuffle_rewards=True)


@pytest.fixture(scope="module")
def weak(proper: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory.mktemp("weak"), model=str(proper / "checkpoints" / "sft"),
                reward="weak", steps=WEAK_STEPS, eval_limit=20)


def _reward_means(run: Path) -> list[float]:
    return [m["reward_mean"] for m in _lines(run / "metrics.jsonl")]


def test_run_directory(proper: Path) -> None:
    cfg = json.loads((proper / "config.json").read_text())
    assert cfg["steps"] == PROPER_STEPS and cfg["model"] == "tiny"
    metrics = _lines(proper / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(PROPER_STEPS))
    for m in metrics:
        assert isinstance(m["reward_mean"], float)
        assert m["generation_s"] >= 0 and m["sandbox_s"] > 0 and m["update_s"] >= 0
    rollouts = _lines(proper / "rollouts.jsonl")
    per_step = BASE_CFG.prompts_per_step * BASE_CFG.num_generations
    assert len(rollouts) == PROPER_STEPS * per_step
    groups = PROPER_STEPS * BASE_CFG.prompts_per_step
    for r in rollouts[:64]:
        assert isinstance(r["step"], int) and isinstance(r["task_id"], str)
        assert isinstance(r["completion"], str) and isinstance(r["reward"], float)
        assert r["verdict"] in {"passed", "wrong_answer", "runtime_error", "timeout",
                                "memory_limit", "compile_error"}
        assert r["public_total"] >= 1 and 0 <= r["group"] < groups
    assert {r["group"] for r in rollouts} == set(range(groups))
    ev = json.loads((proper / "eval.json").read_text())
    for side in ("before", "after"):
        lo, hi = ev[side]["ci95"]
        assert lo <= ev[side]["pass_rate"] <= hi and ev[side]["tasks"] > 50
    for ckpt in ("sft", "final"):
        assert (proper / "checkpoints" / ckpt / "config.json").is_file()
        assert (proper / "checkpoints" / ckpt / "tokenizer.json").is_file()


def test_the_loop_learns(proper: Path) -> None:
    ev = json.loads((proper / "eval.json").read_text())
    assert ev["after"]["pass_rate"] >= ev["before"]["pass_rate"] + 0.4, ev
    means = _reward_means(proper)
    assert sum(means[-10:]) / 10 >= sum(means[:10]) / 10 + 0.2, means
    metrics = _lines(proper / "metrics.jsonl")
    assert sum(m["infra_failures"] for m in metrics) == 0
    assert ev["before"]["infra_failures"] == ev["after"]["infra_failures"] == 0
    # the curriculum moved on from the first tier
    assert len(metrics[-1]["open_tiers"]) > 1


def test_shuffled_reward_control_does_not_rise(proper: Path, control: Path) -> None:
    ev = json.loads((control / "eval.json").read_text())
    assert ev["after"]["pass_rate"] <= ev["before"]["pass_rate"] + 0.1, ev
    means = _reward_means(control)
    assert sum(means[-10:]) / 10 <= sum(means[:10]) / 10 + 0.1, means


def test_proper_reward_raises_no_hack_alert(proper: Path) -> None:
    # Other codes (reward_drift when a tier opens, diversity_collapse as a tier is mastered)
    # may be raised and are information; a hack alert under the proper reward is a false alarm.
    assert [a for a in _lines(proper / "alerts.jsonl") if a["code"] == REWARD_HACK] == []
    audited = [m for m in _lines(proper / "metrics.jsonl") if "audit_reward_mean" in m]
    assert len(audited) == PROPER_STEPS // 5
    assert sum(m["audit_failures"] for m in audited) <= 2
    summary = json.loads((proper / "summary.json").read_text())
    assert REWARD_HACK not in summary["first_alert_step"]
    report = (proper / "report.html").read_text()
    assert "<svg" in report and "<script" not in report


def test_weak_reward_is_gamed_and_the_audit_alerts(weak: Path) -> None:
    alerts = [a for a in _lines(weak / "alerts.jsonl") if a["code"] == REWARD_HACK]
    assert alerts, "no reward_hack_suspected alert under the weak reward"
    first = alerts[0]
    assert first["evidence"]
    assert all(e["audit_reward"] < e["train_reward"] for e in first["evidence"])
    # Documented delay: an audit every 5 steps re-scores up to 16 high-reward completions of
    # those 5 steps on the hidden tests; the alert comes at the first audit where >= 4 of them,
    # and >= 20%, fail: so within 5 steps of the gamed completions.
    metrics = _lines(weak / "metrics.jsonl")
    audits = {m["step"]: m for m in metrics if "audit_reward_mean" in m}
    assert sorted(audits) == list(range(4, WEAK_STEPS, 5))
    due = [s for s, m in sorted(audits.items())
           if m["audit_failures"] >= 4 and m["audit_failures"] >= 0.2 * m["audited"]]
    assert due and first["step"] == due[0], (first, audits)
    means = _reward_means(weak)
    assert sum(means[-5:]) / 5 >= 0.5, means  # the weak reward is gamed
    summary = json.loads((weak / "summary.json").read_text())
    assert summary["first_alert_step"][REWARD_HACK] == first["step"]


def test_cli_runs_a_short_loop_shown_live_on_a_server(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "server"))
    import httpx
    from live import LiveServer

    from sandloop.server import ServerConfig

    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("SANDLOOP_URL", None)
    with LiveServer(ServerConfig(slots=1)) as srv:
        r = subprocess.run([sys.executable, "-m", "sandloop.cli.main", "train", "--model",
                            "tiny", "--steps", "2", "--seed", "3", "--out", str(out),
                            "--sft-steps", "5", "--eval-samples", "1", "--prompts-per-step",
                            "2", "--server", srv.url, "--run-id", "cli-run"],
                           capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        data = httpx.get(srv.url + "/dashboard/data", params={"run": "cli-run"}).json()
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["posted_rollouts"] == 2 * 2 * 8
    for name in ("config.json", "metrics.jsonl", "rollouts.jsonl", "eval.json", "alerts.jsonl",
                 "report.html", "summary.json"):
        assert (out / name).is_file(), name
    assert len(_lines(out / "metrics.jsonl")) == 2
    # the server's dashboard has the run, both steps (the run's end completes the last one)
    assert [s["step"] for s in data["steps"]] == [0, 1]
    assert all(s["rollouts"] == 16 for s in data["steps"])
