"""sandloop: isolated, fast execution and trustworthy rewards for RL post-training.

The names below are imported on first use (PEP 562), so that ``import sandloop`` and the
command line's start-up do not pay for the engine, the pool and pydantic until they are needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sandloop import _extensions

if TYPE_CHECKING:
    from sandloop.engine import Engine, SyncEngine
    from sandloop.sandbox.models import ExecResult, Limits, Program, Status
    from sandloop.sandbox.pool import SandboxPool, run, run_batch

__all__ = [
    "Engine",
    "ExecResult",
    "Limits",
    "Program",
    "SandboxPool",
    "Status",
    "SyncEngine",
    "run",
    "run_batch",
]
__version__ = "0.1.0"

_WHERE = {
    "Engine": "sandloop.engine",
    "SyncEngine": "sandloop.engine",
    "ExecResult": "sandloop.sandbox.models",
    "Limits": "sandloop.sandbox.models",
    "Program": "sandloop.sandbox.models",
    "Status": "sandloop.sandbox.models",
    "SandboxPool": "sandloop.sandbox.pool",
    "run": "sandloop.sandbox.pool",
    "run_batch": "sandloop.sandbox.pool",
}


def _open_episode(engine: Any, task: Any, config: Any = None, **keywords: Any) -> Any:
    """``Engine.episode``'s implementation (sandloop._extensions): imported on first use."""
    from sandloop.episodes import episode

    return episode(engine, task, config, **keywords)


_extensions.episode_opener = _open_episode


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sandloop' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
