"""A local multi-node Ray cluster for the cluster tests: several Ray nodes on this host.

Kept small for a shared 2-core machine: the head offers no `sandloop` (no runs there), each
worker node 1 CPU (2 slots) and a 100 MiB object store, no dashboard. Ray's files live in a
temp dir of the test (RAY_TMPDIR; short, for Unix socket path limits) and every process of the
cluster is ended by ``shutdown``, also when a test fails.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "resources": {"sandloop": 1},
                             "object_store_memory": 100 << 20, "node_ip_address": "127.0.0.1"}


class LocalRayCluster:
    """``ray.cluster_utils.Cluster`` with sandloop nodes, on 127.0.0.1 only."""

    def __init__(self, nodes: int) -> None:
        self.tmp = tempfile.mkdtemp(prefix="slray", dir="/tmp")
        self._saved = {"RAY_TMPDIR": os.environ.get("RAY_TMPDIR")}
        os.environ["RAY_TMPDIR"] = self.tmp
        import ray._private.ray_constants as rc
        from ray.cluster_utils import Cluster

        if rc.ENABLE_RAY_CLUSTER:
            raise RuntimeError("set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before importing ray: "
                               "else Ray connects to the host's public address, not 127.0.0.1")

        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "object_store_memory": 100 << 20,
            "node_ip_address": "127.0.0.1",
            # Notice a dead node in ~1.5 s instead of ~30 s.
            "_system_config": {"health_check_period_ms": 500,
                               "health_check_failure_threshold": 3,
                               "health_check_initial_delay_ms": 0}})
        self.nodes: dict[str, Any] = {}
        try:
            for _ in range(nodes):
                self.add()
            self.cluster.wait_for_nodes()
        except BaseException:
            self.shutdown()
            raise

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add(self, env_vars: dict[str, str] | None = None) -> str:
        """Start one more sandloop node (``env_vars``: its raylet's and workers' extra
        environment); returns its node id."""
        node = self.cluster.add_node(**NODE_ARGS, **({"env_vars": env_vars} if env_vars else {}))
        self.nodes[node.node_id] = node
        return str(node.node_id)

    def kill(self, node_id: str) -> None:
        """End a node's processes at once (its raylet and workers), as a crash would."""
        node = self.nodes.pop(node_id)
        self.cluster.remove_node(node, allow_graceful=False)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(self.tmp, ignore_errors=True)
