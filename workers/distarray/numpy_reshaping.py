"""NumPy's functions that move elements across the distributed axis, natively on distributed arrays:
``reshape``/``ravel``/``a.flatten()`` (C order), ``repeat``, ``tile``, ``nonzero``/``flatnonzero``/
``argwhere``, and the axis permutations the recorded transpose does not cover (``transpose`` with axes or of
N-d arrays, ``swapaxes``, ``moveaxis``).

Each is one exchange by global flat index (:func:`~.exchange.from_elements`): every rank computes, for its
own elements, where they land in the result, and sends each to the rank owning that row; nothing is gathered
to one rank. ``nonzero`` takes each rank's local nonzeros, numbers them by an exclusive scan of the counts and
puts them in C order (by the sample sort of :mod:`.numpy_sorting` unless the rows are block-distributed in
increasing order, when the scan already is that order). ``reshape``/``ravel`` of a whole block-distributed
array whose ranks hold the same flat ranges before and after (e.g. an even number of rows on 2 ranks) exchange
nothing: each rank's result views its block, copy-on-write. Results take the input's layout (block for a
replicated input). Collective over the array's communicator and blocking (a force point); call SPMD with
the same arguments. Orders other than C go through the NumPy fallback.
"""
from __future__ import annotations

import operator
from typing import Any, Tuple

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from . import fallback
from .array import _FUNCTIONS, _METHODS, DistArray, copy_of_view
from .distribution import make_distribution
from .exchange import allgather_int, from_elements, from_local_part, local_part, result_dist
from .graph import Base
from .indexing import View

__all__ = ["reshape", "ravel", "repeat", "tile", "nonzero", "flatnonzero", "argwhere", "permute",
           "moveaxis"]


def _new_shape(size: int, shape: Any) -> Tuple[int, ...]:
    """``shape`` with its one ``-1`` resolved for ``size`` elements; ValueError as NumPy's. Local."""
    shape = given = (shape,) if isinstance(shape, (int, np.integer)) else tuple(operator.index(s) for s in shape)
    unknown = [k for k, s in enumerate(shape) if s == -1]
    known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
    if len(unknown) > 1:
        raise ValueError("can only specify one unknown dimension")
    if unknown and known and size % known == 0:
        shape = shape[:unknown[0]] + (size // known,) + shape[unknown[0] + 1:]
    if any(s < 0 for s in shape) or int(np.prod(shape, dtype=np.int64)) != size:
        np.broadcast_to(np.int8(0), (size,)).reshape(given)       # NumPy's error, from a stand-in (no memory)
        raise ValueError(f"cannot reshape array of size {size} into shape {shape}")
    return shape


def _flat_of(rows: np.ndarray, inner: int) -> np.ndarray:
    """Global flat indices of whole rows ``rows`` of ``inner`` elements each, C order. Local."""
    return (rows[:, None] * inner + np.arange(inner, dtype=np.int64)[None, :]).reshape(-1)


def _reshape_in_place(a: DistArray, new: Tuple[int, ...]) -> Any:
    """``a`` reshaped to ``new`` when no element changes rank: ``a`` is a whole block-distributed array and every
    rank's flat range (rows times row length) is the same under ``a``'s layout and under the result's block
    layout (decided from the shapes alone, the same on every rank). Then each rank's result views its block of ``a``
    copy-on-write (``Base.share``: a copy is made only when either array is written later; a copy into a pooled
    buffer when ``a`` is exported or itself a view). None when elements would move.
    Collective (a force point), blocking."""
    ctx = a.context
    d = a.dist
    if d.kind != "block" or not a._view.is_full or not new or a.size == 0:
        return None
    rd = make_distribution("block", new[0], ctx.size)
    ia = int(np.prod(a.shape[1:], dtype=np.int64))
    ir = int(np.prod(new[1:], dtype=np.int64))
    for q in range(ctx.size):
        (a0, a1), (r0, r1) = d.block_range(q), rd.block_range(q)
        if a0 * ia != r0 * ir or a1 * ia != r1 * ir:
            return None
    ctx.flush("reshape")
    src = a._base
    b = Base(ctx, new, a.dtype, rd, origin="reshape")
    if src.exported or src.owner is not None:
        np.copyto(b.ensure().reshape(-1), src.ensure().reshape(-1))
    else:
        b.share(src)      # copy on write: the copy is made only if either array is written later
    return DistArray(b, View.full(new))


def reshape(a: Any, shape: Any = None, order: str = "C", **kwargs: Any) -> Any:
    """``numpy.reshape`` in C order: a new array of ``shape`` with ``a``'s elements in flat order, in ``a``'s
    layout (elements sent by global flat index). Collective, blocking. A copy, never a view."""
    shape = kwargs.pop("newshape", shape)
    if not isinstance(a, DistArray):
        return np.reshape(a, shape, order=order)
    new = _new_shape(a.size, shape)
    if order != "C" or kwargs or not new or a.ndim == 0:
        return fallback.call(np.reshape, (a, shape), dict(order=order, **kwargs), "reshape")
    fallback.note_native("reshape")
    if new == a.shape:
        return a
    if result_dist(a, new[0]) == "block":
        out = _reshape_in_place(a, new)
        if out is not None:
            return copy_of_view(out, a, "reshape / ravel")
    rows, data = local_part(a)
    inner = int(np.prod(a.shape[1:], dtype=np.int64))
    return copy_of_view(from_elements(a.context, new, a.dtype, _flat_of(rows, inner), data, result_dist(a, new[0]),
                                      "reshape"), a, "reshape / ravel")


def ravel(a: Any, order: str = "C") -> Any:
    """``numpy.ravel``: the 1-D array of ``a``'s elements (a copy). ``order='K'`` (memory order) is C order, as
    NumPy's for a sliced view of a C-ordered array (steps backwards included; a DistArray's ``.T`` is a C-ordered
    copy: C order too, where NumPy's reads a transpose's memory order). Collective, blocking."""
    if not isinstance(a, DistArray):
        return np.ravel(a, order=order)
    if order == "K":
        order = "C"
    if a.ndim == 1 and order == "C":
        fallback.note_native("ravel")
        return a
    return reshape(a, (a.size,), order=order)


def _flatten(a: DistArray, order: str = "C") -> DistArray:
    """``a.flatten()``: a 1-D copy (collective, blocking)."""
    out = ravel(a, order)
    return out.copy() if out is a else out


def repeat(a: Any, repeats: Any, axis: Any = None) -> Any:
    """``numpy.repeat``: each element (``axis=None``: of the flattened array) or each slice along ``axis``
    repeated ``repeats`` times (an int, or one count per slice). Collective, blocking."""
    if not isinstance(a, DistArray) or a.ndim == 0:
        return fallback.call(np.repeat, (a, repeats), dict(axis=axis), "repeat")
    fallback.note_native("repeat")
    if axis is None:
        a, axis = ravel(a), 0
    axis = normalize_axis_index(axis, a.ndim)
    if isinstance(repeats, DistArray):
        if axis == 0 and repeats.ndim == 1 and repeats.shape[0] == a.shape[0] > 1:
            return _repeat_rows(a, repeats)
        repeats = repeats.to_numpy()             # one count, or counts along a trailing axis: small
    n = a.shape[axis]
    given = np.asarray(repeats, dtype=np.int64)
    bad = given.ndim > 1 or given.size not in (1, n) or bool(np.any(given < 0))
    if bad:     # NumPy's error, from a stand-in of the axis (NumPy checks before it allocates anything)
        np.repeat(np.zeros(n, np.int8), repeats)
        raise ValueError("repeats may not contain negative values.")
    reps = np.broadcast_to(given, (n,))
    shape = a.shape[:axis] + (int(reps.sum()),) + a.shape[axis + 1:]
    rows, data = local_part(a)
    if axis == 0:
        starts = np.concatenate(([0], np.cumsum(reps)[:-1])).astype(np.int64)
        r = reps[rows]
        out_rows = np.repeat(starts[rows], r) + (np.arange(int(r.sum()), dtype=np.int64)
                                                 - np.repeat(np.cumsum(r) - r, r))
        data = np.repeat(data, r, axis=0)
    else:
        data = np.repeat(data, reps, axis=axis)
        out_rows = rows
    inner = int(np.prod(shape[1:], dtype=np.int64))
    return from_elements(a.context, shape, a.dtype, _flat_of(out_rows, inner), data, result_dist(a, shape[0]),
                         "repeat")


def _repeat_rows(a: DistArray, repeats: DistArray) -> DistArray:
    """``repeat(a, repeats, axis=0)`` with one distributed count per row: each rank repeats its own rows; where
    they land comes from the distributed exclusive scan of the counts (recorded ``cumsum``), laid out like
    ``a``. Nothing is gathered. Collective, blocking."""
    from .numpy_cumulative import cumsum

    if repeats.dtype.kind not in "biu":
        raise TypeError(f"Cannot cast array data from {repeats.dtype!r} to dtype('int64') according to the rule "
                        "'safe'")
    reps = repeats.astype(np.int64)
    if int(reps.min()) < 0:
        raise ValueError("repeats may not contain negative values.")
    total = int(reps.sum())
    whole = a if a._view.is_full and not a._base.replicated else a.redistribute(result_dist(a, a.shape[0]))
    starts = (cumsum(reps) - reps).redistribute(whole.dist)
    counts = reps.redistribute(whole.dist)
    data, s, r = whole.local, starts.local, counts.local           # this rank's rows, laid out alike
    out_rows = np.repeat(s, r) + (np.arange(int(r.sum()), dtype=np.int64) - np.repeat(np.cumsum(r) - r, r))
    shape = (total,) + a.shape[1:]
    inner = int(np.prod(shape[1:], dtype=np.int64))
    return from_elements(a.context, shape, a.dtype, _flat_of(out_rows, inner), np.repeat(data, r, axis=0),
                         result_dist(a, total), "repeat")


def tile(a: Any, reps: Any) -> Any:
    """``numpy.tile``: ``a`` repeated ``reps`` times along each axis (leading axes added as NumPy does).
    Collective, blocking."""
    if not isinstance(a, DistArray) or a.ndim == 0:
        return np.tile(a, reps) if not isinstance(a, DistArray) else fallback.call(np.tile, (a, reps), {}, "tile")
    reps = (operator.index(reps),) if not isinstance(reps, (tuple, list)) else tuple(operator.index(r) for r in reps)
    if any(r < 0 for r in reps):
        return fallback.call(np.tile, (a, reps), {}, "tile")
    fallback.note_native("tile")
    if len(reps) > a.ndim:
        a = reshape(a, (1,) * (len(reps) - a.ndim) + a.shape)
    reps = (1,) * (a.ndim - len(reps)) + reps
    shape = tuple(s * r for s, r in zip(a.shape, reps))
    rows, data = local_part(a)
    data = np.tile(data, (1,) + reps[1:])
    n0 = a.shape[0]
    out_rows = (rows[None, :] + n0 * np.arange(reps[0], dtype=np.int64)[:, None]).reshape(-1)
    data = np.tile(data, (reps[0],) + (1,) * (a.ndim - 1))
    inner = int(np.prod(shape[1:], dtype=np.int64))
    return from_elements(a.context, shape, a.dtype, _flat_of(out_rows, inner), data, result_dist(a, shape[0]),
                         "tile")


def permute(a: DistArray, axes: Tuple[int, ...]) -> DistArray:
    """``numpy.transpose(a, axes)`` as a new array (not a view): every element sent to its place in the
    permuted shape, in ``a``'s layout. For what the recorded transpose (2-D arrays distributed by rows) does not
    cover: N-d arrays, explicit axes, views that move the distributed axis. Collective, blocking."""
    axes = tuple(normalize_axis_index(k, a.ndim) for k in axes)
    if sorted(axes) != list(range(a.ndim)):
        raise ValueError("axes don't match array")
    shape = tuple(a.shape[k] for k in axes)
    rows, data = local_part(a)
    idx = np.indices(data.shape, dtype=np.int64)
    idx[0] = rows[idx[0]] if len(rows) else idx[0]
    flat = np.ravel_multi_index(tuple(idx[k].reshape(-1) for k in axes), shape) if data.size else \
        np.zeros(0, dtype=np.int64)
    return from_elements(a.context, shape, a.dtype, flat, data, result_dist(a, shape[0] if shape else 0), "transpose")


def moveaxis(a: Any, source: Any, destination: Any) -> Any:
    """``numpy.moveaxis``: ``a`` with axes ``source`` moved to ``destination`` (a new array by
    :func:`permute`; ``a`` itself if nothing moves). Collective, blocking."""
    if not isinstance(a, DistArray) or a.ndim == 0:
        return np.moveaxis(a, source, destination) if not isinstance(a, DistArray) else a
    np.moveaxis(np.broadcast_to(np.int8(0), a.shape), source, destination)   # NumPy's errors (a view: no memory)
    fallback.note_native("moveaxis")
    src = [normalize_axis_index(k, a.ndim) for k in np.atleast_1d(source)]
    dst = [normalize_axis_index(k, a.ndim) for k in np.atleast_1d(destination)]
    if len(src) != len(dst):
        raise ValueError("`source` and `destination` arguments must have the same number of elements")
    order = [k for k in range(a.ndim) if k not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return a if order == list(range(a.ndim)) else copy_of_view(permute(a, tuple(order)), a, "moveaxis")


def _nonzero_flat(a: DistArray) -> DistArray:
    """The 1-D int64 array of the C-order flat indices of ``a``'s nonzeros, in increasing order. Collective."""
    from .numpy_sorting import sort

    ctx = a.context
    rows, data = local_part(a)
    inner = int(np.prod(a.shape[1:], dtype=np.int64))
    flat = _flat_of(rows, inner)[np.flatnonzero(data.reshape(-1))]
    counts = allgather_int(ctx, len(flat), "nonzero")
    start = int(counts[:ctx.rank].sum())
    total = int(counts.sum())
    out = from_elements(ctx, (total,), np.int64, start + np.arange(len(flat), dtype=np.int64), flat,
                        result_dist(a, total), "nonzero")
    d, v = a.dist, a._view
    ordered = d.kind == "block" and v.row_kept and not v.lead_new() and v.row_params[1] > 0
    return out if ordered or total == 0 else sort(out)


def nonzero(a: Any) -> Any:
    """``numpy.nonzero``: one 1-D int64 array per axis of ``a`` with the indices of its nonzero elements, in C
    order; each distributed like the others. Collective, blocking."""
    if not isinstance(a, DistArray) or a.ndim == 0:
        return np.nonzero(a) if not isinstance(a, DistArray) else fallback.call(np.nonzero, (a,), {}, "nonzero")
    fallback.note_native("nonzero")
    f = _nonzero_flat(a)
    if a.ndim == 1:
        return (f,)
    _, local = local_part(f)
    coords = np.unravel_index(local, a.shape) if len(local) else [local] * a.ndim
    return tuple(from_local_part(f.context, f.shape, f.dist, np.asarray(c, dtype=np.int64)) for c in coords)


def flatnonzero(a: Any) -> Any:
    """``numpy.flatnonzero``: the flat indices of ``a``'s nonzeros (1-D int64). Collective, blocking."""
    if not isinstance(a, DistArray) or a.ndim == 0:
        return np.flatnonzero(a) if not isinstance(a, DistArray) else fallback.call(np.flatnonzero, (a,), {},
                                                                                     "flatnonzero")
    fallback.note_native("flatnonzero")
    return _nonzero_flat(a)


def argwhere(a: Any) -> Any:
    """``numpy.argwhere``: the ``(nnz, a.ndim)`` int64 array of the indices of ``a``'s nonzeros, in C order.
    Collective, blocking."""
    if not isinstance(a, DistArray) or a.ndim == 0:
        return np.argwhere(a) if not isinstance(a, DistArray) else fallback.call(np.argwhere, (a,), {}, "argwhere")
    fallback.note_native("argwhere")
    f = _nonzero_flat(a)
    _, local = local_part(f)
    coords = np.stack(np.unravel_index(local, a.shape), axis=1) if len(local) else np.empty((0, a.ndim), np.int64)
    return from_local_part(f.context, (f.shape[0], a.ndim), f.dist, coords.astype(np.int64))


_FUNCTIONS.update({np.reshape: reshape, np.ravel: ravel, np.repeat: repeat, np.tile: tile, np.nonzero: nonzero,
                   np.flatnonzero: flatnonzero, np.argwhere: argwhere, np.moveaxis: moveaxis})
_METHODS.update(_permute=permute)          # for DistArray.transpose (array.py cannot import this module)
_METHODS.update(reshape=reshape, ravel=ravel, flatten=_flatten, repeat=repeat, nonzero=nonzero)
