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
  a buffer that fills is sent at once (a synchronous send of its raw bytes
  on a communicator dup'ed for this aggregator; no pickling). Items for this rank
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
  design.
* *Reply cycles* (request -> reply -> ack back into the first aggregator, or
  a handler pushing into its own aggregator): create the first one with
  ``reply_dtype=`` (its handler gets the reply signature), create the
  others with ``reply=``, then close the cycle with ``first.set_reply(last)``
  on every rank. Bounded buffers alone could deadlock on a cycle (each
  rank's handler output waiting for buffers that sit unmatched at a peer
  whose handler output waits for this rank's buffers), so a handler on a
  cycle never waits: output rows that find no free buffer go to an
  *overflow* (copied, freed as they are placed; stats ``overflow_rows``,
  ``max_overflow_rows``). Aggregators not on a cycle keep strict
  back-pressure and fixed memory.
* Progress: whenever a rank is inside ``push``/``push_many``/``flush`` of any
  aggregator it tests its sends and receives and runs handlers for EVERY
  live aggregator of this process, so a rank that pushes keeps receiving and
  nothing deadlocks when all ranks send to all. Handling never blocks: the
  output of a reply handler is staged and moved into the reply aggregator as
  its buffers allow; until the staging area is empty no further buffer of
  that aggregator is handled (its receive stays posted-and-full, which is
  the back-pressure; on a reply cycle the rest spills to the overflow).
* Bounded memory: ``pool_buffers`` send buffers (at least ``size + 1``,
  one current buffer per destination plus in-flight ones), ``recv_buffers``
  pre-posted receive buffers and one staging area, all allocated at
  construction and never grown (plus the overflow on reply cycles). Sends
  are *synchronous* (``Issend`` / persistent ``Ssend_init``): a send completes only when the destination
  matched it, so each sender has at most ``pool_buffers`` messages
  unmatched anywhere in MPI. When no send buffer is free, ``push``
  progresses (completes sends, receives and handles) until one frees.
* Cost per buffer: the hot path is numba (bucketing, handlers); per buffer
  Python does one ``Start`` of a persistent synchronous send (``Ssend_init``
  once per pool buffer and destination; partly filled buffers use
  ``Issend``), one ``Test`` of the oldest send and of the oldest posted
  receive (all receives match any source and tag, and MPI matches a message
  to the earliest posted receive, so the head is the next to complete), one
  persistent-receive restart and one trace record on each side; handlers
  are called through their compiled entry point (no type dispatch per
  buffer), this rank's own buffers are handled as soon as they fill, and
  counters are updated once per batch. A ``push_many`` bucketing call fills
  as many buffers as are free (all are then dispatched together) and
  progresses at least every 16K rows, so peers' messages keep moving while
  large buffers fill.
* ``flush()`` is collective over the aggregator's communicator and covers
  this aggregator and every aggregator reachable through ``reply`` links:
  when it returns on any rank, every item pushed (before the flush, on any
  rank, or by handlers during it) into any of them has been handled on its
  destination. Termination detection: repeated counting (Mattern's
  four-counter scheme) with non-blocking ``Iallreduce`` waves of
  (buffers sent, buffers received and handled) summed over the linked
  aggregators; a rank contributes only when idle (nothing partial, in
  flight, unhandled or staged), and the flush ends when two consecutive
  waves give equal sums with sent == handled. Correct because the counters
  only grow, so equal sums mean no rank sent or handled anything between
  its two snapshots, all those intervals share the instant the first wave
  ended, and at that instant everything sent had been handled with every
  rank idle, so no message can be in transit and no handler can create
  more; one wave is not enough (a buffer may be sent after its sender was
  counted and handled before its receiver was). Full argument in
  :meth:`Aggregator.flush`.
* Tracing: every buffer sent is one ``agg_buffer`` send event and every
  buffer received one ``agg_buffer`` receive event (``count`` = items), matched
  by a per-peer sequence number (``seq``; all messages use MPI tag 0 and, by
  MPI's non-overtaking rule, arrive from each peer in the order sent, so the
  receiver numbers them by counting), so the timeline shows one arrow per
  buffer. Each ``flush`` is one collective ``agg_flush`` event.
* Errors: pushing to a rank outside the communicator, an item or array of the
  wrong dtype, a handler not compiled with numba, use after ``close()``:
  :class:`~nbmpi.workers.core.errors.AggregationError` naming the rank and the
  operation. Waits time out after ``timeout`` seconds (default
  ``NBMPI_TIMEOUT``, else never) with
  :class:`~nbmpi.workers.core.errors.AggregationTimeout`; after a timeout the
  aggregator stays USABLE and nothing is lost: a ``push`` that timed out
  did not push its item, a ``push_many`` pushed ``exc.items_placed`` items,
  and a ``flush`` that timed out is resumed by the next ``flush()`` (its
  counting wave stays posted, so the ranks stay in step). Waits are
  interruptible (Ctrl-C / Jupyter interrupt); an interrupt may land in the
  middle of a state update, so after it the aggregator is unusable and
  every further call raises an error saying so (create a new one). A
  handler that raises breaks it the same way.

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

from ..tracing import tracer as _tracing
from ..core import waiting
from ..core.errors import AggregationError, AggregationTimeout
from ..core.kernels import is_jitted
from ..core.runtime import MPI, default_timeout, world

__all__ = ["Aggregator"]

K_BUFFER = _tracing.register_kind("agg_buffer")
K_FLUSH = _tracing.register_kind("agg_flush")
_SEND, _RECV, _NONE = _tracing.DIR_SEND, _tracing.DIR_RECV, _tracing.DIR_NONE
_get_tracer = _tracing.get_tracer
_now = time.perf_counter_ns
_UNSET: Any = object()
_POLLS_BETWEEN_CLOCK_CHECKS = 64
REASON_FULL, REASON_FLUSH = 0, 1
_INFLIGHT_BUDGET_BYTES = 8 << 20   # memory the default buffer counts may use beyond the minimum
_PROGRESS_ROWS = 1 << 14            # push_many progresses at least every this many rows (see _place)
_DEPTH_ROWS = 1 << 16               # default in-flight buffers per peer: as many as hold this many rows
_MAX_DEPTH = 64                     # default in-flight buffers per peer, at most (see Aggregator.__init__)
_TESTSOME_EVERY = 8                 # a wait tests all sends (not only the oldest) every this many polls
_SPIN_POLLS = 64                    # waits poll this often before they start yielding the core each poll
_MAX_PERSISTENT = 1 << 16           # at most this many persistent send requests (pool buffers x ranks)

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

    Hot loop: rows go in blocks short enough that no current buffer can fill
    within one (so a row costs a load, a store and no limit check), two rows per
    step (the second row's slot is found without waiting for the first row's
    ``pos`` store: the per-row store-to-load chain through ``pos`` was the cost,
    4.4 ns per row against 2.4-2.9 now, measured on 4M rows of 8 bytes to 2
    destinations). A row that needs a new buffer or fills one takes the full path.
    """
    cap = pool.shape[0] // free.shape[0]
    w = pool.shape[1]
    nready = meta[1]
    maxready = ready.shape[0]
    size = pos.shape[0]
    i = start
    while i < stop:
        # the block: rows that fit in the current buffers whatever their destinations
        m = stop - i
        for d in range(size):
            p = pos[d]
            if p >= 0 and lim[d] - p - 1 < m:
                m = lim[d] - p - 1
        end = i + m
        if w == 1:  # one machine word per item (e.g. one int64 field): no inner loop
            while i + 1 < end:
                d0 = dests[i]
                d1 = dests[i + 1]
                p0 = pos[d0]
                p1 = pos[d1]
                if p0 < 0 or p1 < 0:
                    break
                if d0 == d1:
                    p1 = p0 + 1
                pool[p0, 0] = words[i, 0]
                pool[p1, 0] = words[i + 1, 0]
                pos[d0] = p0 + 1
                pos[d1] = p1 + 1
                i += 2
        while i < end:
            d = dests[i]
            p = pos[d]
            if p < 0:
                break
            for j in range(w):
                pool[p, j] = words[i, j]
            pos[d] = p + 1
            i += 1
        if i >= stop:
            break
        # one row by the full rule: its destination needs a buffer, or its buffer fills
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


def _entry_point(dispatcher: Any, args: Sequence[Any]) -> Callable:
    """The compiled entry of ``dispatcher`` for exactly the numba types of ``args`` (no per-call type
    dispatch: ~0.5 us less per call), or ``dispatcher`` itself if that signature is not compiled yet.

    Only for calls whose argument types cannot change (buffers made by the aggregator, a fixed state).
    """
    try:
        return dispatcher.overloads[tuple(numba.typeof(a) for a in args)].entry_point
    except Exception:  # noqa: BLE001 - not compiled for these types, or a type numba cannot name
        return dispatcher


def _fixed_type(state: Any) -> bool:
    """True if ``state``'s numba type stays the same while the object does (no containers that can
    change their element types)."""
    if state is None or isinstance(state, (np.ndarray, int, float, complex, np.generic)):
        return True
    return type(state) is tuple and all(isinstance(x, (np.ndarray, int, float, complex, np.generic))
                                        for x in state)


def _word_dtype(itemsize: int) -> np.dtype:
    for w in (8, 4, 2):
        if itemsize % w == 0:
            return np.dtype(f"u{w}")
    return np.dtype(np.uint8)


def _progress_all(full: bool = False) -> None:
    """One non-blocking progress step of every live aggregator of this process."""
    global _progressing
    if _progressing:
        return
    _progressing = True
    try:
        for agg in _live:
            if agg._broken is None:
                agg._progress(full)
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
    ``buffer_items`` rows per buffer; ``pool_buffers`` send buffers (at least
    ``size + 1``; default ``size + 1`` plus ``size + 1 .. 4 * size + 4``
    in-flight buffers, or for small buffers up to ``d * size`` with ``d =
    min(64, ceil(65536 / buffer_items))`` per peer, as many as fit in 8 MiB);
    ``recv_buffers`` pre-posted receives (default ``max(4, 2 * (size - 1)) ..
    max(8, 4 * (size - 1))``, or up to ``d * (size - 1)``, within the same
    budget); ``reply`` an aggregator the handler's output
    rows are pushed into (then ``replies_per_item`` bounds the rows one item
    may produce); ``reply_dtype`` the item dtype of a reply aggregator linked
    later with :meth:`set_reply` (for cycles); ``timeout`` seconds for every
    wait (default ``NBMPI_TIMEOUT``, else forever); ``name`` labels errors.
    """

    def __init__(self, item_dtype: Any, handler: Callable, state: Any = None, buffer_items: int = 8192,
                 comm: Any = None, pool_buffers: Optional[int] = None, recv_buffers: Optional[int] = None,
                 reply: Optional["Aggregator"] = None, replies_per_item: int = 1,
                 timeout: Optional[float] = None, name: Optional[str] = None, reply_dtype: Any = None):
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
        # default counts: enough buffers in flight that a rank rarely waits for a peer to progress,
        # within an in-flight memory budget: at least 4 per peer, and for small buffers as many as
        # hold _DEPTH_ROWS rows (what filled between two progress steps of push_many when those came
        # every 64K rows), at most 64 per peer.
        # Measured (benchmarks/aggregation.py, 1024-item buffers, 2 ranks): 15 send / 8 receive
        # buffers ran dry 138 times per 4M-item push_many, 131 / 64 six times.
        extra = _INFLIGHT_BUDGET_BYTES // max(1, buffer_items * dt.itemsize)
        per_peer = min(_MAX_DEPTH, max(4, -(-_DEPTH_ROWS // buffer_items)))
        npool = (size + 1 + int(max(min(max(extra, size + 1), 4 * size + 4), min(extra, per_peer * size))))\
            if pool_buffers is None else int(pool_buffers)
        if npool < size + 1:
            raise AggregationError(
                f"rank {prank}: {self.name}: pool_buffers={npool} is too small for {size} ranks; expected at "
                f"least size + 1 = {size + 1} (one buffer per destination plus one in flight)")
        lo_r, hi_r = max(4, 2 * (size - 1)), max(8, 4 * (size - 1))
        nrecv = int(max(min(max(extra, lo_r), hi_r), min(extra, per_peer * (size - 1))))
        nrecv = (nrecv if size > 1 else 0) if recv_buffers is None else int(recv_buffers)
        if size > 1 and nrecv < 1:
            raise AggregationError(f"rank {prank}: {self.name}: recv_buffers={nrecv}; expected >= 1")
        if size == 1:
            nrecv = 0
        if reply_dtype is not None:
            try:
                reply_dtype = np.dtype(reply_dtype)
            except TypeError as exc:
                raise AggregationError(f"rank {prank}: {self.name}: reply_dtype {reply_dtype!r} is not a numpy "
                                       f"dtype ({exc}); pass the item_dtype of the reply aggregator") from None
        if reply is not None:
            self._check_reply(reply, size, prank, "reply=")
            if reply_dtype is not None and reply_dtype != reply.item_dtype:
                raise AggregationError(f"rank {prank}: {self.name}: reply_dtype {reply_dtype} differs from the "
                                       f"item_dtype {reply.item_dtype} of reply {reply.name}; pass one of them")
            reply_dtype = reply.item_dtype
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
        self.reply_dtype: Optional[np.dtype] = reply_dtype
        self._has_reply = reply_dtype is not None       # handler has the reply signature
        self._cyclic = False                            # on a cycle of reply links (see set_reply)
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
        self._ready = np.zeros((npool, 3), dtype=np.int64)                        # filled: (dest, buffer, rows)
        self._bucket_entry: Dict[tuple, Callable] = {}                            # see _place
        if reply_dtype is not None:
            nout = cap * replies_per_item
            self._out_dests = np.zeros(nout, dtype=np.int64)
            self._out_items = np.zeros(nout, dtype=reply_dtype)
            self._out_words = (self._out_items.view(np.uint8).reshape(nout, reply_dtype.itemsize)
                               .view(_word_dtype(reply_dtype.itemsize)))
        self._stage_pos = self._stage_end = 0
        # overflow of reply rows (aggregators on a reply cycle only): (dests, words) arrays not yet placed
        self._overflow: Deque[Tuple[np.ndarray, np.ndarray]] = deque()
        self._overflow_pos = 0
        self._overflow_rows = 0
        self.buffer_bytes = int(self._pool.nbytes + (self._rpool.nbytes if nrecv else 0)
                                + (self._out_items.nbytes + self._out_dests.nbytes if reply_dtype is not None else 0))

        self._compile_handler()
        # plain handlers are called through their compiled entry point while ``state`` is still the
        # object they were compiled for (checked by identity on every call batch) and of a kind whose
        # numba type cannot change in place (None, arrays, tuples of arrays and scalars); else dispatched
        self._handler_state = self.state
        self._handler_fast = (_entry_point(handler, (self._pool_rec[0, :0], self.state))
                              if not self._has_reply and _fixed_type(self.state) else handler)

        # -- collective part --
        self._parent = parent
        self._check_same_everywhere(parent)
        self.comm = parent.Dup()
        tracer = _tracing.get_tracer()
        self._wrank = self._translate_to(tracer.comm)
        self.chan_id = tracer.new_channel_id(self.comm)
        self._byte = m.BYTE
        # persistent synchronous sends of full buffers, one per (buffer, destination), made on first use
        # (Ssend_init once, Start per buffer: no request object or buffer slice per message)
        self._psend: Optional[List[Any]] = [None] * (npool * size) if npool * size <= _MAX_PERSISTENT else None
        # full-buffer views (no slicing per handled buffer)
        self._pool_views = [self._pool_rec[b] for b in range(npool)]
        self._rpool_views = [self._rpool_rec[i] for i in range(nrecv)]
        self._testsome = m.Request.Testsome
        self._rreqs = [self.comm.Recv_init([self._rpool_bytes[i], m.BYTE], m.ANY_SOURCE, m.ANY_TAG)
                       for i in range(nrecv)]
        self._rstatus = m.Status()
        for r in self._rreqs:
            r.Start()
        # posted receives in posting order: all match (ANY_SOURCE, ANY_TAG) and MPI matches a message
        # to the earliest posted receive, so testing the head alone finds the next one to complete
        self._rq: Deque[int] = deque(range(nrecv))
        # sends in flight, oldest first, as parallel lists: progress tests the oldest ones (cheap);
        # a wait for a free buffer completes them all with one Testsome
        self._sreqs: List[Any] = []
        self._testsome_skip = 0
        self._sbufs: List[int] = []
        self._sdests: List[int] = []
        self._pending: Deque[Tuple[int, int, int]] = deque()  # (recv index, src, rows)
        self._local: Deque[Tuple[int, int]] = deque()          # (pool buffer, rows) for this rank
        # per-peer message numbers for the trace: all messages of this aggregator go over its own
        # communicator with tag 0 and every receive matches any source and tag, so MPI's non-overtaking
        # rule makes the k-th message received from a rank the k-th that rank sent here
        self._send_seq = [0] * size
        self._recv_seq = [0] * size
        self._flush_seq = 0
        self._st = dict(items_pushed=0, items_handled=0, buffers_full=0, buffers_flush=0, messages_sent=0,
                        local_buffers=0, messages_received=0, messages_handled=0, bytes_sent=0, bytes_received=0,
                        rows_dispatched=0, user_pushes=0, overflow_rows=0, max_overflow_rows=0,
                        max_inflight=0, max_buffers_in_use=0, flushes=0, waves=0, flush_timeouts=0)
        # a flush's counting wave outlives a flush timeout (see flush): [req, local, glob, prev, waves, pushes]
        self._wave: Optional[list] = None
        self._broken = None
        _live.append(self)

    # ------------------------------------------------------------------ construction helpers
    def _compile_handler(self) -> None:
        empty = self._pool_rec[0, :0]
        try:
            if not self._has_reply:
                self.handler(empty, self.state)
            else:
                n = self.handler(empty, self.state, self.rank, self._out_dests, self._out_items)
                if not isinstance(n, (int, np.integer)):
                    raise TypeError(f"it returned {type(n).__name__}; a reply handler must return the number "
                                    "of rows it wrote (an int)")
        except Exception as exc:  # noqa: BLE001 - numba typing errors, wrong arity, ...
            sig = ("handler(items, state)" if not self._has_reply
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
                        -1 if self.reply_dtype is None else self.reply_dtype.itemsize], dtype=np.int64)
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

    def _check_reply(self, reply: Any, size: int, rank: int, op: str) -> None:
        if not isinstance(reply, Aggregator):
            raise AggregationError(f"rank {rank}: {op} on {self.name}: reply must be an Aggregator, "
                                   f"got {type(reply).__name__}")
        reply._usable(op)
        if reply.size != size:
            raise AggregationError(f"rank {rank}: {op} on {self.name}: reply {reply.name} lives on a communicator "
                                   f"of size {reply.size}, this one has {size}; use the same ranks")

    def set_reply(self, reply: "Aggregator") -> None:
        """Connect the aggregator this one's handler output is pushed into, after construction.

        For reply *cycles* (request -> reply -> ack back into the first, or a
        handler that pushes into its own aggregator): create this aggregator
        with ``reply_dtype=<reply's item_dtype>`` (so its handler has the
        reply signature), create the others, then call ``set_reply``. Local
        (no communication), once per aggregator; every rank must make the
        same links before it flushes. Buffers that arrive before the link is
        made stay unhandled until it is (``flush`` refuses to start without it).
        """
        self._usable("set_reply")
        if not self._has_reply:
            raise AggregationError(
                f"rank {self.rank}: set_reply on {self.name}: it was created without reply= or reply_dtype=, so "
                "its handler has the plain signature handler(items, state); create it with reply_dtype=... ")
        if self.reply is not None:
            raise AggregationError(f"rank {self.rank}: set_reply on {self.name}: it already replies into "
                                   f"{self.reply.name}; a reply link is set once")
        self._check_reply(reply, self.size, self.rank, "set_reply")
        if reply.item_dtype != self.reply_dtype:
            raise AggregationError(f"rank {self.rank}: set_reply on {self.name}: reply {reply.name} has item_dtype "
                                   f"{reply.item_dtype}, the handler writes {self.reply_dtype} (reply_dtype)")
        self.reply = reply
        path, a = [], reply               # does the new link close a cycle? (each has one reply link)
        while a is not None and a is not self and a not in path:
            path.append(a)
            a = a.reply
        if a is self:
            for b in path + [self]:
                b._cyclic = True

    def set_state(self, state: Any) -> None:
        """Replace the ``state`` object passed to every later handler call. Local, no communication.

        For an aggregator reused over several phases whose handler works on different arrays (the
        distributed arrays' irregular copies keep one aggregator per item type and point it at each
        call's arrays). Call it while nothing pushed is unhandled on this rank (before pushing, or
        after a ``flush``). ``state`` should have the numba type the handler was compiled for; a new
        type compiles the handler again on first use.
        """
        self._usable("set_state")
        self.state = state
        self._handler_state = state
        self._handler_fast = (_entry_point(self.handler, (self._pool_rec[0, :0], state))
                              if not self._has_reply and _fixed_type(state) else self.handler)

    def _group(self) -> List["Aggregator"]:
        """This aggregator and every one reachable through reply links (flush covers them all)."""
        group, a = [], self
        while a is not None and a not in group:
            group.append(a)
            a = a.reply
        return group

    def _bad_dest(self, d: int, op: str) -> AggregationError:
        return AggregationError(f"rank {self.rank}: {op} on {self.name}: destination rank {d} is not a rank of "
                                f"the communicator (size {self.size}); use ranks 0..{self.size - 1}")

    # ------------------------------------------------------------------ pushing
    def push(self, dest: int, item: Any) -> None:
        """Append one item for rank ``dest``. Plain Python (use :meth:`push_many` for speed).

        ``item`` is a structured scalar of ``item_dtype`` (e.g. a row of an
        array of that dtype) or a tuple with one value per field. Returns
        once the item is in a buffer (not yet handled); blocks (progressing)
        only while no send buffer is free. If that wait times out
        (:class:`AggregationTimeout`), the item was NOT pushed and the
        aggregator stays usable: push it again to continue.
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
                self._wait_until(lambda: self._meta[0] > 0, f"push(dest={d}): waiting for a free send buffer",
                                 resume=f"The item was not pushed and {self.name} stays usable: push it again "
                                        "to continue")
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
        self._st["user_pushes"] += 1
        p += 1
        if p == self._lim[d]:
            self._pos[d] = -1
            self._note_use()
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
        buffers. Blocks (progressing) only while no send buffer is free. If
        that wait times out, :class:`AggregationTimeout` has ``items_placed``
        = k: ``items[:k]`` were pushed, the rest not, and the aggregator stays
        usable: ``push_many(dests[k:], items[k:])`` continues.
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
        self._st["user_pushes"] += 1
        i = 0
        while True:
            i = self._place(d, words, i, n)
            if i >= n:
                break
            if self._meta[0] == 0:
                try:
                    self._wait_until(lambda: self._meta[0] > 0,
                                     f"push_many: waiting for a free send buffer ({n - i} of {n} items left)",
                                     resume=f"items[:{i}] were pushed, the rest not, and {self.name} stays "
                                            f"usable: push_many(dests[{i}:], items[{i}:]) continues")
                except AggregationTimeout as exc:
                    exc.items_placed = i
                    raise
            else:
                _progress_all()

    def _place(self, dests: np.ndarray, words: np.ndarray, start: int, stop: int) -> int:
        """Bucket rows start..stop without waiting; dispatch full buffers. Returns rows placed up to.

        Progresses after every buffer sent and at least every ``_PROGRESS_ROWS``
        rows, so peers' messages keep moving even while large buffers fill. 16K rows
        (was 64K): with 1024-item buffers on 2 ranks a peer otherwise waited for free
        send buffers while this rank bucketed (its sends unmatched until this rank's
        next progress); measured 6-8% faster histogram there (16K or 8K; 4K was slower),
        no change at 4096 and 65536 items.
        """
        i = start
        bucket = _bucket
        if stop - start > self.buffer_items:
            # the compiled entry point for these argument types (numba.typeof of ten arrays costs
            # ~10 us, so it is looked up once per kind of input: only dests and words can vary)
            key = (dests.dtype, dests.ndim, dests.flags.c_contiguous, dests.flags.writeable,
                   words.dtype, words.ndim, words.flags.c_contiguous, words.flags.writeable)
            bucket = self._bucket_entry.get(key)
            if bucket is None:
                args = (dests, words, i, stop, self._rows, self._pos, self._lim, self._free, self._meta,
                        self._ready)
                bucket = self._bucket_entry[key] = _entry_point(_bucket, args)
        while True:
            hi = stop if stop - i <= _PROGRESS_ROWS else i + _PROGRESS_ROWS
            j = bucket(dests, words, i, hi, self._rows, self._pos, self._lim, self._free, self._meta,
                       self._ready)
            self._st["items_pushed"] += j - i
            i = j
            nready = int(self._meta[1])
            if nready:
                self._note_use()
                self._meta[1] = 0
                self._send_full(self._ready[:nready].tolist())
                if i < stop:
                    _progress_all()
                    continue
            elif i == hi < stop:
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
        st["buffers_full" if reason == REASON_FULL else "buffers_flush"] += 1
        st["rows_dispatched"] += rows
        if d == self.rank:
            st["local_buffers"] += 1
            self._local.append((b, rows))
            return
        nbytes = rows * self.itemsize
        seq = self._send_seq[d]
        self._send_seq[d] = seq + 1
        t0 = _now()
        req = self.comm.Issend([self._pool_bytes[b, :nbytes], self._byte], d, 0)
        self._sreqs.append(req)
        self._sbufs.append(b)
        self._sdests.append(d)
        st["messages_sent"] += 1
        st["bytes_sent"] += nbytes
        if len(self._sreqs) > st["max_inflight"]:
            st["max_inflight"] = len(self._sreqs)
        tr = _get_tracer()
        if tr.enabled:
            tr.record(K_BUFFER, _SEND, self._wrank[d], 0, nbytes, t0, _now(), 0, seq, self.chan_id, rows)

    def _send_full(self, ready: List[List[int]]) -> None:
        """Dispatch the full buffers ``ready`` = [(dest, buffer, rows)] (the hot path of ``_dispatch``).

        Remote ones start their persistent ``Ssend`` (created on first use of the
        (buffer, destination) pair); one trace record each; stats updated once.
        """
        psend = self._psend
        if psend is None:
            for d, b, rows in ready:
                self._dispatch(d, b, rows, REASON_FULL)
            return
        me, size, cap = self.rank, self.size, self.buffer_items
        nbytes = cap * self.itemsize
        sreqs, sbufs, sdests, seqs = self._sreqs, self._sbufs, self._sdests, self._send_seq
        tr = _get_tracer()
        if not tr.enabled:
            tr = None
        wrank, chan = self._wrank, self.chan_id
        nsent = 0
        mine: List[int] = []
        for d, b, rows in ready:
            if d == me:
                mine.append(b)
                continue
            k = b * size + d
            req = psend[k]
            if req is None:
                req = psend[k] = self.comm.Ssend_init([self._pool_bytes[b], self._byte], d, 0)
            seq = seqs[d]
            seqs[d] = seq + 1
            if tr is not None:
                t0 = _now()
                req.Start()
                tr.record(K_BUFFER, _SEND, wrank[d], 0, nbytes, t0, _now(), 0, seq, chan, rows)
            else:
                req.Start()
            sreqs.append(req)
            sbufs.append(b)
            sdests.append(d)
            nsent += 1
        st = self._st
        n = len(ready)
        st["buffers_full"] += n
        st["rows_dispatched"] += n * cap
        st["local_buffers"] += n - nsent
        st["messages_sent"] += nsent
        st["bytes_sent"] += nsent * nbytes
        if len(sreqs) > st["max_inflight"]:
            st["max_inflight"] = len(sreqs)
        if mine:  # this rank's own buffers, after the sends started
            if self._has_reply or self._pending or self._local:
                self._local.extend([(b, cap) for b in mine])
                if not self._has_reply:
                    self._handle_plain()
            else:
                self._handle_own(mine)

    def _handle_own(self, bufs: List[int]) -> None:
        """Handle this rank's own full buffers ``bufs`` (aggregator without reply, nothing queued) and
        return them to the free list in one step."""
        handler, state, views = self._handler_fast, self.state, self._pool_views
        if state is not self._handler_state:
            handler = self.handler
        k = 0
        try:
            for b in bufs:
                handler(views[b], state)
                k += 1
        except BaseException as exc:
            self._broken = f"its handler raised {type(exc).__name__} on a buffer from rank {self.rank}"
            raise
        finally:
            if k:
                nf = int(self._meta[0])
                self._free[nf:nf + k] = bufs[:k]
                self._meta[0] = nf + k
                self._st["items_handled"] += k * self.buffer_items

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
    def _progress(self, full: bool = False) -> None:
        """One non-blocking step: complete sends, receive, handle. ``full``: if the oldest send is still
        pending, every ``_TESTSOME_EVERY``-th call tests all sends (completion out of order, several peers)."""
        sreqs = self._sreqs
        if sreqs:
            free, meta, sbufs = self._free, self._meta, self._sbufs
            k, n = 0, len(sreqs)
            while k < n and sreqs[k].Test():  # the oldest first: sends to one peer complete in order
                k += 1
            if k:
                nf = int(meta[0])
                free[nf:nf + k] = sbufs[:k]
                meta[0] = nf + k
                del sreqs[:k], sbufs[:k], self._sdests[:k]
            elif full and n > 1 and self._testsome_skip <= 0:
                # the oldest is held up: look at all of them, but not at every poll (Testsome over
                # a deep pool costs ~0.1 us per request, and a wait polls again and again)
                self._testsome_skip = _TESTSOME_EVERY
                done = self._testsome(sreqs)
                if done:
                    for k in done:
                        free[meta[0]] = sbufs[k]
                        meta[0] += 1
                    if len(done) == len(sbufs):
                        self._sreqs, self._sbufs, self._sdests = [], [], []
                    else:
                        gone = set(done)
                        keep = [k for k in range(len(sbufs)) if k not in gone]
                        self._sreqs = [sreqs[k] for k in keep]
                        self._sbufs = [sbufs[k] for k in keep]
                        self._sdests = [self._sdests[k] for k in keep]
            elif full:
                self._testsome_skip -= 1
        if self._overflow:
            self._drain_overflow()
        if self._stage_pos < self._stage_end:
            self._drain()
        rq, pending = self._rq, self._pending
        if rq and not pending and not self._has_reply:
            if self._rreqs[rq[0]].Test(self._rstatus):
                self._receive_plain()
        elif rq and self._rreqs[rq[0]].Test(self._rstatus):
            rreqs, s, byte, isz = self._rreqs, self._rstatus, self._byte, self.itemsize
            rseq, wrank, chan = self._recv_seq, self._wrank, self.chan_id
            tr = _get_tracer()
            if not tr.enabled:
                tr = None
            nmsg = nb = 0
            while True:
                i = rq.popleft()
                src, nbytes = s.Get_source(), s.Get_count(byte)
                rows = nbytes // isz
                pending.append((i, src, rows))
                nmsg += 1
                nb += nbytes
                seq = rseq[src]
                rseq[src] = seq + 1
                if tr is not None:
                    t = _now()
                    tr.record(K_BUFFER, _RECV, wrank[src], 0, nbytes, t, t, 0, seq, chan, rows)
                if not rq or not rreqs[rq[0]].Test(s):
                    break
            st = self._st
            st["messages_received"] += nmsg
            st["bytes_received"] += nb
        if not (pending or self._local) or (self._has_reply and self.reply is None):
            return  # nothing to handle, or set_reply() not called yet: received buffers wait, unhandled
        if not self._has_reply:
            self._handle_plain()
            return
        while self._stage_pos >= self._stage_end and (pending or self._local):
            if pending:
                i, src, rows = pending.popleft()
                self._handle(self._rpool_rec[i, :rows], src)
                self._st["messages_handled"] += 1
                self._rreqs[i].Start()
                rq.append(i)
            else:
                b, rows = self._local.popleft()
                self._handle(self._pool_rec[b, :rows], self.rank)
                self._free[self._meta[0]] = b
                self._meta[0] += 1

    def _receive_plain(self) -> None:
        """Receive and at once handle every completed receive of an aggregator without reply (the head
        receive has just tested complete, its status in ``_rstatus``); each is re-posted right away."""
        rq, rreqs, s, byte, isz = self._rq, self._rreqs, self._rstatus, self._byte, self.itemsize
        rseq, wrank, chan, cap = self._recv_seq, self._wrank, self.chan_id, self.buffer_items
        handler, state, rviews = self._handler_fast, self.state, self._rpool_views
        if state is not self._handler_state:
            handler = self.handler
        tr = _get_tracer()
        if not tr.enabled:
            tr = None
        nmsg = nb = nitems = nhandled = 0
        try:
            while True:
                i = rq.popleft()
                src, nbytes = s.Get_source(), s.Get_count(byte)
                rows = nbytes // isz
                nmsg += 1
                nb += nbytes
                seq = rseq[src]
                rseq[src] = seq + 1
                if tr is not None:
                    t = _now()
                    tr.record(K_BUFFER, _RECV, wrank[src], 0, nbytes, t, t, 0, seq, chan, rows)
                try:
                    handler(rviews[i] if rows == cap else self._rpool_rec[i, :rows], state)
                except BaseException as exc:
                    self._pending.appendleft((i, src, rows))  # received, not handled
                    self._broken = f"its handler raised {type(exc).__name__} on a buffer from rank {src}"
                    raise
                nhandled += 1
                nitems += rows
                rreqs[i].Start()
                rq.append(i)
                if not rreqs[rq[0]].Test(s):
                    break
        finally:
            st = self._st
            st["messages_received"] += nmsg
            st["bytes_received"] += nb
            st["messages_handled"] += nhandled
            st["items_handled"] += nitems

    def _handle_plain(self) -> None:
        """Handle every received and local buffer of an aggregator without reply (the hot path of
        :meth:`_handle`): full-buffer views made once, receives re-posted at once, stats updated once."""
        pending, local, rq, rreqs = self._pending, self._local, self._rq, self._rreqs
        handler, state, cap = self._handler_fast, self.state, self.buffer_items
        if state is not self._handler_state:
            handler = self.handler
        rviews, views, free, meta = self._rpool_views, self._pool_views, self._free, self._meta
        nhandled = nitems = 0
        src = -1
        try:
            while pending:
                i, src, rows = pending[0]
                handler(rviews[i] if rows == cap else self._rpool_rec[i, :rows], state)
                pending.popleft()
                nhandled += 1
                nitems += rows
                rreqs[i].Start()
                rq.append(i)
            src = self.rank
            while local:
                b, rows = local[0]
                handler(views[b] if rows == cap else self._pool_rec[b, :rows], state)
                local.popleft()
                nitems += rows
                free[meta[0]] = b
                meta[0] += 1
        except BaseException as exc:
            self._broken = f"its handler raised {type(exc).__name__} on a buffer from rank {src}"
            raise
        finally:
            st = self._st
            st["messages_handled"] += nhandled
            st["items_handled"] += nitems

    def _handle(self, items: np.ndarray, src: int) -> None:
        rows = items.shape[0]
        try:
            if not self._has_reply:
                self.handler(items, self.state)
                n = 0
            else:
                n = int(self.handler(items, self.state, src, self._out_dests, self._out_items))
        except BaseException as exc:
            self._broken = f"its handler raised {type(exc).__name__} on a buffer from rank {src}"
            raise
        if self._has_reply:
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
                if self._cyclic and self._stage_pos < self._stage_end:
                    self._spill()
        self._st["items_handled"] += rows

    def _reply_usable(self) -> "Aggregator":
        reply = self.reply
        if reply._closed or reply._broken is not None:
            self._broken = f"its reply aggregator {reply.name} was closed or broke with replies pending"
            reply._usable(f"reply from {self.name}")
        return reply

    def _drain(self) -> None:
        """Move staged reply rows into the reply aggregator as far as its free buffers allow."""
        self._stage_pos = self._reply_usable()._place(self._out_dests, self._out_words, self._stage_pos,
                                                      self._stage_end)

    def _spill(self) -> None:
        """On a reply cycle: copy the staged rows that found no free buffer to the overflow.

        Without this, a cycle could deadlock with bounded buffers: each rank's
        staged output waiting for buffers that sit unmatched at a peer whose
        staged output waits for this rank's buffers. Spilling keeps every
        handler non-blocking, so receives are always re-posted and every send
        completes; the overflow holds only rows that could not be placed yet.
        """
        lo, hi = self._stage_pos, self._stage_end
        self._overflow.append((self._out_dests[lo:hi].copy(), self._out_words[lo:hi].copy()))
        st = self._st
        self._overflow_rows += hi - lo
        st["overflow_rows"] += hi - lo
        if self._overflow_rows > st["max_overflow_rows"]:
            st["max_overflow_rows"] = self._overflow_rows
        self._stage_pos = self._stage_end = 0

    def _drain_overflow(self) -> None:
        reply = self._reply_usable()
        while self._overflow:
            dests, words = self._overflow[0]
            n = dests.shape[0]
            k = reply._place(dests, words, self._overflow_pos, n)
            self._overflow_rows -= k - self._overflow_pos
            if k < n:
                self._overflow_pos = k
                return
            self._overflow.popleft()
            self._overflow_pos = 0

    def _busy(self) -> bool:
        """True while this rank still has work for this aggregator (besides partial buffers)."""
        return bool(self._pending or self._local or self._sreqs or self._stage_pos < self._stage_end
                    or self._overflow)

    # ------------------------------------------------------------------ waiting
    def _wait_until(self, cond: Callable[[], bool], op: str, timeout: Any = _UNSET, resume: str = "") -> None:
        """Progress every live aggregator until ``cond()``.

        A timeout raises :class:`AggregationTimeout` and leaves the aggregator
        usable (``resume`` tells the caller how to continue); an interrupt
        makes it unusable (it may have hit the middle of a state update).
        """
        timeout = self.timeout if timeout is _UNSET else timeout
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        peer = self._sdests[0] if self._sdests else None
        waiting.current = (op, peer, _now())
        polls = spins = 0
        try:
            while not cond():
                _progress_all(True)
                spins += 1
                if spins > _SPIN_POLLS:
                    _yield()  # give the core away: under oversubscription the peer we wait for may need it
                if self._broken is not None:
                    self._usable(op)
                polls += 1
                if polls >= _POLLS_BETWEEN_CLOCK_CHECKS:
                    polls = 0
                    if deadline is not None and time.monotonic() > deadline:
                        peer = self._sdests[0] if self._sdests else None
                        raise AggregationTimeout(self.rank, peer, f"{op} on {self.name}", time.monotonic() - t0,
                                                 f"{self._describe_state()}. {resume}")
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
    def flush(self, timeout: Optional[float] = _UNSET) -> None:
        """Collective: return when every item pushed into this aggregator or any
        aggregator reachable through ``reply`` links (on any rank, before the
        flush or by handlers during it) has been handled on its destination.

        Every rank of the communicator must call it on the same aggregator
        (and flushes of different aggregators in the same order everywhere).
        Blocks, progressing every live aggregator. Reply links may form cycles
        (see :meth:`set_reply`): the flush covers the whole linked set.

        Timeout: after ``timeout`` seconds (default: the aggregator's) it
        raises :class:`AggregationTimeout` and the aggregator stays USABLE:
        nothing is lost, the counting wave in progress stays posted, and the
        next ``flush()`` (or ``close()``) on this rank resumes it (the other
        ranks are still in, or will reach, the same flush; calling
        ``flush()`` again is the way to complete it). Items pushed between the
        timeout and the resumed flush are covered by it: if the pending wave
        ends the old flush epoch while this rank has pushed since, this rank
        starts a new epoch instead of returning, so it returns only when
        those items are handled too (which needs the other ranks' next
        flush). An interrupt (Ctrl-C) in a flush makes it unusable.

        Termination detection: repeated counting with non-blocking
        ``Iallreduce`` waves (the double-counting / "four counter" scheme of
        Mattern, 1987). ``s_i`` = buffers rank i has sent (synchronous sends started,
        all linked aggregators), ``r_i`` = buffers rank i has received AND
        handled; both only grow. A rank joins a wave only when *idle* for the
        whole linked set: no partial buffer (they are sent first), no send in
        flight, no received or local buffer unhandled, no staged or overflow
        reply rows. It contributes its ``(s_i, r_i)`` of that instant and keeps
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
        state is stable. Handler-generated traffic (into any linked
        aggregator, whose counters are part of the sums) is covered because a
        rank with staged, overflow or partial reply rows is not idle; cycles
        change nothing in this argument (it never uses the shape of the
        links), and they cannot deadlock because handlers on a cycle spill to
        the overflow instead of waiting. A single wave with S == R is NOT
        enough (a buffer may be sent after its sender was counted and
        received before its receiver was), hence two. The decision is taken
        on identical global values on every rank, so all ranks leave in the
        same wave. A rank that already left may push again at once; another
        rank still polling the last wave may receive and handle such a
        buffer early, which is harmless (it belongs to the next epoch and its
        counts are cumulative).
        """
        self._usable("flush")
        group = [a for a in self._group() if a is self or not a._closed]
        for a in group[1:]:
            a._usable(f"flush of {self.name} (its reply links)")
        for a in group:
            if a._has_reply and a.reply is None:
                raise AggregationError(
                    f"rank {self.rank}: flush of {self.name}: {a.name} was created with reply_dtype= but "
                    "set_reply() was not called, so its handler output has nowhere to go; call "
                    f"{a.name}.set_reply(<aggregator>) on every rank first")
        timeout = self.timeout if timeout is _UNSET else timeout
        m = MPI()
        t_start = _now()
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        if self._wave is None:  # [request, local, global, previous sums, waves, user pushes at contribution]
            self._wave = [None, np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64), None, 0, 0]
        wave = self._wave
        local, glob = wave[1], wave[2]
        polls = spins = 0
        waiting.current = ("flush", None, t_start)
        try:
            while True:
                req = wave[0]
                if req is not None:
                    if req.Test():
                        spins = 0
                        wave[0] = None
                        wave[4] += 1
                        g = (int(glob[0]), int(glob[1]))
                        if g[0] == g[1] and g == wave[3]:
                            if sum(a._st["user_pushes"] for a in group) == wave[5]:
                                break
                            g = None  # the old epoch ended, but this rank pushed since (resumed flush)
                        wave[3] = g
                        continue
                    _progress_all(True)
                    spins += 1
                    if spins > _SPIN_POLLS:  # spin briefly (a wave takes tens of us), then share the core
                        _yield()
                else:
                    _progress_all(True)
                    if not any(a._busy() for a in group):
                        for a in group:
                            a._send_partials()
                        if not any(a._busy() for a in group):
                            local[0] = sum(a._st["messages_sent"] for a in group)
                            local[1] = sum(a._st["messages_handled"] for a in group)
                            wave[5] = sum(a._st["user_pushes"] for a in group)
                            wave[0] = self.comm.Iallreduce(local, glob, op=m.SUM)
                            continue
                for a in group:
                    if a._broken is not None:
                        a._usable("flush")
                polls += 1
                if polls >= _POLLS_BETWEEN_CLOCK_CHECKS:
                    polls = 0
                    if deadline is not None and time.monotonic() > deadline:
                        self._st["flush_timeouts"] += 1
                        raise AggregationTimeout(
                            self.rank, None, f"flush on {self.name}", time.monotonic() - t0,
                            f"{'a counting wave is pending' if wave[0] is not None else 'this rank is not idle yet'}"
                            f"; last global (sent, handled) = {wave[3]}; here: {self._describe_state()}. "
                            f"Nothing is lost and {self.name} stays usable: call flush() again to resume this flush "
                            "(every rank must complete it), or close()")
        except KeyboardInterrupt:
            self._broken = "flush was interrupted"
            raise
        finally:
            waiting.current = None
        waves = wave[4]
        self._wave = None
        for a in group:
            a._st["flushes"] += 1
            a._st["waves"] += waves
        self._flush_seq += 1
        tr = _get_tracer()
        if tr.enabled:
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
        ``overflow_rows`` / ``max_overflow_rows`` (reply rows spilled on a
        reply cycle, in total / at most at once); ``user_pushes`` (calls of
        ``push``/``push_many``); ``flushes``, counting ``waves`` and
        ``flush_timeouts``.
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
        that broke (interrupt, failing handler) is released locally without
        flushing; after a flush timeout, ``close()`` resumes that flush (and
        can time out again: leaving a ``with`` block by an exception releases
        the aggregator locally instead).
        Closing one aggregator of a reply cycle first is fine: the flushes of
        the others skip it (its last flush handled everything it had).
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
        inflight = {id(r) for r in getattr(self, "_sreqs", [])}
        for r in getattr(self, "_psend", None) or []:
            if r is not None and id(r) not in inflight:
                try:
                    r.Free()
                except Exception:  # noqa: BLE001
                    pass
        self._psend = None
        wave = getattr(self, "_wave", None)
        wave_pending = wave is not None and wave[0] is not None
        if self._broken is None and not self._sreqs and not wave_pending and hasattr(self, "comm"):
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
