"""Other systems' protocols: SandboxFusion's ``/run_code`` (verl) and OpenRLHF's remote reward.

Their success shapes are theirs and never change; their errors are this server's (ErrorBody).
``/run_code`` is served by the direct lane too (:func:`direct_routes`)."""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from sandloop.engine import Engine
from sandloop.reward import RewardConfig
from sandloop.reward.assemble import response_after_prompt as openrlhf_completion
from sandloop.reward.trainer_logs import openrlhf_answer
from sandloop.server import sandboxfusion as sf
from sandloop.server.bodies import OpenRLHFBody, ScoreItemBody
from sandloop.server.dependencies import (
    EngineDep,
    Quota,
    StateDep,
    UrlQuotaDep,
    state_of,
    url_key,
)
from sandloop.server.direct import DirectRoute
from sandloop.server.disconnect import until_disconnect
from sandloop.server.errors import ERROR_RESPONSES, RequestError, error_response
from sandloop.server.routers.rewards import score
from sandloop.server.state import ServerState

__all__ = ["direct_routes", "router"]

router = APIRouter(responses=ERROR_RESPONSES)

ApiKeyQuery = Annotated[str | None, Query(description="the API key, for clients that cannot "
                                                      "send headers")]


# -- SandboxFusion ----------------------------------------------------------------------------
async def run_code(request: Request, state: ServerState, quota: Quota,
                   body: sf.RunCodeRequest) -> Response:
    """SandboxFusion's /run_code, for both lanes (FastAPI's and the direct one)."""
    answer = sf.unsupported(body)
    if answer is None:
        c = state.config
        program, limits = sf.to_program(body, default_memory_mb=c.default_sf_memory_mb,
                                        max_memory_mb=c.max_memory_mb, max_time_s=c.max_time_s)
        engine = state.running_engine()
        with quota.charge(1):
            r = await until_disconnect(request, engine.run(
                program, limits, priority="train", client=quota.key.id))
        answer = sf.to_response(state.observe(r, program.language))
    # The model is already valid: serialise it once, without FastAPI re-validating it.
    return Response(answer.model_dump_json(), media_type="application/json")


@router.post("/run_code", tags=["sandboxfusion"], response_model=sf.RunCodeResponse)
async def run_code_plain(request: Request, quota: UrlQuotaDep, state: StateDep,
                         body: sf.RunCodeRequest, api_key: ApiKeyQuery = None) -> Response:
    """SandboxFusion's /run_code (verl's ``sandbox_fusion.url`` points here)."""
    return await run_code(request, state, quota, body)


@router.post("/k/{api_key}/run_code", tags=["sandboxfusion"],
             response_model=sf.RunCodeResponse)
async def run_code_keyed(request: Request, api_key: str, quota: UrlQuotaDep, state: StateDep,
                         body: sf.RunCodeRequest) -> Response:
    """/run_code with the API key in the URL, for clients that cannot send headers."""
    return await run_code(request, state, quota, body)


@router.get("/v1/ping", tags=["sandboxfusion"], response_class=PlainTextResponse)
async def ping() -> str:
    return "pong"


async def _run_code_direct(request: Request, body: sf.RunCodeRequest) -> Response:
    # The same dependencies as the FastAPI route, called by hand, in the same order.
    quota = Quota(await url_key(request))
    return await run_code(request, state_of(request), quota, body)


def direct_routes() -> list[DirectRoute]:
    """The /run_code routes for the direct lane (called once per rollout; see
    server/direct.py); their FastAPI routes stay the description and the fallback."""
    def route_of(endpoint: object) -> APIRoute:
        # The router's own route: its path is the app's (routers here have no prefix), and it
        # is what FastAPI puts in scope["route"] for metrics and logs.
        return next(r for r in router.routes
                    if isinstance(r, APIRoute) and r.endpoint is endpoint)

    return [DirectRoute(route_of(run_code_plain), sf.RunCodeRequest, _run_code_direct),
            DirectRoute(route_of(run_code_keyed), sf.RunCodeRequest, _run_code_direct)]


# -- OpenRLHF remote reward -------------------------------------------------------------------
async def get_reward(request: Request, state: ServerState, engine: Engine, quota: Quota,
                     body: OpenRLHFBody) -> JSONResponse:
    n = len(body.query)
    labels = body.labels or []
    prompts: list[str | None] = list(body.prompts) if body.prompts else [None] * n
    if len(labels) != n or len(prompts) != n:
        raise RequestError(f"query, prompts and labels must have the same length; got "
                           f"{n}, {len(prompts)}, {len(labels)}")
    items = []
    for i, (q, p, lab) in enumerate(zip(body.query, prompts, labels, strict=True)):
        try:
            items.append(ScoreItemBody(
                task=lab if isinstance(lab, str | dict) else json.dumps(lab),
                completion=openrlhf_completion(q, p)))
        except ValidationError as e:  # the client's text, checked as /v1/score checks it
            raise RequestError(f"sample {i}: {e.errors()[0]['msg']}") from None
    results = await until_disconnect(
        request, score(state, engine, quota, items, RewardConfig(), None, "train"))
    if any(r.reward is None for r in results):
        reasons = sorted({r.reward_reason or "infrastructure failure"
                          for r in results if r.reward is None})
        state.metrics.refused.labels("infra").inc()
        return error_response(
            503, "infrastructure_failure", "infrastructure failure while scoring (rewards "
            "unknown, not 0): " + "; ".join(reasons)[:500], retry_after_s=1.0)
    return JSONResponse(openrlhf_answer(results, [i.completion for i in items]))


@router.post("/get_reward", tags=["openrlhf"])
async def get_reward_plain(request: Request, quota: UrlQuotaDep, state: StateDep,
                           engine: EngineDep, body: OpenRLHFBody,
                           api_key: ApiKeyQuery = None) -> JSONResponse:
    """OpenRLHF's remote reward protocol (``--reward.remote_url`` points here)."""
    return await get_reward(request, state, engine, quota, body)


@router.post("/k/{api_key}/get_reward", tags=["openrlhf"])
async def get_reward_keyed(request: Request, api_key: str, quota: UrlQuotaDep,
                           state: StateDep, engine: EngineDep,
                           body: OpenRLHFBody) -> JSONResponse:
    """/get_reward with the API key in the URL."""
    return await get_reward(request, state, engine, quota, body)
