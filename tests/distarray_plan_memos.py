"""Elementwise plans built on a miss share memoised parts: each array's addressing (``elementwise.leaf_meta``, by
the view, base kind, dtype, loop shape, reduced axis and alignment) and the row plan (``row_runs.row_plan``, by
the distributions, view rows, rank). Run SPMD by tests/test_distarray_plan_memos.py under ``nbmpi run -n 1``,
``-n 2`` and ``-n 3``: pivot-step loops over views that move every step (the memos are hit across the groups of a
step) mixing block, cyclic and block-cyclic arrays, every result compared with NumPy's exactly (a wrong reuse
addresses other elements or other rows). Prints ``ok <section>`` per section on rank 0 and ``ALL OK`` at the end."""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray import row_runs
from nbmpi.workers.distarray.context import context_for
from nbmpi.workers.distarray.operations import elementwise
from spmd_checks import checks, same, section, size

DISTS = ["block", "cyclic", ("block-cyclic", 2)]
ctx = context_for()


def close(name, got, want):
    """A sum over rows on several ranks adds the ranks' partial sums: NumPy's value up to rounding."""
    g = got.to_numpy()
    assert g.shape == np.shape(want) and np.allclose(g, want, rtol=1e-13, atol=0), f"{name}: got {g}, NumPy {want}"
    checks[0] += 1


n = 11
i = np.arange(n, dtype=float)
a0 = np.cos(np.outer(i, i + 1.0) * 0.37) + n * np.eye(n)
b0 = np.sin(np.add.outer(i, 2 * i)) * 0.5
for da in DISTS:
    for db in DISTS:
        A, B = dnp.from_numpy(a0, dist=da), dnp.from_numpy(b0, dist=db)
        a, b = a0.copy(), b0.copy()
        for k in range(n - 1):                 # gauss-like: every view moves with k; A and B laid out differently
            f = A[k + 1:, k] / A[k, k]
            fk = a[k + 1:, k] / a[k, k]
            A[k + 1:, k:] = A[k + 1:, k:] - dnp.outer(f, A[k, k:])
            a[k + 1:, k:] = a[k + 1:, k:] - np.outer(fk, a[k, k:])
            B[k + 1:, k:] = B[k + 1:, k:] * 0.5 + A[k + 1:, k:]           # same rows, another layout
            b[k + 1:, k:] = b[k + 1:, k:] * 0.5 + a[k + 1:, k:]
            B[k:, :n - k] = B[k:, :n - k] - A[::-1][k:, k:]                 # reversed rows of A, shifted columns
            b[k:, :n - k] = b[k:, :n - k] - a[::-1][k:, k:]
            if k % 3 == 0:
                same(f"pivot step {k} A {da} B {db}", A, a)
                same(f"pivot step {k} B {da} B {db}", B, b)
        same(f"after the loop A {da} B {db}", A, a)
        same(f"after the loop B {da} B {db}", B, b)
assert elementwise._META_MEMO and row_runs._MEMO, "the memos were not used"
section("pivot steps over moving views, mixed layouts")

for da in DISTS:
    X = dnp.from_numpy(a0, dist=da)
    x = a0.copy()
    for k in range(n - 1):                     # the same views as rows, as reductions and transposed-like reads
        s = dnp.sum(X[k:, k:], axis=1)
        sx = np.sum(x[k:, k:], axis=1)
        same(f"sum over moving view axis 1 k={k} {da}", s, sx)
        t = dnp.sum(X[k:, k:] * 2.0, axis=0)
        tx = np.sum(x[k:, k:] * 2.0, axis=0)
        close(f"sum over moving view axis 0 k={k} {da}", t, tx)
        X[k:, k] = X[k:, k] + X[k, k:]          # a column of rows k.. plus the gathered row k
        x[k:, k] = x[k:, k] + x[k, k:]
        X[k + 1:, None, k] = X[k + 1:, None, k] * 1.5
        x[k + 1:, None, k] = x[k + 1:, None, k] * 1.5
    same(f"after the loop {da}", X, x)
section("reductions and new axes over moving views")
n = 13
c0 = np.cos(np.outer(i2 := np.arange(n, dtype=float), i2 + 0.5) * 0.29) + n * np.eye(n)
for da in DISTS:                               # aligned local groups over moving windows: one plan, rebound
    C, c = dnp.from_numpy(c0, dist=da), c0.copy()
    R = dnp.from_numpy(c0[:, ::-1].copy(), dist=da)
    r = c0[:, ::-1].copy()
    before = ctx.stats["plans_rebound"]
    for k in range(n - 1):
        C[k + 1:, k:] = C[k + 1:, k:] * 0.75 - R[k + 1:, k:] + C[k + 1:, n - 1 - k, None]
        c[k + 1:, k:] = c[k + 1:, k:] * 0.75 - r[k + 1:, k:] + c[k + 1:, n - 1 - k, None]
        R[k:, 1:n - k] = R[k:, 1:n - k] + 0.5 * C[k:, k:n - 1]      # other column offsets, same shape class
        r[k:, 1:n - k] = r[k:, 1:n - k] + 0.5 * c[k:, k:n - 1]
        R[k:, ::3] = R[k:, ::3] * 1.25 + C[k:, :n:3]                # strided columns
        r[k:, ::3] = r[k:, ::3] * 1.25 + c[k:, :n:3]
        w = 3 if k % 2 and k + 3 <= n else 1                        # a column operand broadcast every other step
        R[k:, 0:3] = R[k:, 0:3] + C[k:, k:k + w] * 0.125
        r[k:, 0:3] = r[k:, 0:3] + c[k:, k:k + w] * 0.125
        R[k:, 0:2] = R[k:, 2:4] * 2.0 - C[k:, 4:6]                  # same rows and program, other columns:
        r[k:, 0:2] = r[k:, 2:4] * 2.0 - c[k:, 4:6]
        R[k:, 6:8] = R[k:, 8:10] * 2.0 - C[k:, 10:12]               # one plan, two bindings in one step
        r[k:, 6:8] = r[k:, 8:10] * 2.0 - c[k:, 10:12]
        if k % 2 == 0:
            same(f"moving windows k={k} {da}", C, c)
            same(f"moving windows R k={k} {da}", R, r)
    same(f"moving windows after the loop C {da}", C, c)
    same(f"moving windows after the loop R {da}", R, r)
    assert ctx.stats["plans_rebound"] > before, ("no aligned local plan was rebound", da)
    tail = C[n - 3:, 0] * 2.0                  # a small result over few rows stays on its operand's rows
    assert tail.dist.key == C.dist.key, ("a small result over few rows was laid out apart", tail.dist, C.dist)
    same(f"small result over few rows {da}", tail, c[n - 3:, 0] * 2.0)
section("aligned local plans rebound over moving windows")
n = 15
m0 = np.triu(np.add.outer(np.arange(n), np.arange(n + 1)) % 5 - 2.0, 1)[:, :n + 1]
m0[np.arange(n), np.arange(n)] = 2.0            # dyadic values: every sum below is exact, in any order
m0[:, n] = np.arange(n) % 7 - 3.0
old_chunk = ctx.chunk_elems
dnp.configure(chunk_elems=2)                   # blocks of 2 rows: a window's block count grows as it widens
try:
    for dm in DISTS:
        for dx in DISTS:
            M, R = dnp.from_numpy(m0, dist=dm), dnp.from_numpy(m0[3], dist="replicated")
            for again in (False, True):     # again: every shape class and owner seen, no plan may be built
                X, x = dnp.from_numpy(np.zeros(n), dist=dx), np.zeros(n)
                built, known = ctx.stats["plans_built"], set(ctx.plans)
                for k in range(n - 1, -1, -1):   # back substitution: replicated scalars, dot products over x[k+1:]
                    X[k] = (M[k, n] - dnp.dot(M[k, k + 1:n], X[k + 1:])) / M[k, k]
                    x[k] = (m0[k, n] - np.dot(m0[k, k + 1:n], x[k + 1:])) / m0[k, k]
                    s = dnp.sum(R[k:n] * 0.5) + dnp.sum(X[k:] * 0.25)   # over replicated rows, distributed ones
                    sx = np.sum(m0[3, k:n] * 0.5) + np.sum(x[k:] * 0.25)
                    if k % 4 == 0:
                        same(f"back substitution k={k} M {dm} x {dx}", X, x)
                        same(f"sums over moving windows k={k} M {dm} x {dx}", s, sx)
                same(f"back substitution M {dm} x {dx}", X, x)
                for k in range(n - 3):              # replicated rows into distributed ones: inlined when no larger
                    X[k:k + 3] = R[k:k + 3] * 0.5 + X[k + 1] * 0.25 - 1.0     # 3 elements of 3: inlined
                    x[k:k + 3] = m0[3, k:k + 3] * 0.5 + x[k + 1] * 0.25 - 1.0
                    X[k:] = X[k:] + (R[k] * 0.125 - 0.5)                      # one element for many: kept apart
                    x[k:] = x[k:] + (m0[3, k] * 0.125 - 0.5)
                same(f"replicated expressions into distributed rows M {dm} x {dx}", X, x)
                X[2:5] = R[2:5] * 0.5 - 1.0
                ctx.flush("replicated rows into three distributed ones")
                assert ctx.last["kinds"] == ["elementwise"], ("not inlined into the distributed rows", ctx.last)
                X[2:] = X[2:] + (R[2] * 0.125 - 0.5)
                ctx.flush("a replicated scalar into many distributed rows")
                assert ctx.last["kinds"] == ["elementwise", "elementwise"], ("inlined into more elements", ctx.last)
                x[2:5] = m0[3, 2:5] * 0.5 - 1.0
                x[2:] = x[2:] + (m0[3, 2] * 0.125 - 0.5)
                same(f"replicated expressions flushed alone M {dm} x {dx}", X, x)
                exact = [key for key in ctx.plans if key not in known and key[0] == "ew"]
                assert not exact, ("a back substitution step built an exact-view plan", len(exact), exact[0], dm, dx)
                assert not again or ctx.stats["plans_built"] == built, (
                    "a back substitution step built its plans again", ctx.stats["plans_built"] - built, dm, dx)
finally:
    dnp.configure(chunk_elems=old_chunk)
section("replicated-row and reducing plans rebound over a back substitution")
print(f"ALL OK ({checks[0]} checks on {size} ranks)", flush=True) if ctx.rank == 0 else None
