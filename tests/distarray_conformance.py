"""Conformance of the native NumPy functions of the distributed arrays against NumPy, run SPMD by
tests/test_distarray_conformance.py on 1, 2 and 3 ranks: reductions (axis None/int/negative/tuple, keepdims,
dtype, out, where), the nan* family, argmin/argmax, cumsum/cumprod, shape functions, clip, round, outer,
diagonal, trace, dot, linalg.norm; sort/argsort, reshape/ravel, repeat, tile, nonzero, concatenate, append and the
stack family, convolve/correlate, cross, boolean masks and index arrays (native: nothing gathered to one rank); over block, cyclic and
block-cyclic layouts, views and uneven splits; then
property-based cases drawn by hypothesis (derandomized: every rank draws the same cases). Every native call
must leave the NumPy fallback's counter unchanged."""
import sys
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import nbmpi.workers.distarray as dnp
from nbmpi.workers import world

r = world().Get_rank()
warnings.simplefilter("ignore", RuntimeWarning)        # NumPy's all-NaN / dof warnings; we compare values
DISTS = ("block", "cyclic", ("block-cyclic", 2))
checked = [0]


def fallback_calls():
    return dnp.stats()["fallback"]["calls"]


def same(got, want, what, exact=False):
    g = got.to_numpy() if isinstance(got, dnp.DistArray) else np.asarray(got)
    w = np.asarray(want)
    assert g.shape == w.shape, (what, "shape", g.shape, w.shape)
    assert g.dtype == w.dtype, (what, "dtype", g.dtype, w.dtype)
    if w.dtype.kind == "f" and not exact:
        tol = 1e-4 if w.dtype == np.float32 else 1e-9
        assert np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True), (what, g, w)
    else:
        assert np.array_equal(g, w, equal_nan=w.dtype.kind == "f"), (what, g, w)
    checked[0] += 1


def native(what, call, want, exact=False):
    """``call()`` must not use the fallback (checked before its result is gathered) and equal ``want``."""
    before = fallback_calls()
    got = call()
    assert fallback_calls() == before, (what, "went through the NumPy fallback",
                                        dnp.stats()["fallback"]["functions"])
    same(got, want, what, exact)


def arrays(dist):
    """(name, DistArray, NumPy array) triples: uneven shapes, 1-D to 3-D, views, a replicated array."""
    rng = np.random.default_rng(7)
    f2 = rng.standard_normal((7, 5))
    i2 = rng.integers(-5, 6, size=(7, 5)).astype(np.int32)
    f3 = rng.standard_normal((5, 3, 4)).astype(np.float32)
    f1 = rng.standard_normal(11)
    A2, I2, A3, A1 = (dnp.from_numpy(x, dist=dist) for x in (f2, i2, f3, f1))
    return [("f2", A2, f2), ("i2", I2, i2), ("f3", A3, f3), ("f1", A1, f1),
            ("f2 view", A2[1:, ::2], f2[1:, ::2]), ("f2 rows", A2[::2], f2[::2]), ("f3 view", A3[1:4, :, 1:], f3[1:4, :, 1:]),
            ("f1 view", A1[2:9:3], f1[2:9:3]), ("bool", A2 > 0, f2 > 0),
            ("rep", dnp.from_numpy(f2, dist="replicated"), f2)]


def axes_of(nd):
    out = [None, 0, -1]
    if nd >= 2:
        out += [1, (0, 1), (-1, 0)]
    if nd >= 3:
        out += [(0, 2), (1, 2), (0, 1, 2)]
    return out


REDS = ["sum", "prod", "mean", "std", "var", "min", "max", "any", "all", "count_nonzero"]


def check_reductions(name, X, x):
    for axis in axes_of(x.ndim):
        for keepdims in (False, True):
            for f in REDS:
                tag = f"{f}({name}, axis={axis}, keepdims={keepdims})"
                native(tag, lambda: getattr(dnp, f)(X, axis=axis, keepdims=keepdims),
                       getattr(np, f)(x, axis=axis, keepdims=keepdims))
            if axis is None or isinstance(axis, int):
                for f in ("argmin", "argmax"):
                    native(f"{f}({name}, axis={axis})", lambda: getattr(dnp, f)(X, axis=axis, keepdims=keepdims),
                           getattr(np, f)(x, axis=axis, keepdims=keepdims))
    mask = (np.arange(x.size).reshape(x.shape) % 3) != 1
    for f in ("sum", "prod", "mean", "any", "all", "var"):
        native(f"{f}({name}, where=numpy mask)", lambda: getattr(dnp, f)(X, axis=0, where=mask),
               getattr(np, f)(x, axis=0, where=mask))
    if x.dtype.kind != "b":
        native(f"sum({name}, where=dist mask)", lambda: dnp.sum(X, axis=-1, where=X > 0), np.sum(x, axis=-1, where=x > 0))
        native(f"mean({name}, where=dist mask)", lambda: dnp.mean(X, where=X > -1), np.mean(x, where=x > -1))
    native(f"sum({name}, dtype=float32)", lambda: dnp.sum(X, axis=0, dtype=np.float32), np.sum(x, axis=0, dtype=np.float32))
    native(f"prod({name}, dtype=int64)", lambda: dnp.prod(X > 0, axis=-1, dtype=np.int64), np.prod(x > 0, axis=-1, dtype=np.int64))
    native(f"mean({name}, dtype=float64)", lambda: dnp.mean(X, axis=0, dtype=np.float64), np.mean(x, axis=0, dtype=np.float64))
    native(f"std({name}, ddof=1)", lambda: dnp.std(X, axis=0, ddof=1), np.std(x, axis=0, ddof=1))
    want = np.sum(x, axis=0)
    out = dnp.zeros(want.shape, dtype=want.dtype)
    native(f"sum({name}, out=)", lambda: dnp.sum(X, axis=0, out=out), want)
    same(out, want, f"sum({name}, out=) wrote out")
    # the methods, numpy.<f>(distarray) and ufunc.reduce dispatch natively too
    native(f"{name}.sum(axis=-1, keepdims)", lambda: X.sum(axis=-1, keepdims=True), x.sum(axis=-1, keepdims=True))
    native(f"{name}.argmax()", lambda: X.argmax(), x.argmax())
    native(f"np.mean({name}, axis=0)", lambda: np.mean(X, axis=0), np.mean(x, axis=0))
    native(f"np.multiply.reduce({name})", lambda: np.multiply.reduce(X, axis=0), np.multiply.reduce(x, axis=0))


def check_nan(name, X, x, dist):
    if x.dtype.kind != "f":
        return
    xn = x.copy()
    xn.flat[::4] = np.nan
    if x.ndim >= 2:
        xn[0] = np.nan                               # an all-NaN slice along the last axis
    Xn = dnp.from_numpy(xn, dist=dist)
    for axis in axes_of(x.ndim)[:4]:
        for f in ("nansum", "nanprod", "nanmean", "nanstd", "nanvar", "nanmin", "nanmax"):
            native(f"{f}({name} with NaN, axis={axis})", lambda: getattr(dnp, f)(Xn, axis=axis, keepdims=True),
                   getattr(np, f)(xn, axis=axis, keepdims=True))
    for f in ("min", "max", "argmin", "argmax", "sum", "mean"):
        native(f"{f}({name} with NaN)", lambda: getattr(dnp, f)(Xn, axis=0), getattr(np, f)(xn, axis=0))
    for f in ("argmin", "argmax"):   # over all elements: the first NaN, across ranks
        native(f"{f}({name} with NaN, axis=None)", lambda: getattr(dnp, f)(Xn), getattr(np, f)(xn))
        native(f"{f}({name} with NaN)[1:]", lambda: getattr(dnp, f)(Xn[1:]), getattr(np, f)(xn[1:]))


def check_cumulative(name, X, x):
    small = dnp.where(X > 0, 1, 2) if x.dtype.kind != "b" else X    # products of 1s and 2s: no overflow
    s = np.where(x > 0, 1, 2) if x.dtype.kind != "b" else x
    for f in ("cumsum", "cumprod"):
        for axis in ([None] if x.ndim == 1 else []) + list(range(-1, x.ndim)):
            native(f"{f}({name}, axis={axis})", lambda: getattr(dnp, f)(X, axis=axis), getattr(np, f)(x, axis=axis),
                   exact=True)
            native(f"{f}(small {name}, axis={axis})", lambda: getattr(dnp, f)(small, axis=axis),
                   getattr(np, f)(s, axis=axis), exact=True)
        native(f"{name}.{f}(axis=0, dtype=float64)", lambda: getattr(X, f)(axis=0, dtype=np.float64),
               getattr(x, f)(axis=0, dtype=np.float64), exact=True)


def check_shapes(name, X, x):
    native(f"expand_dims({name}, 1)", lambda: dnp.expand_dims(X, 1), np.expand_dims(x, 1))
    native(f"expand_dims({name}, (-1, 1))", lambda: dnp.expand_dims(X, (-1, 1)), np.expand_dims(x, (-1, 1)))
    native(f"squeeze({name}[..., :1])", lambda: dnp.squeeze(X[..., :1]), np.squeeze(x[..., :1]))
    native(f"{name}[..., None].squeeze(-1)", lambda: X[..., None].squeeze(-1), x[..., None].squeeze(-1))
    if x.ndim >= 2:
        native(f"flip({name}, 1)", lambda: dnp.flip(X, 1), np.flip(x, 1))
        native(f"flip({name}, -1)", lambda: dnp.flip(X, -1), np.flip(x, -1))
    if x.ndim == 2:
        native(f"swapaxes({name})", lambda: dnp.swapaxes(X, 0, 1), np.swapaxes(x, 0, 1))
        native(f"{name}.swapaxes(1, 0)", lambda: X.swapaxes(1, 0), x.swapaxes(1, 0))
        for k in (0, 1, -2, 3):
            native(f"diagonal({name}, {k})", lambda: dnp.diagonal(X, k), np.diagonal(x, k))
            native(f"trace({name}, {k})", lambda: dnp.trace(X, k), np.trace(x, k))
        native(f"{name}.diagonal()", lambda: X.diagonal(), x.diagonal())
    if x.dtype.kind != "b":
        native(f"clip({name})", lambda: dnp.clip(X, -1, 0.5), np.clip(x, -1, 0.5))
        native(f"clip({name}, max only)", lambda: dnp.clip(X, None, 0), np.clip(x, None, 0))
        native(f"{name}.clip(0)", lambda: X.clip(0), x.clip(0))
        for d in (0, 2, -1):
            if x.dtype.kind == "f" or d >= 0:
                native(f"round({name}, {d})", lambda: dnp.round(X * 7.3, d), np.round(x * 7.3, d))
        native(f"{name}.round(1)", lambda: (X * 3.7).round(1), (x * 3.7).round(1))
    if x.ndim == 1:
        y = np.linspace(-1, 1, 4)
        native(f"outer({name}, numpy)", lambda: dnp.outer(X, y), np.outer(x, y))
        native(f"outer({name}, {name})", lambda: dnp.outer(X, X), np.outer(x, x))
        native(f"dot({name}, {name})", lambda: dnp.dot(X, X), np.dot(x, x))
    if x.ndim == 2 and (x.dtype.kind == "f" or x.dtype == np.int64):
        v = np.arange(x.shape[0], dtype=x.dtype) - 2
        m = x.shape[1]
        if x.shape[0] >= m:             # a row (held by one rank) times rows spread over the ranks
            native(f"{name}[1] @ {name}[:{m}]", lambda: X[1] @ X[:m], x[1] @ x[:m])
        native(f"{name}[:, 0] @ {name}", lambda: X[:, 0] @ X, x[:, 0] @ x)
        native(f"numpy @ {name}", lambda: v @ X, v @ x)
        native(f"dot(numpy, {name})", lambda: dnp.dot(v, X), np.dot(v, x))
    if x.dtype.kind != "b":
        ords = [None, 1, 2, np.inf, -np.inf, 0, 3] if x.ndim == 1 else [None, "fro", 1, -1, np.inf, -np.inf]
        for o in ords:
            if x.ndim <= 2:
                native(f"linalg.norm({name}, ord={o})", lambda: dnp.linalg.norm(X, o), np.linalg.norm(x, o))
        native(f"linalg.norm({name}, axis=-1)", lambda: dnp.linalg.norm(X, axis=-1, keepdims=True),
               np.linalg.norm(x, axis=-1, keepdims=True))
        native(f"np.linalg.norm({name})", lambda: np.linalg.norm(X), np.linalg.norm(x))


def check_sorting(name, X, x):
    for axis in [None, 0, -1] + ([1] if x.ndim >= 3 else []):
        native(f"sort({name}, axis={axis})", lambda: dnp.sort(X, axis=axis), np.sort(x, axis=axis), exact=True)
        for kind in (None, "stable"):       # ties keep the input's order for every kind: NumPy's stable order
            native(f"argsort({name}, axis={axis}, kind={kind})", lambda: dnp.argsort(X, axis=axis, kind=kind),
                   np.argsort(x, axis=axis, kind="stable").astype(np.int64))
    native(f"{name}.argsort(axis=0)", lambda: X.argsort(axis=0), x.argsort(axis=0, kind="stable").astype(np.int64))
    if x.ndim == 1:
        S, s, q = dnp.sort(X), np.sort(x), np.array([[-1.0, 0.0], [0.5, 9.0]])
        for side in ("left", "right"):
            native(f"searchsorted(sort({name}), side={side})", lambda: dnp.searchsorted(S, q, side),
                   np.searchsorted(s, q, side).astype(np.int64))
    if not X._base.replicated:
        Y, y = X.copy(), x.copy()
        native(f"{name}.sort(axis=0) in place", lambda: (Y.sort(axis=0), Y)[1], (y.sort(axis=0), y)[1], exact=True)


def check_moving(name, X, x):
    """reshape, ravel, repeat, tile, axis permutations, nonzero: elements sent across the distributed axis; flip
    of axis 0 (a view with a negative row step)."""
    for shape in [(x.size,), x.shape[::-1], (-1, x.shape[-1]) if x.ndim > 1 else (x.size, 1)]:
        native(f"reshape({name}, {shape})", lambda: dnp.reshape(X, shape), np.reshape(x, shape), exact=True)
    native(f"{name}.reshape(1, -1)", lambda: X.reshape(1, -1), x.reshape(1, -1), exact=True)
    native(f"ravel({name})", lambda: dnp.ravel(X), np.ravel(x), exact=True)
    native(f"{name}.flatten()", lambda: X.flatten(), x.flatten(), exact=True)
    counts = np.arange(x.shape[0]) % 3
    native(f"repeat({name}, 2, axis=0)", lambda: dnp.repeat(X, 2, axis=0), np.repeat(x, 2, axis=0), exact=True)
    native(f"repeat({name}, counts, axis=0)", lambda: dnp.repeat(X, counts, axis=0), np.repeat(x, counts, axis=0),
           exact=True)
    native(f"repeat({name}, 2)", lambda: dnp.repeat(X, 2), np.repeat(x, 2), exact=True)
    native(f"repeat({name}, 3, axis=-1)", lambda: X.repeat(3, axis=-1), x.repeat(3, axis=-1), exact=True)
    for reps in (2, (2,) + (1,) * (x.ndim - 1), (2,) * (x.ndim + 1)):
        native(f"tile({name}, {reps})", lambda: dnp.tile(X, reps), np.tile(x, reps), exact=True)
    native(f"flip({name}, 0)", lambda: dnp.flip(X, 0), np.flip(x, 0), exact=True)
    native(f"flip({name})", lambda: dnp.flip(X), np.flip(x), exact=True)
    if x.ndim >= 2:
        axes = tuple(range(1, x.ndim)) + (0,)
        native(f"transpose({name}, {axes})", lambda: np.transpose(X, axes), np.transpose(x, axes), exact=True)
        native(f"{name}.T", lambda: X.T, x.T, exact=True)
        native(f"swapaxes({name}, 0, -1)", lambda: dnp.swapaxes(X, 0, -1), np.swapaxes(x, 0, -1), exact=True)
        native(f"moveaxis({name}, 0, -1)", lambda: dnp.moveaxis(X, 0, -1), np.moveaxis(x, 0, -1), exact=True)
    m, mx = (X, x) if x.dtype.kind == "b" else (X > 0.3, x > 0.3)
    before = fallback_calls()
    got, want = dnp.nonzero(m), np.nonzero(mx)
    assert fallback_calls() == before and len(got) == len(want), (name, "nonzero")
    for g, w in zip(got, want):
        same(g, w.astype(np.int64), f"nonzero({name})")
    native(f"flatnonzero({name})", lambda: dnp.flatnonzero(m), np.flatnonzero(mx).astype(np.int64))
    native(f"where({name})[-1]", lambda: dnp.where(m)[-1], np.where(mx)[-1].astype(np.int64))
    native(f"argwhere({name})", lambda: dnp.argwhere(m), np.argwhere(mx).astype(np.int64))


def check_joining(name, X, x):
    native(f"concatenate({name} x2)", lambda: dnp.concatenate([X, X]), np.concatenate([x, x]), exact=True)
    native(f"concatenate({name}, numpy, axis=-1)", lambda: dnp.concatenate([X, x * 2], axis=-1),
           np.concatenate([x, x * 2], axis=-1), exact=True)
    native(f"concatenate({name}, axis=None)", lambda: dnp.concatenate([X, X[:1]], axis=None),
           np.concatenate([x, x[:1]], axis=None), exact=True)
    for axis in (0, -1):
        native(f"stack({name}, axis={axis})", lambda: dnp.stack([X, x], axis=axis), np.stack([x, x], axis=axis),
               exact=True)
    native(f"append({name}, numpy)", lambda: dnp.append(X, x[:1]), np.append(x, x[:1]), exact=True)
    native(f"append({name}, scalar)", lambda: dnp.append(X, 2.5), np.append(x, 2.5), exact=True)
    native(f"append({name}, 0-d sum)", lambda: dnp.append(X, dnp.sum(X)), np.append(x, np.sum(x)))
    native(f"append({name}, {name}, axis=0)", lambda: dnp.append(X, X, axis=0), np.append(x, x, axis=0), exact=True)
    for f in ("hstack", "vstack", "dstack"):
        native(f"{f}({name})", lambda: getattr(dnp, f)([X, X]), getattr(np, f)([x, x]), exact=True)
    if x.ndim == 1:
        v = np.array([0.5, -1.0, 2.0])
        for mode in ("full", "same", "valid"):
            native(f"convolve({name}, {mode})", lambda: dnp.convolve(X, v, mode), np.convolve(x, v, mode))
            native(f"correlate({name}, {mode})", lambda: dnp.correlate(X, v[:2], mode), np.correlate(x, v[:2], mode))
    if x.ndim >= 2 and x.shape[-1] >= 4 and x.dtype.kind != "b":
        native(f"cross({name})", lambda: dnp.cross(X[..., :3], X[..., 1:4]), np.cross(x[..., :3], x[..., 1:4]))


def check_masks(name, X, x):
    """a[mask], a[mask, ...] = v with a distributed mask laid out like a, a[:, idx], iteration (whole arrays)."""
    if not X._view.is_full or X.dist.kind == "replicated":
        return
    M, mx = X > 0, x > 0
    native(f"{name}[mask]", lambda: X[M], x[mx], exact=True)
    Y, y = X * 1, x * 1
    Y[M] = Y[M] * 2
    y[mx] = y[mx] * 2
    native(f"{name}[mask] = {name}[mask] * 2", lambda: Y, y, exact=True)
    Y[M] = 7
    y[mx] = 7
    native(f"{name}[mask] = 7", lambda: Y, y, exact=True)
    if x.ndim >= 2:
        first = (slice(None),) + (0,) * (x.ndim - 1)         # a 1-D mask of axis 0
        L, lx = X[first] > 0, x[first] > 0
        native(f"{name}[lead mask, ...]", lambda: X[L, ...], x[lx, ...], exact=True)
        Y[L, ...] = x[lx] + 1
        y[lx, ...] = x[lx] + 1
        native(f"{name}[lead mask, ...] = numpy", lambda: Y, y, exact=True)
        idx = [x.shape[1] - 1, 0]
        native(f"{name}[:, idx]", lambda: X[:, idx], x[:, idx], exact=True)
    else:
        before = fallback_calls()
        assert [v for v in X] == list(x) and fallback_calls() == before, f"iterating {name}"


#: which part runs: "recorded" (reductions ... linalg.norm, the first hypothesis cases), "native" (sort ... cross,
#: their hypothesis cases) or "all"; the test runs the two parts as separate programs, each within its timeout
PART = sys.argv[2] if len(sys.argv) > 2 else "all"
for dist in DISTS if PART != "native" else ():
    for name, X, x in arrays(dist):
        check_reductions(name, X, x)
        check_nan(name, X, x, dist)
        check_cumulative(name, X, x)
        check_shapes(name, X, x)
    print(f"rank {r}: ok {dist}", flush=True)
for dist in DISTS if PART != "recorded" else ():
    for name, X, x in arrays(dist):
        check_sorting(name, X, x)
        check_moving(name, X, x)
        check_joining(name, X, x)
        check_masks(name, X, x)
    print(f"rank {r}: ok native {dist}", flush=True)

if PART != "native":                              # the rest of numpy.linalg goes through the fallback, counted
    before = fallback_calls()
    M = np.eye(4) * 3 + 1
    same(dnp.linalg.inv(dnp.from_numpy(M)), np.linalg.inv(M), "linalg.inv (fallback)")
    assert fallback_calls() == before + 1, "linalg.inv did not go through the fallback"
    print(f"rank {r}: ok linalg fallback", flush=True)

SHAPES = st.tuples(st.integers(1, 9), st.integers(1, 4)) | st.tuples(st.integers(1, 7), st.integers(1, 3),
                                                                     st.integers(1, 3))
FUNCS = ["sum", "prod", "mean", "std", "var", "min", "max", "argmin", "argmax", "any", "all", "count_nonzero",
         "nansum", "nanmean", "nanmin", "nanmax", "nanvar", "cumsum"]


@settings(derandomize=True, database=None, deadline=None, max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 40,
          suppress_health_check=list(HealthCheck))
@given(shape=SHAPES, dist=st.sampled_from(DISTS), f=st.sampled_from(FUNCS), keepdims=st.booleans(),
       axis_pick=st.integers(-1, 5), seed=st.integers(0, 1000), ints=st.booleans(), view=st.booleans())
def test_property(shape, dist, f, keepdims, axis_pick, seed, ints, view):
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=shape) if ints else rng.standard_normal(shape)
    if not ints and f.startswith("nan"):
        x[rng.random(shape) < 0.3] = np.nan
    X = dnp.from_numpy(x, dist=dist)
    if view and shape[0] > 2:
        X, x = X[1::2], x[1::2]
    nd = x.ndim
    axis = None if axis_pick >= nd + 1 else (axis_pick % nd if axis_pick >= 0 else -1)
    if f in ("cumsum",):
        axis = 0 if axis is None else axis
        native(f"{f} {shape} {dist} axis={axis}", lambda: getattr(dnp, f)(X, axis=axis), getattr(np, f)(x, axis=axis),
               exact=True)
        return
    kw = {"axis": axis, "keepdims": keepdims}
    native(f"{f} {shape} {dist} {kw} view={view}", lambda: getattr(dnp, f)(X, **kw), getattr(np, f)(x, **kw))


if PART != "native":
    test_property()
    print(f"rank {r}: ok hypothesis", flush=True)


@settings(derandomize=True, database=None, deadline=None, max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 40,
          suppress_health_check=list(HealthCheck))
@given(shape=SHAPES, dist=st.sampled_from(DISTS), axis_pick=st.integers(-1, 3), seed=st.integers(0, 1000),
       kind=st.sampled_from(["int", "float", "nan"]), view=st.booleans())
def test_property_sort(shape, dist, axis_pick, seed, kind, view):
    """sort/argsort (ties and NaN), nonzero and reshape across the distributed axis, against NumPy."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=shape) if kind == "int" else rng.standard_normal(shape)
    if kind == "nan":
        x[rng.random(shape) < 0.3] = np.nan
    X = dnp.from_numpy(x, dist=dist)
    if view and shape[0] > 2:
        X, x = X[::-2], x[::-2]
    axis = None if axis_pick >= x.ndim else axis_pick
    tag = f"{shape} {dist} {kind} axis={axis} view={view}"
    native(f"sort {tag}", lambda: dnp.sort(X, axis=axis), np.sort(x, axis=axis), exact=True)
    native(f"argsort {tag}", lambda: dnp.argsort(X, axis=axis, kind="stable"),
           np.argsort(x, axis=axis, kind="stable").astype(np.int64))
    native(f"flatnonzero {tag}", lambda: dnp.flatnonzero(X > 0), np.flatnonzero(x > 0).astype(np.int64))
    native(f"reshape {tag}", lambda: X.reshape(x.shape[::-1]), x.reshape(x.shape[::-1]), exact=True)


if PART != "recorded":
    test_property_sort()
    print(f"rank {r}: ok hypothesis native", flush=True)
print(f"rank {r}: ALL OK ({checked[0]} comparisons)", flush=True)
