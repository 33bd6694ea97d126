"""Boolean masks at the edges, under real mpiexec on 2 and 3 ranks, against NumPy:

* arrays with fewer rows than ranks (a rank holds no row; also no rows at all): ``a[mask]``, ``a[mask] = v``
  (scalar, NumPy and distributed values), ``nonzero``, ``where(cond)``, ``argwhere``, ``flatnonzero``,
  ``compress`` and ``extract`` give NumPy's results on every rank, natively where they are native (before, an
  empty rank raised in ``a[mask]`` and left the others waiting);
* a row mask laid out otherwise than the array: a column of a lazy expression ``(a % 3 == 0)[:, 0]``, a
  replicated mask, a mask in another distribution, gets and sets natively (before, the set raised ShapeError
  and the get went through the NumPy fallback); on a view or a replicated array, through the fallback.
"""
from __future__ import annotations

import pytest

from conftest import run_code_all_ok

PRELUDE = """
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world

r = world().Get_rank()
DISTS = ("block", "cyclic", ("block-cyclic", 2))
checked = [0]


def same(got, want, what):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (what, got)
        for g, w in zip(got, want):
            same(g, w, what)
        return
    g = np.asarray(got)
    assert g.shape == want.shape and g.dtype == want.dtype, (what, g.shape, g.dtype, want.shape, want.dtype)
    assert np.array_equal(g, want), (what, g, want)
    checked[0] += 1


def column(x):
    return (slice(None),) + (0,) * (x.ndim - 1)


def native(what, fn):
    calls = dnp.stats()["fallback"]["calls"]
    got = fn()
    assert dnp.stats()["fallback"]["calls"] == calls, f"{what} went through the NumPy fallback"
    return got
"""


def _run(run_mpi, kernel_cache: str, body: str, n: int) -> None:
    """Run PRELUDE + ``body`` on ``n`` ranks (a rank late by 30 s fails the run) and require every rank's
    ``rank r: ALL OK``."""
    run_code_all_ok(run_mpi, kernel_cache, PRELUDE + body, n, timeout=150)


EMPTY_RANKS = """
SOURCES = [np.arange(2.), np.arange(1.), np.arange(0.), np.arange(6.).reshape(2, 3), np.arange(3.).reshape(1, 3),
           np.arange(8).reshape(2, 2, 2) % 3]


def check_masks(x, dist, tag):
    a = dnp.from_numpy(x, dist=dist)
    same(native(f"a[a > 0] {tag}", lambda: a[a > 0]), x[x > 0], f"a[a > 0] {tag}")
    if x.ndim > 1:
        same(native(f"a[rows] {tag}", lambda: a[a[:, 0] >= 0]), x[x[:, 0] >= 0], f"a[rows] {tag}")
    b = dnp.from_numpy(x, dist=dist)
    native(f"a[a > 0] = 5 {tag}", lambda: b.__setitem__(b > 0, 5))
    w = x.copy(); w[w > 0] = 5
    same(b, w, f"a[a > 0] = 5 {tag}")
    sel = int((x > 0).sum())
    vals = np.arange(sel, dtype=x.dtype) * 10 + 1
    c = dnp.from_numpy(x, dist=dist)
    native(f"a[a > 0] = dist {tag}", lambda: c.__setitem__(c > 0, dnp.from_numpy(vals, dist=dist)))
    w = x.copy(); w[w > 0] = vals
    same(c, w, f"a[a > 0] = distributed values {tag}")
    c[c > 1] = np.full(int((w > 1).sum()), 7, dtype=x.dtype)
    w[w > 1] = 7
    same(c, w, f"a[a > 1] = NumPy values {tag}")


def check_selections(x, dist, tag):
    a = dnp.from_numpy(x, dist=dist)
    same(native(f"nonzero {tag}", lambda: dnp.nonzero(a)), np.nonzero(x), f"nonzero {tag}")
    same(native(f"where {tag}", lambda: dnp.where(a > 0)), np.where(x > 0), f"where(cond) {tag}")
    same(native(f"argwhere {tag}", lambda: dnp.argwhere(a)), np.argwhere(x), f"argwhere {tag}")
    same(native(f"flatnonzero {tag}", lambda: dnp.flatnonzero(a)), np.flatnonzero(x), f"flatnonzero {tag}")
    same(dnp.extract(a > 0, a), np.extract(x > 0, x), f"extract {tag}")
    rows = x[column(x)] > 0
    same(native(f"compress {tag}", lambda: dnp.compress(rows, a, axis=0)), np.compress(rows, x, axis=0),
         f"compress(NumPy rows) {tag}")
    cond = a[column(x)] > 0
    same(native(f"compress dist {tag}", lambda: dnp.compress(cond, a, axis=0)), np.compress(rows, x, axis=0),
         f"compress(distributed rows) {tag}")
    flat = x.reshape(-1) > 0
    same(dnp.compress(dnp.from_numpy(flat, dist=dist), a), np.compress(flat, x), f"compress(flat) {tag}")
    if x.ndim > 1:
        cols = np.arange(x.shape[1]) % 2 == 0
        same(native(f"compress axis 1 {tag}", lambda: dnp.compress(cols, a, axis=1)), np.compress(cols, x, axis=1),
             f"compress(axis=1) {tag}")


for dist in DISTS:
    for x in SOURCES:
        tag = f"{x.shape} {dist}"
        check_masks(x, dist, tag)
        check_selections(x, dist, tag)
    print(f"rank {r}: ok {dist}", flush=True)
print(f"rank {r}: ALL OK ({checked[0]} checks)", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_masks_and_selections_with_ranks_holding_no_rows(run_mpi, kernel_cache, n):
    _run(run_mpi, kernel_cache, EMPTY_RANKS, n)


ROW_MASKS = """
def check_lazy_column(x, dist, tag):
    col = column(x)
    m = (x % 3 == 0)[col]
    a = dnp.from_numpy(x, dist=dist)
    same(native(f"get {tag}", lambda: a[(a % 3 == 0)[col]]), x[m], f"a[(a % 3 == 0)[:, 0]] {tag}")
    same(native(f"get ... {tag}", lambda: a[(a % 3 == 0)[col], ...]), x[m, ...], f"a[(a % 3 == 0)[:, 0], ...] {tag}")
    native(f"set {tag}", lambda: a.__setitem__((a % 3 == 0)[col], -1))
    w = x.copy(); w[m] = -1
    same(a, w, f"a[(a % 3 == 0)[:, 0]] = -1 {tag}")
    b = dnp.from_numpy(x, dist=dist)
    vals = np.arange(int(m.sum()) * int(np.prod(x.shape[1:]))).reshape((int(m.sum()),) + x.shape[1:]) + 100
    native(f"set values {tag}", lambda: b.__setitem__(((b % 3 == 0)[col], ...), dnp.from_numpy(vals)))
    w = x.copy(); w[m, ...] = vals
    same(b, w, f"a[(a % 3 == 0)[:, 0], ...] = distributed values {tag}")


def check_other_layouts(x, dist, tag):
    m = (x % 3 == 0)[column(x)]
    other = "cyclic" if dist == "block" else "block"
    for name, mask in (("replicated", dnp.from_numpy(m, dist="replicated")), (other, dnp.from_numpy(m, dist=other))):
        a = dnp.from_numpy(x, dist=dist)
        same(native(f"get {name} mask {tag}", lambda: a[mask]), x[m], f"a[{name} mask] {tag}")
        native(f"set {name} mask {tag}", lambda: a.__setitem__(mask, 9))
        w = x.copy(); w[m] = 9
        same(a, w, f"a[{name} mask] = 9 {tag}")


def check_fallbacks(x, dist, tag):
    a = dnp.from_numpy(x, dist=dist)
    v = a[1:]
    v[(v % 3 == 0)[column(x)]] = -2
    w = x.copy(); w[1:][(w[1:] % 3 == 0)[column(x)]] = -2
    same(a, w, f"a view's rows set by a mask {tag}")
    rep = dnp.from_numpy(x, dist="replicated")
    rep[dnp.from_numpy((x % 3 == 0)[column(x)], dist=dist)] = -3
    w = x.copy(); w[(w % 3 == 0)[column(x)]] = -3
    same(rep, w, f"a replicated array's rows set by a distributed mask {tag}")


for dist in DISTS:
    for shape in ((7, 4), (2, 4), (1, 4), (5, 2, 3)):
        x = np.arange(int(np.prod(shape))).reshape(shape)
        tag = f"{shape} {dist}"
        check_lazy_column(x, dist, tag)
        check_other_layouts(x, dist, tag)
        if shape[0] > 1:
            check_fallbacks(x, dist, tag)
    print(f"rank {r}: ok {dist}", flush=True)
a = dnp.arange(28).reshape(7, 4)
a[(a % 3 == 0)[:, 0]] = -1
x = np.arange(28).reshape(7, 4)
x[(x % 3 == 0)[:, 0]] = -1
same(a, x, "the reported case")
print(f"rank {r}: ALL OK ({checked[0]} checks)", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_row_masks_laid_out_otherwise_than_the_array(run_mpi, kernel_cache, n):
    _run(run_mpi, kernel_cache, ROW_MASKS, n)
