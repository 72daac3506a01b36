"""A graph for the crash test (shared by the test and the child it kills)."""

from __future__ import annotations

from sandloop import Limits, Program
from sandloop.engine import Graph, Input, Node

NONCE = "import os\nprint(os.urandom(8).hex())"


def crash_graph() -> Graph:
    """``a -> b -> slow``, ``a -> c``: every node prints a nonce (a rerun would show); ``slow``
    sleeps long enough to be killed in."""
    fast = Limits(time_s=10, memory_mb=128)
    return Graph(nodes=(
        Node(id="a", limits=fast, program=Program(source=NONCE)),
        Node(id="b", limits=fast, program=Program(source=NONCE),
             inputs=(Input(node="a", stdout=True, to="a.txt"),)),
        Node(id="c", limits=fast, program=Program(source=NONCE), after=("a",)),
        Node(id="slow", limits=Limits(time_s=60, memory_mb=128), after=("b",),
             program=Program(source="import os, sys, time\n"
                                    "time.sleep(float(sys.argv[1]))\n" + NONCE,
                             argv=["3"])),
    ))
