"""NumPy's selection functions natively on distributed arrays: ``take``, ``compress``, ``choose``, ``put``,
``partition``/``argpartition``, ``resize`` (and the ``resize`` method), index arrays mixed with slices
(``a[idx, 1:5]``, ``a[:, idx]``, also assigned to), the ``a.shape = ...`` assignment and ``a.flat``
(:class:`FlatIter`: reads a copy, writes in place through ``put``).

How each runs, built from the native pieces (nothing is gathered to one rank unless said):

* along the distributed axis 0, index arrays go through the recorded irregular copies (:mod:`.irregular`:
  ``a[idx]``, ``b[idx] = v``); along another axis each rank selects within its own rows (``local_part``,
  then an exchange by global flat index that keeps every row where it is, :mod:`.exchange`); a distributed
  index array used along another axis is gathered (index arrays along trailing axes are small);
* ``choose`` is a chain of recorded ``where``; ``put`` writes the flattened array (``ravel``, ``a[idx] = v``,
  ``reshape`` back); ``resize`` repeats the flattened array (``tile``) and reshapes it;
* ``partition``/``argpartition`` return the sorted order (``sort``/``argsort``, stable): a valid partition
  for every ``kth`` (NumPy leaves the order within each side unspecified), so the element at each ``kth``
  equals NumPy's;
* ``a.shape = s`` where NumPy allows it (the whole array, or rows ``a[i:j]`` of it): ``a`` becomes the
  reshaped array, its own base from then on (views taken before no longer share its elements: NumPy's
  views would); NumPy's errors elsewhere.

Collective over the array's communicator (SPMD) and blocking where they exchange or check bounds.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Optional, Tuple

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from . import fallback
from .array import _FUNCTIONS, _METHODS, DistArray, where
from .exchange import from_elements, local_part, result_dist
from .numpy_reshaping import _new_shape, ravel, reshape, tile
from .numpy_sorting import argsort, sort

__all__ = ["take", "compress", "choose", "put", "partition", "argpartition", "resize", "getitem_mixed",
           "setitem_mixed", "set_shape", "resize_in_place", "FlatIter"]


def _map_rows(a: DistArray, fn: Callable[[np.ndarray], np.ndarray], shape: Tuple[int, ...], what: str) -> DistArray:
    """A new array of ``shape`` (same length along axis 0 as ``a``) whose rows are ``fn`` of ``a``'s rows,
    each rank computing its own (``fn`` takes and returns a block of rows). Collective, blocking."""
    rows, data = local_part(a)
    out = np.asarray(fn(data))
    inner = int(np.prod(shape[1:], dtype=np.int64))
    flat = (rows[:, None] * inner + np.arange(inner, dtype=np.int64)[None, :]).reshape(-1)
    return from_elements(a.context, shape, out.dtype, flat, out, result_dist(a, shape[0]), what)


def _cast_text(dtype: np.dtype, rule: str) -> str:
    """NumPy's TypeError text for indices of ``dtype`` that ``take`` (``same_kind``) or ``put`` (``safe``) refuse."""
    return f"Cannot cast array data from {np.dtype(dtype)!r} to dtype('int64') according to the rule '{rule}'"


def _indices(ind: Any, n: int, mode: str, what: str) -> Any:
    """``ind`` as int64 indices into an axis of length ``n`` (negative ones counted from the end), by ``mode``
    ('raise': IndexError as NumPy's for one out of bounds; 'wrap'; 'clip'). Distributed ``ind``: recorded. Arrays
    of indices are cast as NumPy's ``what`` (``take`` or ``put``) casts them: bool counts as 0/1, floats raise
    NumPy's TypeError; lists and scalars are converted to int as NumPy converts them."""
    if mode not in ("raise", "wrap", "clip"):
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    rule = "same_kind" if what == "take" else "safe"
    if isinstance(ind, DistArray):
        if ind.dtype.kind == "b":
            ind = ind.astype(np.int64)
        elif ind.dtype.kind not in "iu":
            raise TypeError(_cast_text(ind.dtype, rule))
        if mode == "wrap":
            return np.remainder(ind, n)
        if mode == "clip":
            return np.clip(ind, 0, n - 1)
        if ind.size == 0:
            return ind                   # no index to check (e.g. compress with no true condition, of no rows)
        lo, hi = int(np.min(ind)), int(np.max(ind))
        if lo < -n or hi >= n:
            raise IndexError(f"{what}: index {lo if lo < -n else hi} is out of bounds for axis 0 with size {n}")
        return np.where(ind < 0, ind + n, ind) if lo < 0 else ind
    if isinstance(ind, np.ndarray):         # NumPy casts an array of indices by ``rule``, anything else as int
        if ind.dtype.kind not in "biu":
            raise TypeError(_cast_text(ind.dtype, rule))
        idx = ind.astype(np.int64)
    else:
        idx = np.asarray(ind, dtype=np.int64)
    if mode == "wrap":
        return np.remainder(idx, n) if n else idx
    if mode == "clip":
        return np.clip(idx, 0, n - 1)
    bad = idx[(idx < -n) | (idx >= n)]
    if bad.size:
        raise IndexError(f"{what}: index {int(bad[0])} is out of bounds for axis 0 with size {n}")
    return np.where(idx < 0, idx + n, idx)


def _rows(a: DistArray, idx: Any) -> DistArray:
    """``a[idx]`` along axis 0 for int64 indices (NumPy, any shape, or a distributed array): recorded copies."""
    if isinstance(idx, DistArray):
        flat = idx if idx.ndim == 1 else ravel(idx)
        got = a[flat]
        return got if idx.ndim == 1 else reshape(got, idx.shape + a.shape[1:])
    got = a[idx.reshape(-1)]
    return got if idx.ndim == 1 else reshape(got, idx.shape + a.shape[1:])


def take(a: Any, indices: Any, axis: Any = None, out: Any = None, mode: str = "raise") -> Any:
    """``numpy.take``: elements (``axis=None``: of the flattened array) or slices along ``axis`` at
    ``indices``. Collective, blocking."""
    if not isinstance(a, DistArray) or a.ndim == 0 or (out is not None and not isinstance(out, DistArray)):
        return fallback.call(np.take, (a, indices), dict(axis=axis, out=out, mode=mode), "take")
    fallback.note_native("take")
    if axis is None:
        a, axis = ravel(a), 0
    ax = normalize_axis_index(operator.index(axis), a.ndim)
    idx = _indices(indices, a.shape[ax], mode, "take")
    if ax == 0:
        res = _rows(a, idx)
    else:
        ix = idx.to_numpy() if isinstance(idx, DistArray) else idx
        shape = a.shape[:ax] + ix.shape + a.shape[ax + 1:]
        res = _map_rows(a, lambda blk: np.take(blk, ix, axis=ax), shape, "take")
    if out is not None:
        out[...] = res
        return out
    return res


def compress(condition: Any, a: Any, axis: Any = None, out: Any = None) -> Any:
    """``numpy.compress``: the slices of ``a`` along ``axis`` (None: of the flattened array) where the 1-D
    ``condition`` is true. Collective, blocking."""
    if not isinstance(a, DistArray) or a.ndim == 0 or np.ndim(condition) != 1:
        return fallback.call(np.compress, (condition, a), dict(axis=axis, out=out), "compress")
    fallback.note_native("compress")
    if isinstance(condition, DistArray):
        from .numpy_reshaping import flatnonzero

        idx = flatnonzero(condition)
        if axis is not None and normalize_axis_index(axis, a.ndim) != 0:
            idx = idx.to_numpy()
    else:
        idx = np.flatnonzero(np.asarray(condition)).astype(np.int64)
    return take(a, idx, axis=axis, out=out)


def choose(a: Any, choices: Any, out: Any = None, mode: str = "raise") -> Any:
    """``numpy.choose``: ``choices[a[i]][i]`` elementwise (broadcast), as one chain of recorded ``where``.
    ``mode='raise'`` checks the range of ``a`` first (a force point)."""
    seq = [choices[k] for k in range(choices.shape[0])] if isinstance(choices, DistArray) else list(choices)
    if not isinstance(a, DistArray) and not any(isinstance(c, DistArray) for c in seq):
        return np.choose(a, choices, out=out, mode=mode)
    if out is not None and not isinstance(out, DistArray) or not seq:
        return fallback.call(np.choose, (a, choices), dict(out=out, mode=mode), "choose")
    fallback.note_native("choose")
    n = len(seq)
    ia = a if isinstance(a, DistArray) else np.asarray(a)
    if ia.dtype.kind not in "iu":
        raise TypeError(f"choose: the index array must be of integer type, got {ia.dtype}")
    if mode == "wrap":
        ia = np.remainder(ia, n)
    elif mode == "clip":
        ia = np.clip(ia, 0, n - 1)
    elif mode != "raise":
        raise ValueError(f"clipmode must be one of 'clip', 'raise', or 'wrap' (got {mode!r})")
    elif np.size(ia) and (int(np.min(ia)) < 0 or int(np.max(ia)) >= n):
        raise ValueError("invalid entry in choice array")
    dts = [c.dtype if isinstance(c, DistArray) else np.asarray(c).dtype for c in seq]
    dt = np.result_type(*dts)
    seq = [c if isinstance(c, DistArray) else np.asarray(c, dtype=dt) for c in seq]
    res = where(ia == n - 1, seq[-1], seq[-1])
    for k in range(n - 2, -1, -1):
        res = where(ia == k, seq[k], res)
    if not isinstance(res, DistArray):
        from .creation import from_numpy

        res = from_numpy(res, comm=next(c for c in [a] + seq if isinstance(c, DistArray)).comm)
    if res.dtype != dt:
        res = res.astype(dt)
    if out is not None:
        out[...] = res
        return out
    return res


def put(a: Any, ind: Any, v: Any, mode: str = "raise") -> None:
    """``numpy.put``: ``a.flat[ind] = v`` in place (``v`` repeated to the length of ``ind``). Collective,
    blocking. With a distributed ``ind`` holding one index twice, which value lands is not defined."""
    if not isinstance(a, DistArray):
        return fallback.call(np.put, (a, ind, v), dict(mode=mode), "put")
    fallback.note_native("put")
    flat_ind = ind if not isinstance(ind, DistArray) or ind.ndim == 1 else ravel(ind)
    if not isinstance(flat_ind, DistArray):     # an array keeps its dtype (cast by NumPy's rule), the rest is int
        flat_ind = (ind if isinstance(ind, np.ndarray) else np.asarray(ind, dtype=np.int64)).reshape(-1)
    idx = _indices(flat_ind, a.size, mode, "put")
    m = idx.shape[0]
    if isinstance(v, DistArray) and v.shape == (m,):
        vals = v
    else:
        vals = np.resize(np.asarray(v.to_numpy() if isinstance(v, DistArray) else v).astype(a.dtype), m)
        if not isinstance(idx, DistArray) and m:            # one index twice: NumPy keeps the last value
            u, first = np.unique(idx[::-1], return_index=True)
            idx, vals = u, vals[::-1][first]
    if m == 0:
        return None
    if a.ndim == 1:
        a[idx] = vals
        return None
    flat = ravel(a)
    flat[idx] = vals
    a[...] = reshape(flat, a.shape)
    return None


def _kth_check(a: DistArray, kth: Any, axis: Any) -> None:
    n = a.size if axis is None else a.shape[normalize_axis_index(axis, a.ndim)]
    for k in np.atleast_1d(np.asarray(kth)).reshape(-1):
        if np.asarray(k).dtype.kind not in "iu":
            raise TypeError("Partition index must be integer")
        if a.size and not -n <= int(k) < n:          # NumPy checks no bound for an empty array
            raise ValueError(f"kth(={int(k)}) out of bounds ({n})")


def partition(a: Any, kth: Any, axis: Any = -1, kind: str = "introselect", order: Any = None) -> Any:
    """``numpy.partition``: the sorted copy along ``axis`` (a valid partition for every ``kth``; see the
    module doc). Collective, blocking."""
    if not isinstance(a, DistArray) or order is not None or a.ndim == 0:
        return fallback.call(np.partition, (a, kth), dict(axis=axis, kind=kind, order=order), "partition")
    fallback.note_native("partition")
    _kth_check(a, kth, axis)
    return sort(a, axis=axis)


def argpartition(a: Any, kth: Any, axis: Any = -1, kind: str = "introselect", order: Any = None) -> Any:
    """``numpy.argpartition``: the stable sorting order along ``axis`` (a valid partition order for every
    ``kth``). Collective, blocking."""
    if not isinstance(a, DistArray) or order is not None or a.ndim == 0:
        return fallback.call(np.argpartition, (a, kth), dict(axis=axis, kind=kind, order=order), "argpartition")
    fallback.note_native("argpartition")
    _kth_check(a, kth, axis)
    return argsort(a, axis=axis, kind="stable")


def _partition_in_place(a: DistArray, kth: Any, axis: Any = -1, kind: str = "introselect", order: Any = None) -> None:
    a[...] = partition(a, kth, axis=axis, kind=kind, order=order)


def resize(a: Any, new_shape: Any) -> Any:
    """``numpy.resize``: a new array of ``new_shape`` filled with ``a``'s flattened elements, repeated as
    needed. Collective, blocking."""
    shape = (operator.index(new_shape),) if not isinstance(new_shape, (tuple, list)) else \
        tuple(operator.index(s) for s in new_shape)
    if not isinstance(a, DistArray) or not shape:
        return fallback.call(np.resize, (a, new_shape), {}, "resize")
    if any(s < 0 for s in shape):
        raise ValueError("all elements of `new_shape` must be non-negative")
    fallback.note_native("resize")
    total = int(np.prod(shape, dtype=np.int64))
    if a.size == 0 or total == 0:
        from .creation import zeros

        return zeros(shape, dtype=a.dtype, dist=result_dist(a, shape[0]), comm=a.comm)
    flat = ravel(a) if a.ndim != 1 else a
    reps = -(-total // a.size)
    if reps > 1:
        flat = tile(flat, reps)
    if flat.shape[0] != total:
        flat = flat[:total]
    return reshape(flat, shape) if shape != flat.shape else flat.copy()


def _rebind(a: DistArray, new: DistArray) -> None:
    """Make ``a`` show ``new``'s base and view (``a`` becomes that array)."""
    if new is a:
        return
    a._base.nviews -= 1
    a._base, a._view = new._base, new._view
    new._base.nviews += 1


def _contiguous(a: DistArray) -> bool:
    """Whether ``a`` is C-contiguous within its base as NumPy would see it: the whole base, or rows ``i:j``."""
    v = a._view
    box = v.box()
    return v.is_full or (box is not None and v.ndim == len(a._base.shape)
                         and all(box[k] == (0, a._base.shape[k]) for k in range(1, v.ndim)) and v.row_kept
                         and v.row_params[1] == 1 and v.lead_new() == 0)


def set_shape(a: DistArray, value: Any) -> None:
    """``a.shape = value``: as NumPy, for the whole array or rows ``i:j`` of it (see the module doc);
    AttributeError (NumPy's) for other views, ValueError for another size. Collective, blocking."""
    new = _new_shape(a.size, value)
    if new == a.shape:
        return
    if not _contiguous(a):
        raise AttributeError("Incompatible shape for in-place modification. Use `.reshape()` to make a copy with "
                             "the desired shape.")
    if not new:
        raise ValueError(f"setting the shape of a distributed array to () is not supported (size {a.size}); "
                         "use a.reshape(()) or float(a)")
    _rebind(a, reshape(a, new))


def resize_in_place(a: DistArray, *new_shape: Any, refcheck: bool = True) -> None:
    """``a.resize(new_shape)``: ``a`` becomes an array of ``new_shape`` holding its flattened elements, the
    rest zero (NumPy's method; ``refcheck`` is not checked). ValueError, as NumPy's, for a view.
    Collective, blocking."""
    if len(new_shape) == 1 and isinstance(new_shape[0], (tuple, list)):
        new_shape = tuple(new_shape[0])
    shape = tuple(operator.index(s) for s in new_shape)
    if not a._view.is_full:
        raise ValueError("cannot resize this array: it does not own its data")
    if not shape or any(s < 0 for s in shape):
        raise ValueError("negative dimensions not allowed" if shape else "resize to () is not supported")
    from .creation import zeros

    total = int(np.prod(shape, dtype=np.int64))
    flat = zeros((total,), dtype=a.dtype, dist=result_dist(a, total), comm=a.comm)
    k = min(total, a.size)
    if k:
        src = ravel(a) if a.ndim != 1 else a
        flat[:k] = src[:k]
    _rebind(a, reshape(flat, shape) if shape != (total,) else flat)


def _mixed(a: DistArray, key: Any) -> Optional[Tuple[int, Any, Tuple[Any, ...]]]:
    """(position, index array, the other entries) of a key with one 1-D index array among slices (and, after
    an index array at position 0, integers or Ellipsis); None for other keys."""
    if not isinstance(key, tuple):
        return None
    pos = [k for k, e in enumerate(key) if isinstance(e, (list, np.ndarray, DistArray))]
    if len(pos) != 1 or any(e is None for e in key):
        return None
    p = pos[0]
    arr = key[p]
    if not isinstance(arr, DistArray):
        listed = not isinstance(arr, np.ndarray)
        arr = np.asarray(arr)
        if listed and arr.size == 0:
            arr = arr.astype(np.intp)        # an empty list selects nothing (NumPy's a[[], 1])
        if arr.dtype == np.bool_ and arr.ndim == 1:
            arr = np.flatnonzero(arr)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            return None
    elif arr.ndim != 1 or arr.dtype.kind not in "iu":
        return None
    rest = key[:p] + key[p + 1:]
    if p > 0 and not all(isinstance(e, slice) for e in rest):
        return None
    return p, arr, rest


def getitem_mixed(a: DistArray, key: Any) -> Any:
    """``a[key]`` for one index array mixed with slices (see :func:`_mixed`), natively; None for other keys."""
    got = _mixed(a, key)
    if got is None:
        return None
    p, arr, rest = got
    if p == 0:
        view = a[(slice(None),) + rest]
        return view[arr] if isinstance(view, DistArray) else None
    view = a[rest[:p] + (slice(None),) + rest[p:]]
    return take(view, arr, axis=p)


def setitem_mixed(a: DistArray, key: Any, value: Any) -> bool:
    """``a[key] = value`` for one index array at position 0 followed by basic indices; False for other keys."""
    got = _mixed(a, key)
    if got is None or got[0] != 0:
        return False
    view = a[(slice(None),) + got[2]]
    if not isinstance(view, DistArray):
        return False
    view[got[1]] = value
    return True


class FlatIter:
    """``a.flat`` of a distributed array ``a`` (NumPy's ``flatiter``): ``a`` in C order as one axis.

    * ``a.flat[key] = v`` and ``a.flat = v`` write into ``a`` in place (natively, :func:`put`: ``v`` repeated to
      the length of the selection, as NumPy's), for any key NumPy's ``flatiter`` takes (integers, slices,
      ``...``, integer and boolean arrays; a distributed key is gathered);
    * ``a.flat[key]`` reads a copy (``ravel(a)[key]``; a single element is NumPy's scalar);
    * ``len``, ``numpy.asarray``, iteration (gathered on every rank once), ``copy()`` (``ravel(a)``) and
      ``base`` (``a``) as NumPy's.

    Collective over ``a``'s communicator (SPMD): every rank reads and writes alike. Before, ``a.flat`` went
    through the NumPy fallback: a write went into a gathered copy and was lost."""

    __slots__ = ("base",)

    def __init__(self, a: DistArray):
        self.base = a

    def _positions(self, key: Any) -> Any:
        """The flat positions ``key`` selects: an integer, a range's array for a slice or ``...`` (no array of
        every position), else NumPy's selection from ``arange(size)`` (index arrays and masks, NumPy's errors)."""
        n = self.base.size
        key = key.to_numpy() if isinstance(key, DistArray) else key
        if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
            k = operator.index(key)
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for size {n}")     # NumPy's flatiter text
            return np.int64(k % n)
        if isinstance(key, slice):
            return np.arange(*key.indices(n), dtype=np.int64)
        if key is Ellipsis:
            return np.arange(n, dtype=np.int64)
        return np.arange(n, dtype=np.int64)[key]

    def __getitem__(self, key: Any) -> Any:
        got = ravel(self.base)[self._positions(key)]
        return got.to_numpy()[()] if isinstance(got, DistArray) and got.ndim == 0 else got

    def __setitem__(self, key: Any, value: Any) -> None:
        put(self.base, np.reshape(self._positions(key), -1), value)

    def __len__(self) -> int:
        return self.base.size

    def __iter__(self) -> Any:
        return iter(ravel(self.base).to_numpy())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = ravel(self.base).to_numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def copy(self) -> DistArray:
        """``a.flat.copy()``: the flattened array (a new distributed array)."""
        return ravel(self.base)


def _set_flat(a: DistArray, value: Any) -> None:
    """``a.flat = value``: every element of ``a``, ``value`` repeated (NumPy's flatiter assignment). Collective."""
    FlatIter(a)[...] = value


DistArray.flat = property(FlatIter, _set_flat, doc=FlatIter.__doc__)

_FUNCTIONS.update({np.take: take, np.compress: compress, np.choose: choose, np.put: put, np.partition: partition,
                   np.argpartition: argpartition, np.resize: resize})
_METHODS.update(take=lambda a, indices, axis=None, out=None, mode="raise": take(a, indices, axis, out, mode),
                compress=lambda a, condition, axis=None, out=None: compress(condition, a, axis, out),
                choose=lambda a, choices, out=None, mode="raise": choose(a, choices, out, mode),
                put=put, partition=_partition_in_place, argpartition=argpartition, resize=resize_in_place,
                conj=np.conjugate, conjugate=np.conjugate, _getitem_mixed=getitem_mixed, _setitem_mixed=setitem_mixed, _set_shape=set_shape)
