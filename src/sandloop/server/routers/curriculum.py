"""The curriculum of a served task set: draw task ids, report rewards (the curation layer's
``TaskSampler``, one per set). For trainers without a sampler hook of their own (OpenRLHF), or
several trainer processes sharing one curriculum."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sandloop.server.bodies import FeedbackBody, TaskSampleBody
from sandloop.server.dependencies import Key, StateDep
from sandloop.server.errors import ERROR_RESPONSES, RequestError

__all__ = ["router"]

router = APIRouter(responses=ERROR_RESPONSES)


@router.post("/v1/tasks/sample", tags=["tasks"])
async def sample(key: Key, state: StateDep, body: TaskSampleBody) -> dict[str, Any]:
    """``n`` task ids of ``task_set`` drawn by its curriculum (with replacement; the train split
    when the set has one)."""
    sampler = await state.sampler_for(body.task_set)
    return {"task_set": body.task_set, "task_ids": sampler.sample_ids(body.n)}


@router.post("/v1/tasks/feedback", tags=["tasks"])
async def feedback(key: Key, state: StateDep, body: FeedbackBody) -> dict[str, Any]:
    """Fold a step's group rewards into the curriculum; zero-variance groups are counted."""
    sampler = await state.sampler_for(body.task_set)
    unknown = sorted(tid for tid in body.rewards if tid not in sampler.tasks)
    if unknown:
        raise RequestError(f"rewards: {len(unknown)} task ids not in the curriculum of "
                           f"{body.task_set!r} (e.g. {unknown[0]!r}); use ids from "
                           "/v1/tasks/sample")
    kept = sampler.filter_groups([(tid, rs, tid) for tid, rs in body.rewards.items()])
    return {"task_set": body.task_set, "kept": len(kept),
            "dropped": len(body.rewards) - len(kept), **sampler.stats()}
