"""Find the task a trainer's label / ground truth refers to.

Trainers carry the task in a dataset column: a task id from a known task set (``"HumanEval/3"``),
or the tests themselves as a dict or JSON string — a native sandloop task, a HumanEval / MBPP /
APPS / CodeContests record, or verl's ``{"inputs": [...], "outputs": [...][, "fn_name"]}``
ground truth (stdin/stdout tests, or function calls with ``fn_name``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sandloop.errors import InputError, TaskError
from sandloop.tasks.loaders import TaskFormatError, detect_format, parse_record
from sandloop.tasks.models import Task

__all__ = ["LabelError", "resolve_task"]


class LabelError(TaskError, InputError):
    """A label names no known task and is not a task or tests record."""


def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def resolve_task(label: Any, tasks: Mapping[str, Task] | None = None, *,
                 language: str | None = None) -> Task:
    """The Task for ``label`` (see the module doc). Raises :class:`LabelError`."""
    if isinstance(label, Task):
        return label
    if isinstance(label, str):
        if tasks is not None and label in tasks:
            return tasks[label]
        text = label.strip()
        if not text.startswith("{"):
            known = f" ({len(tasks)} tasks are loaded)" if tasks else " (no task set is loaded)"
            raise LabelError(f"label {label[:80]!r} is not a known task id{known} nor a JSON "
                             "task or tests record")
        try:
            label = json.loads(text)
        except json.JSONDecodeError as e:
            raise LabelError(f"label is not valid JSON: {e.msg} at column {e.colno}") from None
    if not isinstance(label, Mapping):
        raise LabelError(f"label must be a task id, a dict or a JSON object, not "
                         f"{type(label).__name__}")
    rec = dict(label)
    for key in ("task_id", "id"):
        tid = rec.get(key)
        if tasks is not None and isinstance(tid, str) and tid in tasks and len(rec) == 1:
            return tasks[tid]
    if {"inputs", "outputs"} <= set(rec) and not ({"id", "task_id", "public_tests"} & set(rec)):
        # verl / APPS-style ground truth without a task record around it.
        io = {k: rec[k] for k in ("inputs", "outputs", "fn_name") if k in rec}
        wrapped: dict[str, Any] = {"problem_id": "gt-" + _digest(io), "input_output": io}
        if language and language != "python" and not io.get("fn_name"):
            wrapped = {"id": wrapped["problem_id"], "inputs": io["inputs"],
                       "outputs": io["outputs"], "language": language}
            fmt = "stdio"
        else:
            fmt = "apps"
        rec = wrapped
    else:
        try:
            fmt = detect_format(rec)
        except TaskFormatError as e:
            raise LabelError(str(e)) from None
    if fmt != "native" and not any(rec.get(k) for k in ("task_id", "id", "problem_id", "name")):
        rec = {**rec, "id": "label-" + _digest(rec)}
    try:
        return parse_record(rec, fmt)
    except TaskFormatError as e:
        raise LabelError(f"label as a {fmt} record: {e}") from None
