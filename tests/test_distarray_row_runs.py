"""``row_runs``: the closed-form, run-based row plan of an elementwise group (block layouts) equals the
row-by-row one (any layout) on random block layouts, strided views (negative steps too), operand counts and
rank counts; and the run-based builder's work does not grow with the number of rows. Local, no MPI."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nbmpi.workers.distarray import row_runs
from nbmpi.workers.distarray.distribution import Distribution


@st.composite
def view_of(draw, n: int):
    """(nrows of a base, start, step) of a view with ``n`` rows inside that base."""
    t = draw(st.sampled_from([1, 2, 3, 5, -1, -2, -3]))
    span = (n - 1) * abs(t) + 1 if n else 0
    nrows = span + draw(st.integers(0, 9))
    slack = nrows - span
    off = draw(st.integers(0, slack)) if n else 0
    start = off if t > 0 else off + span - 1
    return nrows, start, t


@st.composite
def layouts(draw):
    nranks = draw(st.integers(1, 5))
    n = draw(st.integers(0, 40))
    space = draw(view_of(n))
    ops = [draw(view_of(n)) for _ in range(draw(st.integers(0, 3)))]
    return nranks, n, space, ops


def expand(send):
    """The send list with each (first, step, count) progression written out as an array."""
    out = []
    for k, c, locs in send:
        if isinstance(locs, tuple):
            l0, dl, cnt = locs
            locs = l0 + dl * np.arange(cnt, dtype=np.int64)
        out.append((k, c, np.asarray(locs).tolist()))
    return out


def both(nranks, n, space, ops, rank, need_i):
    sd = Distribution("block", space[0], nranks)
    dops = [(Distribution("block", nr, nranks), s, t) for nr, s, t in ops]
    return (row_runs.by_runs(sd, space[1], space[2], n, dops, rank),
            row_runs.by_rows(sd, space[1], space[2], n, dops, rank, need_i))


@settings(max_examples=600, deadline=None)
@given(layouts(), st.booleans())
def test_runs_equal_rows_on_random_block_layouts(lay, need_i):
    nranks, n, space, ops = lay
    for rank in range(nranks):
        runs, rows = both(nranks, n, space, ops, rank, need_i)
        assert runs.count == rows.count
        assert runs.recv == rows.recv
        assert expand(runs.send) == expand(rows.send)
        assert runs.segs == rows.segs, (lay, rank)


def test_every_row_is_received_or_local_exactly_once():
    """Across ranks, what is sent to a rank is what it receives, and every computed row is in one segment."""
    nranks, n = 3, 50
    space, ops = (60, 5, 1), [(50, 0, 1), (101, 100, -2), (200, 3, 3)]
    plans = [both(nranks, n, space, ops, r, False)[0] for r in range(nranks)]
    assert sum(p.count for p in plans) == n
    for r, p in enumerate(plans):
        assert sum(seg[0] for seg in p.segs) == p.count
        for k, q, cnt in p.recv:
            sent = [locs for (kk, c, locs) in plans[q].send if kk == k and c == r]
            assert len(sent) == 1 and sent[0][2] == cnt


def test_row_plan_takes_runs_only_for_block_layouts():
    sd = Distribution("block", 30, 2)
    cyc = Distribution("cyclic", 30, 2)
    bc = Distribution("block-cyclic", 30, 2, 4)
    for rank in range(2):
        got = row_runs.row_plan(sd, 0, 1, 30, [(cyc, 0, 1), (bc, 29, -1)], rank, False)
        want = row_runs.by_rows(sd, 0, 1, 30, [(cyc, 0, 1), (bc, 29, -1)], rank, False)
        assert got.recv == want.recv and got.segs == want.segs and expand(got.send) == expand(want.send)
        assert row_runs.row_plan(sd, 0, 1, 30, [(sd, 0, 1)], rank, False).segs == \
            row_runs.by_runs(sd, 0, 1, 30, [(sd, 0, 1)], rank).segs


def test_runs_do_not_touch_rows():
    """The run-based plan of a shifted stencil over 10**12 rows has as many segments as over 10 rows."""
    small = row_runs.by_runs(Distribution("block", 12, 3), 1, 1, 10, [(Distribution("block", 12, 3), 0, 1),
                                                                       (Distribution("block", 12, 3), 2, 1)], 1)
    big_n = 10 ** 12
    bd = Distribution("block", big_n + 2, 3)
    big = row_runs.by_runs(bd, 1, 1, big_n, [(bd, 0, 1), (bd, 2, 1)], 1)
    assert len(big.segs) == len(small.segs) == 3
    assert big.count == sum(s[0] for s in big.segs)
    assert [(k, q) for k, q, _ in big.recv] == [(k, q) for k, q, _ in small.recv]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.integers(0, 40).flatmap(lambda n: st.tuples(st.just(n), view_of(n))))
def test_gather_rows_by_owner_closed_form_equals_per_row(nranks, nv):
    """The replicate (gather) plan's per-owner rows: the block closed form selects what the per-row search does."""
    from nbmpi.workers.distarray.operations.gather import _rows_by_owner
    from nbmpi.workers.distarray.plans import hull, selector

    n, (nrows, s, t) = nv
    dist = Distribution("block", nrows, nranks)
    rows = s + np.arange(n, dtype=np.int64) * t
    owner, loc = dist.owner(rows), dist.local_index(rows)
    idx = np.arange(max(nrows, n) + 1)
    for q, (cnt, src_sel, dst_sel, hl) in enumerate(_rows_by_owner(dist, s, t, n, nranks)):
        iq = np.flatnonzero(owner == q)
        assert cnt == len(iq) and hl == hull(loc[iq])
        assert idx[src_sel].tolist() == idx[selector(loc[iq])].tolist() == loc[iq].tolist()
        assert idx[dst_sel].tolist() == iq.tolist()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.integers(0, 40).flatmap(lambda n: st.tuples(st.just(n), view_of(n), view_of(n))))
def test_redistribution_by_peer_closed_form_equals_per_row(nranks, nv):
    """The redistribution plan's per-peer rows between two block layouts: the closed form gives the runs, hulls
    and joint runs the per-row grouping gives."""
    from nbmpi.workers.distarray.operations.redistribution import _by_peer
    from nbmpi.workers.distarray.packing import ap_runs, joint_runs
    from nbmpi.workers.distarray.plans import hull

    n, (hn, hs, ht), (on, os_, ot) = nv
    hd, od = Distribution("block", hn, nranks), Distribution("block", on, nranks)
    i = np.arange(n, dtype=np.int64)
    hrows, orows = hs + i * ht, os_ + i * ot
    for rank in range(nranks):
        got = {q: rest for q, *rest in _by_peer(hd, hs, ht, od, os_, ot, n, rank, nranks)}
        want = {}
        for q in range(nranks):
            sel = (hd.owner(hrows) == rank) & (od.owner(orows) == q)
            if sel.any():
                rows, there = hd.local_index(hrows[sel]), od.local_index(orows[sel])
                local = (joint_runs(rows, there), hull(rows), hull(there)) if q == rank else None
                want[q] = [len(rows), ap_runs(rows), hull(rows), local]
        assert sorted(got) == sorted(want)
        for q in want:
            g, w = got[q], want[q]
            assert g[0] == w[0] and np.array_equal(g[1], w[1]) and g[2] == w[2]
            if q == rank:
                assert np.array_equal(g[3][0], w[3][0]) and g[3][1:] == w[3][1:]
            else:
                assert g[3] is None


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.integers(0, 40).flatmap(lambda n: st.tuples(st.just(n), view_of(n))))
def test_matmul_rows_by_owner_closed_form_equals_per_row(nranks, nv):
    """The matrix product plan's rows of ``b`` per owner and the ranks holding rows of ``a``: the block closed
    forms give the view rows, local rows (order included) and ranks that the per-row search gives."""
    from nbmpi.workers.distarray.operations.linalg import _b_rows_by_owner, _ranks_with_rows

    n, (nrows, s, t) = nv
    block = Distribution("block", nrows, nranks)
    rows = s + np.arange(n, dtype=np.int64) * t
    owner, loc = block.owner(rows), block.local_index(rows)
    closed = _b_rows_by_owner(block, s, t, n, nranks)
    assert len(closed) == nranks
    for q, (j, lq) in enumerate(closed):
        jq = np.flatnonzero(owner == q)
        assert j.tolist() == jq.tolist() and lq.tolist() == loc[jq].tolist()
    assert _ranks_with_rows(block, s, t, n, nranks) == set(np.unique(owner).tolist())


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4).flatmap(lambda d: st.lists(st.integers(0, 6), min_size=d, max_size=d)),
       st.data())
def test_view_index_and_is_full_match_numpy(shape, data):
    """A composed basic index of a View shows the elements NumPy's indexing shows, and ``is_full`` holds exactly
    for the entries of the whole base (every axis sliced from 0 by step 1 over its length)."""
    from nbmpi.workers.distarray.indexing import View

    base = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    v, ref = View.full(tuple(np.int64(n) for n in shape)), base
    assert v.is_full and v.shape == base.shape and all(type(n) is int for n in v.base_shape)
    for _ in range(data.draw(st.integers(1, 3))):
        key = []
        for n in ref.shape[:data.draw(st.integers(0, ref.ndim))]:
            if n and data.draw(st.booleans()):
                key.append(data.draw(st.integers(-n, n - 1)))
            else:
                key.append(slice(data.draw(st.one_of(st.none(), st.integers(-8, 8))),
                                 data.draw(st.one_of(st.none(), st.integers(-8, 8))),
                                 data.draw(st.sampled_from([None, 1, 2, -1, -3]))))
        v, ref = v.index(tuple(key)), ref[tuple(key)]
        got = base[v.numpy_index()]
        assert v.shape == ref.shape and got.tolist() == ref.tolist()
        assert v.is_full == (v.entries == tuple(("s", 0, 1, n) for n in shape))
        assert not v.is_full or got.tolist() == base.tolist()
