"""``sandloop exec-batch``: run a JSONL file of programs (registered by cli/main.py).

Every line is validated, and checked against the project's and the engine's limits, before
anything runs. A bad line becomes that line's result, ``{"status": "invalid_request", "line": N,
"error": "..."}``, and the others still run (``--strict``: a bad line stops the batch, nothing
runs). Results are printed in input order as each prefix is done, and kept in the result store as
they finish, so an interrupted batch is resumed with ``--resume`` without rerunning what finished.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandloop.cli.exits import ExitCode
from sandloop.cli.output import Progress, info

if TYPE_CHECKING:
    from sandloop.engine import Engine
    from sandloop.sandbox.models import ExecResult
    from sandloop.sandbox.requests import ExecRequest
    from sandloop.settings import Settings
    from sandloop.store import ResultKey, ResultStore

__all__ = ["INVALID_REQUEST", "Line", "exec_batch_command"]

INVALID_REQUEST = "invalid_request"
_STORE_CONFIG = "exec-batch/1"  # the config part of a stored run's key; bump if records change


@dataclass
class Line:
    """One request line: its number, the request (None if invalid), the error or the result."""

    number: int
    request: ExecRequest | None
    error: str | None = None
    result: ExecResult | None = None

    def to_json(self) -> str:
        if self.error is not None:
            return json.dumps({"status": INVALID_REQUEST, "line": self.number,
                               "error": self.error})
        assert self.result is not None
        return self.result.to_json()


def _read_lines(file: Path) -> list[bytes]:
    data = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
    return data.split(b"\n")


def _check_project_limits(line: Line, settings: Settings) -> None:
    """Mark ``line`` invalid if its limits pass the project's maxima (no engine needed)."""
    req = line.request
    assert req is not None
    lim = req.limits
    if lim.time_s > settings.max_time_s:
        line.error = (f"line {line.number}: limits.time_s: {lim.time_s:g} s is over the "
                      f"project's max_time_s={settings.max_time_s:g} (sandloop.toml)")
    elif lim.memory_mb > settings.max_memory_mb:
        line.error = (f"line {line.number}: limits.memory_mb: {lim.memory_mb} MiB is over the "
                      f"project's max_memory_mb={settings.max_memory_mb} (sandloop.toml)")
    if line.error is not None:
        line.request = None


def _check_budget(line: Line, engine: Engine) -> None:
    """Mark ``line`` invalid if the engine could never admit it (its memory or CPU budget)."""
    from sandloop.engine import ResourceTooLarge

    req = line.request
    assert req is not None
    try:
        engine.check_admissible(req.program, req.limits)
    except ResourceTooLarge as e:
        line.error = f"line {line.number}: limits: {e}"
        line.request = None


async def _check_environments(lines: list[Line]) -> None:
    """Mark lines invalid whose ``environment`` is not built here (a built-in is built now, on
    first use), before anything runs: a request's unknown environment is that line's error,
    never a run's sandbox_error."""
    import asyncio

    from sandloop.envs import EnvStore
    from sandloop.errors import EnvError

    names = {ln.request.environment for ln in lines
             if ln.request is not None and ln.request.environment is not None}
    if not names:
        return
    store = EnvStore()
    problems: dict[str, str] = {}
    for name in sorted(names):
        try:
            await asyncio.to_thread(store.ensure, name)
        except EnvError as e:
            problems[name] = str(e)
    for ln in lines:
        if ln.request is not None and ln.request.environment in problems:
            ln.error = f"line {ln.number}: environment: {problems[ln.request.environment]}"
            ln.request = None


def _key(req: ExecRequest) -> ResultKey:
    from sandloop.engine.journal import content_digest
    from sandloop.store import ResultKey

    return ResultKey("exec-batch", "", content_digest(req.program, req.limits), _STORE_CONFIG)


def exec_batch_command(file: Path, *, slots: int | None, table: bool, strict: bool,
                       isolation: str, db: Path | None, no_db: bool, resume: bool,
                       settings: Settings, ray: str | None = None) -> int:
    """Run the batch; returns the exit code: 3 if a run hit a sandbox_error, else 2 if a line
    was invalid, else 0 (a program's own failure is a result, not an error)."""
    from sandloop import _aio as aio
    from sandloop.cli.store_open import open_result_store
    from sandloop.sandbox.requests import BatchRequestError, parse_request_lines
    from sandloop.store import StoreError

    try:
        parsed = parse_request_lines(_read_lines(file))
    except OSError as e:
        _fail(f"cannot read {file}: {e.strerror or e}")
        return ExitCode.BAD_INPUT
    lines = [Line(n, None, str(r)) if isinstance(r, BatchRequestError) else Line(n, r)
             for n, r in parsed]
    for ln in lines:  # the project's maxima now; the engine's budget once it has started
        if ln.request is not None:
            _check_project_limits(ln, settings)
    bad = [ln for ln in lines if ln.error is not None]
    if bad and (strict or len(bad) == len(lines)):
        # Nothing to run: the first problem (and how many more) is the answer.
        more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
        _fail(f"{file}: {bad[0].error}{more}; nothing was run")
        return ExitCode.BAD_INPUT
    if not lines:
        _fail(f"{file}: no requests (the file is empty)")
        return ExitCode.BAD_INPUT
    try:
        store = open_result_store(db, no_db, settings)
    except StoreError as e:
        _fail(str(e))
        return ExitCode.BAD_INPUT
    from sandloop.engine.cluster import ClusterUnavailable

    interrupted = False
    try:
        aio.run(_run(lines, slots or settings.slots, isolation, store, resume=resume,
                     strict=strict, settings=settings, print_jsonl=not table, ray=ray))
    except KeyboardInterrupt:
        interrupted = True
    except ClusterUnavailable as e:
        _fail(str(e))
        return ExitCode.BAD_INPUT
    finally:
        if store is not None:
            store.close()
    if table:
        _print_table(lines)
    if interrupted:
        done = sum(ln.result is not None for ln in lines)
        info(f"exec-batch: interrupted, {done}/{len(lines)} finished"
             + (f"; finished runs are kept in {store.path}: rerun with --resume to run only "
                "the rest" if store is not None else ""))
        return 130
    if any(ln.error for ln in lines):
        if strict:
            _fail(f"{file}: " + next(ln.error for ln in lines if ln.error) + "; nothing was run")
        else:
            info(f"exec-batch: {sum(bool(ln.error) for ln in lines)} invalid line(s) reported "
                 f"as {INVALID_REQUEST} results; the others ran")
    if any(ln.result is not None and ln.result.status.value == "sandbox_error" for ln in lines):
        return ExitCode.INFRASTRUCTURE
    return ExitCode.BAD_INPUT if any(ln.error for ln in lines) else ExitCode.OK


def _fail(message: str) -> None:
    from sandloop.cli.exits import one_line

    sys.stderr.write(f"sandloop: error: {one_line(message)}\n")


async def _run(lines: list[Line], slots: int | None, isolation: str, store: ResultStore | None,
               *, resume: bool, strict: bool, settings: Settings, print_jsonl: bool,
               ray: str | None = None) -> None:
    """Vet the limits, take stored results (``resume``), run the rest through the engine, and
    print JSONL in input order as soon as each prefix is done."""
    from sandloop.cli.output import results_stdout

    printed = 0
    out = sys.stdout  # the results' stream: stdout, kept apart from Ray's prints below

    def flush() -> None:
        nonlocal printed
        start = printed
        while printed < len(lines) and (lines[printed].result is not None
                                        or lines[printed].error is not None):
            printed += 1
        if print_jsonl and printed > start:
            # One write and flush for the whole ready prefix, not one per line.
            out.write("".join(ln.to_json() + "\n" for ln in lines[start:printed]))
            out.flush()

    # On Ray, stdout carries the results only (Ray's driver prints its events there).
    with results_stdout(ray is not None) as results:
        out = results
        await _run_on(lines, slots, isolation, store, ray=ray, resume=resume, strict=strict,
                      settings=settings, flush=flush)


async def _run_on(lines: list[Line], slots: int | None, isolation: str,
                  store: ResultStore | None, *, ray: str | None, resume: bool, strict: bool,
                  settings: Settings, flush: Callable[[], None]) -> None:
    """The batch on an engine (local, or on the Ray cluster at ``ray``)."""
    import asyncio
    import contextlib

    from sandloop.engine import Engine
    from sandloop.sandbox.models import ExecResult, Status

    async with Engine(slots=slots, isolation=isolation, cluster="ray" if ray else None,
                      address=ray) as engine:
        for ln in lines:
            if ln.request is not None:
                _check_budget(ln, engine)
        await _check_environments(lines)
        if strict and any(ln.error for ln in lines):
            return
        todo = [ln for ln in lines if ln.request is not None]
        if resume and store is not None and todo:
            found = await asyncio.to_thread(store.get_many, [_key(ln.request) for ln in todo
                                                            if ln.request is not None])
            for ln in todo:
                assert ln.request is not None
                rec = found.get(_key(ln.request))
                if rec is not None:
                    ln.result = ExecResult.model_validate(rec["result"])
            reused = sum(ln.result is not None for ln in todo)
            if reused:
                info(f"exec-batch: {reused} result(s) taken from {store.path}, not rerun")
            todo = [ln for ln in todo if ln.result is None]
        flush()
        runs = engine.stream(((ln.request.program, ln.request.limits)
                              for ln in todo if ln.request is not None), client="exec-batch")
        # aclosing: on Ctrl-C (a cancellation) the stream is closed at once, which cancels its
        # unfinished runs, before the engine closes; else the engine would wait for them.
        with Progress("exec-batch", len(todo), interval_s=settings.progress_interval_s) as bar:
            async with contextlib.aclosing(runs):
                async for i, r in runs:
                    ln = todo[i]
                    ln.result = r
                    if store is not None and ln.request is not None and \
                            r.status is not Status.SANDBOX_ERROR:
                        # An infrastructure failure is never kept: a resumed batch runs it again.
                        store.put(_key(ln.request), {"reward": 1.0 if r.ok else 0.0,
                                                     "verdict": r.status.value,
                                                     "result": json.loads(r.to_json())})
                    bar.advance()
                    flush()
        flush()


def _summary_line(r: ExecResult) -> str:
    for text in (r.stdout, r.stderr, r.compile.stderr if r.compile else "", r.error or ""):
        rows = [x.strip() for x in text.strip().splitlines() if x.strip()]
        if rows:
            return (rows[0] if text is r.stdout else rows[-1])[:70]
    return ""


def _print_table(lines: Sequence[Line]) -> None:
    """A readable table of every line, finished or not (an interrupted batch shows what it
    had done)."""
    from rich.console import Console
    from rich.table import Table

    from sandloop.sandbox.models import Status

    out = Console(width=None if sys.stdout.isatty() else 160)
    done = sum(ln.result is not None for ln in lines)
    t = Table(title=f"sandloop exec-batch: {done} of {len(lines)} programs run")
    for col in ("#", "name", "language", "status", "exit", "wall s", "cpu s", "peak MiB", "output"):
        t.add_column(col, no_wrap=col != "name", overflow="ellipsis")
    colours = {Status.OK: "green", Status.SANDBOX_ERROR: "magenta"}
    for i, ln in enumerate(lines, 1):
        req, r = ln.request, ln.result
        name = req.name or "" if req is not None else ""
        lang = req.program.language if req is not None else ""
        if ln.error is not None:
            t.add_row(str(i), name, lang, f"[red]{INVALID_REQUEST}[/]", "", "", "", "",
                      ln.error[:70])
        elif r is None:
            t.add_row(str(i), name, lang, "[yellow]not run[/]", "", "", "", "", "")
        else:
            ended = f"sig {r.signal}" if r.signal is not None else (
                "" if r.exit_code is None else str(r.exit_code))
            t.add_row(str(i), name, lang,
                      f"[{colours.get(r.status, 'red')}]{r.status.value}[/]", ended,
                      f"{r.wall_time_s:.3f}", f"{r.cpu_time_s:.3f}", f"{r.peak_memory_mb:.1f}",
                      _summary_line(r))
    out.print(t)
