"""SPMD program for tests/test_distarray_lazy_joins.py (1, 2 or 3 ranks): lazy concatenate results
(workers/distarray/lazy_joins.py). Checked on every rank, each result against NumPy bit for bit:

* gathered (every rank, one root), a concatenate of whole block, cyclic, block-cyclic, replicated parts, mixed
  dtypes and lazy grids is never stored (no local buffer, no fresh pooled buffer for whole block parts); a
  concatenate of views or of a lazy concatenate is stored (recorded copies);
* used otherwise (an expression, a slice gathered, ``.local``, a write, a reshape) it is materialised;
* a part written after the concatenate (a recorded write, ``.local``, a mask assignment, a write to the array a
  ravelled part shares its buffer with) leaves the result's values as they were;
* a lazy result dying unmaterialised leaves the context's counters as they were;
* a part whose buffer the user holds (``.local``, ``from_local``) makes the concatenate stored, and a lazy join
  materialised at the flush threshold, in the middle of recording another operation, flushes nothing then.

Prints ``rank R: NAME ok`` per check, then ``rank R: ALL OK``; a failing check raises.
"""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray.creation import from_local
from nbmpi.workers import world
from spmd_checks import check, same_typed as same

comm = world()
rank, P = comm.Get_rank(), comm.Get_size()
ctx = dnp.context_for()
R, C = 4 * P + 3, 3000                 # uneven blocks; a rank's block is above the pool's 64 KiB minimum


def lazy(r):
    return r._base.join is not None and r._base.local is None


def fresh():
    return dnp.stats()["buffers_allocated"]


A = np.arange(R * C, dtype=np.float64).reshape(R, C) * 0.25
B = np.arange(5 * C, dtype=np.float64).reshape(5, C) - 7.0
I = np.arange(3 * C, dtype=np.int64).reshape(3, C)
shared0, joins0 = ctx.shared, ctx.lazy_joins

# -- gathered, never stored ----------------------------------------------------------------------------
for dist in ["block", "cyclic", ("block-cyclic", 2), "replicated"]:
    a, b = dnp.from_numpy(A) * 2.0, dnp.from_numpy(B, dist=dist) + 1.0
    i = dnp.from_numpy(I, dist=dist)
    a.evaluate(), b.evaluate()
    f0 = fresh()
    r = dnp.concatenate([a, b, a, i])
    want = np.concatenate([A * 2.0, B + 1.0, A * 2.0, I])
    check(f"{dist}: lazy", lazy(r))
    same(f"{dist}: gathered", r, want)
    got = r.to_numpy(root=P - 1)
    check(f"{dist}: gathered to a root",
          (got is None) == (rank != P - 1) and (got is None or np.array_equal(got, want)))
    same(f"{dist}: numpy.asarray", np.asarray(r), want)
    check(f"{dist}: never stored", lazy(r))
    views = dnp.concatenate([a[1:3], b[::-1]])
    same(f"{dist}: views joined (stored)", views, np.concatenate([(A * 2.0)[1:3], (B + 1.0)[::-1]]))
    check(f"{dist}: a join of views is stored", not lazy(views))
    nested = dnp.concatenate([r, a])
    check(f"{dist}: a join of a lazy join is stored, the inner one materialised by its copy",
          nested._base.join is None and r._base.join is None)
    same(f"{dist}: nested", nested, np.concatenate([want, A * 2.0]))
    r = dnp.concatenate([a, b, a, i])
    f0 = fresh()
    whole = dnp.concatenate([a, a + 1.0, a])
    same(f"{dist}: whole block parts", whole, np.concatenate([A * 2.0, A * 2.0 + 1.0, A * 2.0]))
    check(f"{dist}: whole block parts gathered without a fresh buffer", lazy(whole) and fresh() - f0 <= 1)
    same(f"{dist}: used in an expression", r * 3.0 - 1.0, want * 3.0 - 1.0)
    check(f"{dist}: materialised by the expression", r._base.join is None)
    same(f"{dist}: gathered after materialising", r, want)
del a, b, i, r, nested, whole, views
check("counters back after the arrays died", ctx.shared == shared0 and ctx.lazy_joins == joins0)

# -- other uses materialise -----------------------------------------------------------------------------
a, b = dnp.from_numpy(A), dnp.from_numpy(B)
want = np.concatenate([A, B])
r = dnp.concatenate([a, b])
same("a slice of it", r[R - 2:R + 3, ::7], want[R - 2:R + 3, ::7])
r = dnp.concatenate([a, b])
loc = r.local
check(".local", not lazy(r) and np.array_equal(loc, want[r.local_rows]))
r = dnp.concatenate([a, b])
r[0, :] = -1.0
w2 = want.copy()
w2[0, :] = -1.0
same("written", r, w2)
r = dnp.concatenate([a, b])
same("reshaped", r.reshape(-1), want.reshape(-1))

# -- parts written after the concatenate --------------------------------------------------------------
a, b = dnp.from_numpy(A) + 0.0, dnp.from_numpy(B) + 0.0
r = dnp.concatenate([a, b])
a[1, :] = 99.0
same("recorded write to a part", r, want)
same("the part written", a[1], np.full(C, 99.0))
a, b = dnp.from_numpy(A) + 0.0, dnp.from_numpy(B) + 0.0
r = dnp.concatenate([b, a])
a.local[:] = -5.0
same(".local write to a part", r, np.concatenate([B, A]))
a, b = dnp.from_numpy(A) + 0.0, dnp.from_numpy(B) + 0.0
r = dnp.concatenate([a, b])
b[b > 0] = 0.0
same("mask write to a part", r, want)
a = dnp.from_numpy(A) + 0.0
flat = a.ravel()                       # shares a's buffer copy-on-write
r = dnp.concatenate([flat, flat])
check("a ravelled array twice: lazy", lazy(r))
a[2, 5] = 1e9
same("write to the array a ravelled part shares", r, np.concatenate([A.ravel(), A.ravel()]))

# nested joins (the outer one stored, reading the inner one); values no earlier array had (a buffer a dead
# array left in the pool must not hold the expected values)
A3, B5 = A * 3.0 + 1.0, B * 5.0
w35 = np.concatenate([A3, B5])
a, b = dnp.from_numpy(A) * 3.0 + 1.0, dnp.from_numpy(B) * 5.0
r = dnp.concatenate([a, b])
nested = dnp.concatenate([r, a])
a[0, :] = 7.0
same("nested: a part of the inner join written", nested, np.concatenate([w35, A3]))
same("nested: the inner join", r, w35)
a, b = dnp.from_numpy(A) * 3.0 - 1.0, dnp.from_numpy(B) * 5.0 - 1.0
r = dnp.concatenate([a, b])
nested = dnp.concatenate([b, r])
r[0, :] = 7.0
r0 = np.concatenate([A3 - 2.0, B5 - 1.0])
w2 = r0.copy()
w2[0, :] = 7.0
same("nested: the inner join written", nested, np.concatenate([B5 - 1.0, r0]))
same("nested: the inner join after its write", r, w2)

# -- lazy grids as parts, the xray program's shape ------------------------------------------------------
y, x = dnp.mgrid[-1:1:R * 1j, -1:1:C * 1j]
Y, X = np.mgrid[-1:1:R * 1j, -1:1:C * 1j]
r = dnp.concatenate([y, x])
y[0, 0] = 5.0
same("grids as parts, one written after", r, np.concatenate([Y, X]))
y, x = dnp.mgrid[-1:1:R * 1j, -1:1:C * 1j]
ph = dnp.where(x ** 2 + y ** 2 < 0.8, 0.2, 0.0)
rows, cols = np.exp(-ph.sum(axis=1) * 0.01), np.exp(-ph.sum(axis=0) * 0.01)
back = -np.log(rows)[:, np.newaxis] - np.log(cols)[np.newaxis, :]
PH = np.where(X ** 2 + Y ** 2 < 0.8, 0.2, 0.0)
ROWS, COLS = np.exp(-PH.sum(axis=1) * 0.01), np.exp(-dnp.from_numpy(PH).sum(axis=0).to_numpy() * 0.01)
BACK = -np.log(ROWS)[:, np.newaxis] - np.log(COLS)[np.newaxis, :]
f0 = fresh()
r = np.concatenate([rows, cols, back.ravel()])
same("xray-like program", r, np.concatenate([ROWS, COLS, BACK.ravel()]))
check("xray-like program: result never stored", lazy(r) and fresh() == f0)
for dist in ["block", "cyclic", ("block-cyclic", 2)]:
    # the user holds a part's buffer (.local, from_local) before the join: its direct writes are unseen, so the
    # join is stored (its copies evaluated at the next force point) and keeps the values from before the write
    A1 = np.arange(4 * P + 3, dtype=np.float64) + 1.0
    B1 = np.arange(5, dtype=np.float64) * 10.0
    a, b = dnp.from_numpy(A1, dist=dist), dnp.from_numpy(B1)
    loc = a.local
    r = dnp.concatenate([b, a])
    check(f"{dist}: a join of a part the user holds (.local) is stored", not lazy(r))
    float(b.sum())
    loc[:] = -7.0
    same(f"{dist}: a part written through an earlier .local", r, np.concatenate([B1, A1]))
    held = np.ascontiguousarray(a.local).copy()
    c = from_local(held, a)
    r = dnp.concatenate([b, c])
    want = np.concatenate([B1, c.to_numpy()])
    float(b.sum())
    held[:] = -9.0
    same(f"{dist}: a part over from_local memory written by the user", r, want)
    # materialised while another operation is being recorded, at the flush threshold: no flush in between
    # (it would take that operation's first temporaries for dead: v @ r records v's gather first)
    A2 = np.arange(R * 6, dtype=np.float64).reshape(R, 6) % 7 - 3.0
    B2 = np.arange(30, dtype=np.float64).reshape(5, 6) % 5 - 2.0
    V2 = (np.arange(R + 5, dtype=np.float64) % 4) - 1.5
    M2 = np.arange(R, dtype=np.float64) % 3
    for threshold in (2, 3):
        dnp.configure(threshold=threshold)
        try:
            r = dnp.concatenate([dnp.from_numpy(A2), dnp.from_numpy(B2)])
            same(f"{dist}: threshold {threshold}: v @ (a lazy join)", dnp.from_numpy(V2, dist=dist) @ r,
                 V2 @ np.concatenate([A2, B2]))
            m = dnp.from_numpy(M2, dist=dist)
            r = dnp.concatenate([m, dnp.from_numpy(B1)])
            m[m > 1] = -9.0
            M3 = M2.copy()
            M3[M3 > 1] = -9.0
            same(f"{dist}: threshold {threshold}: a mask write to a part", m, M3)
            same(f"{dist}: threshold {threshold}: the join keeps the old values", r, np.concatenate([M2, B1]))
        finally:
            dnp.configure(threshold=1000)
print(f"rank {rank}: ALL OK", flush=True)
