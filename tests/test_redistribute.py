"""Redistribution between distributions and irregular copies (issue 14) under real mpiexec on 2 and 3 ranks, the
example notebook, and the benchmark command.

The SPMD program is a real file next to this one, ``redistribute_cases.py``: every pair of block, cyclic and
block-cyclic (block sizes 2 and 3), 1-D and 2-D, contiguous, strided and reversed views against NumPy; at most one
message per peer per redistribution, counted in the gathered trace; a time loop that builds no plan and allocates
nothing (engine counters and tracemalloc); ``b[idx] = a`` and ``a[idx]`` with NumPy, mask and distributed index
arrays through the Aggregator (duplicates: the last occurrence wins); every error raised on every rank."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, assert_ok
from notebook_outputs import notebook_outputs

SECTIONS = ["every pair of distributions, 1-D and 2-D, b[...] = a and redistribute()",
            "strided and reversed views, 1-D and 2-D", "one message per peer per redistribution (trace)",
            "plan and buffers reused, nothing allocated in a time loop",
            "irregular b[idx] = a and a[idx] through the Aggregator", "errors on every rank"]
ERROR_CASES = ["shape mismatch", "unknown distribution", "block size", "index out of range (NumPy index)",
               "index out of range on one rank (distributed index)", "index out of range on one rank (gather)",
               "value shape", "float index"]


@pytest.mark.parametrize("n", [2, 3])
def test_redistribution_and_irregular_copies_equal_numpy(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "redistribute_cases.py").read_text()
    p = run_mpi(code, n=n, timeout=240, env={"NBMPI_DISTARRAY_CACHE": kernel_cache, "NBMPI_TIMEOUT": "30"})
    assert_ok(p)
    for s in SECTIONS:
        assert f"ok {s}\n" in p.stdout, (s, p.stdout)
    assert "max messages per peer per redistribution: 1\n" in p.stdout, p.stdout
    assert "plans built 0, buffers allocated 0" in p.stdout, p.stdout
    for case in ERROR_CASES:
        for r in range(n):
            assert f"rank {r} raised {case}:" in p.stdout, (case, r, p.stdout)
    # the index held by one rank only is reported by that rank, on every rank (each message is one write;
    # the ranks' lines may interleave)
    holder = 19 % n
    for r in range(n):
        got = re.search(rf"rank {r} raised index out of range on one rank \(distributed index\): IndexOutOfBounds: "
                        r"rank \d+: [^\n]*?found by rank (\d+)", p.stdout)
        assert got and int(got.group(1)) == holder, (r, p.stdout)
        assert f"rank {r} done" in p.stdout
    assert "ALL OK (" in p.stdout and f" checks on {n} ranks)" in p.stdout, p.stdout


def test_redistribution_notebook_runs_top_to_bottom(tmp_path, kernel_cache, monkeypatch):
    monkeypatch.setenv("NBMPI_DISTARRAY_CACHE", kernel_cache)
    out = notebook_outputs("04-redistribution.ipynb", tmp_path)
    assert "cyclic over axis 0, 12 rows on 2 ranks" in out
    assert "rank 0 block rows [0, 1, 2, 3, 4, 5] -> cyclic rows [0, 2, 4, 6, 8, 10]" in out
    assert "rank 1 block rows [6, 7, 8, 9, 10, 11] -> cyclic rows [1, 3, 5, 7, 9, 11]" in out
    assert out.count("same as NumPy: True") == 2
    assert "messages of one redistribution (rank, peer): [(0, 1), (1, 0)]" in out
    assert "sends and local copy packed in one interleaved pass" in out and "<svg" in out
    assert out.count("10 steps: 20 redistributions, plans built 0, buffers allocated 0") == 2
    line = out.split("per element ")[1].split("\n")[0]
    assert "result correct: True" in line and "speedup" in line, line
    assert "b[perm] = a equals NumPy: True" in out
    assert "a[[0, 5, 5, 11, -1]] = [ 0.  5.  5. 11. 11.]" in out
    assert "duplicates, last wins: [ 0. 30.  0. 40.]" in out
    assert "a[distributed index] = [11. 10.  9.  8.  7.  6.  5.  4.  3.  2.  1.  0.]" in out
    for r in (0, 1):
        assert f"rank {r} IndexOutOfBounds: index 99 is out of bounds for axis 0 with size 12 (position 11 of the " \
               "index array, found by rank 1)" in out
        assert f"rank {r} ShapeError: could not broadcast input array from shape (13,)" in out


def test_benchmark_quick_evaluates_its_targets(tmp_path, kernel_cache):
    import os

    env = dict(os.environ, NBMPI_DISTARRAY_CACHE=kernel_cache)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "redistribute.py"), "--quick", "--out-dir",
                           str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "redistribute_quick.json").read_text())
    sizes = data["results"]["sizes"]
    assert len(sizes) == 3
    for s in sizes.values():
        for key in ("block->cyclic", "cyclic->block"):
            r = s["directions"][key]
            for m in ("per_element", "nbmpi", "nbmpi_new", "alltoallw", "memcpy"):
                assert r[m]["min"] > 0 and r[m]["cold"] > 0, (key, m)
            assert all(r["verified"].values()), r["verified"]
            assert r["messages"]["max_per_peer"] == 1, r["messages"]
    perm = data["results"]["perm"]
    assert perm["verified"] and all(perm[k]["min"] > 0 for k in ("numpy_index", "dist_index", "alltoallv"))
    names = [t["target"] for t in data["targets"]]
    for part in ("vs per-element messaging", "vs the memcpy bound", "vs Alltoallw", "messages per peer",
                 "equals NumPy's", "permutation results"):
        assert any(part in n for n in names), (part, names)
    assert all(t["status"] in ("PASS", "FAIL") for t in data["targets"])
    md = (tmp_path / "redistribute_quick.md").read_text()
    assert "## 1 MiB" in md and "## Targets" in md and "Random permutation" in md and "Alltoallw" in md


SMALL_ITEMS = """
import itertools
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world

r = world().Get_rank()
D = ["block", "cyclic", ("block-cyclic", 2)]
n = 0
for shape, dt in [((6, 5, 4), np.float32), ((6, 5, 3), np.float32), ((6, 5, 4), np.int16), ((7, 3, 5), np.int8)]:
    x = np.arange(np.prod(shape)).astype(dt).reshape(shape)
    for key in [(slice(None), slice(None), slice(1, 3)), (slice(1, None, 2), slice(1, 3), slice(0, None, 2))]:
        for src, dst in itertools.product(D, D):
            A = dnp.from_numpy(x, dist=src)
            assert np.array_equal(A[key].redistribute(dst).to_numpy(), x[key]), (shape, dt, key, src, dst)
            n += 1
print(f"rank {r}: {n} views redistributed", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_views_of_small_elements_redistribute(run_mpi, kernel_cache, n):
    """A view with a slice on a trailing axis, of 1-, 2- and 4-byte elements, between every pair of layouts: a
    packed message matches a peer that receives it in place (once failed with MPI "Message truncated": the
    packed send carried the 8-byte padding of its buffer)."""
    p = run_mpi(SMALL_ITEMS, n=n, timeout=240, env={"NBMPI_DISTARRAY_CACHE": kernel_cache, "NBMPI_TIMEOUT": "30"})
    assert_ok(p)
    for r in range(n):
        assert f"rank {r}: 72 views redistributed" in p.stdout, p.stdout
