"""Lazy concatenate results (workers/distarray/lazy_joins.py), under real mpiexec on 1, 2 and 3 ranks
(tests/distarray_lazy_joins.py): gathered, a concatenate is never stored and its parts go straight into the
NumPy result; any other use materialises it; parts written afterwards (recorded writes, ``.local``, mask
assignments, copy-on-write sources, nested joins) leave its values as they were; every result equals NumPy's
bit for bit on block, cyclic, block-cyclic and replicated parts."""
from __future__ import annotations

import pytest

from conftest import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3])
def test_lazy_joins(run_mpi, kernel_cache, n):
    run_ranks(run_mpi, kernel_cache, "distarray_lazy_joins.py", n, ["ALL OK"])
