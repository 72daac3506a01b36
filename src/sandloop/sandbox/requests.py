"""The JSONL request format of ``sandloop exec-batch``, validated with errors that name the line."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field, ValidationError

from sandloop.errors import InputError, SandboxError
from sandloop.jsonl import JsonLineError, json_objects
from sandloop.sandbox.models import Limits, Program


class BatchRequestError(SandboxError, InputError):
    """A request line is malformed; the message names the line and the field."""


class ExecRequest(Program):
    """One line of an exec-batch file: a Program's fields (validated the same way) plus its
    limits and an optional name."""

    limits: Limits = Field(default_factory=Limits)
    name: str | None = Field(None, description="free-form label, echoed in tables")

    @property
    def program(self) -> Program:
        return Program.model_construct(**{f: getattr(self, f) for f in Program.model_fields})


def _where(e: ValidationError) -> str:
    parts = []
    for d in e.errors()[:3]:
        loc = ".".join(str(x) for x in d["loc"]) or "(line)"
        parts.append(f"{loc}: {d['msg']}")
    return "; ".join(parts)


def parse_request_lines(lines: Iterable[str | bytes]
                        ) -> list[tuple[int, ExecRequest | BatchRequestError]]:
    """Parse and validate every non-blank line on its own: ``(line number, request or the
    error naming that line and field)``. Bytes lines must be UTF-8 (a line that is not is that
    line's error, not the file's), so one bad line never hides the good ones."""
    out: list[tuple[int, ExecRequest | BatchRequestError]] = []
    for n, raw in enumerate(lines, 1):
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                out.append((n, BatchRequestError(
                    f"line {n}: not UTF-8 text (byte {e.start}); requests are UTF-8 JSON")))
                continue
        else:
            line = raw
        if not line.strip():
            continue
        try:
            [(_, data)] = json_objects([line])
        except JsonLineError as e:
            out.append((n, BatchRequestError(f"line {n}: {e.reason}")))
            continue
        try:
            out.append((n, ExecRequest.model_validate(data)))
        except ValidationError as e:
            out.append((n, BatchRequestError(f"line {n}: {_where(e)}")))
    return out


def read_requests(lines: Iterable[str | bytes]) -> list[ExecRequest]:
    """Parse and validate every line first, so a bad line fails the batch before anything runs
    (raises the first line's :class:`BatchRequestError`)."""
    out: list[ExecRequest] = []
    for _, req in parse_request_lines(lines):
        if isinstance(req, BatchRequestError):
            raise req
        out.append(req)
    return out
