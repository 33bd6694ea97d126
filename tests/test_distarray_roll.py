"""``roll`` of the distributed arrays (tests/distarray_roll_cases.py) under real mpiexec on 1, 2 and 3 ranks: equal to
NumPy bit for bit on block, cyclic and block-cyclic layouts, views, shifts beyond a rank's block and beyond the axis,
and read in place by the stencils that consume it."""
from __future__ import annotations

import pytest

from conftest import run_ranks

DISTS = ["block", "cyclic", "('block-cyclic', 2)"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_roll_equals_numpy(run_mpi, kernel_cache, n):
    run_ranks(run_mpi, kernel_cache, "distarray_roll_cases.py", n, [f"ok {d}" for d in DISTS] + ["ALL OK ("])
