"""``roll`` of the distributed arrays (tests/distarray_roll_cases.py) under real mpiexec on 1, 2 and 3 ranks: equal to
NumPy bit for bit on block, cyclic and block-cyclic layouts, views, shifts beyond a rank's block and beyond the axis,
and read in place by the stencils that consume it."""
from __future__ import annotations

import pytest

from conftest import REPO, assert_ok

DISTS = ["block", "cyclic", "('block-cyclic', 2)"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_roll_equals_numpy(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_roll_cases.py").read_text()
    p = run_mpi(code, n=n, timeout=290, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    for r in range(n):
        for d in DISTS:
            assert f"rank {r}: ok {d}" in p.stdout, (r, d, p.stdout)
        assert f"rank {r}: ALL OK (" in p.stdout, p.stdout
