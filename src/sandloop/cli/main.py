"""The ``sandloop`` command line: doctor, exec, exec-batch (and the commands of later layers)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from sandloop import _aio as aio
from sandloop.engine import Engine
from sandloop.sandbox import host
from sandloop.sandbox.jailbuild import build_jail
from sandloop.sandbox.languages import LanguageUnavailable, spec_for
from sandloop.sandbox.models import LANGUAGES, ExecResult, Limits, Program, Status
from sandloop.sandbox.pool import SandboxPool
from sandloop.sandbox.requests import BatchRequestError, ExecRequest, read_requests

app = typer.Typer(
    help="sandloop: isolated, fast execution and trustworthy rewards for RL post-training.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True)

_EXT = {".py": "python", ".c": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".js": "javascript",
        ".mjs": "javascript", ".sh": "bash", ".bash": "bash"}

NoIsolation = Annotated[
    bool,
    typer.Option("--no-isolation",
                 help="Explicit opt-out: run WITHOUT isolation (only for hosts that cannot "
                      "isolate and code you trust). Results say isolation='none'."),
]
Preload = Annotated[
    list[str] | None,
    typer.Option("--preload", help="Also keep MODULE imported in every slot, e.g. unittest for "
                                   "unittest-based suites (repeatable)."),
]


def _isolation(no_isolation: bool) -> str:
    return "none" if no_isolation else "full"


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
) -> None:
    """Report which isolation features work on this host and what `exec` will use."""
    report = host.probe()
    langs = {}
    for lang in LANGUAGES:
        try:
            spec_for(lang).check_available()
            langs[lang] = "ok"
        except LanguageUnavailable as e:
            langs[lang] = str(e)
    slots = os.cpu_count() or 1
    jail = build_jail()
    if as_json:
        print(json.dumps({
            "level": report.level,
            "cgroup_version": report.cgroup_version,
            "features": [{"name": f.name, "ok": f.ok, "detail": f.detail, "fix": f.fix}
                         for f in report.features],
            "languages": langs,
            "default_slots": slots,
            "child_setup": "c" if jail.path else "python",
            "child_setup_detail": jail.detail,
        }))
        raise typer.Exit(0 if report.full else 1)
    out = Console()
    t = Table(title="sandloop doctor: isolation on this host")
    t.add_column("feature")
    t.add_column("status")
    t.add_column("detail")
    for f in report.features:
        t.add_row(f.name, "[green]ok[/]" if f.ok else "[red]missing[/]",
                  f.detail + (f"\n[yellow]fix:[/] {f.fix}" if f.fix else ""))
    out.print(t)
    lt = Table(title="languages")
    lt.add_column("language")
    lt.add_column("status")
    for lang, st in langs.items():
        lt.add_row(lang, "[green]ok[/]" if st == "ok" else f"[red]{st}[/]")
    out.print(lt)
    if report.full:
        out.print(f"[bold green]exec will use: full isolation[/] (pid/mount/net/ipc/uts/cgroup "
                  f"namespaces, per-slot uid, seccomp, a cgroup v{report.cgroup_version} group "
                  f"per run); "
                  f"{slots} warm slots by default.")
        out.print(f"each run isolates itself with: {jail.detail}")
    else:
        out.print("[bold red]exec will refuse to run untrusted code[/] (every run is a "
                  "sandbox_error) until the missing features are fixed, unless you pass "
                  "--no-isolation.")
    raise typer.Exit(0 if report.full else 1)


def _print_human(r: ExecResult) -> None:
    if r.compile is not None and r.compile.status is not Status.OK:
        sys.stderr.write(r.compile.stderr)
    sys.stdout.write(r.stdout)
    sys.stdout.flush()
    sys.stderr.write(r.stderr)
    colour = "green" if r.ok else "red"
    detail = f" exit={r.exit_code}" if r.exit_code is not None else ""
    detail += f" signal={r.signal}" if r.signal is not None else ""
    err.print(f"[{colour}]{r.status.value}[/]{detail} wall={r.wall_time_s:.3f}s "
              f"cpu={r.cpu_time_s:.3f}s mem={r.peak_memory_mb:.1f}MiB"
              + (f" [red]{r.error}[/]" if r.error else ""))


@app.command("exec")
def exec_(
    source: Annotated[Path, typer.Argument(help="Program file ('-' reads standard input).")],
    language: Annotated[str | None, typer.Option("--language", "-l",
                                                 help=f"One of {', '.join(LANGUAGES)}; "
                                                      "default: from the file extension.")] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", help="Wall-clock seconds.")] = 10.0,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Memory + swap, MiB.")] = 512,
    stdin: Annotated[Path | None, typer.Option("--stdin", help="File fed to the program's stdin.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one ExecResult JSON object.")] = False,
    no_isolation: NoIsolation = False,
) -> None:
    """Run one program in the sandbox."""
    if str(source) == "-":
        text = sys.stdin.read()
    else:
        try:
            text = source.read_text()
        except OSError as e:
            err.print(f"[red]cannot read {source}: {e.strerror}[/]")
            raise typer.Exit(2) from e
    lang = language or _EXT.get(source.suffix.lower())
    if lang is None:
        err.print(f"[red]cannot tell the language of {source}; pass --language[/]")
        raise typer.Exit(2)
    try:
        program = Program(language=lang, source=text,
                          stdin=stdin.read_bytes() if stdin is not None else None)
        limits = Limits(time_s=time_limit, memory_mb=memory_mb)
    except (ValidationError, OSError) as e:
        err.print(f"[red]invalid request: {e}[/]")
        raise typer.Exit(2) from e

    async def go() -> ExecResult:
        async with SandboxPool(1, isolation=_isolation(no_isolation)) as pool:
            return await pool.run(program, limits)

    result = aio.run(go())
    if as_json:
        print(result.to_json())
    else:
        _print_human(result)
    raise typer.Exit(0 if result.ok else 1)


@app.command("exec-batch")
def exec_batch(
    file: Annotated[Path, typer.Argument(help="JSONL: one request per line ('-' for stdin).")],
    slots: Annotated[int | None, typer.Option("--slots", help="Parallel slots; default: cores.")] = None,
    table: Annotated[bool, typer.Option("--table", help="Print a readable table instead of JSONL.")] = False,
    no_isolation: NoIsolation = False,
) -> None:
    """Run many programs in parallel; print one ExecResult JSON per line, in input order.

    Each line: {"language", "source", "stdin", "files", "limits": {"time_s", "memory_mb", ...}}.
    """
    try:
        lines = sys.stdin.read().splitlines() if str(file) == "-" else file.read_text().splitlines()
        requests = read_requests(lines)
    except OSError as e:
        err.print(f"[red]cannot read {file}: {e.strerror}[/]")
        raise typer.Exit(2) from e
    except BatchRequestError as e:
        err.print(f"[red]{e}[/]")
        raise typer.Exit(2) from e
    results = aio.run(_run_batch(requests, slots, _isolation(no_isolation), print_jsonl=not table))
    if table:
        _print_table(requests, results)
    raise typer.Exit(0 if all(r.status is not Status.SANDBOX_ERROR for r in results) else 1)


async def _run_batch(requests: list[ExecRequest], slots: int | None, isolation: str,
                     *, print_jsonl: bool) -> list[ExecResult]:
    """Run through the engine; print results in input order as soon as each prefix is done."""
    results: list[ExecResult | None] = [None] * len(requests)
    printed = 0
    async with Engine(slots=slots, isolation=isolation, max_attempts=2) as engine:
        async for i, r in engine.stream(((q.program, q.limits) for q in requests),
                                        client="exec-batch"):
            results[i] = r
            while printed < len(results) and (ready := results[printed]) is not None:
                if print_jsonl:
                    sys.stdout.write(ready.to_json() + "\n")
                    sys.stdout.flush()
                printed += 1
    return [r for r in results if r is not None]


def _summary_line(r: ExecResult) -> str:
    for text in (r.stdout, r.stderr, r.compile.stderr if r.compile else "", r.error or ""):
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        if lines:
            return (lines[0] if text is r.stdout else lines[-1])[:70]
    return ""


def _print_table(requests: list[ExecRequest], results: list[ExecResult]) -> None:
    out = Console(width=None if sys.stdout.isatty() else 160)
    t = Table(title=f"sandloop exec-batch: {len(results)} programs")
    for col in ("#", "name", "language", "status", "exit", "wall s", "cpu s", "peak MiB", "output"):
        t.add_column(col, no_wrap=col != "name", overflow="ellipsis")
    colours = {Status.OK: "green", Status.SANDBOX_ERROR: "magenta"}
    for i, (req, r) in enumerate(zip(requests, results, strict=True), 1):
        ended = f"sig {r.signal}" if r.signal is not None else (
            "" if r.exit_code is None else str(r.exit_code))
        t.add_row(str(i), req.name or "", req.program.language,
                  f"[{colours.get(r.status, 'red')}]{r.status.value}[/]", ended,
                  f"{r.wall_time_s:.3f}", f"{r.cpu_time_s:.3f}", f"{r.peak_memory_mb:.1f}",
                  _summary_line(r))
    out.print(t)


@app.command()
def score(
    tasks: Annotated[str, typer.Option("--tasks", help="Built-in set (humaneval) or a JSONL task file.")],
    completions: Annotated[Path, typer.Option("--completions", help="JSONL: {task_id, completion[, completion_id]}.")],
    out: Annotated[Path | None, typer.Option("--out", help="Write one result line per completion.")] = None,
    format: Annotated[str | None, typer.Option("--format", help="native|humaneval|mbpp|codecontests|apps|taco|stdio (default: detect).")] = None,
    db: Annotated[Path | None, typer.Option("--db", help="Result store; default $SANDLOOP_DB or ~/.cache/sandloop/results.db.")] = None,
    no_db: Annotated[bool, typer.Option("--no-db", help="Neither read nor write the result store.")] = False,
    k: Annotated[list[int] | None, typer.Option("--k", help="pass@k to report (repeatable).")] = None,
    reward: Annotated[str, typer.Option("--reward", help="binary|fraction|weighted")] = "binary",
    reward_on: Annotated[str, typer.Option("--reward-on", help="hidden|public|all")] = "hidden",
    time_scale: Annotated[float, typer.Option("--time-scale", help="Multiply every per-test time limit.")] = 1.0,
    slots: Annotated[int | None, typer.Option("--slots", help="Parallel slots; default: cores.")] = None,
    no_isolation: NoIsolation = False,
    as_json: Annotated[bool, typer.Option("--json", help="Summary as one JSON object.")] = False,
    preload: Preload = None,
) -> None:
    """Score model completions against a task set (pass@k, verdicts, JSONL out, resumable)."""
    from sandloop.cli.score import score_command

    raise typer.Exit(score_command(tasks, completions, out, format, db, no_db, tuple(k or (1, 10, 100)),
                                   reward, reward_on, time_scale, slots, no_isolation, as_json,
                                   progress=sys.stderr.isatty(), preload_extra=tuple(preload or ())))


@app.command()
def demo() -> None:
    """Score the bundled HumanEval demo completions (references, wrong and cheating ones)."""
    from sandloop.cli.score import demo_completions_path, score_command

    raise typer.Exit(score_command("humaneval", demo_completions_path(), no_db=True,
                                   progress=sys.stderr.isatty(), by_kind=True))


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Listen address (non-loopback needs --api-keys-file).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    api_keys_file: Annotated[Path | None, typer.Option("--api-keys-file", help="Hashed API keys (see `sandloop add-key`).")] = None,
    slots: Annotated[int | None, typer.Option(help="Sandbox slots; default: 2 x cores.")] = None,
    no_isolation: NoIsolation = False,
    journal: Annotated[Path | None, typer.Option(help="Durable jobs, resumed after a crash.")] = None,
    db: Annotated[Path | None, typer.Option(help="Score results store.")] = None,
    task_set: Annotated[list[str] | None, typer.Option("--task-set", help="Task sets to serve (repeatable).")] = None,
    max_body_mb: Annotated[int, typer.Option(help="Largest request body.")] = 16,
    log_level: Annotated[str, typer.Option(help="debug|info|warning|error")] = "info",
    preload: Preload = None,
    usage_db: Annotated[Path | None, typer.Option(
        "--usage-db", help="Where quota use per key is kept across restarts; default: next to "
                           "the keys file (KEYS.usage.sqlite).")] = None,
) -> None:
    """The HTTP service: native API, SandboxFusion /run_code, OpenRLHF /get_reward, /metrics."""
    from sandloop.server.auth import KeysFileError
    from sandloop.server.cli import serve_command
    from sandloop.server.usage import UsageLedgerError

    try:
        serve_command(host, port, api_keys_file, slots, no_isolation, journal, db,
                      tuple(task_set or ["humaneval"]), max_body_mb, log_level,
                      tuple(preload or ()), usage_db)
    except (ValueError, KeysFileError, UsageLedgerError) as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e


@app.command("add-key")
def add_key(
    keys_file: Annotated[Path, typer.Option("--keys-file", help="The keys file (created 0600 if missing).")],
    key_id: Annotated[str, typer.Option("--id", help="A name for the key (its client id).")],
    rate: Annotated[float | None, typer.Option(help="Runs per second (token bucket).")] = None,
    burst: Annotated[float | None, typer.Option(help="Bucket size.")] = None,
    max_runs: Annotated[int | None, typer.Option(help="Quota: total runs.")] = None,
    max_concurrent: Annotated[int | None, typer.Option(help="Runs in flight at once.")] = None,
) -> None:
    """Create an API key for `sandloop serve`; prints the token once (only its hash is stored)."""
    from sandloop.server.auth import KeysFileError
    from sandloop.server.auth import add_key as create

    try:
        print(create(keys_file, key_id, rate=rate, burst=burst, max_runs=max_runs,
                     max_concurrent=max_concurrent))
    except (ValueError, KeysFileError, OSError) as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e


app.command("train")(__import__("sandloop.cli.train", fromlist=["train"]).train)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
