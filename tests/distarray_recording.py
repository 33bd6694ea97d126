"""The recording path's shortcuts give the results the general path gives (run SPMD by
tests/test_distarray_recording.py under ``nbmpi run`` on 1, 2 and 3 ranks): basic views taken by the plain
index pass, results laid out with shared distributions (``elementwise.dist_of``/``rows_of``: compact results of
small views, replicated gathers), leaves and row spaces computed once per operation (aligned operands, row
broadcasts gathered first, overlapping assignments through a temporary), dtype resolution cached per key. Loops
like the pivot steps of Gaussian elimination and LU (views whose offsets change every step) on block, cyclic and
block-cyclic rows; every result compared with NumPy's bit for bit (LU's products, reductions, to rounding; a
wrong reuse of a layout or a view would read other rows on some rank count). Also: the texts made lazily say what
they said. Prints ``ok <section>`` per section
on rank 0 and ``ALL OK`` at the end."""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray.context import context_for
from nbmpi.workers.distarray.graph import Assign, Replicate
from spmd_checks import expect, section, size

DISTS = ["block", "cyclic", ("block-cyclic", 2)]
ctx = context_for()
checks = [0]


def same(name, got, want):
    g = got.to_numpy() if isinstance(got, dnp.DistArray) else np.asarray(got)
    assert g.shape == np.shape(want) and g.dtype == np.asarray(want).dtype, (name, g.shape, g.dtype, np.shape(want))
    assert np.array_equal(g, want, equal_nan=True), f"{name}: got {g}, NumPy gives {want}"
    checks[0] += 1


n = 11
base = np.cos(np.outer(np.arange(n), np.arange(n + 1)) * 0.37) + n * np.eye(n, n + 1)
for dist in DISTS:
    M = dnp.from_numpy(base, dist=dist)
    m = base.copy()
    for k in range(n - 1):                        # elimination steps: every view's offsets change
        p = k + int(dnp.argmax(dnp.abs(M[k:, k])))
        q = k + int(np.argmax(np.abs(m[k:, k])))
        assert p == q, (dist, k, p, q)
        if p != k:
            M[[k, p]] = M[[p, k]]
            m[[k, p]] = m[[p, k]]
        f = M[k + 1:, k] / M[k, k]
        fm = m[k + 1:, k] / m[k, k]
        M[k + 1:, k:] = M[k + 1:, k:] - dnp.outer(f, M[k, k:])
        m[k + 1:, k:] = m[k + 1:, k:] - np.outer(fm, m[k, k:])
        if k % 3 == 0:
            same(f"elimination step {k} {dist}", M, m)
    same(f"elimination {dist}", M, m)
section("elimination steps on views whose offsets change")

for dist in DISTS:
    A = dnp.from_numpy(base[:, :n], dist=dist)
    a = base[:, :n].copy()
    L, U = dnp.identity(n, dist=dist), dnp.zeros((n, n), dist=dist)
    lm, um = np.identity(n), np.zeros((n, n))
    for k in range(n):
        U[k, k:] = A[k, k:] - L[k, :k] @ U[:k, k:]
        um[k, k:] = a[k, k:] - lm[k, :k] @ um[:k, k:]
        L[k + 1:, k] = (A[k + 1:, k] - L[k + 1:, :k] @ U[:k, k]) / U[k, k]
        lm[k + 1:, k] = (a[k + 1:, k] - lm[k + 1:, :k] @ um[:k, k]) / um[k, k]
    # the products are reductions: equal to rounding (their order differs from NumPy's dot), not bit for bit
    np.testing.assert_allclose(L.to_numpy(), lm, rtol=1e-12, atol=1e-14, err_msg=f"LU: L {dist}")
    np.testing.assert_allclose(U.to_numpy(), um, rtol=1e-12, atol=1e-14, err_msg=f"LU: U {dist}")
    checks[0] += 2
section("LU recorded whole")

x = np.arange(13 * 5, dtype=np.float64).reshape(13, 5) * 0.25 - 3.0
for dist in DISTS:
    X = dnp.from_numpy(x, dist=dist)
    for sl in (slice(0, 2), slice(9, None), slice(1, 12, 5), slice(None, None, -3), slice(12, 3, -4), slice(4, 4)):
        # a small view: its result gets a compact base of its own row count (shared distribution)
        same(f"X[{sl}] * 2 + 1 {dist}", X[sl] * 2.0 + 1, x[sl] * 2.0 + 1)
        same(f"X[{sl}, 1:4] - X[{sl}, :3] {dist}", X[sl, 1:4] - X[sl, :3], x[sl, 1:4] - x[sl, :3])
        same(f"X[{sl}][::-1, ::2] {dist}", X[sl][::-1, ::2] + 0.5, x[sl][::-1, ::2] + 0.5)
    same(f"row broadcast X + X[3] {dist}", X + X[3], x + x[3])
    same(f"row broadcast X[2:7] * X[None, 5, :] {dist}", X[2:7] * X[None, 5, :], x[2:7] * x[None, 5, :])
    same(f"column X[:, 2] / X[0, 2] {dist}", X[:, 2] / X[0, 2], x[:, 2] / x[0, 2])
    same(f"int and bool dtypes {dist}", (X > 0) + 1, (x > 0) + 1)
    same(f"int / int {dist}", X.astype(np.int32) // 3 + X.astype(np.int64) / 2, x.astype(np.int32) // 3 +
         x.astype(np.int64) / 2)
    same(f"float32 with weak scalars {dist}", X.astype(np.float32) * 3 + 0.1, x.astype(np.float32) * 3 + 0.1)
    Y = dnp.from_numpy(x, dist=dist)
    y = x.copy()
    Y[1:] = Y[:-1] + Y[1:]                     # overlapping read of the target: through a temporary
    y[1:] = y[:-1] + y[1:]
    Y[:, 1:] += Y[:, :-1]
    y[:, 1:] += y[:, :-1]
    Y[2] = Y[5] * 2.0                          # a single row stored into a row of one rank
    y[2] = y[5] * 2.0
    np.multiply(Y[3:9], Y[0], out=Y[3:9])
    np.multiply(y[3:9], y[0], out=y[3:9])
    Y[..., 0] = -1.5
    y[..., 0] = -1.5
    Y[4, ...] = Y[4, ::-1]
    y[4, ...] = y[4, ::-1]
    same(f"assignments {dist}", Y, y)
    for key in ((slice(2, 9), 1), (-1,), (3, -2), (slice(None), slice(None, None, 2)), (None, 4, slice(1, 3)),
                (Ellipsis, 3), (slice(5, 1, -1), None, slice(None))):
        same(f"X[{key}] + 0 {dist}", X[key] + 0.0, x[key] + 0.0)
section("small views, row broadcasts, overlapping assignments, dtypes")

for dist in DISTS:       # a loop of one-reader temporaries, forced once: no RecursionError, NumPy's values
    a, am = dnp.arange(7.0, dist=dist), np.arange(7.0)
    for _ in range(500):
        a, am = a + 1, am + 1
    same(f"500 chained additions {dist}", a, am)
    b, bm = dnp.from_numpy(np.linspace(0, 1, 13).reshape(13, 1) * np.ones((13, 2)), dist=dist), None
    bm = b.to_numpy()
    for _ in range(700):
        b, bm = np.sqrt(b * 1.01 + 0.5), np.sqrt(bm * 1.01 + 0.5)
    same(f"700 chained steps of three operations {dist}", b, bm)
    same(f"sum over a chain {dist}", (a * 2 + 1).sum(), (am * 2 + 1).sum())
section("long chains of one-reader temporaries")

for dist in DISTS:
    X = dnp.from_numpy(x, dist=dist)
    expect("index out of range", IndexError, lambda: X[13], ["index 13 is out of bounds for axis 0 with size 13"])
    expect("index out of range 2", IndexError, lambda: X[2, -6], ["index -6 is out of bounds for axis 1 with size 5"])
    expect("index out of range, general pass", IndexError, lambda: X[None, 2, -6],
           ["index -6 is out of bounds for axis 1 with size 5"])
    expect("a float index (NumPy's IndexError)", IndexError, lambda: X[1.5], ["only integers, slices"])
    expect("item() of many elements (NumPy's ValueError)", ValueError, lambda: X.item(),
           ["can only convert an array of size 1 to a Python scalar"])
    expect("float() of many elements (NumPy's TypeError)", TypeError, lambda: float(X),
           ["only 0-dimensional arrays can be converted to Python scalars"])
    expect("too many indices", IndexError, lambda: X[1, 2, 3], ["too many indices for array"])
    expect("too many indices on a row", IndexError, lambda: X[1][9, 2], ["too many indices for array"])
    expect("too many indices past a fixed axis", IndexError, lambda: X[:, 1][20, 0], ["too many indices for array"])
    same(f"boolean scalar index (NumPy's new axis) {dist}", X[True, 1], x[True, 1])
    expect("no loop", TypeError, lambda: X & X, ["bitwise_and", "not supported for the input types"])   # NumPy's text
    expect("broadcast", ValueError, lambda: X[1:4] + X[:, 1:3], ["could not be broadcast together"])
    ctx.flush("test")
    gathered = X + X[3]                    # a row broadcast: one gather, its text made when asked for
    texts = [t.desc for t in ctx.pending if isinstance(t, Replicate)]
    assert any(s.startswith("gather array#") and "[3, 0:5] to every rank for array#" in s and "= add(array#" in s
               and "(gathers its whole row array#" in s for s in texts), texts
    Y = dnp.from_numpy(x, dist=dist)
    Y[1:] = Y[:-1]
    assert any("(into a temporary: the value overlaps the target)" in t.desc for t in ctx.pending
               if isinstance(t, Assign)), [t.desc for t in ctx.pending]
    same(f"gathered {dist}", gathered, x + x[3])
    same(f"overlap {dist}", Y, np.concatenate([x[:1], x[:-1]]))
section("messages and texts")
print(f"ALL OK ({checks[0]} checks on {size} ranks)", flush=True) if ctx.rank == 0 else None
