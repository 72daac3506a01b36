"""The engine on a Ray cluster: one slot-pool actor per node offering ``sandloop``.

Ray is an optional extra (``pip install 'sandloop[ray]'``) imported only here, when an engine
is built with ``cluster="ray"``. Ray finds the nodes, places each node's actor on that node,
moves arguments and results, and reports deaths; ``cluster.ClusterBackend`` does placement,
elasticity and node-loss handling; the engine does everything else (queue, priorities,
fairness, rate limits, retries, journal). No cluster protocol of our own. See docs/cluster.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from sandloop._aio import single_flight
from sandloop.engine.backends import copy_base_in
from sandloop.engine.channel import SECRET_BYTES, ChannelClient, ChannelServer, channel_allowed
from sandloop.engine.cluster import (
    RATE_WINDOW_S,
    ClusterBackend,
    ClusterUnavailable,
    NodeInfo,
    NodeLost,
)
from sandloop.sandbox import warm
from sandloop.sandbox.models import ExecResult, Limits, Program, Status
from sandloop.sandbox.pool import SandboxPool, Workspace, WorkspaceLost
from sandloop.sandbox.slot import DEFAULT_PRELOAD

__all__ = ["NAMESPACE", "RESOURCE", "NodePoolActor", "RayBackend", "RayNodes", "actor_name",
           "connect", "ray_available"]

RESOURCE = "sandloop"  # the custom resource a node offers to say "run sandloop pools here"
NAMESPACE = "sandloop"  # where the pool actors are named (one per node: actor_name)
SHIP_MIN_BYTES = 64 << 10  # inputs at least this large go through Ray's object store once
SHIP_CACHE_BYTES = 256 << 20  # the driver's (and each node's) cache of shipped inputs

log = logging.getLogger("sandloop.cluster")

def _first_line(e: BaseException) -> str:
    """``TypeName: first line of its message``: Ray's errors carry whole tracebacks."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def ray_available() -> bool:
    """Whether the optional ``ray`` package is installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterUnavailable(
            "cluster='ray' needs Ray: pip install 'sandloop[ray]'") from None
    return ray


def actor_name(node_id: str) -> str:
    """The name of ``node_id``'s pool actor (in ``NAMESPACE``): one engine's pool per node."""
    return f"sandloop-pool-{node_id}"


def connect(address: str | None) -> tuple[Any, bool]:
    """Connect this process to the running Ray cluster at ``address`` (HOST:PORT; None:
    ``RAY_ADDRESS``), unless it is already connected. Returns (ray, whether we connected).

    Never starts a private Ray. Raises ClusterUnavailable with what to do when it cannot.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return ray, False
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ClusterUnavailable(
            "no Ray cluster address: pass ADDRESS (HOST:PORT of the head node) or set "
            "RAY_ADDRESS; sandloop never starts a private Ray")
    if address in ("local", "auto") or "://" in address:
        raise ClusterUnavailable(
            f"Ray address {address!r} is not HOST:PORT of a running cluster's head; "
            "sandloop never starts a private Ray (see docs/cluster.md)")
    _check_reachable(address)
    try:
        # log_to_driver=False: the workers' output never reaches this process's stdout (the
        # CLI's JSON lines go there); Ray's own messages stay at WARNING, on stderr.
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterUnavailable(
            f"cannot connect to the Ray cluster at {address}: {e}; start its head with "
            "'ray start --head --port=PORT' (see docs/cluster.md)") from e
    return ray, True


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when nothing listens at ``address``: ray.init would retry for ever."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise ClusterUnavailable(
            f"cannot reach a Ray head at {address!r} ({e}); give HOST:PORT of a running "
            "cluster's head ('ray start --head --port=PORT'; see docs/cluster.md)") from e


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


def _as_bytes(v: str | bytes) -> bytes:
    return v.encode() if isinstance(v, str) else v


class NodePoolActor:
    """Lives on one node (a Ray actor) and owns its ``SandboxPool``.

    Methods are coroutines: Ray runs many at once on the actor's event loop, as the pool's
    slots allow. Workspaces (sessions) stay here; the driver holds only their ids. Given a
    ``channel_secret``, it also serves plain runs on a direct channel (``engine.channel``).
    """

    def __init__(self, slots: int, cpus: float, isolation: str, preload: Sequence[str],
                 warm_modules: dict[str, str] | None = None,
                 channel_secret: bytes | None = None) -> None:
        self.slots = slots
        self._channel = None if channel_secret is None else ChannelServer(
            channel_secret, lambda program, limits: self.execute(program, limits, {}))
        self._closed = asyncio.Event()
        # The node's CPU budget, kept here as the local engine keeps it: at most `cpus` cores'
        # worth of programs run at once, and a run's CPU goes to the next one as soon as its
        # program ends (its cleanup and the result's trip to the driver overlap that run).
        self.cpus = cpus
        self._free_cpus = cpus
        self._cpu_waiters: deque[asyncio.Future[None]] = deque()
        # The driver's warm modules (sandbox.warm), not this process's: it imports no verifier.
        self.pool = SandboxPool(slots, max_slots=slots, isolation=isolation, preload=preload,
                                warm_modules=warm_modules)
        self.workspaces: dict[str, Workspace] = {}
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._fetching: dict[str, asyncio.Task[bytes]] = {}
        self._blob_bytes = 0
        self.inflight = 0
        self.runs = 0
        self.failures = 0
        self.shipped_fetches = 0
        self.envs_installed = 0
        self._done_at: deque[float] = deque(maxlen=100_000)

    def stats(self) -> dict[str, Any]:
        """This node's pool as seen on the node (for ``sandloop cluster status``)."""
        now = time.monotonic()
        recent = sum(1 for t in self._done_at if t >= now - RATE_WINDOW_S)
        queued = len(self._cpu_waiters)
        return {"slots": self.slots, "cpus": self.cpus, "running": self.inflight - queued,
                "queued": queued, "runs": self.runs,
                "failures": self.failures, "runs_per_s": round(recent / RATE_WINDOW_S, 3),
                "sessions": len(self.workspaces), "isolation": self.pool.isolation_level,
                "shipped_fetches": self.shipped_fetches, "envs_installed": self.envs_installed,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "channel": "off" if self._channel is None else "serving",
                "channel_refused": 0 if self._channel is None else self._channel.refused}

    async def _take_cpu(self, want: float) -> None:
        while want > self._free_cpus + 1e-9:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._cpu_waiters.append(fut)
            try:
                await fut
            finally:
                with contextlib.suppress(ValueError):
                    self._cpu_waiters.remove(fut)
        self._free_cpus -= want

    def _give_cpu(self, want: float) -> None:
        self._free_cpus += want
        while self._cpu_waiters:  # few per node: wake all, they check again
            fut = self._cpu_waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def _counted(self, limits: Limits,
                       run: Callable[[Callable[[], None]], Awaitable[ExecResult]]) -> ExecResult:
        want = min(limits.cpus, self.cpus)  # a job larger than the node runs alone
        self.inflight += 1
        given = False

        def program_ended() -> None:
            nonlocal given
            if not given:
                given = True
                self._give_cpu(want)

        try:
            await self._take_cpu(want)
            try:
                result = await run(program_ended)
            finally:
                program_ended()
        finally:
            self.inflight -= 1
        self.runs += 1
        self._done_at.append(time.monotonic())
        if result.status is Status.SANDBOX_ERROR:
            self.failures += 1
        return result

    async def start(self) -> dict[str, Any]:
        await self.pool.start()
        info: dict[str, Any] = {"isolation": self.pool.isolation_level, "pid": os.getpid(),
                                "host": socket.gethostname()}
        if self._channel is not None:
            import ray

            # The node's own address (the one Ray reaches it on), not every interface.
            address = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
            try:
                info["channel"] = (address, await self._channel.start(address))
            except OSError as e:  # the driver then uses Ray calls for every run
                log.warning("cluster channel not started on %s: %s", address, e)
        return info

    async def watch(self) -> None:
        """Returns when the actor closes; raises on the driver when it dies (Ray says so)."""
        await self._closed.wait()

    async def _inflate(self, program: Program, shipped: Mapping[str, tuple[str, Any]]) -> Program:
        """Put back the inputs the driver shipped through the object store (one fetch per
        node: later jobs with the same content hit this node's cache)."""
        if not shipped:
            return program
        files = dict(program.files)
        stdin: str | bytes | None = program.stdin
        for name, (digest, ref) in shipped.items():
            data = self._blobs.get(digest)
            if data is not None:
                self._blobs.move_to_end(digest)
            else:  # one fetch, whichever runs want it meanwhile
                data = await single_flight(self._fetching, digest,
                                     functools.partial(self._fetch, digest, ref), keep=False)
            if name == "\0stdin":
                stdin = data
            else:
                files[name] = data
        return program.model_copy(update={"files": files, "stdin": stdin})

    async def _fetch(self, digest: str, ref: Any) -> bytes:
        self.shipped_fetches += 1
        data: bytes = await ref[0]
        self._blobs[digest] = data
        self._blob_bytes += len(data)
        while self._blob_bytes > SHIP_CACHE_BYTES and len(self._blobs) > 1:
            _, old = self._blobs.popitem(last=False)
            self._blob_bytes -= len(old)
        return data

    async def install_env(self, env_id: str, archive: list[Any]) -> str:
        """Make the driver's environment ``env_id`` available in this node's store: present
        already, or installed from ``archive`` (a one-item list holding the object ref of
        ``EnvStore.export``), checked against its id (``EnvStore.install``)."""
        from sandloop.envs.store import EnvStore

        store = EnvStore()
        if await asyncio.to_thread(lambda: (store.root / env_id / "env.json").is_file()):
            return "present"
        data: bytes = await archive[0]
        await asyncio.to_thread(store.install, data, env_id)
        self.envs_installed += 1
        return "installed"

    async def execute(self, program: Program, limits: Limits,
                      shipped: Mapping[str, tuple[str, Any]]) -> ExecResult:
        program = await self._inflate(program, shipped)
        return await self._counted(
            limits, lambda ended: self.pool.run(program, limits, on_end=ended))

    async def open_workspace(self, limits: Limits, environment: str | None = None) -> str:
        ws = await self.pool.open_workspace(limits, environment=environment)
        wid = secrets.token_hex(8)
        self.workspaces[wid] = ws
        return wid

    def _ws(self, wid: str) -> Workspace:
        ws = self.workspaces.get(wid)
        if ws is None:
            raise WorkspaceLost(f"workspace {wid} is not on this node (closed, or lost)")
        return ws

    async def run_in(self, wid: str, program: Program, limits: Limits,
                     shipped: Mapping[str, tuple[str, Any]]) -> ExecResult:
        ws = self._ws(wid)
        program = await self._inflate(program, shipped)
        return await self._counted(limits, lambda ended: self.pool.run_in(ws, program, limits))

    async def write_files(self, wid: str, files: dict[str, str | bytes]) -> None:
        await self.pool.write_files(self._ws(wid), files)

    async def read_files(self, wid: str, paths: list[str]) -> dict[str, bytes]:
        return await self.pool.read_files(self._ws(wid), paths)

    async def close_workspace(self, wid: str) -> None:
        ws = self.workspaces.pop(wid, None)
        if ws is not None:
            await self.pool.close_workspace(ws)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._closed.set()
        await self.pool.close()


def _draining_nodes(ray: Any) -> set[str]:
    """Nodes being drained (`ray drain-node`, autoscaler scale-down, preemption): they get no
    new work; runs in flight there finish before the node goes. An empty set where this Ray
    cannot tell (the call is Ray's internal state API)."""
    try:
        return set(ray._private.state.state.get_draining_nodes())
    except Exception:
        return set()


class _Shipper:
    """The driver's side of shipping large inputs once: content digest -> object ref."""

    def __init__(self, ray: Any) -> None:
        self._ray = ray
        self._refs: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        # Environments named by runs: ref -> the driver's build (None: not built here, the
        # nodes resolve the name themselves), and each build's archive in the object store.
        self._envs: dict[str, asyncio.Task[Any]] = {}
        self._archives: dict[str, asyncio.Task[Any]] = {}

    async def local_env(self, ref: str) -> Any:
        """The driver's own build that ``ref`` names (an ``EnvInfo``), or None: looked up once."""
        return await single_flight(self._envs, ref, functools.partial(self._lookup, ref))

    @staticmethod
    async def _lookup(ref: str) -> Any:
        from sandloop.envs.store import EnvStore
        from sandloop.errors import EnvError

        try:
            return await asyncio.to_thread(EnvStore().get, ref)
        except EnvError:
            return None

    async def env_archive(self, env_id: str) -> list[Any]:
        """The object ref of ``env_id``'s archive, put into the object store once."""
        ref = await single_flight(self._archives, env_id,
                                  functools.partial(self._put_archive, env_id))
        return [ref]  # nested: fetched by the node only if it lacks it

    async def _put_archive(self, env_id: str) -> Any:
        from sandloop.envs.errors import EnvBuildError
        from sandloop.envs.store import EnvStore

        store = EnvStore()
        # A build changed since it was made (edited in place, a disk fault) would be refused by
        # every node, each saying only that the archive is not its id: say where it is wrong.
        report = await asyncio.to_thread(store.verify, env_id)
        if not report.ok:
            raise EnvBuildError(f"the driver's build of environment {report.name!r} "
                                f"({env_id[:12]}) is not shipped to the nodes: {report.detail}")
        return self._ray.put(await asyncio.to_thread(store.export, env_id))

    def split(self, program: Program) -> tuple[Program, dict[str, tuple[str, Any]]]:
        big = {name: v for name, v in program.files.items() if len(v) >= SHIP_MIN_BYTES}
        if program.stdin is not None and len(program.stdin) >= SHIP_MIN_BYTES:
            big["\0stdin"] = program.stdin
        if not big:
            return program, {}
        shipped: dict[str, tuple[str, Any]] = {}
        for name, value in big.items():
            data = _as_bytes(value)
            d = _digest(data)
            entry = self._refs.get(d)
            if entry is None:
                # Wrapped in a list: a top-level ref argument would be fetched by Ray before
                # the call; nested, the actor fetches it only on a cache miss.
                entry = (self._ray.put(data), len(data))
                self._refs[d] = entry
                self._bytes += len(data)
                while self._bytes > SHIP_CACHE_BYTES and len(self._refs) > 1:
                    _, (_, size) = self._refs.popitem(last=False)
                    self._bytes -= size
            else:
                self._refs.move_to_end(d)
            shipped[name] = (d, [entry[0]])
        files = {k: v for k, v in program.files.items() if k not in big}
        stdin = None if "\0stdin" in big else program.stdin
        return program.model_copy(update={"files": files, "stdin": stdin}), shipped


class _RayNodeClient:
    """Calls into one node's ``NodePoolActor``; a dead actor is a ``NodeLost``.

    Plain runs go over the node's channel when it has one (``engine.channel``: a Ray call per
    run costs more than the run); sessions, and runs with inputs shipped through the object
    store, are Ray calls. Ray's report of the actor's death ends the channel too (``_watch``).
    """

    def __init__(self, ray: Any, actor: Any, isolation: str, shipper: _Shipper,
                 channel: ChannelClient | None = None) -> None:
        self._ray = ray
        self._actor = actor
        self._isolation = isolation
        self._shipper = shipper
        self._channel = channel
        self._envs_here: dict[str, asyncio.Task[None]] = {}  # env ids made sure of on the node
        self._watcher = None if channel is None else \
            asyncio.get_running_loop().create_task(self._watch(channel))

    async def _watch(self, channel: ChannelClient) -> None:
        try:
            await self._actor.watch.remote()
            reason = "the node's pool actor closed"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # RayActorError, NodeDiedError, ...: the node is gone
            reason = _first_line(e)
        channel.fail(reason)

    @property
    def transport(self) -> str:
        """``channel`` while plain runs go over the direct channel, else ``ray``."""
        return "channel" if self._channel is not None and self._channel.lost is None else "ray"

    @property
    def isolation(self) -> str:
        return self._isolation

    async def _call(self, method: str, *args: Any) -> Any:
        ray = self._ray
        ref = getattr(self._actor, method).remote(*args)
        try:
            return await ref
        except asyncio.CancelledError:
            # The caller gave up (cancelled job, closing engine): stop the run on the node too.
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise
        except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError) as e:
            raise NodeLost(_first_line(e)) from e

    async def _node_env(self, ref: str | None) -> str | None:
        """What a run naming environment ``ref`` names on the node: the id of the driver's build
        of it, shipped to the node once (so every node runs what the driver has, whatever the
        node's store calls that name); ``ref`` itself for a built-in name (each node builds
        those from its own toolchain) or one the driver has not built."""
        from sandloop.envs.spec import BUILTIN_ENVIRONMENTS

        if ref is None or ref in BUILTIN_ENVIRONMENTS:
            return ref
        info = await self._shipper.local_env(ref)
        if info is None:
            return ref
        env_id: str = info.id
        await single_flight(self._envs_here, env_id, functools.partial(self._install, env_id))
        return env_id

    async def _install(self, env_id: str) -> None:
        await self._call("install_env", env_id, await self._shipper.env_archive(env_id))

    async def _on_node(self, program: Program) -> Program:
        """``program`` naming its environment as the node must (``_node_env``)."""
        env = await self._node_env(program.environment)
        if env == program.environment:
            return program
        return program.model_copy(update={"environment": env})

    async def execute(self, program: Program, limits: Limits) -> ExecResult:
        program, shipped = self._shipper.split(await self._on_node(program))
        if self._channel is not None and not shipped:
            return await self._channel.execute(program, limits)
        result: ExecResult = await self._call("execute", program, limits, shipped)
        return result

    async def open_workspace(self, limits: Limits, *, environment: str | None = None,
                             base: Mapping[str, bytes] | None = None) -> Any:
        ws = await self._call("open_workspace", limits, await self._node_env(environment))
        return await copy_base_in(self, ws, base)  # copied in, over the wire

    async def run_in(self, workspace: Any, program: Program, limits: Limits) -> ExecResult:
        program, shipped = self._shipper.split(await self._on_node(program))
        result: ExecResult = await self._call("run_in", workspace, program, limits, shipped)
        return result

    async def write_files(self, workspace: Any, files: Mapping[str, str | bytes]) -> None:
        await self._call("write_files", workspace, dict(files))

    async def read_files(self, workspace: Any, paths: Sequence[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = await self._call("read_files", workspace, list(paths))
        return out

    async def close_workspace(self, workspace: Any) -> None:
        await self._call("close_workspace", workspace)

    async def close(self) -> None:
        # Best effort on a node that may be dead: a failure is logged, never raised, so one lost
        # node cannot stop the engine's close from releasing the others.
        waiting = [t for t in (self._watcher, *self._envs_here.values()) if t is not None]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
        try:
            await asyncio.wait_for(self._call("close"), 10.0)
        except Exception as e:
            log.debug("closing the node actor: %s: %s", type(e).__name__, e)
        try:
            self._ray.kill(self._actor)
        except Exception as e:
            log.debug("killing the node actor: %s: %s", type(e).__name__, e)


class RayNodes:
    """Finds Ray nodes offering ``sandloop`` and starts a ``NodePoolActor`` on each.

    ``address``: an existing cluster's ``HOST:PORT`` (None: the cluster this process is
    already connected to, else ``RAY_ADDRESS``). A private local Ray is never started.
    ``channel``: plain runs go over a direct channel to each node (``engine.channel``) when the
    driver can reach it; False: every run is a Ray call (slower: ~1.3 ms and more than a
    millisecond of CPU each side per run).
    """

    def __init__(self, address: str | None = None, *, isolation: str = "full",
                 preload: Sequence[str] | None = None, slots_per_cpu: float = 2.0,
                 attach_timeout_s: float = 60.0, channel: bool = True) -> None:
        self.address = address
        self.channel = channel and channel_allowed()
        self.isolation = isolation
        self.preload = tuple(DEFAULT_PRELOAD if preload is None else preload)
        self.slots_per_cpu = slots_per_cpu
        self.attach_timeout_s = attach_timeout_s
        self._ray: Any = None
        self._owns_connection = False
        self._shipper: _Shipper | None = None
        self._actor_cls: Any = None
        self._amount: dict[str, float] = {}

    async def connect(self) -> None:
        ray, self._owns_connection = connect(self.address)
        self._ray = ray
        self._shipper = _Shipper(ray)
        self._actor_cls = ray.remote(NodePoolActor)

    async def discover(self) -> list[NodeInfo]:
        ray = self._ray
        nodes = await asyncio.to_thread(ray.nodes)
        draining = await asyncio.to_thread(_draining_nodes, ray)
        out = []
        for n in nodes:
            res = n.get("Resources") or {}
            if not n.get("Alive") or res.get(RESOURCE, 0) <= 0 or n["NodeID"] in draining:
                continue
            cpus = float(res.get("CPU", 0.0)) or float(os.cpu_count() or 1)
            memory_mb = int(res.get("memory", 0) // (1 << 20)) or 1024
            nid = n["NodeID"]
            self._amount[nid] = float(res[RESOURCE])
            out.append(NodeInfo(nid, str(n.get("NodeManagerAddress", "")), cpus, memory_mb,
                                max(1, int(cpus * self.slots_per_cpu))))
        return out

    async def attach(self, node: NodeInfo) -> _RayNodeClient:
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        assert self._shipper is not None
        # Handed to the actor over Ray, the cluster's own authenticated control plane: only a
        # peer holding it may use the node's channel.
        secret = secrets.token_bytes(SECRET_BYTES) if self.channel else None
        # The actor claims the node's whole `sandloop` resource: one engine's pool per node (a
        # second engine's actor waits, and its attach times out, instead of double-booking
        # the node's cores). num_cpus=0: the runs, not the actor, use the cores.
        # Named (one per node): `sandloop cluster status` finds it; a second engine's actor for
        # the same node fails at once instead of double-booking its cores.
        actor = self._actor_cls.options(
            name=actor_name(node.node_id), namespace=NAMESPACE,
            num_cpus=0, resources={RESOURCE: self._amount.get(node.node_id, 1.0)},
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            max_restarts=0, max_concurrency=100_000,
        ).remote(node.slots, node.cpus, self.isolation, self.preload, warm.registered(),
                 secret)

        async def started() -> dict[str, Any]:
            info: dict[str, Any] = await actor.start.remote()
            return info

        try:
            info = await asyncio.wait_for(started(), self.attach_timeout_s)
            channel = None
            if secret is not None and info.get("channel"):
                channel = await _open_channel(node, info["channel"], secret)
        except BaseException:
            # Left alive, the actor would keep the node's `sandloop` resource and its name:
            # every later attach to this node (this engine's next try, a new engine in this
            # process) would fail until the driver exits.
            with contextlib.suppress(Exception):
                ray.kill(actor)
            raise
        return _RayNodeClient(ray, actor, str(info.get("isolation", "")), self._shipper,
                              channel)

    async def disconnect(self) -> None:
        if self._owns_connection and self._ray is not None:
            self._ray.shutdown()
            self._owns_connection = False


async def _open_channel(node: NodeInfo, where: Sequence[Any],
                        secret: bytes) -> ChannelClient | None:
    host, port = where
    try:
        return await ChannelClient.open(host, int(port), secret)
    except (OSError, TimeoutError) as e:  # a firewall between driver and node, say
        log.warning("cluster channel to node %s (%s:%s) unreachable (%s: %s); its runs go "
                    "through Ray calls (slower). Let the driver reach the nodes' ephemeral "
                    "TCP ports, or pass channel=False to skip the attempt (docs/cluster.md)",
                    node.node_id[:12], host, port, type(e).__name__, e)
        return None


class RayBackend(ClusterBackend):
    """``ClusterBackend`` over the Ray cluster at ``address`` (see ``RayNodes``)."""

    def __init__(self, address: str | None = None, *, isolation: str = "full",
                 preload: Sequence[str] | None = None, refresh_s: float = 1.0,
                 min_nodes: int = 1, start_timeout_s: float = 120.0,
                 channel: bool = True) -> None:
        super().__init__(RayNodes(address, isolation=isolation, preload=preload,
                                  channel=channel),
                         refresh_s=refresh_s, min_nodes=min_nodes,
                         start_timeout_s=start_timeout_s, nodes_limit_cpu=True)
