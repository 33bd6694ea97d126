"""Distributed arrays (nbmpi.workers.distarray) under real mpiexec on 2 and 3 ranks, in a real Jupyter kernel,
the example notebook, and the benchmark command.

The SPMD programs are real files next to this one: ``distarray_cases.py`` (every operation against NumPy, on every
distribution, views across rank boundaries, uneven splits on 3 ranks, the seed's stencil, fusion, caching, tracing)
and ``distarray_errors.py`` (every error raised on every rank, never a hang). The runs use the default on-disk kernel
cache, as users do: the first run on a machine compiles about 150 kernels (~50 s on 2 busy cores), later runs load
them (the notebook checks that a steady-state step compiles nothing)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, assert_ok, run_sections
from notebook_outputs import notebook_outputs

SECTIONS = ["constructors, to_numpy, from_numpy(root), .local, .dist",
            "views and elementwise work across rank boundaries", "ufuncs, operators, where, dtypes",
            "broadcasting against replicated operands", "in-place assignment, overlap, masks, out=",
            "reductions sum/min/max/mean/any/all, axis None/0/1", "matmul, dot, transpose, roll",
            "seed stencil, fusion, kernel and plan caching, threshold, tracing", "printing"]
ERROR_CASES = ["shapes", "assignment shape", "distributions on different communicators", "unknown distribution",
               "block size", "matmul shapes", "divergence (different operations)", "divergence (an extra operation on one rank)",
               "divergence (shapes differ)", "divergence (views differ)", "divergence (gathers of different arrays)",
               "a rank late beyond NBMPI_TIMEOUT"]


@pytest.mark.parametrize("n", [2, 3])
def test_every_operation_equals_numpy_on_every_distribution(run_mpi, kernel_cache, n):
    p = run_sections(run_mpi, kernel_cache, "distarray_cases.py", n, SECTIONS)
    assert "ALL OK (" in p.stdout, p.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_errors_raise_on_every_rank_and_never_hang(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_errors.py").read_text()
    p = run_mpi(code, n=n, timeout=120, env={"NBMPI_DISTARRAY_CACHE": kernel_cache, "NBMPI_TIMEOUT": "2"})
    assert_ok(p)
    for case in ERROR_CASES:
        for r in range(n):
            assert f"rank {r} raised {case}:" in p.stdout, (case, r, p.stdout)
    for r in range(n):
        assert f"rank {r} done after" in p.stdout


def test_distributed_cell_in_a_real_kernel(kernel_cache, monkeypatch):
    from test_kernel_ext import Kernel, _alive

    import psutil

    monkeypatch.setenv("NBMPI_DISTARRAY_CACHE", kernel_cache)
    k = Kernel()
    pids = []
    try:
        r = k.run("%load_ext nbmpi.kernel_ext\n%distributed start -n 2 --name arrays")
        assert r["status"] == "ok", r
        pids = [p.pid for p in psutil.Process(k.pid).children(recursive=True)]
        r = k.run("%%distributed --timeline\nimport numpy as np\nimport nbmpi.workers.distarray as dnp\n"
                  "x = np.arange(40.0).reshape(8, 5) ** 1.5\na = dnp.from_numpy(x, dist='cyclic')\n"
                  "b = (a[1:] - a[:-1]) * 2\nprint(round(float(dnp.sum(b)), 6), round(float(np.sum((x[1:] - x[:-1]) * 2)), 6))\n"
                  "print('rows', a.local_rows.tolist())")
        assert r["status"] == "ok", r
        out = r["stdout"]
        assert "[rank 0]\n" in out and "rows [0, 2, 4, 6]" in out and "rows [1, 3, 5, 7]" in out, out
        sums = [line.split() for line in out.splitlines() if line and line[0].isdigit()]
        assert len(sums) == 2 and all(got == want for got, want in sums), out  # distributed == NumPy, both ranks
        assert "<svg" in "".join(r["texts"]), r
        r = k.run("%distributed stop arrays")
        assert r["status"] == "ok", r
    finally:
        k.shutdown()
    assert not _alive(pids) or all(p == k.pid for p in _alive(pids))


def test_distributed_arrays_notebook_runs_top_to_bottom(tmp_path, kernel_cache, monkeypatch):
    monkeypatch.setenv("NBMPI_DISTARRAY_CACHE", kernel_cache)
    out = notebook_outputs("02-distributed-arrays.ipynb", tmp_path)
    assert "cyclic over axis 0, 10 rows on 2 ranks" in out
    assert "[rank 0]" in out and "holds rows [0, 2, 4, 6, 8]" in out and "holds rows [1, 3, 5, 7, 9]" in out
    assert "view [1:9:2] of the base (10,)" in out and "[10. 30. 50. 70.]" in out
    d = out.split("delta after 5 steps: distributed ")[1].split("\n")[0]
    assert d.split(",")[0] == d.split("numpy ")[1], d
    assert "same array as NumPy: True" in out
    assert "one step: 9 recorded operations -> ['swap', 'elementwise'] (6 fused away); kernels compiled by this " \
           "step: 0" in out
    assert "latency hiding -> wait % per rank:" in out and "blocking exchange -> wait % per rank:" in out
    assert "<svg" in out
    res = float(out.split("residual: ")[1].split("\\n")[0].split("\n")[0])
    assert res < 1e-9
    assert "divergence: operation 1 since the previous force point: rank 0 recorded" in out
    assert "shape error: add: operands could not be broadcast together with shapes (4, 3) (4, 2)" in out
    assert "smooth equals NumPy's: True" in out and "smooth is a DistArray of block over axis 0, 400 rows on 2 ranks" in out
    assert "nbmpi distarray coverage:" in out and "NumPy-fallback calls" in out
    cov = out.split("nbmpi distarray coverage: ")[1].split(" native")[0]
    assert int(cov) > 0, out
    assert "fallback calls: {'diff': {'calls': 1, 'bytes': 3200}}" in out      # convolve is native
    e = out.split("smooth equals NumPy's: True; energy ")[1].split("\n")[0]
    assert e.split(" vs")[0] == e.split("NumPy's ")[1], e     # the sum's order differs, its 10 digits do not


def test_benchmark_quick_evaluates_its_targets(tmp_path, kernel_cache):
    env = dict(__import__("os").environ, NBMPI_DISTARRAY_CACHE=kernel_cache)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "distarray.py"), "--quick", "--out-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=420, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "distarray_quick.json").read_text())
    two = data["mpi"]["2"]
    for name in ("stencil", "jacobi", "blackscholes", "lbm", "nbody", "knn", "prk_stencil", "prk_transpose"):
        assert data["numpy"][name]["per_iter_s"] > 0 and two[name]["verified"], name
        for mode in ("hiding", "blocking"):
            row = two[name][mode]
            assert row["per_iter_s"] > 0 and len(row["wait_pct"]) == 2, (name, mode)
            # the split of the wait (transfers / force points) is part of the total, rank by rank
            split = row["wait_pct_split"]
            for r in range(2):
                part = split["transfers"][r] + split["force_point"][r]
                assert 0 <= part <= row["wait_pct"][r] + 1e-6, (name, mode, r, split, row["wait_pct"])
    hw = two["handwritten_stencil"]
    assert hw["per_iter_s"] > 0 and data["dask"]["per_iter_s"] > 0
    # both peers' waits, per round and rank: a share of the loop's time
    for key in ("wait_pct_rounds", "nbmpi_wait_pct_rounds"):
        assert hw[key] and all(len(r) == 2 and all(0 <= w <= 100 for w in r) for r in hw[key]), (key, hw[key])
    names = [t["target"] for t in data["targets"]]
    for part in ("wait % with latency hiding", "without / with latency hiding", "stencil transfer wait %",
                 "hand-written mpi4py+numba",
                 "over dask.array", "equals NumPy's"):
        assert any(part in n for n in names), (part, names)
    assert all(t["status"] in ("PASS", "FAIL") for t in data["targets"])
    md = (tmp_path / "distarray_quick.md").read_text()
    assert "## 2 ranks" in md and "## Targets" in md and "## Where the wait goes" in md and "GFlop/s" in md and "GB/s" in md
