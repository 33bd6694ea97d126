"""Aggregation of fine-grained items into per-destination buffers (the Chapel
Aggregation Library model, seed 003), with numba handlers and termination detection.

What users write (every rank, SPMD)::

    agg = Aggregator(item_dtype, handler, state=table, buffer_items=8192)  # collective
    for dest, item in work:
        agg.push(dest, item)            # plain Python: correct, slower
    agg.push_many(dests, items)         # vectorised: bucketed by destination in a numba kernel
    agg.flush()                         # collective: every item pushed anywhere has been handled

Semantics:

* An *item* is one row of a numpy structured dtype chosen by the user
  (``item_dtype``). Items are copied into one buffer per destination rank;
  a buffer that fills is sent at once (``MPI_Issend`` of its raw bytes on a
  communicator dup'ed for this aggregator; no pickling). Items for this rank
  go through the same buffers but are handed over locally, without MPI.
* The *handler* runs on the DESTINATION rank over a whole received buffer:
  ``handler(items, state)`` where ``items`` is a structured array view of the
  received rows and ``state`` the object given at construction (numpy
  arrays, tuples of arrays and scalars, numba typed containers: anything
  numba can type). Coalescing happens there (e.g. ``table[i] += 1`` for each
  row). The handler must be compiled with ``numba.njit``; it is compiled at
  construction by one call on zero items, so typing errors surface there.
  The view is only valid during the call (the buffer is recycled after).
* *Handler-generated traffic* (request/reply, index-gather): with
  ``reply=other_aggregator`` the handler signature is
  ``handler(items, state, src, out_dests, out_items) -> int``: ``src`` is the
  rank the buffer came from, ``out_dests`` (int64) and ``out_items``
  (``reply.item_dtype``) have room for ``replies_per_item * len(items)``
  rows; the handler writes ``n`` rows and returns ``n``; the aggregator then
  pushes them into ``reply``. A numba handler cannot call Python, hence this
  design. ``reply`` links are acyclic by construction (the reply aggregator
  must exist first, so a handler cannot push into its own aggregator): with
  a cycle, bounded buffers could deadlock (each rank's handler output
  waiting for buffers held by the other's unhandled input).
* Progress: whenever a rank is inside ``push``/``push_many``/``flush`` of any
  aggregator it tests its sends and receives and runs handlers for EVERY
  live aggregator of this process, so a rank that pushes keeps receiving and
  nothing deadlocks when all ranks send to all. Handling never blocks: the
  output of a reply handler is staged and moved into the reply aggregator as
  its buffers allow; until the staging area is empty no further buffer of
  that aggregator is handled (its receive stays posted-and-full, which is
  the back-pressure).
* Bounded memory: ``pool_buffers`` send buffers (at least ``size + 1``,
  one current buffer per destination plus in-flight ones), ``recv_buffers``
  pre-posted receive buffers and one staging area, all allocated at
  construction and never grown. Sends are *synchronous* (``Issend``): a send
  completes only when the destination matched it, so each sender has at most
  ``pool_buffers`` messages unmatched anywhere in MPI. When no send buffer is
  free, ``push`` progresses (completes sends, receives and handles) until one
  frees.
* ``flush()`` is collective over the aggregator's communicator and covers
  this aggregator and every aggregator reachable through ``reply`` links:
  when it returns on any rank, every item pushed (before the flush, on any
  rank, or by handlers during it) into any of them has been handled on its
  destination. Termination detection is described in :meth:`Aggregator.flush`.
* Tracing: every buffer sent is one ``agg_buffer`` send event and every
  buffer received one ``agg_buffer`` receive event (``count`` = items), matched
  by a per-peer sequence number carried in the MPI tag, so the timeline shows
  one arrow per buffer. Each ``flush`` is one collective ``agg_flush`` event.
* Errors: pushing to a rank outside the communicator, an item or array of the
  wrong dtype, a handler not compiled with numba, use after ``close()``:
  :class:`~nbmpi.workers.errors.AggregationError` naming the rank and the
  operation. Waits time out after ``timeout`` seconds (default
  ``NBMPI_TIMEOUT``, else never) with
  :class:`~nbmpi.workers.errors.AggregationTimeout`; waits are interruptible
  (Ctrl-C / Jupyter interrupt), after which the aggregator is unusable.

Aggregators are not thread-safe: use each from the thread that created it
(MPI runs ``funneled``).
"""
from __future__ import annotations

import atexit
import os
import time
import zlib
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numba
import numpy as np

from . import tracing as _tracing
from . import waiting
from .errors import AggregationError, AggregationTimeout
from .kernels import is_jitted
from .runtime import MPI, default_timeout, world

__all__ = ["Aggregator"]

K_BUFFER = _tracing.register_kind("agg_buffer")
K_FLUSH = _tracing.register_kind("agg_flush")
_SEND, _RECV, _NONE = _tracing.DIR_SEND, _tracing.DIR_RECV, _tracing.DIR_NONE
_now = time.perf_counter_ns
_UNSET: Any = object()
_POLLS_BETWEEN_CLOCK_CHECKS = 64
REASON_FULL, REASON_FLUSH = 0, 1
_INFLIGHT_BUDGET_BYTES = 8 << 20   # memory the default buffer counts may use beyond the minimum

# Aggregators that are open in this process; every wait progresses all of them.
_live: List["Aggregator"] = []
_yield = getattr(os, "sched_yield", lambda: None)
_progressing = False


@numba.njit(cache=True, nogil=True)
def _bucket(dests, words, start, stop, pool, pos, lim, free, meta, ready):  # pragma: no cover - compiled
    """Copy rows ``start..stop`` of ``words`` into the per-destination buffers.

    ``pool`` holds all buffers row after row (buffer ``b`` = rows
    ``b*cap .. b*cap+cap-1``). ``pos[d]`` is the next row of destination
    ``d``'s current buffer (-1: none), ``lim[d]`` the end of that buffer;
    ``free[:meta[0]]`` are the free buffers; a buffer that fills is appended
    to ``ready[meta[1]] = (dest, buffer, rows)``. Stops at ``stop``, when a
    destination needs a buffer and none is free, or when ``ready`` is full.
    Returns the index of the first row not placed.
    """
    cap = pool.shape[0] // free.shape[0]
    w = pool.shape[1]
    nready = meta[1]
    maxready = ready.shape[0]
    i = start
    while i < stop:
        d = dests[i]
        p = pos[d]
        if p < 0:
            nf = meta[0]
            if nf == 0:
                break
            nf -= 1
            meta[0] = nf
            p = free[nf] * cap
            lim[d] = p + cap
        if w == 1:  # one machine word per item (e.g. one int64 field): no inner loop
            pool[p, 0] = words[i, 0]
        else:
            for j in range(w):
                pool[p, j] = words[i, j]
        p += 1
        i += 1
        if p == lim[d]:
            ready[nready, 0] = d
            ready[nready, 1] = p // cap - 1
            ready[nready, 2] = cap
            nready += 1
            pos[d] = -1
            if nready == maxready:
                break
        else:
            pos[d] = p
    meta[1] = nready
    return i


@numba.njit(cache=True, nogil=True)
def _first_bad_dest(dests, size):  # pragma: no cover - compiled
    """Index of the first destination outside ``0..size-1``, or -1 (one vectorised pass)."""
    bad = False
    n = dests.shape[0]
    for i in range(n):
        bad |= np.uint64(dests[i]) >= np.uint64(size)
    if not bad:
        return -1
    for i in range(n):
        if dests[i] < 0 or dests[i] >= size:
            return i
    return -1


def _word_dtype(itemsize: int) -> np.dtype:
    for w in (8, 4, 2):
        if itemsize % w == 0:
            return np.dtype(f"u{w}")
    return np.dtype(np.uint8)


def _progress_all() -> None:
    """One non-blocking progress step of every live aggregator of this process."""
    global _progressing
    if _progressing:
        return
    _progressing = True
    try:
        for agg in _live:
            if agg._broken is None:
                agg._progress()
    finally:
        _progressing = False


def _discard_all() -> None:
    for agg in list(_live):
        agg._discard()


atexit.register(_discard_all)


class Aggregator:
    """Per-destination buffers of ``item_dtype`` rows, sent when full, handled by
    ``handler`` on the destination rank. Collective constructor.

    Every rank of ``comm`` (default ``COMM_WORLD``) must create it, in the
    same order as its other aggregators, with the same ``item_dtype``,
    ``buffer_items`` and buffer counts (checked: a mismatch raises
    :class:`AggregationError` on every rank naming the rank that differs).

    Parameters: ``handler`` compiled with ``numba.njit`` (see the module
    docstring for its signature); ``state`` passed to every handler call;
    ``buffer_items`` rows per buffer; ``pool_buffers`` send buffers (default
    ``2 * size + 2``, at least ``size + 1``); ``recv_buffers`` pre-posted
    receives (default ``max(4, 2 * (size - 1))``); ``reply`` an aggregator the
    handler's output rows are pushed into (then ``replies_per_item`` bounds
    the rows one item may produce); ``timeout`` seconds for every wait
    (default ``NBMPI_TIMEOUT``, else forever); ``name`` labels errors.
    """

    def __init__(self, item_dtype: Any, handler: Callable, state: Any = None, buffer_items: int = 8192,
                 comm: Any = None, pool_buffers: Optional[int] = None, recv_buffers: Optional[int] = None,
                 reply: Optional["Aggregator"] = None, replies_per_item: int = 1,
                 timeout: Optional[float] = None, name: Optional[str] = None):
        m = MPI()
        parent = world() if comm is None else comm
        self.rank = prank = parent.Get_rank()
        self.size = size = parent.Get_size()
        self.name = name or "Aggregator"
        self._closed = False
        self._broken: Optional[str] = "not constructed"
        # -- local validation (before anything collective, so every rank fails alike) --
        try:
            dt = np.dtype(item_dtype)
        except TypeError as exc:
            raise AggregationError(f"rank {prank}: {self.name}: item_dtype {item_dtype!r} is not a numpy "
                                   f"dtype ({exc}); pass e.g. np.dtype([('index', np.int64)])") from None
        if dt.fields is None or dt.hasobject or dt.itemsize == 0:
            raise AggregationError(
                f"rank {prank}: {self.name}: item_dtype must be a numpy structured dtype of plain fields, "
                f"got {dt}; pass e.g. np.dtype([('index', np.int64), ('value', np.float64)])")
        if not is_jitted(handler):
            what = "a plain Python function" if callable(handler) else type(handler).__name__
            raise AggregationError(
                f"rank {prank}: {self.name}: the handler is {what}, not compiled; decorate it with "
                "@numba.njit so it can run over whole buffers at compiled speed")
        buffer_items = int(buffer_items)
        if buffer_items < 1:
            raise AggregationError(f"rank {prank}: {self.name}: buffer_items={buffer_items}; expected >= 1")
        # default counts: enough buffers in flight that a rank rarely waits for a peer to handle
        # (up to 4 per peer), within an in-flight memory budget, never below the old minimum
        extra = _INFLIGHT_BUDGET_BYTES // max(1, buffer_items * dt.itemsize)
        npool = (size + 1 + int(min(max(extra, size + 1), 4 * size + 4))) if pool_buffers is None \
            else int(pool_buffers)
        if npool < size + 1:
            raise AggregationError(
                f"rank {prank}: {self.name}: pool_buffers={npool} is too small for {size} ranks; expected at "
                f"least size + 1 = {size + 1} (one buffer per destination plus one in flight)")
        lo_r, hi_r = max(4, 2 * (size - 1)), max(8, 4 * (size - 1))
        nrecv = (int(min(max(extra, lo_r), hi_r)) if size > 1 else 0) if recv_buffers is None else int(recv_buffers)
        if size > 1 and nrecv < 1:
            raise AggregationError(f"rank {prank}: {self.name}: recv_buffers={nrecv}; expected >= 1")
        if size == 1:
            nrecv = 0
        if reply is not None:
            if not isinstance(reply, Aggregator):
                raise AggregationError(f"rank {prank}: {self.name}: reply must be an Aggregator, "
                                       f"got {type(reply).__name__}")
            reply._usable("reply=")
            if reply.size != size:
                raise AggregationError(f"rank {prank}: {self.name}: reply {reply.name} lives on a communicator "
                                       f"of size {reply.size}, this one has {size}; use the same ranks")
        replies_per_item = int(replies_per_item)
        if replies_per_item < 1:
            raise AggregationError(f"rank {prank}: {self.name}: replies_per_item={replies_per_item}; "
                                   "expected >= 1")

        self.item_dtype = dt
        self.itemsize = dt.itemsize
        self.buffer_items = cap = buffer_items
        self.pool_buffers = npool
        self.recv_buffers = nrecv
        self.handler = handler
        self.state = state
        self.reply = reply
        self.replies_per_item = replies_per_item
        self.timeout = default_timeout() if timeout is None else (None if timeout <= 0 else float(timeout))

        # -- buffers: all allocated now, never grown --
        self._word = wd = _word_dtype(dt.itemsize)
        nwords = dt.itemsize // wd.itemsize
        self._nwords = nwords
        self._pool = np.zeros((npool, cap, nwords), dtype=wd)
        self._pool_rec = self._pool.reshape(npool, cap * nwords).view(dt)          # (npool, cap) rows
        self._pool_bytes = self._pool.reshape(npool, -1).view(np.uint8)            # (npool, cap*itemsize)
        self._rpool = np.zeros((max(nrecv, 1), cap, nwords), dtype=wd)
        self._rpool_rec = self._rpool.reshape(max(nrecv, 1), cap * nwords).view(dt)
        self._rpool_bytes = self._rpool.reshape(max(nrecv, 1), -1).view(np.uint8)
        self._rows = self._pool.reshape(npool * cap, nwords)                        # all buffers, row by row
        self._pos = np.full(size, -1, dtype=np.int64)                              # next row per destination
        self._lim = np.zeros(size, dtype=np.int64)                                 # end row of its buffer
        self._free = np.arange(npool, dtype=np.int64)
        self._meta = np.array([npool, 0], dtype=np.int64)                         # n free, n ready
        self._ready = np.zeros((1, 3), dtype=np.int64)
        if reply is not None:
            nout = cap * replies_per_item
            self._out_dests = np.zeros(nout, dtype=np.int64)
            self._out_items = np.zeros(nout, dtype=reply.item_dtype)
            self._out_words = self._out_items.view(np.uint8).reshape(nout, reply.itemsize).view(reply._word)
        self._stage_pos = self._stage_end = 0
        self.buffer_bytes = int(self._pool.nbytes + (self._rpool.nbytes if nrecv else 0)
                                + (self._out_items.nbytes + self._out_dests.nbytes if reply is not None else 0))

        self._compile_handler()

        # -- collective part --
        self._parent = parent
        self._check_same_everywhere(parent)
        self.comm = parent.Dup()
        tracer = _tracing.get_tracer()
        self._wrank = self._translate_to(tracer.comm)
        self.chan_id = tracer.new_channel_id(self.comm)
        tag_ub = self.comm.Get_attr(m.TAG_UB) or 32767
        self._tag_mod = int(min(tag_ub, (1 << 30) - 1)) + 1
        self._byte = m.BYTE
        self._testsome = m.Request.Testsome
        self._rreqs = [self.comm.Recv_init([self._rpool_bytes[i], m.BYTE], m.ANY_SOURCE, m.ANY_TAG)
                       for i in range(nrecv)]
        self._rstats = [m.Status() for _ in range(nrecv)]
        for r in self._rreqs:
            r.Start()
        # sends in flight, as parallel lists (one Testsome over _sreqs completes them in a batch)
        self._sreqs: List[Any] = []
        self._sbufs: List[int] = []
        self._sdests: List[int] = []
        self._pending: Deque[Tuple[int, int, int, int]] = deque()  # (recv index, src, rows, tag)
        self._local: Deque[Tuple[int, int]] = deque()          # (pool buffer, rows) for this rank
        self._send_seq = [0] * size
        self._flush_seq = 0
        self._st = dict(items_pushed=0, items_handled=0, buffers_full=0, buffers_flush=0, messages_sent=0,
                        local_buffers=0, messages_received=0, messages_handled=0, bytes_sent=0, bytes_received=0,
                        rows_dispatched=0,
                        max_inflight=0, max_buffers_in_use=0, flushes=0, waves=0)
        self._broken = None
        _live.append(self)

    # ------------------------------------------------------------------ construction helpers
    def _compile_handler(self) -> None:
        empty = self._pool_rec[0, :0]
        try:
            if self.reply is None:
                self.handler(empty, self.state)
            else:
                n = self.handler(empty, self.state, self.rank, self._out_dests, self._out_items)
                if not isinstance(n, (int, np.integer)):
                    raise TypeError(f"it returned {type(n).__name__}; a reply handler must return the number "
                                    "of rows it wrote (an int)")
        except Exception as exc:  # noqa: BLE001 - numba typing errors, wrong arity, ...
            sig = ("handler(items, state)" if self.reply is None
                   else "handler(items, state, src, out_dests, out_items) -> int")
            first = str(exc).strip().splitlines()[:6]
            raise AggregationError(
                f"rank {self.rank}: {self.name}: the handler cannot run as {sig} with items "
                f"{numba.typeof(empty)} and state {self._typeof(self.state)}: " + " | ".join(first)) from None

    @staticmethod
    def _typeof(value: Any) -> str:
        try:
            return str(numba.typeof(value))
        except Exception:  # noqa: BLE001
            return f"{type(value).__name__} (not a type numba supports)"

    def _translate_to(self, other_comm) -> List[int]:
        m = MPI()
        ranks = m.Group.Translate_ranks(self._parent.Get_group(), list(range(self.size)), other_comm.Get_group())
        return [(-1 if r == m.UNDEFINED else int(r)) for r in ranks]

    def _check_same_everywhere(self, comm) -> None:
        sig = np.array([self.itemsize, self.buffer_items, self.pool_buffers, self.recv_buffers,
                        zlib.crc32(repr(self.item_dtype.descr).encode()),
                        -1 if self.reply is None else self.reply.itemsize], dtype=np.int64)
        allsig = np.empty((self.size, sig.size), dtype=np.int64)
        comm.Allgather(sig, allsig)
        keys = [allsig[i].tobytes() for i in range(self.size)]
        if all(k == keys[0] for k in keys):
            return
        ref = max(keys, key=lambda k: (keys.count(k), -keys.index(k)))
        differ = [i for i in range(self.size) if keys[i] != ref]
        raise AggregationError(
            f"rank {self.rank}: {self.name} created differently on rank(s) {differ} (itemsize, buffer_items, "
            f"pool_buffers, recv_buffers, dtype hash, reply itemsize = {allsig[differ[0]].tolist()} vs "
            f"{np.frombuffer(ref, dtype=np.int64).tolist()}); every rank must use the same item_dtype, "
            "buffer sizes and reply structure")

    # ------------------------------------------------------------------ checks
    def _usable(self, op: str) -> None:
        if self._closed:
            raise AggregationError(f"rank {self.rank}: {op} on {self.name} after close(); create a new "
                                   "Aggregator (collectively) to push more items")
        if self._broken is not None:
            raise AggregationError(f"rank {self.rank}: {op} on {self.name}: the aggregator is unusable because "
                                   f"{self._broken}; create a new one")

    def _bad_dest(self, d: int, op: str) -> AggregationError:
        return AggregationError(f"rank {self.rank}: {op} on {self.name}: destination rank {d} is not a rank of "
                                f"the communicator (size {self.size}); use ranks 0..{self.size - 1}")

    # ------------------------------------------------------------------ pushing
    def push(self, dest: int, item: Any) -> None:
        """Append one item for rank ``dest``. Plain Python (use :meth:`push_many` for speed).

        ``item`` is a structured scalar of ``item_dtype`` (e.g. a row of an
        array of that dtype) or a tuple with one value per field. Returns
        once the item is in a buffer (not yet handled); blocks (progressing)
        only while no send buffer is free.
        """
        if self._closed or self._broken is not None:
            self._usable("push")
        try:
            d = int(dest)
        except (TypeError, ValueError):
            raise AggregationError(f"rank {self.rank}: push on {self.name}: dest {dest!r} is not a rank "
                                   "number") from None
        if not 0 <= d < self.size or d != dest:
            raise self._bad_dest(dest, "push")
        if isinstance(item, np.void):
            if item.dtype != self.item_dtype:
                raise AggregationError(
                    f"rank {self.rank}: push(dest={d}) on {self.name}: item has dtype {item.dtype}, expected "
                    f"{self.item_dtype}; convert it or create the aggregator with that dtype")
        elif not isinstance(item, tuple):
            raise AggregationError(
                f"rank {self.rank}: push(dest={d}) on {self.name}: item is a {type(item).__name__}, expected a "
                f"structured scalar of {self.item_dtype} or a tuple of {len(self.item_dtype.names)} values")
        cap = self.buffer_items
        p = int(self._pos[d])
        if p < 0:
            if self._meta[0] == 0:
                self._wait_until(lambda: self._meta[0] > 0, f"push(dest={d}): waiting for a free send buffer")
            nf = int(self._meta[0]) - 1
            self._meta[0] = nf
            p = int(self._free[nf]) * cap
            self._lim[d] = p + cap
        b, k = divmod(p, cap)
        try:
            self._pool_rec[b, k] = item
        except (ValueError, TypeError) as exc:
            if k == 0:  # give the new buffer back
                self._free[self._meta[0]] = b
                self._meta[0] += 1
            raise AggregationError(f"rank {self.rank}: push(dest={d}) on {self.name}: item {item!r} does not fit "
                                   f"{self.item_dtype}: {exc}") from None
        self._st["items_pushed"] += 1
        p += 1
        if p == self._lim[d]:
            self._pos[d] = -1
            self._dispatch(d, b, cap, REASON_FULL)
            _progress_all()
        else:
            self._pos[d] = p
            self._note_use()

    def push_many(self, dests: Any, items: np.ndarray) -> None:
        """Append ``items[i]`` for rank ``dests[i]`` for every i. Vectorised.

        ``items`` is a 1-D array of ``item_dtype`` (copied into the buffers,
        so it may be reused on return); ``dests`` integers of the same length.
        Bucketing by destination is a numba kernel; each buffer that fills is
        sent at once and this rank progresses (receives, handles) between
        buffers. Blocks (progressing) only while no send buffer is free.
        """
        if self._closed or self._broken is not None:
            self._usable("push_many")
        items = np.asarray(items)
        if items.dtype != self.item_dtype:
            raise AggregationError(
                f"rank {self.rank}: push_many on {self.name}: items have dtype {items.dtype}, expected "
                f"{self.item_dtype}; build them with np.empty(n, dtype=agg.item_dtype)")
        if items.ndim != 1:
            raise AggregationError(f"rank {self.rank}: push_many on {self.name}: items must be 1-D, got shape "
                                   f"{items.shape}")
        d = np.asarray(dests)
        if d.dtype.kind not in "iu":
            raise AggregationError(f"rank {self.rank}: push_many on {self.name}: dests have dtype {d.dtype}, "
                                   "expected integers (destination ranks)")
        if d.shape != items.shape:
            raise AggregationError(f"rank {self.rank}: push_many on {self.name}: {d.size} dests for "
                                   f"{items.size} items; pass one destination per item")
        n = items.shape[0]
        if n == 0:
            return
        d = np.ascontiguousarray(d, dtype=np.int64)
        bad = _first_bad_dest(d, self.size)
        if bad >= 0:
            raise self._bad_dest(int(d[bad]), f"push_many (item {bad})")
        words = np.ascontiguousarray(items).view(np.uint8).reshape(n, self.itemsize).view(self._word)
        i = 0
        while True:
            i = self._place(d, words, i, n)
            if i >= n:
                break
            if self._meta[0] == 0:
                self._wait_until(lambda: self._meta[0] > 0,
                                 f"push_many: waiting for a free send buffer ({n - i} of {n} items left)")
            else:
                _progress_all()

    def _place(self, dests: np.ndarray, words: np.ndarray, start: int, stop: int) -> int:
        """Bucket rows start..stop without waiting; dispatch full buffers. Returns rows placed up to."""
        i = start
        while True:
            j = _bucket(dests, words, i, stop, self._rows, self._pos, self._lim, self._free, self._meta,
                        self._ready)
            self._st["items_pushed"] += j - i
            i = j
            if self._meta[1]:
                r = self._ready
                self._meta[1] = 0
                self._dispatch(int(r[0, 0]), int(r[0, 1]), int(r[0, 2]), REASON_FULL)
                if i < stop:
                    _progress_all()
                    continue
            self._note_use()
            return i

    def _note_use(self) -> None:
        used = self.pool_buffers - int(self._meta[0])
        if used > self._st["max_buffers_in_use"]:
            self._st["max_buffers_in_use"] = used

    # ------------------------------------------------------------------ sending
    def _dispatch(self, d: int, b: int, rows: int, reason: int) -> None:
        """Send buffer ``b`` (``rows`` rows) to ``d``, or queue it locally if ``d`` is this rank."""
        st = self._st
        self._note_use()
        st["buffers_full" if reason == REASON_FULL else "buffers_flush"] += 1
        st["rows_dispatched"] += rows
        if d == self.rank:
            st["local_buffers"] += 1
            self._local.append((b, rows))
            return
        nbytes = rows * self.itemsize
        seq = self._send_seq[d]
        self._send_seq[d] = seq + 1
        tag = seq % self._tag_mod
        t0 = _now()
        req = self.comm.Issend([self._pool_bytes[b, :nbytes], self._byte], d, tag)
        self._sreqs.append(req)
        self._sbufs.append(b)
        self._sdests.append(d)
        st["messages_sent"] += 1
        st["bytes_sent"] += nbytes
        if len(self._sreqs) > st["max_inflight"]:
            st["max_inflight"] = len(self._sreqs)
        tr = _tracing._TRACER
        if tr is not None and tr.enabled:
            tr.record(K_BUFFER, _SEND, self._wrank[d], 0, nbytes, t0, _now(), 0, tag, self.chan_id, rows)

    def _send_partials(self) -> None:
        """Dispatch every partly filled buffer (reason "flush"); never waits."""
        pos, cap = self._pos, self.buffer_items
        for d in np.flatnonzero(pos >= 0):
            b, rows = divmod(int(pos[d]), cap)
            pos[d] = -1
            if rows:
                self._dispatch(int(d), b, rows, REASON_FLUSH)
            else:
                self._free[self._meta[0]] = b
                self._meta[0] += 1

    # ------------------------------------------------------------------ progress (never blocks)
    def _progress(self) -> None:
        if self._sreqs:
            done = self._testsome(self._sreqs)
            if done:
                free, meta = self._free, self._meta
                sbufs = self._sbufs
                for k in done:
                    free[meta[0]] = sbufs[k]
                    meta[0] += 1
                if len(done) == len(sbufs):
                    self._sreqs, self._sbufs, self._sdests = [], [], []
                else:
                    gone = set(done)
                    keep = [k for k in range(len(sbufs)) if k not in gone]
                    self._sreqs = [self._sreqs[k] for k in keep]
                    self._sbufs = [sbufs[k] for k in keep]
                    self._sdests = [self._sdests[k] for k in keep]
        if self._stage_pos < self._stage_end:
            self._drain()
        if self._rreqs:
            done = self._testsome(self._rreqs, self._rstats)
            if done:
                t = _now()
                tr = _tracing._TRACER
                trace = tr is not None and tr.enabled
                for k, i in enumerate(done):
                    s = self._rstats[k]
                    src, tag, nbytes = s.Get_source(), s.Get_tag(), s.Get_count(self._byte)
                    self._pending.append((i, src, nbytes // self.itemsize, tag))
                    self._st["messages_received"] += 1
                    self._st["bytes_received"] += nbytes
                    if trace:
                        tr.record(K_BUFFER, _RECV, self._wrank[src], 0, nbytes, t, t, 0, tag, self.chan_id,
                                  nbytes // self.itemsize)
        while self._stage_pos >= self._stage_end and (self._pending or self._local):
            if self._pending:
                i, src, rows, _tag = self._pending.popleft()
                self._handle(self._rpool_rec[i, :rows], src)
                self._st["messages_handled"] += 1
                self._rreqs[i].Start()
            else:
                b, rows = self._local.popleft()
                self._handle(self._pool_rec[b, :rows], self.rank)
                self._free[self._meta[0]] = b
                self._meta[0] += 1

    def _handle(self, items: np.ndarray, src: int) -> None:
        rows = items.shape[0]
        try:
            if self.reply is None:
                self.handler(items, self.state)
                n = 0
            else:
                n = int(self.handler(items, self.state, src, self._out_dests, self._out_items))
        except BaseException as exc:
            self._broken = f"its handler raised {type(exc).__name__} on a buffer from rank {src}"
            raise
        if self.reply is not None:
            limit = rows * self.replies_per_item
            if not 0 <= n <= limit:
                self._broken = f"its handler returned {n} reply rows for {rows} items"
                raise AggregationError(
                    f"rank {self.rank}: {self.name}: the handler returned {n} reply rows for a buffer of {rows} "
                    f"items from rank {src}; expected 0..{limit} (replies_per_item={self.replies_per_item}); "
                    "raise replies_per_item or return the number of rows written")
            if n:
                bad = _first_bad_dest(self._out_dests[:n], self.size)
                if bad >= 0:
                    self._broken = "its handler produced a reply for a rank outside the communicator"
                    raise AggregationError(
                        f"rank {self.rank}: {self.name}: the handler wrote reply destination "
                        f"{int(self._out_dests[bad])} (row {bad}, handling items from rank {src}); destinations "
                        f"must be ranks 0..{self.size - 1}")
                self._stage_pos, self._stage_end = 0, n
                self._drain()
        self._st["items_handled"] += rows

    def _drain(self) -> None:
        """Move staged reply rows into the reply aggregator as far as its free buffers allow."""
        reply = self.reply
        if reply._closed or reply._broken is not None:
            self._broken = f"its reply aggregator {reply.name} was closed or broke with replies pending"
            reply._usable(f"reply from {self.name}")
        self._stage_pos = reply._place(self._out_dests, self._out_words, self._stage_pos, self._stage_end)

    def _busy(self) -> bool:
        """True while this rank still has work for this aggregator (besides partial buffers)."""
        return bool(self._pending or self._local or self._sreqs or self._stage_pos < self._stage_end)

    # ------------------------------------------------------------------ waiting
    def _wait_until(self, cond: Callable[[], bool], op: str, timeout: Any = _UNSET) -> None:
        """Progress every live aggregator until ``cond()``; timeout/interrupt make this one unusable."""
        timeout = self.timeout if timeout is _UNSET else timeout
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        peer = self._sdests[0] if self._sdests else None
        waiting.current = (op, peer, _now())
        polls = 0
        try:
            while not cond():
                _progress_all()
                _yield()  # give the core away: under oversubscription the peer we wait for may need it
                if self._broken is not None:
                    self._usable(op)
                polls += 1
                if polls >= _POLLS_BETWEEN_CLOCK_CHECKS:
                    polls = 0
                    if deadline is not None and time.monotonic() > deadline:
                        peer = self._sdests[0] if self._sdests else None
                        self._broken = f"{op} timed out"
                        raise AggregationTimeout(self.rank, peer, f"{op} on {self.name}", time.monotonic() - t0,
                                                 self._describe_state())
        except KeyboardInterrupt:
            self._broken = f"{op} was interrupted"
            raise
        finally:
            waiting.current = None

    def _describe_state(self) -> str:
        st = self._st
        return (f"{len(self._sreqs)} send(s) in flight to rank(s) "
                f"{sorted(set(self._sdests))}, {len(self._pending)} received buffer(s) unhandled, "
                f"{st['messages_sent']} buffers sent and {st['messages_handled']} received+handled here")

    # ------------------------------------------------------------------ flush (termination detection)
    def _chain(self) -> List["Aggregator"]:
        chain, a = [], self
        while a is not None:
            chain.append(a)
            a = a.reply
        return chain

    def flush(self, timeout: Optional[float] = _UNSET) -> None:
        """Collective: return when every item pushed into this aggregator or any
        aggregator reachable through ``reply`` (on any rank, before the flush or
        by handlers during it) has been handled on its destination.

        Every rank of the communicator must call it (and ``flush`` of chained
        aggregators in the same order everywhere). Blocks, progressing every
        live aggregator; raises :class:`AggregationTimeout` after ``timeout``
        seconds (default: the aggregator's), after which it is unusable.

        Termination detection: repeated counting with non-blocking
        ``Iallreduce`` waves (the double-counting / "four counter" scheme of
        Mattern, 1987). ``s_i`` = buffers rank i has sent (``Issend``s started,
        all chained aggregators), ``r_i`` = buffers rank i has received AND
        handled; both only grow. A rank joins a wave only when *idle* for the
        whole chain: no partial buffer (they are sent first), no send in
        flight, no received or local buffer unhandled, no staged reply rows.
        It contributes its ``(s_i, r_i)`` of that instant and keeps
        progressing while the wave completes. Termination is declared when two
        consecutive waves give the same global sums ``(S, R)`` with ``S == R``.
        Why this is correct: (1) rank i's wave-k snapshot is taken after its
        wave-(k-1) Iallreduce completed, which needs every rank's wave-(k-1)
        contribution, so all wave-(k-1) snapshots precede all wave-k ones;
        (2) the counters are monotone, so equal sums mean every rank's own
        counters did not change between its two snapshots: it neither sent nor
        handled anything in between; (3) a rank becomes busy only by receiving
        a buffer (users are inside flush, handlers run only on received
        buffers), so each rank stayed idle over its interval, and all intervals
        share the instant T = end of wave k-1; (4) at T the total sent equals
        the total handled (S == R) and all ranks are idle: no buffer is in
        transit or unhandled, no handler can produce more traffic, and the
        state is stable. Handler-generated traffic (including into the reply
        aggregators, whose counters are part of the sums) is covered because
        a rank with staged or partial reply rows is not idle. A single wave
        with S == R is NOT enough (a buffer may be sent after its sender was
        counted and received before its receiver was), hence two. The
        decision is taken on identical global values on every rank, so all
        ranks leave in the same wave; a rank tests the wave before it
        progresses, so it handles nothing pushed after another rank returned.
        """
        self._usable("flush")
        for a in self._chain()[1:]:
            a._usable(f"flush of {self.name} (its reply chain)")
        timeout = self.timeout if timeout is _UNSET else timeout
        chain = self._chain()
        m = MPI()
        t_start = _now()
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        prev: Optional[Tuple[int, int]] = None
        req = None
        local = np.zeros(2, dtype=np.int64)
        glob = np.zeros(2, dtype=np.int64)
        waves = 0
        polls = 0
        waiting.current = ("flush", None, t_start)
        try:
            while True:
                if req is not None:
                    if req.Test():
                        req = None
                        waves += 1
                        g = (int(glob[0]), int(glob[1]))
                        if g[0] == g[1] and g == prev:
                            break
                        prev = g
                        continue
                    _progress_all()
                    _yield()
                else:
                    _progress_all()
                    if not any(a._busy() for a in chain):
                        for a in chain:
                            a._send_partials()
                        if not any(a._busy() for a in chain):
                            local[0] = sum(a._st["messages_sent"] for a in chain)
                            local[1] = sum(a._st["messages_handled"] for a in chain)
                            req = self.comm.Iallreduce(local, glob, op=m.SUM)
                            continue
                for a in chain:
                    if a._broken is not None:
                        a._usable("flush")
                polls += 1
                if polls >= _POLLS_BETWEEN_CLOCK_CHECKS:
                    polls = 0
                    if deadline is not None and time.monotonic() > deadline:
                        self._broken = "flush timed out"
                        raise AggregationTimeout(
                            self.rank, None, f"flush on {self.name}", time.monotonic() - t0,
                            f"{'a counting wave is pending' if req is not None else 'this rank is not idle yet'}; "
                            f"last global (sent, handled) = {prev}; here: {self._describe_state()}")
        except KeyboardInterrupt:
            self._broken = "flush was interrupted"
            raise
        finally:
            waiting.current = None
        for a in chain:
            a._st["flushes"] += 1
            a._st["waves"] += waves
        self._flush_seq += 1
        tr = _tracing._TRACER
        if tr is not None and tr.enabled:
            tr.record(K_FLUSH, _NONE, -1, 0, 0, t_start, _now(), -1, self._flush_seq, self.chan_id, waves)

    # ------------------------------------------------------------------ stats, closing
    def stats(self) -> Dict[str, Any]:
        """This rank's counters (local, no communication).

        ``items_pushed`` / ``items_handled``; buffers dispatched by reason
        (``buffers_full``, ``buffers_flush``; remote ``messages_sent`` plus
        ``local_buffers`` handed over on this rank); ``bytes_sent`` /
        ``bytes_received``; ``mean_fill`` = mean fraction of ``buffer_items``
        filled at dispatch; ``max_inflight`` sends, ``max_buffers_in_use`` of
        ``pool_buffers``, ``buffer_bytes`` (fixed memory of all buffers);
        ``flushes`` and counting ``waves``.
        """
        st = dict(self._st)
        nbuf = st["buffers_full"] + st["buffers_flush"]
        st["mean_fill"] = (st["rows_dispatched"] / (nbuf * self.buffer_items)) if nbuf else 0.0
        st.update(buffer_items=self.buffer_items, pool_buffers=self.pool_buffers, recv_buffers=self.recv_buffers,
                  buffer_bytes=self.buffer_bytes, rank=self.rank)
        return st

    def close(self) -> None:
        """Collective: ``flush()``, then free the requests and the communicator.

        Further use raises :class:`AggregationError`. Idempotent. An aggregator
        that broke (timeout, interrupt) is released locally without flushing.
        """
        if self._closed:
            return
        if self._broken is None:
            self.flush()
        self._discard()

    def _discard(self) -> None:
        """Local release: cancel the posted receives, free what can be freed."""
        if self._closed:
            return
        self._closed = True
        if self in _live:
            _live.remove(self)
        reqs = getattr(self, "_rreqs", [])
        for i, r in enumerate(reqs):
            if not any(p[0] == i for p in self._pending):
                waiting.cancel(r)
            try:
                r.Free()
            except Exception:  # noqa: BLE001 - a request that could not be cancelled
                pass
        self._rreqs = []
        if self._broken is None and not self._sreqs and hasattr(self, "comm"):
            try:
                self.comm.Free()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> "Aggregator":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._discard()

    def __repr__(self) -> str:
        return (f"Aggregator(name={self.name!r}, item_dtype={self.item_dtype}, buffer_items={self.buffer_items}, "
                f"rank={self.rank}, size={self.size}, reply={None if self.reply is None else self.reply.name!r})")
