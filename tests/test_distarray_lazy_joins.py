"""Lazy concatenate results (workers/distarray/lazy_joins.py), under real mpiexec on 1, 2 and 3 ranks
(tests/distarray_lazy_joins.py): gathered, a concatenate is never stored and its parts go straight into the
NumPy result; any other use materialises it; parts written afterwards (recorded writes, ``.local``, mask
assignments, copy-on-write sources, nested joins) leave its values as they were; every result equals NumPy's
bit for bit on block, cyclic, block-cyclic and replicated parts."""
from __future__ import annotations

import pytest

from conftest import REPO, assert_ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_lazy_joins(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_lazy_joins.py").read_text()
    p = run_mpi(code, n=n, timeout=290, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    for r in range(n):
        assert f"rank {r}: ALL OK" in p.stdout, p.stdout
