"""SandboxFusion's ``/run_code`` request and response shapes, mapped onto sandloop runs.

Response: ``status`` Success | Failed | SandboxError, ``message``, ``compile_result`` and
``run_result`` (each ``{status: Finished | Error | TimeLimitExceeded, execution_time,
return_code, stdout, stderr}`` or null), ``executor_pod_name``, ``files`` (base64). As in
SandboxFusion, any TimeLimitExceeded or non-zero return code is ``Failed``, an infrastructure
failure is ``SandboxError``, and ``run_result`` is null when compilation failed.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandloop.errors import InputError, ServerError
from sandloop.sandbox.models import ExecResult, Limits, Program, Status, check_relative_path

__all__ = [
    "CommandRunResult",
    "RunCodeRequest",
    "RunCodeResponse",
    "SFRequestError",
    "to_program",
    "to_response",
    "unsupported",
]

# SandboxFusion language names -> sandloop languages. The rest of its list is refused with a
# SandboxError naming the language (the infrastructure cannot run it; not the program's fault).
LANGUAGE_MAP = {
    "python": "python", "python3": "python", "cpp": "cpp", "c": "c", "nodejs": "javascript",
    "js": "javascript", "javascript": "javascript", "bash": "bash", "java": "java", "go": "go",
    "rust": "rust", "typescript": "typescript",
}
SF_LANGUAGES = (
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
    "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest",
    "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
)


class SFRequestError(ServerError, InputError):
    """A request sandloop refuses (HTTP 400), e.g. a file path outside the work dir."""


class RunCodeRequest(BaseModel):
    """SandboxFusion's RunCodeRequest (same fields and defaults)."""

    model_config = ConfigDict(extra="ignore")

    code: str = Field(max_length=4 << 20)
    language: str = Field(max_length=64)
    compile_timeout: float = Field(10, gt=0, le=3600)
    run_timeout: float = Field(10, gt=0, le=3600)
    memory_limit_MB: int = Field(-1, ge=-1, le=65536)
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class CommandRunResult(BaseModel):
    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def unsupported(req: RunCodeRequest) -> RunCodeResponse | None:
    """The SandboxError answer for a language sandloop does not run, else None."""
    if req.language in LANGUAGE_MAP:
        return None
    known = "" if req.language in SF_LANGUAGES else " (not a SandboxFusion language either)"
    return RunCodeResponse(
        status="SandboxError",
        message=f"language {req.language!r} is not supported by this sandloop server{known}; "
                f"supported: {', '.join(sorted(set(LANGUAGE_MAP)))}",
        executor_pod_name=_pod())


def to_program(req: RunCodeRequest, *, default_memory_mb: int, max_memory_mb: int,
               max_time_s: float) -> tuple[Program, Limits]:
    """The Program and Limits of a request (raises SFRequestError or ValueError)."""
    files: dict[str, str | bytes] = {}
    for name, content in req.files.items():
        if "IGNORE_THIS_FILE" in name or content is None:
            continue  # as SandboxFusion does
        try:
            check_relative_path(name)
        except ValueError as e:
            raise SFRequestError(f"files: {e} (sandloop never writes outside the sandbox)") \
                from None
        try:
            files[name] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise SFRequestError(f"files[{name!r}]: not valid base64") from None
    for name in req.fetch_files:
        try:
            check_relative_path(name)
        except ValueError as e:
            raise SFRequestError(f"fetch_files: {e} (only work-dir files can be fetched)") \
                from None
    mem = default_memory_mb if req.memory_limit_MB <= 0 else req.memory_limit_MB
    if mem > max_memory_mb:
        raise SFRequestError(f"memory_limit_MB={mem} exceeds this server's maximum of "
                             f"{max_memory_mb}")
    for field in ("run_timeout", "compile_timeout"):
        if getattr(req, field) > max_time_s:
            raise SFRequestError(f"{field}={getattr(req, field)} exceeds this server's maximum "
                                 f"of {max_time_s:g} s")
    program = Program(language=LANGUAGE_MAP[req.language], source=req.code, stdin=req.stdin,
                      files=files, collect=list(req.fetch_files))
    # The compile step's memory derives from the run's (Limits.compile_memory_limit_mb).
    limits = Limits(time_s=req.run_timeout, memory_mb=max(mem, 8),
                    compile_time_s=req.compile_timeout)
    return program, limits


def _return_code(r: ExecResult) -> int | None:
    if r.exit_code is not None:
        return r.exit_code
    if r.signal is not None:
        return -r.signal  # what asyncio's returncode says for a signalled process
    return None


def _command(r: ExecResult) -> CommandRunResult:
    if r.status is Status.TIMEOUT:
        status: Literal["Finished", "Error", "TimeLimitExceeded"] = "TimeLimitExceeded"
    elif r.status is Status.SANDBOX_ERROR:
        status = "Error"
    else:
        status = "Finished"
    rc = _return_code(r)
    if status == "Finished" and r.status is not Status.OK and not rc:
        # memory_limit / output_limit / compile_error with no code: still a failed process.
        rc = 1 if r.status is Status.COMPILE_ERROR else -9
    return CommandRunResult(status=status, execution_time=round(r.wall_time_s, 6),
                            return_code=rc, stdout=r.stdout, stderr=r.stderr)


def _pod() -> str | None:
    return os.environ.get("MY_POD_NAME")


def to_response(r: ExecResult) -> RunCodeResponse:
    """SandboxFusion's answer for one sandloop result."""
    if r.status is Status.SANDBOX_ERROR:
        return RunCodeResponse(status="SandboxError", message=r.error or "sandbox error",
                               executor_pod_name=_pod())
    compile_result = _command(r.compile) if r.compile is not None else None
    if r.status is Status.COMPILE_ERROR:
        if compile_result is None:  # compile step not reported: synthesise it
            compile_result = CommandRunResult(status="Finished", execution_time=r.wall_time_s,
                                              return_code=1, stdout=r.stdout, stderr=r.stderr)
        elif compile_result.status == "Finished" and not compile_result.return_code:
            compile_result = compile_result.model_copy(update={"return_code": 1})
        return RunCodeResponse(status="Failed", compile_result=compile_result, run_result=None,
                               executor_pod_name=_pod())
    run = _command(r)
    failed = run.status != "Finished" or run.return_code != 0
    return RunCodeResponse(
        status="Failed" if failed else "Success", compile_result=compile_result, run_result=run,
        executor_pod_name=_pod(),
        files={k: base64.b64encode(v).decode() for k, v in r.files.items()})
