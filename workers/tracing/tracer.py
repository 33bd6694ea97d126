"""Per-rank recording of every communication call (the runtime's tracer).

One public recording call, :meth:`Tracer.record`, used by every component
(channels, aggregation, fused reductions). Recording is cheap: each rank owns
one preallocated ``int64`` record buffer (:data:`FIELDS` columns per event,
layout in :mod:`~nbmpi.workers.tracing.records`) and an event is one row written
in C (:mod:`~nbmpi.workers.tracing._tracer_core`, the compiled base of :class:`Tracer`,
tens of ns; compiled components call its C entry directly) or, when that
extension is not built or ``NBMPI_PURE_PYTHON=1``, by one ``struct.pack_into``
call (about 0.2 us); no
Python object is kept per event. The buffer
doubles when full, up to ``max_events`` (then events are counted as dropped,
never silently lost). Tracing can be switched off (``NBMPI_TRACE=0`` or
``Tracer.enabled = False``); components check ``tracer.enabled`` before they
even read the clock.

Times are ``time.perf_counter_ns()`` of the recording rank. :meth:`Tracer.align_clocks`
(collective) estimates each rank's offset to rank 0 (Cristian's method, best
of several round trips), and :meth:`Tracer.gather` ships the records of all
ranks to one root in one call, shifted onto rank 0's clock, as a
:class:`~nbmpi.workers.tracing.analysis.Trace`.

Waiting time: a component records ``wait=-1`` when it cannot know locally how
long it waited for its partner; the gathered :class:`Trace` then derives it by
matching (late sender / late receiver / last arrival at a collective).
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Optional

import numpy as np

from ..core.runtime import MPI, tracing_enabled_by_env, world
from ..core.switches import env_switch
from .analysis import Trace
from .records import DIR_NONE, DIR_RECV, DIR_SEND, FIELDS, NF, kind_names, register_kind

#: Bytes of a rank's host name kept in a gathered trace (longer names are cut).
HOST_BYTES = 64

__all__ = ["Tracer", "get_tracer", "set_tracer", "gather_trace", "register_kind", "kind_names",
           "FIELDS", "NF", "DIR_NONE", "DIR_SEND", "DIR_RECV"]

#: ``PACK(buf, offset, *fields)`` writes one record (what :meth:`Tracer.record` does).
PACK = struct.Struct("<" + "q" * NF).pack_into
ROW_BYTES = 8 * NF
_PACK, _ROW_BYTES = PACK, ROW_BYTES
_T_START, _T_END = FIELDS.index("t_start"), FIELDS.index("t_end")


class _PyTracerCore:
    """The record buffer of a tracer in pure Python: what :mod:`._tracer_core` compiles
    (the base class of :class:`Tracer` when that extension is not built). Same fields,
    same :meth:`record`."""

    __slots__ = ("enabled", "buf", "cap", "n", "dropped", "max_events")

    def record(self, kind: int, direction: int, peer: int, tag: int, nbytes: int,
               t_start: int, t_end: int, wait: int = -1, seq: int = 0, chan: int = 0,
               count: int = 0) -> None:
        """Append one event to this rank's buffer. Local; never blocks, never communicates.

        ``kind`` from :func:`register_kind`; ``direction`` one of ``DIR_NONE`` /
        ``DIR_SEND`` / ``DIR_RECV``; ``peer`` a rank of the tracer's communicator
        (-1: none); ``t_start``/``t_end`` from ``time.perf_counter_ns()`` of this
        rank; ``wait`` ns spent waiting for the partner (-1: unknown, derived when
        the trace is gathered); ``seq`` the message's number for matching (-1:
        by order, see the class docstring); ``chan`` the component's channel id
        (:meth:`new_channel_id`); ``count`` items (aggregation) or variables
        (fused reductions). The caller checks :attr:`enabled` first. When the
        buffer is full it doubles, up to ``max_events``; beyond that the event is
        counted in ``dropped`` (reported by :meth:`gather`), never silently lost.
        """
        n = self.n
        if n >= self.cap and not self._grow():
            self.dropped += 1
            return
        _PACK(self.buf, n * _ROW_BYTES, kind, direction, peer, tag, nbytes, t_start, t_end, wait, seq,
              chan, count)
        self.n = n + 1


#: ``NBMPI_PURE_PYTHON=1`` (the switch of :mod:`~nbmpi.workers.fused_reductions.implementation`)
#: selects the pure-Python record buffer too
_TracerCore = _PyTracerCore
if not env_switch("NBMPI_PURE_PYTHON", default=False):
    try:   # the compiled record buffer (built by pip install with Cython); same fields and record()
        from ._tracer_core import TracerCore as _TracerCore
    except ImportError:   # not built: the pure-Python one
        pass


class Tracer(_TracerCore):  # type: ignore[misc, valid-type]
    """The record buffer of one rank. Create with :func:`nbmpi.workers.init` (or :func:`get_tracer`).

    :meth:`record` is THE way to add an event: runtime components (channels,
    aggregation, fused reductions) call it after each communication call
    completes, having checked :attr:`enabled` first (so a disabled tracer costs
    one attribute read). It never blocks and never communicates. ``seq=-1``
    on a blocking point-to-point event means "match by order": the k-th such
    send from s to d on (chan, tag) matches the k-th receive (MPI's
    non-overtaking rule), which spares the caller a counter. All other
    attributes are the tracer's own; only :attr:`enabled` may be set from
    outside (to switch recording off and on).
    """

    __slots__ = ("comm", "rank", "size", "offset_ns", "offset_err_ns", "_next_chan", "_lock")

    def __init__(self, comm, enabled: bool = True, capacity: int = 1 << 14, max_events: int = 1 << 22):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        #: Record or not. Components check it before they even read the clock.
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

    def _grow(self) -> bool:
        if self.cap >= self.max_events:
            return False
        new_cap = min(self.cap * 2, self.max_events)
        buf = np.zeros(new_cap * NF, dtype=np.int64)
        buf[: self.cap * NF] = self.buf
        self.buf, self.cap = buf, new_cap
        return True

    def events(self, since: int = 0) -> np.ndarray:
        """This rank's events from index ``since`` as an ``(n, NF)`` int64 view (local clock). Local."""
        return self.buf[: self.n * NF].reshape(-1, NF)[since:]

    def snapshot(self, since: int = 0) -> np.ndarray:
        """A copy of this rank's recorded rows ``[since, n)`` as an ``(m, NF)`` int64 array (local clock).

        Safe to call from another thread while the owning thread records: it
        writes nothing, reads the row count before the buffer (rows below the
        count are complete, and a buffer grown meanwhile holds them too) and
        copies. Never blocks, never communicates. After a
        concurrent :meth:`clear` the rows may be a mix of old and new events.
        """
        n = self.n
        buf = self.buf
        since = min(max(int(since), 0), n)
        return buf[since * NF: n * NF].reshape(-1, NF).copy()

    def mark(self) -> int:
        """The number of events recorded so far: an index to pass as ``since`` later. Local."""
        return self.n

    def clear(self) -> None:
        """Forget all recorded events (local, not collective)."""
        self.n = 0
        self.dropped = 0

    def new_channel_id(self, comm) -> int:
        """Agree on a fresh channel id among the ranks of ``comm`` (collective on ``comm``).

        Used to match sends with receives of the same component in the trace.
        """
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

        Returns a :class:`~nbmpi.workers.tracing.analysis.Trace` on ``root`` and
        ``None`` elsewhere. Times are shifted onto rank 0's clock; each rank's host name
        (:data:`HOST_BYTES` at most) names its lane. Buffers only, no pickling.
        """
        comm = self.comm
        host = np.zeros(HOST_BYTES, dtype=np.uint8)
        name = socket.gethostname().encode()[:HOST_BYTES]
        host[:len(name)] = np.frombuffer(name, dtype=np.uint8)
        hosts = np.empty((self.size, HOST_BYTES), dtype=np.uint8) if self.rank == root else None
        comm.Gather(host, hosts, root=root)
        ev = np.ascontiguousarray(self.events(since)).copy()
        ev[:, _T_START] += self.offset_ns
        ev[:, _T_END] += self.offset_ns
        meta = np.array([ev.shape[0], self.dropped, self.offset_err_ns], dtype=np.int64)
        metas = np.empty((self.size, 3), dtype=np.int64) if self.rank == root else None
        comm.Gather(meta, metas, root=root)
        if self.rank == root:
            counts = metas[:, 0] * NF
            allev = np.empty(int(counts.sum()), dtype=np.int64)
            comm.Gatherv(ev.reshape(-1), [allev, counts], root=root)
            ranks = np.repeat(np.arange(self.size, dtype=np.int64), metas[:, 0])
            names = [bytes(h).rstrip(b"\0").decode(errors="replace") for h in hosts]
            return Trace(allev.reshape(-1, NF), ranks, self.size, kind_names(),
                         dropped=metas[:, 1].copy(), clock_error_ns=metas[:, 2].copy(), hosts=names)
        comm.Gatherv(ev.reshape(-1), None, root=root)
        return None


_TRACER: Optional[Tracer] = None


def get_tracer() -> Tracer:
    """The tracer of this rank. Local.

    Created on first use (on COMM_WORLD, clocks not aligned, enabled unless
    ``NBMPI_TRACE=0``) if :func:`nbmpi.workers.init` was not called. Components
    call it per operation rather than keeping the object, since ``init`` may
    replace it.
    """
    global _TRACER
    if _TRACER is None:
        _TRACER = Tracer(world(), enabled=tracing_enabled_by_env())
    return _TRACER


def set_tracer(tracer: Tracer) -> None:
    """Make ``tracer`` the one all components record into (what :func:`nbmpi.workers.init` does). Local."""
    global _TRACER
    _TRACER = tracer


def gather_trace(root: int = 0, since: int = 0):
    """Gather every rank's trace to ``root`` (collective on the tracer's communicator).

    One call; returns a :class:`~nbmpi.workers.tracing.analysis.Trace` on ``root``,
    ``None`` elsewhere.
    """
    return get_tracer().gather(root=root, since=since)
