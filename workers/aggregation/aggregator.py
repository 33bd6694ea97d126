"""Aggregation of fine-grained items into per-destination buffers (the Chapel
Aggregation Library model), with numba handlers and termination detection.

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
  :mod:`nbmpi.workers.aggregation.termination`.
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

Layout: this module is the public API (construction, checks, ``push``,
``push_many``, ``flush``, ``stats``, ``close``); the mechanisms are mixins of
:class:`Aggregator` in their own modules: :mod:`.buffers` (the buffer pool,
bucketing, persistent sends and receives), :mod:`.progress` (the progress
engine: testing, dispatching to handlers, reply staging, waiting),
:mod:`.termination` (flush's counting waves) and :mod:`.bucketing` (the numba
kernels).
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, Dict, List, Optional

import numba
import numpy as np

from ..tracing import tracer as _tracing
from ..core import spmd
from ..core.errors import AggregationError, AggregationTimeout
from ..core.kernels import is_jitted
from ..core.runtime import MPI, default_timeout, world
from .bucketing import _entry_point, _first_bad_dest, _fixed_type
from .buffers import REASON_FULL, _Buffers, _buffer_counts
from .progress import _UNSET, _live, _progress_all, _Progress
from .termination import _Termination

__all__ = ["Aggregator"]

_MAX_PERSISTENT = 1 << 16           # at most this many persistent send requests (pool buffers x ranks)


class Aggregator(_Buffers, _Progress, _Termination):
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
        self.rank = parent.Get_rank()
        self.size = size = parent.Get_size()
        self.name = name or "Aggregator"
        self._closed = False
        self._broken: Optional[str] = "not constructed"
        dt, buffer_items, npool, nrecv, reply_dtype, replies_per_item = self._checked_args(
            item_dtype, handler, buffer_items, pool_buffers, recv_buffers, reply, replies_per_item, reply_dtype)

        self.item_dtype = dt
        self.itemsize = dt.itemsize
        self.buffer_items = buffer_items
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
        self._alloc_buffers()   # all buffers allocated now, never grown

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
        self._testsome = m.Request.Testsome
        self._post_receives(m)
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

    def _checked_args(self, item_dtype: Any, handler: Callable, buffer_items: Any, pool_buffers: Optional[int],
                      recv_buffers: Optional[int], reply: Optional["Aggregator"], replies_per_item: Any,
                      reply_dtype: Any) -> tuple:
        """Validate the constructor's arguments locally (before anything collective, so every rank fails
        alike) and return ``(item dtype, buffer_items, pool_buffers, recv_buffers, reply dtype or None,
        replies_per_item)``; raises :class:`AggregationError` naming the rank and what to pass instead."""
        prank, size = self.rank, self.size
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
        npool, nrecv = _buffer_counts(prank, self.name, size, dt.itemsize, buffer_items, pool_buffers,
                                      recv_buffers)
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
        return dt, buffer_items, npool, nrecv, reply_dtype, replies_per_item

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
        return spmd.translate_ranks(self._parent, range(self.size), other_comm)

    def _check_same_everywhere(self, comm) -> None:
        sig = tuple(int(v) for v in (self.itemsize, self.buffer_items, self.pool_buffers, self.recv_buffers,
                                     zlib.crc32(repr(self.item_dtype.descr).encode()),
                                     -1 if self.reply_dtype is None else self.reply_dtype.itemsize))
        d = spmd.agree(comm, sig, timeout=self.timeout, rank=self.rank, error=AggregationTimeout,
                       op=f"creating {self.name} (checking that every rank creates it alike)")
        if d is None:
            return
        raise AggregationError(
            f"rank {self.rank}: {self.name} created differently on rank(s) {list(d.differing)} (itemsize, "
            f"buffer_items, pool_buffers, recv_buffers, dtype hash, reply itemsize = {list(d.items[d.differing[0]])} "
            f"vs {list(d.reference)}); every rank must use the same item_dtype, buffer sizes and reply structure")

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
        ``Iallreduce`` waves (Mattern's "four counter" scheme), in
        :mod:`nbmpi.workers.aggregation.termination` with the argument why it is correct.
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
        self._terminate(group, timeout)

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
