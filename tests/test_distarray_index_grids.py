"""``mgrid`` / ``ogrid`` of the distributed arrays (``nbmpi.workers.distarray.index_grids``) under real mpiexec on
1, 2 and 3 ranks: NumPy's values and dtypes bit for bit, rows distributed over their own axis 0, no fallback."""
from __future__ import annotations

import pytest

from conftest import REPO, assert_ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_mgrid_ogrid_equal_numpy(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_index_grids.py").read_text()
    p = run_mpi(code, n=n, timeout=180, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    for r in range(n):
        assert f"rank {r}: index grids OK" in p.stdout, p.stdout
