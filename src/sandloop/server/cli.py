"""``sandloop serve``: run the HTTP service with uvicorn (registered by cli/main.py)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from sandloop.sandbox.slot import preload_with
from sandloop.server.auth import KeyStore
from sandloop.server.config import ConfigError, ServerConfig, check_bind, check_config

__all__ = ["bind", "serve_command"]


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening); ConfigError if it cannot be, e.g.
    the port is in use. Bound before the sandboxes start, so a taken port fails at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"cannot resolve host {host!r}: {e.strerror}") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e} (another server "
                          "on that port? choose --port)") from None
    sock.set_inheritable(True)
    return sock


def serve_command(
    host: str = "127.0.0.1",
    port: int = 8080,
    api_keys_file: Path | None = None,
    slots: int | None = None,
    no_isolation: bool = False,
    journal: Path | None = None,
    db: Path | None = None,
    task_sets: tuple[str, ...] = ("humaneval",),
    max_body_mb: int = 16,
    log_level: str = "info",
    preload_extra: tuple[str, ...] = (),
    usage_db: Path | None = None,
    *,
    max_sessions: int = 1024,
    max_sessions_per_key: int = 16,
    session_memory_mb: int | None = None,
    public_docs: bool = False,
    public_metrics: bool = False,
    rollout_log: Path | None = None,
    ray_address: str | None = None,
    max_batch: int | None = None,
    max_time_s: float | None = None,
    max_memory_mb: int | None = None,
    episode_db: Path | None = None,
    record_episodes: bool = True,
    audit_share: float = 0.1,
) -> None:
    """Serve until SIGINT/SIGTERM, then stop accepting, finish in-flight requests (up to
    ``ServerConfig.graceful_shutdown_s``) and close the engine. Every setting is checked before
    the port is bound, and the port is bound before the sandboxes start; "ready" is logged once
    the port listens. Raises ConfigError for a setting out of range or a port that cannot be
    bound or a non-loopback ``host`` without API keys, KeysFileError for a bad keys
    file, UsageLedgerError when the quota ledger cannot be opened, RolloutLogError when
    ``rollout_log`` is not a usable SQLite rollout log. ``max_batch``, ``max_time_s`` and
    ``max_memory_mb``: None takes ServerConfig's default (the CLI passes the project's
    settings: sandloop.toml < SANDLOOP_* < its flags). ``episode_db``: where episodes are
    recorded (None: in ``db``, else not at all; ``record_episodes=False``: nowhere). ``audit_share``: the share of posted rollouts
    re-scored on their hidden tests (0: none)."""
    import uvicorn

    from sandloop.server.app import create_app
    from sandloop.server.observability import log, logging_configured

    if max_body_mb <= 0:
        raise ConfigError(f"--max-body-mb {max_body_mb} must be > 0")
    keys = KeyStore.load(api_keys_file)
    check_bind(host, keys.enabled)
    config = ServerConfig(host=host, port=port, keys_file=api_keys_file, usage_db=usage_db,
                          slots=slots,
                          isolation="none" if no_isolation else "full", journal=journal, db=db,
                          task_sets=tuple(task_sets), max_body_bytes=max_body_mb << 20,
                          preload=preload_with(preload_extra),
                          max_sessions=max_sessions,
                          max_sessions_per_key=max_sessions_per_key,
                          session_memory_mb=session_memory_mb, public_docs=public_docs,
                          public_metrics=public_metrics, rollout_log=rollout_log,
                          episode_db=episode_db, record_episodes=record_episodes,
                          audit_share=audit_share,
                          ray_address=ray_address,
                          max_batch=ServerConfig.max_batch if max_batch is None else max_batch,
                          max_time_s=ServerConfig.max_time_s if max_time_s is None else max_time_s,
                          max_memory_mb=(ServerConfig.max_memory_mb if max_memory_mb is None
                                         else max_memory_mb))
    check_config(config)
    sock = bind(host, port)
    # The server's JSON logging holds while it serves and is undone after: `serve` run in
    # process (tests, tools) must leave no handler behind on a stream that will be closed.
    with sock, logging_configured(log_level):
        app = create_app(config, keys=keys)

        class Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                await super().startup(sockets)
                if self.started and not self.should_exit:  # the lifespan started, it listens
                    log.info("ready", extra={"host": host, "port": port, "keys": keys.enabled,
                                             "slots": _slots(app)})

        server = Server(uvicorn.Config(
            app, host=host, port=port, log_config=None, access_log=False, log_level=log_level,
            timeout_graceful_shutdown=int(config.graceful_shutdown_s)))
        server.run(sockets=[sock])


def _slots(app: Any) -> int | None:
    engine = app.state.sandloop.engine
    return engine.backend.slots if engine is not None else None
