"""Every distributed-array operation against NumPy, on every distribution (run SPMD by tests/test_distarray.py
under `nbmpi run -n 2` and `-n 3`; uneven splits on 3 ranks). Prints one `ok <section>` line per section
on rank 0 and `ALL OK` at the end; any difference raises AssertionError naming the case."""
import sys

import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers import gather_trace, get_tracer, world
from spmd_checks import section

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()
DISTS = ["block", "cyclic", ("block-cyclic", 2)]
QUICK = "--quick" in sys.argv
rng = np.random.default_rng(7)
count = [0]


def check(name, got, want, exact=False, rtol=1e-12, dtype=True):
    """got: DistArray / NumPy / scalar; want: NumPy / scalar."""
    g = got.to_numpy() if isinstance(got, dnp.DistArray) else np.asarray(got)
    w = np.asarray(want)
    assert g.shape == w.shape, f"{name}: shape {g.shape} != NumPy's {w.shape}"
    if dtype:
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype} != NumPy's {w.dtype}"
    if exact or w.dtype.kind in "biu":
        ok = np.array_equal(g, w, equal_nan=w.dtype.kind == "f")
    else:
        ok = np.allclose(g, w, rtol=rtol, atol=1e-300, equal_nan=True)
    if not ok:
        bad = np.argwhere(~np.isclose(g, w, rtol=rtol, equal_nan=True)) if w.dtype.kind == "f" else None
        raise AssertionError(f"{name} (rank {rank}/{size}): differs from NumPy\n got {g}\nwant {w}\nfirst bad {bad[:5] if bad is not None else ''}")
    count[0] += 1


# ------------------------------------------------------------------ constructors, gather, local, dist
n1, shape2 = 23, (13, 7)
x1 = rng.random(n1)
x2 = rng.random(shape2)
for dist in DISTS:
    a = dnp.from_numpy(x1, dist=dist)
    b = dnp.from_numpy(x2, dist=dist)
    check(f"from_numpy/to_numpy 1-D {dist}", a, x1, exact=True)
    check(f"from_numpy/to_numpy 2-D {dist}", b, x2, exact=True)
    r = b.to_numpy(root=size - 1)
    assert (r is None) == (rank != size - 1), "to_numpy(root) returns the array on root only"
    if rank == size - 1:
        check(f"to_numpy(root) {dist}", r, x2, exact=True)
    s = dnp.from_numpy(x2 if rank == 1 else None, dist=dist, root=1)
    check(f"from_numpy(root=1) {dist}", s, x2, exact=True)
    check(f"zeros {dist}", dnp.zeros(shape2, dist=dist), np.zeros(shape2), exact=True)
    check(f"ones int32 {dist}", dnp.ones(n1, dtype=np.int32, dist=dist), np.ones(n1, dtype=np.int32))
    check(f"full {dist}", dnp.full(shape2, 2.5, dist=dist), np.full(shape2, 2.5), exact=True)
    assert dnp.empty(shape2, dist=dist).shape == shape2
    check(f"arange int {dist}", dnp.arange(3, 50, 2, dist=dist), np.arange(3, 50, 2))
    check(f"arange float {dist}", dnp.arange(0.5, 7.3, 0.3, dist=dist), np.arange(0.5, 7.3, 0.3), rtol=1e-15)
    check(f"random {dist}", dnp.random.random(shape2, dist=dist, seed=42),
          np.random.default_rng(42).random(shape2), exact=True)
    check(f"uniform {dist}", dnp.random.uniform(-2, 3, n1, dist=dist, seed=5),
          np.random.default_rng(5).uniform(-2, 3, n1), exact=True)
    # .local: this rank's rows, a view of the local buffer
    loc = b.local
    assert np.array_equal(loc, x2[b.local_rows]), f".local {dist}"
    v = b[1:-2:2, 1:]
    assert np.array_equal(v.local, x2[1:-2:2, 1:][v.local_rows]), f".local of a view {dist}"
    rows = comm.allgather(list(b.local_rows))
    assert sorted(sum(rows, [])) == list(range(shape2[0])), f"every row on exactly one rank ({dist})"
    assert str(b.dist).startswith(dist if isinstance(dist, str) else "block-cyclic (block 2)"), str(b.dist)
    assert "view [1:11:2, 1:7]" in v.describe(), v.describe()
section("constructors, to_numpy, from_numpy(root), .local, .dist")

# ------------------------------------------------------------------ views (no copies) and elementwise across ranks
for dist in DISTS:
    a = dnp.from_numpy(x1, dist=dist)
    b = dnp.from_numpy(x2, dist=dist)
    c = dnp.from_numpy(x1[::-1].copy(), dist="cyclic" if dist != "cyclic" else "block")
    views1 = [(slice(2, -3),), (slice(None, None, 2),), (slice(None, None, -1),), (slice(-1, 2, -3),),
              (slice(5, 6),)]
    for key in views1:
        check(f"view {key} {dist}", a[key], x1[key], exact=True)
    for key in [(slice(1, -1), slice(2, None)), (slice(None), 3), (slice(None, None, 3), slice(None, None, -2)),
                (4,), (Ellipsis, 1), (slice(2, 9), None, slice(1, 4))]:
        check(f"view2 {key} {dist}", b[key], x2[key], exact=True)
    assert b[1:-1, 2:]._base is b._base, "a view shares the base (no copy)"
    check(f"scalar index {dist}", b[3, 4], x2[3, 4], exact=True)
    bc = b.copy()
    e = bc[3, 4]                        # a lazy 0-d copy: a later write to bc does not change it
    bc[3, 4] = -1.0
    check(f"scalar index is a copy {dist}", e * 2 + bc[3, 4], x2[3, 4] * 2 - 1.0, exact=True)
    assert float(e) == float(x2[3, 4]) and float(bc[3, 4]) == -1.0
    check(f"shifted views a[1:] + a[:-1] {dist}", a[1:] + a[:-1], x1[1:] + x1[:-1], exact=True)
    check(f"strided vs reversed {dist}", a[::2] * a[::-2], x1[::2] * x1[::-2], exact=True)
    check(f"different distributions {dist}+other", a + c, x1 + x1[::-1], exact=True)
    check(f"2-D shifted {dist}", b[2:, :] - b[:-2, ::-1], x2[2:, :] - x2[:-2, ::-1], exact=True)
    check(f"row of a 2-D view {dist}", b[3] * 2 + b[-1], x2[3] * 2 + x2[-1], exact=True)
    check(f"column {dist}", b[:, 2] + a[:13], x2[:, 2] + x1[:13], exact=True)
section("views and elementwise work across rank boundaries")

# ------------------------------------------------------------------ ufuncs
xp = rng.random(shape2) + 0.5
yp = rng.random(shape2) + 0.1
xi = rng.integers(-50, 50, shape2).astype(np.int32)
yi = rng.integers(1, 9, shape2).astype(np.int64)
unary = ["negative", "absolute", "sqrt", "exp", "log", "sin", "cos", "tan", "square", "log10", "tanh", "floor",
         "ceil", "isnan", "isfinite"]
binary = ["add", "subtract", "multiply", "true_divide", "power", "maximum", "minimum", "less", "less_equal",
          "greater", "greater_equal", "equal", "not_equal", "arctan2"]
for dist in DISTS if not QUICK else DISTS[:2]:
    p = dnp.from_numpy(xp, dist=dist)
    q = dnp.from_numpy(yp, dist=dist)
    for name in unary:
        f = getattr(np, name)
        check(f"{name} {dist}", f(p), f(xp), rtol=1e-14)
    for name in binary:
        f = getattr(np, name)
        check(f"{name} {dist}", f(p, q), f(xp, yp), rtol=1e-14)
        check(f"{name} scalar {dist}", f(p, 0.75), f(xp, 0.75), rtol=1e-14)
    check(f"operators {dist}", (p + 1) * 2 - q / 3 ** 1 + (-p), (xp + 1) * 2 - yp / 3 ** 1 + (-xp), rtol=1e-14)
    check(f"pow op {dist}", p ** 2 + 2 ** q + p ** q, xp ** 2 + 2 ** yp + xp ** yp, rtol=1e-14)
    check(f"abs() {dist}", abs(p - q), abs(xp - yp))
    check(f"where {dist}", dnp.where(p > q, p, -q), np.where(xp > yp, xp, -yp))
    check(f"where scalars {dist}", dnp.where(p > 1.0, 1.0, 0), np.where(xp > 1.0, 1.0, 0))
    check(f"np.where dispatch {dist}", np.where(p < q, p, 7), np.where(xp < yp, xp, 7))
    check(f"NaN scalar operand {dist}", dnp.where(p > 1.2, np.nan, p) * -0.0, np.where(xp > 1.2, np.nan, xp) * -0.0)
    m = dnp.from_numpy(np.where(xp > 1, np.nan, xp), dist=dist)
    check(f"maximum/minimum NaN {dist}", dnp.maximum(m, q) + dnp.minimum(q, m),
          np.maximum(np.where(xp > 1, np.nan, xp), yp) + np.minimum(yp, np.where(xp > 1, np.nan, xp)))
    i1 = dnp.from_numpy(xi, dist=dist)
    i2 = dnp.from_numpy(yi, dist=dist)
    check(f"int32 + int32 {dist}", i1 + i1, xi + xi)
    check(f"int32 * int64 {dist}", i1 * i2, xi * yi)
    check(f"int / int {dist}", i1 / i2, xi / yi)
    check(f"int32 + python int {dist}", i1 + 3, xi + 3)
    check(f"int32 + python float {dist}", i1 + 0.5, xi + 0.5)
    check(f"float32 * python float {dist}", p.astype(np.float32) * 0.1, xp.astype(np.float32) * 0.1)
    check(f"float32 * np.float64 {dist}", p.astype(np.float32) * np.float64(0.1), xp.astype(np.float32) *
          np.float64(0.1))
    check(f"bool ops {dist}", (p > 1) & (q < 0.5) | ~(p > q), (xp > 1) & (yp < 0.5) | ~(xp > yp))
    check(f"logical {dist}", dnp.logical_and(p > 1, q > 0.5) ^ dnp.logical_or(p > 1.2, q < 0.2),
          np.logical_and(xp > 1, yp > 0.5) ^ np.logical_or(xp > 1.2, yp < 0.2))
    check(f"astype/copy {dist}", p.astype(np.int32) + p.copy(), xp.astype(np.int32) + xp.copy())
    check(f"divide by zero {dist}", p / (q * 0), xp / (yp * 0))
    calls = dnp.stats()["fallback"]["calls"]
    check(f"% and // float (signs follow the divisor) {dist}", (p - 1.0) % (q - 0.5) + (p - 1.0) // (q - 0.5),
          (xp - 1.0) % (yp - 0.5) + (xp - 1.0) // (yp - 0.5), exact=True)
    check(f"% and // int, by zero too {dist}", (i2 * 7919) % 1000 - i1 // (i2 - 3) + np.remainder(i1, 0),
          (yi * 7919) % 1000 - xi // (yi - 3) + np.remainder(xi, 0))
    check(f"% float by zero is NaN {dist}", p % (q * 0), xp % (yp * 0), exact=True)
    assert dnp.stats()["fallback"]["calls"] == calls, "% and // run in the fused kernels, not the NumPy fallback"
    check(f"long chain {dist}", dnp.sqrt(dnp.exp(-p * p / 2.0) * (1.0 + q) / (2 * dnp.pi)) + dnp.log(p) * dnp.cos(q),
          np.sqrt(np.exp(-xp * xp / 2.0) * (1.0 + yp) / (2 * np.pi)) + np.log(xp) * np.cos(yp), rtol=1e-13)
section("ufuncs, operators, where, dtypes")

# ------------------------------------------------------------------ broadcasting, replicated operands
for dist in DISTS:
    b = dnp.from_numpy(x2, dist=dist)
    a = dnp.from_numpy(x1[:13], dist=dist)
    row, col = rng.random(7), rng.random((13, 1))
    check(f"+ numpy row {dist}", b + row, x2 + row)
    check(f"* numpy column {dist}", b * col, x2 * col)
    check(f"+ numpy full {dist}", b - x2 * 2, x2 - x2 * 2)
    check(f"dist column broadcast {dist}", b * a[:, None], x2 * x1[:13, None])
    check(f"outer difference x[:, None] - x[None, :] {dist}", a[:, None] - a[None, :], x1[:13, None] - x1[None, :13])
    check(f"row broadcast from a distributed row {dist}", b - b[0], x2 - x2[0])
    check(f"row broadcast b[2:3] {dist}", b + b[2:3], x2 + x2[2:3])
    check(f"0-d lazy result as operand {dist}", b - dnp.mean(b), x2 - np.mean(x2))
    check(f"reduction result broadcast {dist}", b / dnp.sum(b, axis=0), x2 / np.sum(x2, axis=0))
    check(f"axis-1 result as column {dist}", b - dnp.max(b, axis=1)[:, None], x2 - np.max(x2, axis=1)[:, None])
section("broadcasting against replicated operands")

# ------------------------------------------------------------------ in-place assignment
for dist in DISTS:
    for hiding in (True, False):
        dnp.configure(latency_hiding=hiding)
        a = dnp.from_numpy(x1, dist=dist)
        y = x1.copy()
        a[2:9] = a[10:17] * 2
        y[2:9] = y[10:17] * 2
        a[1:] = a[:-1]
        y[1:] = y[:-1]
        a += 1
        y += 1
        a[::3] = 0.5
        y[::3] = 0.5
        a[a > 1.2] = -1
        y[y > 1.2] = -1
        a[y < 0.3] = 4.0  # a NumPy mask
        y[y < 0.3] = 4.0
        a[-4:] = np.array([9.0, 8.0, 7.0, 6.0])
        y[-4:] = [9.0, 8.0, 7.0, 6.0]
        a[::-1] = a + 0
        y[::-1] = y + 0
        check(f"in-place sequence {dist} hiding={hiding}", a, y)
        b = dnp.from_numpy(x2, dist=dist)
        z = x2.copy()
        b[1:-1, 1:-1] = b[:-2, 1:-1] + b[2:, 1:-1]
        z[1:-1, 1:-1] = z[:-2, 1:-1] + z[2:, 1:-1]
        b[:, 0] = 5
        z[:, 0] = 5
        b[3] = b[4] * 2
        z[3] = z[4] * 2
        b *= b
        z *= z
        np.multiply(b, 2, out=b)
        np.multiply(z, 2, out=z)
        bi = dnp.from_numpy(xi, dist=dist)
        bi[...] = b  # setitem casts like NumPy
        check(f"2-D in-place {dist} hiding={hiding}", b, z)
        check(f"setitem cast {dist}", bi, z.astype(np.int32))
        try:
            np.add(b, 1.5, out=dnp.zeros(shape2, dtype=np.int64, dist=dist))
            raise AssertionError("ufunc out= with an unsafe cast must raise")
        except TypeError as e:
            assert "same_kind" in str(e)
dnp.configure(latency_hiding=True)
section("in-place assignment, overlap, masks, out=")

# ------------------------------------------------------------------ reductions
for dist in DISTS:
    b = dnp.from_numpy(x2, dist=dist)
    a = dnp.from_numpy(x1, dist=dist)
    bn = x2.copy()
    bn[4, 2] = np.nan
    m = dnp.from_numpy(bn, dist=dist)
    for op in ("sum", "min", "max", "mean"):
        f = getattr(np, op)
        for axis in (None, 0, 1, -1):
            check(f"{op} axis={axis} {dist}", getattr(dnp, op)(b, axis=axis), f(x2, axis=axis), rtol=1e-12)
            check(f"{op} of a view axis={axis} {dist}", getattr(dnp, op)(b[1::2, ::-1], axis=axis),
                  f(x2[1::2, ::-1], axis=axis), rtol=1e-12)
        check(f"{op} 1-D {dist}", getattr(dnp, op)(a), f(x1), rtol=1e-12)
        check(f"{op} 1-D axis 0 {dist}", getattr(dnp, op)(a, axis=0), f(x1, axis=0), rtol=1e-12)
        check(f"method .{op}() {dist}", getattr(b, op)(axis=1), f(x2, axis=1), rtol=1e-12)
    check(f"min/max NaN {dist}", dnp.min(m) + dnp.max(m, axis=0), np.min(bn) + np.max(bn, axis=0))
    check(f"sum of an expression {dist}", dnp.sum(dnp.abs(b[1:] - b[:-1]) * 2), np.sum(np.abs(x2[1:] - x2[:-1]) * 2))
    ii = dnp.from_numpy(xi, dist=dist)
    check(f"int32 sum dtype {dist}", dnp.sum(ii), np.sum(xi))
    check(f"int mean {dist}", dnp.mean(ii, axis=0), np.mean(xi, axis=0))
    check(f"any/all {dist}", dnp.any(b > 0.9, axis=0) & dnp.all(b > 0.01, axis=0), np.any(x2 > 0.9, axis=0) &
          np.all(x2 > 0.01, axis=0))
    check(f"np.sum dispatch {dist}", np.sum(b, axis=1) + np.max(b, axis=1), np.sum(x2, axis=1) + np.max(x2, axis=1))
    check(f"add.reduce {dist}", np.add.reduce(b), np.add.reduce(x2))
    assert abs(float(dnp.sum(b)) - float(np.sum(x2))) < 1e-12
    assert int(dnp.sum(ii)) == int(np.sum(xi)) and bool(dnp.any(b > 0.5)) and b[2:3, 4:5].item() == x2[2, 4]
    try:
        dnp.min(b[3:3])
        raise AssertionError("min of an empty selection must raise")
    except ValueError as e:
        assert "zero-size" in str(e)
section("reductions sum/min/max/mean/any/all, axis None/0/1")

# ------------------------------------------------------------------ matmul, dot, transpose, roll
for dist in DISTS:
    for hiding in (True, False):
        dnp.configure(latency_hiding=hiding)
        am = rng.random((11, 9))
        bm = rng.random((9, 4))
        v = rng.random(9)
        A = dnp.from_numpy(am, dist=dist)
        X = dnp.from_numpy(v, dist="cyclic" if dist == "block" else "block")
        B = dnp.from_numpy(bm, dist=dist)
        check(f"A @ x {dist} hiding={hiding}", A @ X, am @ v)
        check(f"A @ numpy x {dist}", A @ v, am @ v)
        check(f"A @ B {dist}", A @ B, am @ bm)
        check(f"dot(A, x) {dist}", dnp.dot(A, X), np.dot(am, v))
        check(f"view @ view {dist}", A[1:-1, ::2] @ X[::2], am[1:-1, ::2] @ v[::2])
        # reversed and strided rows of A and of B (their plans take runs of local rows in closed form)
        B2 = dnp.from_numpy(bm, dist=dist)
        check(f"reversed view @ reversed view {dist}", A[::-1, 7::-2] @ B2[7::-2], am[::-1, 7::-2] @ bm[7::-2])
        check(f"strided view @ moving window {dist}", A[9:0:-3, 2:] @ X[2:], am[9:0:-3, 2:] @ v[2:])
        check(f"window @ window {dist}", A[4:, :5] @ B2[:5, 1], am[4:, :5] @ bm[:5, 1])
        check(f"dot 1-D {dist}", dnp.dot(X, X), np.dot(v, v))
        check(f"numpy @ dist {dist}", am @ X, am @ v)
        check(f"transpose {dist} hiding={hiding}", A.T, am.T, exact=True)
        check(f"transpose of a view + op {dist}", A[2:, 1:].T * 2 + 1, am[2:, 1:].T * 2 + 1)
        check(f"jacobi step {dist}", (X - A[:9] @ X) / 3.0, (v - am[:9] @ v) / 3.0)
        a = dnp.from_numpy(x1, dist=dist)
        b = dnp.from_numpy(x2, dist=dist)
        check(f"roll axis 0 {dist}", dnp.roll(a, 3, axis=0), np.roll(x1, 3, axis=0), exact=True)
        check(f"roll 2-D both axes {dist}", dnp.roll(dnp.roll(b, -2, axis=0), 3, axis=1),
              np.roll(np.roll(x2, -2, axis=0), 3, axis=1), exact=True)
        check(f"np.roll dispatch tuple {dist}", np.roll(b, (1, -1), axis=(0, 1)), np.roll(x2, (1, -1), axis=(0, 1)),
              exact=True)
dnp.configure(latency_hiding=True)
section("matmul, dot, transpose, roll")

# ------------------------------------------------------------------ the seed's stencil, fusion, caching, tracing
def stencil_step(np_, full):
    center = full[1:-1, 1:-1]
    north = full[0:-2, 1:-1]
    south = full[2:, 1:-1]
    west = full[1:-1, 0:-2]
    east = full[1:-1, 2:]
    work = 0.2 * (center + north + south + east + west)
    delta = float(np_.sum(np_.abs(center - work)))
    center[:] = work
    return delta


xs = rng.random((19, 11))
for dist in DISTS:
    for hiding in (True, False):
        dnp.configure(latency_hiding=hiding)
        full_d = dnp.from_numpy(xs, dist=dist)
        full_n = xs.copy()
        for it in range(4):
            dd = stencil_step(dnp, full_d)
            dn = stencil_step(np, full_n)
            assert abs(dd - dn) <= 1e-12 * abs(dn), (dist, hiding, it, dd, dn)
        check(f"seed stencil {dist} hiding={hiding}", full_d, full_n, rtol=1e-13)
dnp.configure(latency_hiding=True)
# fusion: the whole work expression and the reduction run as ONE kernel loop; no temporary per operation;
# the second time step compiles nothing and builds no plan
full_d = dnp.from_numpy(rng.random((130, 70)), dist="block")  # 72 KB: pooled buffers are >= 64 KiB
stencil_step(dnp, full_d)
stencil_step(dnp, full_d)
s0 = dnp.stats()
stencil_step(dnp, full_d)
s1 = dnp.stats()
last = s1["last"]
assert s1["kernels"]["signatures"] == s0["kernels"]["signatures"], ("a time step compiled a kernel", s0, s1)
assert s1["plans_built"] == s0["plans_built"], ("a time step built a plan", s0["plans_built"], s1["plans_built"])
assert last["kinds"] == ["swap", "elementwise"], last          # copy-back is a buffer swap; one fused group
assert last["recorded"] == 9 and last["inlined"] == 6, last    # 4 adds + abs + subtract fused away
assert s1["inlined"] - s0["inlined"] == 6 and s1["swapped"] - s0["swapped"] == 1
assert s1["buffers_allocated"] == s0["buffers_allocated"], "a time step allocated a new buffer"
# buffers are reused because nothing keeps the old ones alive: no reference cycles, so even with the
# garbage collector off a time step allocates nothing and leaves nothing to collect
import gc
gc.collect()
gc.disable()
try:
    s0 = dnp.stats()
    for _ in range(6):
        stencil_step(dnp, full_d)
    s1 = dnp.stats()
finally:
    gc.enable()
assert s1["buffers_allocated"] == s0["buffers_allocated"], (
    "time steps without the garbage collector allocated buffers (old ones kept alive by reference cycles)",
    s0["buffers_allocated"], s1["buffers_allocated"])
assert gc.collect() == 0, "time steps left reference cycles (whose buffers live until the collector runs)"
# threshold: a long chain evaluates by itself
dnp.configure(threshold=5)
t = dnp.from_numpy(x1)
f0 = dnp.stats()["flushes"]
for k in range(12):
    t = t * 1.0001 + 1
assert dnp.stats()["flushes"] - f0 >= 2, "the threshold forces evaluations"
dnp.configure(threshold=1000)
yv = x1.copy()
for k in range(12):
    yv = yv * 1.0001 + 1
check("threshold chain", t, yv)
# tracing: every transfer and wait is recorded; the summary gives each rank's wait %
mark = get_tracer().mark()
full_d = dnp.from_numpy(xs, dist="block")
for it in range(3):
    stencil_step(dnp, full_d)
trace = gather_trace(since=mark)
if rank == 0:
    summ = trace.summary()
    kinds = set()
    for r in summ["ranks"]:
        kinds |= set(r["events_by_kind"])
        assert 0.0 <= r["wait_frac"] <= 1.0
    assert {"distarray_send", "distarray_recv", "distarray_check", "distarray_allgather"} <= kinds, kinds
    assert len(trace.flow_pairs) >= 3 * 2 * (size - 1), "sends matched with receives (timeline arrows)"
    print("trace wait %:", [round(r["wait_frac"] * 100, 2) for r in summ["ranks"]], flush=True)
section("seed stencil, fusion, kernel and plan caching, threshold, tracing")

# ------------------------------------------------------------------ printing
small = dnp.from_numpy(x2, dist="cyclic")
assert str(small) == str(x2) and repr(small).startswith("DistArray([[")
big = dnp.from_numpy(rng.random((300, 40)), dist="block")
assert str(big) == str(big.to_numpy()), "large arrays print like NumPy (summarized)"
big1 = dnp.arange(5000, dist="cyclic")
assert str(big1) == str(np.arange(5000))
section("printing")
if rank == 0:
    print(f"ALL OK ({count[0]} checks on {size} ranks)", flush=True)
