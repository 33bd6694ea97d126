"""Every NumPy ufunc, its methods and the selection functions on distributed arrays against NumPy
(tests/distarray_ufuncs.py) under real mpiexec on 1, 2 and 3 ranks: block, cyclic and block-cyclic layouts,
views and uneven splits, out=/where=/dtype=/casting, several outputs, reduce/accumulate/outer, take/compress/
choose/put/partition/resize, index arrays mixed with slices, a.shape = ..., repeat with distributed counts,
correlate with the longer kernel, and hypothesis-drawn cases; equal to NumPy bit for bit, without calling the
NumPy fallback. Also: the generated coverage table lists every ufunc as native."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3])
def test_ufuncs_and_selection_against_numpy(run_mpi, kernel_cache, n):
    run_ranks(run_mpi, kernel_cache, "distarray_ufuncs.py", n,
              ["ok ufuncs ("] + [f"ok rest {d} (" for d in ("block", "cyclic", "('block-cyclic', 2)")]
              + ["ok hypothesis", "ALL OK ("], args=("25", "all"))


def test_every_ufunc_is_native_in_the_table():
    """Every ufunc NumPy has (by name and alias) is classified native by the generated table."""
    from nbmpi.workers.distarray.numpy_table import classify

    functions, _ = classify()
    ufuncs = [n for n in dir(np) if isinstance(getattr(np, n), np.ufunc)]
    assert len(ufuncs) > 80
    assert [n for n in ufuncs if functions[n] != "native"] == []
    for name in ("take", "compress", "choose", "put", "partition", "argpartition", "resize"):
        assert functions[name] == "native", name
