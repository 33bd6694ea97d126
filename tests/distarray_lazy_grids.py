"""SPMD program for tests/test_distarray_lazy_grids.py (1, 2 or 3 ranks): lazy coordinate grids
(workers/distarray/lazy_grids.py). Checked on every rank, each result against NumPy bit for bit:

* ``mgrid`` / ``meshgrid`` (xy and ij, 2 and 3 vectors; block, cyclic and block-cyclic) used in expressions,
  through views (slices, steps, reversed rows read from other ranks, fixed rows and columns, new axes), in
  reductions, copies, transposes, ``ravel``, ``.local`` and ``to_numpy``;
* a grid only read by elementwise operations allocates nothing (no local buffer, no fresh pooled buffer);
* a write materialises the grid: reads recorded before it see the old values, reads after it the new ones.

Prints ``rank R: NAME ok`` per check, then ``rank R: ALL OK``; a failing check raises.
"""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers import world
from spmd_checks import check, same_typed as same

comm = world()
rank, P = comm.Get_rank(), comm.Get_size()
ctx = dnp.context_for()
R = 4 * P + 3                          # uneven blocks
C = 3000                               # 24 KB rows: a rank's block is above the pool's 64 KiB minimum


def fresh():
    return dnp.stats()["buffers_allocated"]


def lazy(*arrays):
    return all(a._base.grid is not None and a._base.local is None for a in arrays)


# -- reading allocates nothing -----------------------------------------------------------------------
y, x = dnp.mgrid[-1:1:R * 1j, -1:1:C * 1j]
Y, X = np.mgrid[-1:1:R * 1j, -1:1:C * 1j]
check("mgrid is lazy", lazy(y, x) and ctx.lazy_grids >= 2)
f0 = fresh()
ph = dnp.where(x ** 2 + y ** 2 < 0.8, 0.2, 0.0)
ph = ph + dnp.where(np.abs(x + 0.4) + np.abs(y - 0.3) < 0.15, 1.0, 0.0)
s1, s0 = ph.sum(axis=1), ph.sum(axis=0)
ph.evaluate()
PH = np.where(X ** 2 + Y ** 2 < 0.8, 0.2, 0.0) + np.where(np.abs(X + 0.4) + np.abs(Y - 0.3) < 0.15, 1.0, 0.0)
check("expressions read the coordinates: the grids stay unallocated", lazy(y, x) and fresh() - f0 <= 1)
same("expression", ph, PH)
same("row sums", s1, PH.sum(axis=1))
# a sum over the distributed axis adds the ranks' partial sums (not NumPy's order): against the stored arrays'
same("column sums", s0, dnp.from_numpy(PH).sum(axis=0).to_numpy())
same("sum of a grid", y.sum(), np.asarray(dnp.from_numpy(Y).sum()))
same("grid reduced along rows", x.sum(axis=0), dnp.from_numpy(X).sum(axis=0).to_numpy())
same("copy", y.copy(), Y.copy())
z = dnp.zeros((R, C))
z[...] = x
same("assigned into another array", z, X)
check("still unallocated after reads, reductions and copies", lazy(y, x))

# -- views, messages, materialisation ----------------------------------------------------------------
same("strided view", y[1::2, 3::7] * 2.0, Y[1::2, 3::7] * 2.0)
same("reversed rows (messages)", y[::-1] - x, Y[::-1] - X)
same("shifted rows (messages)", y[1:, :] - y[:-1, :] + x[1:, :], Y[1:, :] - Y[:-1, :] + X[1:, :])
same("a fixed row", x[R // 2] + y[R - 1], X[R // 2] + Y[R - 1])
same("a fixed column", y[:, 7] * x[:, C - 1], Y[:, 7] * X[:, C - 1])
same("new axes", (y[:, None, :5] + 1.0), (Y[:, None, :5] + 1.0))
check("views read the coordinates", lazy(y, x))
same("a plain view gathered", y[2:, 10:20], Y[2:, 10:20])
same("transpose", x.T + 0.0, X.T + 0.0)
same("ravel", y.ravel(), Y.ravel())
same("whole grid gathered", y, Y)
check(".local materialises", np.array_equal(x.local, X[x.local_rows]) and not lazy(x) and not lazy(y))
same("after materialising", x * y, X * Y)

# -- writes ------------------------------------------------------------------------------------------
y, x = dnp.mgrid[0:R, 0:5]
Y, X = np.mgrid[0:R, 0:5]
before = y * 10
y[1, :] = 99
Y2 = Y.copy()
Y2[1, :] = 99
after = y * 10
check("a write materialises the grid", not lazy(y) and lazy(x))
same("read recorded before the write", before, Y * 10)
same("read recorded after the write", after, Y2 * 10)
same("written grid", y, Y2)
g, G = dnp.mgrid[0:R, 0:4], np.mgrid[0:R, 0:4]
g[0] += 1
G[0] += 1
same("written through the stacked grid", g, G)

# -- meshgrid: every distribution, xy and ij, 3 vectors ----------------------------------------------
a, b, c = np.linspace(-2, 3, R), np.arange(C // 100, dtype=np.float64) * 0.3, np.linspace(0, 1, 3)
for dist in ["block", "cyclic", ("block-cyclic", 2)]:
    for indexing in ("xy", "ij"):
        vecs = (b, a) if indexing == "xy" else (a, b)
        got, want = dnp.meshgrid(*vecs, indexing=indexing, dist=dist), np.meshgrid(*vecs, indexing=indexing)
        check(f"meshgrid {indexing} {dist} lazy", lazy(*got))
        u, v = got
        U, V = want
        same(f"meshgrid {indexing} {dist} expression", u * 2.0 - v ** 2, U * 2.0 - V ** 2)
        same(f"meshgrid {indexing} {dist} reversed", u[::-1, ::2] + v[:, ::-1][::-1, ::2],
             U[::-1, ::2] + V[:, ::-1][::-1, ::2])
        same(f"meshgrid {indexing} {dist} values", u, U)
    got, want = dnp.meshgrid(b, a, c, dist=dist), np.meshgrid(b, a, c)
    expr = got[0][:, ::-1] * got[1] - got[2][::-1]
    same(f"meshgrid 3 vectors {dist}", expr, want[0][:, ::-1] * want[1] - want[2][::-1])
    for k in range(3):
        same(f"meshgrid 3 vectors {dist} [{k}]", got[k], want[k])
k3, K3 = dnp.mgrid[0:R, 0:3, 1:2:4j], np.mgrid[0:R, 0:3, 1:2:4j]
same("mgrid 3-D as a whole", k3 * 2, K3 * 2)
same("mgrid 3-D rows", k3[2] - k3[0][:, ::-1, :], K3[2] - K3[0][:, ::-1, :])
print(f"rank {rank}: ALL OK", flush=True)
