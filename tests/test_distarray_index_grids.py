"""``mgrid`` / ``ogrid`` of the distributed arrays (``nbmpi.workers.distarray.index_grids``) under real mpiexec on
1, 2 and 3 ranks: NumPy's values and dtypes bit for bit, rows distributed over their own axis 0, no fallback."""
from __future__ import annotations

import pytest

from conftest import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3])
def test_mgrid_ogrid_equal_numpy(run_mpi, kernel_cache, n):
    run_ranks(run_mpi, kernel_cache, "distarray_index_grids.py", n, ["index grids OK"], timeout=180)
