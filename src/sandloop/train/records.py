"""The run directory's append-only logs: ``rollouts.jsonl``, ``metrics.jsonl``, ``alerts.jsonl``.

``rollouts.jsonl`` is the monitor's rollout-log format: one JSON object per completion with
``step`` (int), ``task_id``, ``completion``, ``reward`` (float or null) and the optional ``group``,
``verdict``, ``public_passed``, ``public_total``, ``hidden_passed``, ``hidden_total``,
``wall_time_s``. Each line is flushed as it is written, so a monitor can tail a live run.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from sandloop.reward import CompletionResult

__all__ = ["JsonlWriter", "rollout_record"]


class JsonlWriter:
    """Appends JSON objects, one per line, flushed per write (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def rollout_record(step: int, task_id: str, completion: str, result: CompletionResult,
                   *, group: int, reward: float | None) -> dict[str, Any]:
    """One rollout line (``reward`` is the reward the trainer was given)."""
    return {
        "step": step,
        "task_id": task_id,
        "completion": completion,
        "reward": reward,
        "group": group,
        "verdict": result.verdict.value,
        "public_passed": result.public.passed,
        "public_total": result.public.total,
        "hidden_passed": result.hidden.passed,
        "hidden_total": result.hidden.total,
        "wall_time_s": round(sum(result.timings.values()), 6) if result.timings else None,
    }
