"""Feeding the live monitor with rollouts scored elsewhere (``sandloop train --server``): the
dashboard and the Prometheus series then show that run like one scored here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter

from sandloop.errors import SandloopError
from sandloop.monitor.audit import run_audit
from sandloop.monitor.detectors import Alert
from sandloop.monitor.records import LogFormatError, Rollout, rollout_from_dict
from sandloop.reward import CompletionResult, RewardConfig
from sandloop.reward.scoring import Completion
from sandloop.server.auth import Refused, tenant_run
from sandloop.server.bodies import RolloutsBody, ScoreItemBody
from sandloop.server.dependencies import Key, Quota, QuotaDep, StateDep
from sandloop.server.errors import ERROR_RESPONSES, RequestError
from sandloop.server.routers.rewards import score
from sandloop.server.state import ServerState

logger = logging.getLogger(__name__)

__all__ = ["router"]

router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/v1/monitor/rollouts", tags=["monitor"])
async def rollouts(key: Key, quota: QuotaDep, state: StateDep,
                   body: RolloutsBody) -> dict[str, Any]:
    """Record rollouts (the rollout-log format) and the caller's own alerts for run
    ``run_id`` (``final``: the run is over, its last steps complete now); answers the alerts
    the server's detectors raised (an audit's come with the run's next request).

    A sample of the high-reward rollouts of served tasks (at most ``audit_share`` of the
    run's rollouts, signature-flagged first) is re-scored in the background on the tasks'
    hidden tests, charged to the key: a completion its trainer paid for that fails them is
    ``reward_hack_suspected`` ("audit: ...")."""
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
    run = tenant_run(key.id, body.run_id)
    raised = state.monitor.record_rollouts(parsed, run, alerts=given, final=body.final)
    picked = state.monitor.audit_pick(parsed, run, state.known_tasks)
    if picked:
        task = asyncio.create_task(_audit(state, quota, picked, run))
        state.background.add(task)
        task.add_done_callback(state.background.discard)
    return {"recorded": len(parsed), "alerts": [a.to_dict() for a in raised]}


async def _audit(state: ServerState, quota: Quota, picked: Sequence[Rollout],
                 run_id: str | None) -> None:
    """Score ``picked`` on their tasks' hidden tests at background priority; hand the outcomes
    to the monitor. A failure loses only this audit (logged), never the rollouts."""

    async def scorer(items: Sequence[Completion]) -> list[CompletionResult]:
        bodies = [ScoreItemBody(task=c.task_id, completion=c.completion,
                                completion_id=c.completion_id) for c in items]
        return await score(state, state.running_engine(), quota, bodies, RewardConfig(),
                           None, "background")

    try:
        outcomes = await run_audit(picked, scorer, state.monitor.scanner)
    except (SandloopError, Refused) as e:  # engine closed, the key's quota spent, ...
        logger.warning("audit of %d rollouts of run %r not done: %s", len(picked),
                       run_id or "default", e)
        return
    alerts = state.monitor.audit_done(outcomes, run_id)
    state.metrics.audits.inc(len(outcomes))
    if alerts:
        logger.info("audit raised %d alert(s) for run %r", len(alerts), run_id or "default")
