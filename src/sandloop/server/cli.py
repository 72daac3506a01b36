"""``sandloop serve``: run the HTTP service with uvicorn (registered by cli/main.py)."""

from __future__ import annotations

from pathlib import Path

from sandloop.sandbox.slot import preload_with
from sandloop.server.auth import KeyStore
from sandloop.server.config import ServerConfig, check_bind

__all__ = ["serve_command"]


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
    ray_address: str | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then stop accepting, finish in-flight requests (up to
    ``ServerConfig.graceful_shutdown_s``) and close the engine. Raises ValueError for a
    non-loopback ``host`` without API keys, KeysFileError for a bad keys file, UsageLedgerError
    when the quota ledger cannot be opened."""
    import uvicorn

    from sandloop.server.app import create_app
    from sandloop.server.observability import configure_logging

    keys = KeyStore.load(api_keys_file)
    check_bind(host, keys.enabled)
    config = ServerConfig(host=host, port=port, keys_file=api_keys_file, usage_db=usage_db,
                          slots=slots,
                          isolation="none" if no_isolation else "full", journal=journal, db=db,
                          task_sets=tuple(task_sets), max_body_bytes=max_body_mb << 20,
                          preload=preload_with(preload_extra), max_sessions=max_sessions,
                          max_sessions_per_key=max_sessions_per_key,
                          session_memory_mb=session_memory_mb, public_docs=public_docs,
                          public_metrics=public_metrics, ray_address=ray_address)
    configure_logging(log_level)
    app = create_app(config, keys=keys)
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False,
                log_level=log_level, timeout_graceful_shutdown=int(config.graceful_shutdown_s))
