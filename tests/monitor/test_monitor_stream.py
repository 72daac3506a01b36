"""Streaming statistics, the log format, and whole synthetic runs end to end."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sandloop.monitor import LogFormatError, Rollout, analyze, read_log, write_log
from sandloop.monitor.analysis import Monitor
from sandloop.monitor.stats import StepAggregator, compute_step_stats
from sandloop.monitor.synthetic import synthetic_run


def r(step: int, reward: float | None = 1.0, *, group: str = "g", text: str = "x = 1",
      verdict: str | None = "passed", **kw: object) -> Rollout:
    return Rollout(step=step, task_id="t", completion=text, reward=reward, group=group,
                   verdict=verdict, **kw)  # type: ignore[arg-type]


def test_step_stats_values() -> None:
    rs = [r(0, 1.0, text="a = 1", difficulty=0.1, source="mbpp", wall_time_s=0.5),
          r(0, 0.0, text="a  = 1  # same", verdict="wrong_answer", difficulty="hard"),
          r(0, None, group="h", verdict="sandbox_error"),
          r(0, 0.5, group="h", text="import os\nos._exit(0)", verdict="timeout")]
    s = compute_step_stats(0, rs)
    assert (s.rollouts, s.scored, s.null_rewards, s.passed) == (4, 3, 1, 1)
    assert s.reward_mean == pytest.approx(0.5) and s.quantiles["p50"] == 0.5
    assert sum(s.histogram) == 3
    assert s.pass_by_tier == {"easy": [1, 1], "hard": [0, 1]}
    assert s.pass_by_source == {"mbpp": [1, 1]}
    assert s.verdicts == {"passed": 1, "wrong_answer": 1, "sandbox_error": 1, "timeout": 1}
    assert s.infra_bad == 2 and s.infra_share == 0.5
    # group g: two near-identical completions -> diversity 0; group h: two different -> 1
    assert (s.multi_groups, s.group_diversity) == (2, 0.5)
    assert s.zero_var_groups == 1  # h has one non-null reward only
    assert s.hacked == 1 and s.signatures == {"os_exit": 1}
    assert s.hack_examples[0]["signatures"] == ["os_exit"]
    json.dumps(s.to_dict())


def test_aggregator_closes_steps_as_later_ones_arrive() -> None:
    agg = StepAggregator()
    assert agg.add(r(0)) == [] and agg.add(r(0)) == []
    done = agg.add(r(1))
    assert [s.step for s in done] == [0] and done[0].rollouts == 2
    assert agg.add(r(0)) == [] and agg.late == 1
    assert [s.step for s in agg.flush()] == [1]


def test_aggregator_with_lag_waits_for_stragglers() -> None:
    agg = StepAggregator(lag=1)
    assert agg.add(r(0)) == [] and agg.add(r(1)) == [] and agg.add(r(0)) == []
    assert [(s.step, s.rollouts) for s in agg.add(r(2))] == [(0, 2)]


def test_log_round_trip_plain_and_gzip(tmp_path: Path) -> None:
    rs = list(synthetic_run(steps=3, per_step=16, group_size=4))
    for name in ("log.jsonl", "log.jsonl.gz"):
        assert write_log(tmp_path / name, rs) == len(rs)
        assert list(read_log(tmp_path / name)) == rs
    with gzip.open(tmp_path / "log.jsonl.gz", "rb") as fh:
        assert fh.read(1) == b"{"


@pytest.mark.parametrize(("line", "field"), [
    ('{"task_id": "t", "completion": "", "reward": 1}', "'step'"),
    ('{"step": 1, "completion": "", "reward": 1}', "'task_id'"),
    ('{"step": 1, "task_id": "t", "reward": 1}', "'completion'"),
    ('{"step": 1, "task_id": "t", "completion": ""}', "'reward'"),
    ('{"step": 1, "task_id": "t", "completion": "", "reward": "1"}', "'reward'"),
    ('{"step": -1, "task_id": "t", "completion": "", "reward": 1}', "'step'"),
    ('{"step": 1, "task_id": "t", "completion": "", "reward": 1, "hidden_total": 1.5}',
     "'hidden_total'"),
    ('[1]', "JSON object"),
    ('{"step": 1,', "not valid JSON"),
])
def test_malformed_lines_name_file_line_and_field(tmp_path: Path, line: str, field: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"step": 0, "task_id": "t", "completion": "", "reward": null}\n\n' + line)
    with pytest.raises(LogFormatError, match=rf"bad.jsonl:3: .*{field}"):
        list(read_log(p))


def test_truncated_gzip_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "log.jsonl.gz"
    write_log(p, synthetic_run(steps=5, per_step=64))
    p.write_bytes(p.read_bytes()[:200])
    with pytest.raises(LogFormatError, match="truncated"):
        list(read_log(p))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LogFormatError, match="cannot open"):
        list(read_log(tmp_path / "nope.jsonl"))


# --- whole runs ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_hack_from_a_known_step_is_alerted_within_ten_steps(seed: int) -> None:
    analysis = analyze(synthetic_run(steps=60, hack_from=30, seed=seed))
    hacks = [a for a in analysis.alerts if a.code == "reward_hack_suspected"]
    assert hacks, analysis.alerts
    assert 30 <= hacks[0].step < 40
    assert hacks[0].evidence and all(e["signatures"] for e in hacks[0].evidence)
    assert all(a.step >= 30 for a in analysis.alerts)  # nothing before the hack


@pytest.mark.parametrize(("seed", "shape"), [
    (0, {}), (1, {}), (2, {"per_step": 64}), (3, {"start_pass": 0.0, "end_pass": 1.0}),
    (4, {"per_step": 32, "group_size": 4, "steps": 100}),
])
def test_clean_runs_raise_nothing_including_steady_learning(seed: int, shape: dict[str, int]
                                                            ) -> None:
    analysis = analyze(synthetic_run(seed=seed, **shape))  # type: ignore[arg-type]
    assert analysis.alerts == []
    means = [s.reward_mean or 0.0 for s in analysis.steps]
    assert means[-1] - means[0] > 0.3  # it did learn


def test_collapse_and_infra_events_get_their_codes() -> None:
    a = analyze(synthetic_run(steps=50, collapse_from=30))
    assert [(x.code, 30 <= x.step < 40) for x in a.alerts] == [("diversity_collapse", True)]
    a = analyze(synthetic_run(steps=50, infra_from=30))
    assert [(x.code, 30 <= x.step < 40) for x in a.alerts] == [("infra_degradation", True)]


def test_monitor_streams_each_step_as_it_completes() -> None:
    seen: list[int] = []
    mon = Monitor(on_step=lambda s: seen.append(s.step))
    for roll in synthetic_run(steps=4, per_step=16, group_size=4):
        mon.add(roll)
        if roll.step == 2:
            assert seen == [0, 1]
    mon.flush()
    assert seen == [0, 1, 2, 3]


def test_report_axes_label_whole_steps_where_they_are_drawn() -> None:
    import re
    from dataclasses import replace

    from sandloop.monitor.report import PAD_L, PAD_R, W, render_report, step_ticks

    assert step_ticks(0, 9) == [0, 2, 4, 6, 8] and step_ticks(0, 59)[:3] == [0, 10, 20]
    assert step_ticks(5, 17) == [6, 8, 10, 12, 14, 16]
    a = analyze(synthetic_run(steps=10, per_step=16, group_size=4))
    page = render_report(a.steps, a.alerts, a.summary())
    first_chart = page[page.index("<svg"):page.index("</svg>")]
    ticks = [(float(x), int(v)) for x, v in
             re.findall(r'class="x-tick" x="([\d.]+)"[^>]*>(\d+)<', first_chart)]
    assert [v for _, v in ticks] == [0, 2, 4, 6, 8]
    for x, v in ticks:  # steps 0..9 span the plot width
        assert x == pytest.approx(PAD_L + v / 9 * (W - PAD_L - PAD_R), abs=0.1)
    assert 'id="no-tiers"' not in page  # the synthetic run has tiers
    plain = [replace(s, pass_by_tier={}) for s in a.steps]
    assert 'id="no-tiers"' in render_report(plain, [], a.summary())
