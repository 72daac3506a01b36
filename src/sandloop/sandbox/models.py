"""Typed records that cross the sandbox boundary: what to run, within which bounds, what happened.

Their JSON forms are part of the public contract (DESIGN.md): fields may be added, never removed.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_serializer,
    field_validator,
)

from sandloop.errors import InputError, SandboxError
from sandloop.sandbox.protocol import Isolation


class ProgramInputError(SandboxError, InputError):
    """A program, file name or text the sandbox refuses (the message names the field): an
    unsupported language, a name that could leave the work dir, text that is not UTF-8. A
    ``ValueError``, so pydantic reports it as a validation error inside a model."""


LANGUAGES = ("python", "c", "cpp", "javascript", "bash", "java", "go", "rust", "typescript")
# An environment's name (envs.spec.NAME_RE) or its id, or a unique prefix of it (hex).
ENVIRONMENT_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_LANGUAGE_ALIASES = {
    "python3": "python",
    "py": "python",
    "c++": "cpp",
    "cxx": "cpp",
    "js": "javascript",
    "node": "javascript",
    "nodejs": "javascript",
    "sh": "bash",
    "golang": "go",
    "rs": "rust",
    "ts": "typescript",
}


def canonical_language(name: str) -> str:
    """Map a language name or common alias (``py``, ``c++``, ``node``) to its canonical name."""
    key = name.strip().lower()
    key = _LANGUAGE_ALIASES.get(key, key)
    if key not in LANGUAGES:
        raise ProgramInputError(
            f"unsupported language {name!r}; choose one of {', '.join(LANGUAGES)}"
        )
    return key


class Status(StrEnum):
    """Outcome of one run. ``sandbox_error`` is the infrastructure's fault, never the program's."""

    OK = "ok"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    OUTPUT_LIMIT = "output_limit"
    COMPILE_ERROR = "compile_error"
    SANDBOX_ERROR = "sandbox_error"


# How the compile step's limits derive from the run's when not given (Limits.compile_*_limit_*).
COMPILE_TIME_FLOOR_S = 20.0
COMPILE_TIME_CAP_S = 30.0
COMPILE_MEMORY_FLOOR_MB = 512
COMPILE_MEMORY_CAP_MB = 1024
COMPILE_WORKDIR_FLOOR_MB = 256
COMPILE_WORKDIR_INODES_FLOOR = 4096

FileContent = Annotated[str | bytes, Field(description="text (UTF-8) or raw bytes")]


class Limits(BaseModel):
    """Resource bounds for one run. Every limit is enforced, and hitting it is reported."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    time_s: float = Field(10.0, gt=0, le=3600, description="wall-clock limit, seconds")
    cpu_time_s: float | None = Field(
        None, gt=0, le=3600, description="CPU-time limit (all processes); default: time_s"
    )
    memory_mb: int = Field(512, ge=8, le=65536, description="memory + swap, whole run, MiB")
    max_processes: int = Field(64, ge=1, le=4096, description="processes + threads at once")
    cpus: float = Field(1.0, gt=0, le=256, description="CPU quota (cores' worth of CPU time per second)")
    cpu_weight: int = Field(
        100, ge=1, le=10000,
        description="share of contended CPU relative to other runs (cgroup cpu.weight scale)",
    )
    stdout_bytes: int = Field(1 << 20, ge=0, le=1 << 30, description="stdout kept; beyond: truncated")
    stderr_bytes: int = Field(1 << 20, ge=0, le=1 << 30, description="stderr kept; beyond: truncated")
    output_limit_bytes: int | None = Field(
        None,
        ge=0,
        description="total output after which the run is killed with output_limit; "
        "default: 8 x (stdout_bytes + stderr_bytes)",
    )
    workdir_mb: int = Field(64, ge=1, le=16384, description="size of the work dir and of /tmp, MiB")
    workdir_inodes: int = Field(4096, ge=16, le=1 << 20, description="files in the work dir and /tmp")
    open_files: int = Field(
        256, ge=16, le=65536,
        description="file descriptors per process; above the host's hard limit (ulimit -Hn of "
        "the process that runs the sandbox), the hard limit",
    )
    compile_time_s: float | None = Field(
        None, gt=0, le=3600,
        description="wall (and CPU) limit of the compile step; default: derived from time_s, "
        f"2 x time_s within [{COMPILE_TIME_FLOOR_S:g}, {COMPILE_TIME_CAP_S:g}] s",
    )
    compile_memory_mb: int | None = Field(
        None, ge=64, le=65536,
        description="memory of the compile step, MiB; default: derived from memory_mb, "
        f"memory_mb within [{COMPILE_MEMORY_FLOOR_MB}, {COMPILE_MEMORY_CAP_MB}] MiB",
    )
    compile_output_mb: int = Field(64, ge=1, le=1024, description="largest compiled program")

    @property
    def cpu_limit_s(self) -> float:
        return self.cpu_time_s if self.cpu_time_s is not None else self.time_s

    # The compile step's limits follow the run's, so that a small run cannot hide a large
    # compile: a compile bomb submitted with --memory-mb 64 once got 1 GiB and 30 s of the host.
    # Floors keep ordinary programs compiling (measured: g++ -O2 on a bits/stdc++.h solution
    # peaks at ~200 MiB and ~1.7 s of CPU, which took over 10 s of wall time on a 2-core host
    # at load 9: a false compile error is a reward of 0 for a correct program); caps bound what
    # any derived compile step may take.
    # Explicit compile_time_s / compile_memory_mb override the derivation, in both directions.

    @property
    def compile_time_limit_s(self) -> float:
        """The compile step's wall and CPU limit: explicit, or derived from ``time_s``."""
        if self.compile_time_s is not None:
            return self.compile_time_s
        return min(max(2.0 * self.time_s, COMPILE_TIME_FLOOR_S), COMPILE_TIME_CAP_S)

    @property
    def compile_memory_limit_mb(self) -> int:
        """The compile step's memory limit: explicit, or derived from ``memory_mb``."""
        if self.compile_memory_mb is not None:
            return self.compile_memory_mb
        return min(max(self.memory_mb, COMPILE_MEMORY_FLOOR_MB), COMPILE_MEMORY_CAP_MB)

    # The compile step's scratch space (its work dir and /tmp) is not the program's: Go's build
    # cache (256 directories before the first object), rustc's objects and the linker's
    # temporary files took over 8 MiB for a hello world, so a run with workdir_mb=8 failed to
    # compile: a false compile error. tmpfs pages are charged to the compile step's cgroup, so
    # its memory limit still bounds what the scratch space can take.
    @property
    def compile_workdir_limit_mb(self) -> int:
        """The compile step's work dir and /tmp size: ``workdir_mb``, at least 256 MiB."""
        return max(self.workdir_mb, COMPILE_WORKDIR_FLOOR_MB)

    @property
    def compile_workdir_inodes(self) -> int:
        """The compile step's file count limit: ``workdir_inodes``, at least 4096."""
        return max(self.workdir_inodes, COMPILE_WORKDIR_INODES_FLOOR)

    def compile_limit_note(self, status: Status) -> str | None:
        """What to tell the user when the compile step ended for one of its limits, or None."""
        if status is Status.MEMORY_LIMIT:
            how = ("set by compile_memory_mb" if self.compile_memory_mb is not None else
                   f"derived from memory_mb={self.memory_mb}: memory_mb within "
                   f"[{COMPILE_MEMORY_FLOOR_MB}, {COMPILE_MEMORY_CAP_MB}] MiB")
            return (f"sandloop: the compile step hit its memory limit of "
                    f"{self.compile_memory_limit_mb} MiB ({how}); set compile_memory_mb to "
                    "change it")
        if status is Status.TIMEOUT:
            how = ("set by compile_time_s" if self.compile_time_s is not None else
                   f"derived from time_s={self.time_s:g}: 2 x time_s within "
                   f"[{COMPILE_TIME_FLOOR_S:g}, {COMPILE_TIME_CAP_S:g}] s")
            return (f"sandloop: the compile step hit its time limit of "
                    f"{self.compile_time_limit_s:g} s ({how}); set compile_time_s to change it")
        return None

    @property
    def kill_output_bytes(self) -> int:
        if self.output_limit_bytes is not None:
            return self.output_limit_bytes
        return 8 * (self.stdout_bytes + self.stderr_bytes) + (1 << 16)


class Program(BaseModel):
    """What to run: source in one language, optional stdin and extra files for the work dir."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    language: str = "python"
    source: str
    stdin: FileContent | None = None
    files: dict[str, FileContent] = Field(default_factory=dict)
    argv: list[str] = Field(default_factory=list, description="extra program arguments")
    collect: list[str] = Field(
        default_factory=list,
        description="work-dir files to read back after the run (regular files only)",
    )
    environment: str | None = Field(
        None, description="the environment to run in: a name or id (`sandloop env ls`); "
                          "default the language's built-in (python: the host interpreter and "
                          "its standard library)")

    # Everything below is checked here, before anything runs, so that a request the sandbox
    # could not lay out is an input error naming the field (HTTP 422, an exec-batch line
    # error), never a run that fails as sandbox_error: that would be read as the
    # infrastructure's fault and excluded from training, a verdict a policy could learn to
    # reach on purpose.
    @field_validator("language")
    @classmethod
    def _language(cls, v: str) -> str:
        return canonical_language(v)

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return check_text(v, "source")

    @field_validator("stdin")
    @classmethod
    def _stdin(cls, v: str | bytes | None) -> str | bytes | None:
        return check_text(v, "stdin") if isinstance(v, str) else v

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, str | bytes], info: ValidationInfo) -> dict[str, str | bytes]:
        check_file_names(v)
        for name, content in v.items():
            if isinstance(content, str):
                check_text(content, f"files[{name!r}]")
        # The program's own file (and a compiled language's binary) is written under a fixed
        # name; a file that needs it to be a directory could not be laid out.
        own = OWN_FILES.get(info.data.get("language", ""), ())
        for name in v:
            top = name.split("/", 1)[0]
            if "/" in name and top in own:
                raise ProgramInputError(f"{name!r} needs {top!r} to be a directory, but the "
                                 f"program's own file goes there; choose another directory")
        return v

    @field_validator("argv")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        for n, arg in enumerate(v):
            check_text(arg, f"argv[{n}]")
            if "\0" in arg:
                raise ProgramInputError(f"argv[{n}] contains a NUL byte, which no program argument "
                                 "can hold")
        return v

    @field_validator("collect")
    @classmethod
    def _collect(cls, v: list[str]) -> list[str]:
        for name in v:
            check_relative_path(name)
        return v

    @field_validator("environment")
    @classmethod
    def _environment(cls, v: str | None) -> str | None:
        if v is not None and not ENVIRONMENT_RE.fullmatch(v):
            raise ProgramInputError(f"environment {v!r} is not an environment name or id "
                                    "(lowercase letters, digits, . _ -; `sandloop env ls`)")
        return v


# Work-dir names a language's own files take (sandbox/languages.py: main_file, binary).
OWN_FILES: dict[str, tuple[str, ...]] = {
    "python": ("main.py",),
    "c": ("main.c", "main"),
    "cpp": ("main.cpp", "main"),
    "javascript": ("main.js",),
    "bash": ("main.sh",),
    "java": ("Main.java", "main.jar", ".sandloop-build"),
    "go": ("main.go", "main", ".sandloop-build"),
    "rust": ("main.rs", "main"),
    "typescript": ("main.ts", "main.js", "sandloop-node.d.ts"),
}

MAX_PATH_BYTES = 1024  # a whole relative path, UTF-8
MAX_NAME_BYTES = 255  # one component (NAME_MAX of every Linux file system)


def check_text(text: str, field: str) -> str:
    """Reject text that cannot be encoded as UTF-8 (a lone surrogate, e.g. ``"\\udc80"`` in
    JSON): it could never reach the program."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ProgramInputError(f"{field} is not valid Unicode text: {text[e.start:e.end]!r} at "
                         f"position {e.start} is a lone surrogate; send valid UTF-8 (or bytes)"
                         ) from None
    return text


def check_relative_path(name: str) -> str:
    """Reject paths that could leave the work dir or that no file system can hold: absolute,
    empty, ``.``/``..``/empty components, NUL, not UTF-8, longer than 1024 bytes or with a
    component longer than 255 bytes."""
    if not name or name.startswith("/") or "\0" in name:
        raise ProgramInputError(f"file name {name!r} must be a non-empty relative path without NUL")
    check_text(name, f"file name {name[:40]!r}")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ProgramInputError(f"file name {name!r} must not contain '', '.' or '..' components")
    if len(name.encode()) > MAX_PATH_BYTES:
        raise ProgramInputError(f"file name {name[:40]!r}... is longer than {MAX_PATH_BYTES} bytes")
    for p in parts:
        if len(p.encode()) > MAX_NAME_BYTES:
            raise ProgramInputError(f"file name {name[:40]!r}...: component {p[:40]!r}... is longer "
                             f"than {MAX_NAME_BYTES} bytes")
    return name


def check_file_names(names: Iterable[str]) -> None:
    """Check each name (``check_relative_path``) and that they can all exist at once: no name
    may also be another's directory (``a`` and ``a/b``)."""
    names = list(names)
    for name in names:
        check_relative_path(name)
    taken = set(names)
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in taken:
                raise ProgramInputError(f"files {parent!r} and {name!r} conflict: {parent!r} cannot be "
                                 "both a file and a directory")


class ExecResult(BaseModel):
    """What one run did. ``compile`` holds the compile step of compiled languages."""

    model_config = ConfigDict(frozen=True)

    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    peak_memory_mb: float = 0.0
    compile: ExecResult | None = None
    error: str | None = Field(None, description="why the infrastructure failed (sandbox_error)")
    isolation: Isolation | None = Field(None, description="isolation level the run used")
    environment: str | None = Field(
        None, description="id of the environment the run used (docs/environments.md); None "
                          "when it used none (isolation 'none', or it never started)")
    files: dict[str, bytes] = Field(
        default_factory=dict, description="collected work-dir files (base64 in JSON)"
    )
    missing_files: list[str] = Field(
        default_factory=list,
        description="names in Program.collect that came back absent: the program left no "
                    "regular file there (a collection the sandbox failed to finish is a "
                    "sandbox_error instead)",
    )
    channel: bytes | None = Field(
        None, exclude=True, description="bytes a trusted harness wrote on the result channel"
    )

    @field_serializer("files")
    def _ser_files(self, files: dict[str, bytes]) -> dict[str, str]:
        return {k: base64.b64encode(v).decode() for k, v in files.items()}

    @field_validator("files", mode="before")
    @classmethod
    def _de_files(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {
                k: base64.b64decode(x) if isinstance(x, str) else x for k, x in v.items()
            }
        return v

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @classmethod
    def sandbox_error(cls, message: str, *, isolation: Isolation | None = None) -> ExecResult:
        return cls(status=Status.SANDBOX_ERROR, error=message, isolation=isolation)

    def to_json(self) -> str:
        """One-line JSON form (the ``--json`` / exec-batch output)."""
        return self.model_dump_json(exclude_none=False)


def with_compile_limit_note(result: ExecResult, limits: Limits) -> ExecResult:
    """A compile step's ``result``, its stderr ending with which limit it hit, if it hit one
    (last, so that the tail a verdict keeps says why)."""
    note = limits.compile_limit_note(result.status)
    if note is None:
        return result
    text = result.stderr.rstrip()
    return result.model_copy(update={"stderr": f"{text}\n{note}\n" if text else f"{note}\n"})
