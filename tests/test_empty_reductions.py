"""Reductions of distributed arrays over empty inputs equal NumPy's (value, dtype, shape, RuntimeWarning, error),
under real mpiexec on 2 and 3 ranks (3 ranks: some ranks own no row).

* Reductions with an identity over an EMPTY reduced axis (``zeros((3, 0)).sum(axis=1)``): NumPy gives the
  identity (``sum`` 0, ``prod`` 1, ``any`` False, ``all`` True, ``count_nonzero`` 0) or NaN with a
  RuntimeWarning (``mean``, ``std``, ``var``); the distributed result used to be the uninitialized buffer of
  the target (the fused kernel, which writes it, is never called over an empty iteration space).
* Reductions without an identity (``min``, ``max``, ``argmin``, ``argmax``, ``nanmin``, ``nanmax``) over a
  non-empty axis of an empty array give an empty result (``zeros((0, 3)).max(axis=1)`` has shape (0,)); only
  an empty reduced axis raises NumPy's ValueError with NumPy's message. They used to raise whenever the array
  was empty.
"""
from __future__ import annotations

import pytest

from conftest import assert_ok

CODE = '''
import sys
import warnings

import numpy as np
import nbmpi.workers.distarray as dnp
from spmd_checks import rank, section, size

PART = sys.argv[1]
failures = []
count = [0]


def outcome(fn):
    """(kind, value, dtype, shape, RuntimeWarning messages without a final dot) of ``fn()``, or
    ("error", type name, message) if it raises."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            r = np.asarray(fn())
        except Exception as e:                   # noqa: BLE001 - compared with NumPy's own error
            return ("error", type(e).__name__, str(e))
    msgs = {str(x.message).rstrip(".") for x in w if issubclass(x.category, RuntimeWarning)}
    return ("value", r, r.dtype, r.shape, msgs)


def compare(name, dist_fn, np_fn):
    """The distributed outcome must be NumPy's: the same error and message, or the same dtype, shape and values
    (NaN equal to NaN), and a RuntimeWarning (one of NumPy's messages) exactly when NumPy warns."""
    got, want = outcome(dist_fn), outcome(np_fn)
    count[0] += 1
    if want[0] == "error" or got[0] == "error":
        ok = got == want
    else:
        _, g, gdt, gsh, gw = got
        _, e, edt, esh, ew = want
        ok = (gdt == edt and gsh == esh and np.array_equal(g, e, equal_nan=e.dtype.kind in "fc")
              and bool(gw) == bool(ew) and gw <= ew)
    if not ok:
        failures.append(f"{name}: got {got!r}, NumPy gives {want!r}")


def both(shape, dtype, dist="block"):
    """An array of ``shape`` (ascending values cast to ``dtype``) and its distributed copy."""
    x = (np.arange(int(np.prod(shape))) % 5).reshape(shape).astype(dtype)
    return x, dnp.from_numpy(x, dist=dist)


def reduce_case(fname, shape, in_dtype, dist="block", view=None, **kw):
    """Compare ``numpy.<fname>(x[view], **kw)`` of a distributed ``x`` with NumPy's; ``where="none"`` becomes a
    mask selecting no element (a DistArray one on the distributed side)."""
    x, d = both(shape, in_dtype, dist)
    if view is not None:
        x, d = x[view], d[view]
    kx, kd = dict(kw), dict(kw)
    if kw.get("where") == "none":
        kx["where"], kd["where"] = np.zeros(x.shape, bool), dnp.zeros(x.shape, dtype=bool, dist=dist)
    f = getattr(np, fname)
    compare(f"{fname}{x.shape} {np.dtype(in_dtype).name} {dist} view={view} {kw}",
            lambda: f(d, **kd), lambda: f(x, **kx))


def identity_part():
    """Reductions with an identity (and mean/std/var) over an empty reduced axis."""
    ops = ["sum", "prod", "mean", "any", "all", "count_nonzero", "nansum", "nanprod", "nanmean", "std", "var",
           "nanstd", "nanvar", "cumsum", "cumprod"]
    for dtype in (np.float64, np.int32, np.bool_):
        for op in ops:
            if dtype == np.bool_ and op.startswith(("nan", "cum")):
                continue
            reduce_case(op, (3, 0), dtype, axis=1)
            reduce_case(op, (2, 0, 3), dtype, axis=1)
            reduce_case(op, (2, 3, 0), dtype, axis=-1)
            reduce_case(op, (0, 3), dtype, axis=0)
            if not op.startswith("cum"):
                reduce_case(op, (3, 0), dtype)                      # axis=None: a 0-d result
                reduce_case(op, (2, 0, 3), dtype, axis=(1, 2))
                reduce_case(op, (3, 0), dtype, axis=1, keepdims=True)
    for dist in ("block", "cyclic", "replicated"):
        for op in ("sum", "prod", "mean", "any", "all", "count_nonzero", "std", "cumsum"):
            reduce_case(op, (7, 4), np.float64, dist, view=(slice(None), slice(2, 2)), axis=1)
            reduce_case(op, (7, 4), np.float64, dist, view=(slice(1, 6, 2), slice(0, 0)), axis=-1)
    for dtype in (np.float64, np.int32):
        for dt in (np.int32, np.float32, np.int64):
            reduce_case("sum", (3, 0), dtype, axis=1, dtype=dt)
            reduce_case("prod", (3, 0), dtype, axis=1, dtype=dt)
        for op in ("sum", "prod", "mean", "any", "all", "nansum", "std", "var"):
            reduce_case(op, (3, 0), dtype, axis=1, where="none")
            reduce_case(op, (4, 0), dtype, axis=1, keepdims=True, where="none")
    x, d = both((5, 0), np.float64)
    compare("sum(axis=1) used in an expression", lambda: d.sum(axis=1) * 2 + 1, lambda: x.sum(axis=1) * 2 + 1)
    compare("sum(axis=1, out=ones)", lambda: np.sum(d, axis=1, out=dnp.ones(5)),
            lambda: np.sum(x, axis=1, out=np.ones(5)))
    compare("prod of a fused expression", lambda: np.prod(2 * d - 1, axis=1), lambda: np.prod(2 * x - 1, axis=1))


def no_identity_part():
    """min/max/argmin/argmax (and nanmin/nanmax): an empty result, or NumPy's error over an empty axis."""
    for dtype in (np.float64, np.int32):
        for op in ("max", "min", "argmax", "argmin", "nanmax", "nanmin"):
            for shape, axis in [((0, 3), 1), ((0, 3), -1), ((3, 0), 0), ((2, 0, 3), 0), ((2, 0, 3), -1),
                                ((0, 3), 0), ((3, 0), 1), ((2, 0, 3), 1), ((0, 0), 0), ((0, 3), None),
                                ((0,), None), ((0,), 0)]:
                reduce_case(op, shape, dtype, axis=axis)
            reduce_case(op, (0, 3), dtype, axis=1, keepdims=True)
            reduce_case(op, (3, 0), dtype, axis=0, keepdims=True)
        for op in ("max", "min"):
            reduce_case(op, (2, 0, 3), dtype, axis=(0, 2))
            reduce_case(op, (2, 0, 3), dtype, axis=(1, 2))
            reduce_case(op, (0, 2, 0), dtype, axis=(1, 2))
    for dist in ("block", "cyclic", "replicated"):
        for op in ("max", "argmin"):
            reduce_case(op, (7, 4), np.float64, dist, view=(slice(3, 3), slice(None)), axis=1)
            reduce_case(op, (7, 4), np.float64, dist, view=(slice(None), slice(2, 2)), axis=0)
            reduce_case(op, (7, 4), np.float64, dist, view=(slice(None), slice(2, 2)), axis=1)


{"identity": identity_part, "no-identity": no_identity_part}[PART]()
if failures:
    print(f"rank {rank}: {len(failures)} of {count[0]} cases differ from NumPy:\\n" + "\\n".join(failures),
          flush=True)
    sys.exit(1)
section(PART)
if rank == 0:
    print(f"ALL OK ({count[0]} checks on {size} ranks)", flush=True)
'''


def _run(run_mpi, kernel_cache, n, part):
    p = run_mpi(CODE, n=n, timeout=290, env={"NBMPI_DISTARRAY_CACHE": kernel_cache}, args=(part,))
    assert_ok(p)
    assert f"ok {part}\n" in p.stdout, p.stdout
    assert f" checks on {n} ranks)" in p.stdout, p.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_reductions_with_an_identity_over_an_empty_axis(run_mpi, kernel_cache, n):
    """sum/prod/any/all/count_nonzero/nansum/nanprod give the identity, mean/std/var (and nan*) NaN with NumPy's
    RuntimeWarning, cumsum/cumprod an empty array; with dtype=, keepdims=True, where=, out=, views of block, cyclic
    and replicated arrays, fused expressions."""
    _run(run_mpi, kernel_cache, n, "identity")


@pytest.mark.parametrize("n", [2, 3])
def test_reductions_without_an_identity_on_empty_inputs(run_mpi, kernel_cache, n):
    """max/min/argmax/argmin/nanmax/nanmin: an empty result over a non-empty axis of an empty array (e.g.
    ``zeros((0, 3)).max(axis=1)`` has shape (0,)); NumPy's ValueError and message over an empty axis."""
    _run(run_mpi, kernel_cache, n, "no-identity")
