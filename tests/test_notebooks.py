"""The example notebooks of fused reductions, aggregation and a controller pool, executed top to bottom in a real
Jupyter kernel (nbclient) with real MPI ranks and a real controller: their outputs are checked against NumPy
computed here and against the controller's answers, only the cells tagged ``raises-exception`` may fail (and must),
and no process the notebook started (kernel, engines, mpiexec, ipcontroller, the controller) is left afterwards.
"""
from __future__ import annotations

import re
import time
from typing import Dict, List, Set

import numpy as np
import psutil
import pytest

from conftest import REPO
from liveness import running

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _alive(pids: Set[int]) -> Dict[int, str]:
    """The live (not zombie) processes among ``pids``, with their command lines."""
    out = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out[pid] = " ".join(p.cmdline())[:200]
        except psutil.NoSuchProcess:
            pass
    return out


def _descendants(pid: int) -> Set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


class Run:
    """One notebook executed: the notebook with its outputs, and what ran under its kernel."""

    def __init__(self, nb, seen: Set[int]):
        self.nb = nb
        self.seen = seen

    def code_cells(self) -> List:
        return [c for c in self.nb.cells if c.cell_type == "code"]

    def text(self, i: int) -> str:
        """Everything code cell ``i`` (0-based, code cells only) showed: streams, plain-text values, errors."""
        parts = []
        for o in self.code_cells()[i].get("outputs", []):
            if o["output_type"] == "stream":
                parts.append(o["text"])
            elif o["output_type"] == "error":
                parts.append(f"{o['ename']}: {o['evalue']}\n" + ANSI.sub("", "\n".join(o["traceback"])))
            else:
                parts.append(o.get("data", {}).get("text/plain", ""))
        return "".join(parts)

    def html(self, i: int) -> str:
        return "".join(o.get("data", {}).get("text/html", "") for o in self.code_cells()[i].get("outputs", []))


def run_notebook(name: str, tmp_path) -> Run:
    """Execute ``notebooks/NAME`` cell by cell; record every process under the kernel after each cell; check
    that errors happen exactly in the cells tagged ``raises-exception`` and that, once the kernel is shut down,
    none of the recorded processes is left (bounded wait: processes end asynchronously)."""
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    km = KernelManager(kernel_name="python3")   # ipykernel's spec: this interpreter (jupyter_client maps "python")
    seen: Set[int] = set()

    def record(**_):
        kernel = km.provisioner.process.pid
        seen.add(kernel)
        seen.update(_descendants(kernel))

    client = NotebookClient(nb, km=km, timeout=180, resources={"metadata": {"path": str(tmp_path)}},
                            on_cell_executed=record)
    try:
        client.execute()
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=False)
        deadline = time.monotonic() + 20
        while _alive(seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _alive(seen)
        _end(set(left))   # also after a failed cell: the test ends what the notebook left, then fails
    assert not left, f"{name} left processes running: {left}"
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.outputs if o["output_type"] == "error"]
        expected = "raises-exception" in cell.metadata.get("tags", [])
        assert bool(errors) == expected, (cell.source, errors)
    return Run(nb, seen)


def _end(pids: Set[int]) -> None:
    """SIGTERM, then SIGKILL after 5 s, the given processes (by pid)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
            procs[-1].terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def _one(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in:\n{text}"
    return m.group(1)


def test_fused_reductions_notebook(tmp_path):
    run = run_notebook("05-fused-reductions.ipynb", tmp_path)
    assert len(run.seen) >= 4, run.seen          # kernel, mpiexec, 2 engines (and their helpers) were watched
    data = np.concatenate([np.random.default_rng(seed=r).normal(5.0, 2.0, 50_000) for r in range(2)])
    start, variance, check, block, budget, diverge, after, rebind, mean, stop = (run.text(i) for i in range(10))
    assert "pool 'fused': 2 ranks" in start
    # the variance: 16 contributions kept as 2 pending segments, no collective until the read, then exactly one
    assert variance.startswith("[ranks 0-1]\npending segments: 2 | collectives so far: 0\n"), variance
    assert "collectives for the variance: 1\n" in variance
    assert float(_one(r"variance: ([-0-9.]+)", variance)) == pytest.approx(np.var(data, ddof=1), rel=1e-11)
    assert "<svg" in run.html(1)
    # the trace agrees: one fused_allreduce event per rank; every rank finds NumPy's variance
    assert "fused_allreduce events per rank: [1, 1]" in check
    assert f"NumPy np.var(ddof=1): {np.var(data, ddof=1):.12f}; same to 1e-12 relative: True" in check
    assert check.count("same to 1e-12 relative: True") == 2, check
    # min, max and an exact integer count in one collective; flush() with nothing pending sends nothing
    assert block.count("collectives for the block: 1\n") == 1 and "[ranks 0-1]" in block, block
    assert f"min {data.min():.12f} max {data.max():.12f} count 100000\n" in block
    assert "flush() with nothing pending resolves 0 variables; collectives: 1" in block
    # the pool: 120 asked of 100, grants scaled by 100/120, the pool left empty
    assert f"rank 0 asked for 40, was granted {40 * 100 / 120:.4f}; left in the pool: 0.0000" in budget
    assert f"rank 1 asked for 80, was granted {80 * 100 / 120:.4f}; left in the pool: 0.0000" in budget
    # contributions in a different order: SPMDDivergence raised on both ranks, naming the first difference
    assert diverge.startswith("DistributedCellError: SPMDDivergence on ranks 0-1"), diverge
    for r in (0, 1):
        assert f"[rank {r}] remote traceback:" in diverge and f"SPMDDivergence: rank {r}: fused reduction" in diverge
    assert "first difference at pending step" in diverge and "rank 0: sum contribution to shared variable" in diverge
    assert after == "[ranks 0-1] after the divergence: c = 3.0\n", after
    # rebinding a shared variable to a local value: SharedVariableError on both ranks
    assert rebind.startswith("DistributedCellError: SharedVariableError on ranks 0-1"), rebind
    for r in (0, 1):
        assert f"SharedVariableError: rank {r}: `s1 = ...` assigns a rank-local float to 's1'" in rebind
    assert mean == f"[ranks 0-1] mean: {data.mean():.12f} (NumPy {data.mean():.12f})\n", mean
    assert "pool 'fused' stopped" in stop


def test_aggregation_notebook(tmp_path):
    run = run_notebook("06-aggregation.ipynb", tmp_path)
    assert len(run.seen) >= 4, run.seen
    start, hist, check, second, gather, stop = (run.text(i) for i in range(6))
    assert "pool 'aggregation': 2 ranks" in start
    samples = [np.random.default_rng(seed=100 + r).integers(0, 1000, 200_000) for r in range(2)]
    counts = np.bincount(np.concatenate(samples), minlength=1000)
    for r in range(2):   # each rank counted exactly NumPy's counts of the bins it owns (bin g on rank g % 2)
        n = int(_one(rf"\[rank {r}\] rank {r}: pushed 200000 updates in (\d+) messages, counted "
                     rf"{int(counts[r::2].sum())} here", hist))
        assert n >= 200_000 // 4096 // 2, hist   # full buffers of 4096 items to the other rank, not per item
    assert "<svg" in run.html(1) and "nbmpi-arrow" in run.html(1)   # one arrow per buffer on the timeline
    assert check == "[ranks 0-1] equal to np.bincount: True | updates counted on all ranks: 400000\n", check
    assert second == "[ranks 0-1] second batch: counted 400200 updates; flushes so far: 2\n", second
    assert gather == "[ranks 0-1] entries read: 50000 of 50000 | equal to np.sqrt(index): True\n", gather
    assert "pool 'aggregation' stopped" in stop


def test_controller_pool_notebook(tmp_path):
    run = run_notebook("07-controller-pool.ipynb", tmp_path)
    serve, create, connect, cell, job, stop = (run.text(i) for i in range(6))
    pid = int(_one(r"controller \(pid (\d+)\) at http://127\.0\.0\.1:\d+: ok\n", serve))
    url = _one(r"at (http://127\.0\.0\.1:\d+): ok", serve)
    assert f"its dashboard through this Jupyter server: /proxy/{url.rsplit(':', 1)[1]}/dashboard\n" in serve, serve
    # the controller and its pool's processes (mpiexec, engines, ipcontroller) ran under the kernel
    assert pid in run.seen and len(run.seen) >= 5, run.seen
    assert create == "pool 1 'shared-pool' running with 2 ranks\npools on the controller: [(1, 'shared-pool', " \
                     "'running')]\n", create
    assert f"connected to pool 'shared-pool' (2 ranks) at {url}\n" in connect
    assert "* shared-pool: 2 ranks (0-1)" in connect and "running" in connect and "(attached)" in connect
    assert cell == "[rank 0] rank 0 of 2: channel allreduce 3.0, shared total 10.0\n" \
                   "[rank 1] rank 1 of 2: channel allreduce 3.0, shared total 10.0\n", cell
    assert job == "job 1 succeeded | exit code of each rank: [0, 0]\n" \
                  "log of rank 0: job rank 0 of 2: sum of rank+1 = 3\n" \
                  "log of rank 1: job rank 1 of 2: sum of rank+1 = 3\n", job
    assert stop == "pool 'shared-pool' disconnected\npool state after disconnecting: running\n" \
                   f"pool state after delete_pool: stopped\ncontroller (pid {pid}) ended, return code -15\n", stop
    assert not running(pid)


def test_cluster_pool_notebook(tmp_path):
    """The notebook brings up a virtual cluster (skipped with its one-line reason where none can run), starts
    a pool with one engine on each node, fails clearly on an unknown host, and leaves nothing on any node."""
    from nbmpi.workers.launch import virtual_cluster as vcm

    why = vcm.why_not_available()
    if why:
        pytest.skip(why)
    run = run_notebook("09-cluster-pool.ipynb", tmp_path)
    up, start, cell, wrong, stop = (run.text(i) for i in range(5))
    names = _one(r"\| nodes: (\S+)\n", up).split(",")
    cid = names[0][2:].split("-", 1)[0]
    assert names == [f"nb{cid}-node{i}" for i in (1, 2, 3)], up
    where = ", ".join(f"{n} (rank {i})" for i, n in enumerate(names))
    assert f"* cluster: 3 ranks (0-2) on {where}, running" in start, start
    assert cell == "".join(f"[rank {r}] rank {r} of 3 on {names[r]}: allreduce 6.0\n" for r in range(3)), cell
    assert wrong.startswith("pool 'wrong' failed to startUsageError: pool 'wrong': cannot start engines on "
                            "nosuchnode (") and \
        "no node 'nosuchnode'" in wrong and "nbmpi cluster up" in wrong, wrong
    assert stop == "pool 'cluster' stopped\ncell timelines server stopped (no pool started here runs)\n" + \
        str({n: ([], []) for n in names}) + "\n", stop
    assert cid not in vcm.list_clusters()
