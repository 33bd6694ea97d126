"""Irregular copies through an index array: ``b[idx] = a`` and ``a[idx]`` along axis 0, aggregated per
destination by the project's :class:`~nbmpi.workers.aggregation.aggregator.Aggregator`.

What users write (SPMD, every rank)::

    b[perm] = a            # scatter: b[perm[k]] = a[k]
    c = a[idx]             # gather:  c[k] = a[idx[k]]
    b[ix] = a; c = a[ix]   # ix a DistArray of integers (the indices stay distributed)

``idx`` selects rows (axis 0) of a distributed array or of a view whose axis 0 is its
distributed axis. It is a 1-D NumPy integer array (the same on every rank, a "replicated"
index), a 1-D boolean NumPy mask of the axis's length (its ``flatnonzero``), or a 1-D
distributed integer array. Negative indices count from the end, as in NumPy.

Semantics:

* **Eager.** Both are force points: pending operations run first, then the copy, before the
  call returns (collective over the array's communicator). ``a[idx]`` returns a new array of
  shape ``(len(idx),) + a.shape[1:]``: distributed like ``a`` (its kind and block size, over
  ``len(idx)`` rows) for a NumPy index, like the index array for a distributed one.
* **Duplicates in ``b[idx] = a``**: NumPy stores one of the values and documents no order; nbmpi
  defines it: the value of the LAST occurrence (the largest position ``k``) is stored, on any
  rank count and whatever order the messages arrive in (what NumPy's sequential loop does).
  A NumPy index is resolved once per plan (only the last occurrences move); a distributed
  index carries each item's position ``k`` and the destination keeps, per row, the largest
  ``k`` written in this call (a stamp array per plan, never cleared: stamps of earlier
  calls are smaller by construction).
* **Errors**: an index out of ``-n .. n-1`` raises :class:`~.errors.IndexOutOfBounds` on EVERY
  rank, naming the value, its position and the rank that holds it, even if only one rank
  holds it: the ranks agree on the outcome of the check (one small allgather) before any item
  moves, so nothing is written and nothing hangs. Shapes that do not match raise
  :class:`~.errors.ShapeError` when the operation is recorded.

How it runs (at the force point, between the scheduler's other work: it is a barrier within
the flush). Each item is one row: its position in the destination's local block, (for a
distributed index) its ``k``, and the row's elements. The rank holding the source row fills
the items with a numba kernel straight from its local block and pushes them with
``push_many`` (bucketed per destination in numba, one buffer per destination, sent when
full); the numba handler on the destination writes the rows into its local block; the
aggregator's ``flush`` (termination detection) ends the step. A gather with a distributed
index is a request/reply: the index holder pushes ``(position, source row)`` requests to the
row's owner, whose handler answers with the row through a linked reply aggregator. With a
NumPy index every rank knows every destination, so a gather needs no requests. Plans (who
sends which rows where) are cached by layout, and for a NumPy index by its content (a CRC32
of it is computed per call); aggregators are kept per item type and reused.
"""
from __future__ import annotations

import time
import zlib
from typing import Any, Optional, Tuple

import numba
import numpy as np

from ..tracing import tracer as tracing
from ..core import spmd
from ..aggregation.aggregator import Aggregator
from ..core.errors import AggregationTimeout
from .distribution import Distribution
from .errors import DistArrayTimeout, IndexOutOfBounds, ShapeError, UnsupportedOperation
from .graph import Base, IndexedCopy, Leaf, node_desc
from .indexing import View
from .packing import RowPattern, row_pattern

__all__ = ["record_take", "record_put", "execute", "numpy_index", "digest", "check_rows_view", "write_dtype",
           "REQUEST_DTYPE"]

K_CHECK = tracing.register_kind("distarray_index_check")
_KIND_CODE = {"block": 1, "cyclic": 2, "block-cyclic": 2}
#: Bytes per aggregation buffer (the item count follows from the item size).
BUFFER_BYTES = 1 << 18
#: Item of a gather request: destination position and source row (local indices).
REQUEST_DTYPE = np.dtype([("pos", np.int64), ("row", np.int64)])
_now = time.perf_counter_ns


def write_dtype(dtype: np.dtype, elems: int, stamped: bool) -> np.dtype:
    """Item of a row write: destination local row ``pos``, (stamped) the position ``k`` that orders
    duplicates, and the row's ``elems`` elements (booleans as uint8 0/1: numba has no bool arrays in records;
    the kernels convert on the way in and out)."""
    dt = np.dtype(np.uint8) if np.dtype(dtype) == np.bool_ else np.dtype(dtype)
    fields = [("pos", np.int64)] + ([("k", np.int64)] if stamped else []) + [("val", dt, (elems,))]
    return np.dtype(fields)


# --------------------------------------------------------------------------- numba kernels and handlers
@numba.njit(cache=True, nogil=True, inline="always")
def _row_to_item(src, base, offs, inner, stride, v):  # pragma: no cover - compiled
    """v = the elements (pattern ``offs``, ``inner``, ``stride``) of the row of flat ``src`` starting at ``base``."""
    k = 0
    for q in range(offs.shape[0]):
        b = base + offs[q]
        for j in range(inner):
            v[k] = src[b + j * stride]
            k += 1


@numba.njit(cache=True, nogil=True, inline="always")
def _item_to_row(dst, base, offs, inner, stride, v):  # pragma: no cover - compiled
    """The elements (pattern ``offs``, ``inner``, ``stride``) of the row of flat ``dst`` starting at ``base`` = v
    (cast to ``dst``'s dtype)."""
    k = 0
    for q in range(offs.shape[0]):
        b = base + offs[q]
        for j in range(inner):
            dst[b + j * stride] = v[k]
            k += 1


@numba.njit(cache=True, nogil=True)
def _fill_rows(items, src, row_elems, offs, inner, stride, rows):  # pragma: no cover - compiled
    """items[i].val = the elements (pattern) of local row rows[i] of src."""
    for i in range(rows.shape[0]):
        _row_to_item(src, rows[i] * row_elems, offs, inner, stride, items[i]["val"])


@numba.njit(cache=True, nogil=True)
def write_rows(items, state):  # pragma: no cover - compiled
    """Aggregator handler: write each item's row into the local block (``state`` = (block, row_elems,
    offsets, inner, stride)); casts to the block's dtype."""
    dst, row_elems, offs, inner, stride = state
    for i in range(items.shape[0]):
        _item_to_row(dst, items[i]["pos"] * row_elems, offs, inner, stride, items[i]["val"])


@numba.njit(cache=True, nogil=True)
def write_rows_last(items, state):  # pragma: no cover - compiled
    """Aggregator handler for duplicates: like :func:`write_rows`, but a row is written only if the item's
    ``epoch + k`` exceeds the row's stamp (``state`` adds (stamp, epoch)): the largest ``k`` wins."""
    dst, row_elems, offs, inner, stride, stamp, epoch = state
    for i in range(items.shape[0]):
        p = items[i]["pos"]
        key = epoch + items[i]["k"]
        if key <= stamp[p]:
            continue
        stamp[p] = key
        _item_to_row(dst, p * row_elems, offs, inner, stride, items[i]["val"])


@numba.njit(cache=True, nogil=True)
def serve_rows(items, state, src, out_dests, out_items):  # pragma: no cover - compiled
    """Aggregator reply handler of a gather: answer each request ``(pos, row)`` from rank ``src`` with the
    row's elements (``state`` = (block, row_elems, offsets, inner, stride)). Returns the rows written."""
    a, row_elems, offs, inner, stride = state
    n = items.shape[0]
    for i in range(n):
        out_dests[i] = src
        out_items[i]["pos"] = items[i]["pos"]
        _row_to_item(a, items[i]["row"] * row_elems, offs, inner, stride, out_items[i]["val"])
    return n


@numba.njit(cache=True, nogil=True)
def _locate(vals, n, start, step, kind, nranks, block, offsets, dests, locs):  # pragma: no cover - compiled
    """For each index value: wrap negatives, check ``-n <= v < n``, global row ``start + v*step``, its owner
    (into ``dests``) and local row there (into ``locs``, e.g. a field of the items). Returns the first bad
    position, or -1."""
    for i in range(vals.shape[0]):
        v = np.int64(vals[i])
        if v < 0:
            v += n
        if v < 0 or v >= n:
            return i
        g = start + v * step
        if kind == 1:
            r = np.searchsorted(offsets, g, side="right") - 1
            loc = g - offsets[r]
        else:
            blk = g // block
            r = blk % nranks
            loc = (blk // nranks) * block + g % block
        dests[i] = r
        locs[i] = loc
    return -1


def _dist_args(d: Distribution) -> Tuple[int, int, int, np.ndarray]:
    return _KIND_CODE[d.kind], d.nranks, d.block, d.offsets if d.kind == "block" else np.zeros(1, dtype=np.int64)


def _pattern_args(p: RowPattern) -> Tuple[int, np.ndarray, int, int]:
    return p.row_elems, p.offsets, p.inner, p.stride


# --------------------------------------------------------------------------- recording (DistArray hooks)
def numpy_index(key: Any, axis_len: int, shape: Tuple[int, ...] = ()) -> Optional[np.ndarray]:
    """``key`` as an int64 index array along axis 0 if it is a 1-D NumPy integer array, a list of integers or
    a 1-D boolean mask of length ``axis_len``; None if it is not an index array (basic indexing). Raises
    IndexError (a mask of another shape), UnsupportedOperation (more than one dimension; for a mask of the
    leading ``shape`` of the indexed array, e.g. its whole shape, NumPy's indexing through the fallback takes it)."""
    if isinstance(key, list):
        key = np.asarray(key)
        if key.size == 0:
            key = key.astype(np.int64)
    if not isinstance(key, np.ndarray):
        return None
    if key.dtype == np.bool_:
        if key.ndim > 1 and key.shape == tuple(shape[:key.ndim]):
            raise UnsupportedOperation(f"a NumPy boolean mask of {key.ndim} dimensions selects elements, not rows")
        dims = tuple(shape) or (axis_len,)
        off = next((k for k, (m, d) in enumerate(zip(key.shape, dims)) if m != d), None)
        if off is not None:     # NumPy's text
            raise IndexError(f"boolean index did not match indexed array along axis {off}; size of axis is "
                             f"{dims[off]} but size of corresponding boolean axis is {key.shape[off]}")
        if key.ndim != 1 or key.shape[0] != axis_len:
            raise IndexError(f"boolean index of shape {key.shape} does not match axis 0 of length {axis_len}; "
                             "a mask selects rows (a 1-D mask of the axis's length); for a[mask] = x with a "
                             "mask of the array's shape use where(mask, x, a)")
        return np.flatnonzero(key).astype(np.int64)
    if key.dtype.kind not in "iu":
        raise IndexError("arrays used as indices must be of integer (or boolean) type, got " + str(key.dtype))
    if key.ndim != 1:
        raise UnsupportedOperation(f"index arrays of {key.ndim} dimensions are not supported; index axis 0 with a "
                                   "1-D integer array (a[idx]) and reshape the result with NumPy after to_numpy()")
    return np.ascontiguousarray(key, dtype=np.int64)


def digest(idx: np.ndarray) -> int:
    """The content fingerprint of a NumPy index array (plan key and divergence check): CRC32 and length."""
    return (zlib.crc32(idx) << 32) | (len(idx) & 0xFFFFFFFF)


def rows_view(view: View) -> bool:
    """Whether axis 0 of ``view`` is its base's distributed axis (what an index array selects natively)."""
    return bool(view.row_kept) and not view.lead_new()


def check_rows_view(leaf: Leaf, what: str) -> None:
    """Raise UnsupportedOperation unless axis 0 of the view ``leaf`` is its base's distributed axis."""
    v = leaf.view
    if not rows_view(v):
        raise UnsupportedOperation(f"{what}: an index array selects along axis 0, which must be the distributed "
                                   f"axis; {v.text()} of {leaf.base.name()} fixes or moves it. Index the base array "
                                   "first, then slice the result")


def record_take(context, src: Leaf, idx: Any) -> Leaf:
    """Record ``src[idx]`` (see the module doc) and return the result's Leaf; the caller forces it.
    ``idx``: a NumPy int64 array (from :func:`numpy_index`) or a Leaf of a compact 1-D distributed integer
    array."""
    check_rows_view(src, "a[idx]")
    trail = src.view.shape[1:]
    if isinstance(idx, Leaf):
        m = idx.shape[0]
        d = idx.base.dist
    else:
        m = len(idx)
        d = src.base.dist.with_rows(m)
    base = Base(context, (m,) + tuple(trail), src.dtype, d, temp=True)
    out = Leaf(base, View.full(base.shape))
    desc = f"{base.name()} = {node_desc(src)}[" + (f"{node_desc(idx)}]" if isinstance(idx, Leaf) else
                                                   f"<NumPy index array of {m}>]")
    if isinstance(idx, Leaf):
        context.record(IndexedCopy("gather", out, src, idx, None, 0, desc))
    else:
        context.record(IndexedCopy("gather", out, src, None, idx, digest(idx), desc))
    return out


def record_put(context, out: Leaf, idx: Any, src: Leaf) -> None:
    """Record ``out[idx] = src`` (see the module doc); the caller forces it. ``src`` has the shape
    ``(len(idx),) + out.shape[1:]``; with a distributed ``idx`` (a Leaf) it is aligned with it."""
    check_rows_view(out, "b[idx] = a")
    if out.base.replicated:
        raise UnsupportedOperation("b[idx] = a into a replicated array is not supported; index a distributed "
                                   "array, or gather to NumPy with to_numpy() first")
    m = idx.shape[0] if isinstance(idx, Leaf) else len(idx)
    want = (m,) + tuple(out.view.shape[1:])
    if tuple(src.shape) != want:
        raise ShapeError(f"b[idx] = a: a has shape {tuple(src.shape)}, expected {want} (one row of b's shape "
                         f"{out.view.shape[1:]} per index; the value is not broadcast except from a scalar)")
    desc = f"{node_desc(out)}[" + (node_desc(idx) if isinstance(idx, Leaf) else f"<NumPy index array of {m}>") + \
        f"] = {node_desc(src)}"
    if isinstance(idx, Leaf):
        context.record(IndexedCopy("scatter", out, src, idx, None, 0, desc))
    else:
        context.record(IndexedCopy("scatter", out, src, None, idx, digest(idx), desc))


# --------------------------------------------------------------------------- plans
class _Plan:
    """Common part: patterns of the source and target views, item dtype, per-rank counters."""

    kind = "indexed"

    def __init__(self, task: IndexedCopy):
        src, out = task.src, task.out
        self.spat = row_pattern(src.view, src.base.shape[1:])
        self.tpat = row_pattern(out.view, out.base.shape[1:])
        self.elems = self.spat.count
        self.bad: Optional[Tuple[int, int]] = None   # (position, value) of the first bad index here

    def free(self) -> None:
        """Nothing to free (aggregators are kept by the context)."""


class StaticPlan(_Plan):
    """A NumPy (replicated) index: every rank computes, once, which of its source rows go to which rank
    and local row. Duplicates of a scatter are resolved here (last occurrence wins)."""

    def __init__(self, task: IndexedCopy, rank: int):
        super().__init__(task)
        src, out, idx = task.src, task.out, task.idx_array
        ss, st, ns = src.view.row_params
        ts, tt, nt = out.view.row_params
        n_axis = nt if task.mode == "scatter" else ns
        m = len(idx)
        bad = np.flatnonzero((idx < -n_axis) | (idx >= n_axis))
        self.items = np.empty(0, dtype=write_dtype(src.dtype, max(self.elems, 1), False))
        self.rows = np.empty(0, dtype=np.int64)
        self.dests = np.empty(0, dtype=np.int64)
        if len(bad):
            self.bad = (int(bad[0]), int(idx[bad[0]]))
            return
        v = np.where(idx < 0, idx + n_axis, idx)
        if task.mode == "scatter":
            if m and len(np.unique(v)) < m:
                _, first_rev = np.unique(v[::-1], return_index=True)
                ks = np.sort(m - 1 - first_rev).astype(np.int64)
            else:
                ks = np.arange(m, dtype=np.int64)
            src_rows = ss + ks * st
            out_rows = ts + v[ks] * tt
        else:
            ks = np.arange(m, dtype=np.int64)
            src_rows = ss + v * st
            out_rows = ts + ks * tt
        dest = out.base.dist.owner(out_rows)
        if src.base.replicated:
            mine = dest == rank
            loc = src_rows[mine]
        else:
            mine = src.base.dist.owner(src_rows) == rank
            loc = src.base.dist.local_index(src_rows[mine])
        dests = dest[mine]
        pos = out.base.dist.local_index(out_rows[mine])
        order = np.argsort(dests, kind="stable")
        self.rows = np.ascontiguousarray(loc[order], dtype=np.int64)
        self.dests = np.ascontiguousarray(dests[order], dtype=np.int64)
        self.items = np.zeros(len(order), dtype=write_dtype(src.dtype, max(self.elems, 1), False))
        self.items["pos"] = pos[order]


class DistScatterPlan(_Plan):
    """A distributed index aligned with the source (both compact, same distribution): per call the index
    values give each local source row's destination and local row there; items carry the row's position
    ``k`` for the duplicate rule."""

    def __init__(self, task: IndexedCopy, rank: int):
        super().__init__(task)
        src, out = task.src, task.out
        nloc = src.base.local_shape()[0]
        self.rows = np.arange(nloc, dtype=np.int64)
        self.ks = src.base.dist.global_rows(rank)
        self.items = np.zeros(nloc, dtype=write_dtype(src.dtype, max(self.elems, 1), True))
        self.items["k"] = self.ks
        self.dests = np.zeros(nloc, dtype=np.int64)
        self.stamp = np.full(max(1, out.base.local_shape()[0]), -1, dtype=np.int64)
        self.epoch = 0

    def next_epoch(self) -> int:
        """The stamp base of a new call (``epoch << 40``; positions are below 2**40); stamps restart at -1
        when the epochs run out."""
        self.epoch += 1
        if self.epoch >= 1 << 22:
            self.stamp.fill(-1)
            self.epoch = 1
        return self.epoch << 40


class DistGatherPlan(_Plan):
    """A distributed index aligned with the result: per call the index values give each result row's source
    owner and local row there (requests ``(pos, row)``)."""

    def __init__(self, task: IndexedCopy, rank: int):
        super().__init__(task)
        nloc = task.out.base.local_shape()[0]
        self.requests = np.zeros(nloc, dtype=REQUEST_DTYPE)
        self.requests["pos"] = np.arange(nloc, dtype=np.int64)
        self.dests = np.zeros(nloc, dtype=np.int64)
        self.ks = task.idx.base.dist.global_rows(rank)


# --------------------------------------------------------------------------- execution
def _agree(context, bad: Optional[Tuple[int, int]], what: str, size: int, op: str) -> None:
    """Collective: every rank learns whether any rank found a bad index; all raise the same error if so
    (the lowest such rank's ``bad = (position, value)``)."""
    t0 = _now()
    ok = spmd.all_ok(context.dcomm, bad is None, timeout=context.timeout, rank=context.rank,
                     op=op + ": agreeing on the index check", error=DistArrayTimeout)
    tr = tracing.get_tracer()
    if tr.enabled:
        tr.record(K_CHECK, tracing.DIR_NONE, -1, 0, 8, t0, _now(), wait=-1, seq=context.flush_no,
                  chan=context.chan, count=context.size)
    if ok:
        return
    bads = spmd.gather(context.dcomm, bad, timeout=context.timeout, rank=context.rank,
                       op=op + ": naming the bad index", error=DistArrayTimeout)
    r = next(i for i, b in enumerate(bads) if b is not None)
    raise IndexOutOfBounds(context.rank, what, int(bads[r][1]), int(bads[r][0]), r, size)


def _aggregator(context, role: str, item_dtype: np.dtype, handler, state, reply=None) -> Aggregator:
    """The context's aggregator for ``role`` and ``item_dtype`` (created collectively on first use, at the same
    point of the same flush on every rank), pointed at ``state``."""
    key = (role, item_dtype.descr.__repr__())
    agg = context.aggregators.get(key)
    if agg is None:
        items = max(64, BUFFER_BYTES // item_dtype.itemsize)
        agg = Aggregator(item_dtype, handler, state=state, buffer_items=items, comm=context.comm, reply=reply,
                         timeout=context.timeout if context.timeout is not None else 0,
                         name=f"distarray {role} aggregator")
        context.aggregators[key] = agg
    else:
        agg.set_state(state)
    return agg


def _flat(base: Base) -> np.ndarray:
    if base.flat is None:
        base.ensure()
    return base.flat


def _locate_agreed(context, plan, arr, idx_flat: np.ndarray, locs: np.ndarray, what: str, op: str) -> None:
    """Resolve this rank's part of a distributed index against the rows of ``arr`` (the array it indexes):
    owners into ``plan.dests``, local rows into ``locs``; then the ranks agree on the first bad value
    (``_agree``: IndexOutOfBounds on every rank if any rank found one). Collective."""
    start, step, n = arr.view.row_params
    bad_at = _locate(idx_flat, n, start, step, *_dist_args(arr.base.dist), plan.dests, locs) \
        if len(idx_flat) else -1
    _agree(context, None if bad_at < 0 else (int(plan.ks[bad_at]), int(idx_flat[bad_at])), what, n, op)


def _push_rows(context, plan, src, role: str, handler, state) -> None:
    """Push step of a plan whose sources know the destinations (a NumPy index, or ``b[ix] = a``): fill
    ``plan.items`` with this rank's source rows (``plan.rows``, pattern ``plan.spat``) and send them to
    ``plan.dests`` through the ``role`` aggregator, whose numba ``handler`` writes them into ``state`` on the
    destination. Collective (the flush returns when every item is written)."""
    if len(plan.rows):
        _fill_rows(plan.items, _flat(src.base), *_pattern_args(plan.spat), plan.rows)
    agg = _aggregator(context, role, plan.items.dtype, handler, state)
    agg.push_many(plan.dests, plan.items)
    agg.flush()


def execute(context, task: IndexedCopy, op: str) -> None:
    """Run ``task`` now (see the module doc). Collective over the context's communicator; called by the
    scheduler at a force point, after the ranks agreed on the recorded operations."""
    try:
        _execute(context, task, op)
    except AggregationTimeout as exc:
        raise DistArrayTimeout(context.rank, exc.peer, f"{op}: {task.desc}", exc.waited, str(exc)) from None
    context.stats["indexed"] += 1


def _execute(context, task: IndexedCopy, op: str) -> None:
    src, out = task.src, task.out
    rank = context.rank
    what = task.desc
    layout = (task.mode, src.base.dist.key, src.view.key, src.dtype.str, out.base.dist.key, out.view.key,
              out.dtype.str)
    if task.idx is None:
        plan: Any = context.plan(("ix",) + layout + (task.idx_digest, len(task.idx_array)),
                                lambda: StaticPlan(task, rank))
        size = (out.view.shape[0] if task.mode == "scatter" else src.view.shape[0])
        _agree(context, plan.bad, what, size, op)
        if plan.elems == 0:
            return
        _push_rows(context, plan, src, "write", write_rows, (_flat(out.base),) + _pattern_args(plan.tpat))
        return
    idx_flat = _flat(task.idx.base)
    if task.mode == "scatter":
        plan = context.plan(("ixd",) + layout + (task.idx.base.dist.key, task.idx.dtype.str),
                           lambda: DistScatterPlan(task, rank))
        _locate_agreed(context, plan, out, idx_flat, plan.items["pos"], what, op)
        if plan.elems == 0:
            return
        state = (_flat(out.base),) + _pattern_args(plan.tpat) + (plan.stamp, plan.next_epoch())
        _push_rows(context, plan, src, "write-last", write_rows_last, state)
        return
    plan = context.plan(("ixd",) + layout + (task.idx.base.dist.key, task.idx.dtype.str),
                       lambda: DistGatherPlan(task, rank))
    _locate_agreed(context, plan, src, idx_flat, plan.requests["row"], what, op)
    if plan.elems == 0:
        return
    wdt = write_dtype(src.dtype, plan.elems, False)
    writer = _aggregator(context, "gather-reply", wdt, write_rows, (_flat(out.base),) + _pattern_args(plan.tpat))
    serve_state = (_flat(src.base),) + _pattern_args(plan.spat)
    req = context.aggregators.get(("gather-request", wdt.descr.__repr__()))
    if req is None:
        req = Aggregator(REQUEST_DTYPE, serve_rows, state=serve_state, comm=context.comm, reply=writer,
                         buffer_items=max(64, BUFFER_BYTES // REQUEST_DTYPE.itemsize),
                         timeout=context.timeout if context.timeout is not None else 0,
                         name="distarray gather-request aggregator")
        context.aggregators[("gather-request", wdt.descr.__repr__())] = req
    else:
        req.set_state(serve_state)
    req.push_many(plan.dests, plan.requests)
    req.flush()
