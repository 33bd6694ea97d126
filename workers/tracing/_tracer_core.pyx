# cython: language_level=3, boundscheck=False, wraparound=False, auto_pickle=False
"""The tracer's record buffer compiled: :meth:`Tracer.record` without the interpreter.

:class:`TracerCore` is the base class of :class:`nbmpi.workers.tracing.tracer.Tracer`
when this module is built (``pip install`` compiles it with Cython; else the
tracer's pure-Python ``record`` with the same semantics runs). It owns the
fields ``record`` writes (``enabled``, ``buf``, ``cap``, ``n``, ``dropped``,
``max_events``); the tracer's Python code owns the rest (growing the buffer,
gathering). Compiled components (the fused-reductions core) cimport it and call
:meth:`TracerCore.record_c`, the C entry of the same public recording call.
"""
from .records import NF as _NF

cdef enum:
    NCOLS = 11    # trace_records.NF (checked at import)

if _NF != NCOLS:
    raise ImportError(f"nbmpi.workers.tracing._tracer_core was compiled for {NCOLS} trace fields, "
                      f"trace_records has {_NF}")


cdef class TracerCore:
    """The record buffer of one rank's tracer (fields set by ``Tracer.__init__``)."""

    @property
    def buf(self):
        """The int64 record buffer (``cap`` rows of ``NF`` columns, C-contiguous, writable)."""
        return self._buf

    @buf.setter
    def buf(self, object b):
        cdef long long[::1] view = b   # int64, C-contiguous, writable (else a ValueError/TypeError)
        self._buf = b
        self._rows = &view[0] if view.shape[0] else NULL
        self._len = view.shape[0]

    cdef int record_c(self, long long kind, long long direction, long long peer, long long tag, long long nbytes,
                      long long t_start, long long t_end, long long wait, long long seq, long long chan,
                      long long count) except -1:
        """:meth:`record` from C (the caller checked ``enabled``); rows past the buffer's
        length are never written (the tracer's ``_grow`` makes room or the event is dropped)."""
        cdef long long n = self.n
        cdef long long *row
        if n >= self.cap or (n + 1) * NCOLS > self._len:
            if not self._grow() or (n + 1) * NCOLS > self._len:
                self.dropped += 1
                return 0
        row = self._rows + n * NCOLS
        row[0] = kind
        row[1] = direction
        row[2] = peer
        row[3] = tag
        row[4] = nbytes
        row[5] = t_start
        row[6] = t_end
        row[7] = wait
        row[8] = seq
        row[9] = chan
        row[10] = count
        self.n = n + 1
        return 0

    def record(self, long long kind, long long direction, long long peer, long long tag, long long nbytes,
               long long t_start, long long t_end, long long wait=-1, long long seq=0, long long chan=0,
               long long count=0):
        """Append one event to this rank's buffer. Local; never blocks, never communicates.

        The fields as in the pure-Python ``tracing._PyTracerCore.record`` (the same
        call): ``kind`` from ``register_kind``; ``direction`` ``DIR_NONE`` /
        ``DIR_SEND`` / ``DIR_RECV``; ``peer`` (-1: none); ``t_start``/``t_end``
        ``time.perf_counter_ns()``; ``wait`` (-1: unknown); ``seq`` (-1: match by
        order); ``chan``; ``count``. Integers (a float raises TypeError). The caller
        checks :attr:`enabled` first. A full buffer doubles (``_grow``) up to
        ``max_events``; beyond that the event is counted in ``dropped``."""
        self.record_c(kind, direction, peer, tag, nbytes, t_start, t_end, wait, seq, chan, count)
