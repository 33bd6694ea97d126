"""Memoised parts of elementwise plans: :func:`~nbmpi.workers.distarray.operations.elementwise.leaf_meta` equals
the addressing computed from the :class:`View` methods on random views (replicated and distributed bases, new
axes, integers, negative steps, reduced axes); a memoised :func:`row_runs.row_plan` equals a fresh one for every
rank, layout and view (local, no MPI); and pivot-step programs over moving views give NumPy's results exactly on
1, 2 and 3 ranks under real mpiexec (``distarray_plan_memos.py``)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import run_sections
from nbmpi.workers.distarray import row_runs
from nbmpi.workers.distarray.distribution import Distribution
from nbmpi.workers.distarray.indexing import View
from nbmpi.workers.distarray.operations.elementwise import leaf_meta
from nbmpi.workers.distarray.plans import prod


def reference_meta(v, replicated, sshape, reduced):
    """The addressing as the View methods give it (what ``leaf_meta`` computes in one pass)."""
    d = len(sshape)
    if replicated:
        off, stv = v.full_strides()
        ushape = list(v.shape)
        if reduced is not None:
            ushape.insert(reduced, 1)
            stv = stv[:reduced] + (0,) + stv[reduced:]
        pad = d - len(ushape)
        ishape = (1,) * pad + tuple(ushape)
        istr = (0,) * pad + tuple(stv)
        bc = tuple(ishape[k] == 1 and sshape[k] > 1 for k in range(d))
        if reduced is not None:
            bc = tuple(True if k == reduced else bc[k] for k in range(d))
        return dict(off0=off, rows_full=ishape[0] == sshape[0] and sshape[0] > 1, st0=istr[0],
                    trail_strides=istr[1:], bcast=bc)
    trail_shape = v.base_shape[1:]
    toff, tstr = v.trail_strides(trail_shape)
    pstr = v.packed_strides()
    lead = (0,) * (v.lead_new() if not v.row_kept else 0)
    uafter = [e for e in v.after_row() if e[0] != "i"]
    ush = [1] * len(lead) + [e[3] if e[0] == "s" else 1 for e in uafter]
    if reduced is not None:
        ush.insert(reduced - 1, 1)
        tstr = tstr[:reduced - 1] + (0,) + tstr[reduced - 1:]
        pstr = pstr[:reduced - 1] + (0,) + pstr[reduced - 1:]
    pad = (d - 1) - len(ush)
    ishape = (sshape[0],) + (1,) * pad + tuple(ush)
    bc = (False,) + tuple(ishape[k] == 1 and sshape[k] > 1 for k in range(1, d))
    if reduced is not None:
        bc = tuple(True if k == reduced else bc[k] for k in range(d))
    return dict(row_elems=prod(trail_shape), trail_off=toff, trail_strides=(0,) * pad + lead + tuple(tstr),
                packed_strides=(0,) * pad + lead + tuple(pstr), packed_row_elems=prod(v.packed_trail_shape()),
                bcast=bc)


@st.composite
def views(draw):
    base = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    items = []
    for n in base:
        if draw(st.booleans()):
            items.append(None)
        kind = draw(st.sampled_from(["slice", "slice", "int"]))
        if kind == "int":
            items.append(draw(st.integers(-n, n - 1)))
        else:
            items.append(slice(draw(st.one_of(st.none(), st.integers(-n, n))),
                               draw(st.one_of(st.none(), st.integers(-n, n))),
                               draw(st.sampled_from([None, 1, 2, -1, -2, 3]))))
    return View.full(base).index(tuple(items))


@settings(max_examples=500, deadline=None)
@given(views(), st.booleans(), st.data())
def test_leaf_meta_equals_the_view_methods(v, replicated, data):
    if not replicated and not v.row_kept and v.lead_new():
        replicated = True                      # a fixed distributed row behind new axes is never planned
    ush = len(v.shape) if replicated else len([e for e in v.after_row() if e[0] != "i"]) + (
        v.lead_new() if not v.row_kept else 0)
    lo = 0 if replicated else 1
    reduced = data.draw(st.one_of(st.none(), st.integers(lo, ush))) if ush >= lo else None
    d = max(ush + (reduced is not None) + (0 if replicated else 1), 1)
    d += data.draw(st.integers(0, 1))
    sshape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=d, max_size=d)))
    m = leaf_meta(v, replicated, np.dtype(float), sshape, reduced, identical=False)
    want = reference_meta(v, replicated, sshape, reduced)
    got = {k: getattr(m, k) for k in want}
    assert got == want, (v, replicated, sshape, reduced)
    assert m.kind == ("repv" if replicated else "dist") and m.reduced == reduced


def _fields(rp):
    send = [(k, c, tuple(np.asarray(x).tolist()) if not isinstance(x, tuple) else x) for k, c, x in rp.send]
    return rp.count, rp.recv, send, rp.segs


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.sampled_from(["block", "cyclic", "block-cyclic"]), st.integers(1, 30),
       st.lists(st.tuples(st.sampled_from(["block", "cyclic", "block-cyclic"]), st.integers(0, 6),
                          st.sampled_from([1, 2, -1])), max_size=2), st.integers(0, 5), st.booleans())
def test_row_plan_memo_gives_each_rank_its_own_plan(nranks, kind, n, ops_desc, s0, need_i):
    nrows = s0 + n
    sd = Distribution(kind, nrows, nranks, 2 if kind == "block-cyclic" else 1)
    ops = []
    for k2, off, t in ops_desc:
        span = (n - 1) * abs(t) + 1
        dist = Distribution(k2, off + span, nranks, 2 if k2 == "block-cyclic" else 1)
        ops.append((dist, off if t > 0 else off + span - 1, t))
    row_runs._MEMO.clear()
    for _ in range(2):                                   # a miss, then a hit
        for rank in range(nranks):
            got = row_runs.row_plan(sd, s0, 1, n, ops, rank, need_i)
            fresh = (row_runs.by_runs(sd, s0, 1, n, ops, rank)
                     if kind == "block" and all(d.kind == "block" for d, _, _ in ops)
                     else row_runs.by_rows(sd, s0, 1, n, ops, rank, need_i))
            assert _fields(got) == _fields(fresh), (rank, nranks, kind, ops_desc)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_pivot_steps_over_moving_views_equal_numpy(run_mpi, kernel_cache, n):
    run_sections(run_mpi, kernel_cache, "distarray_plan_memos.py", n,
                 ("pivot steps over moving views, mixed layouts", "reductions and new axes over moving views",
                  "aligned local plans rebound over moving windows",
                  "replicated-row and reducing plans rebound over a back substitution"), timeout=400)
