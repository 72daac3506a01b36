"""The public API, pinned: what the top-level package and each layer's ``__init__`` export.

A change here is a change of the public contract (DESIGN.md): removing a name breaks users, and
adding one commits us to it. Update this list on purpose, in the same commit, with the docs.
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC = {
    "sandloop": ["Engine", "ExecResult", "Limits", "Program", "SandboxPool", "Status",
                 "SyncEngine", "run", "run_batch"],
    "sandloop.engine": [
        "Backend", "ClientPolicy", "DeadlineExceeded", "Engine", "EngineClosed", "EngineError",
        "EngineOverloaded", "EngineStats", "Graph", "GraphResult", "IdempotencyConflict", "Input",
        "JobHandle", "Journal", "JournalError", "LocalBackend", "Node", "NodeResult", "NodeState",
        "PRIORITIES", "QueueFull", "RateLimited", "RepeatedResult", "ResourceTooLarge", "RetryPolicy", "Session",
        "SessionClosed", "SessionExpired", "SessionFull", "SessionLimit", "SessionLost", "SyncEngine",
        "SyncSession", "WorkspaceWriteError", "aggregate", "job_key"],
    "sandloop.tasks": [
        "BUILTIN_SETS", "CallTest", "Checker", "Comparison", "FORMATS", "IOTest", "LabelError",
        "SCHEMA", "ScriptTest", "Signature", "Task", "TaskFormatError", "TaskLimits", "Test",
        "detect_format",
        "load_tasks", "parse_record", "resolve_task"],
    "sandloop.reward": [
        "CompletionResult", "RewardConfig", "Runner", "ScoreSummary", "TestOutcome", "Verdict",
        "Verifier", "completion_hash", "output_equal", "overall_verdict", "pass_at_k",
        "shape_reward", "summarize", "values_equal"],
    "sandloop.sandbox": [
        "BatchRequestError", "CgroupError", "ExecRequest", "ExecResult", "Graph", "GraphResult",
        "Input", "Isolation", "IsolationUnavailable", "LanguageUnavailable", "Limits", "Node",
        "NodeResult", "NodeState", "Program", "ProgramInputError", "SandboxPool", "SlotBroken",
        "Status", "Workspace", "WorkspaceFull", "WorkspaceLost", "WorkspaceWriteError",
        "canonical_language", "check_relative_path", "run", "run_batch", "spec_for",
        "workspace_mb"],
    "sandloop.store": ["ResultKey", "ResultStore", "StoreError"],
    "sandloop.integrations": ["LabelError", "ScoreItem", "Scorer", "resolve_task"],
    "sandloop.server": ["KeyStore", "ServerConfig", "add_key", "check_bind", "create_app",
                        "hash_token"],
    "sandloop.curation": ["DEFAULT_SEVERITY", "Difficulty", "Problem", "ProblemCode", "TIERS",
                          "TaskReport", "TaskSampler", "TierThresholds", "grade", "posterior",
                          "verdict_of"],
    "sandloop.monitor": ["ALERT_CODES", "Alert", "AuditOutcome", "LogFormatError", "Monitor",
                         "Rollout", "RunAnalysis", "StepAggregator", "StepStats", "Thresholds",
                         "analyze", "compute_step_stats", "read_log", "write_log"],
    "sandloop.episodes": ["Episode", "EpisodeConfig", "EpisodeFinished", "Grade", "SetupFailed",
                          "Shaping", "Snapshots", "TOOLS", "TOOL_NAMES", "check_arguments",
                          "episode", "shape_reward", "snapshots_of", "tool_schemas"],
    "sandloop.envs": ["BUILTIN_ENVIRONMENTS", "BUILTIN_LANGUAGES", "Determinism", "EnvBuildError",
                      "EnvInfo", "EnvNotFound", "EnvSpec", "EnvStore", "Environment",
                      "MOUNT_POINT", "Mount", "Pin", "PythonSpec", "SpecError", "VerifyReport",
                      "builtin_spec", "default_dir", "load_spec", "parse_spec"],
    # The torch-free part (the loop itself, sandloop.train.loop, needs the train extra).
    "sandloop.train": ["LivePoster", "RunMonitor"],
    "sandloop.errors": ["EngineError", "EnvError", "EpisodeError", "InputError",
                        "IntegrationError", "MonitorError",
                        "RewardError",
                        "SandboxError", "SandloopError", "ServerError", "StoreError", "TaskError"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_are_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(PUBLIC[module])
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.__all__ names {name!r}, which it does not define"


def test_importing_the_package_is_cheap() -> None:
    # The command line's start-up depends on it: the heavy modules load on first use.
    import subprocess
    import sys

    code = ("import sys, sandloop, sandloop.sandbox; heavy = [m for m in ('pydantic', 'sandloop.engine', "
            "'sandloop.sandbox.pool', 'asyncio') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
