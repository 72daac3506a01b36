"""The live dashboard served at ``/dashboard``: one self-contained page (inline script and
styles, SVG drawn in the browser, nothing fetched but its own data endpoint), polling
``/dashboard/data`` for the steps completed since its last poll."""

from __future__ import annotations

__all__ = ["DASHBOARD_HTML"]

DASHBOARD_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sandloop monitor</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:sans-serif;margin:20px;max-width:940px;color:#111827}
.kpi span{display:inline-block;margin-right:18px;font-size:14px}
svg{border:1px solid #e5e7eb;margin-top:10px;width:100%}
#alerts li{margin:4px 0} .code{font-weight:bold;color:#dc2626}
</style></head><body>
<h1>sandloop monitor <small id="run"></small></h1>
<div class="kpi"><span>steps: <b id="steps-count">0</b></span><span>last reward mean:
<b id="last-mean">-</b></span><span>alerts: <b id="alerts-count">0</b></span>
<span id="status">connecting</span></div>
<svg id="reward-chart" viewBox="0 0 900 240"></svg>
<svg id="health-chart" viewBox="0 0 900 200"></svg>
<h2>Alerts</h2><ul id="alerts"></ul>
<script>
"use strict";
const W = 900, L = 44, R = 10, T = 18, B = 24;
let steps = [], alerts = [], run = null, since = -1;
// The page's own ?api_key= (servers with keys on) and ?run= (a run to watch; default: the
// latest, followed as new runs start) go on to every data request.
const page = new URLSearchParams(location.search);
const apiKey = page.get("api_key"), pinned = page.get("run");
const NS = "http://www.w3.org/2000/svg";
function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function chart(svg, height, title, series, band) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  svg.appendChild(el("text", {x: L, y: 13, "font-size": 12, "font-weight": "bold"}, title));
  if (!steps.length) return;
  const x0 = steps[0].step, x1 = Math.max(steps[steps.length - 1].step, x0 + 1);
  const X = v => L + (v - x0) / (x1 - x0) * (W - L - R);
  const Y = v => height - B - v * (height - T - B);
  for (let i = 0; i <= 4; i++) {
    svg.appendChild(el("line", {x1: L, x2: W - R, y1: Y(i / 4), y2: Y(i / 4), stroke: "#eee"}));
    svg.appendChild(el("text", {x: L - 4, y: Y(i / 4) + 4, "font-size": 10,
                                "text-anchor": "end"}, (i / 4).toFixed(2)));
  }
  svg.appendChild(el("text", {x: L, y: height - 6, "font-size": 10}, String(x0)));
  svg.appendChild(el("text", {x: W - R, y: height - 6, "font-size": 10, "text-anchor": "end"},
                     String(x1)));
  if (band) {
    const pts = band.filter(p => p[1] !== null);
    if (pts.length) {
      let d = pts.map((p, i) => (i ? "L" : "M") + X(p[0]) + "," + Y(p[2])).join(" ");
      d += " " + pts.slice().reverse().map(p => "L" + X(p[0]) + "," + Y(p[1])).join(" ") + " Z";
      svg.appendChild(el("path", {d: d, fill: "#2563eb", "fill-opacity": 0.18}));
    }
  }
  for (const s of series) {
    const pts = s.points.filter(p => p[1] !== null && p[1] !== undefined);
    if (!pts.length) continue;
    const d = pts.map((p, i) => (i ? "L" : "M") + X(p[0]) + "," + Y(Math.max(0, Math.min(1, p[1])))).join(" ");
    svg.appendChild(el("path", {d: d, fill: "none", stroke: s.colour, "stroke-width": 2,
                                class: "series", "data-name": s.name}));
  }
  for (const a of alerts) {
    const x = X(a.step);
    svg.appendChild(el("line", {x1: x, x2: x, y1: T, y2: height - B, stroke: "#dc2626",
                                "stroke-dasharray": "4 3", class: "alert-mark",
                                "data-code": a.code}));
    svg.appendChild(el("text", {x: x + 3, y: T + 10, "font-size": 10, fill: "#dc2626"}, a.code));
  }
  let lx = L + 220;
  for (const s of series) {
    svg.appendChild(el("text", {x: lx, y: 13, "font-size": 11, fill: s.colour}, s.name));
    lx += 9 * s.name.length + 20;
  }
}
function draw() {
  document.getElementById("run").textContent = run ? "run " + run : "";
  document.getElementById("steps-count").textContent = steps.length;
  const last = steps.length ? steps[steps.length - 1].reward_mean : null;
  document.getElementById("last-mean").textContent = last === null ? "-" : last.toFixed(3);
  document.getElementById("alerts-count").textContent = alerts.length;
  chart(document.getElementById("reward-chart"), 240, "reward per step",
        [{name: "reward mean", colour: "#2563eb",
          points: steps.map(s => [s.step, s.reward_mean])},
         {name: "pass rate", colour: "#16a34a", points: steps.map(s => [s.step, s.pass_rate])}],
        steps.map(s => [s.step, s.quantiles.p25 ?? null, s.quantiles.p75 ?? null]));
  chart(document.getElementById("health-chart"), 200, "health",
        [{name: "hack signatures", colour: "#dc2626", points: steps.map(s => [s.step, s.hack_share])},
         {name: "infra", colour: "#4b5563", points: steps.map(s => [s.step, s.infra_share])},
         {name: "diversity", colour: "#9333ea", points: steps.map(s => [s.step, s.group_diversity])}]);
  const ul = document.getElementById("alerts");
  while (ul.firstChild) ul.removeChild(ul.firstChild);
  for (const a of alerts) {
    const li = document.createElement("li");
    li.className = "alert";
    li.dataset.code = a.code;
    const c = document.createElement("span");
    c.className = "code";
    c.textContent = a.code;
    li.appendChild(c);
    li.appendChild(document.createTextNode(" at step " + a.step + ": " + a.detail));
    ul.appendChild(li);
  }
}
async function poll() {
  try {
    const q = new URLSearchParams({since: String(since)});
    if (pinned) q.set("run", pinned);
    if (apiKey) q.set("api_key", apiKey);
    const resp = await fetch("dashboard/data?" + q.toString(), {cache: "no-store"});
    if (!resp.ok) {
      document.getElementById("status").textContent = resp.status === 401
        ? "unauthorized: open this page as /dashboard?api_key=YOUR_KEY"
        : "error " + resp.status;
      return;
    }
    const data = await resp.json();
    // Another run (a newer one started): its steps from the first, at the next poll when this
    // answer held only those after the old run's last step.
    if (data.run !== run) {
      const partial = since >= 0;
      run = data.run; steps = []; since = -1;
      if (partial) return;
    }
    for (const s of data.steps) if (s.step > since) { steps.push(s); since = s.step; }
    alerts = data.alerts;
    document.getElementById("status").textContent = "live";
    draw();
  } catch (e) {
    document.getElementById("status").textContent = "disconnected: " + e;
  }
}
poll();
setInterval(poll, 1000);
</script></body></html>
"""
