"""NumPy's floating-point error handling (``numpy.errstate``, ``numpy.seterr``) for distributed arrays, under real
mpiexec on 2 and 3 ranks (the elements that raise a flag are on one rank only):

* the warnings NumPy gives (divide by zero, overflow, invalid value; in a compiled kernel, in NumPy's ufunc on
  each block, in a cast, in a reduction) are given with NumPy's text, by the ranks holding the elements (their
  union over the ranks is NumPy's set), at the user's line of the force point, once per line in a loop;
* the handling in effect when an operation was recorded is the one used: an operation recorded under
  ``errstate(divide='ignore')`` and evaluated after the ``with`` block is quiet;
* ``errstate(divide='raise')``: FloatingPointError with NumPy's text on every rank, at the operation's line (the
  program then goes on). Before, a NumPy loop raised on one rank only and the others waited until
  ``NBMPI_TIMEOUT`` (and one printed uninitialized memory); a compiled kernel raised nothing;
* the ``warnings`` filters in effect when an operation was recorded are the ones its warning meets; under
  ``simplefilter('error')`` every rank raises the RuntimeWarning at the operation's line;
* ``errstate(all='call')`` calls the ``seterrcall`` function with NumPy's arguments;
* integer division and remainder by zero warn (and raise) as NumPy's;
* results equal NumPy's (inf and NaN included), and an operation without errors warns nowhere.
"""
from __future__ import annotations

import pytest

from conftest import run_code_all_ok

SCRIPT = """
import warnings
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world


def same_typed(what, got, want):
    # dtype, shape and values exactly, NaN equal to NaN
    g = np.asarray(got)
    assert g.dtype == want.dtype and g.shape == want.shape, (what, g.dtype, g.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(g, want, err_msg=what)

comm = world()
r = comm.Get_rank()
checked = [0]
x = np.arange(6.0) - 1          # [-1, 0, 1, 2, 3, 4]: the zero and the negative value on rank 0


def texts(w):
    return sorted({str(m.message) for m in w if issubclass(m.category, RuntimeWarning)})


def compare(what, fn, *, action="always"):
    # the warnings of fn(numpy) and of fn(dnp) forced; the union over the ranks must be NumPy's set
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter(action)
        want = fn(np, x)
    want_texts = texts(w)
    a = dnp.asarray(x)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter(action)
        got = np.asarray(fn(dnp, a))
    mine = texts(w)
    union = sorted(set().union(*map(set, comm.allgather(mine))))
    assert union == want_texts, (what, "rank", r, "got", union, "NumPy", want_texts)
    for m in w:
        assert m.filename == __file__, (what, "warned at", m.filename, m.lineno)
    same_typed(what, got, np.asarray(want))
    checked[0] += 1
    return w


compare("1 / a", lambda m, a: 1.0 / a)
compare("log(a)", lambda m, a: m.log(a))
compare("sqrt(a)", lambda m, a: m.sqrt(a))
compare("exp(a * 1000)", lambda m, a: m.exp(a * 1000))
compare("a * 1e308 * 10", lambda m, a: a * 1e308 * 10)
compare("zeros / zeros", lambda m, a: m.zeros(6) / m.zeros(6))
compare("cast of nan to int64", lambda m, a: m.asarray(np.full(6, np.nan)).astype(np.int64))
compare("sum overflowing", lambda m, a: m.full(6, 1e308).sum())
compare("no error", lambda m, a: a * 2 + 1)


def flags_left_by_numpy(m, a):
    with np.errstate(all="ignore"):
        np.log(np.zeros(3))             # NumPy leaves the divide-by-zero flag set under ignore
    return a * 2 + 1


compare("no error after NumPy left a flag set", flags_left_by_numpy)
compare("max of square roots", lambda m, a: m.sqrt(a + 1).max())
# NaN operands: NumPy's max, min, argmax, maximum and comparisons are quiet; a compiled comparison with a NaN sets
# the invalid flag, which must not become a warning (it did, on the ranks holding the NaN)
compare("max of data with a NaN", lambda m, a: m.where(a > 2, m.nan, a).max())
compare("argmin of data with a NaN", lambda m, a: m.argmin(m.where(a > 2, m.nan, a)))
compare("min over axis 1 with a NaN", lambda m, a: m.min(m.where(a > 2, m.nan, a).reshape(3, 2), axis=1))
compare("maximum and a comparison with a NaN", lambda m, a: m.maximum(m.where(a > 2, m.nan, a), 1.0) > 0.5)
compare("count_nonzero, sum and mean of a comparison with a NaN",
        lambda m, a: m.array([m.count_nonzero(m.where(a > 2, m.nan, a) > 0), m.sum(m.where(a > 2, m.nan, a) > 0),
                              m.mean(m.where(a > 2, m.nan, a) > 0)]))
compare("maximum of 0 / 0 still warns", lambda m, a: m.maximum(m.zeros(6) / m.zeros(6), 1.0))
# NaN data fused with arithmetic: the compiled comparison must set no flag (before: "invalid value encountered in
# multiply", the flag of the comparison named after the loop's arithmetic)
xn = np.where(x > 2, np.nan, x)        # [-1, 0, 1, 2, nan, nan]: the NaNs on the last rank
compare("where over data with NaNs, fused with a product", lambda m, a: m.where(m.asarray(xn) > 0, m.asarray(xn) * 2, 0))
compare("maximum of a product of data with NaNs", lambda m, a: m.maximum(m.asarray(xn) * 3, 0.5))
compare("sum of a comparison of a product of data with NaNs", lambda m, a: (m.asarray(xn) * 3 < 0.5).sum())
compare("clip of a sum of data with NaNs", lambda m, a: m.clip(m.asarray(xn) + 1, 0, 1))
compare("max and min of a product of data with NaNs",
        lambda m, a: m.array([(m.asarray(xn) * 2).max(), (m.asarray(xn) - 1).min()]))
compare("float32 comparison of a product of data with NaNs", lambda m, a: m.asarray(xn.astype(np.float32)) * 2 >= 1)
compare("floor division and remainder of data with NaNs", lambda m, a: m.asarray(xn) // 0.3 + m.asarray(xn) % 0.3)
compare("0 / 0 under a comparison still warns", lambda m, a: m.where(a > 0, m.zeros(6) / m.zeros(6), 1.0))


def nan_data_under_raise(m, a):
    d = m.asarray(xn)
    with np.errstate(invalid="raise"):  # NumPy raises nothing: NaN operands are quiet
        r = m.where(d > 0, d * 2, m.minimum(d, -1.0))
    return r


compare("NaN data compared under errstate(invalid='raise')", nan_data_under_raise)
# warnings NumPy gives from the values of a result (all-NaN or empty slices), issued after the force point
An = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [4.0, 5.0, np.nan], [1.0, 2.0, 3.0], [np.nan, 1.0, 2.0],
               [7.0, 8.0, 9.0]])
compare("nanmax along an axis with an all-NaN slice", lambda m, a: m.nanmax(m.asarray(An), axis=1))
compare("nanmin of every element (no all-NaN slice)", lambda m, a: m.nanmin(m.asarray(An)))
compare("nanmean along an axis with an all-NaN slice", lambda m, a: m.nanmean(m.asarray(An), axis=1))
compare("nanvar along an axis with an all-NaN slice", lambda m, a: m.nanvar(m.asarray(An), axis=1))
compare("nanstd with ddof=2 along axis 0", lambda m, a: m.nanstd(m.asarray(An), axis=0, ddof=2))
compare("nanvar without a bad slice", lambda m, a: m.nanvar(m.asarray(An[[0, 2, 3, 4, 5]]), axis=1))
compare("nanmean of an empty slice", lambda m, a: m.nanmean(m.asarray(An[:0]), axis=0))
compare("nanvar with ddof reaching the count of every slice", lambda m, a: m.nanvar(m.asarray(np.ones((6, 2))), axis=1,
                                                                                  ddof=2))



def compare_in_order(what, fn, mode):
    # every warning in NumPy's order and number, or NumPy's FloatingPointError, under errstate(invalid=mode,
    # divide=mode): mean, var and std warn of an empty slice (or ddof reaching the count), then give the floating-point
    # errors of NumPy's own divisions; decided by the shapes or by flags every rank holds, so every rank gives them all
    out = []
    for m in (np, dnp):
        with warnings.catch_warnings(record=True) as w, np.errstate(invalid=mode, divide=mode):
            warnings.simplefilter("always")
            try:
                res = ("value", np.asarray(fn(m)))
            except FloatingPointError as err:
                res = ("FloatingPointError", str(err))
        out.append((res, [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]))
    (want, want_w), (got, got_w) = out
    assert got_w == want_w, (what, mode, "rank", r, "got", got_w, "NumPy", want_w)
    assert got[0] == want[0], (what, mode, got, want)
    if want[0] == "value":
        same_typed(what, got[1], want[1])
    else:
        assert got[1] == want[1], (what, mode, got, want)
    checked[0] += 1


E03, V12 = np.zeros((0, 3)), np.array([[1.0, 3.0], [2.0, 3.0]])
for mode in ("warn", "raise", "ignore"):
    compare_in_order("mean over an empty axis", lambda m: m.mean(m.asarray(E03), axis=0), mode)
    compare_in_order("mean of no element (a scalar)", lambda m: m.mean(m.asarray(E03)), mode)
    compare_in_order("mean of no element, keepdims", lambda m: m.mean(m.asarray(E03), keepdims=True), mode)
    compare_in_order("var over an empty axis (two divisions)", lambda m: m.var(m.asarray(E03), axis=0), mode)
    compare_in_order("var with ddof=1 of one row", lambda m: m.var(m.asarray(np.ones((1, 3))), axis=0, ddof=1), mode)
    compare_in_order("var with ddof=2 of two rows (x / 0 and 0 / 0)", lambda m: m.var(m.asarray(V12), axis=0, ddof=2),
                     mode)
    compare_in_order("std with ddof=4 of four elements (a scalar)", lambda m: m.std(m.arange(4.0), ddof=4), mode)
    compare_in_order("mean where nothing is selected",
                     lambda m: m.mean(m.asarray(V12), axis=0, where=m.asarray(np.array([[True, False]] * 2))), mode)
    compare_in_order("var where one column keeps one element", lambda m: m.var(
        m.asarray(V12), axis=0, ddof=1, where=m.asarray(np.array([[True, True], [False, True]]))), mode)
    compare_in_order("nanmean of an empty slice (quiet division)",
                     lambda m: m.nanmean(m.asarray(An[:0]), axis=0), mode)
    compare_in_order("nanvar with ddof reaching the count (quiet division)",
                     lambda m: m.nanvar(m.asarray(np.ones((6, 2))), axis=1, ddof=2), mode)
    compare_in_order("var of an ordinary array", lambda m: m.var(m.asarray(V12), axis=0), mode)


def all_nan_slice_as_error(m, a):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            m.nanmax(m.asarray(An), axis=1)     # NumPy raises here; every rank must, at this line
        except RuntimeWarning as err:
            assert str(err) == "All-NaN slice encountered", err
            return m.asarray([1.0])
    return m.asarray([0.0])


compare("All-NaN slice under simplefilter('error')", all_nan_slice_as_error)
# integer division and remainder by zero: NumPy's 0 and its divide-by-zero warning (before: no warning), the lowest
# integer floor-divided by -1 its overflow warning; errstate(divide='raise') raises on every rank
for t in ("int64", "int32", "int8", "uint8", "uint64"):
    xi = np.arange(7, dtype=t)
    compare(f"{t} // 0", lambda m, a, xi=xi: m.asarray(xi) // 0)
    compare(f"{t} % 0", lambda m, a, xi=xi: m.asarray(xi) % 0)
    compare(f"{t} // zeros, no zero on most ranks", lambda m, a, xi=xi: m.asarray(xi) // m.asarray(xi[::-1] * 1))
    compare(f"{t} // 2 (no zero)", lambda m, a, xi=xi: m.asarray(xi) // 2)
compare("int64 min // -1", lambda m, a: m.asarray(np.full(7, np.iinfo(np.int64).min)) // -1)


def int_division_raises(m, a):
    with np.errstate(divide="raise"):
        try:
            np.asarray(m.arange(7) % 0)
        except FloatingPointError as err:
            assert str(err) == "divide by zero encountered in remainder", err
            return m.asarray([1.0])
    return m.asarray([0.0])


compare("integer % 0 under errstate(divide='raise')", int_division_raises)
# casts of what does not fit an integer type: NumPy's "invalid value encountered in cast" for exactly those
cx = np.array([np.nan, 1e10, -3.0, 300.0, 2.0, -1e19, np.inf, 3e9])
for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
    compare(f"cast of values that do not fit to {t}", lambda m, a, t=t: m.asarray(cx).astype(t))
    compare(f"cast of values that fit to {t}", lambda m, a, t=t: m.asarray(cx[[2, 3, 4]]).astype(t))
# a flag of a library step (nansum's inf + -inf) fused with integer or boolean operations is not theirs
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    d = dnp.asarray(np.array([0.0, 1.0, np.inf, 3.0, -np.inf, 5.0]))
    pair = (dnp.nansum(d), dnp.isfinite(d) | dnp.isnan(d))
    np.asarray(pair[1]), float(pair[0])
assert not any("bitwise_or" in str(m.message) for m in w), [str(m.message) for m in w]
checked[0] += 1
# every ordering of special values, fused with arithmetic (the kernels compare integer keys of the floats)
sv = np.array([-np.inf, -1e308, -1.5, -5e-324, -0.0, 0.0, 5e-324, 1.5, 1e308, np.inf, np.nan])
p_, q_ = np.repeat(sv, sv.size), np.tile(sv, sv.size)
for dt in (np.float64, np.float32):
    with np.errstate(all="ignore"):
        pd_, qd_ = p_.astype(dt), q_.astype(dt)
    for name in ("less", "less_equal", "greater", "greater_equal", "maximum", "minimum"):
        compare(f"{name} of special {np.dtype(dt).name} values",
                lambda m, a, f=name, pd_=pd_, qd_=qd_: getattr(m, f)(m.asarray(pd_) * 1, m.asarray(qd_) + 0))
    for name in ("floor_divide", "remainder"):   # alone in their loop: their flags are NumPy's, named alone
        compare(f"{name} of special {np.dtype(dt).name} values",
                lambda m, a, f=name, pd_=pd_, qd_=qd_: getattr(m, f)(m.asarray(pd_), m.asarray(qd_)))
    compare(f"max and min of special {np.dtype(dt).name} values without NaN",
            lambda m, a, pd_=pd_: m.array([(m.asarray(pd_[:-11]) * 1).max(), (m.asarray(pd_[:-11]) * 1).min(),
                                           (m.asarray(pd_) * 1).max()]))
compare("mean(1 / a): the division warns, not mean's own steps", lambda m, a: m.mean(1.0 / a))


def in_loop(m, a):
    out = None
    for _ in range(3):
        out = np.asarray(1.0 / a)      # one line: the default filter shows its warning once
    return out


w = compare("a division forced three times at one line", in_loop, action="default")
assert len(w) <= 1, ("shown once per line", [str(m.message) for m in w])


def recorded_quiet(m, a):
    with np.errstate(divide="ignore", invalid="ignore"):
        c = m.log(a)                    # recorded here, evaluated below, outside the with block
    return c + 0


compare("log(a) recorded under errstate(ignore), forced outside it", recorded_quiet)


def seterr_around_a_division(m, a):
    b = a - 0.0                         # recorded under the default state; fusable into the division below
    old = np.seterr(all="ignore")
    try:
        c = 1.0 / b                     # quiet (before: fused with b, warned "... in subtract")
    finally:
        np.seterr(**old)
    return c


compare("1 / b under seterr(all='ignore'), b recorded before it", seterr_around_a_division)


def division_then_raise(m, a):
    c = 1.0 / a                         # warns, whatever a later errstate says
    with np.errstate(divide="raise"):
        d = c + 1                       # before: fused with the division, raised FloatingPointError here
    return d


compare("1 / a recorded, then c + 1 under errstate(divide='raise')", division_then_raise)


def ignored_in_block(m, a):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = m.log(a)                    # evaluated after the block: before, it warned there
    return c + 0


compare("log(a) recorded under simplefilter('ignore'), forced after the block", ignored_in_block)

# raise: FloatingPointError on every rank, at the operation's own line, then the program goes on
a = dnp.asarray(x)
outcome = []
with np.errstate(divide="raise"):
    try:
        q = 1.0 / a
        outcome.append("no error")
    except FloatingPointError as e:
        outcome.append(str(e))
    try:
        dnp.log(a)
        outcome.append("no error")
    except FloatingPointError as e:
        outcome.append(str(e))
    ok = np.asarray(a + 1)              # no error under raise
every = comm.allgather(outcome)
assert every == [["divide by zero encountered in divide", "divide by zero encountered in log"]] * comm.Get_size(), every
same_typed("a + 1 under errstate(raise)", ok, x + 1)
checked[0] += 2

# warnings as errors (simplefilter('error'), -W error): the RuntimeWarning raised on every rank at its line (before:
# at the next force point, outside the try, and only on the rank holding the zero)
outcome = []
with warnings.catch_warnings():
    warnings.simplefilter("error")
    try:
        q = dnp.log(a) * 2
        outcome.append("no error")
    except RuntimeWarning as e:
        outcome.append(str(e))
every = comm.allgather(outcome)
assert every == [["divide by zero encountered in log"]] * comm.Get_size(), every
same_typed("a + 1 after the warnings-as-errors block", a + 1, x + 1)
checked[0] += 1

# call: the seterrcall function gets NumPy's arguments, on the rank holding the zero
calls = []
old = np.seterrcall(lambda kind, flag: calls.append((kind, flag)))
with np.errstate(all="call"):
    np.asarray(1.0 / a)
np.seterrcall(old)
every = sorted(set().union(*map(set, comm.allgather(calls))))
assert every == [("divide by zero", 1)], every
checked[0] += 1

same_typed("a program after the errors", dnp.cumsum(a * 2), np.cumsum(x * 2))
print(f"rank {r}: ALL OK ({checked[0]} checks)", flush=True)
"""


@pytest.mark.parametrize("n", [2, 3])
def test_floating_point_errors_are_handled_as_numpy_does(run_mpi, kernel_cache, n):
    run_code_all_ok(run_mpi, kernel_cache, SCRIPT, n, timeout=180)
