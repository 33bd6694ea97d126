"""NumPy's reduction functions on distributed arrays, natively: ``axis`` (None, an int, a tuple, negative),
``keepdims``, ``dtype``, ``out`` and ``where`` for ``sum``, ``prod``, ``mean``, ``std``, ``var``, ``min``,
``max``, ``argmin``, ``argmax``, ``any``, ``all``, ``count_nonzero`` and the ``nan*`` family.

Each is composed of the recorded primitives (:func:`~.array._reduce` over one axis or all of them,
elementwise ufuncs, :func:`~.array.where`, views): nothing is gathered, everything is recorded lazily
and runs at the next force point. A tuple of axes is reduced one axis at a time, the last first;
``keepdims`` inserts length-1 axes as a view; ``where`` replaces the masked-out elements by the
operation's identity; ``dtype`` casts the input first (as NumPy's accumulator does). ``argmin`` and
``argmax`` find the first position equal to the minimum (or the first NaN, as NumPy) with a second
reduction over an index grid laid out like the input. ``nanmin``/``nanmax`` of an all-NaN slice give
NaN with NumPy's ``RuntimeWarning`` after the force point (:mod:`.value_warnings`). Float results equal NumPy's to rounding (the order of
summation differs: blocks, then ranks); integer and boolean results are exact.

Call them SPMD on every rank with the same arguments. The array methods (``a.sum(...)``) and
``numpy.<name>(distarray)`` dispatch here (registered in :mod:`.array`).
"""
from __future__ import annotations

import builtins as _builtins
import functools
import inspect
import math
import operator
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from . import fallback
from .array import _FUNCTIONS, _METHODS, DistArray, _reduce, where
from .creation import full_like
from .fp_errors import library_steps, warn_at
from .value_warnings import signal_if, signal_now, warn_if
from .arg_extreme import flat_arg

__all__ = ["sum", "prod", "mean", "std", "var", "min", "max", "amin", "amax", "argmin", "argmax", "any", "all", "count_nonzero",
           "nansum", "nanprod", "nanmean", "nanstd", "nanvar", "nanmin", "nanmax", "normalize_axes", "keep_dims"]

_IDENTITY = {"sum": 0, "prod": 1, "any": False, "all": True}


def normalize_axes(axis: Any, ndim: int) -> Optional[Tuple[int, ...]]:
    """``axis`` (None, an int or a tuple of ints, negative counting from the end) as sorted non-negative
    axes, or None for all of them. Raises ``numpy.exceptions.AxisError`` / ValueError as NumPy."""
    if axis is None:
        return None
    axes = axis if isinstance(axis, tuple) else (axis,)      # a list is not an axis, as in NumPy
    out = []
    for ax in axes:
        if isinstance(ax, (bool, np.bool_)):
            raise TypeError("an integer is required")
        ax = operator.index(ax)
        if not -ndim <= ax < _builtins.max(ndim, 1) or (ndim == 0 and ax not in (0, -1)):
            raise np.exceptions.AxisError(ax, ndim)
        out.append(ax % _builtins.max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError("duplicate value in 'axis'")
    return tuple(sorted(out))


def keep_dims(res: Any, axes: Optional[Tuple[int, ...]], ndim: int) -> Any:
    """``res`` (reduced over ``axes`` of an ``ndim``-d array) with a length-1 axis in place of each
    reduced one: a view, nothing recorded."""
    gone = set(range(ndim)) if axes is None else set(axes)
    if not isinstance(res, DistArray):
        return np.expand_dims(res, tuple(sorted(gone))) if gone else res
    key = tuple(None if k in gone else slice(None) for k in range(ndim))
    return res[key] if key else res


def _count(a: DistArray, axes: Optional[Tuple[int, ...]]) -> int:
    """Elements per reduced slice."""
    return math.prod(a.shape) if axes is None else math.prod(a.shape[k] for k in axes)


def _over(a: DistArray, op: str, axes: Optional[Tuple[int, ...]]) -> Any:
    """``op`` (a primitive of :mod:`.reductions`) over ``axes``: all at once for None (or every axis),
    else one axis at a time, the last first (so the remaining axes keep their numbers)."""
    if axes is None or a.ndim <= 1 or len(axes) == a.ndim:
        return _reduce(a, op, None)
    res = a
    for ax in reversed(axes):
        res = _reduce(res, op, ax)
    return res


def _finish(res: Any, a: DistArray, axes, keepdims: bool, out: Any, dtype: Any = None) -> Any:
    """Apply ``dtype``, ``keepdims`` and ``out`` to a reduction result."""
    if dtype is not None and isinstance(res, DistArray) and res.dtype != np.dtype(dtype):
        res = res.astype(dtype)
    if keepdims:
        res = keep_dims(res, axes, a.ndim)
    if out is None:
        return res
    if isinstance(out, tuple):
        out = out[0]
    out[...] = res if isinstance(out, DistArray) else np.asarray(res)
    return out


def _prepare(a: DistArray, dtype: Any, mask: Any, fill: Any) -> DistArray:
    """``a`` cast to ``dtype`` and with ``fill`` where ``mask`` is false (both recorded)."""
    if dtype is not None and np.dtype(dtype) != a.dtype:
        a = a.astype(dtype)
    if mask is not None and mask is not True:
        a = where(mask, a, np.asarray(fill, dtype=a.dtype))
    return a


def _numpy_only(*dtypes: Any) -> bool:
    """Whether a reduction over or into these dtypes (None: none given) goes through the NumPy fallback: complex
    and float16, which the compiled kernels do not take (numba has no float16 arrays)."""
    return _builtins.any(d is not None and np.dtype(d).kind == "c" or d is not None and np.dtype(d) == np.float16
                         for d in dtypes)


def _simple(op: str):
    typed = op in ("sum", "prod")

    def core(a: Any, axis: Any, dtype: Any, out: Any, keepdims: bool, initial: Any, where: Any) -> Any:
        if not isinstance(a, DistArray) or initial is not None or (
                op in ("min", "max") and where is not True) or _numpy_only(a.dtype, dtype):
            kw = dict(axis=axis, out=out, keepdims=keepdims, **({"dtype": dtype} if typed else {}),
                      **({} if where is True else {"where": where}),
                      **({} if initial is None else {"initial": initial}))
            if not isinstance(a, DistArray) and not isinstance(out, DistArray):
                return getattr(np, op)(a, **kw)          # NumPy data: NumPy's own reduction
            return fallback.call(getattr(np, op), (a,), kw, op)
        axes = normalize_axes(axis, a.ndim)
        x = _prepare(a, dtype, where, _IDENTITY.get(op))
        res = _over(x, op, axes)
        return _finish(res, a, axes, keepdims, out, dtype if typed else None)

    # NumPy's signatures (positional arguments land where NumPy puts them)
    if typed:
        def reduction(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False,
                      initial: Any = None, where: Any = True) -> Any:
            return core(a, axis, dtype, out, keepdims, initial, where)
    elif op in ("min", "max"):
        def reduction(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, initial: Any = None,
                      where: Any = True) -> Any:
            return core(a, axis, None, out, keepdims, initial, where)
    else:
        def reduction(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, *,
                      where: Any = True) -> Any:
            return core(a, axis, None, out, keepdims, None, where)
    reduction.__name__ = op
    reduction.__qualname__ = op
    reduction.__doc__ = (f"``numpy.{op}`` of a DistArray over ``axis`` (None, int, tuple), with NumPy's arguments "
                         f"(recorded; a 0-d result forces on ``float()``). ``initial`` "
                         f"{'and ``where`` go' if op in ('min', 'max') else 'goes'} through the NumPy fallback. "
                         "SPMD: call on every rank.")
    return reduction


sum = _simple("sum")  # noqa: A001 - NumPy's names
prod = _simple("prod")
min = _simple("min")  # noqa: A001
max = _simple("max")  # noqa: A001
amin, amax = min, max
any = _simple("any")  # noqa: A001
all = _simple("all")  # noqa: A001


def _warn_empty(a: DistArray, axes, ddof: Optional[float] = None,
                text: str = "Degrees of freedom <= 0 for slice") -> None:
    """NumPy's RuntimeWarning for a mean (``ddof`` None: "Mean of empty slice") or a variance (``text``) over
    slices of ``a`` with no element (or at most ``ddof``), decided from the shape, at the user's line now; a
    ``where`` mask leaving fewer elements warns after the force point (:func:`mean`, :func:`_variance`)."""
    n = _count(a, axes)
    if ddof is None and n == 0:
        warn_at("Mean of empty slice", fallback.user_frame())
    elif ddof is not None and n - ddof <= 0:
        warn_at(text, fallback.user_frame())


def _mask_count(a: DistArray, mask: Any, axes) -> Any:
    """Number of selected elements per reduced slice (``where=mask``): an int, or a recorded array."""
    if mask is None or mask is True:
        return _count(a, axes)
    return _over(where(mask, 1, 0) + full_like(a, 0, dtype=np.intp), "sum", axes)


@library_steps
def mean(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False,
         where: Any = True) -> Any:
    """``numpy.mean`` of a DistArray (recorded): the sum in float64 for integers (``dtype`` otherwise)
    divided by the number of selected elements; NaN over no element, with NumPy's RuntimeWarning. SPMD."""
    if not isinstance(a, DistArray):
        return np.mean(a, axis=axis, dtype=dtype, out=out, keepdims=keepdims, where=where)
    if _numpy_only(a.dtype, dtype):
        return fallback.call(np.mean, (a,), dict(axis=axis, dtype=dtype, out=out, keepdims=keepdims, where=where),
                             "mean")
    axes = normalize_axes(axis, a.ndim)
    _warn_empty(a, axes)
    rdt = np.dtype(dtype) if dtype is not None else np.mean(np.ones(1, dtype=a.dtype)).dtype
    div = _division(a, axes, keepdims, out) if rdt.kind == "f" else None
    if div and _count(a, axes) == 0:                # NumPy's own 0 / 0, after its warning
        signal_now("invalid", div)
    if where is True and dtype is None:
        return _finish(_over(a, "mean", axes), a, axes, keepdims, out)
    x = _prepare(a, np.float64 if rdt.kind == "f" else rdt, where, 0)
    total = _over(x, "sum", axes)
    if rdt.kind in "iu" and total.dtype != rdt:     # NumPy sums in an integer dtype= (wrapping): the same modulo
        total = total.astype(rdt)
    count = _mask_count(a, where, axes)
    if isinstance(count, DistArray) and _count(a, axes) > 0:      # else warned from the shape
        empty = any(count == 0)
        warn_if(empty, "Mean of empty slice")
        if div:
            signal_if(empty, "invalid", div)
    res = total / count
    return _finish(res, a, axes, keepdims, out, rdt)


@library_steps
def var(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: float = 0, keepdims: bool = False,
        where: Any = True, mean: Any = None, correction: Any = None) -> Any:
    """``numpy.var`` of a DistArray (recorded): the mean of the squared deviations from the mean, divided
    by ``n - ddof`` (NaN or inf where that is not positive, as NumPy, with its RuntimeWarning). SPMD. An integer
    or bool ``dtype=`` (NumPy's truncating arithmetic in it) goes through the fallback."""
    if not isinstance(a, DistArray) or mean is not None or _numpy_only(a.dtype) or _integral(dtype):
        return fallback.call(np.var, (a,), dict(axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims,
                                                where=where, **({} if mean is None else {"mean": mean})), "var")
    if correction is not None:
        ddof = correction
    return _variance(a, axis, dtype, out, ddof, keepdims, where, "Degrees of freedom <= 0 for slice")


def _variance(a: DistArray, axis: Any, dtype: Any, out: Any, ddof: float, keepdims: bool, where: Any,
              text: str) -> DistArray:
    """:func:`var`'s computation (recorded); a ``where`` mask leaving some slice at most ``ddof`` elements
    warns ``text`` after the next force point (:mod:`.value_warnings`; NumPy's ``var`` and ``nanvar`` word it
    differently)."""
    axes = normalize_axes(axis, a.ndim)
    _warn_empty(a, axes, ddof, text)
    rdt = np.dtype(dtype) if dtype is not None else np.var(np.ones(2, dtype=a.dtype)).dtype
    n = _mask_count(a, where, axes)
    if isinstance(n, DistArray) and _count(a, axes) - ddof > 0:     # else warned from the shape
        warn_if(any(n <= ddof), text)
    div = _division(a, axes, keepdims, out)
    if div and isinstance(n, DistArray):            # NumPy's division of the mean: 0 / 0 over an empty slice
        signal_if(any(n == 0), "invalid", "divide")
    elif div and n == 0:
        signal_now("invalid", "divide")
    m = _mean_kd(a, axes, where, n)
    x = a - m
    x = _prepare(x * x, None, where, 0)
    total = _over(x, "sum", axes)
    if div:
        _signal_division(total, n, ddof, div)
    res = total / _positive(n - ddof)
    return _finish(res, a, axes, keepdims, out, rdt)


def _division(a: DistArray, axes, keepdims: bool, out: Any) -> Optional[str]:
    """The operation NumPy's floating-point errors name for its division of a reduction of ``a`` over ``axes``:
    ``'scalar divide'`` for a scalar result, ``'divide'`` for an array; None for a result with no element (nothing
    is divided)."""
    rest = [] if axes is None else [n for k, n in enumerate(a.shape) if k not in axes]
    if math.prod(rest) == 0:
        return None
    return "scalar divide" if not rest and not keepdims and out is None else "divide"


def _signal_division(total: Any, n: Any, ddof: float, div: str) -> None:
    """NumPy's errors of ``total / (n - ddof)`` where ``n - ddof <= 0`` (``n``: the count of each slice, an int or a
    recorded array): "divide by zero" for a positive finite sum, then "invalid value" for a zero one (``0 / 0``), as
    its error state says (:mod:`.value_warnings`); nothing where no slice's count can reach ``ddof``."""
    if not isinstance(n, DistArray):
        if n - ddof > 0:
            return
        if n == 0:                  # the sum of nothing: 0 / 0 whatever the values
            signal_now("invalid", div)
            return
        signal_if(any((total > 0) & np.isfinite(total)), "divide", div)
        signal_if(any(total == 0), "invalid", div)
        return
    bad = n - ddof <= 0
    signal_if(any(bad & (total > 0) & np.isfinite(total)), "divide", div)
    signal_if(any(bad & (total == 0)), "invalid", div)


@library_steps
def std(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: float = 0, keepdims: bool = False,
        where: Any = True, mean: Any = None, correction: Any = None) -> Any:
    """``numpy.std`` of a DistArray: the square root of :func:`var` (recorded). SPMD. An integer or bool
    ``dtype=`` goes through the fallback, as :func:`var`'s."""
    if not isinstance(a, DistArray) or mean is not None or _numpy_only(a.dtype) or _integral(dtype):
        return fallback.call(np.std, (a,), dict(axis=axis, dtype=dtype, out=out, ddof=ddof, keepdims=keepdims,
                                                where=where, **({} if mean is None else {"mean": mean})), "std")
    if out is not None and np.dtype(getattr(out, "dtype", np.float64)).kind in "biu":
        np.sqrt(np.ones(1), out=np.ones(1, dtype=out.dtype))     # NumPy's sqrt cannot store into it: its error
    res = np.sqrt(var(a, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, where=where, correction=correction))
    return _finish(res, a, None, False, out)


def _integral(dtype: Any) -> bool:
    """Whether ``dtype`` (a ``dtype=`` argument, None when not given) is an integer or bool dtype."""
    return dtype is not None and np.dtype(dtype).kind in "biu"


def _positive(n: Any) -> Any:
    """``n`` where positive, else 0 (a division by it then gives inf or NaN, as NumPy)."""
    if isinstance(n, DistArray):
        return np.maximum(n, 0).astype(np.float64)
    return float(n) if n > 0 else 0.0


def _mean_kd(a: DistArray, axes, mask: Any, count: Any) -> Any:
    """The mean over ``axes`` with kept dimensions (float64 for integer input); ``count``: the elements ``mask``
    selects per slice (:func:`_mask_count`)."""
    if mask is None or mask is True:
        return keep_dims(_over(a if a.dtype.kind == "f" else a.astype(np.float64), "mean", axes), axes, a.ndim)
    x = _prepare(a if a.dtype.kind == "f" else a.astype(np.float64), None, mask, 0)
    return keep_dims(_over(x, "sum", axes) / count, axes, a.ndim)


def count_nonzero(a: Any, axis: Any = None, *, keepdims: bool = False) -> Any:
    """``numpy.count_nonzero`` of a DistArray (recorded; an intp result). SPMD."""
    if not isinstance(a, DistArray):
        return np.count_nonzero(a, axis=axis, keepdims=keepdims)
    axes = normalize_axes(axis, a.ndim)
    nz = a if a.dtype == np.bool_ else a != 0
    return _finish(_over(nz, "sum", axes), a, axes, keepdims, None, np.intp)


def _position(a: DistArray, ax: Optional[int]) -> DistArray:
    """An intp array of ``a``'s shape holding each element's flat index (``ax`` None) or its index along
    ``ax``, laid out like ``a`` (each rank fills its own rows; nothing recorded but the view)."""
    from .grids import rows_from_function

    shape = a.shape
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    dist = a.dist if a._view.is_full and not a._base.replicated else "block"
    if ax is None:
        return rows_from_function(lambda *ix: _np_sum_products(ix, strides), shape, dtype=np.intp, dist=dist,
                            comm=a.comm)
    return rows_from_function(lambda *ix: ix[ax] + 0 * ix[0], shape, dtype=np.intp, dist=dist, comm=a.comm)


def _np_sum_products(ix, strides) -> np.ndarray:
    out = 0
    for i, s in zip(ix, strides):
        out = out + i * s
    return out


def _arg(op: str):
    def arg(a: Any, axis: Any = None, out: Any = None, *, keepdims: bool = False) -> Any:
        if not isinstance(a, DistArray) or _numpy_only(a.dtype) or a.ndim == 0:
            return fallback.call(getattr(np, f"arg{op}"), (a,), dict(axis=axis, out=out, keepdims=keepdims),
                                 f"arg{op}")
        if isinstance(axis, tuple):
            raise TypeError("'tuple' object cannot be interpreted as an integer")
        axes = normalize_axes(axis, a.ndim)
        ax = None if axes is None else axes[0]
        if _count(a, axes) == 0:        # an empty reduced axis (an empty result alone is fine, as NumPy)
            raise ValueError(f"attempt to get arg{op} of an empty sequence")
        if ax is None:                  # one collective step (see arg_extreme); None: record the general form
            res = flat_arg(a, op)
            if res is not None:
                return _finish(res, a, None, keepdims, out)
        m = keep_dims(_reduce(a, op, ax), None if ax is None else (ax,), a.ndim)
        hit = a == m
        if a.dtype.kind == "f":
            hit = hit | (np.isnan(a) & np.isnan(m))
        big = np.iinfo(np.intp).max
        res = _reduce(where(hit, _position(a, ax), big), "min", ax)
        return _finish(res, a, None if ax is None else (ax,), keepdims, out)
    arg.__name__ = arg.__qualname__ = f"arg{op}"
    arg.__doc__ = (f"``numpy.arg{op}`` of a DistArray (over all elements: a force point and one allgather, "
                   ":mod:`.arg_extreme`; along an axis: recorded): the first index of the {op}imum (of the first "
                   "NaN, as NumPy) over all elements (a flat index) or along one axis. SPMD.")
    return arg


argmin = _arg("min")
argmax = _arg("max")


def _nan(op: str, base: Any, fill: Any):
    def core(a: Any, axis: Any, dtype: Any, out: Any, keepdims: bool, where: Any, kwargs: Dict[str, Any]) -> Any:
        if not isinstance(a, DistArray) or kwargs.get("initial") is not None or kwargs.get("mean") is not None \
                or _numpy_only(a.dtype) or (op in ("min", "max") and where is not True) \
                or (op in ("var", "std") and _integral(dtype)):
            return fallback.call(getattr(np, f"nan{op}"), (a,), dict(axis=axis, out=out, keepdims=keepdims,
                                                                    **({"dtype": dtype} if dtype is not None else {}),
                                                                    **({} if where is True else {"where": where}),
                                                                    **{k: v for k, v in kwargs.items()
                                                                       if v is not None}), f"nan{op}")
        if out is not None and a.dtype.kind == "f" and op in ("mean", "var", "std") \
                and np.dtype(getattr(out, "dtype", np.float64)).kind not in "fc":
            raise TypeError("If a is inexact, then out must be inexact")
        kwargs = {k: v for k, v in kwargs.items() if v is not None or k == "ddof"}
        if op in ("min", "max") and _count(a, normalize_axes(axis, a.ndim)) == 0:   # NumPy's fmin/fmax error
            raise ValueError(f"zero-size array to reduction operation f{op} which has no identity")
        kw = dict(axis=axis, out=out, keepdims=keepdims, where=where)
        if dtype is not None:
            kw["dtype"] = dtype
        if a.dtype.kind != "f":          # no NaN in integers and booleans: NumPy's plain reduction
            return base(a, **kw, **kwargs)
        nan = np.isnan(a)
        if op in ("min", "max"):
            res = base(where_(nan, fill, a), axis=axis, keepdims=keepdims)
            allnan = all(nan, axis=axis, keepdims=keepdims)
            warn_if(any(allnan), "All-NaN slice encountered")
            return _finish(where_(allnan, np.nan, res), a, None, False, out)
        if op in ("mean", "var", "std"):
            mask = ~nan if where is True or where is None else (~nan) & where
            kw["where"] = mask
            if op == "mean":
                with np.errstate(invalid="ignore", divide="ignore"):    # NumPy's nanmean divides quietly
                    return base(a, **kw, **kwargs)
            # NumPy's nanvar: NaN where the slice has at most ddof numbers (var's: inf), its own warning's text
            ddof = kwargs["ddof"] if kwargs.get("correction") is None else kwargs["correction"]
            few = sum(mask, axis=axis, keepdims=keepdims) <= ddof
            with np.errstate(invalid="ignore", divide="ignore"):
                res = _variance(a, axis, dtype, None, ddof, keepdims, mask, "Degrees of freedom <= 0 for slice.")
            return _finish(where_(few, np.nan, np.sqrt(res) if op == "std" else res), a, None, False, out)
        return base(where_(nan, fill, a), **kw, **kwargs)

    # NumPy's signatures (positional arguments land where NumPy puts them)
    if op in ("sum", "prod"):
        def nanred(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False,
                   initial: Any = None, where: Any = True) -> Any:
            return core(a, axis, dtype, out, keepdims, where, {"initial": initial})
    elif op in ("min", "max"):
        def nanred(a: Any, axis: Any = None, out: Any = None, keepdims: bool = False, initial: Any = None,
                   where: Any = True) -> Any:
            return core(a, axis, None, out, keepdims, where, {"initial": initial})
    elif op == "mean":
        def nanred(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, *,
                   where: Any = True) -> Any:
            return core(a, axis, dtype, out, keepdims, where, {})
    else:
        def nanred(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: float = 0,
                   keepdims: bool = False, *, where: Any = True, mean: Any = None, correction: Any = None) -> Any:
            return core(a, axis, dtype, out, keepdims, where, dict(ddof=ddof, mean=mean, correction=correction))
    nanred = library_steps(nanred)
    nanred.__name__ = nanred.__qualname__ = f"nan{op}"
    nanred.__doc__ = (f"``numpy.nan{op}`` of a DistArray (recorded): ``{op}`` ignoring NaNs (NumPy's arguments). "
                      "SPMD.")
    return nanred


where_ = where
nansum = _nan("sum", sum, 0)
nanprod = _nan("prod", prod, 1)
nanmin = _nan("min", min, np.inf)
nanmax = _nan("max", max, -np.inf)
nanmean = _nan("mean", mean, 0)
nanvar = _nan("var", var, 0)
nanstd = _nan("std", std, 0)



def _no_axis(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a reduction ``fn(a, axis, ...)``) with NumPy's ``axis=()`` for a DistArray: reduced over no axis,
    each element alone (``sum`` gives the elements in its dtype, ``any`` booleans, ``std`` zeros): ``fn`` over a
    new last axis of length 1 (``where`` given that axis too; ``keepdims`` changes nothing). Local, as ``fn``."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def reduction(a: Any, *args: Any, **kwargs: Any) -> Any:
        ax = args[0] if args else kwargs.get("axis")
        if type(ax) is not tuple or ax or not isinstance(a, DistArray):
            return fn(a, *args, **kwargs)
        bound = sig.bind(a, *args, **kwargs)
        p = bound.arguments
        p["a"], p["axis"] = a[..., None], -1
        if "keepdims" in sig.parameters:
            p["keepdims"] = False
        mask = p.get("where", True)
        if mask is not True and mask is not None:
            p["where"] = mask[..., None] if isinstance(mask, DistArray) else np.asarray(mask)[..., None]
        return fn(*bound.args, **bound.kwargs)
    return reduction


sum, prod, mean, std, var, min, max, any, all, count_nonzero = (  # noqa: A001 - NumPy's names
    _no_axis(f) for f in (sum, prod, mean, std, var, min, max, any, all, count_nonzero))
nansum, nanprod, nanmean, nanstd, nanvar, nanmin, nanmax = (
    _no_axis(f) for f in (nansum, nanprod, nanmean, nanstd, nanvar, nanmin, nanmax))
amin, amax = min, max
_ALL = dict(sum=sum, prod=prod, mean=mean, std=std, var=var, min=min, max=max, argmin=argmin, argmax=argmax,
            any=any, all=all, count_nonzero=count_nonzero, nansum=nansum, nanprod=nanprod, nanmean=nanmean,
            nanstd=nanstd, nanvar=nanvar, nanmin=nanmin, nanmax=nanmax, amin=min, amax=max)


def _contains(a: DistArray, value: Any) -> bool:
    """``value in a``: NumPy's ``(a == value).any()`` (collective: a force point). SPMD."""
    return bool(any(a == value))


DistArray.__contains__ = _contains

# numpy.<name>(distarray, ...) dispatches here through DistArray.__array_function__, a.<name>(...) too
_FUNCTIONS.update({getattr(np, n): f for n, f in _ALL.items()})
_METHODS.update({n: _ALL[n] for n in ("sum", "prod", "mean", "std", "var", "min", "max", "argmin", "argmax")})


def _truth_method(op: str) -> Callable[..., Any]:
    """``a.any(...)``/``a.all(...)`` with the method's signature, NumPy's ``(axis, dtype, out, keepdims)``
    (the functions have no ``dtype``): a result dtype other than bool goes through the NumPy fallback."""
    func = _ALL[op]

    def method(a: DistArray, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False, *,
               where: Any = True) -> Any:
        if dtype is not None and np.dtype(dtype) != np.bool_:
            return fallback.call(getattr(np.ndarray, op), (a,), dict(axis=axis, dtype=dtype, out=out,
                                                                     keepdims=keepdims, where=where), op)
        return func(a, axis, out, keepdims, where=where)

    method.__name__ = method.__qualname__ = op
    return method


_METHODS.update(any=_truth_method("any"), all=_truth_method("all"))
