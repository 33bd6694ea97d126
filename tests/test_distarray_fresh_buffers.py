"""Fresh memory of distributed arrays (workers/distarray/gather_direct.py, creation.empty, grids._from_rows,
Base.share), under real mpiexec on 1, 2 and 3 ranks (tests/distarray_fresh_buffer_cases.py): ``to_numpy`` of a
whole block array gathers without plan or staging buffer, a grid program run again takes no fresh buffer,
``empty`` allocates on first write, and ``ravel``/``reshape`` share the source's buffer copy-on-write; every
result equals NumPy's bit for bit."""
from __future__ import annotations

import pytest

from conftest import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fresh_buffers(run_mpi, kernel_cache, n):
    run_ranks(run_mpi, kernel_cache, "distarray_fresh_buffer_cases.py", n, ["ALL OK"])
