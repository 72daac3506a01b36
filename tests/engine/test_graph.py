"""Job graphs (Engine.run_graph): results flow along edges as files, failed parents cancel
their children with a reason, the graph is admitted and journalled as one job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_helpers import assert_none_left, sandbox_processes
from graph_shapes import crash_graph
from pydantic import ValidationError

from sandloop import Limits, Program, Status
from sandloop.engine import Engine, Graph, Input, Node, NodeState, ResourceTooLarge
from sandloop.engine.journal import Journal

HERE = Path(__file__).parent

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAST = Limits(time_s=5, memory_mb=128)


def _setup_then_steps(setup_source: str) -> Graph:
    setup = Node(id="setup", limits=FAST, program=Program(
        source=setup_source, collect=["data.txt"]))
    step = Program(source="import sys\nn = int(open('in/data.txt').read())\n"
                          "print(n * int(sys.argv[1]))", argv=["2"])
    return Graph(nodes=(
        setup,
        Node(id="double", limits=FAST, program=step,
             inputs=(Input(node="setup", file="data.txt", to="in/data.txt"),)),
        Node(id="triple", limits=FAST, program=step.model_copy(update={"argv": ["3"]}),
             inputs=(Input(node="setup", file="data.txt", to="in/data.txt"),)),
        Node(id="report", limits=FAST, after=("double", "triple"),
             program=Program(source="print('all done')")),
    ))


async def test_outputs_flow_to_children(engine: Engine) -> None:
    g = await engine.run_graph(_setup_then_steps("open('data.txt', 'w').write('7')"))
    assert g.ok
    assert g["double"].result is not None and g["double"].result.stdout == "14\n"
    assert g["triple"].result is not None and g["triple"].result.stdout == "21\n"
    assert g["report"].state is NodeState.DONE
    assert list(g.nodes) == ["setup", "double", "triple", "report"]


async def test_failed_parent_cancels_all_descendants_with_a_reason(engine: Engine) -> None:
    g = await engine.run_graph(_setup_then_steps("raise SystemExit(2)"))
    assert g["setup"].result is not None and g["setup"].result.status is Status.RUNTIME_ERROR
    for child in ("double", "triple"):
        assert g[child].state is NodeState.CANCELLED and g[child].result is None
        assert g[child].reason == "parent 'setup' ended runtime_error"
        assert g[child].cause is Status.RUNTIME_ERROR
    assert g["report"].state is NodeState.CANCELLED
    assert "was cancelled" in (g["report"].reason or "") and not g.ok


async def test_a_missing_artifact_cancels_the_child(engine: Engine) -> None:
    g = await engine.run_graph(_setup_then_steps("print('forgot the file')"))
    assert g["setup"].ok and g["double"].state is NodeState.CANCELLED
    assert g["double"].reason == "parent 'setup' left no file 'data.txt'"


async def test_the_whole_graph_is_admitted_before_anything_runs() -> None:
    async with Engine(slots=1, memory_mb=1024) as e:
        g = Graph(nodes=(
            Node(id="first", limits=FAST, program=Program(source="print(1)")),
            Node(id="huge", after=("first",), limits=Limits(memory_mb=4096),
                 program=Program(source="pass")),
        ))
        with pytest.raises(ResourceTooLarge):
            await e.run_graph(g)
        assert e.stats.submitted == 0  # not even the node that would have fitted


async def test_a_graphs_nodes_run_at_the_graphs_priority(engine: Engine) -> None:
    """A high-priority graph overtakes a queued low-priority flood: each of its nodes is
    admitted at the graph's priority as it becomes ready (two levels deep here)."""
    import asyncio

    from engine_helpers import until
    order: list[str] = []

    def sleeper(tag: str) -> Program:
        return Program(source=f"import time\ntime.sleep(0.15)\nprint({tag!r})")

    async def low(i: int) -> None:
        r = await engine.run(sleeper(f"l{i}"), FAST, priority="train", client="flood")
        order.append(r.stdout.strip())

    graph = Graph(nodes=(Node(id="a", limits=FAST, program=sleeper("g-a")),
                         Node(id="b", limits=FAST, program=sleeper("g-b"), after=("a",))))
    flood = [asyncio.create_task(low(i)) for i in range(12)]
    await until(lambda: engine.stats.running == 2 and engine.snapshot().queued == 10,
                "the slots busy and the rest of the flood queued")
    result = await engine.run_graph(graph, priority="eval", client="grader")
    order.append("graph done")
    await asyncio.gather(*flood)
    assert result.ok and result["b"].result is not None
    # Without its priority, the graph would wait behind the 10 queued lows (done last, index
    # 12); at "eval", a then b each take the next free slot: 2 + 2 lows finish before it on a
    # quiet machine. b becomes ready only once a's result is back, so the slot a frees can go
    # to a queued low first; under load (CI running beside other tests) that cost 2 more.
    assert order.index("graph done") <= 6, order


async def test_a_journalled_graph_answers_finished_nodes_after_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    nonce = "import os\nopen('data.txt', 'w').write(str(int.from_bytes(os.urandom(2), 'big')))"
    g = _setup_then_steps(nonce)
    async with Engine(slots=1, journal=db) as e:
        first = await e.run_graph(g, key="graph-1")
        assert e.stats.executed == 4
    async with Engine(slots=1, journal=db) as e:
        again = await e.run_graph(g, key="graph-1")
        assert e.stats.executed == 0 and e.stats.from_journal == 4
    assert again == first


async def test_a_graph_is_one_journal_row_holding_its_nodes(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    async with Engine(slots=1, journal=db) as e:
        await e.run_graph(_setup_then_steps("open('data.txt', 'w').write('7')"), key="g1")
    with Journal(db) as j:
        assert j.counts() == {}  # no per-node job rows
        entry = j.find_graph("default", "g1")
        assert entry is not None and entry.done
        assert sorted(entry.nodes) == ["double", "report", "setup", "triple"]
        assert entry.nodes["double"].stdout == "14\n" and j.pending_graphs() == []


async def test_a_graph_key_reused_for_another_graph_is_refused(tmp_path: Path) -> None:
    from sandloop.engine import IdempotencyConflict

    async with Engine(slots=1, journal=tmp_path / "j.db") as e:
        await e.run_graph(_setup_then_steps("open('data.txt', 'w').write('7')"), key="g")
        with pytest.raises(IdempotencyConflict):
            await e.run_graph(_setup_then_steps("open('data.txt', 'w').write('8')"), key="g")


async def test_crash_mid_graph_then_rerun_recomputes_nothing_finished(tmp_path: Path) -> None:
    before = sandbox_processes()
    db = tmp_path / "crash.db"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, str(HERE / "graph_crash_child.py"), str(db)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    recorded: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            if db.exists():
                with Journal(db) as j:
                    entry = j.find_graph("default", "crash-graph")
                if entry is not None and {"a", "b", "c"} <= set(entry.nodes):
                    recorded = {k: r.stdout for k, r in entry.nodes.items()}
                    break
            time.sleep(0.05)
        assert child.poll() is None and recorded, child.stderr.read() if child.stderr else ""
        os.kill(child.pid, signal.SIGKILL)  # mid-graph: 'slow' is running, nothing cleaned up
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "slow" not in recorded
    assert_none_left(before)  # its fork-servers and runs died with it

    async with Engine(slots=2, journal=db) as e:
        got = [x async for x in e.resume_graphs()]
        assert [k for k, _ in got] == ["crash-graph"]
        g = got[0][1]
        # Only 'slow' ran again; the finished nodes are the crashed run's own results.
        assert e.stats.executed == 1 and e.stats.from_journal == 3
        assert {k: n.result.stdout for k, n in g.nodes.items() if n.result and k != "slow"
                } == recorded
        assert g.ok
        again = await e.run_graph(crash_graph(), key="crash-graph")
        assert again == g and e.stats.executed == 1  # a final row answers it whole
    with Journal(db) as j:
        assert j.pending_graphs() == []


async def test_a_parents_output_can_be_a_childs_file(engine: Engine) -> None:
    g = await engine.run_graph(Graph(nodes=(
        Node(id="test", limits=FAST, program=Program(source="print('3 4')")),
        Node(id="check", limits=FAST, inputs=(Input(node="test", stdout=True, to="out.txt"),),
             program=Program(source="print(sum(map(int, open('out.txt').read().split())))")),
    )))
    assert g["check"].result is not None and g["check"].result.stdout == "7\n"


@pytest.mark.parametrize("nodes, says", [
    ([Node(id="a", program=Program(source=""), after=("b",)),
      Node(id="b", program=Program(source=""), after=("a",))], "cycle"),
    ([Node(id="a", program=Program(source=""), after=("zz",))], "not a node"),
    ([Node(id="a", program=Program(source="")),
      Node(id="a", program=Program(source=""))], "unique"),
    ([Node(id="a", program=Program(source="")),
      Node(id="b", program=Program(source=""), inputs=(Input(node="a", file="x"),))],
     "does not collect it"),
    ([Node(id="a", program=Program(source="", collect=["x"])),
      Node(id="b", program=Program(source="", files={"x": "mine"}),
           inputs=(Input(node="a", file="x"),))], "replace one of its own files"),

])
async def test_malformed_graphs_are_refused(nodes: list[Node], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        Graph(nodes=tuple(nodes))


async def test_an_input_takes_a_file_or_the_output() -> None:
    with pytest.raises(ValidationError, match="needs a file name"):
        Input(node="a", stdout=True)
    with pytest.raises(ValidationError, match="not both or neither"):
        Input(node="a", file="x", stdout=True, to="y")
    with pytest.raises(ValidationError, match="not both or neither"):
        Input(node="a")

