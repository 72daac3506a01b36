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


def read_requests(lines: Iterable[str]) -> list[ExecRequest]:
    """Parse and validate every line first, so a bad line fails the batch before anything runs."""
    out: list[ExecRequest] = []
    try:
        objects = list(json_objects(lines))
    except JsonLineError as e:
        raise BatchRequestError(str(e)) from e
    for n, data in objects:
        try:
            req = ExecRequest.model_validate(data)
        except ValidationError as e:
            raise BatchRequestError(f"line {n}: {_where(e)}") from e
        out.append(req)
    return out
