"""Writes of some columns of rows and reads of other columns of the same rows, recorded into one force point, against
NumPy on every distribution (run SPMD by tests/test_distarray_column_conflicts.py under ``nbmpi run -n 1``, ``-n 2``
and ``-n 3``).

The dependency index orders two accesses of a base only where their rows and columns overlap
(``workers/distarray/dependencies.py``): a send or a computation reading columns of a row that the flush does not
write runs without waiting for the writes of its other columns. Every case here records a loop of such statements
before one force point (with and without latency hiding) and compares the result exactly: integer operands, so
every order of a sum gives NumPy's bits, and a read ordered before a write of its columns (or after a later one)
changes the result. Prints ``ok <section>`` per section on rank 0 and ``ALL OK`` at the end."""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray.context import context_for
from spmd_checks import checks, same, section, size

DISTS = ["block", "cyclic", ("block-cyclic", 2)]
ctx = context_for()
rng = np.random.default_rng(11)
n = 12

am = rng.integers(-3, 4, (n, n))
for dist in DISTS:
    for hiding in (True, False):
        dnp.configure(latency_hiding=hiding)
        X = dnp.from_numpy(am, dist=dist)
        x = am.copy()
        dnp.evaluate()
        for k in range(1, n - 1):
            X[k, k:] = X[k, :n - k] * 2 - X[k - 1, k:]        # columns k.. of row k from its columns ..n-k
            x[k, k:] = x[k, :n - k] * 2 - x[k - 1, k:]
            # its first columns from the ones just written
            X[k, :k] = X[k, k:2 * k] + 1 if 2 * k <= n else X[k, :k] - 1
            x[k, :k] = x[k, k:2 * k] + 1 if 2 * k <= n else x[k, :k] - 1
            X[k + 1:, k] = X[k + 1:, k - 1] - X[k, k]         # one column of the rows below, from the row above
            x[k + 1:, k] = x[k + 1:, k - 1] - x[k, k]
            X[k, 0] = X[k, n - 1] + X[k + 1, 0]
            x[k, 0] = x[k, n - 1] + x[k + 1, 0]
        assert len(ctx.pending) > 4 * (n - 2), len(ctx.pending)   # one force point for the whole loop
        same(f"elementwise writes and reads of columns of rows {dist} hiding={hiding}", X, x)
dnp.configure(latency_hiding=True)
section("elementwise writes of some columns of a row and reads of others")

for dist in DISTS:
    for hiding in (True, False):
        dnp.configure(latency_hiding=hiding)
        A = dnp.from_numpy(am, dist=dist)
        L = dnp.from_numpy(np.identity(n, dtype=np.int64), dist=dist)
        U = dnp.zeros((n, n), dtype=np.int64, dist=dist)
        l, u = np.identity(n, dtype=np.int64), np.zeros((n, n), dtype=np.int64)
        dnp.evaluate()
        for k in range(n):          # LU's steps (remainders keep the integers small): L[k, :k] is read while
            U[k, k:] = (A[k, k:] - L[k, :k] @ U[:k, k:]) % 5     # L's later columns of row k are written
            u[k, k:] = (am[k, k:] - l[k, :k] @ u[:k, k:]) % 5
            L[k + 1:, k] = (A[k + 1:, k] - L[k + 1:, :k] @ U[:k, k]) % 7 - 3
            l[k + 1:, k] = (am[k + 1:, k] - l[k + 1:, :k] @ u[:k, k]) % 7 - 3
        same(f"LU steps: U {dist} hiding={hiding}", U, u)
        same(f"LU steps: L {dist} hiding={hiding}", L, l)
        h = n // 2                  # the products of the first columns of each row, read while later ones change
        P = dnp.zeros((n, n), dtype=np.int64, dist=dist)
        p = np.zeros((n, n), dtype=np.int64)
        for k in range(h, n - 1):
            P[k, :] = L[k, :h] @ U[:h, :]
            p[k, :] = l[k, :h] @ u[:h, :]
            L[k:, k] = L[k:, k] + P[k, k]
            l[k:, k] = l[k:, k] + p[k, k]
            L[k + 1, :h] = L[k + 1, :h] * 2
            l[k + 1, :h] = l[k + 1, :h] * 2
        same(f"products of first columns {dist} hiding={hiding}", P, p)
        same(f"columns written around them {dist} hiding={hiding}", L, l)
dnp.configure(latency_hiding=True)
section("LU's steps: products reading columns of a row while other columns are written")

tm = rng.integers(-4, 5, (7, 6, 5))
for dist in DISTS:
    for hiding in (True, False):
        dnp.configure(latency_hiding=hiding)
        T = dnp.from_numpy(tm, dist=dist)
        t = tm.copy()
        S = dnp.from_numpy(am, dist=dist)
        s = am.copy()
        dnp.evaluate()
        for k in range(6):
            T[k, 1:3, :] = T[k, 3:5, :] + T[k + 1, 0, :]        # axis-1 ranges of a 3-D base
            t[k, 1:3, :] = t[k, 3:5, :] + t[k + 1, 0, :]
            T[k:, 2, 1::2] = T[k:, 1, ::2][:, :2] - 1            # a column with a strided last axis
            t[k:, 2, 1::2] = t[k:, 1, ::2][:, :2] - 1
            T[k + 1, ::-2, 0] = T[k, 1::2, 4] * 3                 # reversed strided columns
            t[k + 1, ::-2, 0] = t[k, 1::2, 4] * 3
            S[k, ::3] = S[k, 1::3] + S[k, 2::3]                  # strided columns: their hulls overlap
            s[k, ::3] = s[k, 1::3] + s[k, 2::3]
            S[k + 1:, 5:9] = S[k:-1, 1:5] - S[k, 9]
            s[k + 1:, 5:9] = s[k:-1, 1:5] - s[k, 9]
        same(f"n-D and strided columns: T {dist} hiding={hiding}", T, t)
        same(f"n-D and strided columns: S {dist} hiding={hiding}", S, s)
dnp.configure(latency_hiding=True)
section("column ranges of n-D bases, strided and reversed columns")
print(f"ALL OK ({checks[0]} checks on {size} ranks)", flush=True) if ctx.rank == 0 else None
