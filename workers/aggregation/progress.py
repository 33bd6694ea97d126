"""The aggregators' progress engine: completing sends, testing receives,
dispatching received and local buffers to the handlers, moving reply rows on,
and waiting.

Whenever a rank is inside ``push``/``push_many``/``flush`` of any aggregator,
:func:`_progress_all` runs one step of :meth:`_Progress._progress` for EVERY
live aggregator of this process (``_live``), so a rank that pushes keeps
receiving and nothing deadlocks when all ranks send to all. A step never
blocks: it tests the oldest sends (sends to one peer complete in order) and the
head of the posted receives (all match any source and tag, and MPI matches a
message to the earliest posted receive), re-posts each receive as soon as its
buffer is handled, and stages a reply handler's output for the reply
aggregator (on a reply cycle the rows that find no free buffer spill to the
overflow). :meth:`_Progress._wait_until` is the one wait loop of ``push`` and
``push_many``: it progresses until a condition holds, with the timeout and
interrupt rules of :class:`~nbmpi.workers.aggregation.aggregator.Aggregator`.

:class:`_Progress` is a mixin of ``Aggregator``: its methods work on the
aggregator's own attributes (no extra object or call per message).
"""
from __future__ import annotations

import atexit
import os
import time
from typing import Any, Callable, List

import numpy as np

from ..tracing import tracer as _tracing
from ..core import waiting
from ..core.errors import AggregationError, AggregationTimeout
from .bucketing import _first_bad_dest

__all__: list = []

K_BUFFER = _tracing.register_kind("agg_buffer")
_RECV = _tracing.DIR_RECV
_get_tracer = _tracing.get_tracer
_now = time.perf_counter_ns
_UNSET: Any = object()
_POLLS_BETWEEN_CLOCK_CHECKS = 64
_TESTSOME_EVERY = 8                 # a wait tests all sends (not only the oldest) every this many polls
_SPIN_POLLS = 64                    # waits poll this often before they start yielding the core each poll

# Aggregators that are open in this process; every wait progresses all of them.
_live: List[Any] = []
_yield = getattr(os, "sched_yield", lambda: None)
_progressing = False


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
    """At exit: release every live aggregator locally (no flush)."""
    for agg in list(_live):
        agg._discard()


atexit.register(_discard_all)


class _Progress:
    """Mixin of ``Aggregator``: one non-blocking progress step, handling, reply staging, waiting.

    Called only from this process's aggregators (the thread that created them); never blocks except
    :meth:`_wait_until`, which progresses until its condition holds or the timeout passes.
    """

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
                self._complete_any_sends()
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

    def _complete_any_sends(self) -> None:
        """The oldest send is held up: test all of them at once and free the buffers of those done
        (completion out of order, several peers). Not at every poll (Testsome over a deep pool costs
        ~0.1 us per request, and a wait polls again and again): the next ``_TESTSOME_EVERY`` full
        progress steps skip it."""
        sreqs, sbufs, free, meta = self._sreqs, self._sbufs, self._free, self._meta
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

    def _handle(self, items: np.ndarray, src: int) -> None:
        """Run the handler on ``items`` received from ``src`` (any signature); stage a reply handler's
        output rows and move them into the reply aggregator (spilling on a cycle)."""
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

    def _reply_usable(self) -> Any:
        """The reply aggregator, if it can still take rows; else mark this one broken and raise."""
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
        """Move overflow rows (reply cycles) into the reply aggregator as far as its free buffers allow."""
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
        """This rank's sends in flight, unhandled buffers and counts, for timeout messages."""
        st = self._st
        return (f"{len(self._sreqs)} send(s) in flight to rank(s) "
                f"{sorted(set(self._sdests))}, {len(self._pending)} received buffer(s) unhandled, "
                f"{st['messages_sent']} buffers sent and {st['messages_handled']} received+handled here")
