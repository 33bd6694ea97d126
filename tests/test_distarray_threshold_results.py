"""A force point that the threshold of recorded operations starts inside a ufunc call (``a // 5``, ``a % 5``,
``numpy.floor_divide``, a ufunc method along the columns, a generalized ufunc) keeps the call's result: the result
must be held by its DistArray before the threshold is checked, else the force point takes it for a dead temporary
and drops the operation (the array then shows whatever its buffer held). Real mpiexec on 1 and 2 ranks, every
distribution, thresholds 1, 2 and one that is never reached; results equal NumPy's exactly (integers)."""
from __future__ import annotations

import pytest

from conftest import assert_ok

CODE = '''
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray.context import context_for
from spmd_checks import checks, same, section, size

x = np.arange(-20, 19).reshape(13, 3).astype(np.int64)
cases = [("a // 5", lambda a: a // 5), ("a % 5", lambda a: a % 5),
         ("floor_divide", lambda a: np.floor_divide(a, 5)),
         ("add.accumulate along the columns", lambda a: np.add.accumulate(a, axis=1))]
if hasattr(np, "vecdot"):
    cases.append(("vecdot (a generalized ufunc)", lambda a: np.vecdot(a, a)))
for dist in ["block", "cyclic", ("block-cyclic", 2)]:
    for threshold in (1, 2, 10 ** 6):
        dnp.configure(threshold=threshold)
        for name, f in cases:
            X = dnp.from_numpy(x, dist=dist)
            dnp.evaluate()
            assert not context_for().pending
            same(f"{name} {dist} threshold {threshold}", f(X), f(x))
section("ufunc results kept by a force point the threshold starts")
print(f"ALL OK ({checks[0]} checks on {size} ranks)", flush=True) if context_for().rank == 0 else None
'''


@pytest.mark.parametrize("n", [1, 2])
def test_a_force_point_at_the_threshold_keeps_the_ufunc_result(run_mpi, kernel_cache, n):
    p = run_mpi(CODE, n=n, timeout=240, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    assert "ok ufunc results kept by a force point the threshold starts\n" in p.stdout, p.stdout
    assert f" checks on {n} ranks)" in p.stdout, p.stdout
