"""NumPy's ``sort`` and ``argsort`` natively on distributed arrays: along the distributed axis by a sample
sort, along a local axis by a local sort, and of the flattened array (``axis=None``); ``a.sort()`` in place
and ``a.argsort()``.

Along axis 0 (the distributed one) every rank sorts its rows' records ``(column, key, global row)``
locally, the ranks pick splitters from an allgather of regular samples, one ``alltoallv`` sends each
record to the rank of its bucket, each rank merges what it got, and an exclusive scan of the counts gives
every record its global position: its column and its rank within the column, hence its place in the
result, to which :func:`~.exchange.from_elements` sends it (the result takes the input's layout). Ties of
equal keys are ordered by their global row, so the result of every ``kind`` is the stable one
(``kind='stable'``/``'mergesort'`` are guaranteed stable, as NumPy defines; ``argsort`` returns global
row indices). NaN sorts last, as in NumPy (any sign or payload). Along a local axis each rank sorts its own
rows (``argsort`` stably) and only the result's placement is exchanged. Complex arrays go through the
NumPy fallback. No rank ever holds more than its part plus its bucket.

Collective over the array's communicator and blocking (a force point); call SPMD with the same arguments.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from . import fallback
from .array import _FUNCTIONS, _METHODS, DistArray
from .exchange import allgather_int, allreduce_sum, alltoallv, from_elements, local_part, result_dist

__all__ = ["sort", "argsort", "searchsorted", "sort_keys"]

_STABLE = ("stable", "mergesort")
_KINDS = (None, "quicksort", "heapsort") + _STABLE


def sort_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys ordered as NumPy sorts ``values`` (booleans, integers, floats; NaN last). Local."""
    v = np.asarray(values)
    if v.dtype.kind == "b":
        return v.astype(np.uint64)
    if v.dtype.kind == "u":
        return v.astype(np.uint64)
    if v.dtype.kind == "i":
        return v.astype(np.int64).view(np.uint64) ^ np.uint64(1 << 63)
    f = v.astype(np.float64)
    f = np.where(np.isnan(f), np.float64(np.nan), f) + 0.0            # one positive NaN; -0.0 is 0.0
    bits = f.view(np.uint64)
    neg = (bits >> np.uint64(63)).astype(bool)
    return np.where(neg, ~bits, bits | np.uint64(1 << 63))


def _supported(a: Any, kind: Any, order: Any) -> bool:
    return (isinstance(a, DistArray) and a.ndim >= 1 and a.dtype.kind in "biuf" and order is None
            and kind in _KINDS)


def _lex_less(c, k, g, sc, sk, sg) -> np.ndarray:
    """Records ``(c, k, g)`` lexicographically below the splitter ``(sc, sk, sg)``. Local."""
    return (c < sc) | ((c == sc) & ((k < sk) | ((k == sk) & (g < sg))))


def _sort_axis0(a: DistArray, want_indices: bool) -> DistArray:
    """Sample sort along axis 0 (see the module doc). Collective, blocking."""
    ctx = a.context
    n0 = a.shape[0]
    inner = int(np.prod(a.shape[1:], dtype=np.int64))
    rows, data = local_part(a)
    data = data.reshape(len(rows), inner)
    rec = np.empty(data.size, dtype=[("c", "<i8"), ("k", "<u8"), ("g", "<i8"), ("v", a.dtype)])
    rec["c"] = np.tile(np.arange(inner, dtype=np.int64), len(rows))
    rec["g"] = np.repeat(rows, inner)
    rec["v"] = data.reshape(-1)
    rec["k"] = sort_keys(rec["v"])
    rec = rec[np.lexsort((rec["g"], rec["k"], rec["c"]))]
    p = ctx.size
    counts = np.zeros(p, dtype=np.int64)
    if p == 1:
        counts[0] = len(rec)
        got = rec
    else:
        got = _exchange_buckets(ctx, rec, counts)
    got = got[np.lexsort((got["g"], got["k"], got["c"]))]
    start = int(np.cumsum(allgather_int(ctx, len(got), "sort"))[ctx.rank] - len(got))
    pos = start + np.arange(len(got), dtype=np.int64)
    flat = (pos % n0) * inner + got["c"]
    vals = got["g"] if want_indices else got["v"]
    dtype = np.int64 if want_indices else a.dtype
    return from_elements(ctx, a.shape, dtype, flat, vals, result_dist(a, n0), "argsort" if want_indices else "sort")


def _exchange_buckets(ctx: Any, rec: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Splitters from regular samples of every rank's sorted records, then one alltoallv sending each
    record to its bucket's rank; fills ``counts`` with the records sent per rank. Collective, blocking."""
    p = ctx.size
    m = len(rec)
    take = np.linspace(0, m, p + 1)[1:-1].astype(np.int64) if m else np.zeros(0, dtype=np.int64)
    mine = rec[["c", "k", "g"]][take] if m else np.zeros(0, dtype=rec[["c", "k", "g"]].dtype)
    sample = np.zeros(p - 1, dtype=[("ok", "<i8"), ("c", "<i8"), ("k", "<u8"), ("g", "<i8")])
    if m:
        sample["ok"] = 1
        sample["c"], sample["k"], sample["g"] = mine["c"], mine["k"], mine["g"]
    all_samples = alltoallv(ctx, np.tile(sample, p), np.full(p, p - 1), "sort: samples")   # an allgather
    all_samples = all_samples[all_samples["ok"] == 1]
    all_samples = all_samples[np.lexsort((all_samples["g"], all_samples["k"], all_samples["c"]))]
    bucket = np.zeros(m, dtype=np.int64)
    if len(all_samples):
        picks = np.linspace(0, len(all_samples), p + 1)[1:-1].astype(np.int64)
        for s in all_samples[np.minimum(picks, len(all_samples) - 1)]:
            bucket += ~_lex_less(rec["c"], rec["k"], rec["g"], s["c"], s["k"], s["g"])
    counts[:] = np.bincount(bucket, minlength=p)
    return alltoallv(ctx, rec, counts, "sort: buckets")          # rec is sorted, hence grouped by bucket


def _sort_local(a: DistArray, axis: int, kind: Optional[str], want_indices: bool) -> DistArray:
    """Sort along a local axis: each rank sorts its rows; the result takes ``a``'s layout. Collective."""
    ctx = a.context
    rows, data = local_part(a)
    out = np.argsort(data, axis=axis, kind="stable") if want_indices else np.sort(data, axis=axis, kind=kind)
    inner = int(np.prod(a.shape[1:], dtype=np.int64))
    flat = (rows[:, None] * inner + np.arange(inner, dtype=np.int64)[None, :]).reshape(-1)
    return from_elements(ctx, a.shape, out.dtype, flat, out.reshape(-1), result_dist(a, a.shape[0]),
                         "argsort" if want_indices else "sort")


def _run(a: Any, axis: Any, kind: Any, order: Any, want_indices: bool) -> Any:
    name = "argsort" if want_indices else "sort"
    if not _supported(a, kind, order):
        return fallback.call(np.argsort if want_indices else np.sort, (a,), dict(axis=axis, kind=kind, order=order),
                             name)
    fallback.note_native(name)
    if axis is None:
        a, axis = a.reshape(a.size), 0          # the native reshape (numpy_reshaping), registered as the method
    axis = normalize_axis_index(axis, a.ndim)
    if a.size == 0:
        return a.astype(np.int64) if want_indices else a.copy()
    if axis == 0:
        return _sort_axis0(a, want_indices)
    return _sort_local(a, axis, kind, want_indices)


def _kind(kind: Any, stable: Any) -> Any:
    """The sort kind of ``kind=`` and ``stable=`` (NumPy's ValueError when both are given)."""
    if stable is not None:
        if kind is not None:
            raise ValueError("`kind` and keyword parameters can't be provided at the same time. Use only one of "
                             "them.")
        return "stable" if stable else None
    return kind


def sort(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *, stable: Any = None) -> Any:
    """``numpy.sort``: a sorted copy of ``a`` along ``axis`` (None: the flattened array), in ``a``'s layout.
    Collective, blocking (see the module doc)."""
    kind = _kind(kind, stable)
    if not isinstance(a, DistArray):
        return np.sort(a, axis=axis, kind=kind, order=order)
    return _run(a, axis, kind, order, False)


def argsort(a: Any, axis: Any = -1, kind: Any = None, order: Any = None, *, stable: Any = None) -> Any:
    """``numpy.argsort``: the global indices along ``axis`` that sort ``a`` (int64; ties in the order of the
    input, for every kind). Collective, blocking (see the module doc)."""
    kind = _kind(kind, stable)
    if not isinstance(a, DistArray):
        return np.argsort(a, axis=axis, kind=kind, order=order)
    return _run(a, axis, kind, order, True)


def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None) -> Any:
    """``numpy.searchsorted`` of NumPy values ``v`` (every rank passes the same) in a sorted distributed 1-D
    ``a``: each rank counts its elements below each value (``side='right'``: not above), one allreduce sums
    the counts. A scalar ``v`` gives an int64 scalar, an array ``v`` an array of its shape in block layout.
    Distributed ``v``, ``sorter`` and unsortable dtypes go through the NumPy fallback. Collective, blocking."""
    vals = np.asarray(v) if not isinstance(v, DistArray) else None
    if (not isinstance(a, DistArray) or a.ndim != 1 or vals is None or sorter is not None
            or side not in ("left", "right") or a.dtype.kind not in "biuf" or vals.dtype.kind not in "biuf"):
        return fallback.call(np.searchsorted, (a, v), dict(side=side, sorter=sorter), "searchsorted")
    fallback.note_native("searchsorted")
    _, data = local_part(a)
    if a.dtype.kind == vals.dtype.kind or a.dtype.kind == "f" or vals.dtype.kind == "f":
        common = np.result_type(a.dtype, vals.dtype)
        keys, vkeys = sort_keys(data.astype(common)), sort_keys(vals.astype(common))
    else:                                        # ints of different signedness: as float64 keys
        keys, vkeys = sort_keys(data.astype(np.float64)), sort_keys(vals.astype(np.float64))
    counts = allreduce_sum(a.context, np.searchsorted(np.sort(keys), vkeys.reshape(-1), side=side), "searchsorted")
    if vals.ndim == 0:
        return np.int64(counts[0])
    from .creation import from_numpy

    return from_numpy(counts.reshape(vals.shape), dist="block", comm=a.comm)


def _sort_in_place(a: DistArray, axis: int = -1, kind: Any = None, order: Any = None) -> None:
    """``a.sort()``: sort ``a`` in place (its values replaced by ``sort(a, axis, kind)``). Collective. As
    NumPy's method, it sorts along one axis: ``axis=None`` raises TypeError."""
    if axis is None:
        raise TypeError("'NoneType' object cannot be interpreted as an integer (a.sort sorts along one axis; "
                        "numpy.sort(a, axis=None) returns the flattened array sorted)")
    a[...] = sort(a, axis=axis, kind=kind, order=order)


_FUNCTIONS.update({np.sort: sort, np.argsort: argsort, np.searchsorted: searchsorted})
_METHODS.update(sort=_sort_in_place, argsort=argsort, searchsorted=searchsorted)
