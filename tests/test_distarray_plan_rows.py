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


def test_block_owner_and_local_index_of_sorted_rows_equal_the_search():
    """Distribution.owner / local_index for block: the per-rank cuts taken for long non-decreasing row arrays
    give what one binary search per row gives, also for unsorted and short arrays (which take that search)."""
    rng = np.random.default_rng(0)
    for nrows in (1000, 1500, 5001, 100003):
        for nranks in (1, 2, 3, 5):
            dist = Distribution("block", nrows, nranks)
            off = dist.offsets
            cases = (np.arange(nrows), np.arange(0, nrows, 3), np.arange(7, nrows - 5),
                     np.sort(rng.integers(0, nrows, 3000)), np.arange(nrows)[::-1].copy(),
                     rng.integers(0, nrows, 3000), np.repeat(np.arange(0, nrows, 2), 2), np.arange(min(nrows, 100)))
            for rows in cases:
                own = np.searchsorted(off[1:], rows, side="right")
                got = dist.owner(rows)
                assert got.dtype == np.int64 and np.array_equal(got, own), (nrows, nranks)
                assert np.array_equal(dist.local_index(rows), rows - off[own]), (nrows, nranks)
