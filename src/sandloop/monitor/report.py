"""A self-contained HTML report of a run: inline SVG plots, no scripts, no external assets.

Plots: reward mean over steps with its interquartile and +-1 std bands, pass rate, the reward
histogram of every step (a heat map), the verdict mix, pass rate by difficulty tier, hack
signature / infrastructure / diversity shares; every alert is marked on the timelines and listed
with its evidence.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

from sandloop.monitor.detectors import Alert
from sandloop.monitor.stats import StepStats

__all__ = ["render_report", "step_ticks"]

W, H = 860, 220
PAD_L, PAD_R, PAD_T, PAD_B = 48, 12, 16, 28
PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04",
           "#4b5563")
ALERT_COLOURS = {"reward_hack_suspected": "#dc2626", "reward_drift": "#ea580c",
                 "diversity_collapse": "#9333ea", "infra_degradation": "#4b5563"}
VERDICT_ORDER = ("passed", "wrong_answer", "runtime_error", "compile_error", "timeout",
                 "memory_limit", "sandbox_error", "null", "unknown")


class _Axes:
    def __init__(self, x0: float, x1: float, y0: float, y1: float) -> None:
        self.x0, self.x1 = x0, x1 if x1 > x0 else x0 + 1
        self.y0, self.y1 = y0, y1 if y1 > y0 else y0 + 1

    def x(self, v: float) -> float:
        return PAD_L + (v - self.x0) / (self.x1 - self.x0) * (W - PAD_L - PAD_R)

    def y(self, v: float) -> float:
        return H - PAD_B - (v - self.y0) / (self.y1 - self.y0) * (H - PAD_T - PAD_B)


def _frame(ax: _Axes, title: str, y_fmt: str = "{:.1f}") -> list[str]:
    out = [f'<svg viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="{html.escape(title)}"'
           ' xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">',
           f'<text x="{PAD_L}" y="11" font-weight="bold">{html.escape(title)}</text>']
    for i in range(5):
        v = ax.y0 + (ax.y1 - ax.y0) * i / 4
        y = ax.y(v)
        out.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#e5e7eb"/><text x="{PAD_L - 4}" y="{y + 4:.1f}" '
                   f'text-anchor="end">{y_fmt.format(v)}</text>')
    for v in step_ticks(ax.x0, ax.x1):
        out.append(f'<text class="x-tick" x="{ax.x(v):.1f}" y="{H - 10}" '
                   f'text-anchor="middle">{v}</text>')
    return out


def step_ticks(x0: float, x1: float, most: int = 8) -> list[int]:
    """Whole steps to label an axis from ``x0`` to ``x1`` with: every 1, 2, 5, 10, 20, ...
    steps, at most ``most`` of them (a label sits exactly where its step is drawn)."""
    span = max(1.0, x1 - x0)
    every = next(e for e in _nice() if span / e <= most - 1)
    first = math.ceil(x0 / every) * every
    return list(range(first, math.floor(x1) + 1, every))


def _nice() -> Iterator[int]:
    """1, 2, 5, 10, 20, 50, ..."""
    scale = 1
    while True:
        for k in (1, 2, 5):
            yield k * scale
        scale *= 10


def _alert_marks(ax: _Axes, alerts: Sequence[Alert]) -> list[str]:
    out = []
    for a in alerts:
        x = ax.x(a.step)
        c = ALERT_COLOURS.get(a.code, "#000")
        out.append(f'<line class="alert-mark" data-code="{a.code}" x1="{x:.1f}" x2="{x:.1f}" '
                   f'y1="{PAD_T}" y2="{H - PAD_B}" stroke="{c}" stroke-dasharray="4 3">'
                   f'<title>step {a.step}: {html.escape(a.code)}</title></line>'
                   f'<text x="{x + 3:.1f}" y="{PAD_T + 10}" fill="{c}">{html.escape(a.code)}'
                   f'</text>')
    return out


def _path(ax: _Axes, pts: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{ax.x(x):.1f},{ax.y(y):.1f}"
                    for i, (x, y) in enumerate(pts))


def _band(ax: _Axes, lo: Sequence[tuple[float, float]], hi: Sequence[tuple[float, float]],
          colour: str, opacity: float) -> str:
    if not lo:
        return ""
    d = _path(ax, list(hi)) + " " + " ".join(f"L{ax.x(x):.1f},{ax.y(y):.1f}"
                                             for x, y in reversed(lo)) + " Z"
    return f'<path d="{d}" fill="{colour}" fill-opacity="{opacity}" stroke="none"/>'


def _legend(names: Sequence[str], colours: Sequence[str]) -> str:
    items = "".join(f'<span><i style="background:{c}"></i>{html.escape(n)}</span>'
                    for n, c in zip(names, colours, strict=False))
    return f'<div class="legend">{items}</div>'


def _lines(steps: Sequence[StepStats], series: dict[str, list[tuple[float, float]]],
           alerts: Sequence[Alert], title: str, y0: float = 0.0, y1: float = 1.0) -> str:
    xs = [s.step for s in steps] or [0]
    ax = _Axes(min(xs), max(xs), y0, y1)
    out = _frame(ax, title, "{:.2f}")
    for (name, pts), c in zip(series.items(), PALETTE, strict=False):
        if pts:
            out.append(f'<path d="{_path(ax, pts)}" fill="none" stroke="{c}" stroke-width="1.6">'
                       f'<title>{html.escape(name)}</title></path>')
    out += _alert_marks(ax, alerts)
    out.append("</svg>")
    return "".join(out) + _legend(list(series), PALETTE)


def _reward_chart(steps: Sequence[StepStats], alerts: Sequence[Alert]) -> str:
    sc = [s for s in steps if s.reward_mean is not None]
    xs = [s.step for s in steps] or [0]
    lo = min([min(0.0, s.reward_min or 0.0) for s in sc] or [0.0])
    hi = max([max(1.0, s.reward_max or 0.0) for s in sc] or [1.0])
    ax = _Axes(min(xs), max(xs), lo, hi)
    out = _frame(ax, "reward per step: mean, interquartile band, mean +- 1 std", "{:.2f}")
    mean = [(s.step, s.reward_mean or 0.0) for s in sc]
    std = [(s.reward_std or 0.0) for s in sc]
    out.append(_band(ax, [(x, max(lo, m - d)) for (x, m), d in zip(mean, std, strict=True)],
                     [(x, min(hi, m + d)) for (x, m), d in zip(mean, std, strict=True)],
                     "#2563eb", 0.10))
    out.append(_band(ax, [(s.step, s.quantiles.get("p25", 0.0)) for s in sc],
                     [(s.step, s.quantiles.get("p75", 0.0)) for s in sc], "#2563eb", 0.22))
    if mean:
        out.append(f'<path id="reward-mean" d="{_path(ax, mean)}" fill="none" stroke="#2563eb" '
                   f'stroke-width="2"/>')
        out.append(f'<path d="{_path(ax, [(s.step, s.pass_rate) for s in sc])}" fill="none" '
                   f'stroke="#16a34a" stroke-width="1.3" stroke-dasharray="5 3"/>')
    out += _alert_marks(ax, alerts)
    out.append("</svg>")
    return "".join(out) + _legend(["reward mean", "pass rate"], ["#2563eb", "#16a34a"])


def _heatmap(steps: Sequence[StepStats], alerts: Sequence[Alert]) -> str:
    xs = [s.step for s in steps] or [0]
    ax = _Axes(min(xs), max(xs) + 1, 0.0, 1.0)
    out = _frame(ax, "reward histogram per step (darker = more rollouts in the bin)", "{:.1f}")
    bw = (W - PAD_L - PAD_R) / max(1, len(steps))
    for s in steps:
        total = sum(s.histogram) or 1
        x = ax.x(s.step)
        for b, count in enumerate(s.histogram):
            if count:
                y_top = ax.y((b + 1) / len(s.histogram))
                h = ax.y(b / len(s.histogram)) - y_top
                out.append(f'<rect x="{x:.1f}" y="{y_top:.1f}" width="{bw + 0.5:.1f}" '
                           f'height="{h:.1f}" fill="#1d4ed8" fill-opacity="'
                           f'{0.08 + 0.92 * count / total:.2f}"/>')
    out += _alert_marks(ax, alerts)
    out.append("</svg>")
    return "".join(out)


def _verdict_mix(steps: Sequence[StepStats], alerts: Sequence[Alert]) -> str:
    xs = [s.step for s in steps] or [0]
    ax = _Axes(min(xs), max(xs) + 1, 0.0, 1.0)
    out = _frame(ax, "verdict mix per step (share of rollouts)", "{:.0%}")
    names = [v for v in VERDICT_ORDER if any(s.verdicts.get(v) for s in steps)]
    names += sorted({k for s in steps for k in s.verdicts} - set(names))
    colours = dict(zip(names, ("#16a34a", "#f59e0b", "#ef4444", "#a855f7", "#0ea5e9",
                               "#14b8a6", "#111827", "#6b7280", "#d1d5db", *PALETTE),
                       strict=False))
    bw = (W - PAD_L - PAD_R) / max(1, len(steps))
    for s in steps:
        acc = 0.0
        for v in names:
            share = s.verdicts.get(v, 0) / (s.rollouts or 1)
            if share:
                y_top = ax.y(acc + share)
                out.append(f'<rect x="{ax.x(s.step):.1f}" y="{y_top:.1f}" width="{bw + 0.5:.1f}"'
                           f' height="{ax.y(acc) - y_top:.1f}" fill="{colours[v]}"/>')
            acc += share
    out += _alert_marks(ax, alerts)
    out.append("</svg>")
    return "".join(out) + _legend(names, [colours[n] for n in names])


def _evidence(a: Alert) -> str:
    rows = []
    for e in a.evidence[:5]:
        text = e.get("completion")
        meta = {k: v for k, v in e.items() if k != "completion"}
        rows.append(f"<li><code>{html.escape(json.dumps(meta, default=str))}</code>"
                    + (f"<pre>{html.escape(str(text))}</pre>" if text else "") + "</li>")
    return "<ul>" + "".join(rows) + "</ul>"


def render_report(steps: Sequence[StepStats], alerts: Sequence[Alert],
                  summary: dict[str, object], title: str = "sandloop monitor report") -> str:
    """The report as one HTML document (nothing fetched when it is opened)."""
    tiers = sorted({t for s in steps for t in s.pass_by_tier})
    tier_series = {t: [(float(s.step), s.pass_by_tier[t][0] / s.pass_by_tier[t][1])
                       for s in steps if t in s.pass_by_tier and s.pass_by_tier[t][1]]
                   for t in tiers}
    health = {
        "hack-signature share": [(float(s.step), s.hack_share) for s in steps],
        "infra share (sandbox_error/timeout/memory/null)": [(float(s.step), s.infra_share)
                                                            for s in steps],
        "group diversity": [(float(s.step), s.group_diversity) for s in steps
                            if s.group_diversity is not None],
        "zero-variance groups": [(float(s.step), s.zero_var_share) for s in steps],
    }
    alert_rows = "".join(
        f'<tr class="alert" data-code="{html.escape(a.code)}"><td>{a.step}</td>'
        f'<td style="color:{ALERT_COLOURS.get(a.code, "#000")}">{html.escape(a.code)}</td>'
        f"<td>{html.escape(a.detail)}{_evidence(a)}</td></tr>" for a in alerts)
    summary_rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>"
                           f"{html.escape(json.dumps(v, default=str))}</td></tr>"
                           for k, v in summary.items())
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    charts = [
        _reward_chart(steps, alerts),
        _heatmap(steps, alerts),
        _verdict_mix(steps, alerts),
        _lines(steps, tier_series, alerts, "pass rate by difficulty tier") if tiers else
        '<p id="no-tiers">Pass rate by difficulty tier: no rollout in this log names a '
        "difficulty (the log's <code>difficulty</code> field; tasks that carry one fill it "
        "in).</p>",
        _lines(steps, health, alerts, "health: hack signatures, infrastructure, diversity"),
        _lines(steps, {"completion length (chars, mean)": [(float(s.step), s.length_mean)
                                                           for s in steps]},
               alerts, "completion length", 0.0, max([s.length_mean for s in steps] or [1.0])),
    ]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{{font-family:sans-serif;margin:24px;max-width:920px;color:#111827}}
table{{border-collapse:collapse;margin:8px 0}} td,th{{border:1px solid #e5e7eb;padding:3px 8px;
text-align:left;vertical-align:top;font-size:13px}} pre{{background:#f3f4f6;padding:6px;
overflow:auto;max-height:180px;font-size:12px}} .legend span{{margin-right:14px;font-size:12px}}
.legend i{{display:inline-block;width:10px;height:10px;margin-right:4px}} svg{{margin-top:14px}}
</style></head><body>
<h1>{html.escape(title)}</h1><p>generated {generated}; {len(steps)} steps, {len(alerts)} alerts</p>
<h2>Summary</h2><table>{summary_rows}</table>
<h2>Alerts</h2>{f'<table><tr><th>step</th><th>code</th><th>detail and evidence</th></tr>{alert_rows}</table>' if alerts else '<p id="no-alerts">No alerts.</p>'}
<h2>Plots</h2>{''.join(charts)}
</body></html>
"""
