"""Python ints outside an operand's integer dtype, and ``arange`` in narrow dtypes, against NumPy 2 (NEP 50):

* comparisons (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, reversed operands, ``numpy.equal`` & co, ``out=``)
  with a Python int outside the array's integer dtype compare by value (``uint8_array == 256`` is all False,
  ``int8_array > 200`` all False), as NumPy does; before, the int was wrapped into the dtype (256 as uint8 is 0);
* arithmetic with such an int raises NumPy's own ``OverflowError`` (same message: ``Python integer 300 out of
  bounds for int8``) on every rank, in-place operators and ``a[...] = 300`` too, and leaves the array as it was;
  before, the int wrapped silently; ints beyond 64 bits with a float loop give NumPy's floats (before: a kernel
  typing error at the force point);
* ``arange(start, stop, step, dtype=)`` is bit for bit ``numpy.arange`` (filled in the target dtype from the
  stored first two values): ``arange(0, 1, 0.1, dtype=float32)[9]`` is 0.90000004, not 0.89999998.

Real mpiexec on 2 and 3 ranks (block and cyclic rows, views), and a hypothesis property test of ``arange`` in
this process (one rank) and of its per-rank values."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_ok

PRELUDE = """
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world

r = world().Get_rank()
checked = [0]


def same(got, want, what):
    g = np.asarray(got)
    assert g.shape == want.shape and g.dtype == want.dtype, (what, g.shape, g.dtype, want.shape, want.dtype)
    assert np.array_equal(g, want), (what, g, want)
    checked[0] += 1


def outcome(f, *args):
    '''("ok", result) or ("error", type, message) of f(*args).'''
    try:
        with np.errstate(all="ignore"):
            return ("ok", f(*args))
    except Exception as e:
        return ("error", type(e).__name__, str(e))
"""

COMPARISONS = PRELUDE + """
OPS = [("==", lambda a, v: a == v, lambda a, v: v == a), ("!=", lambda a, v: a != v, lambda a, v: v != a),
       ("<", lambda a, v: a < v, lambda a, v: v < a), ("<=", lambda a, v: a <= v, lambda a, v: v <= a),
       (">", lambda a, v: a > v, lambda a, v: v > a), (">=", lambda a, v: a >= v, lambda a, v: v >= a)]
UFUNCS = [np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal]
INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]

for dist in ("block", "cyclic"):
    for t in INTS:
        info = np.iinfo(t)
        x = np.array([info.min, info.max, 0, 1, info.max // 2, info.min // 2 + 1, 7] * 3, dtype=t).reshape(7, 3)
        X = dnp.from_numpy(x, dist=dist)
        outside = [int(info.min) - 1, int(info.max) + 1, -1 if info.min == 0 else -2**70, 2**64, 2**70, 256]
        for v in [v for v in outside if not info.min <= v <= info.max]:
            for name, f, rf in OPS:
                same(f(X, v), f(x, v), f"{dist} {t.__name__} {name} {v}")
                same(rf(X, v), rf(x, v), f"{dist} {t.__name__} {v} {name} (reversed)")
            for u in UFUNCS:
                same(u(X, v), u(x, v), f"{dist} np.{u.__name__}({t.__name__}, {v})")
                same(u(v, X), u(v, x), f"{dist} np.{u.__name__}({v}, {t.__name__})")
            # a view, an expression operand, an out= array, a combination with another comparison
            same(X[1:, ::2] < v, x[1:, ::2] < v, f"{dist} view < {v}")
            same((X * 1) >= v, (x * 1) >= v, f"{dist} expression >= {v}")
            o, O = np.ones(x.shape, bool), dnp.ones(x.shape, dtype=bool, dist=dist)
            np.equal(X, v, out=O)
            same(O, np.equal(x, v, out=o), f"{dist} equal(out=) {v}")
            same((X != v) & (X > 0), (x != v) & (x > 0), f"{dist} (x != {v}) & (x > 0)")
        # inside the range the comparison reads the array, as before
        for v in (int(info.min), int(info.max), 0):
            same(X == v, x == v, f"{dist} {t.__name__} == {v}")
            same(v < X, v < x, f"{dist} {v} < {t.__name__}")
    b = np.array([True, False, True])       # compared as int64: NumPy's error beyond it
    for v in (2**70, -2**70, 2**63, 300, -1):
        want = outcome(lambda a: a == v, b)
        got = outcome(lambda a: np.asarray(a == v), dnp.from_numpy(b, dist=dist))
        assert got[0] == want[0] and (got[1:] == want[1:] if got[0] == "error" else np.array_equal(got[1], want[1])), \
            (dist, "bool ==", v, got, want)
    f32 = np.array([1.0, 2.0**70, -3.0], np.float32)
    same(dnp.from_numpy(f32, dist=dist) == 2**70, f32 == 2**70, f"{dist} float32 == 2**70")
print(f"rank {r}: comparisons OK ({checked[0]} checks)", flush=True)
"""

ARITHMETIC = PRELUDE + """
def iadd(a, v):
    a += v
    return a


def isub(a, v):
    a -= v
    return a


def imul(a, v):
    a *= v
    return a


def setall(a, v):
    a[...] = v
    return a


def setone(a, v):
    a[1] = v
    return a


OPS = [("+", lambda a, v: a + v), ("-", lambda a, v: a - v), ("*", lambda a, v: a * v),
       ("v + a", lambda a, v: v + a), ("v - a", lambda a, v: v - a), ("&", lambda a, v: a & v),
       ("|", lambda a, v: a | v), ("^", lambda a, v: a ^ v), ("//", lambda a, v: a // v), ("%", lambda a, v: a % v),
       ("**", lambda a, v: a ** v), ("np.add", np.add), ("np.subtract", np.subtract), ("np.maximum", np.maximum),
       ("np.minimum", np.minimum), ("np.multiply(v, a)", lambda a, v: np.multiply(v, a)),
       ("+=", iadd), ("-=", isub), ("*=", imul), ("a[...] = v", setall), ("a[1] = v", setone)]
CASES = [(np.int8, 300), (np.int8, -129), (np.uint8, -1), (np.uint8, 256), (np.int16, 2**15), (np.uint16, -1),
         (np.int32, 2**31), (np.uint32, 2**32), (np.int64, 2**63), (np.int64, -2**63 - 1), (np.uint64, -1),
         (np.uint64, 2**64), (np.int64, 2**70)]
errors = 0
for dist in ("block", "cyclic"):
    for t, v in CASES:
        x = np.arange(1, 7, dtype=t)
        for name, f in OPS:
            want = outcome(f, x.copy(), v)
            X = dnp.from_numpy(x, dist=dist)
            got = outcome(lambda a, w: np.asarray(f(a, w)), X, v)
            what = f"{dist} {t.__name__} {name} {v}"
            if want[0] == "error":
                assert got == want, (what, got, want)
                same(X, x, what + " (the array is unchanged)")
                errors += 1
            else:
                assert got[0] == "ok", (what, got, want)
                same(got[1], want[1], what)
        same(dnp.from_numpy(x, dist=dist) + 1, x + 1, f"{dist} {t.__name__} + 1 after the errors")
    # no error: true division, float loops, Python ints beyond 64 bits converted as NumPy converts them
    i8, i64 = np.arange(-3, 4, dtype=np.int8), np.arange(-3, 4, dtype=np.int64)
    f32 = np.linspace(-2, 2, 7, dtype=np.float32)
    for name, f, x in [("int8 / 300", lambda a: a / 300, i8), ("int64 / 2**64", lambda a: a / 2**64, i64),
                       ("float32 + 10**40", lambda a: a + 10**40, f32), ("float32 * 2**70", lambda a: a * 2**70, f32),
                       ("where(int64 > 0, int64, 2**63)", lambda a: np.where(a > 0, a, 2**63), i64),
                       ("where(float32 > 0, 2**70, float32)", lambda a: np.where(a > 0, 2**70, a), f32),
                       ("uint8 where 300 (NumPy casts it)", lambda a: np.where(a > 0, a, 300), i8.astype(np.uint8)),
                       # np.clip: a Python int bound at or beyond the integer dtype's range is no bound (NumPy's _clip)
                       ("clip(int8, -300, 300)", lambda a: np.clip(a, -300, 300), i8),
                       ("clip(int8, -2, 300)", lambda a: np.clip(a, -2, 300), i8),
                       ("clip(uint8, -5, 2)", lambda a: np.clip(a, -5, 2), i8.astype(np.uint8)),
                       ("clip(int64, 0, 2**70)", lambda a: np.clip(a, 0, 2**70), i64)]:
        with np.errstate(all="ignore"):
            want = f(x)
            got = np.asarray(f(dnp.from_numpy(x, dist=dist)))
        same(got, want, f"{dist} {name}")
    for name, f, x in [("logical_and(int64, 2**70)", lambda a: np.logical_and(a, 2**70), i64),
                       ("where(int8 > 0, int8, 2**70)", lambda a: np.where(a > 0, a, 2**70), i8)]:
        want = outcome(f, x)
        got = outcome(lambda a: np.asarray(f(a)), dnp.from_numpy(x, dist=dist))
        assert want[0] == "error" and got == want, (name, got, want)
assert errors > 200, errors
print(f"rank {r}: overflow errors OK ({errors} errors, {checked[0]} checks)", flush=True)
"""

ARANGE = PRELUDE + """
CASES = [(0, 1, 0.1, "float32"), (0, 1, 0.1, "float64"), (1, 0, -0.1, "float32"), (-3.3, 7.1, 0.37, "float32"),
         (0.5, 40.5, 1.5, "float16"), (0, 10000, 0.7, "float32"), (3, -300, -7, "int8"), (0, 600, 3, "uint8"),
         (-2**62, 2**62, 2**58 + 3, "int64"), (2**64 - 10, 2**64, 1, "uint64"), (0.5, 20, 1.5, "int32"),
         (0, 2, 1, "bool"), (-5, 5, 1, None), (0.25, 9.0, 0.5, None)]
for dist in ("block", "cyclic", ("block-cyclic", 3)):
    for start, stop, step, dt in CASES:
        want = np.arange(start, stop, step, dtype=dt)
        got = dnp.arange(start, stop, step, dtype=dt, dist=dist)
        g = np.asarray(got)
        assert g.dtype == want.dtype and g.tobytes() == want.tobytes(), (dist, start, stop, step, dt, g, want)
        checked[0] += 1
assert np.asarray(dnp.arange(0, 1, 0.1, dtype="float32"))[9] == np.float32(0.90000004)
try:
    dnp.arange(0, 3, dtype=bool)
except TypeError as e:
    assert "at most length 2" in str(e), e
else:
    raise AssertionError("arange(0, 3, dtype=bool) did not raise")
print(f"rank {r}: arange OK ({checked[0]} checks)", flush=True)
"""


def _run(run_mpi, kernel_cache, code, n, mark):
    p = run_mpi(code, n=n, timeout=280, env={"NBMPI_DISTARRAY_CACHE": kernel_cache})
    assert_ok(p)
    for k in range(n):
        assert f"rank {k}: {mark} OK (" in p.stdout, p.stdout
    return p


@pytest.mark.parametrize("n", [2, 3])
def test_comparisons_with_out_of_range_python_ints_compare_by_value(run_mpi, kernel_cache, n):
    _run(run_mpi, kernel_cache, COMPARISONS, n, "comparisons")


@pytest.mark.parametrize("n", [2, 3])
def test_arithmetic_with_out_of_range_python_ints_raises_numpys_overflow_error(run_mpi, kernel_cache, n):
    _run(run_mpi, kernel_cache, ARITHMETIC, n, "overflow errors")


@pytest.mark.parametrize("n", [2, 3])
def test_distributed_arange_is_numpys_bit_for_bit(run_mpi, kernel_cache, n):
    _run(run_mpi, kernel_cache, ARANGE, n, "arange")


_DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


@st.composite
def _arange_args(draw):
    """``(start, stop, step, dtype)`` with at most 2000 values (Python and NumPy scalars; some raise in NumPy)."""
    dt = draw(st.sampled_from(_DTYPES))
    kind = np.dtype(dt).kind
    num = st.floats(-1e4, 1e4, allow_nan=False, width=64) if kind == "f" else st.integers(-300, 300)
    start = draw(st.one_of(num, st.integers(-1000, 1000), st.sampled_from(
        [0, 0.1, -0.3, 1 / 3, np.float32(0.1), np.float64(-1.5), np.int64(-1), np.float32(300.5)])))
    step = draw(st.one_of(st.floats(-50, 50, allow_nan=False).filter(lambda s: abs(s) > 1e-3),
                          st.integers(-40, 40).filter(bool), st.sampled_from([0.1, -0.1, 0.7, 1 / 3, np.float32(0.3)])))
    count = draw(st.integers(0, 2000))
    if kind == "u" and draw(st.integers(0, 4)):      # else NumPy's OverflowError for a negative element
        start, step = abs(start), abs(step)
    if kind in "iu" and isinstance(start, int):
        start = min(max(start, int(np.iinfo(dt).min)), int(np.iinfo(dt).max))
    return start, start + step * count + draw(st.sampled_from([0, step / 2])), step, dt


@settings(max_examples=400, deadline=None)
@given(_arange_args())
def test_arange_matches_numpy_arange_bit_for_bit(args):
    """``dnp.arange`` (this process: one rank) and the values each rank of a block or cyclic split computes
    (:func:`creation._arange_values` on that rank's indices) are ``numpy.arange``'s, bit for bit; or it raises
    NumPy's error (type and message)."""
    import nbmpi.workers.distarray as dnp

    start, stop, step, dt = args
    try:
        with np.errstate(all="ignore"):
            want = np.arange(start, stop, step, dtype=dt)
    except (OverflowError, ValueError, TypeError) as e:
        with pytest.raises(type(e), match=re.escape(str(e))), np.errstate(all="ignore"):
            dnp.arange(start, stop, step, dtype=dt)
        return
    with np.errstate(all="ignore"):
        got = np.asarray(dnp.arange(start, stop, step, dtype=dt))
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (args, got, want)
    from nbmpi.workers.distarray.creation import _arange_head, _arange_values

    n = len(want)
    for idx in (np.arange(n // 3, n, dtype=np.int64), np.arange(1, n, 3, dtype=np.int64)):
        with np.errstate(all="ignore"):
            part = _arange_values(_arange_head(start, step, n, np.dtype(dt)), n, idx)
        assert part.tobytes() == want[idx].tobytes(), (args, idx[:4])
