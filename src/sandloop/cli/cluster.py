"""``sandloop cluster status ADDRESS``: the sandloop nodes of a Ray cluster and their pools."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sandloop.cli.exits import ExitCode, print_error
from sandloop.cli.output import results_stdout as results_stdout  # its former home

cluster_app = typer.Typer(help="The Ray cluster sandloop runs on (docs/cluster.md).",
                          no_args_is_help=True)

_COLUMNS = ("slots", "running", "queued", "runs", "runs_per_s", "failures", "sessions",
            "channel", "channel_refused")


def cluster_nodes(address: str | None, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """One row per Ray node offering ``sandloop``: its resources and, when an engine's pool
    actor runs there, that pool's counters as the node reports them."""
    from sandloop.engine.ray_backend import NAMESPACE, RESOURCE, actor_name, connect

    ray, owned = connect(address)
    try:
        rows = []
        for n in ray.nodes():
            res = n.get("Resources") or {}
            if res.get(RESOURCE, 0) <= 0:
                continue
            row: dict[str, Any] = {
                "node_id": n["NodeID"], "address": n.get("NodeManagerAddress", ""),
                "alive": bool(n.get("Alive")), "cpus": res.get("CPU", 0.0),
                "memory_mb": int(res.get("memory", 0) // (1 << 20)), "pool": "none"}
            if row["alive"]:
                try:
                    actor = ray.get_actor(actor_name(n["NodeID"]), namespace=NAMESPACE)
                except ValueError:
                    pass  # no engine holds this node now
                else:
                    try:
                        row.update(ray.get(actor.stats.remote(), timeout=timeout_s))
                        row["pool"] = "ready"
                    except Exception as e:  # starting, or dying: say so, keep listing
                        row["pool"] = f"unreachable ({type(e).__name__})"
            rows.append(row)
        return rows
    finally:
        if owned:
            ray.shutdown()


@cluster_app.command("status")
def status(
    address: Annotated[str, typer.Argument(help="HOST:PORT of the Ray cluster's head.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per node.")] = False,
) -> None:
    """Per node: slots, runs in flight and queued, runs, runs/s (last 10 s), failures."""
    from sandloop.engine.cluster import ClusterUnavailable

    err = Console(stderr=True)
    try:
        rows = cluster_nodes(address)
    except ClusterUnavailable as e:
        print_error(e)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row, sort_keys=True) + "\n")
        raise typer.Exit(0 if rows else 1)
    if not rows:
        err.print("no node offers the 'sandloop' resource; start workers with "
                  "ray start --address=HEAD:PORT --resources='{\"sandloop\": 1}'")
        raise typer.Exit(1)
    t = Table(title=f"sandloop cluster at {address}: {len(rows)} nodes")
    for col in ("node", "address", "alive", "cpus", "memory MiB", "pool", *_COLUMNS):
        t.add_column(col, no_wrap=True)
    for r in rows:
        t.add_row(r["node_id"][:12], r["address"], "yes" if r["alive"] else "no",
                  f"{r['cpus']:g}", str(r["memory_mb"]), r["pool"],
                  *(str(r.get(c, "-")) for c in _COLUMNS))
    Console().print(t)
