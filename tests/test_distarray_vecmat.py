"""``v @ B`` with ``B``'s rows distributed as one VecMat task (local BLAS product, one allgather of the partial
products, their sum in rank order): the SPMD program ``distarray_vecmat.py`` under real mpiexec on 1, 2 and 3
ranks, every result equal to NumPy's bit for bit (integer-valued operands)."""
from __future__ import annotations

import pytest

from conftest import run_sections


@pytest.mark.parametrize("n", [1, 2, 3])
def test_vecmat_equals_numpy_on_every_distribution_and_view(run_mpi, kernel_cache, n):
    run_sections(run_mpi, kernel_cache, "distarray_vecmat.py", n,
                 ("v @ B on every distribution, every view of the rows", "int64, float32 and mixed dtypes",
                  "products reading rows written before them",
                  "a product of a fixed row lives on the row's owner, no collective",
                  "a matrix product waits for the rows of b it reads, not for later rows",
                  "products over a moving window share plans of their shape class"))
