"""``sandloop exec``: run one program, and read its plain command lines without the full parser.

``sandloop exec one.py`` is the command people time. Its work is a few milliseconds; its
start-up was the parser's: typer, and the pydantic type adapters typer builds for each option,
cost more than the run. :func:`parse_plain` reads the common, unambiguous forms of the command
line itself and hands every other form (``--help``, an unknown or repeated option, a value
that needs checking, ``-`` for stdin, a path that is no readable regular file) to typer, so
that errors, help and edge cases stay exactly typer's. A test holds the two parsers to the same
result for the forms this one accepts.

Both parsers end in :func:`exec_command`.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import re
import stat
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sandloop.cli import output
from sandloop.cli.exits import ExitCode, print_error

if TYPE_CHECKING:
    from sandloop.sandbox.models import ExecResult, Limits, Program

__all__ = ["ExecArgs", "exec_command", "parse_plain"]

EXTENSIONS = {".py": "python", ".c": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp",
              ".js": "javascript", ".mjs": "javascript", ".sh": "bash", ".bash": "bash",
              ".java": "java", ".go": "go", ".rs": "rust", ".ts": "typescript"}


@dataclass(frozen=True)
class ExecArgs:
    """One ``sandloop exec`` command line, parsed (the defaults are the command's)."""

    source: Path
    language: str | None = None
    time_limit: float = 10.0
    memory_mb: int = 512
    stdin: Path | None = None
    as_json: bool = False
    no_isolation: bool = False
    environment: str | None = None


@dataclass(frozen=True)
class Plain:
    """What :func:`parse_plain` read: the root's verbosity and the command's arguments."""

    quiet: bool
    verbose: bool
    args: ExecArgs


_ROOT_FLAGS = {"-q": "quiet", "--quiet": "quiet", "-v": "verbose", "--verbose": "verbose"}
_FLAGS = {"--json": "as_json", "--no-isolation": "no_isolation"}
_VALUED = {"--language": "language", "-l": "language", "--time-limit": "time_limit",
           "--memory-mb": "memory_mb", "--stdin": "stdin", "--env": "environment"}
# Values in the forms both parsers read alike; anything else is typer's to judge.
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")
_MIB = re.compile(r"[1-9][0-9]{0,9}")


def _readable_file(value: str) -> bool:
    """A path typer would pass as it is (``dir_okay=False``, readable): a regular file."""
    try:
        return stat.S_ISREG(os.stat(value).st_mode) and os.access(value, os.R_OK)
    except (OSError, ValueError):
        return False


def parse_plain(argv: Sequence[str]) -> Plain | None:
    """``argv`` (without the program name) as a plain ``exec`` command line, or None when it
    is anything else: then the full parser (typer) reads it, errors and help included."""
    quiet = verbose = False
    i = 0
    while i < len(argv) and argv[i] in _ROOT_FLAGS:
        if _ROOT_FLAGS[argv[i]] == "quiet":
            quiet = True
        else:
            verbose = True
        i += 1
    if (quiet and verbose) or i >= len(argv) or argv[i] != "exec":
        return None
    seen: dict[str, str | bool] = {}
    positional: list[str] = []
    rest = list(argv[i + 1:])
    while rest:
        token = rest.pop(0)
        name, eq, inline = token.partition("=")
        if token in _FLAGS:
            key: str | None = _FLAGS[token]
            value: str | bool = True
        elif name in _VALUED and (eq or token in _VALUED):
            key = _VALUED[name]
            if eq:
                if not name.startswith("--"):
                    return None  # -l=python: click reads "=python"
                value = inline
            elif rest and not rest[0].startswith("-"):
                value = rest.pop(0)
            else:
                return None
        elif token.startswith("-"):
            return None  # --help, --, -, unknown options, bundled short flags
        else:
            key = None
            positional.append(token)
        if key is not None:
            if key in seen:
                return None
            seen[key] = value
    if len(positional) != 1 or not _readable_file(positional[0]):
        return None
    args = ExecArgs(source=Path(positional[0]))
    for key, value in seen.items():
        assert isinstance(value, str) or key in ("as_json", "no_isolation")
        if key == "time_limit":
            if not (isinstance(value, str) and _SECONDS.fullmatch(value)):
                return None
            seconds = float(value)
            if not (seconds > 0 and math.isfinite(seconds)):
                return None
            args = replace(args, time_limit=seconds)
        elif key == "memory_mb":
            if not (isinstance(value, str) and _MIB.fullmatch(value)):
                return None
            args = replace(args, memory_mb=int(value))
        elif key == "stdin":
            if not (isinstance(value, str) and _readable_file(value)):
                return None
            args = replace(args, stdin=Path(value))
        elif key == "language":
            args = replace(args, language=str(value))
        elif key == "environment":
            args = replace(args, environment=str(value))
        elif key == "as_json":
            args = replace(args, as_json=True)
        else:
            args = replace(args, no_isolation=True)
    return Plain(quiet=quiet, verbose=verbose, args=args)


def _read_source(source: Path) -> str | None:
    """The program's text: UTF-8, from a file or '-' (stdin); None (after the error line) if
    it cannot be had."""
    where = "standard input" if str(source) == "-" else str(source)
    try:
        data = sys.stdin.buffer.read() if str(source) == "-" else source.read_bytes()
    except OSError as e:
        print_error(f"cannot read {where}: {e.strerror or e}")
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        print_error(f"{where}: not UTF-8 text (byte {e.start}); programs are UTF-8 source")
        return None


def _print_human(r: ExecResult) -> None:
    from rich.console import Console

    from sandloop.sandbox.models import Status

    if r.compile is not None and r.compile.status is not Status.OK:
        sys.stderr.write(r.compile.stderr)
    sys.stdout.write(r.stdout)
    sys.stdout.flush()
    sys.stderr.write(r.stderr)
    colour = "green" if r.ok else "red"
    detail = f" exit={r.exit_code}" if r.exit_code is not None else ""
    detail += f" signal={r.signal}" if r.signal is not None else ""
    Console(stderr=True).print(
        f"[{colour}]{r.status.value}[/]{detail} wall={r.wall_time_s:.3f}s "
        f"cpu={r.cpu_time_s:.3f}s mem={r.peak_memory_mb:.1f}MiB"
        + (f" [red]{r.error}[/]" if r.error else ""), highlight=False)


def exec_command(args: ExecArgs) -> int:
    """Run ``args``' program and print its result; the exit code: 0 it succeeded, 1 it failed,
    2 bad input, 3 ``sandbox_error``."""
    if not args.no_isolation:
        # The pool's seccomp filter needs pyseccomp, whose import runs `ldconfig -p` twice to
        # find libc and libseccomp (~35 ms here, mostly waiting): started now, those waits pass
        # while this thread imports pydantic and the sandbox.
        _warm("pyseccomp")
    text = _read_source(args.source)
    if text is None:
        return ExitCode.BAD_INPUT
    lang = args.language or EXTENSIONS.get(args.source.suffix.lower())
    if lang is None:
        print_error(f"cannot tell the language of {args.source}; pass --language")
        return ExitCode.BAD_INPUT
    from sandloop.settings import ConfigError, load_settings

    try:
        settings = load_settings()
    except ConfigError as e:
        print_error(str(e))
        return ExitCode.BAD_INPUT
    if args.time_limit > settings.max_time_s or args.memory_mb > settings.max_memory_mb:
        print_error(f"--time-limit {args.time_limit:g} / --memory-mb {args.memory_mb}: over the "
                    f"project's max_time_s={settings.max_time_s:g} / max_memory_mb="
                    f"{settings.max_memory_mb} (raise them in sandloop.toml)")
        return ExitCode.BAD_INPUT
    try:
        stdin_data = args.stdin.read_bytes() if args.stdin is not None else None
    except OSError as e:
        print_error(f"--stdin {args.stdin}: {e.strerror or e}")
        return ExitCode.BAD_INPUT
    from pydantic import ValidationError

    from sandloop.sandbox.models import Limits, Program, Status

    try:
        program = Program(language=lang, source=text, stdin=stdin_data,
                          environment=args.environment)
        limits = Limits(time_s=args.time_limit, memory_mb=args.memory_mb)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in d['loc']) or 'request'}: {d['msg']}"
                             for d in e.errors()[:3])
        print_error(f"{args.source}: {problems}")
        return ExitCode.BAD_INPUT
    from sandloop.errors import EnvError, InputError

    try:
        result = _run(program, limits, "none" if args.no_isolation else "full",
                      human=not args.as_json)
    except EnvError as e:  # --env names no environment, or its build failed
        print_error(str(e))
        return ExitCode.BAD_INPUT if isinstance(e, InputError) else ExitCode.INFRASTRUCTURE
    if args.as_json:
        print(result.to_json())
    else:
        _print_human(result)
    if result.status is Status.SANDBOX_ERROR:
        return ExitCode.INFRASTRUCTURE
    return ExitCode.OK if result.ok else ExitCode.FAILURES


def _run(program: Program, limits: Limits, isolation: str, *, human: bool) -> ExecResult:
    """One run in a one-slot pool. While its zygote starts (another process, on another core
    where there is one), this one imports what printing the result will need."""
    from sandloop import _aio as aio
    from sandloop.sandbox.pool import SandboxPool

    if human:
        _warm("rich.console")

    async def go() -> ExecResult:
        async with SandboxPool(1, isolation=isolation) as pool:
            return await pool.run(program, limits)

    return aio.run(go())


def _warm(module: str) -> None:
    """Import ``module`` on a thread of its own, ahead of its use on this one (an import that
    waits, on a subprocess or while a zygote starts, then costs this thread nothing)."""

    def load() -> None:
        with contextlib.suppress(ImportError):  # its user reports it, with what to do
            importlib.import_module(module)

    threading.Thread(target=load, name=f"sandloop-import-{module}", daemon=True).start()


def run_plain(plain: Plain) -> int:
    """:func:`exec_command` for a command line :func:`parse_plain` read, with the root options
    applied as the root's callback does, and an interrupt ending as typer's does."""
    output.state.quiet, output.state.verbose = plain.quiet, plain.verbose
    try:
        return exec_command(plain.args)
    except (EOFError, KeyboardInterrupt):
        sys.stderr.write("\n")
        print_error("aborted")
        return 130
