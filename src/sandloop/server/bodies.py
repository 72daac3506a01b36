"""Request bodies of the native API and of OpenRLHF's remote reward (SandboxFusion's are in
server/sandboxfusion.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from sandloop.reward import RewardConfig
from sandloop.sandbox.models import Limits, canonical_language, check_text
from sandloop.sandbox.requests import ExecRequest

__all__ = [
    "BatchBody",
    "FeedbackBody",
    "FilesBody",
    "OpenRLHFBody",
    "Priority",
    "ReadFilesBody",
    "RolloutsBody",
    "RunBody",
    "ScoreBody",
    "ScoreItemBody",
    "SessionOpenBody",
    "SessionRunBody",
    "TaskSampleBody",
]
# Bounded like the engine's (PRIORITY_MIN/MAX): the journal stores it as a 64-bit integer.
Priority = Annotated[int, Field(ge=-(1 << 31), le=(1 << 31) - 1)] | \
    Literal["eval", "interactive", "train", "background"]


# -- request bodies ---------------------------------------------------------------------------
class RunBody(ExecRequest):
    """One program (the exec-batch line format) and how to schedule it."""

    priority: Priority = "train"
    timeout_s: float | None = Field(None, gt=0, le=86400, description="queueing + running")
    key: str | None = Field(None, max_length=256, description="idempotency key")

MAX_STEP = 2**63 - 1  # the largest step a rollout log (SQLite INTEGER) holds


class BatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests: list[ExecRequest] = Field(min_length=1)
    priority: Priority = "train"
    timeout_s: float | None = Field(None, gt=0, le=86400)


class ScoreItemBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str | dict[str, Any] = Field(description="a task id, a task record, or tests")
    completion: str
    completion_id: str | None = None
    language: str | None = None
    group: str | None = Field(None, max_length=256,
                              description="rollout group of this item (default: the request's)")

    @field_validator("completion")
    @classmethod
    def _completion(cls, v: str) -> str:
        return check_text(v, "completion")


class ScoreBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    items: list[ScoreItemBody] = Field(min_length=1)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    task_set: str | None = None
    priority: Priority = "train"
    step: int | None = Field(None, ge=0, le=MAX_STEP,
                             description="training step: recorded by the monitor "
                                         "(or header X-Sandloop-Step)")
    group: str | None = Field(None, max_length=256,
                              description="rollout group (header X-Sandloop-Group)")
    run_id: str | None = Field(None, max_length=256,
                               description="training run (header X-Sandloop-Run)")


class TaskSampleBody(BaseModel):
    """Draw task ids from a served set's curriculum."""

    model_config = ConfigDict(extra="forbid")
    task_set: str
    n: int = Field(1, ge=1, le=10_000)


class FeedbackBody(BaseModel):
    """Rewards of one step's groups, by task id (one list per task: its group's rewards;
    null: the infrastructure failed)."""

    model_config = ConfigDict(extra="forbid")
    task_set: str
    rewards: dict[str, list[float | None]] = Field(min_length=1)


class AlertBody(BaseModel):
    """An alert raised by the caller's own monitor (e.g. its hidden-test audit)."""

    model_config = ConfigDict(extra="forbid")
    # The monitor's codes only: each is a Prometheus label value, so the set stays bounded.
    code: Literal["reward_hack_suspected", "reward_drift", "diversity_collapse",
                  "infra_degradation"]
    step: int = Field(ge=0, le=MAX_STEP)
    detail: str = Field("", max_length=4096)
    evidence: list[dict[str, Any]] = Field(default_factory=list, max_length=20)


class RolloutsBody(BaseModel):
    """Rollouts scored elsewhere (a trainer's own), in the rollout-log format (docs/monitor.md),
    for the live monitor."""

    model_config = ConfigDict(extra="forbid")
    run_id: str | None = Field(None, max_length=256)
    rollouts: list[dict[str, Any]] = Field(default_factory=list)
    alerts: list[AlertBody] = Field(default_factory=list, max_length=100)
    final: bool = Field(False, description="the run is over: complete its open steps")


class SessionOpenBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    language: str = "python"
    limits: Limits = Field(default_factory=Limits)
    ttl_s: float | None = Field(None, gt=0, le=7 * 86400)
    idle_timeout_s: float | None = Field(None, gt=0, le=86400)

    @field_validator("language")
    @classmethod
    def _language(cls, v: str) -> str:
        # Checked at open: every run of the session's code uses it.
        return canonical_language(v)


class SessionRunBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str | None = Field(None, description="a bash command in the work dir")
    code: str | None = Field(None, description="source in the session's language")
    stdin: str | None = None
    limits: Limits | None = None
    timeout_s: float | None = Field(None, gt=0, le=86400)

    @field_validator("command", "code", "stdin")
    @classmethod
    def _text(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else check_text(v, str(info.field_name))


class FilesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[str, str] = Field(description="path -> content")
    encoding: Literal["utf-8", "base64"] = "utf-8"

    @field_validator("files")
    @classmethod
    def _text(cls, v: dict[str, str]) -> dict[str, str]:
        for name, content in v.items():  # names are checked as paths when written
            check_text(content, f"files[{name[:40]!r}]")
        return v


class ReadFilesBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    paths: list[str] = Field(min_length=1, max_length=1024)


class OpenRLHFBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    query: list[str]
    prompts: list[str] | None = None
    labels: list[Any] | None = None
