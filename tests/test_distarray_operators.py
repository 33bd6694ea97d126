"""Python's operators and NumPy's product functions on distributed arrays behave as NumPy's: the SPMD program
``distarray_operators.py`` under real mpiexec on 2 and 3 ranks (3: a rank may hold no row of a small array)."""
from __future__ import annotations

import pytest

from conftest import run_sections


@pytest.mark.parametrize("n", [2, 3])
def test_operators_and_products_equal_numpy(run_mpi, kernel_cache, n):
    p = run_sections(run_mpi, kernel_cache, "distarray_operators.py", n,
                     ("augmented assignments are in place", "comparisons with None and complex, complex scalars, round",
                      "dot, matmul out=, a @= b, reshape order, NumPy masks of the array's shape",
                      "float16 reductions and scans", "writes into copies where NumPy has views warn",
                      "boolean scalar indexes, 0-d shapes", "a.flat reads a copy and writes in place",
                      "integer floor division and remainder at the edges",
                      "NumPy's positional arguments of the reductions",
                      "stored values, keyword names and results as NumPy's",
                      "dot dtypes, matrix norms, in-place power, float32 sums and other fixes",
                      "scalars, copies, boolean index arrays, products of views of 3-D arrays",
                      "index arrays broadcast values and select in rows; NumPy scalars stored as NumPy casts them; "
                      "shares_memory; 0-d float methods; dot out= checks",
                      "nanvar and nanstd where ddof reaches the count, integer dtype= of var and std, out= and axis "
                      "errors, default_rng of generators",
                      "files written through the fallback"))
    assert "rank 0 raised int //= float: UFuncTypeError" in p.stdout and "ALL OK (" in p.stdout, p.stdout
