"""``nbmpi serve --hosts``: the local backend's jobs across the nodes of a virtual cluster.

A real controller (``nbmpi serve``, local backend) started with the cluster's launch environment
(:meth:`~nbmpi.workers.launch.virtual_cluster.VirtualCluster.launch_env`: Hydra's ssh launcher replaced
by the cluster's stand-in) and ``--hosts`` = the 3 nodes' addresses runs a job with one rank on each
node (hostnames, trace lanes and the dashboard's timeline named by rank and node), and the cancel of
a job with two ranks per node leaves no process and no shared memory on any node; those tests skip
(one line) where no virtual cluster can run (not root, ``ip``/``nsenter`` missing). The options' bad
cases are checked everywhere.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


from virtual_nodes import WHERE_JOB, assert_nothing_left, cluster_or_skip
from test_server import SLEEP_JOB, Server, job_processes, pids_from_logs, submit, wait_state

NODES = 3

@pytest.fixture(scope="module")
def cluster():
    yield from cluster_or_skip(NODES)


@pytest.fixture(scope="module")
def server(cluster, tmp_path_factory):
    data = tmp_path_factory.mktemp("serve-hosts") / "data"
    s = Server(data, max_ranks=2 * NODES, extra_args=["--hosts", ",".join(cluster.addresses)],
               env=cluster.launch_env())
    try:
        yield s.start()
    finally:
        s.stop()
        left = job_processes(data)
        for p in left:
            p.kill()
        assert not left, f"job processes survived the controller: {[p.pid for p in left]}"


def test_job_has_a_rank_on_each_node_with_trace_and_timeline(server, cluster):
    with server.client() as c:
        job = wait_state(c, submit(c, WHERE_JOB, ranks=NODES)["id"], ("succeeded", "failed", "cancelled",
                                                                       "timed_out"), timeout=120)
        assert job["state"] == "succeeded", job
        logs = [c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text for r in range(NODES)]
        # mpiexec -hosts fills the hosts in order: rank r on node r+1
        assert logs == [f"rank {r} of {NODES} on {cluster.names[r]} sum 3.0\n" for r in range(NODES)], logs
        lanes = [f"rank {r} ({cluster.names[r]})" for r in range(NODES)]
        trace = c.get(f"/api/v1/jobs/{job['id']}/trace").json()
        assert [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"] == lanes
        tl = c.get(f"/api/v1/dashboard/jobs/{job['id']}/timeline", params={"width": 300}).json()
        assert tl["available"] and tl["state"] == "succeeded" and tl["meta"]["lanes"] == lanes, tl.get("meta")
    assert_nothing_left(cluster)


def test_cancel_of_a_job_on_every_node_leaves_nothing_there(server, cluster):
    with server.client() as c:
        job = submit(c, SLEEP_JOB.format(seconds=600), ranks=2 * NODES)
        pids = pids_from_logs(c, job["id"], 2 * NODES)
        where = {cluster.names[i]: set(cluster.pids(i)) for i in range(NODES)}
        for r, pid in pids.items():   # one slot per host, filled round-robin: rank r on node r % 3 + 1
            assert pid in where[cluster.names[r % NODES]], (r, pid, where)
        assert all(any(f.startswith("mpich_shm_") for f in cluster.shm_files(i)) for i in range(NODES))
        r = c.delete(f"/api/v1/jobs/{job['id']}")
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    assert_nothing_left(cluster)
    assert not job_processes(Path(server.data_dir))


def test_hosts_options_bad_cases(tmp_path):
    """Both --hosts and --hostfile, a missing hostfile, --hosts with the slurm backend: exit 2, one line."""
    base = [sys.executable, "-m", "nbmpi.server.cli", "serve", "--port", "0", "--data-dir", str(tmp_path / "d")]
    env = dict(os.environ, NBMPI_CONFIG=str(tmp_path / "client.json"))
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a\nb\n")
    cases = {("--hosts", "a,b", "--hostfile", str(hostfile)):
             "nbmpi serve: give the hosts either as a list (--hosts) or in a file (--hostfile), not both",
             ("--hostfile", str(tmp_path / "nosuch")):
             f"nbmpi serve: --hostfile {tmp_path / 'nosuch'}: no such file; give one host[:slots] a line",
             ("--backend", "slurm", "--hosts", "a"):
             "nbmpi serve: --hosts: only for --backend local (this service uses --backend slurm)"}
    for args, message in cases.items():
        p = subprocess.run(base + list(args), capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 2 and p.stderr.strip().endswith(message), (args, p.returncode, p.stderr)
