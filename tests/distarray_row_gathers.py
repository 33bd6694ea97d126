"""Reads of single rows gathered to every rank (``a[k, j]``, ``a[k, j:]``, ``a[None, k, j:]``) reuse a pending gather
of the whole row only while neither the array nor the gathered copy is written (run SPMD by
tests/test_distarray_row_gathers.py under ``nbmpi run -n 2`` and ``-n 3``). Every result is compared with NumPy's
exactly (a wrong reuse reads a stale or another row); the count of recorded gathers shows whether a reuse happened.
Also ``argmax``/``argmin`` over strided views (each rank's rows taken as one run on a block layout).
Prints ``ok <section>`` per section on rank 0 and ``ALL OK`` at the end."""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray.context import context_for
from nbmpi.workers.distarray.elementwise import WHOLE_ROW_BYTES
from nbmpi.workers.distarray.graph import Replicate
from spmd_checks import checks, same, section, size

DISTS = ["block", "cyclic", ("block-cyclic", 2)]
ctx = context_for()


def gathers() -> int:
    """Gathers recorded since the last force point."""
    return sum(isinstance(t, Replicate) for t in ctx.pending)


x = np.arange(7 * 6, dtype=float).reshape(7, 6) * 1.5 - 4.0
for dist in DISTS:
    for k in (0, 3, 6):
        M = dnp.from_numpy(x, dist=dist)
        m = x.copy()
        # one gather of row k, reused twice (the rows read against distributed rows elsewhere)
        a, b, c = M[k, k % 6], M[:1, 1:] * 0.0 + M[k, 1:], M[:1, 2:] * 0.0 + M[None, k, 2:]
        assert gathers() == 1, (dist, k, [t.desc for t in ctx.pending])
        same(f"a[k, j], a[k, 1:], a[None, k, 2:] {dist} k={k}", a, m[k, k % 6])
        same(f"a[k, 1:] {dist} k={k}", b, m[:1, 1:] * 0.0 + m[k, 1:])
        same(f"a[None, k, 2:] {dist} k={k}", c, m[:1, 2:] * 0.0 + m[None, k, 2:])

        s = M[k, 2]
        M[k, 3] = 7.0                          # the array changes: the next read of row k gathers again
        m[k, 3] = 7.0
        t, u = M[k, 3], M[k, 2]
        assert gathers() == 2, (dist, k, [t.desc for t in ctx.pending])
        same(f"a[k, j] after a write to the row {dist} k={k}", t, m[k, 3])
        same(f"a[k, j] before the write {dist} k={k}", s, x[k, 2])
        same(f"a[k, j] after the write {dist} k={k}", u, m[k, 2])

        r0 = M[k, 0]
        r1 = M[(k + 1) % 7, 0]                 # another row: a gather of its own
        assert gathers() == 2
        same(f"two rows {dist} k={k}", r0 + r1, m[k, 0] + m[(k + 1) % 7, 0])

        v = M[k, 1]
        v += 1.0                               # the gathered copy changes: a later read of the row gathers again
        w = M[k, 1]
        same(f"a[k, j] += 1 {dist} k={k}", v, m[k, 1] + 1.0)
        same(f"a[k, j] after the copy changed {dist} k={k}", w, m[k, 1])

        M[k:, :] = M[k:, :] - M[k, :] * 0.5      # a row read inside an update of the same array
        m[k:, :] = m[k:, :] - m[k, :] * 0.5
        same(f"row update {dist} k={k}", M, m)
        same(f"row after the update {dist} k={k}", M[k, 1:] + M[k, 0], m[k, 1:] + m[k, 0])
section("a pending whole-row gather is reused only while nothing writes the array or the copy")

y = np.arange(5 * 3 * 4, dtype=np.int64).reshape(5, 3, 4)
for dist in DISTS:
    T = dnp.from_numpy(y, dist=dist)
    p, q = T[:1, 1] * 0 + T[2, 1], T[:1, :, 3] * 0 + T[2, :, 3]     # 3-D: rows of shape (3, 4), one gather
    assert gathers() == 1
    same(f"3-D a[i, j] {dist}", p, y[:1, 1] * 0 + y[2, 1])
    same(f"3-D a[i, :, l] {dist}", q, y[:1, :, 3] * 0 + y[2, :, 3])
    same(f"3-D a[i, j, l] {dist}", T[4, 2, 3] + T[4, 0, 0], y[4, 2, 3] + y[4, 0, 0])
    wide = WHOLE_ROW_BYTES // 8 + 3             # a row larger than the bound: only the part asked for is gathered
    zw = np.arange(2 * size * wide, dtype=float).reshape(2 * size, wide)
    W = dnp.from_numpy(zw, dist=dist)
    e1, e2 = W[1, 5], W[:1, 5:9] * 0.0 + W[1, 5:9]
    assert gathers() == 2 and all(t.out.base.shape[-1] < wide for t in ctx.pending if isinstance(t, Replicate))
    same(f"wide row a[k, j] {dist}", e1, zw[1, 5])
    same(f"wide row a[k, j:l] {dist}", e2, zw[:1, 5:9] * 0.0 + zw[1, 5:9])
section("3-D rows and rows larger than the whole-row bound")

for dist in DISTS:
    for k in range(7):
        M = dnp.from_numpy(x, dist=dist)
        U = dnp.zeros((7, 6))
        v = np.linspace(-1.0, 1.0, 6 - k % 6)
        r = M[k, k % 6:] - v * M[(k + 2) % 7, k % 6:]     # rows only: computed by the owner of row k, no gather
        U[k, k % 6:] = r
        assert gathers() == 0, (dist, k, [t.desc for t in ctx.pending])
        o = x[k, k % 6:] - v * x[(k + 2) % 7, k % 6:]
        u = np.zeros((7, 6))
        u[k, k % 6:] = o
        same(f"a[k, j:] - v * a[k+2, j:] stored in u[k, j:] {dist} k={k}", U, u)
        same(f"a[k, j:] - v * a[k+2, j:] read back {dist} k={k}", r + 1.0, o + 1.0)
        U[(k + 1) % 7, k % 6:] = r * 2.0          # stored into a row of another rank
        u[(k + 1) % 7, k % 6:] = o * 2.0
        same(f"a result over rows stored into another row {dist} k={k}", U, u)
        same(f"a result over rows against distributed rows {dist} k={k}", M[1:3, k % 6:] + r, x[1:3, k % 6:] + o)
section("a result over fixed rows only is computed by its first row's owner")
z = np.cos(np.arange(17 * 4, dtype=float) * 0.7).reshape(17, 4)
for dist in DISTS:
    Z = dnp.from_numpy(z, dist=dist)
    for sl in (slice(None), slice(3, None), slice(None, None, -1), slice(15, 1, -3), slice(2, 16, 2)):
        for col in (0, slice(1, 3)):
            same(f"argmax(|Z[{sl}, {col}]|) {dist}", int(dnp.argmax(dnp.abs(Z[sl, col]))), np.argmax(np.abs(z[sl, col])))
            same(f"argmin(Z[{sl}, {col}]) {dist}", int(dnp.argmin(Z[sl, col])), np.argmin(z[sl, col]))
section("argmax and argmin over strided views")
print(f"ALL OK ({checks[0]} checks on {size} ranks)", flush=True) if ctx.rank == 0 else None
