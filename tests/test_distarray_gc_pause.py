"""The cyclic garbage collector is paused during a force point and enabled again after it (left off if the
program turned it off), a force point that made plan instances freezes them and evicted plans are freed
although frozen, garbage alive then is collected, not frozen for good: the SPMD program ``distarray_gc_pause.py``
under real mpiexec on 1, 2 and 3 ranks, every result equal to NumPy's."""
from __future__ import annotations

import pytest

from conftest import run_sections


@pytest.mark.parametrize("n", [1, 2, 3])
def test_collector_is_paused_during_a_force_point(run_mpi, kernel_cache, n):
    run_sections(run_mpi, kernel_cache, "distarray_gc_pause.py", n,
                 ("no collection during a force point, the collector enabled after it",
                  "a collector turned off by the program stays off",
                  "a force point that made plan instances freezes them, evicted plans die though frozen",
                  "garbage alive when a force point freezes is collected, not frozen for good",
                  "objects frozen alive and dropped later are collected at the next refresh of the frozen set"))
