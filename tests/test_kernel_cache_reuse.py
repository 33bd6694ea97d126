"""The fused kernels' on-disk cache (``nbmpi.workers.distarray.fused_kernels``): processes started at the same time
on a new cache directory all run and leave one source per kernel (no temporary files), and a later new process
compiles nothing: every kernel it needs is loaded from the cache. Real processes (single-rank MPI), no mocks."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import assert_ok

PROGRAM = """
import json
import numpy
import nbmpi.workers.distarray as np
x = np.linspace(0.0, 1.0, 20_000)
y = np.where(x < 0.5, np.sin(x) * 3.0 + 1.0, np.exp(-x)) ** 2
g = np.zeros((300, 200)) + np.arange(200.0)
h = 0.25 * (g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:])
rows = (g / 7.0).sum(axis=1)                        # NumPy's pairwise order: a kernel with helper functions
out = [float(y.sum()), float(numpy.asarray(h).sum()), float(np.mean(x * x)), numpy.asarray(rows).tolist()]
print(json.dumps(dict(out=out, stats=np.kernel_stats())))
"""


def _start(cache: str) -> subprocess.Popen:
    env = {**os.environ, "NBMPI_DISTARRAY_CACHE": cache}
    return subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen) -> dict:
    """Wait for ``p`` (at most 300 s), assert it ended well, and return the JSON of its last output line."""
    try:
        out, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    assert_ok(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return json.loads(out.strip().splitlines()[-1])


def test_concurrent_writers_then_a_new_process_compiles_nothing(tmp_path):
    cache = str(tmp_path / "kernels")
    procs = [_start(cache) for _ in range(3)]
    try:
        first = [finish(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(r["out"] == first[0]["out"] for r in first), first
    assert first[0]["stats"]["kernels"] >= 3, first[0]["stats"]
    names = os.listdir(cache)
    assert not [n for n in names if n.endswith(".tmp")], names
    sources = [n for n in names if n.endswith(".py")]
    assert len(sources) == first[0]["stats"]["kernels"], (sources, first[0]["stats"])
    later = finish(_start(cache))
    assert later["out"] == first[0]["out"]
    st = later["stats"]
    assert st["compiled"] == 0 and st["loaded"] == st["signatures"] == first[0]["stats"]["signatures"], st


def test_cache_off_compiles_every_kernel_and_its_helpers_in_memory(tmp_path):
    """``NBMPI_DISTARRAY_CACHE=off``: every kernel, also one whose source holds helper functions (the pairwise
    row sum), compiles in memory and gives what a process with an on-disk cache gives, and NumPy's row sums."""
    import numpy

    cached = finish(_start(str(tmp_path / "kernels")))
    off = finish(_start("off"))
    assert off["out"] == cached["out"]
    g = numpy.zeros((300, 200)) + numpy.arange(200.0)
    assert off["out"][3] == (g / 7.0).sum(axis=1).tolist()
    st = off["stats"]
    assert st["loaded"] == 0 and st["compiled"] == st["signatures"] == cached["stats"]["signatures"], st


STATS_BETWEEN_CALLS = """
import json
import numba
import nbmpi.workers.distarray as np
from nbmpi.workers.distarray import fused_kernels
seen = []
for dtype in ("float64", "int64", "float32"):       # a new kernel each
    x = np.arange(1000).astype(dtype)
    float((x * 3 + 1).sum())
    seen.append(np.kernel_stats())
    seen.append(np.kernel_stats())                  # read twice in a row: the same
k = numba.njit(lambda v: v + 1)                     # one kernel gaining signatures between reads
fused_kernels._KERNELS["test: one kernel, three signatures"] = k
grown = []
for v in (1, 1.5, 1j):
    k(v)
    grown.append(np.kernel_stats()["signatures"])
print(json.dumps(dict(seen=seen, grown=grown)))
"""


def test_kernel_stats_read_between_calls_count_every_new_signature(tmp_path):
    """``kernel_stats()`` keeps each kernel's counts between reads, and counts anew a kernel that gained a
    signature after a read; new kernels count as compiled on an empty cache, as loaded from a full one, and as
    compiled with the cache off (``NBMPI_DISTARRAY_CACHE=off``: kernels compiled in memory only)."""
    cache = str(tmp_path / "kernels")
    for run, where in (("empty cache", cache), ("full cache", cache), ("cache off", "off")):
        env = {**os.environ, "NBMPI_DISTARRAY_CACHE": where}
        p = subprocess.run([sys.executable, "-c", STATS_BETWEEN_CALLS], env=env, capture_output=True, text=True,
                           timeout=300)
        assert_ok(p)
        out = json.loads(p.stdout.strip().splitlines()[-1])
        seen = out["seen"]
        for a, b in zip(seen[::2], seen[1::2]):
            assert a == b, (run, seen)
        sigs = [s["signatures"] for s in seen[::2]]
        assert sigs[0] < sigs[1] < sigs[2], (run, seen)
        key = "loaded" if run == "full cache" else "compiled"
        assert [s[key] for s in seen[::2]] == sigs, (run, key, seen)
        other = "compiled" if run == "full cache" else "loaded"
        assert all(s[other] == 0 for s in seen), (run, other, seen)
        assert out["grown"] == [sigs[2] + 1, sigs[2] + 2, sigs[2] + 3], (run, out)
