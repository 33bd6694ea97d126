"""Conformance of every NumPy ufunc, its methods and the selection functions on distributed arrays against
NumPy, run SPMD by tests/test_distarray_ufuncs.py on 1, 2 and 3 ranks: each ufunc on bool, integer and
float operands (NaN, inf, signed zeros included), whole arrays and views, uneven splits, Python and NumPy
scalars, rows broadcast from NumPy and from distributed arrays, over block, cyclic and block-cyclic layouts;
results and dtypes equal to NumPy's bit for bit, without calling the NumPy fallback. Then out=/where=/dtype=/
casting, several outputs, reduce/accumulate/outer, generalized ufuncs, take/compress/choose/put/partition/
resize, index arrays mixed with slices, a.shape = ..., repeat with distributed counts, correlate with the
longer kernel; then property-based cases drawn by hypothesis (derandomized: every rank draws the same)."""
import sys
import time
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import nbmpi.workers.distarray as dnp
from nbmpi.workers import world

r = world().Get_rank()
warnings.simplefilter("ignore", RuntimeWarning)
np.seterr(all="ignore")
dnp.configure(numpy_math=True)      # exp, log, sin, ... by NumPy's loops too (the fused kernels' differ in the last bit)
DISTS = ("block", "cyclic", ("block-cyclic", 2))
UFUNCS = sorted({getattr(np, n) for n in dir(np) if isinstance(getattr(np, n), np.ufunc)}, key=lambda u: u.__name__)
checked = [0]


def fallback_calls():
    return dnp.stats()["fallback"]["calls"]


def same(got, want, what):
    """Equal to NumPy's result bit for bit (NaN where NumPy has NaN), with NumPy's dtype and shape. NumPy's
    own transcendental loops give other last bits for strided operands than for contiguous ones (SIMD vs
    scalar loops): ``want`` is NumPy's result on contiguous operands, as each rank's blocks are."""
    gs = got if isinstance(got, tuple) else (got,)
    ws = want if isinstance(want, tuple) else (want,)
    assert len(gs) == len(ws), (what, "outputs", len(gs), len(ws))
    for g, w in zip(gs, ws):
        g = g.to_numpy() if isinstance(g, dnp.DistArray) else np.asarray(g)
        w = np.asarray(w)
        assert g.shape == w.shape, (what, "shape", g.shape, w.shape)
        assert g.dtype == w.dtype, (what, "dtype", g.dtype, w.dtype)
        if w.dtype.kind == "f":
            assert np.array_equal(g.view(f"u{w.dtype.itemsize}"), w.view(f"u{w.dtype.itemsize}")) or \
                np.array_equal(g, w, equal_nan=True) and np.array_equal(np.signbit(g), np.signbit(w)), (what, g, w)
        else:
            assert np.array_equal(g, w), (what, g, w)
    checked[0] += 1


def native(what, call, want):
    """``call()`` must not use the NumPy fallback and must equal ``want``."""
    before = fallback_calls()
    got = call()
    assert fallback_calls() == before, (what, "went through the NumPy fallback", dnp.stats()["fallback"]["functions"])
    same(got, want, what)


def values(kind, shape, rng, second=False, name=""):
    """Sample operands of dtype ``kind``: floats with NaN, inf and signed zeros; small integers (exponents
    and shift counts not negative where NumPy raises or leaves it undefined)."""
    if kind == "?":
        return rng.random(shape) < 0.5
    if kind in "fd":
        x = rng.standard_normal(shape) * 3
        flat = x.reshape(-1)
        for k, v in zip(range(0, flat.size, 7), (np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.0)):
            flat[k] = v
        return x.astype(np.float32 if kind == "f" else np.float64)
    lo = 0 if second and name in ("power", "left_shift", "right_shift", "ldexp") else -6
    return rng.integers(lo, 7, size=shape).astype(np.int32 if kind == "i" else np.int64)


def kinds_of(u):
    """The operand kinds (one per test) NumPy has a loop for: bool, int32, int64, float32, float64."""
    out = []
    for k in ("?", "i", "l", "f", "d"):
        try:
            u.resolve_dtypes((np.dtype(k),) * u.nin + (None,) * u.nout)
        except Exception:     # noqa: BLE001 - no loop for this kind
            continue
        if u.__name__ == "ldexp" and k != "d":
            continue
        out.append(k)
    return out


def operands(u, k, rng, shape):
    xs = [values(k, shape, rng, second=j > 0, name=u.__name__) for j in range(u.nin)]
    if u.__name__ == "ldexp":
        xs[1] = rng.integers(-3, 4, size=shape).astype(np.int32)
    return xs


def C(x):
    """``x`` as NumPy computes on it in one rank's block: contiguous."""
    return np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x


def check_ufunc(u, k, dist, rng, j):
    """``u`` on operands of kind ``k``: whole arrays (uneven split), views; for two operands also a Python
    scalar and a row broadcast along the rows (from NumPy or from a distributed array, by ``j``)."""
    name = f"{u.__name__}[{k}] {dist}"
    xs = operands(u, k, rng, (7, 5))
    Xs = [dnp.from_numpy(x, dist=dist) for x in xs]
    native(f"{name} whole", lambda: u(*Xs), u(*xs))
    native(f"{name} views", lambda: u(*[X[1:, ::2] if i == 0 else X[:-1, 2:] for i, X in enumerate(Xs)]),
           u(*[C(x[1:, ::2]) if i == 0 else C(x[:-1, 2:]) for i, x in enumerate(xs)]))
    if u.nin == 2:
        s = xs[1].reshape(-1)[3].item()              # a Python scalar (weak) of the kind
        native(f"{name} scalar", lambda: u(Xs[0], s), u(xs[0], s))
        if j % 2:
            native(f"{name} numpy row", lambda: u(Xs[0], xs[1][2]), u(xs[0], C(xs[1][2])))
        else:
            native(f"{name} distributed row", lambda: u(Xs[0], Xs[1][2]), u(xs[0], C(xs[1][2])))


def check_keywords(dist, rng):
    x = values("d", (7, 5), rng)
    y = values("d", (7, 5), rng)
    X, Y = dnp.from_numpy(x, dist=dist), dnp.from_numpy(y, dist=dist)
    for u in (np.sinh, np.add, np.hypot, np.exp):
        args, xargs = (X, Y)[:u.nin], (x, y)[:u.nin]
        o, oo = dnp.zeros((7, 5)), np.zeros((7, 5))
        native(f"{u.__name__} out=where= {dist}", lambda: u(*args, out=o, where=Y > 0), u(*xargs, out=oo, where=y > 0))
        o2, oo2 = dnp.ones((9, 5), dist=dist), np.ones((9, 5))
        native(f"{u.__name__} out=view where=numpy {dist}", lambda: u(*args, out=o2[1:8], where=y < 1),
               u(*xargs, out=oo2[1:8], where=y < 1))
        same(o2, oo2, "the rest of out kept")
        native(f"{u.__name__} dtype=float32 {dist}", lambda: u(*args, dtype=np.float32), u(*xargs, dtype=np.float32))
        o3, oo3 = dnp.zeros((7, 5), dtype=np.float32, dist=dist), np.zeros((7, 5), dtype=np.float32)
        native(f"{u.__name__} out=float32 {dist}", lambda: u(*args, out=o3), u(*xargs, out=oo3))
        native(f"{u.__name__} out=tuple, where=False {dist}", lambda: u(*args, out=(o3,), where=False),
               u(*xargs, out=(oo3,), where=False))
    i = values("l", (7, 5), rng)
    I = dnp.from_numpy(i, dist=dist)
    for u, a, b in ((np.add, I, 1.5), (np.sinh, I, None)):
        try:
            u(*((a, b) if b is not None else (a,)), out=I)
        except TypeError as e:   # NumPy's UFuncTypeError: same_kind does not cast float64 to int64
            assert "Cannot cast" in str(e) or "cast" in str(e), e
        else:
            raise AssertionError(f"{u.__name__} with out=int64 did not raise like NumPy")
    native(f"add casting=unsafe out=int64 {dist}", lambda: np.add(I, 1.5, out=I.copy(), casting="unsafe"),
           np.add(i, 1.5, out=i.copy(), casting="unsafe"))
    native(f"operators ~ << >> divmod on integers {dist}", lambda: (~I, I << 2, 3 >> abs(I % 4)) + divmod(I, 3),
           (~i, i << 2, 3 >> abs(i % 4)) + divmod(i, 3))
    native(f"modf/frexp/divmod {dist}", lambda: np.modf(X) + np.frexp(X[::3]) + np.divmod(I, 4),
           np.modf(x) + np.frexp(x[::3]) + np.divmod(i, 4))
    m, e = dnp.zeros((7, 5), dist=dist), dnp.zeros((7, 5), dtype=np.int32, dist=dist)
    mm, ee = np.zeros((7, 5)), np.zeros((7, 5), dtype=np.int32)
    native(f"frexp out=(m, e) {dist}", lambda: np.frexp(X, out=(m, e)), np.frexp(x, out=(mm, ee)))
    a32 = values("f", (5, 3, 4), rng)
    A32 = dnp.from_numpy(a32, dist=dist)
    native(f"float32 3-D view arcsinh {dist}", lambda: np.arcsinh(A32[1:4, :, 1:]), np.arcsinh(C(a32[1:4, :, 1:])))
    native(f"float32 + Python float stays float32 {dist}", lambda: np.logaddexp(A32, 0.5), np.logaddexp(a32, 0.5))
    native(f"bool operand promotes {dist}", lambda: np.copysign(X > 0, Y), np.copysign(x > 0, y))
    native(f"numpy math sin {dist}", lambda: dnp.sin(X[::2]), np.sin(C(x[::2])))
    try:
        np.power(I, I)        # NumPy math is on: NumPy's integer power, which refuses negative exponents
    except ValueError as e:
        assert "negative integer powers" in str(e), e
    else:
        raise AssertionError("power of integers with negative exponents did not raise ValueError like NumPy")
    try:
        np.isnat(X)
    except TypeError:
        pass
    else:
        raise AssertionError("isnat of floats did not raise TypeError like NumPy")


def check_methods(dist, rng):
    x = values("d", (7, 5), rng)
    i = values("l", (7, 5), rng)
    X, I = dnp.from_numpy(x, dist=dist), dnp.from_numpy(i, dist=dist)
    cases = [
        ("hypot.reduce axis=1", lambda a: np.hypot.reduce(a, axis=1), X, x),
        ("subtract.reduce axis=-1 keepdims view", lambda a: np.subtract.reduce(a, axis=-1, keepdims=True), X[1:], x[1:]),
        ("fmax.reduce axis=0", lambda a: np.fmax.reduce(a, axis=0), X, x),
        ("fmin.reduce axis=None", lambda a: np.fmin.reduce(a, axis=None), X[::2], x[::2]),
        ("maximum.reduce axis=0 initial", lambda a: np.maximum.reduce(a, axis=0, initial=100.0), X, x),
        ("bitwise_xor.reduce axis=None", lambda a: np.bitwise_xor.reduce(a, axis=None), I, i),
        ("gcd.reduce axis=0 view", lambda a: np.gcd.reduce(a, axis=0), I[::2], i[::2]),
        ("add.reduce int (0,1) dtype", lambda a: np.add.reduce(a, axis=(0, 1), dtype=np.int32), I, i),
        ("logical_xor.reduce axis=0", lambda a: np.logical_xor.reduce(a > 0, axis=0), X, x),
        ("fmax.accumulate axis=1", lambda a: np.fmax.accumulate(a, axis=1), X, x),
        ("subtract.accumulate axis=1 view", lambda a: np.subtract.accumulate(a, axis=1), X[:, 1:], x[:, 1:]),
        ("add.accumulate axis=0", lambda a: np.add.accumulate(a, axis=0), I, i),
        ("multiply.outer", lambda a: np.multiply.outer(a[:, 0], a[0]), X, x),
        ("hypot.outer 2-D", lambda a: np.hypot.outer(a, a[0] if isinstance(a, np.ndarray) else x[0]), X, x),
        ("vecdot", lambda a: np.vecdot(a, a[::-1] if isinstance(a, np.ndarray) else a[::-1]), X, x),
        ("matvec", lambda a: np.matvec(a.reshape(7, 5, 1) * 1.0, a[:, :1] * 1.0), X, x),
    ]
    for what, f, A, a in cases:
        native(f"{what} {dist}", lambda: f(A), f(a))
    before = fallback_calls()
    same(np.subtract.reduce(X, axis=0), np.subtract.reduce(x, axis=0), "subtract.reduce over the rows (fallback)")
    assert fallback_calls() == before + 1, "subtract.reduce over the rows: expected one NumPy fallback call"


def check_selection(dist, rng):
    x = values("d", (7, 5), rng)
    X = dnp.from_numpy(x, dist=dist)
    c = rng.integers(0, 3, (7, 5))
    C = dnp.from_numpy(c, dist=dist)
    idx = np.array([4, 0, -1, 2, 2])
    mask = x[:, 1] > 0
    cases = [
        ("take axis 0", lambda: dnp.take(X, idx, axis=0), np.take(x, idx, axis=0)),
        ("take axis 1", lambda: np.take(X, idx, axis=1), np.take(x, idx, axis=1)),
        ("take flat 2-D indices clip", lambda: X.take([[1, 2], [3, 40]], mode="clip"), x.take([[1, 2], [3, 40]], mode="clip")),
        ("take distributed indices of a view", lambda: np.take(X[1:], dnp.from_numpy(np.array([0, 3, 5, 1]), dist=dist), axis=0),
         np.take(x[1:], [0, 3, 5, 1], axis=0)),
        ("compress axis 0", lambda: np.compress(mask, X, axis=0), np.compress(mask, x, axis=0)),
        ("compress distributed condition", lambda: np.compress(dnp.from_numpy(mask, dist=dist), X, axis=0),
         np.compress(mask, x, axis=0)),
        ("compress axis 1", lambda: np.compress([True, False, True], X, axis=1), np.compress([True, False, True], x, axis=1)),
        ("compress flat short condition", lambda: X.compress(mask[:4]), x.compress(mask[:4])),
        ("choose", lambda: np.choose(C, [X, X * 2, np.float32(3)]), np.choose(c, [x, x * 2, np.float32(3)])),
        ("choose wrap", lambda: np.choose(C + 2, [X, 3.0, X[0]], mode="wrap"), np.choose(c + 2, [x, 3.0, x[0]], mode="wrap")),
        ("choose clip method", lambda: (C - 1).choose([X, -X], mode="clip"), (c - 1).choose([x, -x], mode="clip")),
        ("resize larger", lambda: np.resize(X, (4, 11)), np.resize(x, (4, 11))),
        ("resize of a view", lambda: np.resize(X[::2, 1:], 5), np.resize(x[::2, 1:], 5)),
        ("index array, slice", lambda: X[[3, 1, 1, -2], 1:4], x[[3, 1, 1, -2], 1:4]),
        ("index array, integer", lambda: X[np.array([6, 0]), 2], x[np.array([6, 0]), 2]),
        ("slice, index array", lambda: X[1:6, [4, 0, 0]], x[1:6, [4, 0, 0]]),
        ("slice, mask", lambda: X[:, np.array([True, False, True, False, True])], x[:, np.array([True, False, True, False, True])]),
        ("repeat distributed counts", lambda: np.repeat(X, C[:, 0], axis=0), np.repeat(x, c[:, 0], axis=0)),
        ("repeat distributed counts of a view", lambda: np.repeat(X[1:], C[:-1, 1], axis=0), np.repeat(x[1:], c[:-1, 1], axis=0)),
        ("repeat flat distributed counts", lambda: np.repeat(X[:, 0], C[:, 2]), np.repeat(x[:, 0], c[:, 2])),
    ]
    for what, f, want in cases:
        native(f"{what} {dist}", f, want)
    for kth, axis in ((2, 1), ((1, 5), 0), (-1, None)):
        before = fallback_calls()
        p = np.partition(X, kth, axis=axis).to_numpy()
        ap = np.argpartition(X, kth, axis=axis).to_numpy()
        assert fallback_calls() == before, ("partition", dist, dnp.stats()["fallback"]["functions"])
        want = np.partition(x, kth, axis=axis)
        flat = x.reshape(-1) if axis is None else x
        ks = np.atleast_1d(kth)
        same(np.take(p, ks, axis=axis or 0), np.take(want, ks, axis=axis or 0), f"partition kth={kth} {dist}")
        same(np.take(np.take_along_axis(flat, ap, axis=axis or 0), ks, axis=axis or 0),
             np.take(want, ks, axis=axis or 0), f"argpartition kth={kth} {dist}")
    check_in_place(dist, rng, X, x)


def check_in_place(dist, rng, X, x):
    """put, the partition method, assignment through an index array and a slice, the shape setter,
    the resize method and correlate with the longer kernel, on copies of ``X``/``x``."""
    P, p = X.copy(), x.copy()
    native(f"put with repeats and duplicates {dist}", lambda: (np.put(P, [0, 7, 34, -1, 7], [10.0, 20.0, 30.0]), P)[1],
           (np.put(p, [0, 7, 34, -1, 7], [10.0, 20.0, 30.0]), p)[1])
    S, s = X.copy(), x.copy()
    S.partition(3, axis=1)
    s.partition(3, axis=1)
    same(S[:, 3], s[:, 3], f"partition method {dist}")
    Y, y = X.copy(), x.copy()
    Y[[0, 5], 1:3] = -1.0
    y[[0, 5], 1:3] = -1.0
    same(Y, y, f"assignment through an index array and a slice {dist}")
    Z, z = dnp.from_numpy(np.arange(12.0), dist=dist), np.arange(12.0)
    Z.shape, z.shape = (3, 4), (3, 4)
    same(Z, z, f"a.shape = (3, 4) {dist}")
    Z.shape, z.shape = (-1,), (-1,)
    same(Z, z, f"a.shape = (-1,) {dist}")
    V, v = dnp.from_numpy(z.reshape(3, 4).copy(), dist=dist), z.reshape(3, 4).copy()
    W, w = V[1:3], v[1:3]
    W.shape, w.shape = (8,), (8,)
    same(W, w, f"rows view .shape = (8,) {dist}")
    for bad, err in (((5,), ValueError),):
        try:
            Z.shape = bad
        except err:
            pass
        else:
            raise AssertionError("a.shape = (5,) of 12 elements did not raise ValueError")
    try:
        V[:, 1:].shape = (9,)
    except AttributeError:
        pass
    else:
        raise AssertionError("shape of a non-contiguous view did not raise AttributeError like NumPy")
    R, rr = dnp.from_numpy(np.arange(6.0), dist=dist), np.arange(6.0)
    R.resize((2, 4))
    rr.resize((2, 4))
    same(R, rr, f"resize method {dist}")
    a, k = rng.standard_normal(5), rng.standard_normal(13)
    A, K = dnp.from_numpy(a, dist=dist), dnp.from_numpy(k, dist=dist)
    for mode in ("full", "same", "valid"):
        native(f"correlate longer kernel {mode} {dist}", lambda: np.correlate(A, K, mode), np.correlate(a, k, mode))
        native(f"correlate numpy signal, longer distributed kernel {mode} {dist}", lambda: np.correlate(a, K, mode),
               np.correlate(a, k, mode))


PART = sys.argv[2] if len(sys.argv) > 2 else "all"
N = world().Get_size()
rng0 = np.random.default_rng(11)
if PART in ("ufuncs", "all"):
    # every ufunc once per run, its operand kind and layout rotating with the ufunc and the number of ranks
    # (the runs on 1, 2 and 3 ranks together see each ufunc on every layout)
    t0 = time.perf_counter()
    for j, u in enumerate(UFUNCS):
        ks = kinds_of(u)
        if u.signature is not None or not ks:
            continue                            # matmul, vecdot, matvec, vecmat: check_methods; isnat: check_keywords
        check_ufunc(u, ks[(j + N) % len(ks)], DISTS[(j + N) % len(DISTS)], rng0, j)
    print(f"rank {r}: ok ufuncs ({time.perf_counter() - t0:.1f} s)", flush=True)
if PART in ("rest", "all"):
    for dist in DISTS:
        t0 = time.perf_counter()
        check_keywords(dist, rng0)
        t1 = time.perf_counter()
        check_methods(dist, rng0)
        t2 = time.perf_counter()
        check_selection(dist, rng0)
        print(f"rank {r}: ok rest {dist} ({t1 - t0:.1f} s keywords, {t2 - t1:.1f} s methods, "
              f"{time.perf_counter() - t2:.1f} s selection)", flush=True)

NAMES = [u.__name__ for u in UFUNCS if u.signature is None and kinds_of(u)]
SHAPES = st.tuples(st.integers(1, 9), st.integers(1, 4)) | st.tuples(st.integers(1, 6), st.integers(1, 3),
                                                                     st.integers(1, 3))


@settings(derandomize=True, database=None, deadline=None, max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 40,
          suppress_health_check=list(HealthCheck))
@given(shape=SHAPES, dist=st.sampled_from(DISTS), name=st.sampled_from(NAMES), seed=st.integers(0, 1000),
       view=st.booleans(), scalar=st.booleans(), kpick=st.integers(0, 4))
def test_property(shape, dist, name, seed, view, scalar, kpick):
    u = getattr(np, name)
    ks = kinds_of(u)
    k = ks[kpick % len(ks)]
    rng = np.random.default_rng(seed)
    xs = operands(u, k, rng, shape)
    Xs = [dnp.from_numpy(x, dist=dist) for x in xs]
    if view and shape[0] > 2:
        Xs, xs = [X[::-2] for X in Xs], [x[::-2] for x in xs]
    if scalar and u.nin == 2:
        s = xs[1].reshape(-1)[0].item()
        Xs[1], xs[1] = s, s
    native(f"{name}[{k}] {shape} {dist} view={view} scalar={scalar}", lambda: u(*Xs), u(*[C(x) for x in xs]))


if PART in ("rest", "all"):
    test_property()
    print(f"rank {r}: ok hypothesis", flush=True)
print(f"rank {r}: ALL OK ({checked[0]} comparisons)", flush=True)
