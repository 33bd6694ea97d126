"""The aggregators' send side: per-destination buffers in one fixed pool,
bucketing pushed rows into them, sending full and partial buffers, and the
local release of the persistent requests (``_discard``).

Bounded memory: ``pool_buffers`` send buffers (at least ``size + 1``: one
current buffer per destination plus in-flight ones), ``recv_buffers``
pre-posted receive buffers and one staging area for reply rows, all allocated
at construction (:meth:`_Buffers._alloc_buffers`) and never grown; the default
counts (:func:`_buffer_counts`) keep enough buffers in flight that a rank
rarely waits for a peer to progress, within an in-flight memory budget. Sends
are synchronous (``Issend`` / persistent ``Ssend_init`` started once per full
buffer, :meth:`_Buffers._send_full`), so each sender has at most
``pool_buffers`` messages unmatched anywhere in MPI. A send buffer returns to
the free list when its send completes (:mod:`.progress`) or, for this rank's
own buffers, when it is handled.

:class:`_Buffers` is a mixin of ``Aggregator``: its methods work on the
aggregator's own attributes (no extra object or call per message). Local, never
blocks.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np

from ..tracing import tracer as _tracing
from ..core.errors import AggregationError
from .bucketing import _bucket, _entry_point, _word_dtype
from ..core import waiting
from .progress import _live, _progress_all

__all__: list = []

K_BUFFER = _tracing.register_kind("agg_buffer")
_SEND = _tracing.DIR_SEND
_get_tracer = _tracing.get_tracer
_now = time.perf_counter_ns
REASON_FULL, REASON_FLUSH = 0, 1
_INFLIGHT_BUDGET_BYTES = 8 << 20   # memory the default buffer counts may use beyond the minimum
_PROGRESS_ROWS = 1 << 14            # push_many progresses at least every this many rows (see _place)
_DEPTH_ROWS = 1 << 16               # default in-flight buffers per peer: as many as hold this many rows
_MAX_DEPTH = 64                     # default in-flight buffers per peer, at most (see _buffer_counts)


def _buffer_counts(prank: int, name: str, size: int, itemsize: int, buffer_items: int,
                   pool_buffers: Optional[int], recv_buffers: Optional[int]) -> Tuple[int, int]:
    """``(pool_buffers, recv_buffers)`` of a new aggregator: the given ones, checked, or the defaults.

    Local (before anything collective, so every rank fails alike); raises :class:`AggregationError`
    naming ``prank`` and ``name`` for counts too small.
    """
    # default counts: enough buffers in flight that a rank rarely waits for a peer to progress,
    # within an in-flight memory budget: at least 4 per peer, and for small buffers as many as
    # hold _DEPTH_ROWS rows (what filled between two progress steps of push_many when those came
    # every 64K rows), at most 64 per peer.
    # Measured (benchmarks/aggregation.py, 1024-item buffers, 2 ranks): 15 send / 8 receive
    # buffers ran dry 138 times per 4M-item push_many, 131 / 64 six times.
    extra = _INFLIGHT_BUDGET_BYTES // max(1, buffer_items * itemsize)
    per_peer = min(_MAX_DEPTH, max(4, -(-_DEPTH_ROWS // buffer_items)))
    npool = (size + 1 + int(max(min(max(extra, size + 1), 4 * size + 4), min(extra, per_peer * size))))\
        if pool_buffers is None else int(pool_buffers)
    if npool < size + 1:
        raise AggregationError(
            f"rank {prank}: {name}: pool_buffers={npool} is too small for {size} ranks; expected at "
            f"least size + 1 = {size + 1} (one buffer per destination plus one in flight)")
    lo_r, hi_r = max(4, 2 * (size - 1)), max(8, 4 * (size - 1))
    nrecv = int(max(min(max(extra, lo_r), hi_r), min(extra, per_peer * (size - 1))))
    nrecv = (nrecv if size > 1 else 0) if recv_buffers is None else int(recv_buffers)
    if size > 1 and nrecv < 1:
        raise AggregationError(f"rank {prank}: {name}: recv_buffers={nrecv}; expected >= 1")
    if size == 1:
        nrecv = 0
    return npool, nrecv


class _Buffers:
    """Mixin of ``Aggregator``: the buffer pool, bucketing, dispatching full and partial buffers.

    Called only from this process's aggregators (the thread that created them); local, never blocks.
    """

    def _alloc_buffers(self) -> None:
        """Allocate every buffer of this aggregator (send pool, receive pool, reply staging area) and
        the bucketing state, from ``item_dtype``, ``buffer_items``, ``pool_buffers``,
        ``recv_buffers``, ``size``, ``reply_dtype`` and ``replies_per_item``. Local."""
        dt, cap, npool, nrecv = self.item_dtype, self.buffer_items, self.pool_buffers, self.recv_buffers
        size, reply_dtype, replies_per_item = self.size, self.reply_dtype, self.replies_per_item
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
        # full-buffer views (no slicing per handled buffer)
        self._pool_views = [self._pool_rec[b] for b in range(npool)]
        self._rpool_views = [self._rpool_rec[i] for i in range(nrecv)]

    def _post_receives(self, m: Any) -> None:
        """Create and start this aggregator's persistent receives (one per receive buffer, any source
        and tag) on its communicator, and the empty in-flight and pending queues. Local."""
        nrecv = self.recv_buffers
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
        """Record the most send buffers in use at once (stats ``max_buffers_in_use``)."""
        used = self.pool_buffers - int(self._meta[0])
        if used > self._st["max_buffers_in_use"]:
            self._st["max_buffers_in_use"] = used

    def _dispatch(self, d: int, b: int, rows: int, reason: int) -> None:
        """Send buffer ``b`` (``rows`` rows) to ``d`` with ``Issend``, or queue it locally if ``d`` is this
        rank; ``reason`` is ``REASON_FULL`` or ``REASON_FLUSH`` (counted in the stats)."""
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

    def _discard(self) -> None:
        """Local release (``close``, leaving a ``with`` block by an exception, interpreter exit): cancel the
        posted receives, free the persistent requests and, if nothing is in flight, the communicator."""
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
