"""The engine layer: scheduling many sandbox runs, and multi-turn sessions (see docs/engine.md)."""

from sandloop.engine.backends import Backend, LocalBackend
from sandloop.engine.engine import PRIORITIES, ClientPolicy, Engine, EngineStats, JobHandle
from sandloop.engine.errors import (
    DeadlineExceeded,
    EngineClosed,
    EngineError,
    EngineOverloaded,
    IdempotencyConflict,
    QueueFull,
    RateLimited,
    ResourceTooLarge,
    SessionClosed,
    SessionExpired,
    SessionFull,
    SessionLimit,
    SessionLost,
    WorkspaceWriteError,
)
from sandloop.engine.journal import Journal, JournalError, job_key
from sandloop.engine.repeat import RepeatedResult, aggregate
from sandloop.engine.retry import RetryPolicy
from sandloop.engine.session import Session
from sandloop.engine.sync import SyncEngine, SyncSession
from sandloop.sandbox.graph import Graph, GraphResult, Input, Node, NodeResult, NodeState

__all__ = [
    "PRIORITIES",
    "Backend",
    "ClientPolicy",
    "DeadlineExceeded",
    "Engine",
    "EngineClosed",
    "EngineError",
    "EngineOverloaded",
    "EngineStats",
    "Graph",
    "GraphResult",
    "IdempotencyConflict",
    "Input",
    "JobHandle",
    "Journal",
    "JournalError",
    "LocalBackend",
    "Node",
    "NodeResult",
    "NodeState",
    "QueueFull",
    "RateLimited",
    "RepeatedResult",
    "ResourceTooLarge",
    "RetryPolicy",
    "Session",
    "SessionClosed",
    "SessionExpired",
    "SessionFull",
    "SessionLimit",
    "SessionLost",
    "SyncEngine",
    "SyncSession",
    "WorkspaceWriteError",
    "aggregate",
    "job_key",
]
