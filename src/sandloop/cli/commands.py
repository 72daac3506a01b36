"""The ``sandloop`` command line: doctor, exec, exec-batch (and the commands of later layers).

``app`` is the whole command line as a typer app; ``cli/main.py`` is the entry point that runs
it, or a plain ``exec`` without it (``cli/exec_one.py``). Exit codes (``cli/exits.py``): 0 ok, 1 the work found failures, 2 bad input, 3 infrastructure.
Commands import what they run (engine, sandbox, rich tables) inside themselves, so that
``sandloop --help`` and argument errors stay fast.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar

import typer

from sandloop.cli import output
from sandloop.cli.exits import ExitCode, print_error
from sandloop.cli.lazy import LazyGroup, LazySub
from sandloop.cli.options import (
    Db,
    MemoryMb,
    NoIsolation,
    Out,
    Preload,
    RayAddress,
    Slots,
    TimeLimit,
    positive,
)

if TYPE_CHECKING:
    from sandloop.settings import Settings



class _Root(LazyGroup):
    # The command groups, listed after the commands in this order. Their modules load when
    # one of their commands runs (cli/lazy.py); the help texts must be the groups' own (a test
    # compares the listings).
    lazy: ClassVar[dict[str, LazySub]] = {
        "monitor": LazySub("sandloop.cli.monitor", "monitor_app",
                           "Reward monitoring: per-step statistics, reward-hack/drift/diversity/"
                           "infra alerts, audits, HTML report."),
        "episodes": LazySub("sandloop.cli.episodes", "episodes_app",
                            "Multi-turn episodes: list and replay recorded ones."),
        "cluster": LazySub("sandloop.cli.cluster", "cluster_app",
                           "The Ray cluster sandloop runs on (docs/cluster.md)."),
        "tasks": LazySub("sandloop.cli.tasks", "app",
                         "Task governance: inspect, validate, curate, grade, split and diff "
                         "task sets."),
        "env": LazySub("sandloop.cli.env", "app",
                       "Runtime environments: build specs into content-addressed read-only "
                       "trees, list, show, remove, verify; check determinism across slots."),
    }


app = typer.Typer(
    cls=_Root,
    help="sandloop: isolated, fast execution and trustworthy rewards for RL post-training. "
         "Exit codes: 0 ok, 1 the work found failures, 2 bad input, 3 infrastructure failed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def _isolation(no_isolation: bool) -> str:
    return "none" if no_isolation else "full"


def _error(message: str) -> None:
    """One line on stderr: the input, the field, the problem."""
    print_error(message)


def _settings() -> Settings:
    """The project's config (sandloop.toml / [tool.sandloop]); a bad one is exit 2."""
    from sandloop.settings import ConfigError, load_settings

    try:
        return load_settings()
    except ConfigError as e:
        _error(str(e))
        raise typer.Exit(ExitCode.BAD_INPUT) from None


def _version(value: bool) -> None:
    if value:
        from sandloop import __version__

        print(f"sandloop {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q",
                                        help="No progress or notes on stderr (errors still).")
                     ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v",
                                          help="More detail: tracebacks of internal errors.")
                       ] = False,
) -> None:
    if quiet and verbose:
        raise typer.BadParameter("--quiet and --verbose exclude each other")
    output.state.quiet, output.state.verbose = quiet, verbose


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
) -> None:
    """Report which isolation features work on this host and what `exec` will use."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from sandloop.sandbox import host
    from sandloop.sandbox.jailbuild import find_jail
    from sandloop.sandbox.languages import LanguageUnavailable, spec_for
    from sandloop.sandbox.models import LANGUAGES
    from sandloop.sandbox.pool import DEFAULT_UID_BASE, unisolated_interpreter
    from sandloop.sandbox.slot import default_python

    report = host.probe()
    langs = {}
    for lang in LANGUAGES:
        try:
            spec_for(lang).check_available()
            langs[lang] = "ok"
        except LanguageUnavailable as e:
            langs[lang] = str(e)
    slots = os.cpu_count() or 1
    jail = find_jail()
    # Who --no-isolation runs programs as: never root (see sandbox/unisolated.py).
    none_python, none_as = asyncio.run(unisolated_interpreter(
        default_python(), DEFAULT_UID_BASE if os.geteuid() == 0 else None,
        given=bool(os.environ.get("SANDLOOP_PYTHON"))))
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
            "unisolated_identity": {"uid": none_as.uid, "detail": none_as.describe(),
                                    "python": none_python,
                                    "python_error": none_as.python_error},
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
    out.print(f"--no-isolation runs programs {none_as.describe()}"
              + (f"\n[red]but Python programs cannot run then:[/] {none_as.python_error}"
                 if none_as.python_error else f"; Python programs on {none_python}"))
    raise typer.Exit(0 if report.full else 1)


@app.command("exec")
def exec_(
    source: Annotated[Path, typer.Argument(help="Program file ('-' reads standard input).",
                                           dir_okay=False)],
    language: Annotated[str | None, typer.Option(
        "--language", "-l", help="python, c, cpp, javascript, bash, java, go, rust or "
                                 "typescript; default: from the file extension.")] = None,
    time_limit: TimeLimit = 10.0,
    memory_mb: MemoryMb = 512,
    stdin: Annotated[Path | None, typer.Option("--stdin", dir_okay=False,
                                               help="File fed to the program's stdin.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one ExecResult JSON object.")] = False,
    no_isolation: NoIsolation = False,
    environment: Annotated[str | None, typer.Option(
        "--env", help="Runtime environment (name or id, `sandloop env ls`); default: the "
                      "language's built-in.")] = None,
) -> None:
    """Run one program in the sandbox. Exit 0: it succeeded; 1: it failed; 3: sandbox_error."""
    from sandloop.cli.exec_one import ExecArgs, exec_command

    raise typer.Exit(exec_command(ExecArgs(
        source=source, language=language, time_limit=time_limit, memory_mb=memory_mb,
        stdin=stdin, as_json=as_json, no_isolation=no_isolation, environment=environment)))


@app.command("exec-batch")
def exec_batch(
    file: Annotated[Path, typer.Argument(help="JSONL: one request per line ('-' for stdin).",
                                         dir_okay=False)],
    slots: Slots = None,
    table: Annotated[bool, typer.Option("--table", help="Print a readable table instead of JSONL.")] = False,
    strict: Annotated[bool, typer.Option(
        "--strict", help="A bad line stops the batch before anything runs (default: it is "
                         "reported as that line's invalid_request result).")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Take results the store already holds for identical requests (an "
                         "interrupted batch) instead of running them again.")] = False,
    db: Db = None,
    no_db: Annotated[bool, typer.Option("--no-db", help="Neither read nor write the result store.")] = False,
    no_isolation: NoIsolation = False,
    ray: RayAddress = None,
) -> None:
    """Run many programs in parallel; print one ExecResult JSON per line, in input order.

    Each line: {"language", "source", "stdin", "files", "limits": {"time_s", "memory_mb", ...}}.
    Exit 0: all ran (whatever the programs did); 2: some lines were invalid; 3: sandbox_error.
    """
    from sandloop.cli.batch import exec_batch_command

    raise typer.Exit(exec_batch_command(
        file, slots=slots, table=table, strict=strict, isolation=_isolation(no_isolation),
        db=db, no_db=no_db, resume=resume, settings=_settings(), ray=ray))


@app.command()
def score(
    tasks: Annotated[str, typer.Option("--tasks", help="Built-in set (humaneval) or a JSONL task file.")],
    completions: Annotated[Path, typer.Option("--completions", dir_okay=False, help="JSONL: {task_id, completion[, completion_id]}.")],
    out: Out = None,
    format: Annotated[str | None, typer.Option("--format", help="native|humaneval|mbpp|codecontests|apps|taco|stdio (default: detect).")] = None,
    db: Db = None,
    no_db: Annotated[bool, typer.Option("--no-db", help="Neither read nor write the result store.")] = False,
    k: Annotated[list[int] | None, typer.Option("--k", min=1, help="pass@k to report (repeatable; every task needs >= k completions).")] = None,
    reward: Annotated[str, typer.Option("--reward", help="binary|fraction|weighted")] = "binary",
    reward_on: Annotated[str, typer.Option("--reward-on", help="hidden|public|all")] = "hidden",
    time_scale: Annotated[float, typer.Option("--time-scale", callback=positive, max=1000, help="Multiply every per-test time limit (> 0).")] = 1.0,
    slots: Slots = None,
    no_isolation: NoIsolation = False,
    as_json: Annotated[bool, typer.Option("--json", help="Summary as one JSON object.")] = False,
    preload: Preload = None,
    step: Annotated[int | None, typer.Option("--step", help="Training step of these rollouts (a line's 'step' wins); needs --rollout-log.")] = None,
    group: Annotated[str | None, typer.Option("--group", help="Rollout group (a line's 'group' wins; default: the task id).")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Training run in the rollout log (default: default).")] = None,
    rollout_log: Annotated[Path | None, typer.Option("--rollout-log", help="Append the scored rollouts to this SQLite rollout log; default $SANDLOOP_ROLLOUT_LOG.")] = None,
    ray: RayAddress = None,
) -> None:
    """Score model completions against a task set (pass@k, verdicts, JSONL out, resumable).

    Exit 0: scored (whatever the rewards); 2: bad input; 3: some rewards are null (the
    infrastructure failed for them).
    """
    from sandloop.cli.score import score_command

    settings = _settings()
    raise typer.Exit(score_command(tasks, completions, out, format, db, no_db,
                                   tuple(k) if k else None, reward, reward_on, time_scale,
                                   slots or settings.slots, no_isolation, as_json,
                                   preload_extra=tuple(preload or ()), step=step, group=group,
                                   run_id=run_id, rollout_log=rollout_log, settings=settings,
                                   ray_address=ray))


@app.command()
def demo() -> None:
    """Score the bundled HumanEval demo completions (references, wrong and cheating ones)."""
    from sandloop.cli.score import demo_completions_path, score_command

    raise typer.Exit(score_command("humaneval", demo_completions_path(), no_db=True,
                                   by_kind=True, settings=_settings()))


def _log_level(value: str) -> str:
    if value not in ("debug", "info", "warning", "error"):
        raise typer.BadParameter(f"{value!r}: use debug, info, warning or error")
    return value


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Listen address (non-loopback needs --api-keys-file).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 8080,
    api_keys_file: Annotated[Path | None, typer.Option("--api-keys-file", help="Hashed API keys (see `sandloop add-key`).")] = None,
    slots: Annotated[int | None, typer.Option(min=1, max=4096, help="Sandbox slots; default: 2 x cores.")] = None,
    no_isolation: NoIsolation = False,
    journal: Annotated[Path | None, typer.Option(help="Durable jobs, resumed after a crash.")] = None,
    db: Annotated[Path | None, typer.Option(help="Score results store.")] = None,
    task_set: Annotated[list[str] | None, typer.Option("--task-set", help="Task sets to serve (repeatable).")] = None,
    max_body_mb: Annotated[int, typer.Option(min=1, max=4096, help="Largest request body, MiB.")] = 16,
    log_level: Annotated[str, typer.Option(callback=_log_level, help="debug|info|warning|error")] = "info",
    preload: Preload = None,
    usage_db: Annotated[Path | None, typer.Option(
        "--usage-db", help="Where quota use per key is kept across restarts; default: next to "
                           "the keys file (KEYS.usage.sqlite).")] = None,
    max_sessions: Annotated[int, typer.Option(min=1, help="Open sessions, all keys together.")] = 1024,
    max_sessions_per_key: Annotated[int, typer.Option(
        min=1, help="Open sessions per API key (a key's own max_sessions overrides).")] = 16,
    session_memory_mb: Annotated[int | None, typer.Option(
        min=1, help="Memory all sessions' files may hold (each: workdir_mb capped at memory_mb); "
             "default: half the host's memory.")] = None,
    public_docs: Annotated[bool, typer.Option(
        "--public-docs", help="Serve /openapi.json, /docs, /redoc without a key when keys are "
                              "on.")] = False,
    public_metrics: Annotated[bool, typer.Option(
        "--public-metrics", help="Serve /metrics without a key when keys are on.")] = False,
    rollout_log: Annotated[Path | None, typer.Option(
        "--rollout-log", help="SQLite log of the scored rollouts that come with a training step "
                              "(read by `sandloop monitor`).")] = None,
    ray: RayAddress = None,
    max_batch: Annotated[int | None, typer.Option(
        "--max-batch", min=1, max=1 << 20,
        help="Programs per request; default: the project's max_batch (sandloop.toml, "
             "SANDLOOP_MAX_BATCH), else 1024.")] = None,
    max_time_s: Annotated[float | None, typer.Option(
        "--max-time-s", callback=positive, max=86400,
        help="The most wall time one run may ask; default: the project's max_time_s, else "
             "300.")] = None,
    max_memory_mb: Annotated[int | None, typer.Option(
        "--max-memory-mb", min=1, max=1 << 22,
        help="The most memory one run may ask, MiB; default: the project's max_memory_mb, "
             "else 8192.")] = None,
    episode_db: Annotated[Path | None, typer.Option(
        "--episode-db", help="Where episodes are recorded for `sandloop episodes list/replay`; "
                             "default: --db, else the project's result store.")] = None,
    no_episode_log: Annotated[bool, typer.Option(
        "--no-episode-log", help="Do not record episodes.")] = False,
    audit_share: Annotated[float, typer.Option(
        "--audit-share", min=0.0, max=1.0,
        help="Share of the rollouts posted to /v1/monitor/rollouts re-scored on their "
             "served task's hidden tests (0: no live audit).")] = 0.1,
) -> None:
    """The HTTP service: native API, SandboxFusion /run_code, OpenRLHF /get_reward, /metrics.

    Per-run and per-request limits: the flags, else SANDLOOP_* variables, else the config file
    (sandloop.toml / [tool.sandloop])."""
    from sandloop.monitor.rolloutlog import RolloutLogError
    from sandloop.server.auth import KeysFileError
    from sandloop.server.cli import serve_command
    from sandloop.server.usage import UsageLedgerError

    project = _settings()  # file < environment; the flags below win over both
    if episode_db is None and not no_episode_log:  # every served episode is recorded unless asked not to
        from sandloop.settings import default_db_path
        episode_db = db if db is not None else default_db_path(project)
    try:
        serve_command(host, port, api_keys_file, slots, no_isolation, journal, db,
                      tuple(task_set or ["humaneval"]), max_body_mb, log_level,
                      tuple(preload or ()), usage_db, max_sessions=max_sessions,
                      max_sessions_per_key=max_sessions_per_key,
                      session_memory_mb=session_memory_mb, public_docs=public_docs,
                      public_metrics=public_metrics, rollout_log=rollout_log, ray_address=ray,
                      max_batch=project.max_batch if max_batch is None else max_batch,
                      max_time_s=project.max_time_s if max_time_s is None else max_time_s,
                      max_memory_mb=(project.max_memory_mb if max_memory_mb is None
                                     else max_memory_mb),
                      episode_db=episode_db, record_episodes=not no_episode_log,
                      audit_share=audit_share)
    except (ValueError, KeysFileError, UsageLedgerError, RolloutLogError) as e:
        _error(str(e))
        raise typer.Exit(ExitCode.BAD_INPUT) from None


@app.command("add-key")
def add_key(
    keys_file: Annotated[Path, typer.Option("--keys-file", help="The keys file (created 0600 if missing).")],
    key_id: Annotated[str, typer.Option("--id", help="A name for the key (its client id).")],
    rate: Annotated[float | None, typer.Option(callback=positive, help="Runs per second (token bucket).")] = None,
    burst: Annotated[float | None, typer.Option(callback=positive, help="Bucket size.")] = None,
    max_runs: Annotated[int | None, typer.Option(min=1, help="Quota: total runs.")] = None,
    max_concurrent: Annotated[int | None, typer.Option(min=1, help="Runs in flight at once.")] = None,
    max_sessions: Annotated[int | None, typer.Option(
        min=1, help="Sessions open at once (default: the server's --max-sessions-per-key).")] = None,
) -> None:
    """Create an API key for `sandloop serve`; prints the token once (only its hash is stored)."""
    from sandloop.server.auth import KeysFileError
    from sandloop.server.auth import add_key as create

    try:
        print(create(keys_file, key_id, rate=rate, burst=burst, max_runs=max_runs,
                     max_concurrent=max_concurrent, max_sessions=max_sessions))
    except (ValueError, KeysFileError, OSError) as e:
        _error(str(e))
        raise typer.Exit(ExitCode.BAD_INPUT) from None


app.command("train")(__import__("sandloop.cli.train", fromlist=["train"]).train)
