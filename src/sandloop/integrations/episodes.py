"""Multi-turn rollouts over sandloop episodes, in the shapes trainers use.

- :class:`ToolEnv` — the chat-messages loop of PrimeIntellect verifiers' ``MultiTurnEnv`` and of
  TRL's tool calling: ``initial_messages`` (system + user prompt), ``env_response`` (runs the
  tool calls of the last assistant message, returns ``role: tool`` messages),
  ``is_completed``, and ``rollout(policy, task)`` that drives one episode end to end. Messages
  and ``tools`` are OpenAI function-calling JSON, which chat templates (``tools=``) accept.
- :class:`VerlEpisodeTool` — verl's tool interface as its ``ToolAgentLoop`` (verl >= 0.5) drives
  it: built from a tools YAML (``class_name`` + ``config``: ``url`` and ``task_set`` of a
  ``sandloop serve``; ``tool_schema``), one instance per tool; every tool call is ``create``
  (``create_kwargs``: the sample's ``task_id``) -> ``execute(..., agent_data=...)`` ->
  ``release``, and the calls of one trajectory (``agent_data.request_id``) share its episode.
  ``execute`` returns (response with ``.text``, step reward, metrics): the step reward of the
  call that ends the episode is its final reward. :func:`verl_tools` makes the same tools over
  an in-process engine.
- :class:`TrlEpisodeEnv` — TRL's ``GRPOTrainer(environment_factory=...)`` shape: ``reset(**row)``
  starts the row's episode (``task_id``) and returns its first observation, each public method
  is a tool (type hints and Google-style docstrings, as TRL turns them into JSON schemas), and
  ``get_reward()`` is the episode's final reward (submitted first if the model never did).

:class:`ToolEnv` and :func:`verl_tools` drive episodes in this process over an
:class:`~sandloop.engine.Engine`; :class:`VerlEpisodeTool` from a verl config and
:class:`TrlEpisodeEnv` use the HTTP endpoints (``POST /v1/episodes``...) of a ``sandloop serve
--task-set ...``, which is what a trainer's rollout workers reach. examples/episode_rollout.py
runs a scripted policy through :class:`ToolEnv`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from sandloop.engine import Engine
from sandloop.episodes import TOOLS, Episode, EpisodeConfig
from sandloop.errors import IntegrationError
from sandloop.store.episodes import EpisodeLog
from sandloop.tasks.repo import RepoTask

__all__ = ["EpisodeClient", "HttpEpisodes", "LocalEpisodes", "Policy", "Rollout", "ToolEnv",
           "ToolText", "TrlEpisodeEnv", "VerlEpisodeTool", "verl_tools"]

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


class EpisodeClient(Protocol):
    """Where episodes live for the verl tools: in this process (:class:`LocalEpisodes`) or
    behind ``sandloop serve`` (:class:`HttpEpisodes`)."""

    async def start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        """Start an episode of ``task_id``: its id and first observation."""
        ...

    async def call(self, episode_id: str, tool: str,
                   arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """One tool call: its observation and whether the episode ended."""
        ...

    async def end(self, episode_id: str) -> None:
        """Drop an episode (ungraded if unfinished)."""
        ...


class LocalEpisodes:
    """Episodes over an in-process engine, by task id."""

    def __init__(self, engine: Engine, tasks: Sequence[RepoTask],
                 config: EpisodeConfig | None = None) -> None:
        self.engine = engine
        self.config = config or EpisodeConfig()
        self.tasks = {t.id: t for t in tasks}
        self._live: dict[str, Episode] = {}

    async def start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        task = self.tasks.get(task_id)
        if task is None:
            raise ValueError(f"unknown task_id {task_id!r}; known: {sorted(self.tasks)[:10]}")
        ep = Episode(self.engine, task, self.config)
        obs = await ep.reset()
        self._live[ep.id] = ep
        return ep.id, obs

    async def call(self, episode_id: str, tool: str,
                   arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        ep = self._live[episode_id]
        obs = await ep.call(tool, arguments)
        if ep.done:
            await self.end(episode_id)
        return obs, ep.done

    async def end(self, episode_id: str) -> None:
        ep = self._live.pop(episode_id, None)
        if ep is not None:
            await ep.close()


class HttpEpisodes:
    """Episodes behind ``sandloop serve --task-set SET`` at ``url`` (``POST /v1/episodes``)."""

    def __init__(self, url: str, task_set: str, *, api_key: str | None = None,
                 max_turns: int | None = None, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.task_set = task_set
        self.api_key = api_key
        self.max_turns = max_turns
        self.timeout_s = timeout_s

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx

        async with httpx.AsyncClient(timeout=self.timeout_s) as c:
            r = await c.post(self.url + path, json=body, headers=self._headers())
        if r.status_code >= 400:
            raise RemoteEpisodeError(f"POST {path}: {r.status_code} {r.text[:500]}")
        return r.json()

    async def start(self, task_id: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"task_set": self.task_set, "task_id": task_id}
        if self.max_turns is not None:
            body["max_turns"] = self.max_turns
        got = await self._post("/v1/episodes", body)
        return str(got["episode_id"]), dict(got["observation"])

    async def call(self, episode_id: str, tool: str,
                   arguments: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        got = await self._post(f"/v1/episodes/{episode_id}/call",
                               {"tool": tool, "arguments": arguments})
        return dict(got["observation"]), bool(got["done"])

    async def end(self, episode_id: str) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=self.timeout_s) as c:
            await c.delete(f"{self.url}/v1/episodes/{episode_id}", headers=self._headers())


class RemoteEpisodeError(IntegrationError):
    """``sandloop serve`` refused an episode request (the message has its status and body)."""


@dataclass
class ToolText:
    """A tool's answer in the shape verl's agent loop reads (``ToolResponse``: ``.text``, and
    no image or video)."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None


class _Schema:
    """What verl's agent loop asks of a tool's schema (``model_dump``), for tools built
    without verl's ``OpenAIFunctionToolSchema``."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._schema = schema

    def model_dump(self, **_: Any) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(self._schema))
        return copy


@dataclass
class _Trajectory:
    episode_id: str | None = None
    done: bool = False
    reward: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class VerlEpisodeTool:
    """One episode tool in verl's ``BaseTool`` shape, as verl's ``ToolAgentLoop`` calls it.

    In a tools YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``), one entry per
    tool::

        - class_name: sandloop.integrations.episodes.VerlEpisodeTool
          config: {type: native, url: "http://127.0.0.1:8000", task_set: repo-demo}
          tool_schema: {type: function, function: {name: run_tests, description: ..., ...}}

    and each sample's ``extra_info.tools_kwargs.<tool>.create_kwargs.task_id`` names its task.
    verl creates, executes and releases a tool instance for every call; the calls of one
    trajectory (its ``agent_data.request_id``) share one episode, which the first call starts.
    """

    # Trajectories by (where the episodes live, trajectory key), shared by all the tools of a
    # process: each tool is its own instance, and verl makes one instance per call.
    _trajectories: ClassVar[dict[tuple[int, str], _Trajectory]] = {}
    _clients: ClassVar[dict[tuple[str, str, str | None], HttpEpisodes]] = {}
    MAX_FINISHED: ClassVar[int] = 4096

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None, *,
                 client: EpisodeClient | None = None, name: str | None = None) -> None:
        config = dict(config or {})
        if tool_schema is not None:
            name = str(tool_schema.function.name)
        name = name or config.get("name")
        by_name = {t["function"]["name"]: t for t in TOOLS}
        if not isinstance(name, str) or name not in by_name:
            raise ValueError(f"tool {name!r} is not an episode tool; tools: {sorted(by_name)}")
        self.name: str = name
        self.config = config
        self.tool_schema = tool_schema if tool_schema is not None else _Schema(by_name[name])
        if client is None:
            if "url" not in config or "task_set" not in config:
                raise ValueError("config needs url (a `sandloop serve`) and task_set")
            key = (str(config["url"]), str(config["task_set"]), config.get("api_key"))
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = HttpEpisodes(
                    key[0], key[1], api_key=key[2], max_turns=config.get("max_turns"))
        self.client = client
        self._instances: dict[str, tuple[str | None, str | None]] = {}  # id -> (task, trajectory)

    def get_openai_tool_schema(self) -> Any:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolText]:
        """A tool instance for one call (verl: ``create(create_kwargs=...)``); the task comes
        from ``create_kwargs["task_id"]`` (or a ``task_id`` keyword)."""
        create_kwargs = kwargs.get("create_kwargs") or {}
        task_id = create_kwargs.get("task_id", kwargs.get("task_id"))
        iid = instance_id or uuid.uuid4().hex
        self._instances[iid] = (task_id, None)
        return iid, ToolText(text="")

    def _trajectory(self, key: str) -> _Trajectory:
        k = (id(self.client), key)
        got = self._trajectories.get(k)
        if got is None:
            got = self._trajectories[k] = _Trajectory()
        return got

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolText, float, dict[str, Any]]:
        """Call the tool in the trajectory's episode (started by its first call). The step
        reward is 0 until the call that ends the episode, which carries the final reward."""
        task_id, _ = self._instances.get(instance_id, (None, None))
        agent_data = kwargs.get("agent_data")
        key = str(getattr(agent_data, "request_id", None) or instance_id)
        self._instances[instance_id] = (task_id, key)
        traj = self._trajectory(key)
        async with traj.lock:  # verl may run one trajectory's tool calls concurrently
            if traj.done:
                return (ToolText(text=json.dumps({"error": "the episode has ended"})), 0.0,
                        {"done": True, "episode_id": traj.episode_id})
            if traj.episode_id is None:
                if task_id is None:
                    raise ValueError("no task_id: give it in the sample's tools_kwargs "
                                     f"({self.name}.create_kwargs.task_id)")
                traj.episode_id, _obs = await self.client.start(str(task_id))
            obs, done = await self.client.call(traj.episode_id, self.name, dict(parameters))
            if done:
                traj.done, traj.reward = True, obs.get("reward")
        extra = getattr(agent_data, "extra_fields", None)
        if isinstance(extra, dict):  # the trajectory's output carries its episode
            extra["sandloop_episode_id"] = traj.episode_id
            if done:
                extra["sandloop_reward"] = traj.reward
        step = float(traj.reward or 0.0) if done else 0.0
        return ToolText(text=json.dumps(obs)), step, {"done": done,
                                                      "episode_id": traj.episode_id}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The trajectory's final reward; an unfinished episode is submitted first."""
        _task, key = self._instances.get(instance_id, (None, instance_id))
        traj = self._trajectory(str(key))
        async with traj.lock:
            if not traj.done and traj.episode_id is not None:
                obs, _done = await self.client.call(traj.episode_id, "submit", {})
                traj.done, traj.reward = True, obs.get("reward")
        return float(traj.reward or 0.0)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """verl releases the instance after every call: the episode stays with its
        trajectory. A finished trajectory is remembered (a later call must not start a new
        episode), the oldest finished ones forgotten past ``MAX_FINISHED``."""
        self._instances.pop(instance_id, None)
        finished = [k for k, t in self._trajectories.items() if t.done]
        for k in finished[:max(0, len(finished) - self.MAX_FINISHED)]:
            self._trajectories.pop(k, None)


def verl_tools(engine: Engine, tasks: Sequence[RepoTask],
               config: EpisodeConfig | None = None) -> list[VerlEpisodeTool]:
    """The episode tools as verl tools over an in-process engine (one per tool, sharing
    episodes by trajectory)."""
    client = LocalEpisodes(engine, tasks, config)
    return [VerlEpisodeTool(client=client, name=t["function"]["name"]) for t in TOOLS]


class TrlEpisodeEnv:
    """An episode as TRL's ``GRPOTrainer(environment_factory=...)`` wants an environment.

    ``environment_factory=functools.partial(TrlEpisodeEnv, "http://127.0.0.1:8000",
    "repo-demo")``, and a dataset whose rows carry ``task_id``: TRL calls ``reset(**row)`` for
    each rollout, offers the public methods below as tools (from their type hints and
    docstrings), and adds ``get_reward()`` to the rewards. Synchronous (TRL calls ``reset``
    on its trainer thread); it talks to ``sandloop serve --task-set ...``.
    """

    def __init__(self, url: str, task_set: str, *, api_key: str | None = None,
                 max_turns: int | None = None, timeout_s: float = 600.0) -> None:
        import httpx

        self._client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=(
            {"Authorization": f"Bearer {api_key}"} if api_key else {}))
        self._task_set = task_set
        self._max_turns = max_turns
        self._episode: str | None = None
        self._done = False
        self._reward: float | None = None

    def reset(self, **row: Any) -> str:
        """Start the episode of ``row["task_id"]`` (ending the previous one); returns the first
        observation (problem statement and files), appended to the prompt by TRL."""
        self._end()
        body: dict[str, Any] = {"task_set": self._task_set, "task_id": row["task_id"]}
        if self._max_turns is not None:
            body["max_turns"] = self._max_turns
        r = self._client.post("/v1/episodes", json=body)
        if r.status_code >= 400:
            raise RemoteEpisodeError(f"POST /v1/episodes: {r.status_code} {r.text[:500]}")
        got = r.json()
        self._episode, self._done, self._reward = got["episode_id"], False, None
        obs = got["observation"]
        return (f"{obs['problem_statement']}\n\nRepository files:\n"
                + "\n".join(obs["files"][:200]))

    def _end(self) -> None:
        if self._episode is not None:
            self._client.delete(f"/v1/episodes/{self._episode}")
            self._episode = None

    def _call(self, tool: str, arguments: dict[str, Any]) -> str:
        if self._done:
            return json.dumps({"error": "the episode has ended"})
        if self._episode is None:
            return json.dumps({"error": "no episode: reset() first"})
        r = self._client.post(f"/v1/episodes/{self._episode}/call",
                              json={"tool": tool, "arguments": arguments})
        if r.status_code >= 400:
            return json.dumps({"error": f"{r.status_code}: {r.text[:500]}"})
        got = r.json()
        if got["done"]:
            self._done, self._reward = True, got["observation"].get("reward")
        return json.dumps(got["observation"])

    def read_file(self, path: str) -> str:
        """Read a text file of the repository.

        Args:
            path: The file's path, relative to the repository root.

        Returns:
            JSON with the file's content, size and whether it was truncated.
        """
        return self._call("read_file", {"path": path})

    def write_file(self, path: str, content: str) -> str:
        """Create or replace a file of the repository.

        Args:
            path: The file's path, relative to the repository root.
            content: The file's whole new text.

        Returns:
            JSON saying what was written, or an error.
        """
        return self._call("write_file", {"path": path, "content": content})

    def apply_patch(self, patch: str) -> str:
        """Apply a unified diff to the repository (all or nothing).

        Args:
            patch: The diff, with --- a/PATH and +++ b/PATH headers and @@ hunks.

        Returns:
            JSON with the files written and deleted, or why the patch does not apply.
        """
        return self._call("apply_patch", {"patch": patch})

    def list_dir(self, path: str = ".") -> str:
        """List a directory of the repository.

        Args:
            path: The directory, relative to the repository root.

        Returns:
            JSON with its entries (directories end in /).
        """
        return self._call("list_dir", {"path": path})

    def run(self, command: str) -> str:
        """Run a bash command in the repository root (time, memory and output limited).

        Args:
            command: The command line.

        Returns:
            JSON with status, exit_code, stdout and stderr.
        """
        return self._call("run", {"command": command})

    def run_tests(self) -> str:
        """Run the repository's tests.

        Returns:
            JSON with passed and failed counts and the output's tail.
        """
        return self._call("run_tests", {})

    def submit(self) -> str:
        """Finish: the repository as it is now is graded by the hidden tests.

        Returns:
            JSON with the reward, the verdict and each test's result.
        """
        return self._call("submit", {})

    def get_reward(self) -> float:
        """The episode's final reward (TRL calls it once per rollout); submits first if the
        model never did, and ends the episode."""
        if self._episode is not None and not self._done:
            self._call("submit", {})
        reward = float(self._reward or 0.0)
        self._end()
        return reward
