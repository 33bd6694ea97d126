"""Jobs and pools whose ranks span nodes, on a real multi-node Slurm (:mod:`multinode_slurm`).

The module fixture brings up a virtual cluster of 3 nodes (network namespaces with their own
hostname, :class:`~nbmpi.workers.launch.virtual_cluster.VirtualCluster`) and Slurm on it:
slurmctld on the host, one slurmd per node. Every node declares one CPU, so a 3-rank job or pool
has one rank on each node. Checked: ``sbatch -N 3`` of ``deploy/slurm/nbmpi-run.sbatch`` (each
rank on its own node, the trace's lanes named by rank and node); ``nbmpi serve --backend slurm``
running a 3-rank job across the nodes (hostnames, trace lanes, the dashboard's timeline), a pool
whose engines are on the 3 nodes, and the cancel of a spanning job, after which no process of it
is left on any node (:meth:`VirtualCluster.pids`) nor any file in a node's ``/dev/shm``.
Skips (one line) where not root, without ``ip``/``nsenter``, or without Slurm's packages.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nbmpi.workers.launch.virtual_cluster import ClusterUnavailable, VirtualCluster

from multinode_slurm import MultiNodeSlurm, why_not_available
from test_server import SLEEP_JOB, submit
from virtual_nodes import WHERE_JOB
from test_slurm import REPO, Controller, _processes_under, _sbatch, final, rank_pid, wait_job

NODES = 3
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

@pytest.fixture(scope="module")
def slurm():
    why = why_not_available()
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="nbmpi-slurm-nodes-", dir="/tmp"))
    root.chmod(0o755)   # munged checks every directory above its socket
    vc = VirtualCluster(NODES)
    cluster = None
    try:
        try:
            vc.up()
        except ClusterUnavailable as exc:
            pytest.skip(str(exc))
        cluster = MultiNodeSlurm(root, vc, cpus_per_node=1)
        cluster.start()
        yield cluster
    finally:
        if cluster is not None:
            cluster.stop()
        vc.down()   # ends anything still running in a node
        leftovers = _processes_under(root)
        for p in leftovers:
            p.kill()
        shutil.rmtree(root, ignore_errors=True)
        assert not leftovers, f"processes of the Slurm tests survived: {[p.info['cmdline'] for p in leftovers]}"


@pytest.fixture(scope="module")
def ctl(slurm):
    data = Path(tempfile.mkdtemp(prefix="ctl-", dir=slurm.root))
    c = Controller(slurm, data / "data").start()
    yield c
    c.stop()


def _lanes(trace: dict) -> dict:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}


def test_sbatch_run_script_puts_a_rank_on_each_node(slurm, tmp_path):
    (tmp_path / "prog.py").write_text(WHERE_JOB)
    sid = _sbatch(slurm, tmp_path, f"--nodes={NODES}", f"--ntasks={NODES}",
                  str(REPO / "deploy" / "slurm" / "nbmpi-run.sbatch"), "prog.py", env={"NBMPI_PYTHON": sys.executable})
    state = slurm.wait_job(sid, ENDED)
    out = (tmp_path / f"nbmpi-run-{sid}.out").read_text()
    assert state.startswith("COMPLETED"), out
    names = slurm.node_names
    for r in range(NODES):
        assert f"{r}: rank {r} of {NODES} on {names[r]} sum 3.0\n" in out, out
    trace = json.loads((tmp_path / f"nbmpi-run-{sid}.trace" / "trace.json").read_text())
    assert _lanes(trace) == {r: f"rank {r} ({names[r]})" for r in range(NODES)}


def test_controller_job_spans_the_nodes_with_its_trace_and_timeline(ctl, slurm):
    names = slurm.node_names
    with ctl.client() as c:
        job = wait_job(c, submit(c, WHERE_JOB, ranks=NODES)["id"], final, "final")
        assert job["state"] == "succeeded", job
        hosts = []
        for r in range(NODES):
            line = c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text
            assert line.startswith(f"rank {r} of {NODES} on ") and line.endswith(" sum 3.0\n"), line
            hosts.append(line.split(" on ")[1].split()[0])
        assert sorted(hosts) == sorted(names), hosts   # one rank on each node
        lanes = {r: f"rank {r} ({hosts[r]})" for r in range(NODES)}
        assert _lanes(c.get(f"/api/v1/jobs/{job['id']}/trace").json()) == lanes
        tl = c.get(f"/api/v1/dashboard/jobs/{job['id']}/timeline", params={"width": 300}).json()
        assert tl["available"] and tl["state"] == "succeeded", tl
        assert tl["meta"]["ranks"] == list(range(NODES)) and tl["meta"]["lanes"] == [lanes[r] for r in range(NODES)]
        assert set(tl["sources"]["nbmpi_segments"]["rank"]) == set(range(NODES))


def test_pool_engines_on_three_nodes_run_code(ctl, slurm):
    with ctl.client() as c:
        r = c.post("/api/v1/pools", json={"ranks": NODES, "name": "spanning"})
        assert r.status_code == 201, r.text
        pool = r.json()
        try:
            assert pool["state"] == "running", pool["message"]
            job = wait_job(c, submit(c, """
                import socket
                import numpy as np
                x = np.zeros(1)
                comm.Allreduce(np.full(1, rank + 1.0), x)
                print("rank", rank, "of", size, x[0], socket.gethostname())
                """, ranks=None, pool=pool["id"])["id"], final, "final")
            assert job["state"] == "succeeded", job
            lines = [c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text for r in range(NODES)]
            assert [ln.rsplit(" ", 1)[0] for ln in lines] == [f"rank {r} of {NODES} 6.0" for r in range(NODES)], lines
            assert sorted(ln.split()[-1] for ln in lines) == sorted(slurm.node_names), lines
        finally:
            stopped = c.delete(f"/api/v1/pools/{pool['id']}").json()
        assert stopped["state"] == "stopped", stopped
    _assert_nodes_idle(slurm)


def test_cancel_of_a_spanning_job_leaves_nothing_on_any_node(ctl, slurm):
    names = slurm.node_names
    with ctl.client() as c:
        job = submit(c, SLEEP_JOB.format(seconds=600), ranks=NODES)
        wait_job(c, job["id"], lambda j: j["state"] == "running", "running")
        pids = [rank_pid(c, job["id"], r) for r in range(NODES)]
        where = [slurm.node_of(p) for p in pids]
        assert sorted(where) == sorted(names), where     # a rank on every node, in that node's namespace
        r = c.delete(f"/api/v1/jobs/{job['id']}")
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    _assert_nodes_idle(slurm)


def _assert_nodes_idle(slurm: MultiNodeSlurm, timeout: float = 30) -> None:
    """Every node runs nothing but its slurmd (within ``timeout`` s: slurmstepd ends just after the
    job), and its own ``/dev/shm`` is empty."""
    deadline = time.monotonic() + timeout
    while True:
        extra = {n: sorted(set(slurm.vc.pids(n)) - {slurm.procs[f"slurmd-{n}"].pid}) for n in slurm.node_names}
        if not any(extra.values()):
            break
        assert time.monotonic() < deadline, f"processes left on the nodes after the end: " + "; ".join(
            f"{n}: {_cmdlines(p)}" for n, p in extra.items() if p)
        time.sleep(0.3)
    assert {n: slurm.vc.shm_files(n) for n in slurm.node_names} == {n: [] for n in slurm.node_names}


def _cmdlines(pids) -> list:
    out = []
    for p in pids:
        try:
            out.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
        except OSError:
            pass
    return out
