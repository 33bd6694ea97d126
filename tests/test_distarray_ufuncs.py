"""Every NumPy ufunc, its methods and the selection functions on distributed arrays against NumPy
(tests/distarray_ufuncs.py) under real mpiexec on 1, 2 and 3 ranks: block, cyclic and block-cyclic layouts,
views and uneven splits, out=/where=/dtype=/casting, several outputs, reduce/accumulate/outer, take/compress/
choose/put/partition/resize, index arrays mixed with slices, a.shape = ..., repeat with distributed counts,
correlate with the longer kernel, and hypothesis-drawn cases; equal to NumPy bit for bit, without calling the
NumPy fallback. Also: the generated coverage table lists every ufunc as native."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import REPO, assert_ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_ufuncs_and_selection_against_numpy(run_mpi, kernel_cache, n):
    code = (REPO / "tests" / "distarray_ufuncs.py").read_text()
    p = run_mpi(code, n=n, timeout=290, env={"NBMPI_DISTARRAY_CACHE": kernel_cache}, args=("25", "all"))
    assert_ok(p)
    for r in range(n):
        assert f"rank {r}: ok ufuncs (" in p.stdout, p.stdout
        for d in ("block", "cyclic", "('block-cyclic', 2)"):
            assert f"rank {r}: ok rest {d} (" in p.stdout, (r, d, p.stdout)
        assert f"rank {r}: ok hypothesis" in p.stdout, p.stdout
        assert f"rank {r}: ALL OK (" in p.stdout, p.stdout


def test_every_ufunc_is_native_in_the_table():
    """Every ufunc NumPy has (by name and alias) is classified native by the generated table."""
    from nbmpi.workers.distarray.numpy_table import classify

    functions, _ = classify()
    ufuncs = [n for n in dir(np) if isinstance(getattr(np, n), np.ufunc)]
    assert len(ufuncs) > 80
    assert [n for n in ufuncs if functions[n] != "native"] == []
    for name in ("take", "compress", "choose", "put", "partition", "argpartition", "resize"):
        assert functions[name] == "native", name
