"""nbmpi across nodes: a real 3-node virtual cluster on this machine (network namespaces, a bridge, links
capped at 1 Gbit/s), real mpiexec placing ranks on the nodes through ``nbmpi run --hosts``.

Skipped with the cluster's one-line reason where it cannot run (not root, no ``ip``). The module's
cluster is torn down by the fixture's finalizer, also after a failed test; every test that starts a job
checks that nothing of it is left on any node.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import TESTS, assert_ok
from nbmpi.workers.launch import virtual_cluster as vcm
from virtual_nodes import assert_nothing_left, cluster_or_skip

NODES = 3
WHY = vcm.why_not_available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")


@pytest.fixture(scope="module")
def cluster():
    """A 3-node cluster, 1 Gbit/s links, for the whole module; torn down whatever happens."""
    yield from cluster_or_skip(NODES, "1gbit")


def run_on(cluster, tmp_path: Path, argv, n: int = NODES, timeout: float = 180, env=None, hosts=None):
    """``nbmpi run --hosts NODE1,... -n n ARGV`` from the host with the cluster's launch environment."""
    full = {**os.environ, **cluster.launch_env(), "NBMPI_TIMEOUT": "60"}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    full.update(env or {})
    cmd = [sys.executable, "-m", "nbmpi.workers.launch.cli", "run", "--hosts", ",".join(hosts or cluster.addresses),
           "-n", str(n), "--timeout", str(timeout), *[str(a) for a in argv]]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=tmp_path, timeout=timeout + 60)


def test_nodes_have_their_own_hostname_and_address(cluster):
    for i, node in enumerate(cluster.nodes):
        out = cluster.run(i, ["sh", "-c", "hostname; ip -o -4 addr show dev eth0; tc qdisc show dev eth0"],
                          capture_output=True, text=True, check=True).stdout
        assert out.splitlines()[0] == node.name, out
        assert f"inet {node.address}/24" in out and "tbf" in out and "rate 1Gbit" in out, out
    via_ssh = subprocess.run([cluster.ssh_standin, "-x", cluster.addresses[2], "hostname"], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert via_ssh == cluster.names[2]
    bad = subprocess.run([cluster.ssh_standin, "10.213.250.250", "true"], capture_output=True, text=True)
    assert bad.returncode == 255 and "no node '10.213.250.250'" in bad.stderr


def test_every_capability_across_three_nodes(cluster, tmp_path, kernel_cache):
    p = run_on(cluster, tmp_path, [TESTS / "cluster_cases.py", NODES],
               env={"NBMPI_DISTARRAY_CACHE": kernel_cache, "NBMPI_TRACE_OUT": str(tmp_path / "trace")})
    assert_ok(p)
    for s in ("placement", "put/take between every pair", "reduce, allreduce", "fused reductions",
              "Aggregator histogram", "distributed arrays"):
        assert f"ok {s}" in p.stdout, (s, p.stdout)
    assert "ALL OK on 3 ranks, 3 nodes" in p.stdout, p.stdout
    for r in range(NODES):
        assert f"rank {r} on {cluster.names[r]}" in p.stdout, p.stdout
    assert "MPI (other node): no node peers" in p.stdout and "shared memory" not in p.stdout, p.stdout
    check_trace(cluster, json.loads((tmp_path / "trace" / "trace.json").read_text()),
                json.loads((tmp_path / "trace" / "summary.json").read_text()))
    check_every_pair(cluster, tmp_path / "trace" / "trace.npz")
    assert "fabricclose failed" not in p.stderr and "MPI_Finalize failed" not in p.stderr, p.stderr
    assert_nothing_left(cluster)


def check_every_pair(cluster, npz: Path) -> None:
    """Clocks aligned for every send/receive pair the tracer records between two nodes (put/take, the
    collectives' steps with a scatter and gather root, aggregator buffers, distributed-array slices): on
    the raw records, no receive ends before its send starts, and the trace needed no shift beyond the
    ranks' clock errors."""
    from nbmpi.workers.tracing.analysis import Trace

    tr = Trace.load(str(npz))
    assert tr.clock_violations == 0
    assert all(abs(c) <= e for c, e in zip(tr.clock_shift_ns.tolist(), tr.clock_error_ns.tolist()))
    start, end, kind = tr.col("t_start"), tr.col("t_end"), tr.col("kind")
    seen = {}
    for s, r in tr.flow_pairs.tolist():
        if tr.hosts[tr.ranks[s]] == tr.hosts[tr.ranks[r]]:
            continue
        name = tr.kind_name(int(kind[s]))
        seen[name] = seen.get(name, 0) + 1
        assert end[r] >= start[s], (f"a {name} receive on rank {tr.ranks[r]} ended {(start[s] - end[r]) / 1e3:.1f} us "
                                    f"before its send on rank {tr.ranks[s]} started")
    for name in ("put", "scatter", "gather", "agg_buffer", "distarray_send"):
        assert seen.get(name, 0) > 0, (name, seen)


def test_cross_node_job_using_shared_finalizes_without_ofi_warning(cluster, tmp_path):
    code = ("from nbmpi.workers import shared, world\n"
            "s = shared(0.0)\n"
            "s += world().Get_rank() + 1.0\n"
            "assert float(s) == 3.0\n"
            "print('sum ok')\n")
    p = run_on(cluster, tmp_path, ["-c", code], n=2, timeout=120, hosts=cluster.addresses[:2])
    assert_ok(p)
    assert p.stdout.count("sum ok") == 2, p.stdout
    for bad in ("fabricclose failed", "MPI_Finalize failed", "Fatal error"):
        assert bad not in p.stderr, p.stderr
    assert_nothing_left(cluster)


def check_trace(cluster, chrome, summary) -> None:
    """Lanes named by rank and node. Clocks aligned: for every rendezvous put/take between two nodes (whose
    slices start when the call was made), the take ends after its put started and the put (a synchronous send)
    ends after its take started (every other pair: :func:`check_every_pair`, on the raw records)."""
    events = chrome["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {r: f"rank {r} ({cluster.names[r]})" for r in range(NODES)}, names
    assert [r["host"] for r in summary["ranks"]] == cluster.names, summary["ranks"]
    assert all(abs(e) < 1000 for e in summary["clock_error_us"]), summary["clock_error_us"]

    def whole(e):   # the call's whole span: its wait slice (if any) ends where its comm slice starts
        waits = [w for w in events if w.get("cat") == "wait" and w["pid"] == e["pid"]
                 and abs(w["ts"] + w["dur"] - e["ts"]) < 1e-3 and w["name"] == "wait: " + e["name"]]
        return (waits[0]["ts"] if waits else e["ts"]), e["ts"] + e["dur"]

    sends = {e["bind_id"]: e for e in events if e.get("flow_out") and e["name"].startswith("put(")}
    recvs = {e["bind_id"]: e for e in events if e.get("flow_in") and e["name"].startswith("take(")}
    pairs = [(sends[k], recvs[k]) for k in sends.keys() & recvs.keys() if sends[k]["pid"] != recvs[k]["pid"]]
    assert len(pairs) == NODES * (NODES - 1), pairs   # each pair: a put and a take each way
    for s, r in pairs:
        (s0, s1), (r0, r1) = whole(s), whole(r)
        assert r1 >= s0, ("a take ended before its put started", s, r)
        assert s1 >= r0, ("a synchronous put ended before its take started", s, r)


def test_more_ranks_than_nodes_share_memory_within_a_node(cluster, tmp_path, kernel_cache):
    """-n 4 on 3 hosts: ranks 0 and 3 share node 1 (shared-memory put/take), every other pair crosses nodes."""
    p = run_on(cluster, tmp_path, [TESTS / "cluster_cases.py", NODES], n=4,
               env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    assert "ALL OK on 4 ranks, 3 nodes" in p.stdout, p.stdout
    assert "rank 0 <-> 3: put/take shared memory" in p.stdout and "rank 3 <-> 0: put/take shared memory" in p.stdout
    assert "rank 0 <-> 1: put/take MPI (other node)" in p.stdout
    assert_nothing_left(cluster)


def test_hostfile_places_ranks_like_mpiexec(cluster, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{cluster.addresses[1]}:2\n{cluster.addresses[2]}\n")
    code = ("import socket, sys; from nbmpi.workers import world; "
            "sys.stdout.write(f'rank {world().Get_rank()} {socket.gethostname()}\\n')")   # one write: no interleaving
    full = {**os.environ, **cluster.launch_env()}
    p = subprocess.run([sys.executable, "-m", "nbmpi.workers.launch.cli", "run", "--hostfile", str(hostfile),
                        "-n", "3", "--timeout", "60", "-c", code], capture_output=True, text=True, env=full,
                       timeout=120)
    assert_ok(p)
    for r, node in ((0, 1), (1, 1), (2, 2)):
        assert f"rank {r} {cluster.names[node]}\n" in p.stdout, p.stdout


def test_kill_9_of_a_rank_on_one_node_ends_the_job_everywhere(cluster, tmp_path):
    """Rank 1 (node 2) is killed with SIGKILL while the others wait on it in MPI and in a channel: the job
    ends on every node, reports the kill, and leaves no process and no shared memory on any node. Two ranks
    per node (-n 6), so MPICH's own node segments exist and the killed rank never finalizes its node's."""
    prog = tmp_path / "victim.py"
    prog.write_text(
        "import os, signal, sys, time, numpy as np\n"
        "from nbmpi.workers import ArrayChannel, world\n"
        "comm = world(); rank = comm.Get_rank()\n"
        "ch = ArrayChannel((1 << 16,), np.float64)\n"
        "sys.stdout.write(f'rank {rank} pid {os.getpid()} node /dev/shm: {sorted(os.listdir(\"/dev/shm\"))}\\n')\n"
        "comm.Barrier()\n"
        "if rank == 1:\n"
        "    time.sleep(1); os.kill(os.getpid(), signal.SIGKILL)\n"
        "elif rank == 0:\n"
        "    ch.take(1)\n"
        "else:\n"
        "    comm.Recv(np.zeros(1), source=1)\n")
    before = {i: cluster.shm_files(i) for i in range(NODES)}
    assert not any(before.values()), before
    t0 = time.monotonic()
    p = run_on(cluster, tmp_path, [prog], n=2 * NODES, timeout=120, env={"NBMPI_TIMEOUT": "300"})
    took = time.monotonic() - t0
    assert p.returncode == 128 + signal.SIGKILL, (p.returncode, p.stdout, p.stderr)
    assert "rank 1 was killed by SIGKILL" in p.stderr, p.stderr
    assert "rank 4 pid" in p.stdout and "mpich_shm_" in p.stdout.split("rank 4 pid")[1].splitlines()[0], p.stdout
    assert took < 60, f"the job took {took:.0f} s to end after the kill"
    assert_nothing_left(cluster)


def test_cluster_tears_down_everything(tmp_path):
    """A second cluster (unique names, its own /24) comes up beside the module's and goes away completely,
    processes started on its nodes included."""
    vc = vcm.VirtualCluster(2, None)
    vc.up()
    try:
        assert vc.subnet is not None and vc.bridge.startswith(f"nb{vc.cid}")
        sleeper = vc.popen(1, ["sleep", "600"])
        deadline = time.monotonic() + 10   # nsenter enters the namespaces, then execs sleep (same pid)
        while sleeper.pid not in vc.pids(1) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sleeper.pid in vc.pids(1)
        assert "tbf" not in vc.run(0, ["tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True).stdout
    finally:
        vc.down()
    sleeper.wait(timeout=10)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(n in netns for n in vc.names), netns
    assert f"nb{vc.cid}-" not in links, links
    assert not os.path.exists(vc.state_dir)
    assert vc.cid not in vcm.list_clusters()


def test_cluster_command_runs_the_demo_job_and_tears_down():
    """The README's command: `nbmpi cluster run -- nbmpi run --hosts {hosts} -n 3 -m nbmpi.server.example_job`."""
    before = set(vcm.list_clusters())
    p = subprocess.run([sys.executable, "-m", "nbmpi.workers.launch.cluster_cli", "cluster", "run", "--", sys.executable,
                        "-m", "nbmpi.workers.launch.cli", "run", "--hosts", "{hosts}", "-n", "3", "-m",
                        "nbmpi.server.example_job"], capture_output=True, text=True, timeout=300)
    assert_ok(p)
    assert "done: 3 ranks x 200000 cells" in p.stdout, p.stdout
    assert "3 nodes up" in p.stderr and "torn down" in p.stderr, p.stderr
    assert set(vcm.list_clusters()) == before


def _start_cluster_command(*cmd):
    """`nbmpi cluster run --nodes 2 --rate none -- CMD` in a new session; returns (process, cluster id) once up."""
    proc = subprocess.Popen([sys.executable, "-m", "nbmpi.workers.launch.cluster_cli", "cluster", "run", "--nodes", "2",
                             "--rate", "none", "--", *cmd], stderr=subprocess.PIPE, text=True, start_new_session=True)
    ready, _, _ = select.select([proc.stderr], [], [], 120)
    if not ready:
        from nbmpi.workers.launch.processes import end_processes

        tree = [" ".join(c.cmdline()) for c in psutil.Process(proc.pid).children(recursive=True)]
        end_processes(groups=[proc.pid], leaders=[proc])
        pytest.fail(f"`nbmpi cluster run` printed nothing within 120 s; its children were: {tree}")
    line = proc.stderr.readline()
    assert "2 nodes up" in line, line
    return proc, line.split("(nb", 1)[1].split("-node", 1)[0]


def _assert_cluster_gone(cid: str) -> None:
    assert cid not in vcm.list_clusters()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"nb{cid}-" not in netns and f"nb{cid}-" not in links, (netns, links)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_cluster_command_tears_down_on_ctrl_c_and_sigterm(how):
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM to `nbmpi cluster run` alone: the command
    ends, the cluster is torn down, exit code 130; a process running on a node is ended too."""
    proc, cid = _start_cluster_command("sleep", "600")
    try:
        vc = vcm.VirtualCluster.attach(cid)
        on_node = vc.popen(0, ["sleep", "600"])
        sleeper = [c.pid for c in psutil.Process(proc.pid).children()]
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 130, proc.stderr.read()
        assert "torn down" in proc.stderr.read()
        _assert_cluster_gone(cid)
        assert on_node.wait(timeout=10) != 0
        time.sleep(0.2)
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                       for p in sleeper), sleeper
    finally:
        if proc.poll() is None:
            from nbmpi.workers.launch.processes import end_processes

            end_processes(groups=[proc.pid], leaders=[proc])


def test_a_cluster_whose_owner_was_killed_is_removed_by_the_next_one():
    """SIGKILL leaves no chance to tear down: the next cluster brought up on this machine removes it."""
    proc, cid = _start_cluster_command("sleep", "600")
    child = [c.pid for c in psutil.Process(proc.pid).children()]
    try:
        proc.kill()
        proc.wait(timeout=10)
        assert cid in vcm.list_clusters()
        assert cid in vcm.remove_stale()
        _assert_cluster_gone(cid)
    finally:
        from nbmpi.workers.launch.processes import end_processes

        end_processes(pids=child)


def test_refuses_in_one_line_where_it_cannot_run():
    """Not root: one line saying so, exit code 3, nothing created."""
    if subprocess.run(["which", "setpriv"], capture_output=True).returncode != 0:
        pytest.skip("setpriv (util-linux) is needed to run the command as an unprivileged user")
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                        "nbmpi.workers.launch.cluster_cli", "cluster", "run", "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and "needs root" in p.stderr, p.stderr


HANDWRITTEN_CHUNKED = """
import sys
import numpy
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
from distarray import _hw_kernels, handwritten_stencil, jacobi_stencil
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
n, m, iters = 41, 300, 4
x = numpy.random.default_rng(5).random((n, m))
lo, hi = rank * n // size, (rank + 1) * n // size
u = numpy.zeros((hi - lo + 2, m))
u[1:-1] = x[lo:hi]
v = u.copy()
delta, u, wait_s = handwritten_stencil(comm, u, v, lo, n, iters, _hw_kernels(), chunk_rows=3)
want = x.copy()
want_delta = jacobi_stencil(numpy, want, iters)
got = comm.gather(u[1:-1], root=0)
if rank == 0:
    full = numpy.concatenate(got)
    assert numpy.isclose(delta, want_delta, rtol=1e-12), (delta, want_delta)
    assert numpy.allclose(full[1:-1, 1:-1], want[1:-1, 1:-1], rtol=0, atol=1e-12)
    print("handwritten chunked ok", wait_s >= 0)
"""


def test_handwritten_stencil_in_chunks_equals_numpy_across_nodes(cluster, tmp_path):
    """The benchmark's hand-written mpi4py + numba stencil, its interior in chunks of 3 rows with Testall between
    them (what drives its halos over ofi/tcp), on 3 nodes: the same grid and delta as NumPy's stencil."""
    from conftest import REPO

    script = tmp_path / "hw_chunked.py"
    script.write_text(HANDWRITTEN_CHUNKED)
    p = run_on(cluster, tmp_path, [script, REPO / "benchmarks"])
    assert_ok(p)
    assert "handwritten chunked ok True" in p.stdout, p.stdout
    assert_nothing_left(cluster)


def test_benchmark_quick_measures_both_sides_and_evaluates_its_targets(tmp_path):
    """`benchmarks/cluster.py --quick` on its own 1 Gbit/s cluster: ping-pong channel vs raw between two nodes,
    the stencil with and without latency hiding on two nodes and on one (scaling), verified against NumPy; the
    histogram and the redistribution across two nodes, verified; targets computed."""
    from conftest import REPO

    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cluster.py"), "--quick", "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert_ok(p)
    data = json.loads((tmp_path / "cluster_quick.json").read_text())
    res = data["results"]["1gbit"]
    for m in ("raw", "channel"):
        assert all(t > 0 for t in res["pingpong"][m].values()), res["pingpong"]
    assert all(h.startswith("no node peers") for h in res["pingpong"]["how"].values()), res["pingpong"]["how"]
    st = res["stencil_2"]
    assert st["verified"] is True and len(set(st["hosts"])) == 2, st["hosts"]
    for m in ("hiding", "blocking"):
        assert len(st[m]["wait_pct_median"]) == 2 and all(0 <= w <= 100 for w in st[m]["wait_pct_median"])
    one = res["stencil_1"]   # strong scaling's base, the same program on one node
    assert one["verified"] is True and one["hiding"]["per_iter_median_s"] > 0, one
    assert len(st["hiding"]["cpu_pct_median"]) == 2 and all(0 <= c <= 110 for c in st["hiding"]["cpu_pct_median"])
    mv = res["moves"]
    assert len(set(mv["hosts"])) == 2 and mv["redistribution"]["verified"] is True, mv
    assert all(m["verified"] for m in mv["histogram"].values()), mv["histogram"]
    assert [d["nodes"] for d in data["scaling"]] == [1, 2] and data["scaling"][0]["nbmpi_speedup"] == 1.0
    names = [t["target"] for t in data["targets"]]
    assert any("without / with" in n for n in names) and all(t["status"] in ("PASS", "FAIL") for t in data["targets"])
    md = (tmp_path / "cluster_quick.md").read_text()
    assert "| link | bytes |" in md and "### The problem size" in md, md
    arith = data["shape_arithmetic"][0]   # the shape's arithmetic from this run's measured numbers
    assert arith["rate"] == "1gbit" and arith["ns_per_element"] > 0 and arith["t_over_c"] > 0, arith
    assert 0 <= arith["predicted_blocking_transfer_pct"] < 100, arith
