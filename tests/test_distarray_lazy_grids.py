"""Lazy coordinate grids (workers/distarray/lazy_grids.py), under real mpiexec on 1, 2 and 3 ranks
(tests/distarray_lazy_grids.py): ``mgrid``/``meshgrid`` arrays read by elementwise operations allocate nothing,
anything needing memory materialises them, a write materialises them first; every result equals NumPy's bit
for bit on block, cyclic and block-cyclic layouts."""
from __future__ import annotations

import pytest

from conftest import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3])
def test_lazy_grids(run_mpi, kernel_cache, n):
    run_ranks(run_mpi, kernel_cache, "distarray_lazy_grids.py", n, ["ALL OK"])
