"""The blocking wrapper, for scripts."""

from __future__ import annotations

from engine_helpers import assert_none_left, sandbox_processes

from sandloop import Limits, Program
from sandloop.engine import SyncEngine

FAST = Limits(time_s=5, memory_mb=256)


def test_sync_wrapper() -> None:
    before = sandbox_processes()
    with SyncEngine(slots=1) as e:
        assert e.run(Program(source="print('hi')")).stdout == "hi\n"
        outs = e.map([Program(source=f"print({i})") for i in range(4)], FAST)
        assert [r.stdout for r in outs] == ["0\n", "1\n", "2\n", "3\n"]
        assert sorted(i for i, _ in e.stream([Program(source="pass")] * 3)) == [0, 1, 2]
        with e.session() as s:
            s.write_files({"a.txt": "x"})
            assert s.run("cat a.txt").stdout == "x"
    assert_none_left(before)



def test_sync_engine_starts_on_first_use_without_with() -> None:
    from sandloop import Program, SyncEngine

    eng = SyncEngine(slots=1)
    try:
        assert [r.stdout for r in eng.map([Program(source="print(5)"),
                                           Program(source="print(6)")])] == ["5\n", "6\n"]
        assert eng.run(Program(source="print(7)")).stdout == "7\n"
    finally:
        eng.close()


def test_sync_engine_runs_a_graph() -> None:
    from sandloop.engine import Graph, Input, Node

    fast = Limits(time_s=5, memory_mb=128)
    graph = Graph(nodes=(
        Node(id="make", limits=fast, program=Program(
            source="open('n.txt', 'w').write('5')", collect=["n.txt"])),
        Node(id="use", limits=fast, inputs=(Input(node="make", file="n.txt"),),
             program=Program(source="print(3 * int(open('n.txt').read()))")),
    ))
    with SyncEngine(slots=1) as e:
        g = e.run_graph(graph)
    assert g.ok and g["use"].result is not None and g["use"].result.stdout == "15\n"
