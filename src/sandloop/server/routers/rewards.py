"""Scoring completions against tasks, and the task sets this server serves."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from sandloop.engine import Engine
from sandloop.reward import CompletionResult, RewardConfig, Verifier
from sandloop.reward.scoring import Completion, score_all
from sandloop.sandbox.models import ExecResult, Limits, Program
from sandloop.server.auth import tenant_run
from sandloop.server.bodies import MAX_STEP, Priority, ScoreBody, ScoreItemBody
from sandloop.server.dependencies import EngineDep, Key, Quota, QuotaDep, StateDep
from sandloop.server.disconnect import until_disconnect
from sandloop.server.errors import ERROR_RESPONSES, RequestError
from sandloop.server.state import ServerState
from sandloop.tasks import LabelError, Task, resolve_task

__all__ = ["router", "score"]

router = APIRouter(responses=ERROR_RESPONSES)


async def score(state: ServerState, engine: Engine, quota: Quota, items: list[ScoreItemBody],
                reward: RewardConfig, task_set: str | None,
                priority: Priority) -> list[CompletionResult]:
    """Score ``items`` (a task id of a served set, a task record, or tests each), charging one
    run per item to the key's quota once the tasks resolve."""
    config = state.config
    if len(items) > config.max_score_items:
        raise RequestError(f"at most {config.max_score_items} items per request; got "
                           f"{len(items)}")
    needs_set = any(isinstance(i.task, str) and not i.task.lstrip().startswith("{")
                    for i in items)
    known = await state.tasks_for(task_set) if needs_set and config.task_sets else {}
    by_id: dict[str, Task] = {}
    comps: list[Completion] = []
    for n, item in enumerate(items):
        try:
            task = resolve_task(item.task, known, language=item.language)
        except LabelError as e:
            raise LabelError(f"items[{n}].task: {e}") from None
        other = by_id.setdefault(task.id, task)
        if other.version != task.version:
            raise RequestError(f"items[{n}].task: two different tasks share id {task.id!r}")
        comps.append(Completion(task_id=task.id, completion=item.completion,
                                completion_id=item.completion_id or str(n)))
    run = engine.runner(priority=priority, client=quota.key.id)

    async def observed(p: Program, lim: Limits) -> ExecResult:
        return state.observe(await run(p, lim), p.language)

    verifier = Verifier(observed, reward=reward)
    with quota.charge(len(items)):
        results = await score_all(by_id, comps, verifier, store=state.store,
                                  concurrency=4 * engine.backend.slots, scope=quota.key.id)
    for r in results:
        state.metrics.verdicts.labels(r.verdict.value).inc()
    return results


@router.post("/v1/score", tags=["rewards"])
async def score_endpoint(request: Request, quota: QuotaDep, state: StateDep, engine: EngineDep,
                         body: ScoreBody) -> dict[str, Any]:
    """Score completions against tasks (by id from a served task set, or given inline)."""
    step = training_step(request, body)  # a bad header is a 400 before anything is charged
    results = await until_disconnect(request, score(
        state, engine, quota, body.items, body.reward, body.task_set, body.priority))
    if step is not None:
        record_rollouts(state, request, body, results, step, quota.key.id)
    return {"results": [r.model_dump(mode="json") for r in results]}


def training_step(request: Request, body: ScoreBody) -> int | None:
    """The training step the scores come with (body field, else header X-Sandloop-Step), or
    None; RequestError (400) for a header that is not one."""
    for name in ("x-sandloop-group", "x-sandloop-run"):
        if len(request.headers.get(name, "")) > 256:
            raise RequestError(f"{name}: longer than 256 characters")
    if body.step is not None:
        return body.step
    raw = request.headers.get("x-sandloop-step")
    if raw is None:
        return None
    try:
        step = int(raw)
    except ValueError:
        raise RequestError(f"X-Sandloop-Step: not an integer: {raw!r}") from None
    if not 0 <= step <= MAX_STEP:
        raise RequestError(f"X-Sandloop-Step: {raw!r} is not in [0, 2**63 - 1]")
    return step


def record_rollouts(state: ServerState, request: Request, body: ScoreBody,
                    results: list[CompletionResult], step: int, key_id: str) -> None:
    """Scores that come with a training step go to the monitor (body field or header), in
    the key's own run."""
    h = request.headers
    state.monitor.record(results, [i.completion for i in body.items], step=step,
                         group=body.group or h.get("x-sandloop-group"),
                         run_id=tenant_run(key_id, body.run_id or h.get("x-sandloop-run")),
                         groups=[i.group for i in body.items])


@router.get("/v1/tasksets", tags=["tasks"])
async def task_sets(key: Key, state: StateDep) -> dict[str, Any]:
    """The task sets this server scores against by id."""
    loaded = state.task_sets
    return {"task_sets": [{"name": n, "loaded": n in loaded,
                           "tasks": len(loaded[n]) if n in loaded else None}
                          for n in state.config.task_sets]}


@router.get("/v1/tasksets/{name}/tasks", tags=["tasks"])
async def task_list(key: Key, state: StateDep, name: str,
                    offset: Annotated[int, Query(ge=0)] = 0,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
    """Tasks of a set as a model may see them: prompt and public tests (hidden tests are
    counted, never shown)."""
    tasks = list((await state.tasks_for(name)).values())
    page = tasks[offset:offset + limit]
    return {"total": len(tasks), "tasks": [{
        "id": t.id, "version": t.version, "language": t.language, "prompt": t.prompt,
        "starter_code": t.starter_code, "entry_point": t.entry_point,
        "test_kind": t.test_kind,
        "public_tests": [x.model_dump(mode="json") for x in t.public_tests],
        "hidden_tests": len(t.hidden_tests)} for t in page]}
