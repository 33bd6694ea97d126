"""Lazy coordinate grids (workers/distarray/lazy_grids.py), under real mpiexec on 1, 2 and 3 ranks
(tests/distarray_lazy_grids.py): ``mgrid``/``meshgrid`` arrays read by elementwise operations allocate nothing,
anything needing memory materialises them, a write materialises them first; every result equals NumPy's bit
for bit on block, cyclic and block-cyclic layouts."""
from __future__ import annotations

import pytest

from conftest import REPO, assert_ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_lazy_grids(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_lazy_grids.py").read_text()
    p = run_mpi(code, n=n, timeout=290, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    for r in range(n):
        assert f"rank {r}: ALL OK" in p.stdout, p.stdout
