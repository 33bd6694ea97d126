"""Per-rank recording of every communication call (the runtime's tracer).

Recording is cheap: each rank owns one preallocated ``int64`` record buffer
(:data:`FIELDS` columns per event) and an event is written by a single
``struct.pack_into`` call; no Python object is kept per event. The buffer
doubles when full, up to ``max_events`` (then events are counted as dropped,
never silently lost). Tracing can be switched off (``NBMPI_TRACE=0`` or
``Tracer.enabled = False``); components check ``tracer.enabled`` before they
even read the clock.

Times are ``time.perf_counter_ns()`` of the recording rank. :meth:`Tracer.align_clocks`
(collective) estimates each rank's offset to rank 0 (Cristian's method, best
of several round trips), and :meth:`Tracer.gather` ships the records of all
ranks to one root in one call, shifted onto rank 0's clock, as a
:class:`~nbmpi.workers.trace_analysis.Trace`.

Waiting time: a component records ``wait=-1`` when it cannot know locally how
long it waited for its partner; the gathered :class:`Trace` then derives it by
matching (late sender / late receiver / last arrival at a collective).
"""
from __future__ import annotations

import struct
import threading
import time
from typing import Dict, List, Optional

import numpy as np

#: Columns of one record, in order. All int64.
FIELDS = ("kind", "dir", "peer", "tag", "nbytes", "t_start", "t_end", "wait", "seq", "chan", "count")
NF = len(FIELDS)
#: ``dir`` values: a collective step (or no direction), a send, a receive.
DIR_NONE, DIR_SEND, DIR_RECV = 0, 1, 2

_KINDS: List[str] = []
_KIND_CODES: Dict[str, int] = {}
_kinds_lock = threading.Lock()


def register_kind(name: str) -> int:
    """Return the integer code of event kind ``name``, registering it if new.

    Components register their kinds at import time so codes agree on all ranks;
    the gathered trace carries rank 0's name table regardless.
    """
    with _kinds_lock:
        code = _KIND_CODES.get(name)
        if code is None:
            code = len(_KINDS)
            _KINDS.append(name)
            _KIND_CODES[name] = code
        return code


def kind_names() -> List[str]:
    """Names of all registered kinds, indexed by code."""
    return list(_KINDS)


for _k in ("put", "take", "reduce", "allreduce", "bcast", "scatter", "gather", "barrier"):
    register_kind(_k)

#: ``PACK(buf, offset, *fields)`` writes one record (used by :meth:`Tracer.record`).
PACK = struct.Struct("<" + "q" * NF).pack_into
ROW_BYTES = 8 * NF
_PACK, _ROW_BYTES = PACK, ROW_BYTES
# A deferred record = packed static head (kind, dir, peer, tag, nbytes) + the two times +
# packed static tail (wait, seq, chan, count): one pack_into with 4 arguments (8 for two).
_T0 = FIELDS.index("t_start")
assert FIELDS[_T0 + 1] == "t_end" and NF - _T0 - 2 == 4
_HEAD = struct.Struct("<" + "q" * _T0)
_TAIL = struct.Struct("<qqqq")
_SITE_FMT = f"{8 * _T0}sqq32s"
_PACK_SITE = struct.Struct("<" + _SITE_FMT).pack_into
_PACK_SITES2 = struct.Struct("<" + _SITE_FMT * 2).pack_into


class Tracer:
    """The record buffer of one rank. Create with :func:`nbmpi.workers.runtime.init`.

    ``record`` is called by runtime components (not by users) after each
    communication call completes; it never blocks and never communicates.
    ``seq=-1`` on a blocking point-to-point event means "match by order": the
    k-th such send from s to d on (chan, tag) matches the k-th receive (MPI's
    non-overtaking rule), which spares the hot path a counter.
    """

    __slots__ = ("comm", "rank", "size", "enabled", "max_events", "buf", "cap", "n", "dropped",
                 "offset_ns", "offset_err_ns", "_next_chan", "_lock",
                 "pend", "site1", "t0_1", "t1_1", "site2", "t0_2", "t1_2")

    def __init__(self, comm, enabled: bool = True, capacity: int = 1 << 14, max_events: int = 1 << 22):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.enabled = bool(enabled)
        self.max_events = int(max_events)
        self.buf = np.zeros(capacity * NF, dtype=np.int64)
        self.cap = capacity
        self.n = 0
        self.dropped = 0
        self.offset_ns = 0
        self.offset_err_ns = 0
        self._next_chan = 1
        self._lock = threading.Lock()
        #: Deferred records of the latency-critical put/take path (see :meth:`defer`).
        self.pend = 0
        self.site1 = self.site2 = None
        self.t0_1 = self.t1_1 = self.t0_2 = self.t1_2 = 0

    # -- recording -------------------------------------------------------------
    # Deferred records. A blocking put/take record written right after the
    # operation completes sits on the critical path of a ping-pong: the partner's
    # reply is usually already there. So channel put/take only note their
    # record in two slots (``site`` = the static fields, a tuple made once per
    # channel and peer; ``t0``/``t1``) with a few attribute stores, inline:
    #     if tr.pend == 0: tr.site1, tr.t0_1, tr.t1_1, tr.pend = site, t0, t1, 1
    #     elif tr.pend == 1: tr.site2, tr.t0_2, tr.t1_2, tr.pend = site, t0, t1, 2
    #     else: tr.flush(); (then slot 1)
    # and call :meth:`flush` where it costs nothing: after the next ``Start``
    # of a send (the message is on its way) or while blocked waiting. Every
    # reader of the buffer (record, events, mark, gather, clear) flushes first,
    # so the buffer stays in completion order and nothing is ever lost.
    def flush(self) -> None:
        """Write the deferred put/take records into the buffer (oldest first). Never blocks."""
        p = self.pend
        if not p:
            return
        self.pend = 0
        n = self.n
        if p == 2 and n + 2 <= self.cap:
            a, b = self.site1, self.site2
            _PACK_SITES2(self.buf, n * _ROW_BYTES, a[0], self.t0_1, self.t1_1, a[1],
                         b[0], self.t0_2, self.t1_2, b[1])
            self.n = n + 2
            return
        if n >= self.cap and not self._grow():
            self.dropped += p
            return
        a = self.site1
        _PACK_SITE(self.buf, n * _ROW_BYTES, a[0], self.t0_1, self.t1_1, a[1])
        self.n = n + 1
        if p == 2:
            self.pend = 1
            self.site1, self.t0_1, self.t1_1 = self.site2, self.t0_2, self.t1_2
            self.flush()

    @staticmethod
    def site(kind: int, direction: int, peer: int, tag: int, nbytes: int, chan: int) -> tuple:
        """The static fields of a deferred point-to-point record, packed once (see :meth:`defer`):
        everything but the times; ``wait=-1, seq=-1`` (derived by order matching), ``count=0``."""
        return (_HEAD.pack(kind, direction, peer, tag, nbytes), _TAIL.pack(-1, -1, chan, 0))

    def defer(self, site: tuple, t_start: int, t_end: int) -> None:
        """Note a blocking point-to-point record to be written at the next flush.

        ``site`` comes from :meth:`site` (made once per channel and peer). The hot
        path inlines this.
        """
        p = self.pend
        if p == 0:
            self.site1, self.t0_1, self.t1_1, self.pend = site, t_start, t_end, 1
        elif p == 1:
            self.site2, self.t0_2, self.t1_2, self.pend = site, t_start, t_end, 2
        else:
            self.flush()
            self.site1, self.t0_1, self.t1_1, self.pend = site, t_start, t_end, 1

    def record(self, kind: int, direction: int, peer: int, tag: int, nbytes: int,
               t_start: int, t_end: int, wait: int = -1, seq: int = 0, chan: int = 0,
               count: int = 0) -> None:
        """Append one event (times from ``time.perf_counter_ns()``). Never blocks."""
        if self.pend:
            self.flush()
        self._write(kind, direction, peer, tag, nbytes, t_start, t_end, wait, seq, chan, count)

    def _write(self, kind, direction, peer, tag, nbytes, t_start, t_end, wait, seq, chan, count) -> None:
        n = self.n
        if n >= self.cap and not self._grow():
            self.dropped += 1
            return
        _PACK(self.buf, n * _ROW_BYTES, kind, direction, peer, tag, nbytes,
              t_start, t_end, wait, seq, chan, count)
        self.n = n + 1

    def _grow(self) -> bool:
        if self.cap >= self.max_events:
            return False
        new_cap = min(self.cap * 2, self.max_events)
        buf = np.zeros(new_cap * NF, dtype=np.int64)
        buf[: self.cap * NF] = self.buf
        self.buf, self.cap = buf, new_cap
        return True

    def events(self, since: int = 0) -> np.ndarray:
        """This rank's events from index ``since`` as an ``(n, NF)`` int64 view (local clock)."""
        if self.pend:
            self.flush()
        return self.buf[: self.n * NF].reshape(-1, NF)[since:]

    def snapshot(self, since: int = 0) -> np.ndarray:
        """A copy of this rank's recorded rows ``[since, n)`` as an ``(m, NF)`` int64 array (local clock).

        Safe to call from another thread while the owning thread records: it
        writes nothing (no flush, so deferred put/take records appear in a later
        snapshot, after the owner's next flush), reads the row count before the
        buffer (rows below the count are complete, and a buffer grown meanwhile
        holds them too) and copies. Never blocks, never communicates. After a
        concurrent :meth:`clear` the rows may be a mix of old and new events.
        """
        n = self.n
        buf = self.buf
        since = min(max(int(since), 0), n)
        return buf[since * NF: n * NF].reshape(-1, NF).copy()

    def mark(self) -> int:
        """An index to pass as ``since`` later, to gather only what follows (flushes deferred records)."""
        if self.pend:
            self.flush()
        return self.n

    def clear(self) -> None:
        """Forget all recorded events, deferred ones included (local, not collective)."""
        self.pend = 0
        self.n = 0
        self.dropped = 0

    def new_channel_id(self, comm) -> int:
        """Agree on a fresh channel id among the ranks of ``comm`` (collective on ``comm``).

        Used to match sends with receives of the same component in the trace.
        """
        from .runtime import MPI

        mine = np.array([self._next_chan], dtype=np.int64)
        agreed = np.empty(1, dtype=np.int64)
        comm.Allreduce(mine, agreed, op=MPI().MAX)
        self._next_chan = int(agreed[0]) + 1
        return int(agreed[0])

    # -- clocks ------------------------------------------------------------------
    def align_clocks(self, rounds: int = 16) -> None:
        """Estimate this rank's clock offset to rank 0. Collective on ``self.comm``.

        Rank 0 answers ``rounds`` timestamp requests from each rank in turn; each
        rank keeps the sample with the shortest round trip (error <= RTT/2).
        """
        comm = self.comm
        if self.size == 1:
            return
        cbuf = np.zeros(1, dtype=np.int64)
        tag = 31000
        if self.rank == 0:
            for r in range(1, self.size):
                for _ in range(rounds):
                    comm.Recv(cbuf, source=r, tag=tag)
                    cbuf[0] = time.perf_counter_ns()
                    comm.Send(cbuf, dest=r, tag=tag)
        else:
            best_rtt, best_off = None, 0
            for _ in range(rounds):
                t1 = time.perf_counter_ns()
                comm.Send(cbuf, dest=0, tag=tag)
                comm.Recv(cbuf, source=0, tag=tag)
                t2 = time.perf_counter_ns()
                rtt = t2 - t1
                if best_rtt is None or rtt < best_rtt:
                    best_rtt, best_off = rtt, int(cbuf[0]) - (t1 + t2) // 2
            self.offset_ns, self.offset_err_ns = best_off, best_rtt // 2
        comm.Barrier()

    # -- gathering -----------------------------------------------------------------
    def gather(self, root: int = 0, since: int = 0):
        """Collect the events of all ranks (from index ``since``) on ``root``. Collective.

        Returns a :class:`~nbmpi.workers.trace_analysis.Trace` on ``root`` and
        ``None`` elsewhere. Times are shifted onto rank 0's clock. Buffers only,
        no pickling.
        """
        from .trace_analysis import Trace

        comm = self.comm
        ev = np.ascontiguousarray(self.events(since)).copy()
        ev[:, FIELDS.index("t_start")] += self.offset_ns
        ev[:, FIELDS.index("t_end")] += self.offset_ns
        meta = np.array([ev.shape[0], self.dropped, self.offset_err_ns], dtype=np.int64)
        metas = np.empty((self.size, 3), dtype=np.int64) if self.rank == root else None
        comm.Gather(meta, metas, root=root)
        if self.rank == root:
            counts = metas[:, 0] * NF
            allev = np.empty(int(counts.sum()), dtype=np.int64)
            comm.Gatherv(ev.reshape(-1), [allev, counts], root=root)
            ranks = np.repeat(np.arange(self.size, dtype=np.int64), metas[:, 0])
            return Trace(allev.reshape(-1, NF), ranks, self.size, kind_names(),
                         dropped=metas[:, 1].copy(), clock_error_ns=metas[:, 2].copy())
        comm.Gatherv(ev.reshape(-1), None, root=root)
        return None


_TRACER: Optional[Tracer] = None


def get_tracer() -> Tracer:
    """The tracer of this rank; created on first use (on COMM_WORLD, clocks not aligned)
    if :func:`nbmpi.workers.runtime.init` was not called."""
    global _TRACER
    if _TRACER is None:
        from .runtime import tracing_enabled_by_env, world

        _TRACER = Tracer(world(), enabled=tracing_enabled_by_env())
    return _TRACER


def set_tracer(tracer: Tracer) -> None:
    """Make ``tracer`` the one all components record into."""
    global _TRACER
    _TRACER = tracer


def gather_trace(root: int = 0, since: int = 0):
    """Gather every rank's trace to ``root`` (collective on the tracer's communicator).

    One call; returns a :class:`~nbmpi.workers.trace_analysis.Trace` on ``root``,
    ``None`` elsewhere.
    """
    return get_tracer().gather(root=root, since=since)
