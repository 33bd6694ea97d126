"""The conformance suite of the native NumPy functions of the distributed arrays (tests/distarray_conformance.py)
under real mpiexec on 1, 2 and 3 ranks, in two parts (recorded operations; collective steps): each native function
equals NumPy on block, cyclic and block-cyclic layouts, views and uneven splits, without calling the NumPy fallback;
plus hypothesis-drawn cases."""
from __future__ import annotations

import pytest

from conftest import run_ranks

DISTS = ["block", "cyclic", "('block-cyclic', 2)"]


PARTS = {"recorded": DISTS + ["linalg fallback", "hypothesis"],
         "native": [f"native {d}" for d in DISTS] + ["hypothesis native"]}


@pytest.mark.parametrize("part", sorted(PARTS))
@pytest.mark.parametrize("n", [1, 2, 3])
def test_conformance_against_numpy(run_mpi, kernel_cache, n, part):
    """Recorded part: reductions, nan*, cumulative, shape functions, linalg.norm. Native part: sort/argsort,
    searchsorted, reshape, repeat, tile, flip, transpose/swapaxes/moveaxis, nonzero, joining, convolve/correlate,
    cross (collective steps)."""
    run_ranks(run_mpi, kernel_cache, "distarray_conformance.py", n, [f"ok {d}" for d in PARTS[part]] + ["ALL OK ("],
              args=("25", part))
