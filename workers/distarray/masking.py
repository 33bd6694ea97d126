"""Boolean masks and trailing-axis index arrays on distributed arrays, without gathering the array.

* ``a[mask]``, ``a[mask, :]``, ``a[mask, ...]``: ``mask`` a DistArray of bools of ``a``'s leading shape, ``a`` a
  whole distributed array (not a view). A mask laid out otherwise than ``a`` (a view, e.g. ``(a % 3 == 0)[:, 0]``,
  a replicated array or another distribution) is first copied into ``a``'s layout. Each rank selects from
  its own rows; the selected rows (NumPy's order: C order of the mask) become a new array distributed like
  ``a`` (block, cyclic or block-cyclic over the selected rows). Moved: one exchange of counts and the
  selected elements, never the array.
* ``a[mask] = v``, ``a[mask, :] = v``: each rank writes its own rows. ``v`` a scalar, a NumPy array or a
  replicated array (broadcast to the selection as NumPy does): no element moves; ``v`` distributed of the
  selection's shape: each rank receives the rows of ``v`` its mask selects (one ``alltoallv``); ``v``
  distributed of another shape that broadcasts to the selection (a row ``v`` for ``a[mask] = v``): gathered
  to every rank first, then broadcast.
* ``a[:, idx]`` (axis 0 whole, one NumPy index array on a later axis, every other axis a full slice): each
  rank indexes its own rows; the result is laid out like ``a``.
* any index of a replicated array: NumPy's indexing on every rank's copy.

Every function here is collective over the array's communicator (a force point: the recorded operations
run first) and blocking; call them SPMD on every rank with the same arguments. Each returns None when its
case does not apply (the caller then uses the NumPy fallback). Called by :class:`~.array.DistArray`'s
``__getitem__`` and ``__setitem__`` for keys their basic indexing does not take.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from . import fallback
from .array import _INDEXERS, DistArray, wrap
from .elementwise import rep_base_from_numpy
from .exchange import allreduce_sum, alltoallv, from_elements, from_local_part, local_part, result_dist

__all__ = ["mask_of", "getitem", "setitem"]

_FULL = slice(None)


def _is_full(k: Any) -> bool:
    return k is Ellipsis or (isinstance(k, slice) and k == _FULL)


def _mask_key(a: DistArray, key: Any) -> Optional[DistArray]:
    """The mask of ``key`` if ``key`` is ``mask`` or ``(mask, :, ...)`` with ``mask`` a DistArray of bools of
    ``a``'s leading shape on ``a``'s context (whatever the layouts of both), else None. Local."""
    rest: Tuple[Any, ...] = ()
    if isinstance(key, tuple) and key:
        key, rest = key[0], key[1:]
    if not isinstance(key, DistArray) or key.dtype != np.bool_ or not all(_is_full(k) for k in rest):
        return None
    if sum(k is Ellipsis for k in rest) > 1 or key.ndim == 0 or key.ndim + len(rest) - (Ellipsis in rest) > a.ndim:
        return None
    if key.shape != a.shape[:key.ndim] or key.context is not a.context:
        return None
    return key


def mask_of(a: DistArray, key: Any) -> Optional[DistArray]:
    """The mask of ``key`` (see :func:`_mask_key`) laid out like ``a`` if ``a`` is a whole distributed array,
    else None. A mask laid out otherwise (a view such as ``(a % 3 == 0)[:, 0]``, a replicated array, another
    distribution) is copied into ``a``'s layout (a recorded :meth:`~.array.DistArray.redistribute`). Local, no
    force point."""
    mask = _mask_key(a, key)
    if mask is None or a._base.replicated or not a._view.is_full:
        return None
    return mask if mask._view.is_full and mask.dist == a.dist else mask.redistribute(a.dist)


def _row_counts(m: np.ndarray) -> np.ndarray:
    """The number of True elements in each row (index along axis 0) of the local mask ``m`` (int64, one per
    row; empty when this rank holds no rows, as a rank does when the array has fewer rows than ranks). Local."""
    inner = int(np.prod(m.shape[1:], dtype=np.int64))
    return np.count_nonzero(m.reshape(m.shape[0], inner), axis=1).astype(np.int64)


def _selected(a: DistArray, mask: DistArray, what: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(this rank's local buffer of ``a``, its local mask, the positions in the selection (NumPy's order) of the
    rows it selects, ascending; the end position of every global row of the mask). Collective (force point, one
    allreduce of per-row counts)."""
    ctx = a.context
    ctx.flush(what)
    loc, m = a._base.ensure(), mask._base.ensure()
    per_row = _row_counts(m)
    rows = a.dist.global_rows(ctx.rank)
    counts = np.zeros(a.shape[0], dtype=np.int64)
    counts[rows] = per_row
    ends = np.cumsum(allreduce_sum(ctx, counts, what))
    first = np.repeat(ends[rows] - per_row, per_row)                 # position of each row's first selected
    run = np.arange(len(first), dtype=np.int64) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    return loc, m, first + run, ends


def take(a: DistArray, mask: DistArray) -> DistArray:
    """``a[mask]`` (``mask`` from :func:`mask_of`): a new array laid out like ``a``. Collective, blocking."""
    loc, m, pos, ends = _selected(a, mask, "a[mask]")
    total = int(ends[-1]) if len(ends) else 0
    sel = loc[m]
    shape = (total,) + tuple(a.shape[mask.ndim:])
    inner = int(np.prod(shape[1:], dtype=np.int64))
    flat = (pos[:, None] * inner + np.arange(inner, dtype=np.int64)).reshape(-1)
    return from_elements(a.context, shape, a.dtype, flat, sel.reshape(-1), result_dist(a, total), "a[mask]")


def put(a: DistArray, mask: DistArray, value: Any) -> None:
    """``a[mask] = value`` (``mask`` from :func:`mask_of`), in place in each rank's rows. Collective, blocking.
    ``ValueError`` (on every rank) if ``value`` does not broadcast to the selection, as in NumPy. Writes the local
    buffer directly (not a recorded task), so it first ends any copy-on-write sharing of ``a``'s base (a
    ``reshape``/``ravel`` of it, or the array it was reshaped from, keeps its own values)."""
    a._base.unshare()
    loc, m, pos, ends = _selected(a, mask, "a[mask] = v")
    total = int(ends[-1]) if len(ends) else 0
    want = (total,) + tuple(a.shape[mask.ndim:])
    if isinstance(value, DistArray) and not value._base.replicated and value.shape == want:
        mine = _rows_for(a, value, pos, ends)
    else:
        val = value.to_numpy() if isinstance(value, DistArray) else np.asarray(value)  # a row to broadcast: gathered
        try:
            mine = np.broadcast_to(val, want)[pos]
        except ValueError:
            # NumPy's error: the same assignment into a stand-in of the selection (NumPy checks before it writes;
            # np.empty's pages are not touched)
            np.empty(want, a.dtype)[np.ones(total, bool)] = val
            raise ValueError(f"a[mask] = v: v of shape {val.shape} does not broadcast to the selection's shape "
                             f"{want}") from None
    loc[m] = mine


def _rows_for(a: DistArray, value: DistArray, pos: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The rows ``pos`` of the distributed ``value`` on this rank (row ``p`` goes to the rank owning the row of
    ``a`` whose mask selects it; ``ends``: the selection's end position of every row). Collective (one
    ``alltoallv``)."""
    ctx = a.context
    rows, data = local_part(value)
    dest = a.dist.owner(np.searchsorted(ends, rows, side="right")).astype(np.int64)
    trail = tuple(value.shape[1:])
    rec = np.empty(len(rows), dtype=[("r", "<i8"), ("v", value.dtype, trail)])
    order = np.argsort(dest, kind="stable")
    rec["r"], rec["v"] = rows[order], data[order]
    got = alltoallv(ctx, rec, np.bincount(dest, minlength=ctx.size), "a[mask] = v: rows of v")
    mine = np.empty((len(pos),) + trail, dtype=value.dtype)
    mine[np.searchsorted(pos, got["r"])] = got["v"]
    return mine


def _trailing_index(a: DistArray, key: Any) -> bool:
    """True if ``key`` is ``(:, ..., idx, ..., :)``: axis 0 whole, one NumPy integer or bool index array on a
    later axis, full slices elsewhere (then NumPy keeps axis 0 first)."""
    if not isinstance(key, tuple) or len(key) < 2 or not _is_full(key[0]) or key[0] is Ellipsis:
        return False
    arrays = [k for k in key[1:] if isinstance(k, (list, np.ndarray))]
    if len(arrays) != 1 or not all(_is_full(k) or k is arrays[0] for k in key[1:]):
        return False
    arr = np.asarray(arrays[0])
    return arr.dtype.kind in "iub" and not a._base.replicated and a._view.is_full


def getitem(a: DistArray, key: Any) -> Optional[Any]:
    """``a[key]`` for the keys of the module doc; None for any other key. Collective, blocking."""
    if a._base.replicated:
        if isinstance(key, DistArray) or isinstance(key, tuple) and any(isinstance(k, DistArray) for k in key):
            return None
        a.context.flush("a[key]")
        got = a._base.ensure()[a._view.numpy_index()][key]
        if np.ndim(got) == 0 or got.dtype.kind not in "biuf":
            return got
        return wrap(rep_base_from_numpy(a.context, got))
    mask = mask_of(a, key)
    if mask is not None:
        return take(a, mask)
    if _trailing_index(a, key):
        a.context.flush("a[:, idx]")
        local = a._base.ensure()[key]
        shape = (a.shape[0],) + local.shape[1:]
        return from_local_part(a.context, shape, a.dist, local)
    return None


def setitem(a: DistArray, key: Any, value: Any) -> bool:
    """``a[key] = value`` for a mask key of the module doc; False (nothing done) for any other key. A mask key
    on a view or a replicated array goes through the NumPy fallback (written back in place). Collective,
    blocking."""
    mask = mask_of(a, key)
    if mask is not None:
        put(a, mask, value)
        return True
    if _mask_key(a, key) is None:
        return False
    fallback.setitem(a, key, value)
    return True


_INDEXERS.update(getitem=getitem, setitem=setitem)
