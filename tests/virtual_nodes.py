"""What the tests on a virtual cluster share: the cluster itself (up for a module, down whatever happens, a
skip with the one-line reason where it cannot run) and a job in which every rank says where it runs."""
from __future__ import annotations

import time
from typing import Iterator, Optional

import pytest

from nbmpi.workers.launch import virtual_cluster as vcm

#: Every rank says where it runs and takes part in a collective (so the trace has communication).
WHERE_JOB = """
import socket
from nbmpi.workers import ArrayChannel, world
r, n = world().Get_rank(), world().Get_size()
ch = ArrayChannel(1000)
ch.fill(r)
ch.allreduce("sum")
print(f"rank {r} of {n} on {socket.gethostname()} sum {ch[0]}")
"""


def cluster_or_skip(nodes: int, rate: Optional[str] = vcm.DEFAULT_RATE) -> Iterator[vcm.VirtualCluster]:
    """Yield a :class:`~nbmpi.workers.launch.virtual_cluster.VirtualCluster` of ``nodes`` nodes, links capped
    at ``rate``, torn down after (also when the test fails); skip the test with the cluster's one-line reason
    where it cannot run. Use from a fixture: ``yield from cluster_or_skip(3)``."""
    why = vcm.why_not_available()
    if why:
        pytest.skip(why)
    vc = vcm.VirtualCluster(nodes, rate)
    try:
        vc.up()
    except vcm.ClusterUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield vc
    finally:
        vc.down()


def assert_nothing_left(cluster: vcm.VirtualCluster, timeout: float = 15) -> None:
    """No process in any node's namespace and nothing in any node's own /dev/shm (waiting up to
    ``timeout`` seconds for what is still ending); the assertion names what is left on which node."""
    nodes = range(len(cluster.names))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(cluster.pids(i) or cluster.shm_files(i) for i in nodes):
        time.sleep(0.1)
    left = {cluster.names[i]: (cluster.pids(i), cluster.shm_files(i)) for i in nodes}
    assert not any(p or f for p, f in left.values()), f"(processes, /dev/shm files) left on the nodes: {left}"
