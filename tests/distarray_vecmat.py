"""``v @ B`` (1-D @ 2-D) with ``B``'s rows distributed, recorded as one ``VecMat`` task (each rank's rows of ``B``
times their entries of ``v``, one allgather of the partial products, their sum in rank order), against NumPy on
every distribution (run SPMD by tests/test_distarray_vecmat.py under ``nbmpi run -n 1``, ``-n 2`` and ``-n 3``).

The float operands hold small integers, so every order of the sums gives NumPy's bits: each result is compared
exactly (a wrong row of ``B`` or a wrong entry of ``v`` on any rank changes it). Checks also that each product
was recorded as a VecMat task, and that a chain of products reading rows written just before (LU's
``U[k, k:] = A[k, k:] - L[k, :k] @ U[:k, k:]``) reads what was written. Prints ``ok <section>`` per section on
rank 0 and ``ALL OK`` at the end."""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray.context import context_for
from nbmpi.workers.distarray.graph import Replicate, VecMat
from spmd_checks import checks, same, section, size

DISTS = ["block", "cyclic", ("block-cyclic", 2)]
ctx = context_for()
#: The cases recording no gather: ``v`` a NumPy array (replicated), or one fixed row of a distributed base.
NO_GATHER = ("numpy v", "row of B @ rows of B", "last row @ rows after the first", "strided part of a row @ strided rows",
               "no rows")
rng = np.random.default_rng(3)


def vecmats() -> int:
    """VecMat tasks recorded since the last force point."""
    return sum(isinstance(t, VecMat) for t in ctx.pending)


def gathers() -> int:
    """Gathers recorded since the last force point."""
    return sum(isinstance(t, Replicate) for t in ctx.pending)


bm = rng.integers(-9, 10, (13, 7)).astype(float)
vm = rng.integers(-9, 10, 13).astype(float)
for dist in DISTS:
    other = "cyclic" if dist == "block" else "block"
    for hiding in (True, False):
        dnp.configure(latency_hiding=hiding)
        B = dnp.from_numpy(bm, dist=dist)
        V = dnp.from_numpy(vm, dist=other)
        cases = [
            ("v @ B", lambda: V @ B, vm @ bm),
            ("slices", lambda: V[2:9] @ B[2:9, 1:], vm[2:9] @ bm[2:9, 1:]),
            ("strided rows", lambda: V[::2] @ B[::2], vm[::2] @ bm[::2]),
            ("reversed rows", lambda: V[::-1] @ B[::-1, 3:], vm[::-1] @ bm[::-1, 3:]),
            ("strided columns", lambda: V[1:12] @ B[1:12, ::3], vm[1:12] @ bm[1:12, ::3]),
            ("numpy v", lambda: vm[:5] @ B[4:9], vm[:5] @ bm[4:9]),
            ("row of B @ rows of B", lambda: B[5, :4] @ B[:4, 3:], bm[5, :4] @ bm[:4, 3:]),
            ("last row @ rows after the first", lambda: B[12, 1:6] @ B[7:12], bm[12, 1:6] @ bm[7:12]),
            ("strided part of a row @ strided rows", lambda: B[6, 5::-2] @ B[1:13:4, ::2],
             bm[6, 5::-2] @ bm[1:13:4, ::2]),
            ("no rows", lambda: B[5, :0] @ B[:0, 3:], bm[5, :0] @ bm[:0, 3:]),
        ]
        for name, fn, want in cases:
            got = fn()
            assert vecmats() == 1, (name, dist, [t.desc for t in ctx.pending])
            # a fixed row of B as v: its owner sends the entries within the VecMat task, no gather recorded
            assert (gathers() == 0) == (name in NO_GATHER), (name, [t.desc for t in ctx.pending])
            assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
            same(f"{name} {dist} hiding={hiding}", got, want)
        got = (V[3:] @ B[3:] - B[2]) * 2.0
        same(f"product in an expression {dist}", got, (vm[3:] @ bm[3:] - bm[2]) * 2.0)
dnp.configure(latency_hiding=True)
section("v @ B on every distribution, every view of the rows")

im = rng.integers(-50, 50, (11, 6))
for dist in DISTS:
    B = dnp.from_numpy(im, dist=dist)
    same(f"int64 {dist}", B[4, 1:6] @ B[1:6, :], im[4, 1:6] @ im[1:6, :])
    B32 = dnp.from_numpy(bm.astype(np.float32), dist=dist)
    got = dnp.from_numpy(vm.astype(np.float32), dist=dist) @ B32
    assert got.dtype == np.float32, got.dtype
    same(f"float32 {dist}", got, vm.astype(np.float32) @ bm.astype(np.float32))
    got = dnp.from_numpy(vm.astype(np.int32), dist=dist) @ dnp.from_numpy(bm, dist=dist)
    same(f"int32 @ float64 {dist}", got, vm.astype(np.int32) @ bm)
section("int64, float32 and mixed dtypes")

n = 9
base = rng.integers(-4, 5, (n, n)).astype(float)
for dist in DISTS:
    # each product reads rows written by the statement before (recorded, not evaluated): U[k] depends on U[:k]
    U = dnp.from_numpy(base, dist=dist)
    u = base.copy()
    for k in range(1, n):
        U[k, :] = U[k, :] - U[k - 1, :k] @ U[:k, :] * 0.5
        u[k, :] = u[k, :] - u[k - 1, :k] @ u[:k, :] * 0.5
    same(f"chain of products over rows just written {dist}", U, u)
section("products reading rows written before them")
from nbmpi.workers.distarray import matmul_recording  # noqa: E402

for bound in (matmul_recording.OWNER_ROW_BYTES, 0):     # 0: the owner's row of a one-row-per-rank base
    matmul_recording.OWNER_ROW_BYTES = bound
    for dist in DISTS:
        for r in (0, 6, 12):
            B = dnp.from_numpy(bm, dist=dist)
            C = dnp.from_numpy(bm * 0.5, dist=dist)
            c = bm * 0.5
            dnp.evaluate()
            coll = dnp.stats()["collectives"]
            got = B[r, :6] @ B[:6, 1:]                   # lives on the owner of row r: no allgather
            want = bm[r, :6] @ bm[:6, 1:]
            C[r, 1:] = C[r, 1:] - got                    # the owner's row, as in LU
            c[r, 1:] = c[r, 1:] - want
            C[(r + 1) % 13, 1:] = got * 2.0              # another rank's row
            c[(r + 1) % 13, 1:] = want * 2.0
            both = C[2:5, 1:] + got                      # against distributed rows elsewhere
            same(f"fixed row @ rows stored into rows {dist} r={r} bound={bound}", C, c)
            same(f"fixed row @ rows against rows {dist} r={r} bound={bound}", both, c[2:5, 1:] + want)
            same(f"fixed row @ rows itself {dist} r={r} bound={bound}", got, want)
            assert dnp.stats()["collectives"] == coll, (dist, r, dnp.stats()["collectives"] - coll)
matmul_recording.OWNER_ROW_BYTES = 1 << 26
section("a product of a fixed row lives on the row's owner, no collective")

# L[k:, :k] @ U[:k, k] (a Matmul) reads only rows :k of U: a write to row k (outside them) need not wait for it,
# a write to row k - 1 (inside them) after it must, and the write to row k - 1 before it (waiting for a message
# from another rank) is read
lm = rng.integers(-3, 4, (13, 13)).astype(float)
um = rng.integers(-3, 4, (13, 13)).astype(float)
for dist in DISTS:
    for hiding in (True, False):
        dnp.configure(latency_hiding=hiding)
        L, U, R = dnp.from_numpy(lm, dist=dist), dnp.from_numpy(um, dist=dist), dnp.zeros((13, 13), dist=dist)
        u, r = um.copy(), np.zeros((13, 13))
        for k in range(1, 13):
            q = (k + 6) % 13                            # mostly another rank's row: its message arrives later
            U[k - 1, k:] = U[k - 1, k:] - L[q, k:]
            u[k - 1, k:] = u[k - 1, k:] - lm[q, k:]
            t = L[k:, :k] @ U[:k, k]
            want = lm[k:, :k] @ u[:k, k]
            U[k - 1, :] = U[k - 1, :] * 2.0
            u[k - 1, :] = u[k - 1, :] * 2.0
            U[k, :k] = U[k, :k] + 1.0
            u[k, :k] = u[k, :k] + 1.0
            R[k:, k] = t
            r[k:, k] = want
        same(f"matrix @ column of rows written before and after {dist} hiding={hiding}", R, r)
        same(f"rows written around the products {dist} hiding={hiding}", U, u)
dnp.configure(latency_hiding=True)
section("a matrix product waits for the rows of b it reads, not for later rows")

# LU's two products over a moving window: in a block layout every step binds a plan of its shape class (messages
# with room for a few more rows), the other layouts build a plan per step; every result is NumPy's
n = 72
lm = np.tril(rng.integers(-3, 4, (n, n))).astype(float)
um = np.triu(rng.integers(-3, 4, (n, n))).astype(float)
from nbmpi.workers.distarray.operations import linalg  # noqa: E402

for dist, exact in [(d, 1 << 20) for d in DISTS] + [("block", 0)]:    # 0: every message's room is its size
    linalg.ROOM_EXACT_BYTES = exact
    L, U = dnp.from_numpy(lm, dist=dist), dnp.from_numpy(um, dist=dist)
    R1, R2 = dnp.zeros((n, n), dist=dist), dnp.zeros((n, n), dist=dist)
    r1, r2 = np.zeros((n, n)), np.zeros((n, n))
    dnp.evaluate()
    before = dict(dnp.stats())
    for k in range(n):
        R1[k, k:] = L[k, :k] @ U[:k, k:]
        r1[k, k:] = lm[k, :k] @ um[:k, k:]
        R2[k + 1:, k] = L[k + 1:, :k] @ U[:k, k]
        r2[k + 1:, k] = lm[k + 1:, :k] @ um[:k, k]
        if k % 7 == 3:
            U[k, k:] = U[k, k:] + 1.0                   # written between steps: later products read it
            um[k, k:] = um[k, k:] + 1.0
    same(f"vecmat over a moving window {dist}", R1, r1)
    same(f"matmul over a moving window {dist}", R2, r2)
    X, x = dnp.zeros((n, 6), dist=dist), np.zeros((n, 6))
    for j in range(n - 1, -1, -1):                      # a's rows grow onto more ranks, b's rows stay
        X[j:, :] = X[j:, :] + L[j:, :8] @ U[:8, 1:7]
        x[j:, :] = x[j:, :] + lm[j:, :8] @ um[:8, 1:7]
    same(f"matmul over a growing window of a {dist}", X, x)
    st = dnp.stats()
    if dist == "block" and size > 1:
        assert st["plans_rebound"] - before["plans_rebound"] >= n, (st["plans_rebound"], before["plans_rebound"])
linalg.ROOM_EXACT_BYTES = 1 << 20
section("products over a moving window share plans of their shape class")
print(f"ALL OK ({checks[0]} checks on {size} ranks)", flush=True) if ctx.rank == 0 else None
