"""NumPy's shape functions where the rows stay where they are, and a few elementwise compositions, natively on
distributed arrays: ``expand_dims``, ``squeeze``, ``flip``, ``fliplr``, ``flipud``, ``swapaxes``, the splits (``split``,
``array_split``, ``hsplit``, ``vsplit``, ``dsplit``: lists of views), ``atleast_1d/2d/3d``, ``a.view()``, ``a.real``
and ``a.imag``, ``clip``, ``round``/``around``, ``outer``, ``cross``, ``diagonal`` (read-only, as NumPy's), ``trace``.

The shape functions return views (:mod:`.indexing`: ``None`` inserts an axis, an integer removes one, a
negative step reverses one, also the distributed axis 0), nothing is copied or recorded; ``swapaxes`` of a 2-D
array is its transpose (:func:`~.array.transpose`). Swapping axes of N-d arrays moves elements across the
distributed axis: a collective step of :mod:`.numpy_reshaping`. ``clip`` is ``minimum(maximum(a, lo), hi)``; ``round`` with ``decimals``
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
from .array import _FUNCTIONS, _METHODS, DistArray, _reduce, transpose, where
from .numpy_reductions import normalize_axes, sum as _sum
from .errors import ufunc_cast_error

__all__ = ["expand_dims", "squeeze", "flip", "swapaxes", "clip", "round", "around", "outer", "cross", "diagonal",
           "trace", "fliplr", "flipud", "split", "array_split", "hsplit", "vsplit", "dsplit", "atleast_1d", "atleast_2d",
           "atleast_3d", "view"]


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
    """``numpy.flip``: a view of ``a`` reversed along ``axis`` (a negative step; also along the distributed axis 0:
    writes through it change ``a``, as NumPy's). Local."""
    if not isinstance(a, DistArray):
        return np.flip(a, axis)
    axes = normalize_axes(axis, a.ndim)
    axes = tuple(range(a.ndim)) if axes is None else axes
    if a.ndim == 0:
        return fallback.call(np.flip, (a,), dict(axis=axis), "flip")
    fallback.note_native("flip")
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
    if not np.can_cast(res.dtype, out.dtype, "same_kind"):
        raise ufunc_cast_error("clip", res.dtype, out.dtype)     # NumPy's: no silent unsafe cast into out
    out[...] = res
    return out


def _power_of_ten(n: int) -> float:
    """``10.0 ** n`` as NumPy's ``round`` computes it (``power_of_ten``: exact up to 1e8, then multiplied by 10 one
    step at a time: past 1e22 it differs from ``10.0 ** n`` in the last bits; inf past 1e308, where ``10.0 ** n``
    raises OverflowError)."""
    if n < 9:
        return 10.0 ** n
    r = 1e9
    for _ in range(min(n, 400) - 9):     # inf from 1e309 on
        r *= 10.0
    return r


def round(a: Any, decimals: int = 0, out: Any = None) -> Any:  # noqa: A001 - NumPy's name
    """``numpy.round``: half to even; with ``decimals`` NumPy's formula (``rint(a * 10**d) / 10**d``, or
    ``rint(a / 10**-d) * 10**-d``, ``10**d`` as :func:`_power_of_ten`), bit for bit, NaN past 308 decimals.
    Integers: unchanged for ``decimals >= 0``. Recorded. SPMD."""
    if not isinstance(a, DistArray) or a.dtype.kind not in "iuf" or (a.dtype.kind in "iu" and decimals < 0):
        return fallback.call(np.round, (a,), dict(decimals=decimals, out=out), "round")
    d = operator.index(decimals)
    if a.dtype.kind != "f":
        res = a.copy()
    elif d == 0:
        res = np.rint(a)
    else:
        with np.errstate(over="ignore"):      # NumPy's factor is a double: inf past 1e308, inf in float32 past 1e38
            f = a.dtype.type(_power_of_ten(abs(d)))
        res = np.rint(a * f) / f if d > 0 else np.rint(a / f) * f
    if out is None:
        return res
    if not np.can_cast(res.dtype, out.dtype, "same_kind"):      # NumPy names the step whose output it cannot store
        raise ufunc_cast_error("rint" if d == 0 else "multiply", res.dtype, out.dtype)
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
    from .grids import rows_from_function

    k = operator.index(offset)
    n, m = a.shape
    lo, hi = max(0, -k), min(n, m - k)        # rows holding a diagonal element
    if hi <= lo:
        return a[0:0, 0]
    dist = a.dist if a._view.is_full and not a._base.replicated else "block"
    on = rows_from_function(lambda i, j: j - i == k, (n, m), dtype=np.intp, dist=dist, comm=a.comm)
    if a.dtype.kind == "b":
        res = _reduce(on & a, "any", 1)
    elif a.dtype.kind == "f":
        res = _reduce(where(on, a, -np.inf), "max", 1)
    else:
        res = _reduce(where(on, a, np.iinfo(a.dtype).min), "max", 1)
    res._base.copy_of, res._base.read_only = "numpy.diagonal", True     # NumPy's is a read-only view
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


def fliplr(m: Any) -> Any:
    """``numpy.fliplr``: a view of ``m`` reversed along axis 1. Local."""
    if not isinstance(m, DistArray):
        return np.fliplr(m)
    if m.ndim < 2:
        raise ValueError("Input must be >= 2-d.")
    return flip(m, 1)


def flipud(m: Any) -> Any:
    """``numpy.flipud``: a view of ``m`` reversed along axis 0. Local."""
    if not isinstance(m, DistArray):
        return np.flipud(m)
    if m.ndim < 1:
        raise ValueError("Input must be >= 1-d.")
    return flip(m, 0)


def _split_with(np_split: Any, axis_of: Any):
    """A NumPy split function (``split``, ``array_split``, ``hsplit``, ``vsplit``, ``dsplit``) returning views of
    a DistArray, as NumPy's pieces are views: the pieces' bounds and NumPy's errors come from the same NumPy function
    on a stand-in of ``a``'s shape (no memory); ``axis_of(a, kwargs)`` is the axis split along. Local."""
    def split(a: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(a, DistArray):
            return np_split(a, *args, **kwargs)
        stand = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape=a.shape, strides=(0,) * a.ndim)
        # distributed sections or indices (``split(a, a.max() - 5)``) are read first (a force point on every rank)
        args = tuple(x.to_numpy() if isinstance(x, DistArray) else x for x in args)
        kwargs = {k: v.to_numpy() if isinstance(v, DistArray) else v for k, v in kwargs.items()}
        pieces = np_split(stand, *args, **kwargs)
        ax = axis_of(a, args, kwargs)
        given = args[0] if args else kwargs.get("indices_or_sections")
        if np.ndim(given) == 0:     # sections: consecutive pieces of NumPy's lengths
            bounds, lo = [], 0
            for p in pieces:
                bounds.append((lo, lo + p.shape[ax]))
                lo += p.shape[ax]
        else:                       # indices: NumPy's a[i:j] between consecutive ones, as given (any order)
            points = [0] + [int(i) for i in np.asarray(given).ravel()] + [a.shape[ax]]
            bounds = list(zip(points[:-1], points[1:]))
        return [a[(slice(None),) * ax + (slice(lo, hi),)] for lo, hi in bounds]
    split.__name__ = split.__qualname__ = np_split.__name__
    split.__doc__ = (f"``numpy.{np_split.__name__}`` of a DistArray: a list of views of it (slices along the axis "
                     "NumPy splits), as NumPy's. Local.")
    return split


def _given_axis(a: Any, args: tuple, kwargs: dict) -> int:
    return normalize_axes(args[1] if len(args) > 1 else kwargs.get("axis", 0), a.ndim)[0]


split = _split_with(np.split, _given_axis)
array_split = _split_with(np.array_split, _given_axis)
hsplit = _split_with(np.hsplit, lambda a, args, kwargs: 1 if a.ndim > 1 else 0)
vsplit = _split_with(np.vsplit, lambda a, args, kwargs: 0)
dsplit = _split_with(np.dsplit, lambda a, args, kwargs: 2)


def _atleast_nd(nd: int):
    np_fn = {1: np.atleast_1d, 2: np.atleast_2d, 3: np.atleast_3d}[nd]

    def atleast(*arys: Any) -> Any:
        from .numpy_joining import _atleast

        if not any(isinstance(x, DistArray) and x.ndim for x in arys):     # 0-d DistArrays: NumPy's copy
            return fallback.call(np_fn, arys, {}, np_fn.__name__)
        res = [_atleast(x, nd) if isinstance(x, DistArray) and x.ndim else np_fn(x) for x in arys]
        return res[0] if len(res) == 1 else (tuple(res) if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else res)
    atleast.__name__ = atleast.__qualname__ = np_fn.__name__
    atleast.__doc__ = f"``numpy.{np_fn.__name__}``: a DistArray itself or a view of it with length-1 axes added. Local."
    return atleast


atleast_1d, atleast_2d, atleast_3d = _atleast_nd(1), _atleast_nd(2), _atleast_nd(3)


def view(a: DistArray, dtype: Any = None, type: Any = None) -> Any:  # noqa: A002 - NumPy's name
    """``a.view()``: a new DistArray object on the same elements (a view: writes through either show in both).
    With another ``dtype`` or ``type``: the NumPy fallback (a copy). Local."""
    if type is None and (dtype is None or np.dtype(dtype) == a.dtype):
        return DistArray(a._base, a._view)
    return fallback.call(np.ndarray.view, (a,) + (() if dtype is None else (dtype,)),
                         {} if type is None else {"type": type}, "ndarray.view")


def _real(a: DistArray) -> Any:
    """``a.real``: for bool, integer and float arrays a view of ``a`` itself (writes through it change ``a``)."""
    return view(a)


def _set_real(a: DistArray, value: Any) -> None:
    a[...] = value


def _imag(a: DistArray) -> Any:
    """``a.imag``: for bool, integer and float arrays NumPy's read-only zeros (a write raises ValueError)."""
    from .creation import zeros_like

    z = zeros_like(a)
    z._base.copy_of, z._base.read_only = "ndarray.imag", True
    return z


def _set_imag(a: DistArray, value: Any) -> None:
    raise TypeError("array does not have imaginary part to set")


DistArray.real = property(_real, _set_real, doc=_real.__doc__)
DistArray.imag = property(_imag, _set_imag, doc=_imag.__doc__)

_NAMES = dict(expand_dims=expand_dims, squeeze=squeeze, flip=flip, swapaxes=swapaxes, clip=clip, round=round,
              around=around, outer=outer, cross=cross, diagonal=diagonal, trace=trace, fliplr=fliplr, flipud=flipud,
              split=split, array_split=array_split, hsplit=hsplit, vsplit=vsplit, dsplit=dsplit,
              atleast_1d=atleast_1d, atleast_2d=atleast_2d, atleast_3d=atleast_3d)
# numpy.<name>(distarray) and the array methods dispatch here
_FUNCTIONS.update({getattr(np, n): f for n, f in _NAMES.items() if hasattr(np, n)})
_METHODS.update(squeeze=squeeze, swapaxes=swapaxes, clip=clip, round=round, diagonal=diagonal, trace=trace, view=view)
