"""The HTML quality report of a validation run: one self-contained file (inline SVG, no
scripts, no CDN), with problems per code, difficulty, mutation scores and tags as bar charts and
the tasks that need attention as a table."""

from __future__ import annotations

import html
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from sandloop.curation.difficulty import TIERS
from sandloop.curation.problems import ProblemCode
from sandloop.curation.validate import ValidationRun

__all__ = ["bar_chart", "difficulty_bars", "render_report", "write_report"]

_COLOURS = {"keep": "#2e7d32", "review": "#f9a825", "reject": "#c62828"}


def bar_chart(title: str, bars: Sequence[tuple[str, float]], *, colour: str = "#1565c0",
              width: int = 520) -> str:
    """A horizontal bar chart as an inline ``<svg>`` (labels and values escaped)."""
    row, label_w = 22, 190
    height = 30 + row * max(1, len(bars))
    top = max((v for _, v in bars), default=0) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{html.escape(title)}">',
             f'<text x="0" y="16" font-weight="bold" font-size="14">{html.escape(title)}</text>']
    if not bars:
        parts.append('<text x="0" y="40" font-size="12" fill="#666">nothing to show</text>')
    for i, (label, value) in enumerate(bars):
        y = 26 + i * row
        w = (width - label_w - 60) * value / top
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" font-size="12" '
                     f'text-anchor="end">{html.escape(label)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 6}" '
                     f'fill="{colour}"/>')
        text = f"{value:g}"
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 14}" font-size="12">'
                     f'{html.escape(text)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def difficulty_bars(values: Sequence[float | str | None]) -> list[tuple[str, float]]:
    """Tasks per difficulty: tiers in tier order (easiest first), other names sorted, numeric
    difficulties as they are (up to 10 distinct values) or in 10 equal-width bins, then the
    ungraded ones."""
    names = Counter(v for v in values if isinstance(v, str))
    nums = sorted(float(v) for v in values if isinstance(v, int | float))
    bars: list[tuple[str, float]] = [(t, names.pop(t)) for t in TIERS if t in names]
    bars += sorted(names.items())
    if len(set(nums)) <= 10:
        bars += [(f"{v:g}", n) for v, n in sorted(Counter(nums).items())]
    else:
        lo, hi = nums[0], nums[-1]
        width = (hi - lo) / 10
        bins = [0] * 10
        for v in nums:
            bins[min(9, int((v - lo) / width))] += 1
        bars += [(f"{lo + i * width:.3g}-{lo + (i + 1) * width:.3g}", n)
                 for i, n in enumerate(bins)]
    ungraded = sum(v is None for v in values)
    if ungraded:
        bars.append(("ungraded", ungraded))
    return bars


def render_report(res: ValidationRun, title: str = "Task quality") -> str:
    """The report as one HTML document."""
    reports = res.reports
    verdicts = Counter(r.verdict for r in reports)
    codes = Counter(p.code.value for r in reports for p in r.problems)
    scores = [r.mutation_score for r in reports if r.mutation_score is not None]
    bins = [0] * 10
    for s in scores:
        bins[min(9, int(s * 10))] += 1
    tags = Counter(tag for r in reports for tag in r.tags)
    charts = [
        bar_chart("verdicts", [(v, verdicts[v]) for v in ("keep", "review", "reject")],
                  colour="#455a64"),
        bar_chart("tasks per problem code", [(c.value, codes[c.value]) for c in ProblemCode],
                  colour="#c62828"),
        bar_chart(f"mutation score ({len(scores)} tasks)",
                  [(f"{i / 10:.1f}-{(i + 1) / 10:.1f}", n) for i, n in enumerate(bins)]),
        bar_chart("difficulty", difficulty_bars([r.difficulty for r in reports]),
                  colour="#6a1b9a"),
        bar_chart("tags (top 15)", tags.most_common(15), colour="#00838f"),
    ]
    rows = []
    for r in reports:
        if r.verdict == "keep":
            continue
        problems = "<br>".join(f"<b>{html.escape(p.code.value)}</b> ({p.severity}): "
                               f"{html.escape(p.detail)}" for p in r.problems)
        ms = "-" if r.mutation_score is None else f"{r.mutation_score:.2f}"
        rows.append(f'<tr><td>{html.escape(r.id)}</td><td style="color:'
                    f'{_COLOURS[r.verdict]}">{r.verdict}</td><td>{problems}</td><td>{ms}</td></tr>')
    table = ("<table><tr><th>task</th><th>verdict</th><th>problems</th><th>mutation score</th>"
             "</tr>" + "".join(rows) + "</table>") if rows else "<p>Every task is kept.</p>"
    summary = (f"{len(reports)} tasks: keep {verdicts['keep']}, review {verdicts['review']}, "
               f"reject {verdicts['reject']}. {res.runs} sandbox runs, {res.cached} results "
               f"reused, {res.mutants} mutants, {res.elapsed_s:.1f} s.")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1100px}"
        ".charts{display:flex;flex-wrap:wrap;gap:24px}"
        "table{border-collapse:collapse;margin-top:1em}td,th{border:1px solid #ccc;"
        "padding:4px 8px;vertical-align:top;font-size:13px;text-align:left}"
        f"</style></head><body><h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>"
        f"<div class='charts'>{''.join(charts)}</div><h2>Tasks to look at</h2>{table}"
        "</body></html>\n"
    )


def write_report(path: Path, res: ValidationRun, *, title: str = "Task quality") -> None:
    """Write the report to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(render_report(res, title))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
