"""NumPy's shape functions where the rows stay where they are, and a few elementwise compositions, natively on
distributed arrays: ``expand_dims``, ``squeeze``, ``flip``, ``swapaxes``, ``clip``, ``round``/``around``, ``outer``, ``cross``, ``diagonal``, ``trace``.

The shape functions return views (:mod:`.indexing`: ``None`` inserts an axis, an integer removes one, a
negative step reverses one), nothing is copied or recorded; ``swapaxes`` of a 2-D array is its transpose
(:func:`~.array.transpose`). Flipping axis 0 and swapping axes of N-d arrays move elements across the
distributed axis: collective steps of :mod:`.numpy_reshaping`. ``clip`` is ``minimum(maximum(a, lo), hi)``; ``round`` with ``decimals``
is NumPy's own formula (scale, ``rint``, unscale), bit for bit; ``outer`` broadcasts ``a[:, None] *
b[None, :]``; ``diagonal`` selects each row's element on the diagonal with a masked reduction over the
row (no gathering; its cost is that of one pass over the matrix) and ``trace`` sums it. Whatever these
do not cover (diagonal of N-d arrays) goes through the NumPy fallback. Call them SPMD on every rank with the same arguments.
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import fallback
from .array import _FUNCTIONS, _METHODS, DistArray, _reduce, copy_of_view, transpose, where
from .numpy_reductions import normalize_axes, sum as _sum

__all__ = ["expand_dims", "squeeze", "flip", "swapaxes", "clip", "round", "around", "outer", "cross", "diagonal",
           "trace"]


def expand_dims(a: Any, axis: Any) -> Any:
    """``numpy.expand_dims``: a view of ``a`` with length-1 axes inserted at ``axis`` (int or tuple). Local."""
    if not isinstance(a, DistArray):
        return np.expand_dims(a, axis)
    nd = a.ndim + (len(axis) if isinstance(axis, (tuple, list)) else 1)
    axes = set(normalize_axes(axis, nd))
    return a[tuple(None if k in axes else slice(None) for k in range(nd))]


def squeeze(a: Any, axis: Any = None) -> Any:
    """``numpy.squeeze``: a view of ``a`` without its length-1 axes (those of ``axis``). Local."""
    if not isinstance(a, DistArray):
        return np.squeeze(a, axis)
    axes = normalize_axes(axis, a.ndim)
    axes = tuple(k for k, n in enumerate(a.shape) if n == 1) if axes is None else axes
    for k in axes:
        if a.shape[k] != 1:
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    return a[tuple(0 if k in axes else slice(None) for k in range(a.ndim))]


def flip(a: Any, axis: Any = None) -> Any:
    """``numpy.flip``: a view of ``a`` reversed along ``axis`` for axes other than 0 (local); reversing axis 0 is a
    new array, its rows exchanged (collective, blocking)."""
    if not isinstance(a, DistArray):
        return np.flip(a, axis)
    axes = normalize_axes(axis, a.ndim)
    axes = tuple(range(a.ndim)) if axes is None else axes
    if a.ndim == 0:
        return fallback.call(np.flip, (a,), dict(axis=axis), "flip")
    fallback.note_native("flip")
    if 0 in axes:                                 # rows sent to their mirrored place (a collective step)
        a = copy_of_view(_METHODS["_flip_rows"](a), a, "flip along axis 0")
        axes = tuple(k for k in axes if k != 0)
    return a[tuple(slice(None, None, -1) if k in axes else slice(None) for k in range(a.ndim))]


def swapaxes(a: Any, axis1: int, axis2: int) -> Any:
    """``numpy.swapaxes``: for 2-D arrays the transpose (recorded), for N-d arrays a permutation by exchange of
    elements (a collective step), for equal axes ``a``."""
    if not isinstance(a, DistArray):
        return np.swapaxes(a, axis1, axis2)
    i, j = (normalize_axes(x, a.ndim)[0] for x in (axis1, axis2))
    if i == j:
        return a
    order = list(range(a.ndim))
    order[i], order[j] = j, i
    return transpose(a) if a.ndim == 2 else transpose(a, tuple(order))


def clip(a: Any, a_min: Any = None, a_max: Any = None, out: Any = None, **kwargs: Any) -> Any:
    """``numpy.clip``: ``minimum(maximum(a, a_min), a_max)`` (recorded; NaN stays NaN, as NumPy). SPMD."""
    lo = kwargs.pop("min", a_min)
    hi = kwargs.pop("max", a_max)
    if not isinstance(a, DistArray) or kwargs:
        return fallback.call(np.clip, (a, lo, hi), dict(out=out, **kwargs), "clip")
    if a.dtype.kind in "iu":        # as NumPy's _clip: a Python int bound at or beyond the dtype's range is none
        info = np.iinfo(a.dtype)
        lo = None if type(lo) is int and lo <= info.min else lo
        hi = None if type(hi) is int and hi >= info.max else hi
    res = a
    if lo is not None:
        res = np.maximum(res, lo)
    if hi is not None:
        res = np.minimum(res, hi)
    if res is a:
        res = a.copy()
    if out is None:
        return res
    out[...] = res
    return out


def round(a: Any, decimals: int = 0, out: Any = None) -> Any:  # noqa: A001 - NumPy's name
    """``numpy.round``: half to even; with ``decimals`` NumPy's formula (``rint(a * 10**d) / 10**d``, or
    ``rint(a / 10**-d) * 10**-d``), bit for bit. Integers: unchanged for ``decimals >= 0``. Recorded. SPMD."""
    if not isinstance(a, DistArray) or a.dtype.kind not in "biuf" or (a.dtype.kind in "iub" and decimals < 0):
        return fallback.call(np.round, (a,), dict(decimals=decimals, out=out), "round")
    d = operator.index(decimals)
    if a.dtype.kind != "f":
        res = a.copy()
    elif d == 0:
        res = np.rint(a)
    elif d > 0:
        f = a.dtype.type(10.0 ** d)
        res = np.rint(a * f) / f
    else:
        f = a.dtype.type(10.0 ** -d)
        res = np.rint(a / f) * f
    if out is None:
        return res
    out[...] = res
    return out


around = round


def outer(a: Any, b: Any, out: Any = None) -> Any:
    """``numpy.outer``: ``a.ravel()[:, None] * b.ravel()[None, :]`` for 1-D operands (recorded; the result's
    rows are ``a``'s). SPMD."""
    if not isinstance(a, DistArray) or np.ndim(b) != 1 or a.ndim != 1:
        return fallback.call(np.outer, (a, b), dict(out=out), "outer")
    res = a[:, None] * (b[None, :] if isinstance(b, DistArray) else np.asarray(b)[None, :])
    if out is None:
        return res
    out[...] = res
    return out


def cross(a: Any, b: Any, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis: Any = None) -> Any:
    """``numpy.cross`` of arrays of 3-vectors along ``axis`` (default the last; equal in ``a`` and ``b``):
    each component ``a[k+1] * b[k+2] - a[k+2] * b[k+1]`` from length-1 slices of the vector axis, joined along
    it with :func:`~.numpy_joining.concatenate` (recorded; the vector axis may be the distributed one).
    2-vectors, different vector axes and operands of different ndim go through the NumPy fallback. SPMD."""
    kw = dict(axisa=axisa, axisb=axisb, axisc=axisc, axis=axis)
    ax = axis if axis is not None else axisa
    nd = np.ndim(a)
    same_axes = axis is not None or axisa == axisb == axisc
    if (not same_axes or nd == 0 or np.ndim(b) != nd or not isinstance(a, DistArray) and not isinstance(b, DistArray)
            or np.shape(a)[ax] != 3 or np.shape(b)[ax] != 3):
        return fallback.call(np.cross, (a, b), kw, "cross")
    from .numpy_joining import concatenate

    a, b = (x if isinstance(x, DistArray) else np.asarray(x) for x in (a, b))
    pre = (slice(None),) * normalize_axes(ax, nd)[0]
    comp = [(a[pre + (slice(k, k + 1),)], b[pre + (slice(k, k + 1),)]) for k in range(3)]
    parts = [comp[(k + 1) % 3][0] * comp[(k + 2) % 3][1] - comp[(k + 2) % 3][0] * comp[(k + 1) % 3][1]
             for k in range(3)]
    return concatenate(parts, axis=ax)


def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Any:
    """``numpy.diagonal`` of a 2-D DistArray (a new array, recorded): each row's element at column
    ``row + offset``, selected by a masked reduction over the row. Other ranks of ``a`` or axes: the
    NumPy fallback. SPMD."""
    if (not isinstance(a, DistArray) or a.ndim != 2 or normalize_axes((axis1, axis2), 2) != (0, 1)
            or (axis1 % 2, axis2 % 2) != (0, 1) or a.dtype.kind not in "biuf"):
        return fallback.call(np.diagonal, (a,), dict(offset=offset, axis1=axis1, axis2=axis2), "diagonal")
    from .grids import fromfunction

    k = operator.index(offset)
    n, m = a.shape
    lo, hi = max(0, -k), min(n, m - k)        # rows holding a diagonal element
    if hi <= lo:
        return a[0:0, 0]
    dist = a.dist if a._view.is_full and not a._base.replicated else "block"
    on = fromfunction(lambda i, j: j - i == k, (n, m), dtype=np.intp, dist=dist, comm=a.comm)
    if a.dtype.kind == "b":
        res = _reduce(on & a, "any", 1)
    elif a.dtype.kind == "f":
        res = _reduce(where(on, a, -np.inf), "max", 1)
    else:
        res = _reduce(where(on, a, np.iinfo(a.dtype).min), "max", 1)
    return res[lo:hi]


def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None, out: Any = None) -> Any:
    """``numpy.trace`` of a 2-D DistArray: the sum of :func:`diagonal` (recorded). SPMD."""
    if not isinstance(a, DistArray) or a.ndim != 2:
        return fallback.call(np.trace, (a,), dict(offset=offset, axis1=axis1, axis2=axis2, dtype=dtype, out=out),
                             "trace")
    d = diagonal(a, offset, axis1, axis2)
    if d.size == 0:
        return _sum(a[0:0, 0], dtype=dtype, out=out)
    return _sum(d, dtype=dtype, out=out)


_NAMES = dict(expand_dims=expand_dims, squeeze=squeeze, flip=flip, swapaxes=swapaxes, clip=clip, round=round,
              around=around, outer=outer, cross=cross, diagonal=diagonal, trace=trace)
# numpy.<name>(distarray) and the array methods dispatch here
_FUNCTIONS.update({getattr(np, n): f for n, f in _NAMES.items() if hasattr(np, n)})
_METHODS.update(squeeze=squeeze, swapaxes=swapaxes, clip=clip, round=round, diagonal=diagonal, trace=trace)
