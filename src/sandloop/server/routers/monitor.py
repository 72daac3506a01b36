"""Feeding the live monitor with rollouts scored elsewhere (``sandloop train --server``): the
dashboard and the Prometheus series then show that run like one scored here."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sandloop.monitor.detectors import Alert
from sandloop.monitor.records import LogFormatError, rollout_from_dict
from sandloop.server.bodies import RolloutsBody
from sandloop.server.dependencies import Key, StateDep
from sandloop.server.errors import ERROR_RESPONSES, RequestError

__all__ = ["router"]

router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/v1/monitor/rollouts", tags=["monitor"])
async def rollouts(key: Key, state: StateDep, body: RolloutsBody) -> dict[str, Any]:
    """Record rollouts (the rollout-log format) and the caller's own alerts for run
    ``run_id`` (``final``: the run is over, its last steps complete now); answers the alerts
    the server's detectors raised."""
    limit = state.config.max_score_items
    if len(body.rollouts) > limit:
        raise RequestError(f"at most {limit} rollouts per request; got {len(body.rollouts)}")
    try:
        parsed = [rollout_from_dict(r, f"rollouts[{i}]") for i, r in enumerate(body.rollouts)]
    except LogFormatError as e:  # the caller's input here, not a log file of the server's
        raise RequestError(str(e)) from None
    given = [Alert(a.code, a.step, a.detail, a.evidence, "client") for a in body.alerts]
    # The served task sets, loaded once: the detectors then know their tests (rollouts of
    # other tasks get the task-blind signatures).
    await state.tasks_for(None)
    raised = state.monitor.record_rollouts(parsed, body.run_id, alerts=given,
                                           final=body.final)
    return {"recorded": len(parsed), "alerts": [a.to_dict() for a in raised]}
