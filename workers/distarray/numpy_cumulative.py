"""Cumulative sums and products of distributed arrays: ``cumsum`` and ``cumprod`` (``axis``, ``dtype``,
``out``), natively, without gathering the array.

* Along axis 0 (the distributed axis) a distributed scan: the array is copied into a block
  distribution (one aggregated transfer, none if it is block-distributed already) and each rank
  scans its rows locally. Integers and booleans: the ranks' totals (one row each) are allgathered
  and each rank combines its rows with the exclusive scan of the totals of the ranks before it.
  Floats: the running value (one row) is carried from rank to rank instead (``size - 1``
  allgathers of one row), so that the rounding is NumPy's, bit for bit.
* Along another axis each rank scans its own rows (a compacted copy of a view first).
* ``axis=None`` of a 1-D array is axis 0; of an N-d array (NumPy flattens it) it goes through the
  NumPy fallback.

Both are force points (collective): the recorded operations producing the input run first. Results
equal NumPy's bit for bit. Call them SPMD on every rank with the same arguments.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import fallback
from .array import _FUNCTIONS, _METHODS, DistArray, wrap
from .distribution import Distribution, make_distribution
from .elementwise import rep_base_from_numpy
from .graph import Base
from .indexing import View
from .plans import my_rows, selector

__all__ = ["cumsum", "cumprod"]

_NP = {"sum": (np.cumsum, np.add, 0), "prod": (np.cumprod, np.multiply, 1)}


def _new_like(ctx: Any, shape, dtype, dist: Distribution, local: np.ndarray, origin: str) -> DistArray:
    """A new array of ``shape`` distributed by ``dist`` whose local rows are ``local``. Local."""
    b = Base(ctx, shape, dtype, make_distribution(dist, shape[0], ctx.size), origin=origin)
    b.set_local(np.ascontiguousarray(local, dtype=b.dtype).reshape(b.local_shape()))
    return DistArray(b, View.full(b.shape))


def _compact(a: DistArray) -> DistArray:
    """``a``, or for a view a block-distributed copy with its own base. The view is copied first
    (``copy()`` keeps its rows in place) and evaluated, then redistributed (collective): recorded in one
    flush, a copy of a float32 view sliced along a trailing axis of a cyclic 3-D base followed by its
    ``redistribute()`` mis-sizes a message today (an engine bug of the redistribution plans)."""
    if a._view.is_full:
        return a
    c = a.copy()
    if c._view.is_full:
        return c
    c.evaluate()
    return c.redistribute("block")


def _allgather_row(ctx: Any, row: np.ndarray, dt: np.dtype, what: str) -> np.ndarray:
    """Every rank's ``row`` stacked in rank order (an array with one row per rank, gathered through the
    recorded operations, with their timeout). Collective."""
    one_each = Distribution("block", ctx.size, ctx.size)
    rows = _new_like(ctx, (ctx.size,) + row.shape, dt, one_each, row[None], what)
    return rows.to_numpy(_reason=what)


def _scan_rows(a: DistArray, op: str, dt: np.dtype) -> DistArray:
    """The scan of ``a`` along axis 0 as a new block-distributed array (the module doc). Collective."""
    scan, ufunc, ident = _NP[op]
    ctx = a.context
    block = Distribution("block", a.shape[0], ctx.size)
    src = _compact(a)
    if src.dist.kind != "block":
        src = src.redistribute(block)
    rows = src.local
    local = scan(rows, axis=0, dtype=dt)
    rest = tuple(a.shape[1:])
    if dt.kind not in "fc":
        # exact arithmetic: each rank adds the exclusive scan of the ranks' totals (one allgather)
        total = local[-1] if len(local) else np.full(rest, ident, dtype=dt)
        every = _allgather_row(ctx, total, dt, f"cum{op} along axis 0 (the ranks' totals)")
        if ctx.rank > 0 and len(local):
            local = ufunc(ufunc.reduce(every[:ctx.rank], axis=0, dtype=dt), local, dtype=dt)
    else:
        # rounding depends on the order: the running value is carried from rank to rank, so every element is
        # NumPy's own sequential sum (size - 1 allgathers of one row; a block distribution leaves only the last
        # ranks empty, and nothing follows them)
        for k in range(1, ctx.size):
            last = local[-1] if len(local) else np.full(rest, ident, dtype=dt)
            every = _allgather_row(ctx, last, dt, f"cum{op} along axis 0 (the running value of rank {k - 1})")
            if ctx.rank == k and len(rows):
                local = scan(np.concatenate([every[k - 1][None], rows.astype(dt, copy=False)]), axis=0,
                             dtype=dt)[1:]
    return _new_like(ctx, a.shape, dt, block, local, f"cum{op}")


def _scan_local(a: DistArray, op: str, dt: np.dtype, ax: int) -> DistArray:
    """The scan of ``a`` along a non-distributed axis ``ax``: a copy in ``dt`` (its rows stay where they
    are, no communication), then each rank scans its own rows of it in place. Collective (a force point)."""
    scan = _NP[op][0]
    c = a.astype(dt, copy=True)
    c.evaluate()
    b, v = c._base, c._view
    if not v.row_kept or any(e[0] != "s" for e in v.entries):   # not a plain strided view: a compact copy
        src = _compact(c)
        return _new_like(a.context, a.shape, dt, src.dist, scan(src.local, axis=ax), f"cum{op}")
    b.exported = True                     # written below, outside the recorded operations
    loc = b.ensure()
    s, t, n = v.row_params
    _, lidx = my_rows(b.dist, s, t, n, a.context.rank)
    if len(lidx):
        idx = v.numpy_index(row_sel=selector(lidx))
        loc[idx] = scan(loc[idx], axis=ax, dtype=dt)
    return c


def _cumulative(op: str):
    def cumulative(a: Any, axis: Any = None, dtype: Any = None, out: Any = None) -> Any:
        name = f"cum{op}"
        if not isinstance(a, DistArray) or (axis is None and a.ndim > 1) or a.ndim == 0 or a.dtype.kind == "c" \
                or np.float16 in (a.dtype, None if dtype is None else np.dtype(dtype)):   # numba: no float16
            return fallback.call(getattr(np, name), (a,), dict(axis=axis, dtype=dtype, out=out), name)
        if isinstance(axis, (bool, np.bool_)):
            raise TypeError("an integer is required for the axis")
        ax = 0 if axis is None else operator.index(axis)
        if not -a.ndim <= ax < a.ndim:
            raise np.exceptions.AxisError(ax, a.ndim)
        ax %= a.ndim
        dt = np.dtype(dtype) if dtype is not None else _NP[op][0](np.ones(1, dtype=a.dtype)).dtype
        if a._base.replicated:
            res = wrap(rep_base_from_numpy(a.context, _NP[op][0](a.to_numpy(), axis=ax, dtype=dt)))
        elif ax == 0:
            res = _scan_rows(a, op, dt)
        else:
            res = _scan_local(a, op, dt, ax)
        if out is None:
            return res
        out[...] = res if isinstance(out, DistArray) else np.asarray(res)
        return out
    cumulative.__name__ = cumulative.__qualname__ = f"cum{op}"
    cumulative.__doc__ = (f"``numpy.cum{op}`` of a DistArray (``axis``, ``dtype``, ``out``): a distributed scan along "
                          "axis 0, a local one along the others (see the module doc). A force point: collective, "
                          "SPMD. Returns a new array (block-distributed for axis 0, laid out like ``a`` otherwise).")
    return cumulative


cumsum = _cumulative("sum")
cumprod = _cumulative("prod")

# numpy.cumsum(distarray) and a.cumsum() dispatch here
_FUNCTIONS.update({np.cumsum: cumsum, np.cumprod: cumprod})
_METHODS.update(cumsum=cumsum, cumprod=cumprod)
