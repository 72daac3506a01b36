"""Running programs: one, a batch, or a stream of results as they finish."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.server.bodies import BatchBody, RunBody
from sandloop.server.dependencies import EngineDep, Key, QuotaDep, StateDep
from sandloop.server.disconnect import until_disconnect
from sandloop.server.errors import ERROR_RESPONSES, RequestError
from sandloop.server.state import ServerState

__all__ = ["router"]

router = APIRouter(tags=["runs"], responses=ERROR_RESPONSES)


def dump(r: ExecResult) -> dict[str, Any]:
    return r.model_dump(mode="json")


@router.post("/v1/run")
async def run_one(request: Request, key: Key, quota: QuotaDep, state: StateDep,
                  engine: EngineDep, body: RunBody) -> dict[str, Any]:
    """Run one program; returns its ExecResult JSON."""
    state.check_limits(body.limits)
    program = body.program
    with quota.charge(1):
        r = await until_disconnect(request, engine.run(
            program, body.limits, priority=body.priority, client=key.id, key=body.key,
            timeout_s=body.timeout_s))
    return dump(state.observe(r, program.language))


def batch_items(state: ServerState, body: BatchBody) -> list[tuple[Program, Limits]]:
    """The programs of a batch, each within this server's limits (RequestError otherwise)."""
    if len(body.requests) > state.config.max_batch:
        raise RequestError(f"at most {state.config.max_batch} programs per batch; got "
                           f"{len(body.requests)}")
    items = []
    for n, req in enumerate(body.requests):
        try:
            state.check_limits(req.limits)
        except RequestError as e:
            raise RequestError(f"requests[{n}]: {e}") from None
        items.append((req.program, req.limits))
    return items


@router.post("/v1/batch")
async def run_batch(request: Request, key: Key, quota: QuotaDep, state: StateDep,
                    engine: EngineDep, body: BatchBody) -> dict[str, Any]:
    """Run many programs on all slots; results in input order."""
    items = batch_items(state, body)
    out: list[dict[str, Any] | None] = [None] * len(items)

    async def go() -> None:
        async for i, r in engine.stream(items, priority=body.priority, client=key.id,
                                        timeout_s=body.timeout_s):
            out[i] = dump(state.observe(r, items[i][0].language))

    with quota.charge(len(items)):
        await until_disconnect(request, go())
    return {"results": out}


@router.post("/v1/stream", responses={200: {"content": {"application/x-ndjson": {}}}})
async def run_stream(key: Key, quota: QuotaDep, state: StateDep, engine: EngineDep,
                     body: BatchBody) -> StreamingResponse:
    """Like /v1/batch, but NDJSON lines ``{"index", "result"}`` as each run finishes."""
    items = batch_items(state, body)
    quota.admit(len(items))

    async def lines() -> AsyncIterator[bytes]:
        with quota.holding():  # in flight while the lines are sent, not only until the first
            async for i, r in engine.stream(items, priority=body.priority, client=key.id,
                                            timeout_s=body.timeout_s):
                state.observe(r, items[i][0].language)
                yield (json.dumps({"index": i, "result": dump(r)}) + "\n").encode()

    return StreamingResponse(lines(), media_type="application/x-ndjson")
