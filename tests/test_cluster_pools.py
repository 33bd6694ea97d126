"""Pools whose engines run on the nodes of a virtual cluster while the notebook and the controller stay on
the host: ``%distributed start --hosts/--hostfile`` in a real Jupyter kernel, and a controller pool on a
local backend started with ``--hosts``.

Each engine reports its own node's hostname and takes part in an allreduce; ``%distributed status``
names each engine's host; a name the cluster does not know fails the start at once, naming it; stopping
leaves no process and no ``/dev/shm`` file on any node. The cluster tests skip with the cluster's one-line
reason where it cannot run (not root, a tool missing); the option checks run everywhere.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time

import psutil
import pytest
from IPython.core.error import UsageError

from nbmpi.kernel_ext.magics import _line_parser
from nbmpi.workers.launch.engine_pool import EnginePool, EnginePoolError
from test_kernel_ext import Kernel, _alive
from test_server import Server, pool_processes, stop_and_kill_pools, submit, wait_state
from virtual_nodes import WHERE_JOB, assert_nothing_left, cluster_or_skip

NODES = 3
#: A cell every engine runs: its node's hostname and the sum of every rank's number (an allreduce).
WHERE_CELL = """%%distributed
import socket
from nbmpi.workers import ArrayChannel
ch = ArrayChannel(1000)
ch.fill(rank)
ch.allreduce("sum")
print(socket.gethostname(), ch[0])
"""


@pytest.fixture(scope="module")
def cluster():
    yield from cluster_or_skip(NODES)


@pytest.fixture(scope="module")
def kernel(cluster):
    """A kernel on the host with the cluster's launch environment (as after `nbmpi cluster up`'s exports)."""
    k = Kernel(env={**os.environ, **cluster.launch_env(), "NBMPI_TIMEOUT": "60"})
    try:
        r = k.run("%load_ext nbmpi.kernel_ext")
        assert r["status"] == "ok", r
        yield k
    finally:
        k.shutdown()


def _tree(pid: int) -> set:
    """``pid``'s descendants, with the children of each (ipyparallel's nannies run in sessions of their own)."""
    out = set()
    try:
        for p in psutil.Process(pid).children(recursive=True):
            out.add(p.pid)
            out.update(c.pid for c in p.children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    return out


def test_host_options_are_checked_before_anything_starts(tmp_path):
    args = _line_parser().parse_args(["start", "-n", "3", "--hosts", "a,b:2"])
    assert (args.hosts, args.hostfile) == ("a,b:2", None)
    with pytest.raises(EnginePoolError, match="not both"):
        EnginePool(2, hosts=["a"], hostfile=str(tmp_path / "f"))
    with pytest.raises(EnginePoolError, match="no such file; give a file with one host"):
        EnginePool(2, hostfile=str(tmp_path / "missing"))
    pool = EnginePool(2, hosts=["10.213.9.2", " ", "10.213.9.3:2"], env={"NBMPI_LAUNCHER_LOCALHOST": "10.213.9.1"},
                      work_dir=str(tmp_path / "p"))
    assert pool.host_names() == ["10.213.9.2", "10.213.9.3"] and pool.spans_hosts
    assert (pool.ip, pool.location) == ("10.213.9.1", "10.213.9.1")   # where the engines reach the controller
    again = pool.renewed()
    shutil.rmtree(again.work_dir)   # (a fresh temporary directory, as for every pool started without one)
    assert (again.placement, again.ip, again.location) == (pool.placement, pool.ip, pool.location)
    local = EnginePool(1, work_dir=str(tmp_path / "q"))
    assert not local.spans_hosts and local.ip == os.environ.get("NBMPI_POOL_IP", "127.0.0.1")
    with pytest.raises(UsageError, match=r"ambiguous option: --host could match --hosts, --hostfile\. Usage: "
                                         r"%distributed start .*\[--hosts H1,H2\[:N\],\.\.\.\] \[--hostfile FILE\]"):
        _line_parser().parse_args(["start", "-n", "2", "--host", "a"])


def test_notebook_pool_with_engines_on_three_nodes(cluster, kernel):
    names = cluster.names
    r = kernel.run(f"%distributed start -n {NODES} --hosts {','.join(names)} --name spread")
    assert r["status"] == "ok", r
    assert any(f"{NODES} ranks on {', '.join(names)} ready" in t for t in r["texts"]), r["texts"]
    tree = _tree(kernel.pid)
    for i in range(NODES):   # the engines (and Hydra's proxies) run in the nodes, not on the host
        assert cluster.pids(i) and set(cluster.pids(i)) <= tree, (i, cluster.pids(i))
    r = kernel.run("%distributed status")
    want = ", ".join(f"{n} (rank {i})" for i, n in enumerate(names))
    assert f"spread: {NODES} ranks (0-2) on {want}, running" in r["stdout"], r
    r = kernel.run(WHERE_CELL)
    assert r["status"] == "ok", r
    assert r["stdout"] == "".join(f"[rank {i}] {n} 3.0\n" for i, n in enumerate(names)), r
    # a hang is explained from each engine's probe, which the notebook reaches on the engine's node
    r = kernel.run("%%distributed --timeout 3\nimport time\nif rank == 2:\n    ch.take(0)\nelse:\n    time.sleep(60)")
    assert r["status"] == "error" and r["ename"] == "DistributedTimeout", r
    assert re.search(r"rank 2: take\(src=0\) waiting [\d.]+ s", r["tb"]), r
    assert "rank 0: at cell line 5 `time.sleep(60)`" in r["tb"], r
    r = kernel.run("%distributed restart spread")   # a new MPI job on the same hosts, the controller stays
    assert r["status"] == "ok", r
    r = kernel.run("%%distributed\nimport os, socket\nprint(socket.gethostname(), os.getpid())")
    got = [line.split() for line in r["stdout"].splitlines()]
    assert [g[:2] for g in got] == [[f"[rank", f"{i}]"] for i in range(NODES)] and \
        [g[2] for g in got] == names, r
    pid = int(got[1][3])
    assert pid in cluster.pids(1), (pid, cluster.pids(1))
    # kill -9 of the engine on node 2 while a cell runs: the cell fails naming it; the pool is ended everywhere
    threading.Timer(2.0, os.kill, (pid, signal.SIGKILL)).start()
    r = kernel.run("%%distributed\nimport time\ntime.sleep(60)", timeout=60)
    assert r["status"] == "error" and f"rank 1 (pid {pid}) was killed by SIGKILL" in r["stderr"], r
    assert_nothing_left(cluster)
    r = kernel.run("%distributed stop spread")
    assert r["status"] == "ok" and "pool 'spread' stopped" in r["stdout"], r
    tree |= _tree(kernel.pid)
    deadline = time.monotonic() + 10
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(tree), f"left running on the host after stop: {_alive(tree)}"


def test_hostfile_slots_and_an_unknown_host(cluster, kernel, tmp_path):
    names = cluster.names
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{names[1]}:2\n{cluster.addresses[2]}\n")
    r = kernel.run(f"%distributed start -n 3 --hostfile {hostfile} --name slots")
    assert r["status"] == "ok", r
    r = kernel.run("%distributed status")
    assert f"slots: 3 ranks (0-2) on {names[1]} (ranks 0-1), {names[2]} (rank 2), running" in r["stdout"], r
    r = kernel.run(WHERE_CELL)
    assert r["stdout"] == f"[ranks 0-1] {names[1]} 3.0\n[rank 2] {names[2]} 3.0\n", r
    r = kernel.run("%distributed stop slots")
    assert r["status"] == "ok", r
    assert_nothing_left(cluster)
    before = _tree(kernel.pid)
    r = kernel.run(f"%distributed start -n 2 --hosts {names[0]},nosuchnode --name bad")
    assert r["status"] == "error", r
    assert "cannot start engines on nosuchnode" in r["stderr"] and "no node 'nosuchnode'" in r["stderr"], r
    assert "nbmpi cluster up" in r["stderr"], r   # ... and what to do
    assert _tree(kernel.pid) <= before and not any(cluster.pids(i) for i in range(NODES))
    r = kernel.run(f"%distributed start -n 2 --hosts {names[0]} --hostfile {hostfile}")
    assert r["status"] == "error" and "not both" in r["stderr"], r
    r = kernel.run("%distributed status")
    assert "no pool" in r["stdout"], r


def test_controller_pool_spans_the_operators_hosts(cluster, kernel, tmp_path):
    data = tmp_path / "data"
    srv = Server(data, max_ranks=NODES, extra_args=["--hosts", ",".join(cluster.addresses)],
                 env=cluster.launch_env()).start()
    try:
        with srv.client() as c:
            r = c.post("/api/v1/pools", json={"ranks": NODES, "name": "spread"})
            assert r.status_code == 201 and r.json()["state"] == "running", r.text
            pool = r.json()
            assert pool["connection"]["hosts"] == cluster.names, pool["connection"]
            job = wait_state(c, submit(c, WHERE_JOB, ranks=None, pool=pool["id"])["id"], ("succeeded", "failed"))
            assert job["state"] == "succeeded", job
            logs = [c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text for r in range(NODES)]
            assert logs == [f"rank {r} of {NODES} on {cluster.names[r]} sum 3.0\n" for r in range(NODES)], logs
            # the notebook on the host uses the same pool
            r = kernel.run(f"%distributed connect {srv.url} --token {srv.token} --pool {pool['id']}")
            assert r["status"] == "ok", r
            r = kernel.run(WHERE_CELL)
            assert r["stdout"] == "".join(f"[rank {i}] {n} 3.0\n" for i, n in enumerate(cluster.names)), r
            assert kernel.run("%distributed stop")["status"] == "ok"
            r = c.delete(f"/api/v1/pools/{pool['id']}")
            assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
        assert_nothing_left(cluster)
        assert not pool_processes(data)
    finally:
        left = stop_and_kill_pools(srv, data)
    assert not left, f"pool processes survived the controller: {[p.pid for p in left]}"


def test_engines_that_cannot_reach_the_controller_say_where_they_had_to(cluster, monkeypatch):
    for k, v in cluster.launch_env().items():
        monkeypatch.setenv(k, v)
    pool = EnginePool(2, hosts=cluster.names[:2], ip="127.0.0.1")   # listens where no node reaches it
    with pytest.raises(EnginePoolError) as info:
        pool.start(timeout=15)
    # (ipyparallel's engines see a loopback address and give up at once; otherwise the registration times out)
    assert (f" (the engines on {cluster.names[0]}, {cluster.names[1]} connect to this host's controller at "
            f"{cluster.bridge_address}, listening on 127.0.0.1: every host must reach that address; else set "
            "$NBMPI_LAUNCHER_LOCALHOST, or $NBMPI_POOL_IP, to an address of this host they reach); "
            ) in str(info.value), info.value
    assert_nothing_left(cluster)
