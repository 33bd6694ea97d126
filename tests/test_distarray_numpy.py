"""NumPy breadth of the distributed arrays: the NumPy fallback (``nbmpi.workers.distarray.fallback``) and the grid
constructors (``grids``), under real mpiexec on 1, 2
and 3 ranks: results equal NumPy's, warnings once per call site, counters, the coverage report at exit, and the
fallback marked on the timeline."""
from __future__ import annotations

import pytest

from conftest import REPO, assert_ok, run_ranks

SECTIONS = ["functions, ufuncs, operators and methods fall back to NumPy on every distribution",
            "Python bool operands follow NumPy's promotion", "every name NumPy has exists",
            "one warning per call site on rank 0, every call counted"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fallback_equals_numpy(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_fallback.py").read_text()
    p = run_mpi(code, n=n, timeout=240, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    for s in SECTIONS:
        assert f"ok {s}" in p.stdout, (s, p.stdout)
    for r in range(n):
        assert f"rank {r}: ALL OK (" in p.stdout, p.stdout


def test_coverage_report_and_timeline(run_mpi, kernel_cache):
    code = """
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import gather_trace, get_tracer, world
mark = get_tracer().mark()
a = dnp.from_numpy(np.arange(10.0))
b = np.diff(a * 2, prepend=0.0)    # a native multiply, a fallback diff
print("sum", float(dnp.sum(b)), flush=True)
t = gather_trace(since=mark)
if world().Get_rank() == 0:
    kinds = [t.kind_name(int(k)) for k in t.col("kind")]
    print("fallback events", kinds.count("numpy_fallback"), flush=True)
"""
    p = run_mpi(code, n=2, timeout=180, env={"NBMPI_DISTARRAY_CACHE": kernel_cache, "NBMPI_REPORT_COVERAGE": "1"})
    assert_ok(p)
    assert "sum 18.0" in p.stdout, p.stdout
    assert "fallback events 2" in p.stdout, p.stdout      # one per rank
    report = p.stdout + p.stderr
    assert "nbmpi distarray coverage:" in report, report
    assert "native and 1 NumPy-fallback calls" in report, report
    assert "fallback" in report and "diff" in report and "multiply" in report, report


def test_numpy_table_is_current():
    """The committed table of native and fallback names is what the generator makes now (same NumPy)."""
    import re

    import numpy as np

    from nbmpi.workers.distarray import fusion  # noqa: F401 - binds its submodules (`piece_inlining`) on the package
    from nbmpi.workers.distarray.numpy_table import classify, markdown

    committed = (REPO / "workers" / "distarray" / "NUMPY_COVERAGE.md").read_text()
    version = re.search(r"with NumPy (\S+)\.", committed).group(1)
    if version != np.__version__:
        pytest.skip(f"the table was generated with NumPy {version}, this is {np.__version__}: regenerate it")
    assert committed == markdown(), "regenerate: python -m nbmpi.workers.distarray.numpy_table --write " \
                                    "workers/distarray/NUMPY_COVERAGE.md"
    functions, methods = classify()
    assert functions["sum"] == "native" and functions["diff"] == "fallback", functions
    for name in ("sort", "argsort", "concatenate", "stack", "hstack", "vstack", "dstack", "nonzero", "reshape",
                 "ravel", "tile", "repeat", "convolve", "correlate", "cross", "abs", "searchsorted", "partition",
                 "take", "sinh", "isinf", "hypot"):
        assert functions[name] == "native", (name, functions[name])
    assert methods["astype"] == "native" and methods["partition"] == "native" and methods["tobytes"] == "fallback", \
        methods


@pytest.mark.parametrize("n", [1, 3])
def test_grid_constructors_equal_numpy(run_mpi, kernel_cache, n):
    """linspace, logspace, meshgrid (xy and ij, 2 and 3 vectors, distributed vectors), eye, identity, indices,
    fromfunction, asarray(dtype=), copy: bit-for-bit NumPy's values on block, cyclic and block-cyclic."""
    run_ranks(run_mpi, kernel_cache, "distarray_grids.py", n, ["grids OK"], timeout=180)


@pytest.mark.parametrize("n", [1, 3])
def test_random_api_equals_numpy(run_mpi, kernel_cache, n):
    """default_rng's Generator (random/uniform drawn distributed, the other methods per rank) and the legacy
    functions after seed(s) give NumPy's values; an unseeded default_rng() gives every rank the same stream."""
    run_ranks(run_mpi, kernel_cache, "distarray_random_api.py", n, ["random OK"], timeout=180)


@pytest.mark.parametrize("n", [1, 3])
def test_numpy_math_is_identical_to_numpy(run_mpi, kernel_cache, n):
    p = run_ranks(run_mpi, kernel_cache, "distarray_numpy_math.py", n, ["numpy math OK"], timeout=240)
    assert "compiled float32 exp differs from NumPy's on" in p.stdout, p.stdout
