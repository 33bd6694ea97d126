"""Cumulative sums and products of distributed arrays: ``cumsum`` and ``cumprod`` (``axis``, ``dtype``,
``out``), natively, without gathering the array.

* Along axis 0 (the distributed axis) a distributed scan: the array is copied into a block
  distribution (one aggregated transfer, none if it is block-distributed already), each rank scans
  its rows locally, the ranks' totals (one row each) are allgathered, and each rank combines its
  rows with the exclusive scan of the totals of the ranks before it.
* Along another axis each rank scans its own rows (a compacted copy of a view first).
* ``axis=None`` of a 1-D array is axis 0; of an N-d array (NumPy flattens it) it goes through the
  NumPy fallback.

Both are force points (collective): the recorded operations producing the input run first. Integer
results equal NumPy's exactly; float results equal them to rounding (the scan adds the ranks' totals
in a different order than NumPy's running sum). Call them SPMD on every rank with the same arguments.
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

__all__ = ["cumsum", "cumprod"]

_NP = {"sum": (np.cumsum, np.add, 0), "prod": (np.cumprod, np.multiply, 1)}


def _new_like(ctx: Any, shape, dtype, dist: Distribution, local: np.ndarray, origin: str) -> DistArray:
    """A new array of ``shape`` distributed by ``dist`` whose local rows are ``local``. Local."""
    b = Base(ctx, shape, dtype, make_distribution(dist, shape[0], ctx.size), origin=origin)
    b.set_local(np.ascontiguousarray(local, dtype=b.dtype).reshape(b.local_shape()))
    return DistArray(b, View.full(b.shape))


def _scan_rows(a: DistArray, op: str, dt: np.dtype) -> DistArray:
    """The scan of ``a`` along axis 0 as a new block-distributed array (the module doc). Collective."""
    scan, ufunc, ident = _NP[op]
    ctx = a.context
    block = Distribution("block", a.shape[0], ctx.size)
    src = a if (a._view.is_full and a.dist.kind == "block") else a.redistribute(block)
    local = scan(src.local, axis=0, dtype=dt)
    rest = tuple(a.shape[1:])
    total = local[-1] if len(local) else np.full(rest, ident, dtype=dt)
    one_each = Distribution("block", ctx.size, ctx.size)      # one row per rank: the ranks' totals
    totals = _new_like(ctx, (ctx.size,) + rest, dt, one_each, total[None], f"{op}-scan totals")
    every = totals.to_numpy(_reason=f"cum{op} along axis 0 (the ranks' totals)")
    if ctx.rank > 0 and len(local):
        offset = ufunc.reduce(every[:ctx.rank], axis=0, dtype=dt)
        local = ufunc(offset, local, dtype=dt)
    return _new_like(ctx, a.shape, dt, block, local, f"cum{op}")


def _scan_local(a: DistArray, op: str, dt: np.dtype, ax: int) -> DistArray:
    """The scan of ``a`` along a non-distributed axis ``ax``: each rank its own rows. Collective
    (a force point)."""
    scan = _NP[op][0]
    src = a if a._view.is_full else a.redistribute(a.dist)
    return _new_like(a.context, a.shape, dt, src.dist, scan(src.local, axis=ax, dtype=dt), f"cum{op}")


def _cumulative(op: str):
    def cumulative(a: Any, axis: Any = None, dtype: Any = None, out: Any = None) -> Any:
        name = f"cum{op}"
        if not isinstance(a, DistArray) or (axis is None and a.ndim > 1) or a.ndim == 0 or a.dtype.kind == "c":
            return fallback.call(getattr(np, name), (a,), dict(axis=axis, dtype=dtype, out=out), name)
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
