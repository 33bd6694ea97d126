"""``plans.my_rows`` (which view rows a rank owns, and where they sit locally): the closed form used for block
distributions equals the per-row computation used for every distribution, over every slice of small arrays on
1 to 4 ranks. Local, no MPI."""
from __future__ import annotations

import numpy as np

from nbmpi.workers.distarray import plans
from nbmpi.workers.distarray.distribution import Distribution


def per_row(dist, s, t, n, rank):
    """The general (per global row) answer: what my_rows computes for cyclic and block-cyclic layouts."""
    g = dist.global_rows(rank)
    rel = g - s
    q = rel // t
    ok = (rel % t == 0) & (q >= 0) & (q < n)
    i, loc = q[ok].astype(np.int64), np.flatnonzero(ok).astype(np.int64)
    return (i[::-1].copy(), loc[::-1].copy()) if t < 0 else (i, loc)


def test_block_closed_form_equals_per_row():
    checked = 0
    for nrows in (1, 2, 5, 7, 13):
        for nranks in (1, 2, 3, 4):
            dist = Distribution("block", nrows, nranks)
            for start in range(nrows):
                for step in (1, 2, 3, -1, -2, -3):
                    for stop in [*range(nrows + 1), None]:
                        n = len(range(nrows)[slice(start, stop, step)])
                        for rank in range(nranks):
                            got = plans.my_rows(dist, start, step, n, rank)
                            want = per_row(dist, start, step, n, rank)
                            for a, b in zip(got, want):
                                assert a.dtype == np.int64 and np.array_equal(a, b), \
                                    (nrows, nranks, start, stop, step, rank, got, want)
                            checked += 1
    assert checked > 10_000
