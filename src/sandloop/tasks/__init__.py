"""Tasks: the task schema and loaders for task sets (data only; nothing here executes code)."""

from sandloop.tasks.labels import LabelError, resolve_task
from sandloop.tasks.loaders import (
    BUILTIN_SETS,
    FORMATS,
    TaskFormatError,
    detect_format,
    load_tasks,
    parse_record,
)
from sandloop.tasks.models import (
    SCHEMA,
    CallTest,
    Checker,
    Comparison,
    IOTest,
    ScriptTest,
    Signature,
    Task,
    TaskLimits,
    Test,
)

__all__ = [
    "BUILTIN_SETS",
    "FORMATS",
    "SCHEMA",
    "CallTest",
    "Checker",
    "Comparison",
    "IOTest",
    "LabelError",
    "ScriptTest",
    "Signature",
    "Task",
    "TaskFormatError",
    "TaskLimits",
    "Test",
    "detect_format",
    "load_tasks",
    "parse_record",
    "resolve_task",
]
