"""Multi-turn rollouts over sandloop episodes, in the shapes trainers use.

- :class:`ToolEnv` — the chat-messages loop of PrimeIntellect verifiers' ``MultiTurnEnv`` and of
  TRL's tool calling: ``initial_messages`` (system + user prompt), ``env_response`` (runs the
  tool calls of the last assistant message, returns ``role: tool`` messages),
  ``is_completed``, and ``rollout(policy, task)`` that drives one episode end to end. Messages
  and ``tools`` are OpenAI function-calling JSON, which chat templates (``tools=``) accept.
- :class:`VerlEpisodeTool` — verl's tool interface (``BaseTool``: ``get_openai_tool_schema``,
  ``create``, ``execute`` -> (text, step reward, metrics), ``calc_reward``, ``release``): one
  instance per tool name, sharing the episode of a rollout by ``instance_id``.

Both drive episodes in this process over an :class:`~sandloop.engine.Engine`; a remote trainer
uses the HTTP endpoints (``POST /v1/episodes``...) instead. examples/episode_rollout.py runs a
scripted policy through :class:`ToolEnv`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandloop.engine import Engine
from sandloop.episodes import TOOLS, Episode, EpisodeConfig
from sandloop.store.episodes import EpisodeLog
from sandloop.tasks.repo import RepoTask

__all__ = ["Policy", "Rollout", "ToolEnv", "VerlEpisodeTool", "verl_tools"]

Message = dict[str, Any]
# A policy sees the conversation and the tools and answers with one assistant message
# (``{"role": "assistant", "content": ..., "tool_calls": [...]}``).
Policy = Callable[[list[Message], list[dict[str, Any]]], Awaitable[Message]]

SYSTEM = ("You are fixing a bug in a Python repository. Use the tools to read files, run the "
          "tests, edit the code, and call submit when the tests pass. Editing the tests does "
          "not help: hidden tests decide the reward.")


@dataclass
class Rollout:
    """One finished episode as a trainer needs it."""

    task_id: str
    messages: list[Message]
    reward: float | None
    verdict: str | None
    turns: int
    episode_id: str
    tests: dict[str, str] = field(default_factory=dict)


class ToolEnv:
    """Chat-message episodes (verifiers ``MultiTurnEnv`` / TRL tool-calling shape)."""

    def __init__(self, engine: Engine, config: EpisodeConfig | None = None, *,
                 log: EpisodeLog | None = None, system_prompt: str = SYSTEM) -> None:
        self.engine = engine
        self.config = config or EpisodeConfig()
        self.log = log
        self.system_prompt = system_prompt
        self.tools = [dict(t) for t in TOOLS]

    async def setup_state(self, task: RepoTask) -> dict[str, Any]:
        """A new episode for ``task``; the state carries it."""
        ep = Episode(self.engine, task, self.config, log=self.log)
        await ep.reset()
        return {"episode": ep, "task": task}

    def initial_messages(self, state: dict[str, Any]) -> list[Message]:
        ep: Episode = state["episode"]
        obs = ep.observation
        files = "\n".join(obs["files"][:200])
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"{obs['problem_statement']}\n\nRepository files:\n"
                                            f"{files}"}]

    def is_completed(self, messages: list[Message], state: dict[str, Any]) -> bool:
        ep: Episode = state["episode"]
        return ep.done

    async def env_response(self, messages: list[Message],
                           state: dict[str, Any]) -> tuple[list[Message], dict[str, Any]]:
        """Run the tool calls of the last assistant message; one ``tool`` message each. An
        assistant message without tool calls submits (the model says it is done)."""
        ep: Episode = state["episode"]
        calls = messages[-1].get("tool_calls") or []
        if not calls:
            obs = await ep.call("submit")
            return [{"role": "user", "content": json.dumps(obs)}], state
        out: list[Message] = []
        for c in calls:
            if ep.done:
                break
            fn = c.get("function", {})
            try:
                args = fn.get("arguments") or {}
                args = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError as e:
                args = {"__invalid_json__": str(e)}  # the tool answers with an error
            obs = await ep.call(str(fn.get("name")), args)
            out.append({"role": "tool", "tool_call_id": c.get("id", ""),
                        "name": fn.get("name"), "content": json.dumps(obs)})
        return out, state

    async def rollout(self, policy: Policy, task: RepoTask) -> Rollout:
        """Drive one episode: the policy answers until the episode ends."""
        state = await self.setup_state(task)
        ep: Episode = state["episode"]
        try:
            messages = self.initial_messages(state)
            while not self.is_completed(messages, state):
                messages.append(await policy(messages, self.tools))
                reply, state = await self.env_response(messages, state)
                messages.extend(reply)
            return Rollout(task.id, messages, ep.reward, ep.verdict, ep.turns, ep.id,
                           dict(ep.grade.tests) if ep.grade is not None else {})
        finally:
            await ep.close()


class VerlEpisodeTool:
    """One tool in verl's ``BaseTool`` shape; all tools of a rollout share its episode."""

    def __init__(self, name: str, episodes: dict[str, Episode], env: ToolEnv,
                 tasks: dict[str, RepoTask]) -> None:
        self.name = name
        self._schema = next(t for t in TOOLS if t["function"]["name"] == name)
        self._episodes = episodes
        self._env = env
        self._tasks = tasks

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return dict(self._schema)

    async def create(self, instance_id: str, task_id: str | None = None,
                     **kwargs: Any) -> str:
        """Start the rollout's episode (once per instance, whichever tool is created first)."""
        if instance_id not in self._episodes:
            if task_id is None or task_id not in self._tasks:
                raise ValueError(f"create() needs a known task_id (got {task_id!r})")
            self._episodes[instance_id] = (await self._env.setup_state(
                self._tasks[task_id]))["episode"]
        return instance_id

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[str, float, dict[str, Any]]:
        ep = self._episodes[instance_id]
        if ep.done:
            return json.dumps({"error": "the episode has ended"}), 0.0, {"done": True}
        obs = await ep.call(self.name, parameters)
        step = float(obs.get("reward") or 0.0) if ep.done else 0.0
        return json.dumps(obs), step, {"done": ep.done, "turns": ep.turns}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The final reward; an unfinished episode is submitted first."""
        ep = self._episodes[instance_id]
        if not ep.done:
            await ep.call("submit")
        return float(ep.reward or 0.0)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        ep = self._episodes.pop(instance_id, None)
        if ep is not None:
            await ep.close()


def verl_tools(engine: Engine, tasks: Sequence[RepoTask],
               config: EpisodeConfig | None = None) -> list[VerlEpisodeTool]:
    """One :class:`VerlEpisodeTool` per episode tool, sharing episodes by ``instance_id``."""
    env = ToolEnv(engine, config)
    shared: dict[str, Episode] = {}
    by_id = {t.id: t for t in tasks}
    return [VerlEpisodeTool(t["function"]["name"], shared, env, by_id) for t in TOOLS]
