"""``sandloop env``: build, list, show, remove and verify runtime environments, and check that
runs are deterministic across slots.

Registered by cli/main.py. The sandbox is imported inside ``check`` only, so that ``sandloop
--help`` stays fast.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sandloop.cli.exits import ExitCode, print_error
from sandloop.envs import (
    BUILTIN_ENVIRONMENTS,
    EnvInfo,
    EnvStore,
    builtin_spec,
    load_spec,
)
from sandloop.errors import EnvError, InputError

app = typer.Typer(help="Runtime environments: build specs into content-addressed read-only "
                       "trees, list, show, remove, verify; check determinism across slots.",
                  no_args_is_help=True, add_completion=False)
err = Console(stderr=True)

Store = Annotated[Path | None, typer.Option(
    "--store", help="Store directory (default: $SANDLOOP_ENV_DIR, else /var/lib/sandloop/envs).")]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Ref = Annotated[str, typer.Argument(help="Environment name, id or id prefix (>= 6 characters).")]


def _store(store: Path | None) -> EnvStore:
    if store is not None and store.exists() and not store.is_dir():
        print_error(f"--store {store}: not a directory (the environment store is one)")
        raise typer.Exit(ExitCode.BAD_INPUT)
    return EnvStore(store)


def _fail(e: EnvError) -> typer.Exit:
    """The one error line, and the exit: 2 for the caller's input (a bad spec, an unknown
    environment), 3 for a build that failed underneath (cli/exits.py)."""
    print_error(e)
    return typer.Exit(ExitCode.BAD_INPUT if isinstance(e, InputError)
                      else ExitCode.INFRASTRUCTURE)


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _summary(info: EnvInfo) -> str:
    py = info.resolved.get("python")
    parts = []
    if py:
        pk = py.get("installed") or []
        parts.append(f"python {py['version']}" + (f" + {', '.join(pk)}" if pk else ""))
    if info.resolved.get("spec", {}).get("node"):
        parts.append("node_modules")
    sysp = info.resolved.get("system") or {}
    if sysp:
        parts.append("system: " + ", ".join(f"{k} {v}" for k, v in sysp.items()))
    return "; ".join(parts) or "-"


@app.command()
def build(
    spec: Annotated[str, typer.Argument(
        help="Spec file (.toml, .yaml), or a built-in name: " + ", ".join(BUILTIN_ENVIRONMENTS))],
    store: Store = None,
    as_json: AsJson = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show each build step.")]
    = False,
) -> None:
    """Build an environment once into a read-only tree named by its content hash."""
    s = _store(store)
    builtin = spec in BUILTIN_ENVIRONMENTS and not Path(spec).exists()
    t0 = time.monotonic()
    try:
        env_spec = builtin_spec(spec) if builtin else load_spec(spec)
        info = s.build(env_spec, builtin=builtin,
                       log=(lambda m: err.print(m, markup=False, highlight=False))
                       if verbose else None)
    except EnvError as e:
        raise _fail(e) from None
    wall = time.monotonic() - t0
    if as_json:
        print(json.dumps({**json.loads(info.model_dump_json()), "wall_s": round(wall, 3)}))
        return
    print(f"{info.name} {info.id}")
    err.print(f"built in {wall:.1f} s ({', '.join(f'{k} {v:g}' for k, v in info.timings.items())}"
              f"); {info.files} files, {_size(info.size_bytes)}; {_summary(info)}")


@app.command("ls")
def ls(store: Store = None, as_json: AsJson = False) -> None:
    """List built environments (newest first) and the names pointing to them."""
    s = _store(store)
    infos = s.list()
    names = s.names()
    by_id: dict[str, list[str]] = {}
    for n, i in names.items():
        by_id.setdefault(i, []).append(n)
    if as_json:
        for info in infos:
            print(json.dumps({"id": info.id, "name": info.name, "names": by_id.get(info.id, []),
                              "built_at": info.built_at, "files": info.files,
                              "size_bytes": info.size_bytes, "summary": _summary(info)}))
        return
    t = Table(title=f"environments in {s.root}")
    for col in ("names", "id", "built", "size", "contents"):
        t.add_column(col)
    for info in infos:
        t.add_row(", ".join(by_id.get(info.id, [])) or f"({info.name})", info.short_id,
                  info.built_at, _size(info.size_bytes), _summary(info))
    Console().print(t)


@app.command()
def show(ref: Ref, store: Store = None) -> None:
    """Print an environment's record (JSON): resolved spec, timings, and how it is mounted."""
    try:
        info = _store(store).get(ref)
    except EnvError as e:
        raise _fail(e) from None
    env = info.environment()
    out: dict[str, Any] = json.loads(info.model_dump_json())
    out["mount"] = {"source": str(env.root), "target": env.mount_point,
                    "python": env.python, "preload": list(env.preload),
                    "env": env.env_vars(), "path": list(env.path)}
    print(json.dumps(out, indent=2))


@app.command()
def rm(refs: Annotated[list[str], typer.Argument(help="Names or ids to remove.")],
       store: Store = None) -> None:
    """Remove environments (and the names pointing to them)."""
    s = _store(store)
    for ref in refs:
        try:
            info = s.remove(ref)
        except EnvError as e:
            raise _fail(e) from None
        print(f"removed {info.name} {info.id}")


@app.command()
def verify(
    refs: Annotated[list[str] | None, typer.Argument(help="Names or ids (default: all).")] = None,
    store: Store = None,
    as_json: AsJson = False,
) -> None:
    """Re-hash environment trees against their manifests and ids; exit 1 if any changed."""
    s = _store(store)
    try:
        targets = refs or [i.id for i in s.list()]
        reports = [s.verify(r) for r in targets]
    except EnvError as e:
        raise _fail(e) from None
    for r in reports:
        if as_json:
            print(r.model_dump_json())
        else:
            mark = "[green]ok[/]" if r.ok else "[red]MODIFIED[/]"
            Console(soft_wrap=True).print(f"{mark} {r.name} {r.id[:12]}: {r.detail}", highlight=False)
    raise typer.Exit(0 if all(r.ok for r in reports) else 1)


@app.command()
def check(
    repeat: Annotated[int, typer.Option("--repeat", "-k", min=1, max=100,
                                        help="Rounds; each runs every probe once per slot.")] = 3,
    slots: Annotated[int | None, typer.Option("--slots", min=1, max=4096, help="Slots; default: cores.")] = None,
    environment: Annotated[str | None, typer.Option(
        "--env", help="Environment to probe (name or id); default: the built-in python.")]
    = None,
    as_json: AsJson = False,
) -> None:
    """Run the determinism probe set K times across all slots; report every probe whose
    outcome (status, output) differs. Exit 1 if any does."""
    from sandloop import _aio as aio
    from sandloop.envs.probes import PROBES, Probe, ProbeReport, check_determinism
    from sandloop.sandbox.models import Limits, Program
    from sandloop.sandbox.pool import SandboxPool

    async def go() -> tuple[int, list[ProbeReport]]:
        async with SandboxPool(slots, environment=environment) as pool:
            programs = {p.name: Program(language=p.language, source=p.source) for p in PROBES}

            async def one(probe: Probe) -> tuple[str, str]:
                r = await pool.run(programs[probe.name], Limits(time_s=10))
                return r.status.value, r.stdout + r.stderr + (r.error or "")

            # Sequential: the pool hands its slots out in FIFO order, so pool.size runs in a
            # row visit every slot once (concurrent runs need not).
            return pool.size, await check_determinism(one, repeat=repeat, width=pool.size)

    try:
        n_slots, reports = aio.run(go())
    except EnvError as e:
        raise _fail(e) from None
    bad = [r for r in reports if not r.deterministic]
    if as_json:
        for r in reports:
            print(json.dumps({"probe": r.probe.name, "pins": r.probe.pins,
                              "deterministic": r.deterministic,
                              "variants": [{"status": s, "output": o, "count": n}
                                           for s, o, n in r.variants]}))
    else:
        out = Console(soft_wrap=True)
        runs = repeat * n_slots
        for r in reports:
            if r.deterministic:
                out.print(f"[green]same[/]      {r.probe.name}: {runs} runs, one outcome "
                          f"({r.probe.pins})", highlight=False)
            else:
                out.print(f"[red]DIFFERS[/]   {r.probe.name}: {len(r.variants)} outcomes in "
                          f"{runs} runs ({r.probe.pins})", highlight=False)
                for s, o, n in r.variants[:5]:
                    shown = o.strip().replace("\n", " | ")[:160]
                    out.print(f"            {n}x {s}: {shown}", highlight=False, markup=False)
        sys.stdout.flush()
    raise typer.Exit(1 if bad else 0)
