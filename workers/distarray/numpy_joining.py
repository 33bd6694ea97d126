"""NumPy's joining functions natively on distributed arrays: ``concatenate`` (``concat``), ``stack``,
``hstack``, ``vstack``, ``dstack``, ``column_stack``, ``append``.

The result is a new array in the layout of the first distributed operand (block if that one is
replicated); each operand is copied into its slice of the result with ``out[..., lo:hi, ...] = part``,
recorded like any assignment: between different row layouts that is one aggregated redistribution with at
most one message per peer (:mod:`.operations.redistribution`), rows already in place are copied locally.
``stack`` inserts the new axis as a view (``expand_dims``) of each operand first. Operands may mix
distributed arrays, NumPy arrays and scalars (as NumPy: at least one must be a DistArray for these
functions to be called). Nothing runs before the next force point. Call SPMD with the same arguments.
A ``concatenate`` of whole distributed arrays (none itself a lazy join) along axis 0 into a block-distributed
result records nothing at first (:mod:`.lazy_joins`): gathered, its parts go straight into the NumPy result; any
other use records the copies.
``out=`` and ``casting=`` other than ``'same_kind'`` go through the NumPy fallback.
"""
from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from . import fallback, gather_direct, lazy_joins
from .array import _FUNCTIONS, DistArray
from .exchange import result_dist

__all__ = ["concatenate", "concat", "stack", "hstack", "vstack", "dstack", "column_stack", "append"]


def _first(arrays: Sequence[Any]) -> DistArray:
    return next(x for x in arrays if isinstance(x, DistArray))


def _ndim(x: Any) -> int:
    return x.ndim if isinstance(x, DistArray) else np.ndim(x)


def _shape(x: Any) -> tuple:
    return x.shape if isinstance(x, DistArray) else np.shape(x)


def _atleast(x: Any, nd: int) -> Any:
    """``x`` with leading (1-D to 2-D) or NumPy's (to 3-D) length-1 axes, as a view for a DistArray. Local."""
    if not isinstance(x, DistArray):
        return {1: np.atleast_1d, 2: np.atleast_2d, 3: np.atleast_3d}[nd](x)
    if x.ndim >= nd:
        return x
    if nd == 3:
        return x[None, :, None] if x.ndim == 1 else (x[:, :, None] if x.ndim == 2 else x[None, None, None])
    return x[(None,) * (nd - x.ndim) + (slice(None),) * x.ndim]


def _user_holds(base: Any) -> bool:
    """Whether the user may hold ``base``'s buffer (``.local``, ``from_local``) and write it directly, unseen:
    it is exported, and not only as the copy-on-write view of another base's buffer (``Base.share``)."""
    return base.exported and base.owner is None


def _numpy_error(arrays: List[Any], axis: int) -> None:
    """Raise NumPy's error for joining arrays of these shapes along ``axis`` (``numpy.concatenate`` of zero-stride
    stand-ins: NumPy checks the shapes before it allocates)."""
    np.concatenate([np.broadcast_to(np.int8(0), _shape(x)) for x in arrays], axis=axis)


def _join(arrays: List[Any], axis: int, dtype: Any, name: str) -> DistArray:
    """The copies into a new array (see the module doc); ``arrays`` have equal ndim. Recorded."""
    from .creation import empty

    first = _first(arrays)
    nd = first.ndim
    for x in arrays:
        if _ndim(x) != nd:
            _numpy_error(arrays, axis)
            raise ValueError(f"all the input array dimensions except for the concatenation axis must match exactly, "
                             f"but along dimension 0, the array at index 0 has {nd} dimension(s) and another has "
                             f"{_ndim(x)} dimension(s)")
    axis = normalize_axis_index(axis, nd)
    shapes = [_shape(x) for x in arrays]
    for k, s in enumerate(shapes):
        if tuple(s[:axis]) + tuple(s[axis + 1:]) != tuple(shapes[0][:axis]) + tuple(shapes[0][axis + 1:]):
            _numpy_error(arrays, axis)
            raise ValueError(f"all the input array dimensions except for the concatenation axis must match exactly: "
                             f"the array at index 0 has shape {tuple(shapes[0])}, the array at index {k} {tuple(s)} "
                             f"({name}, axis {axis})")
    dt = np.dtype(dtype) if dtype is not None else np.result_type(
        *[x.dtype if isinstance(x, DistArray) else np.asarray(x).dtype for x in arrays])
    total = sum(int(s[axis]) for s in shapes)
    shape = tuple(shapes[0][:axis]) + (total,) + tuple(shapes[0][axis + 1:])
    out = empty(shape, dtype=dt, dist=result_dist(first, shape[0]), comm=first.comm)
    if axis == 0 and all(isinstance(x, DistArray) and x._view.is_full and x._base.join is None
                         and not _user_holds(x._base) for x in arrays) and gather_direct.applies(out._base, out._view):
        parts, lo = [], 0
        for x, s in zip(arrays, shapes):
            if int(s[0]):
                parts.append((lo, lo + int(s[0]), x))
            lo += int(s[0])
        lazy_joins.make_lazy(out, parts)      # stored only if something needs more than a gather of it
        return out
    lo = 0
    pre = (slice(None),) * axis
    for x, s in zip(arrays, shapes):
        n = int(s[axis])
        if n:
            out[pre + (slice(lo, lo + n),)] = x
        lo += n
    return out


def _native(arrays: Any, kwargs: dict) -> bool:
    arrays = list(arrays) if not isinstance(arrays, DistArray) else None
    return (arrays is not None and len(arrays) > 0 and any(isinstance(x, DistArray) for x in arrays)
            and kwargs.get("out") is None and kwargs.get("casting", "same_kind") == "same_kind"
            and all(_ndim(x) > 0 for x in arrays))


def concatenate(arrays: Any, axis: Any = 0, out: Any = None, dtype: Any = None, casting: str = "same_kind") -> Any:
    """``numpy.concatenate``: the operands joined along ``axis`` (None: flattened first). Recorded."""
    kw = dict(out=out, dtype=dtype, casting=casting)
    if not _native(arrays, kw):
        return fallback.call(np.concatenate, (arrays,), dict(axis=axis, **kw), "concatenate")
    fallback.note_native("concatenate")
    arrays = list(arrays)
    if axis is None:
        from .numpy_reshaping import ravel
        arrays, axis = [ravel(x) if isinstance(x, DistArray) else np.ravel(x) for x in arrays], 0
    return _join(arrays, axis, dtype, "concatenate")


concat = concatenate


def stack(arrays: Any, axis: int = 0, out: Any = None, dtype: Any = None, casting: str = "same_kind") -> Any:
    """``numpy.stack``: the operands (of one shape) joined along a new ``axis``. Recorded."""
    kw = dict(out=out, dtype=dtype, casting=casting)
    if not _native(arrays, kw):
        return fallback.call(np.stack, (arrays,), dict(axis=axis, **kw), "stack")
    fallback.note_native("stack")
    arrays = list(arrays)
    shapes = {tuple(_shape(x)) for x in arrays}
    if len(shapes) != 1:
        raise ValueError("all input arrays must have the same shape")
    nd = _ndim(arrays[0]) + 1
    ax = normalize_axis_index(axis, nd)
    key = (slice(None),) * ax + (None,)
    return _join([x[key] if isinstance(x, DistArray) else np.expand_dims(x, ax) for x in arrays], ax, dtype,
                 "stack")


def _stack_family(name: str, nd: int, axis_of) -> Any:
    npf = getattr(np, name)

    def f(tup: Any, dtype: Any = None, casting: str = "same_kind") -> Any:
        kw = dict(dtype=dtype, casting=casting)
        if not _native(tup, kw):
            return fallback.call(npf, (tup,), kw, name)
        fallback.note_native(name)
        arrays = [_atleast(x, nd) for x in tup]
        return _join(arrays, axis_of(arrays), dtype, name)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"``numpy.{name}``: {npf.__doc__.strip().splitlines()[0].rstrip('.')}. Recorded."
    return f


hstack = _stack_family("hstack", 1, lambda arrays: 0 if _ndim(arrays[0]) == 1 else 1)
vstack = _stack_family("vstack", 2, lambda arrays: 0)
dstack = _stack_family("dstack", 3, lambda arrays: 2)


def column_stack(tup: Any) -> Any:
    """``numpy.column_stack``: 1-D operands as columns of a 2-D array, others joined along axis 1. Recorded."""
    if not _native(tup, {}):
        return fallback.call(np.column_stack, (tup,), {}, "column_stack")
    fallback.note_native("column_stack")
    arrays = [(x[:, None] if isinstance(x, DistArray) else np.asarray(x)[:, None]) if _ndim(x) == 1 else x
              for x in tup]
    return _join(arrays, 1, None, "column_stack")


def append(arr: Any, values: Any, axis: Any = None) -> Any:
    """``numpy.append``: ``values`` joined after ``arr`` along ``axis`` (None: both flattened first), as
    :func:`concatenate`. Recorded; a 0-d DistArray operand is read first (a force point, collective)."""
    if not any(isinstance(x, DistArray) for x in (arr, values)):
        return np.append(arr, values, axis)
    if axis is None:
        from .numpy_reshaping import ravel
        arr, values = [np.ravel(x.to_numpy() if isinstance(x, DistArray) else x) if _ndim(x) == 0  # a scalar
                       else ravel(x) if isinstance(x, DistArray) else np.ravel(x) for x in (arr, values)]
        axis = 0
    return concatenate((arr, values), axis=axis)


_FUNCTIONS.update({np.concatenate: concatenate, np.stack: stack, np.hstack: hstack, np.vstack: vstack,
                   np.dstack: dstack, np.column_stack: column_stack, np.append: append})
if hasattr(np, "concat"):
    _FUNCTIONS[np.concat] = concatenate
