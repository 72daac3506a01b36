"""The sandbox layer: programs, their limits and results, and the pool of jailed slots that runs
them (DESIGN.md). Everything above it (the engine, rewards, the surfaces) speaks these names.

The names are imported on first use (PEP 562): a slot's zygote imports its own modules of this
package at start-up and must not pay for pydantic, the pool or the languages table.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandloop.sandbox.cgroups import CgroupError
    from sandloop.sandbox.graph import Graph, GraphResult, Input, Node, NodeResult, NodeState
    from sandloop.sandbox.languages import LanguageUnavailable, spec_for
    from sandloop.sandbox.models import (
        ExecResult,
        Limits,
        Program,
        ProgramInputError,
        Status,
        canonical_language,
        check_relative_path,
    )
    from sandloop.sandbox.pool import (
        IsolationUnavailable,
        SandboxPool,
        Workspace,
        WorkspaceFull,
        WorkspaceLost,
        WorkspaceWriteError,
        run,
        run_batch,
        workspace_mb,
    )
    from sandloop.sandbox.protocol import Isolation
    from sandloop.sandbox.requests import BatchRequestError, ExecRequest
    from sandloop.sandbox.slot import SlotBroken

_WHERE = {
    "CgroupError": "cgroups",
    "Graph": "graph", "GraphResult": "graph", "Input": "graph", "Node": "graph",
    "NodeResult": "graph", "NodeState": "graph",
    "LanguageUnavailable": "languages", "spec_for": "languages",
    "ExecResult": "models", "Limits": "models", "Program": "models",
    "ProgramInputError": "models", "Status": "models", "canonical_language": "models",
    "check_relative_path": "models",
    "IsolationUnavailable": "pool", "SandboxPool": "pool", "Workspace": "pool",
    "WorkspaceFull": "pool", "WorkspaceLost": "pool", "WorkspaceWriteError": "pool",
    "run": "pool", "run_batch": "pool", "workspace_mb": "pool",
    "Isolation": "protocol",
    "BatchRequestError": "requests", "ExecRequest": "requests",
    "SlotBroken": "slot",
}

__all__ = [
    "BatchRequestError",
    "CgroupError",
    "ExecRequest",
    "ExecResult",
    "Graph",
    "GraphResult",
    "Input",
    "Isolation",
    "IsolationUnavailable",
    "LanguageUnavailable",
    "Limits",
    "Node",
    "NodeResult",
    "NodeState",
    "Program",
    "ProgramInputError",
    "SandboxPool",
    "SlotBroken",
    "Status",
    "Workspace",
    "WorkspaceFull",
    "WorkspaceLost",
    "WorkspaceWriteError",
    "canonical_language",
    "check_relative_path",
    "run",
    "run_batch",
    "spec_for",
    "workspace_mb",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sandloop.sandbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sandloop.sandbox.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value
