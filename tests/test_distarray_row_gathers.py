"""Reads of a single row of a distributed array gathered to every rank share one gather of the whole row while
nothing writes the array or the gathered copy (``elementwise.replicate_leaf``): the SPMD program
``distarray_row_gathers.py`` under real mpiexec on 2 and 3 ranks, every result equal to NumPy's."""
from __future__ import annotations

import pytest

from conftest import run_sections


@pytest.mark.parametrize("n", [2, 3])
def test_row_gathers_are_reused_only_while_nothing_is_written(run_mpi, kernel_cache, n):
    run_sections(run_mpi, kernel_cache, "distarray_row_gathers.py", n,
                 ("a pending whole-row gather is reused only while nothing writes the array or the copy",
                  "3-D rows and rows larger than the whole-row bound",
                  "a result over fixed rows only is computed by its first row's owner",
                  "argmax and argmin over strided views"))
