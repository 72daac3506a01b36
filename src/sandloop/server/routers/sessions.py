"""Multi-turn sessions: a work dir whose files persist between runs, owned by one API key."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from fastapi import APIRouter, Request

from sandloop.engine import Session, SessionClosed
from sandloop.server.auth import KeyPolicy, Refused
from sandloop.server.bodies import FilesBody, ReadFilesBody, SessionOpenBody, SessionRunBody
from sandloop.server.dependencies import EngineDep, Key, QuotaDep, StateDep
from sandloop.server.disconnect import until_disconnect
from sandloop.server.errors import ERROR_RESPONSES, RequestError
from sandloop.server.state import ServerState

__all__ = ["router"]

router = APIRouter(tags=["sessions"], responses=ERROR_RESPONSES)


def session_of(state: ServerState, key: KeyPolicy, sid: str) -> Session:
    """The key's session ``sid``; SessionClosed (404) if it is gone or another key's."""
    entry = state.sessions.get(sid)
    if entry is None or entry[1] != key.id:
        raise SessionClosed(f"no session {sid!r} (closed, expired, or not yours)")
    s = entry[0]
    if s.closed:
        state.sessions.pop(sid, None)
    return s


def sessions_held(state: ServerState, key_id: str) -> int:
    return sum(1 for s, k in state.sessions.values() if k == key_id and not s.closed) \
        + state.opening.get(key_id, 0)


@router.post("/v1/sessions", status_code=201)
async def open_session(key: Key, state: StateDep, engine: EngineDep,
                       body: SessionOpenBody) -> dict[str, Any]:
    """Open a multi-turn session: a work dir whose files persist between runs (at most
    ``limits.workdir_mb`` capped at ``limits.memory_mb``)."""
    state.check_limits(body.limits)
    for sid in [k for k, (x, _) in state.sessions.items() if x.closed]:
        state.sessions.pop(sid, None)
    # Threat: idle sessions pin memory; one key must not take the whole server's share.
    cap = key.record.max_sessions if key.record.max_sessions is not None \
        else state.config.max_sessions_per_key
    held = sessions_held(state, key.id)
    if held >= cap:
        raise Refused(429, f"key {key.id!r} already holds {held} open sessions (at most "
                           f"{cap}); close some (DELETE /v1/sessions/ID) or let them expire",
                      code="too_many_sessions")
    state.opening[key.id] = state.opening.get(key.id, 0) + 1  # counted while the open awaits
    try:
        s = await engine.open_session(language=body.language, limits=body.limits,
                                      ttl_s=body.ttl_s, idle_timeout_s=body.idle_timeout_s,
                                      client=key.id)
    finally:
        state.opening[key.id] -= 1
    state.sessions[s.id] = (s, key.id)
    return {"id": s.id, "language": s.language, "ttl_s": s.ttl_s,
            "idle_timeout_s": s.idle_timeout_s}


@router.post("/v1/sessions/{sid}/run")
async def session_run(request: Request, key: Key, quota: QuotaDep, state: StateDep, sid: str,
                      body: SessionRunBody) -> dict[str, Any]:
    """Run a bash ``command`` or ``code`` in the session's language, in its work dir."""
    s = session_of(state, key, sid)
    if (body.command is None) == (body.code is None):
        raise RequestError("give exactly one of 'command' (bash) or 'code'")
    if body.limits is not None:
        state.check_limits(body.limits)
    with quota.charge(1):
        if body.command is not None:
            coro = s.run(body.command, stdin=body.stdin, limits=body.limits,
                         timeout_s=body.timeout_s)
        else:
            assert body.code is not None
            coro = s.run_code(body.code, stdin=body.stdin, limits=body.limits,
                              timeout_s=body.timeout_s)
        r = await until_disconnect(request, coro)
    return state.observe(r, "bash" if body.command is not None else s.language) \
        .model_dump(mode="json")


@router.put("/v1/sessions/{sid}/files")
async def session_write(key: Key, state: StateDep, sid: str,
                        body: FilesBody) -> dict[str, Any]:
    """Create or replace files in the session's work dir."""
    s = session_of(state, key, sid)
    files: dict[str, str | bytes] = {}
    for name, content in body.files.items():
        if body.encoding == "base64":
            try:
                files[name] = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError):
                raise RequestError(f"files[{name!r}]: not valid base64") from None
        else:
            files[name] = content
    await s.write_files(files)
    return {"written": sorted(files)}


@router.post("/v1/sessions/{sid}/files/read")
async def session_read(key: Key, state: StateDep, sid: str,
                       body: ReadFilesBody) -> dict[str, Any]:
    """Read regular files (base64); missing files and symlinks are left out."""
    s = session_of(state, key, sid)
    got = await s.read_files(body.paths)
    return {"files": {k: base64.b64encode(v).decode() for k, v in got.items()}}


@router.delete("/v1/sessions/{sid}")
async def session_close(key: Key, state: StateDep, sid: str) -> dict[str, Any]:
    """Close the session and delete its files."""
    s = session_of(state, key, sid)
    await s.close()
    state.sessions.pop(sid, None)
    return {"closed": sid}
