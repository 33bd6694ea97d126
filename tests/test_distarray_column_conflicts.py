"""Writes of some columns of rows while reading other columns of the same rows in one force point (the dependency
index orders accesses by rows and columns): the SPMD program ``distarray_column_conflicts.py`` under real mpiexec on
1, 2 and 3 ranks, block, cyclic and block-cyclic rows, every result equal to NumPy's bit for bit (integers)."""
from __future__ import annotations

import pytest

from conftest import run_sections


@pytest.mark.parametrize("n", [1, 2, 3])
def test_column_writes_and_reads_of_the_same_rows_equal_numpy(run_mpi, kernel_cache, n):
    run_sections(run_mpi, kernel_cache, "distarray_column_conflicts.py", n,
                 ("elementwise writes of some columns of a row and reads of others",
                  "LU's steps: products reading columns of a row while other columns are written",
                  "column ranges of n-D bases, strided and reversed columns"))
