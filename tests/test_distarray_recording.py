"""The recording path's shortcuts: the plain pass of ``View.index`` gives what the general pass gives (views and
errors), shared distributions place every row as fresh ones, and the SPMD program ``distarray_recording.py``
(elimination and LU loops, small views, row broadcasts, overlapping assignments, lazy texts) under real mpiexec on
1, 2 and 3 ranks gives NumPy's results bit for bit."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import run_sections
from nbmpi.workers.distarray.distribution import Distribution
from nbmpi.workers.distarray.elementwise import dist_of, rows_of
from nbmpi.workers.distarray.indexing import View


def _views():
    """Views of bases (7, 5) and (4, 0, 3) with sliced, fixed, new and empty axes, composed by the general pass."""
    out = []
    for shape in ((7, 5), (4, 0, 3)):
        full = View.full(shape)
        out.append(full)
        for key in ((slice(1, 6, 2),), (slice(None, None, -1), 2), (3,), (None, slice(2, 4)), (slice(5, 5),),
                    (slice(None), None, slice(4, 0, -2)), (Ellipsis, 1), (-2, slice(None))):
            try:
                out.append(full._index_general(key))
            except IndexError:
                pass
    # empty axes as other code writes them (a start other than 0): ``[:]`` of them is ``("s", 0, 1, 0)``
    out += [View((7, 5), (("s", 2, 1, 3), ("s", 4, 1, 0))), View((7, 5), (("s", 3, 2, 0), ("s", 1, 2, 2))),
            View((7, 5), (("s", 1, 1, 4), ("n",), ("i", 2))), View((7, 5), (("i", 6), ("s", 3, 1, 0)))]
    return out


def _outcome(fn):
    try:
        return ("ok", fn().key)
    except Exception as e:  # noqa: BLE001 - compared: the same type and message
        return (type(e).__name__, str(e))


KEYS = [0, 1, -1, 4, -5, 6, 7, -8] + [slice(*s) for s in ((None,), (1, None), (None, 3), (2, 5), (None, None, 2),
                                                             (None, None, -1), (5, 1, -2), (3, 3), (-3, None),
                                                             (10, 20), (None, -9))]


def test_plain_index_pass_equals_general_pass():
    plain = 0
    for v in _views():
        for nk in (1, 2, 3):
            for key in itertools.product(KEYS, repeat=nk):
                try:
                    got = v._index_plain(key)
                except IndexError as e:
                    got_out = ("IndexError", str(e))
                else:
                    if got is None:
                        continue
                    got_out = ("ok", got.key)
                    # the plain pass fills the view's slots itself: as the constructor would from its entries
                    ref = View(got.base_shape, got.entries)
                    assert [getattr(got, f) for f in View.__slots__] == [getattr(ref, f) for f in View.__slots__]
                plain += 1
                assert got_out == _outcome(lambda: v._index_general(key)), (v, key)
                assert got_out == _outcome(lambda: v.index(key)), (v, key)
    assert plain > 2000, plain     # the plain pass did take most of these keys


def test_index_keeps_general_errors_for_other_keys():
    v = View.full((6, 4))._index_general((slice(None), 2))     # ('s', ...), ('i', 2): one user axis
    with pytest.raises(IndexError, match="too many indices for array: array is 1-dimensional, but 2 were indexed"):
        v.index((9, 0))
    with pytest.raises(IndexError, match="index 9 is out of bounds for axis 0 with size 6"):
        v.index(9)
    assert v.index(np.int64(-1)).key == v.index(-1).key == v._index_general((5,)).key


@pytest.mark.parametrize("kind,block", [("block", 1), ("cyclic", 1), ("block-cyclic", 2), ("block-cyclic", 3),
                                        ("replicated", 1)])
def test_shared_distributions_place_rows_as_fresh_ones(kind, block):
    for nranks in (1, 2, 3):
        for nrows in range(0, 10):
            d = dist_of(kind, nrows, nranks, block)
            fresh = Distribution(kind, nrows, nranks, block)
            assert d is dist_of(kind, nrows, nranks, block) and d == fresh and d.key == fresh.key
            rows = np.arange(nrows)
            if kind != "replicated":
                assert np.array_equal(d.owner(rows), fresh.owner(rows))
                assert np.array_equal(d.local_index(rows), fresh.local_index(rows))
            for m in range(0, 8):
                r = rows_of(d, m)
                w = fresh.with_rows(m)
                assert r == w and r.nrows == m and r.kind == kind and r.nranks == nranks
                if kind != "replicated":
                    assert np.array_equal(r.owner(np.arange(m)), w.owner(np.arange(m)))


@pytest.mark.parametrize("kind,block", [("block", 1), ("cyclic", 1), ("block-cyclic", 2), ("block-cyclic", 3),
                                        ("replicated", 1)])
def test_scalar_placement_equals_vectorized(kind, block):
    """``owner_of``, ``local_index_of`` and ``block_range`` (closed forms for one row) give what the vectorized
    ``owner`` / ``local_index`` / ``offsets`` give, rows past either end included."""
    for nranks in (1, 2, 3, 4):
        for nrows in range(0, 12):
            d = Distribution(kind, nrows, nranks, block)
            rows = np.arange(-2, nrows + 3)
            owners = d.owner(rows)
            local = d.local_index(rows)
            for r, q, li in zip(rows.tolist(), owners.tolist(), local.tolist()):
                assert d.owner_of(r) == q and type(d.owner_of(r)) is int, (d, r)
                assert d.local_index_of(r) == li and type(d.local_index_of(r)) is int, (d, r)
            if kind == "block":
                offs = d.offsets
                for q in range(nranks):
                    assert d.block_range(q) == (int(offs[q]), int(offs[q + 1]))
                    assert all(type(x) is int for x in d.block_range(q))


@pytest.mark.parametrize("kind,block", [("block", 1), ("cyclic", 1), ("block-cyclic", 2), ("block-cyclic", 3),
                                        ("replicated", 1)])
def test_local_runs_are_the_global_rows_in_runs(kind, block):
    """``local_runs`` (closed form, used by the distributed random draws) lists ``global_rows`` as maximal
    ``(first, count)`` runs in local order, none empty; ``local_run_count`` is their number."""
    for nranks in (1, 2, 3, 4):
        for nrows in range(0, 14):
            d = Distribution(kind, nrows, nranks, block)
            for q in range(nranks):
                runs = d.local_runs(q)
                rows = [a + i for a, c in runs for i in range(c)]
                assert rows == d.global_rows(q).tolist(), (d, q, runs)
                assert all(c > 0 and type(a) is int and type(c) is int for a, c in runs), (d, q, runs)
                assert all(a1 > a0 + c0 for (a0, c0), (a1, _) in zip(runs, runs[1:])), (d, q, runs)
                assert d.local_run_count(q) == len(runs)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_recording_shortcuts_give_numpy_results(run_mpi, kernel_cache, n):
    run_sections(run_mpi, kernel_cache, "distarray_recording.py", n,
                 ("elimination steps on views whose offsets change", "LU recorded whole",
                  "small views, row broadcasts, overlapping assignments, dtypes",
                  "long chains of one-reader temporaries", "messages and texts"), timeout=600)


def test_assign_writes_only_its_target():
    """``elementwise._pending_row`` reads an Assign's written leaf as ``out`` (no ``writes()`` list per task)."""
    from nbmpi.workers.distarray.graph import Assign, Base, Leaf

    class _Ctx:
        _serial = 0

        def next_serial(self):
            self._serial += 1
            return self._serial

    d = Distribution("block", 4, 2)
    b = Base(_Ctx(), (4, 3), np.float64, d)
    out = Leaf(b, View.full((4, 3)).index((slice(1, 3),)))
    t = Assign(out, Leaf(b, View.full((4, 3)).index((slice(0, 2),))))
    assert t.writes() == [out] and t.out is out
