"""The conformance suite of the native NumPy functions of the distributed arrays (tests/distarray_conformance.py)
under real mpiexec on 1, 2 and 3 ranks, in two parts (recorded operations; collective steps): each native function
equals NumPy on block, cyclic and block-cyclic layouts, views and uneven splits, without calling the NumPy fallback;
plus hypothesis-drawn cases."""
from __future__ import annotations

import pytest

from conftest import REPO, assert_ok

DISTS = ["block", "cyclic", "('block-cyclic', 2)"]


PARTS = {"recorded": DISTS + ["linalg fallback", "hypothesis"],
         "native": [f"native {d}" for d in DISTS] + ["hypothesis native"]}


@pytest.mark.parametrize("part", sorted(PARTS))
@pytest.mark.parametrize("n", [1, 2, 3])
def test_conformance_against_numpy(run_mpi, kernel_cache, n, part):
    """Recorded part: reductions, nan*, cumulative, shape functions, linalg.norm. Native part: sort/argsort,
    searchsorted, reshape, repeat, tile, flip, transpose/swapaxes/moveaxis, nonzero, joining, convolve/correlate,
    cross (collective steps)."""
    code = (REPO / "tests" / "distarray_conformance.py").read_text()
    p = run_mpi(code, n=n, timeout=290, env={"NBMPI_DISTARRAY_CACHE": kernel_cache}, args=("25", part))
    assert_ok(p)
    for r in range(n):
        for d in PARTS[part]:
            assert f"rank {r}: ok {d}" in p.stdout, (r, d, p.stdout)
        assert f"rank {r}: ALL OK (" in p.stdout, p.stdout
