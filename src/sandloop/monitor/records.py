"""The rollout record and the rollout-log file format (JSON lines, optionally gzip-compressed).

One line per scored completion that came in with a training step::

    {"step": 12, "task_id": "HumanEval/0", "completion": "...", "reward": 1.0,
     "group": "g3", "verdict": "passed", "public_passed": 2, "public_total": 2,
     "hidden_passed": 7, "hidden_total": 7, "wall_time_s": 0.031}

``step`` (int), ``task_id`` (str), ``completion`` (str) and ``reward`` (float or null: the
infrastructure failed) are required; the rest is optional. Extensions read when present:
``run_id``, ``completion_id``, ``difficulty`` (a tier name or a number), ``source`` (the task's
data source). Records are plain frozen dataclasses: the analyses read millions of them.
"""

from __future__ import annotations

import gzip
import io
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sandloop.errors import InputError, MonitorError

__all__ = ["LOG_FIELDS", "LogFormatError", "Rollout", "read_log", "rollout_from_dict",
           "write_log"]

LOG_FIELDS = ("run_id", "step", "group", "task_id", "completion_id", "completion", "reward",
              "verdict", "public_passed", "public_total", "hidden_passed", "hidden_total",
              "wall_time_s", "difficulty", "source")


class LogFormatError(MonitorError, InputError):
    """A rollout log line is malformed; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class Rollout:
    """One scored completion of one training step.

    ``group`` is the set of rollouts of one prompt in one step (GRPO's group); when the log does
    not say, the task id stands for it. ``difficulty`` is a tier name or a number; ``source``
    the task's data source.
    """

    step: int
    task_id: str
    completion: str
    reward: float | None
    group: str | None = None
    verdict: str | None = None
    public_passed: int | None = None
    public_total: int | None = None
    hidden_passed: int | None = None
    hidden_total: int | None = None
    wall_time_s: float | None = None
    run_id: str | None = None
    completion_id: str | None = None
    difficulty: str | float | None = None
    source: str | None = None

    @property
    def group_key(self) -> str:
        """The group within its step: ``group``, else the task id."""
        return self.group if self.group is not None else self.task_id

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (one log line), without the unset optional fields."""
        return {k: v for k, v in asdict(self).items()
                if v is not None or k in ("reward", "step", "task_id", "completion")}


_INT_FIELDS = ("public_passed", "public_total", "hidden_passed", "hidden_total")
_STR_FIELDS = ("verdict", "run_id", "completion_id", "source")
# The rollout log stores integers as SQLite INTEGER (signed 64 bits); a larger one would only
# fail at the insert, far from the line that carried it.
MAX_INT = 2**63 - 1
# Larger rewards are not rewards: their squares overflow the step's std to inf.
MAX_REWARD = 1e9


def _int_problem(v: object) -> str | None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        return "not a non-negative integer"
    if v > MAX_INT:
        return "over 2**63 - 1, the largest integer a rollout log holds"
    return None


def _finite(v: object) -> float | None:
    """``v`` as a finite float, None when it is not a number or not finite."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)  # a 400-digit integer overflows here, not in math.isfinite's caller
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _str_problem(v: str) -> str | None:
    # json.loads decodes "\ud800" to a lone surrogate; it would only fail when a report or an
    # export encodes it, with no line to name. isascii() is O(1), so ASCII text costs nothing.
    if v.isascii():
        return None
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"not valid Unicode (lone surrogate at character {e.start})"
    return None


def rollout_from_dict(rec: dict[str, Any], where: str = "record") -> Rollout:
    """Validate one decoded log line. ``where`` (e.g. ``file:line``) prefixes every error."""
    def bad(name: str, problem: str) -> LogFormatError:
        return LogFormatError(f"{where}: field {name!r}: {problem}")

    step = rec.get("step")
    if not isinstance(step, int) or _int_problem(step) is not None:
        raise bad("step", "over 2**63 - 1, the largest integer a rollout log holds"
                  if isinstance(step, int) and step > MAX_INT
                  else "missing or not a non-negative integer")
    tid, text = rec.get("task_id"), rec.get("completion")
    if not isinstance(tid, str):
        raise bad("task_id", "missing or not a string")
    if not isinstance(text, str):
        raise bad("completion", "missing or not a string")
    if "reward" not in rec:
        raise bad("reward", "missing (use null when the infrastructure failed)")
    reward = rec["reward"]
    if reward is not None:
        reward = _finite(reward)
        if reward is None or abs(reward) > MAX_REWARD:
            raise bad("reward", f"not a finite number within +-{MAX_REWARD:g}, or null")
    group = rec.get("group")
    if group is not None:
        if isinstance(group, int) and not isinstance(group, bool):
            if abs(group) > MAX_INT:
                raise bad("group", "integer out of range (over 2**63 - 1)")
            group = str(group)
        elif not isinstance(group, str):
            raise bad("group", "not a string or integer")
    extra: dict[str, Any] = {}
    for name in _INT_FIELDS:
        v = rec.get(name)
        if v is not None and (problem := _int_problem(v)) is not None:
            raise bad(name, problem)
        extra[name] = v
    for name in _STR_FIELDS:
        v = rec.get(name)
        if v is not None and not isinstance(v, str):
            raise bad(name, "not a string")
        extra[name] = v
    wall = rec.get("wall_time_s")
    if wall is not None:
        wall = _finite(wall)
        if wall is None or wall < 0:
            raise bad("wall_time_s", "not a finite non-negative number")
    diff = rec.get("difficulty")
    if diff is not None and not isinstance(diff, str) and _finite(diff) is None:
        raise bad("difficulty", "not a tier name or a finite number")
    for name, v in (("task_id", tid), ("completion", text), ("group", group),
                    ("difficulty", diff), *((n, extra[n]) for n in _STR_FIELDS)):
        if isinstance(v, str) and (problem := _str_problem(v)) is not None:
            raise bad(name, problem)
    return Rollout(step=step, task_id=tid, completion=text, reward=reward, group=group,
                   wall_time_s=wall, difficulty=diff, **extra)


def _open_text(path: Path) -> io.TextIOBase:
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return path.open(encoding="utf-8")


def read_log(path: Path | str) -> Iterator[Rollout]:
    """Stream the rollouts of a log file (JSON lines; gzip is detected by its magic bytes).

    Raises LogFormatError naming ``file:line`` for a malformed line, or the file itself when it
    cannot be opened or decompressed.
    """
    path = Path(path)
    try:
        fh = _open_text(path)
    except OSError as e:
        raise LogFormatError(f"{path}: cannot open: {e.strerror or e}") from None
    with fh:
        lineno = 0
        try:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise LogFormatError(f"{path}:{lineno}: not valid JSON ({e.msg} at column "
                                         f"{e.colno})") from None
                except ValueError as e:  # an integer of over 4,300 digits (int_max_str_digits)
                    raise LogFormatError(f"{path}:{lineno}: not valid JSON ({e})") from None
                except RecursionError:  # [[[[...]]]]: the decoder's limit, not a crash
                    raise LogFormatError(f"{path}:{lineno}: JSON nested too deeply") from None
                if not isinstance(rec, dict):
                    raise LogFormatError(f"{path}:{lineno}: expected a JSON object, got "
                                         f"{type(rec).__name__}")
                yield rollout_from_dict(rec, f"{path}:{lineno}")
        except (OSError, EOFError, UnicodeDecodeError) as e:
            raise LogFormatError(f"{path}:{lineno + 1}: cannot read: {e}; is the file "
                                 f"truncated or not JSON lines?") from None


def write_log(path: Path | str, rollouts: Iterable[Rollout]) -> int:
    """Write rollouts as JSON lines (gzip when the name ends in ``.gz``); returns the count."""
    path = Path(path)
    n = 0
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as fh:
        for r in rollouts:
            fh.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n
