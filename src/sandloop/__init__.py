"""sandloop: isolated, fast execution and trustworthy rewards for RL post-training."""

from sandloop.sandbox.models import ExecResult, Limits, Program, Status
from sandloop.sandbox.pool import SandboxPool, run, run_batch

__all__ = ["ExecResult", "Limits", "Program", "SandboxPool", "Status", "run", "run_batch"]
__version__ = "0.1.0"
