"""Server configuration, and the rule that a server without API keys listens on loopback only."""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, fields
from pathlib import Path

from sandloop.errors import InputError, ServerError
from sandloop.settings import Settings
from sandloop.tasks import BUILTIN_SETS
from sandloop.tasks.repo import REPO_BUILTIN_SETS

__all__ = ["ConfigError", "ServerConfig", "check_bind", "check_config", "is_loopback"]

# The limits a project may set in sandloop.toml have one default, Settings' (``sandloop serve``
# takes them from the project's settings; these are for a ServerConfig built in Python).
_PROJECT = Settings.model_fields


class ConfigError(ServerError, InputError):
    """A server setting is out of range or names what does not exist (the message names the
    setting): found before the server binds its port or starts its sandboxes."""


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``sandloop serve`` can be told. Limits guard the service from its callers."""

    host: str = "127.0.0.1"
    port: int = 8080
    keys_file: Path | None = None
    usage_db: Path | None = None  # quota use per key; default: next to the keys file
    slots: int | None = None
    isolation: str = "full"
    preload: tuple[str, ...] | None = None  # modules warm in every slot (None: the default set)
    journal: Path | None = None  # durable jobs: accepted work survives a restart
    db: Path | None = None  # score results store (reused across requests and restarts)
    rollout_log: Path | None = None  # SQLite log of scored rollouts that came with a step
    # Where episodes are recorded (tool calls, observations, rewards) for `sandloop episodes`;
    # None: in ``db`` if given, else not recorded (`sandloop serve` defaults to the project's
    # result store).
    episode_db: Path | None = None
    record_episodes: bool = True  # False: record none, wherever ``db`` is
    # Rollouts posted to /v1/monitor/rollouts: the share of them re-scored on the hidden tests
    # (high-reward completions of served tasks; 0: no live audit).
    audit_share: float = 0.1
    task_sets: tuple[str, ...] = ("humaneval",)
    max_body_bytes: int = 16 << 20
    max_batch: int = _PROJECT["max_batch"].default
    max_score_items: int = 1024
    max_time_s: float = _PROJECT["max_time_s"].default
    max_memory_mb: int = _PROJECT["max_memory_mb"].default
    max_output_bytes: int = 8 << 20  # per stream (stdout, stderr) of one run
    max_workdir_mb: int = 1024
    default_sf_memory_mb: int = 1024  # SandboxFusion's memory_limit_MB=-1 ("unlimited")
    graceful_shutdown_s: float = 30.0
    # Sessions hold memory while idle (their files: workdir_mb capped at memory_mb each).
    max_sessions: int = 1024  # open at once, all keys together
    max_sessions_per_key: int = 16  # open at once per API key (a key's max_sessions overrides)
    session_memory_mb: int | None = None  # all sessions' files; None: half the host's memory
    # With API keys on, /openapi.json, /docs, /redoc and /metrics need a key unless opened here.
    public_docs: bool = False
    public_metrics: bool = False
    ray_address: str | None = None  # HOST:PORT of a Ray cluster's head: run jobs there


# Settings that must be positive (a size or count of zero would refuse every request) and those
# that may be zero. New numeric fields of ServerConfig are checked by their type (see below).
_MAY_BE_ZERO = frozenset({"max_sessions", "max_sessions_per_key", "graceful_shutdown_s",
                          "audit_share"})


def check_config(config: ServerConfig) -> None:
    """Refuse settings the server could not honour, before anything binds or starts: a port
    outside 1..65535, a task set that is neither built in nor an existing file, a size, count
    or limit that is not positive. Raises :class:`ConfigError` naming the setting."""
    if not 1 <= config.port <= 65535:
        raise ConfigError(f"port {config.port} is outside 1..65535")
    builtin = (*BUILTIN_SETS, *REPO_BUILTIN_SETS)
    for name in config.task_sets:
        if name not in builtin and not Path(name).is_file():
            raise ConfigError(f"task set {name!r} is neither built in ({', '.join(builtin)})"
                              " nor an existing file")
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float) or f.name == "port":
            continue
        floor = 0 if f.name in _MAY_BE_ZERO else 1e-9
        if value < floor:
            raise ConfigError(f"{f.name}={value} must be {'>= 0' if floor == 0 else '> 0'}")
    if config.audit_share > 1:
        raise ConfigError(f"audit_share={config.audit_share} must be within [0, 1]")


@functools.lru_cache(maxsize=1024)  # asked for every request: clients are few, parsing is not free
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys_enabled: bool) -> None:
    """Refuse to listen beyond loopback without API keys (raises ConfigError, a ValueError)."""
    if not keys_enabled and not is_loopback(host):
        raise ConfigError(
            f"refusing to listen on {host!r} without API keys: anyone who can reach it could "
            "run code. Create keys (sandloop add-key --keys-file keys.json "
            "--id NAME) and pass --api-keys-file, or listen on 127.0.0.1")
