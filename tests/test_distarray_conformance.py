"""The conformance suite of the native NumPy functions of the distributed arrays (tests/distarray_conformance.py)
under real mpiexec on 1, 2 and 3 ranks: each native function equals NumPy on block, cyclic and block-cyclic
layouts, views and uneven splits, without calling the NumPy fallback; plus hypothesis-drawn cases."""
from __future__ import annotations

import pytest

from conftest import REPO, assert_ok

DISTS = ["block", "cyclic", "('block-cyclic', 2)"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_conformance_against_numpy(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_conformance.py").read_text()
    p = run_mpi(code, n=n, timeout=900, env={"NBMPI_DISTARRAY_CACHE": kernel_cache}, args=("25",))
    assert_ok(p)
    for r in range(n):
        for d in DISTS + [f"native {d}" for d in DISTS] + ["linalg fallback", "hypothesis", "hypothesis native"]:
            assert f"rank {r}: ok {d}" in p.stdout, (r, d, p.stdout)
        assert f"rank {r}: ALL OK (" in p.stdout, p.stdout
