"""The cluster's direct run channel (engine.channel) over real TCP on 127.0.0.1: results and
harness bytes arrive intact, cancellation and disconnection stop runs on the node, a lost
connection is a NodeLost (never a result), and the adversarial cases: no secret, a wrong
secret, a silent peer, oversized and malformed frames.

The node's run function here is a real SandboxPool's where a test needs a program to run, and
a small coroutine where it needs a run that blocks or raises on cue.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sandloop import Limits, Program, Status
from sandloop.engine import channel as ch
from sandloop.engine.channel import ChannelClient, ChannelServer, RemoteInputError, RemoteRunError
from sandloop.engine.cluster import NodeLost
from sandloop.envs.errors import EnvNotFound
from sandloop.errors import InputError
from sandloop.sandbox.models import ExecResult
from sandloop.sandbox.pool import SandboxPool

pytestmark = pytest.mark.timeout(60)

Run = Callable[[Program, Limits], Awaitable[ExecResult]]


async def _pair(run: Run) -> tuple[ChannelServer, ChannelClient, int, bytes]:
    secret = secrets.token_bytes(ch.SECRET_BYTES)
    server = ChannelServer(secret, run)
    port = await server.start("127.0.0.1")
    client = await ChannelClient.open("127.0.0.1", port, secret)
    return server, client, port, secret


@pytest.fixture
async def pool() -> AsyncIterator[SandboxPool]:
    async with SandboxPool(2) as p:
        yield p


async def test_runs_on_a_real_pool_come_back_as_the_pool_gave_them(pool: SandboxPool) -> None:
    server, client, _, _ = await _pair(lambda p, lim: pool.run(p, lim))
    try:
        progs = [Program(source=f"print({i} * {i})") for i in range(20)]
        results = await asyncio.gather(*(client.execute(p, Limits(time_s=10)) for p in progs))
        assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(20)]
        assert all(r.status is Status.OK and r.isolation is not None for r in results)
        failing = await client.execute(Program(source="import sys; sys.exit(3)"), Limits())
        assert failing.status is Status.RUNTIME_ERROR and failing.exit_code == 3
    finally:
        await client.close()
        await server.close()


async def test_binary_inputs_and_harness_bytes_cross_byte_for_byte() -> None:
    blob = bytes(range(256)) + ch.SEP * 3  # not UTF-8, and holds the frame separator
    seen: list[Program] = []

    async def run(program: Program, limits: Limits) -> ExecResult:
        seen.append(program)
        return ExecResult(status=Status.OK, stdout="é\x1e", files={"out.bin": blob},
                          channel=blob)

    server, client, _, _ = await _pair(run)
    try:
        r = await client.execute(Program(source="x", files={"in.bin": blob}, stdin=blob),
                                 Limits(time_s=3))
        assert r.channel == blob and r.files == {"out.bin": blob} and r.stdout == "é\x1e"
        assert seen[0].files["in.bin"] == blob and seen[0].stdin == blob
        plain = await client.execute(Program(source="y"), Limits())
        assert plain.channel == blob  # the same run function; None stays None below

        async def none_run(program: Program, limits: Limits) -> ExecResult:
            return ExecResult(status=Status.OK)

        s2, c2, _, _ = await _pair(none_run)
        assert (await c2.execute(Program(source="z"), Limits())).channel is None
        await c2.close()
        await s2.close()
    finally:
        await client.close()
        await server.close()


async def test_a_run_that_raises_is_an_error_and_input_errors_stay_input_errors() -> None:
    class NodeOnlyError(InputError):  # a class the driver does not know by name
        pass

    async def run(program: Program, limits: Limits) -> ExecResult:
        if program.source == "env":
            raise EnvNotFound("environment 'nope' does not exist on this node")
        if program.source == "input":
            raise NodeOnlyError("a bad request")
        raise OSError("no space left")

    server, client, _, _ = await _pair(run)
    try:
        with pytest.raises(EnvNotFound, match="nope"):  # what a local run would raise
            await client.execute(Program(source="env"), Limits())
        with pytest.raises(RemoteInputError, match="NodeOnlyError: a bad request") as bad:
            await client.execute(Program(source="input"), Limits())
        assert isinstance(bad.value, InputError)
        with pytest.raises(RemoteRunError, match="OSError: no space left"):
            await client.execute(Program(source="other"), Limits())
        assert client.lost is None  # the channel is still good for the next run
    finally:
        await client.close()
        await server.close()


async def test_a_cancelled_run_is_stopped_on_the_node_and_a_closed_driver_stops_all() -> None:
    started: list[str] = []
    stopped: list[str] = []

    async def run(program: Program, limits: Limits) -> ExecResult:
        started.append(program.source)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.append(program.source)
            raise
        return ExecResult(status=Status.OK)

    server, client, _, _ = await _pair(run)
    try:
        job = asyncio.ensure_future(client.execute(Program(source="a"), Limits()))
        while not started:
            await asyncio.sleep(0.01)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        while not stopped:
            await asyncio.sleep(0.01)
        assert stopped == ["a"]
        others = [asyncio.ensure_future(client.execute(Program(source=s), Limits()))
                  for s in "bc"]
        while len(started) < 3:
            await asyncio.sleep(0.01)
        await client.close()  # the driver goes: its runs on the node stop
        for o in others:
            with pytest.raises(NodeLost):
                await o
        while len(stopped) < 3:
            await asyncio.sleep(0.01)
        assert sorted(stopped) == ["a", "b", "c"]
    finally:
        await client.close()
        await server.close()


async def test_a_node_that_goes_ends_waiting_and_later_runs_as_node_lost() -> None:
    async def run(program: Program, limits: Limits) -> ExecResult:
        await asyncio.sleep(30)
        return ExecResult(status=Status.OK)

    server, client, _, _ = await _pair(run)
    job = asyncio.ensure_future(client.execute(Program(source="a"), Limits()))
    await asyncio.sleep(0.1)
    await server.close()
    with pytest.raises(NodeLost):
        await job
    with pytest.raises(NodeLost):
        await client.execute(Program(source="b"), Limits())
    assert client.lost
    await client.close()


async def _frames(port: int, data: bytes, most: int = 10) -> list[tuple[int, int, bytes]]:
    """The frames the server sends a raw peer that sends ``data``: up to ``most``, or until it
    closes the connection (a close with unread input may come as a reset)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    out: list[tuple[int, int, bytes]] = []
    try:
        while len(out) < most:
            out.append(await asyncio.wait_for(ch._read_frame(reader), 10))
    except (asyncio.IncompleteReadError, ConnectionResetError):
        pass  # closed by the server
    finally:
        writer.close()
    return out


def _run_frame(rid: int = 1) -> bytes:
    body = ch.encode_run(Program(source="print(1)"), Limits())
    return ch.HEADER.pack(len(body), ch.RUN, rid) + body


async def test_a_peer_without_the_secret_runs_nothing() -> None:
    # The threat: anyone who can reach the port runs programs on the node. Without the check
    # in ChannelServer._accept, the wrong-secret peers below get HELLO and a result.
    ran: list[Program] = []

    async def run(program: Program, limits: Limits) -> ExecResult:
        ran.append(program)
        return ExecResult(status=Status.OK, stdout="1\n")

    secret = secrets.token_bytes(ch.SECRET_BYTES)
    server = ChannelServer(secret, run)
    port = await server.start("127.0.0.1")
    try:
        wrong = bytes(b ^ 1 for b in secret)
        assert await _frames(port, wrong + _run_frame()) == []
        assert await _frames(port, secret[:-1] + b"\0" + _run_frame()) == []
        assert await _frames(port, _run_frame() + _run_frame(2) + _run_frame(3)) == []
        with pytest.raises((ConnectionError, TimeoutError, asyncio.IncompleteReadError)):
            await ChannelClient.open("127.0.0.1", port, wrong)
        assert ran == [] and server.refused == 4
        # The control: with the secret, the same frame runs.
        (k0, _, hello), (k1, rid, body) = await _frames(port, secret + _run_frame(), most=2)
        assert (k0, hello, k1, rid) == (ch.HELLO_K, ch.HELLO, ch.RESULT, 1)
        assert ch.decode_result(body).stdout == "1\n" and len(ran) == 1
    finally:
        await server.close()


async def test_a_silent_peer_is_dropped_after_the_auth_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ch, "AUTH_TIMEOUT_S", 0.3)

    async def run(program: Program, limits: Limits) -> ExecResult:
        raise AssertionError("nothing runs")

    server = ChannelServer(secrets.token_bytes(ch.SECRET_BYTES), run)
    port = await server.start("127.0.0.1")
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        writer.close()
        assert server.refused == 1
    finally:
        await server.close()


async def test_an_oversized_or_unknown_frame_closes_the_connection() -> None:
    async def run(program: Program, limits: Limits) -> ExecResult:
        return ExecResult(status=Status.OK)

    secret = secrets.token_bytes(ch.SECRET_BYTES)
    server = ChannelServer(secret, run)
    port = await server.start("127.0.0.1")
    try:
        hello = (ch.HELLO_K, 0, ch.HELLO)
        huge = ch.HEADER.pack(ch.MAX_FRAME_BYTES + 1, ch.RUN, 1)
        assert await _frames(port, secret + huge) == [hello]  # closed, 256 MiB never read
        odd = ch.HEADER.pack(0, 99, 1)
        assert await _frames(port, secret + odd) == [hello]  # closed
        garbage = ch.HEADER.pack(5, ch.RUN, 7) + b"{{{{{"
        (_, (kind, rid, _)) = await _frames(port, secret + garbage, most=2)
        assert (kind, rid) == (ch.FAILED, 7)  # an error for that run, never a result
    finally:
        await server.close()


async def test_a_node_sending_an_invalid_result_is_lost_not_believed() -> None:
    secret = secrets.token_bytes(ch.SECRET_BYTES)

    async def fake_node(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(ch.SECRET_BYTES)
        writer.write(ch.HEADER.pack(len(ch.HELLO), ch.HELLO_K, 0) + ch.HELLO)
        _, rid, _ = await ch._read_frame(reader)
        body = b'{"status": "ok", "wall_time_s": "soon"}'
        writer.write(ch.HEADER.pack(len(body), ch.RESULT, rid) + body)
        await writer.drain()
        await asyncio.sleep(5)

    srv = await asyncio.start_server(fake_node, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    client = await ChannelClient.open("127.0.0.1", port, secret)
    try:
        with pytest.raises(NodeLost, match="invalid result"):
            await client.execute(Program(source="x"), Limits())
    finally:
        await client.close()
        srv.close()


def test_no_channel_when_rays_own_traffic_is_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandloop.engine.ray_backend import RayNodes

    monkeypatch.setenv("RAY_USE_TLS", "1")
    assert not ch.channel_allowed() and not RayNodes("127.0.0.1:1").channel
    monkeypatch.setenv("RAY_USE_TLS", "0")
    assert ch.channel_allowed() and RayNodes("127.0.0.1:1").channel
    assert not RayNodes("127.0.0.1:1", channel=False).channel


async def test_a_flood_of_silent_peers_cannot_hold_the_nodes_descriptors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The threat: anyone who reaches the port opens connections and sends nothing; each holds
    # a descriptor of the actor (which its sandboxes need) until the auth timeout, and they
    # reconnect as fast as they are dropped. At most MAX_UNAUTHENTICATED wait; the oldest go.
    monkeypatch.setattr(ch, "MAX_UNAUTHENTICATED", 8)

    async def run(program: Program, limits: Limits) -> ExecResult:
        return ExecResult(status=Status.OK, stdout="ran\n")

    secret = secrets.token_bytes(ch.SECRET_BYTES)
    server = ChannelServer(secret, run)
    port = await server.start("127.0.0.1")
    peers = [await asyncio.open_connection("127.0.0.1", port) for _ in range(30)]
    try:
        async def dropped(reader: asyncio.StreamReader) -> bool:
            try:
                return await asyncio.wait_for(reader.read(), 1) == b""
            except TimeoutError:
                return False
            except ConnectionError:
                return True

        gone = await asyncio.gather(*(dropped(r) for r, _ in peers))
        assert sum(gone) == 22  # well before the 5 s auth timeout
        assert server.refused == 22
        # The driver, arriving during the flood, still gets in (it drops the oldest silent one).
        client = await ChannelClient.open("127.0.0.1", port, secret)
        assert (await client.execute(Program(source="x"), Limits())).stdout == "ran\n"
        await client.close()
        assert server.refused == 23
    finally:
        for _, w in peers:
            w.close()
        await server.close()


async def test_a_channel_closed_during_the_handshake_is_a_connection_error() -> None:
    # What the cluster backend falls back from (to Ray calls); an IncompleteReadError instead
    # escaped it and failed the node's attach.
    async def closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(ch.SECRET_BYTES)
        writer.close()

    srv = await asyncio.start_server(closes, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectionError, match="does not speak the sandloop channel"):
            await ChannelClient.open("127.0.0.1", port, secrets.token_bytes(ch.SECRET_BYTES))
    finally:
        srv.close()


# -- the Ray backend's node client and attach, with Ray's objects replaced -----------------------

class _Method:
    def __init__(self, fn: Callable[..., Awaitable[object]]) -> None:
        self.fn = fn

    def remote(self, *args: object) -> Awaitable[object]:
        return self.fn(*args)


class _Actor:
    def __init__(self, **methods: Callable[..., Awaitable[object]]) -> None:
        self.methods = methods

    def __getattr__(self, name: str) -> _Method:
        return _Method(self.methods[name])


class _Ray:
    class exceptions:
        class RayActorError(Exception):
            pass

        class NodeDiedError(Exception):
            pass

        class ObjectLostError(Exception):
            pass

    def __init__(self) -> None:
        self.killed: list[object] = []

    def cancel(self, ref: object) -> None:
        pass

    def kill(self, actor: object) -> None:
        self.killed.append(actor)


async def test_a_cancelled_run_does_not_cancel_the_others_waiting_on_its_environment() -> None:
    # The first run naming a shipped environment installed it on the node, and the others
    # awaited its future: cancelling that run (a withdrawn job) handed them its
    # CancelledError, which the engine takes for their own withdrawal: their results never
    # came. The install now runs on its own; each waiter can only cancel itself.
    from types import SimpleNamespace

    from sandloop.engine.ray_backend import _RayNodeClient

    env_id = "e" * 64
    installs: list[str] = []
    release = asyncio.Event()

    async def install_env(eid: str, archive: object) -> str:
        installs.append(eid)
        await release.wait()
        return "installed"

    async def execute(program: Program, limits: Limits, shipped: object) -> ExecResult:
        return ExecResult(status=Status.OK, stdout=str(program.environment))

    async def local_env(ref: str) -> object:
        return SimpleNamespace(id=env_id)

    async def env_archive(eid: str) -> list[object]:
        return [None]

    shipper = SimpleNamespace(local_env=local_env, env_archive=env_archive,
                              split=lambda p: (p, {}))
    client = _RayNodeClient(_Ray(), _Actor(install_env=install_env, execute=execute), "full",
                            shipper)  # type: ignore[arg-type]
    runs = [asyncio.ensure_future(client.execute(Program(source="x", environment="mine"),
                                                 Limits())) for _ in range(3)]
    while not installs:
        await asyncio.sleep(0.01)
    runs[0].cancel()
    await asyncio.sleep(0.01)
    release.set()
    done = await asyncio.wait_for(asyncio.gather(*runs[1:]), 5)
    assert [r.stdout for r in done] == [env_id, env_id] and installs == [env_id]
    assert runs[0].cancelled()
    await client.execute(Program(source="y", environment="mine"), Limits())
    assert installs == [env_id]  # made sure of once per node


async def test_a_cancelled_run_does_not_fail_the_others_waiting_on_its_shipped_input() -> None:
    # The same on the node: the first run fetching a shipped input from the object store is
    # cancelled (its job withdrawn); the others that wanted the same content still get it.
    from sandloop.engine.ray_backend import NodePoolActor

    actor = NodePoolActor(1, 1.0, "none", ())
    fetched: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    program = Program(source="x")
    shipped = {"big.bin": ("d1", [fetched])}
    runs = [asyncio.ensure_future(actor._inflate(program, shipped)) for _ in range(3)]
    await asyncio.sleep(0.01)
    runs[0].cancel()
    await asyncio.sleep(0.01)
    fetched.set_result(b"data")
    done = await asyncio.wait_for(asyncio.gather(*runs[1:]), 5)
    assert [p.files["big.bin"] for p in done] == [b"data", b"data"]
    assert actor.shipped_fetches == 1 and actor._fetching == {}


async def test_a_node_whose_channel_fails_at_attach_falls_back_and_no_actor_is_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_USE_TLS", raising=False)
    from sandloop.engine.cluster import NodeInfo
    from sandloop.engine.ray_backend import RayNodes

    async def closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(ch.SECRET_BYTES)
        writer.close()  # a middlebox, or an actor refusing during a flood

    async def hangs(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async def close() -> None:
        return None

    for handler in (closes, hangs):
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]

        async def start(port: int = port) -> dict[str, object]:
            return {"isolation": "full", "channel": ("127.0.0.1", port)}

        actor = _Actor(start=start, close=close)
        ray = _Ray()
        nodes = RayNodes("127.0.0.1:1")
        nodes._ray, nodes._shipper = ray, object()  # type: ignore[assignment]
        nodes._actor_cls = SimpleActorClass(actor)
        attach = asyncio.ensure_future(nodes.attach(NodeInfo("ab" * 28, "127.0.0.1", 1, 1024, 2)))
        try:
            if handler is closes:
                client = await asyncio.wait_for(attach, 10)
                assert client.transport == "ray" and ray.killed == []
                await client.close()
            else:
                # The engine closes while the node is attaching: its actor must not live on,
                # holding the node's resource and name (every later attach would fail).
                await asyncio.sleep(0.2)
                attach.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await attach
                assert ray.killed == [actor]
        finally:
            srv.close()


class SimpleActorClass:
    def __init__(self, actor: _Actor) -> None:
        self.actor = actor

    def options(self, **kw: object) -> SimpleActorClass:
        return self

    def remote(self, *args: object) -> _Actor:
        return self.actor


async def test_the_driver_ships_only_a_build_that_still_matches_its_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A driver's build edited in place would be refused by every node, each saying only that
    # the archive is not its id; the driver checks first and says which file changed.
    from sandloop.engine.ray_backend import _Shipper
    from sandloop.envs import EnvBuildError, EnvStore, parse_spec

    monkeypatch.setenv("SANDLOOP_ENV_DIR", str(tmp_path / "driver"))
    store = EnvStore()
    info = store.build(parse_spec({"name": "shipme", "files": {"data/a.txt": "a"}}, tmp_path))
    put: list[bytes] = []

    class _PutRay(_Ray):
        def put(self, data: bytes) -> str:
            put.append(data)
            return "ref"

    assert await _Shipper(_PutRay()).env_archive(info.id) == ["ref"]
    assert EnvStore(tmp_path / "node").install(put[0], info.id).id == info.id  # sound
    os.chmod(info.tree / "data", 0o755)
    os.chmod(info.tree / "data" / "a.txt", 0o644)
    (info.tree / "data" / "a.txt").write_text("A")
    with pytest.raises(EnvBuildError, match=r"'shipme'.*not shipped.*data/a.txt"):
        await _Shipper(_PutRay()).env_archive(info.id)
    assert len(put) == 1
