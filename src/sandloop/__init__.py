"""sandloop: isolated, fast execution and trustworthy rewards for RL post-training."""

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
