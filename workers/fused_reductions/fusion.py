"""The fuser: one collective per force point, on persistent requests.

:class:`Fuser` (one per process, :func:`fuser`) owns everything
pending (the current :class:`~.pending._Batch`) and resolves it at a force
point (:meth:`Fuser.flush`) with ONE collective on a private duplicate
of ``COMM_WORLD``: all segments packed into one buffer of 8-byte words after
the signature header (:mod:`.wire`), padded to a size class and reduced in
place by a persistent ``MPI_Allreduce_init`` request made once per size class
(``MPI_SUM`` when only float64 sums are pending, else a user-defined operation
whose combining function is a numba kernel). The wait is interruptible and has
a timeout; while it waits it watches the peers' size boards (:mod:`.boards`),
and any failure goes through the divergence diagnosis (:mod:`.diagnosis`).

:func:`flush`, :func:`fused` and :func:`configure` are the user-facing controls.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import time
from typing import Any, Callable, Dict, Iterator, Optional

import numpy as np

from ..tracing import tracer as _tracing
from ..core import waiting
from ..core.errors import CommTimeout, NbmpiError, SharedVariableError, SPMDDivergence
from ..core.kernels import LAYOUT_FIXED, combine_words, combine_words_mpi_address
from ..core.runtime import MPI, default_timeout, world
from ..core.switches import env_switch
from ..tracing.tracer import DIR_NONE, get_tracer
from .boards import SizeBoards, _SizeMismatch
from .diagnosis import _compare, _decode_log, _first_difference, _size_note, exchange_logs
from .implementation import DIRECT_MPI_ENV, direct_mpi
from .implementation import core as _core
from .pending import _EMPTY, _Batch
from .wire import (HEADER, W_C16, W_I8, _size_class, _same_signature, _STRUCT_MAX, _WORDS, _words,
                   layout_words, signature_words)

K_FUSED = _tracing.register_kind("fused_allreduce")
THRESHOLD_ENV = "NBMPI_FUSE_THRESHOLD"
DEFAULT_THRESHOLD_BYTES = 1 << 20
_SPIN = 64   # Test polls of a force point before the (slower to enter) interruptible wait (compiled: at least
             # these, and for up to 50 us: a partner a few microseconds late is common)


def _user_combine(inbuf, inoutbuf, datatype) -> None:
    """Combining function of the user-defined MPI op of the pure-Python implementation:
    the compiled kernel on copy-free int64 views of MPI's buffers (whose layout record
    says what each word is). The compiled implementation gives MPI the same kernel as a C
    function instead (:func:`~nbmpi.workers.core.kernels.combine_words_mpi_address`)."""
    combine_words(np.frombuffer(inbuf, np.int64), np.frombuffer(inoutbuf, np.int64))


class Fuser:
    """Pending contributions of this rank and the one-collective resolution.

    One fuser per process (:func:`fuser`) serves every shared variable; its
    communicator is a duplicate of ``COMM_WORLD`` made at the first force
    point (``MPI_Comm_idup``, so even that wait can time out).
    """

    def __init__(self) -> None:
        self.next_id = 0
        self.comm = None
        self.diag = None
        self.rank = -1
        self.size = 0
        self.chan = 0
        self.seq = 0
        self.timeout = default_timeout()
        raw = os.environ.get(THRESHOLD_ENV, "").strip()
        nbytes = DEFAULT_THRESHOLD_BYTES
        if raw:
            try:
                nbytes = int(float(raw))
            except ValueError:
                raise ValueError(f"{THRESHOLD_ENV}={raw!r} is not a number of bytes; set e.g. 1048576 "
                                 "or unset it") from None
        self.threshold_words = max(HEADER + 1, nbytes // 8)
        self.batch = _Batch(self.threshold_words)
        self._buf = np.zeros(256, dtype=np.float64)
        self._types: Dict[int, Any] = {}
        self._preq: Dict[Any, Any] = {}   # words (MPI_SUM) or (words, False) -> persistent Allreduce_init request
        self._op = None
        self._broken: Optional[str] = None
        self._diag_broken = False
        self._boards: Optional[SizeBoards] = None   # the size boards (RMA window on ``diag``)
        self._strict = 0
        self._ready = False   # connected, not broken, not inside fused(strict=True): the fast flush may run
        self._mpi = None
        #: the compiled force point calls ``MPI_Start``/``MPI_Test`` directly (set at the
        #: first force point; False: through mpi4py, or the pure-Python implementation)
        self.direct_mpi = False
        #: the MPI operation of general fusions combines in C (a numba ``cfunc`` given to
        #: MPI by the compiled glue; set at the first general fusion); False: a Python callback
        self.compiled_op = False
        self._sync_core()

    if _core is not None:
        # counters and flags the compiled hot path reads and writes live in the extension
        next_id = property(lambda self: _core.state.next_id, lambda self, v: setattr(_core.state, "next_id", v),
                           doc="Id of the next shared variable (creation order identifies variables).")
        seq = property(lambda self: _core.state.seq, lambda self, v: setattr(_core.state, "seq", v),
                       doc="Number of fused collectives run so far (local).")
        _ready = property(lambda self: _core.state.ready, lambda self, v: setattr(_core.state, "ready", v),
                          doc="Connected, not broken, not in fused(strict=True): the fast force point may run.")

    def _sync_core(self) -> None:
        """Give the compiled force point the buffer, requests, threshold and communicator facts."""
        if _core is not None:
            _core.state.sync(self._buf, self._preq, self.threshold_words, self.chan, max(self.size, 1))

    @property
    def batch(self) -> "_Batch":
        """The pending contributions (the current fusion)."""
        return self._batch

    @batch.setter
    def batch(self, b: "_Batch") -> None:
        self._batch = b

    if _core is not None:
        # the compiled hot path appends to the current batch and starts the next one itself
        batch = property(lambda self: _core.state.batch, lambda self, b: setattr(_core.state, "batch", b),  # noqa: F811
                         doc="The pending contributions (the current fusion).")

    # -- setup ----------------------------------------------------------------
    def _connect(self) -> None:
        m = MPI()
        w = world()
        self.rank = w.Get_rank()
        comm, req = w.Idup()
        waiting.wait(req, self.timeout, self.rank, None, "fused reductions: first force point (Comm_idup)",
                     CommTimeout, self._abandoned("Comm_idup"), cancellable=False)
        self.comm = comm
        self.size = comm.Get_size()
        # a second duplicate for the divergence diagnosis only: it still works when the
        # ranks' fused collectives did not match (different sizes) and one is left pending
        diag, req = w.Idup()
        waiting.wait(req, self.timeout, self.rank, None, "fused reductions: first force point (Comm_idup)",
                     CommTimeout, self._abandoned("Comm_idup"), cancellable=False)
        self.diag = diag
        self._boards = SizeBoards.open(diag, self.rank, self.size, self.timeout, self._abandoned("size boards"))
        if self._boards is not None:   # registered after mpi4py's exit handler: runs before MPI_Finalize
            atexit.register(self._close_boards)
        self.chan = _tracing.get_tracer().new_channel_id(comm)
        self._mpi = m
        self._sync_core()
        if _core is not None:
            # the compiled force point calls MPI_Start/MPI_Test itself (no Python call per poll)
            glue = direct_mpi()
            self.direct_mpi = glue is not None and env_switch(DIRECT_MPI_ENV)
            _core.state.runner = glue.DirectRunner() if self.direct_mpi else None
        self._ready = not self._strict

    def _close_boards(self) -> None:
        """At exit (every rank): free the size boards' RMA window before ``MPI_Finalize`` if no rank's fuser
        was abandoned (:meth:`SizeBoards.close`), waiting at most 10 s (less with a shorter timeout) for the
        other ranks to exit too."""
        if self._boards is not None:
            self._boards.close(self._broken is None and not self._diag_broken, min(self.timeout or 10.0, 10.0))

    def _abandoned(self, what: str) -> Callable[[], None]:
        def mark() -> None:
            self._ready = False
            self._broken = (f"the fused collective ({what}) was abandoned by a timeout or interrupt while "
                            "other ranks may still be in it")
        return mark

    @property
    def collectives(self) -> int:
        """Number of fused collectives this fuser has run (local)."""
        return self.seq

    @property
    def compiled_collectives(self) -> int:
        """How many of them the compiled force point ran (the others took the Python
        path, e.g. the first fusion of each buffer size, or other ops than float64
        sums); 0 with the pure-Python implementation. Local."""
        return _core.state.compiled_fusions if _core is not None else 0

    def _run(self, req, b: _Batch, words: int) -> None:
        """Start the persistent collective ``req`` of batch ``b`` and return when it is
        done: a few ``Test`` polls, then :meth:`_wait` (interruptible, with the timeout)."""
        req.Start()
        test = req.Test
        for _ in range(_SPIN + 1):
            if test():
                return
        self._wait(req, b, words)

    def _wait(self, req, b: _Batch, words: int) -> None:
        """The force point's collective is not done after a few polls: the interruptible
        wait with the timeout (a timeout or interrupt leaves the fuser unusable).

        While waiting it watches the peers' size boards (:meth:`SizeBoards.watch`). On a size
        mismatch found there, a timeout or an MPI error the ranks' sequences are compared
        over the diagnosis communicator: if they differ (typically in size, so MPI could
        not match the collective) the error is :class:`SPMDDivergence` naming the first
        difference, otherwise the original error."""
        seq = self.seq
        check = None if self._boards is None else self._boards.watch(seq, words)
        try:
            waiting.wait(req, self.timeout, self.rank, None,
                         f"fused reduction #{seq} of {b.nvars} shared variable(s)", CommTimeout,
                         self._abandoned(f"#{seq}"), cancellable=False, check=check)
        except (CommTimeout, _SizeMismatch, self._mpi.Exception) as exc:
            self._abandoned(f"#{seq}")()
            err = self._failed(b, words, exc)
            if err is exc:
                raise
            raise err from exc

    def _fuse_failed(self, b: _Batch, words: int, exc: BaseException) -> BaseException:
        """What the hot path's force point raises for ``exc`` (also the compiled one's):
        an MPI error (e.g. truncation: the ranks passed different sizes) is diagnosed
        unless ``_wait`` already did; the batch keeps the error for its readers."""
        err = exc
        if isinstance(exc, self._mpi.Exception) and not self._broken:
            self._abandoned(f"#{self.seq}")()
            err = self._failed(b, words, exc)
        b.error = err
        return err

    def _failed(self, b: _Batch, words: int, exc: BaseException) -> BaseException:
        """Error of a fused collective that did not complete on this rank."""
        self._publish(self.seq, words)
        t = self.timeout
        logs = self._exchange_logs(b, words, None if t is None else min(t, 10.0) + 5.0)
        detail = None if logs is None else _compare(logs)
        if detail is None and isinstance(exc, _SizeMismatch):   # proof enough, even without the logs
            self._broken = "the ranks' fused collectives had different sizes (an SPMD divergence)"
            return SPMDDivergence(self.rank, f"fused reduction #{self.seq}",
                                  f"{exc}; the other ranks did not report their sequences in time, so the "
                                  "first difference cannot be named")
        if detail is None:
            if isinstance(exc, self._mpi.Exception) and hasattr(exc, "add_note"):
                exc.add_note(f"rank {self.rank}: in fused reduction #{self.seq} of {b.nvars} shared variable(s) "
                             "(a force point); shared variables are unusable now: restart the program")
            return exc
        return SPMDDivergence(self.rank, f"fused reduction #{self.seq}", detail + _size_note(logs))

    def _grow(self, words: int) -> None:
        """A larger fusion buffer; the persistent requests bound to the old one are freed."""
        for req in self._preq.values():
            req.Free()
        self._preq.clear()
        self._buf = np.zeros(max(words, 2 * self._buf.size), dtype=np.float64)
        self._sync_core()

    def _persistent(self, words: int, allsum: bool):
        """The persistent ``MPI_Allreduce_init`` request reducing ``words`` words of the
        fusion buffer in place (``MPI_SUM`` on doubles, or the compiled op on one
        contiguous datatype). Made once per size class: a force point then costs
        ``Start`` + ``Test`` instead of building a nonblocking schedule each time."""
        m = self._mpi
        fb = self._buf
        if allsum:
            req = self.comm.Allreduce_init(m.IN_PLACE, [fb, words, m.DOUBLE], op=m.SUM)
        else:
            req = self.comm.Allreduce_init(m.IN_PLACE, [fb, 1, self._dtype(words)], op=self._op or self._make_op())
        self._preq[words if allsum else (words, False)] = req
        return req

    def _make_op(self):
        """The commutative MPI operation of general fusions: :func:`~nbmpi.workers.core.kernels.combine_words`
        as a C function given to ``MPI_Op_create`` by the compiled glue, else (pure Python,
        or no glue) the same kernel behind a Python callback (``MPI.Op.Create``)."""
        glue = direct_mpi()
        if glue is not None:
            self._op = glue.op_create(combine_words_mpi_address(), True)
            self.compiled_op = True
        else:
            self._op = self._mpi.Op.Create(_user_combine, commute=True)
        return self._op

    def _dtype(self, words: int):
        t = self._types.get(words)
        if t is None:
            t = self._types[words] = MPI().INT64_T.Create_contiguous(words).Commit()
        return t

    # -- resolution --------------------------------------------------------------
    def pending(self) -> int:
        """Number of pending segments (contributions not yet communicated). Local."""
        return self.batch.segments()

    def flush(self) -> int:
        """Resolve every pending contribution with one collective call; return
        the number of variables resolved (0: nothing pending, no communication)."""
        b = self.batch
        f8 = b.f8
        n1 = len(f8)
        if b.nseg == 0:
            if n1 == HEADER:
                return 0
            if self._ready and b.allsum:
                # the hot path: only float64 scalar sums pending -> MPI_SUM on the preallocated
                # buffer through a persistent request, signature words in the same buffer
                # (the compiled version does the same steps; None: no request/buffer of this size yet)
                if _core is not None:
                    nv = _core.fuse(self, b)
                    if nv is not None:
                        return nv
                self.batch = _Batch(self.threshold_words)
                try:
                    L = 16 if n1 <= 16 else _size_class(n1)
                    fb = self._buf
                    if fb.size < L:
                        self._grow(L)
                        fb = self._buf
                    f8[:4] = signature_words(hash((b.sig, L, tuple(b.log))))
                    # words n1..L-1 are padding: summed, never read
                    if _core is not None:
                        st = _core
                        _core.pack(f8, fb)
                    elif n1 <= _STRUCT_MAX:
                        st = _WORDS.get(n1) or _words(n1)
                        st.pack_into(fb, 0, *f8)
                    else:
                        st = None
                        fb[:n1] = f8
                    req = self._preq.get(L) or self._persistent(L, True)
                    t0 = time.perf_counter_ns()
                    self._run(req, b, L)
                    t1 = time.perf_counter_ns()
                    seq = self.seq
                    self.seq = seq + 1
                    tr = get_tracer()
                    if tr.enabled:
                        tr.record(K_FUSED, DIR_NONE, -1, 0, L * 8, t0, t1, -1, seq, self.chan, b.nvars)
                    if st is not None and st is _core:
                        res = _core.unpack(fb, n1)
                    else:
                        res = st.unpack_from(fb) if st is not None else fb[:n1].tolist()
                    P = self.size
                    if P > 64 or P * res[1] != res[0] * res[0] or P * res[3] != res[2] * res[2]:
                        if not _same_signature(P, res):
                            raise self._divergence(b, L)
                    b.res = (res, _EMPTY, _EMPTY)
                    b.done = True
                except BaseException as exc:
                    err = self._fuse_failed(b, L, exc)
                    if err is exc:
                        raise
                    raise err from exc
                return b.nvars
        if self._strict:
            raise SharedVariableError(
                f"rank {self.rank if self.rank >= 0 else world().Get_rank()}: a force point (a shared value "
                "was read or flushed) inside `with fused(strict=True)`; read shared values after the block")
        if self._broken:
            raise NbmpiError(f"rank {self.rank}: shared variables are unusable: {self._broken}; restart the "
                             "program (all ranks)")
        if self.comm is None:
            self._connect()
        if _core is not None and self._ready:
            nv = _core.fuse_general(self, b)   # the same steps in C (None: no request of this size yet)
            if nv is not None:
                return nv
        self.batch = _Batch(self.threshold_words)
        try:
            self._reduce(b)
        except BaseException as exc:
            b.error = exc
            raise
        return b.nvars

    def _reduce(self, b: _Batch) -> None:
        """The general force point (any ops, dtypes and shapes): pack everything into the
        fusion buffer, one collective, unpack ``b.res``. Only float64 sums (and consumes):
        ``MPI_SUM``; otherwise the buffer carries a layout record after the header (the op
        of every scalar word, the segments; :mod:`.wire`) and the user-defined operation's
        kernel combines each word with its op."""
        n1, n2 = len(b.f8), len(b.i8)
        nf = n1 - HEADER                                  # float64 scalar words
        allsum = b.allsum
        nlay = 0 if allsum else layout_words(nf, n2, len(b.arrs))
        d = HEADER + nlay                                 # where the scalar words start
        words = n1 + nlay + b.words
        L = 16 if words <= 16 else _size_class(words)
        if self._buf.size < L:
            self._grow(L)
        places = self._pack_general(b, L, d, nlay)
        req = self._preq.get(L if allsum else (L, False))
        if req is None:
            req = self._persistent(L, allsum)
        t0 = time.perf_counter_ns()
        try:
            self._run(req, b, L)
        except self._mpi.Exception as exc:   # e.g. truncation: the ranks passed different sizes
            if self._broken:   # already diagnosed (by _wait)
                raise
            self._abandoned(f"#{self.seq}")()
            err = self._failed(b, L, exc)
            if err is exc:
                raise
            raise err from exc
        t1 = time.perf_counter_ns()
        seq = self.seq
        self.seq = seq + 1
        tr = get_tracer()
        if tr.enabled:
            tr.record(K_FUSED, DIR_NONE, -1, 0 if allsum else 1, L * 8, t0, t1, -1, seq, self.chan, b.nvars)
        fb = self._buf
        if allsum:
            res = fb[:n1].tolist()
        else:
            res = fb[:d + nf].tolist()
            del res[HEADER:d]                             # indices as in b.f8
        if not _same_signature(self.size, res):
            raise self._divergence(b, L)
        ib = fb.view(np.int64)
        b.res = (res, ib[d + nf:d + nf + n2].tolist() if n2 else [], self._segment_results(places))
        b.done = True

    def _pack_general(self, b: _Batch, L: int, d: int, nlay: int) -> list:
        """Fill the fusion buffer for :meth:`_reduce`: the signature words, the layout record
        (``nlay`` words; 0: ``MPI_SUM``, none), the float64 words from word ``d``, the int64
        words, the array segments, zero padding up to ``L``. Returns each segment's
        ``(start, words, kind)``."""
        f8, arrs, allsum = b.f8, b.arrs, b.allsum
        n1, n2, nf = len(f8), len(b.i8), len(f8) - HEADER
        fb = self._buf
        ib = fb.view(np.int64)
        f8[:HEADER] = signature_words(hash((b.sig, L, tuple(b.log))))
        if allsum:
            fb[:n1] = f8
        else:
            fb[:HEADER] = f8[:HEADER]
            fb[d:d + nf] = f8[HEADER:]
            nops = (nf + n2 + 7) // 8
            ib[HEADER:HEADER + LAYOUT_FIXED] = (nlay, L, nf, n2, len(arrs))
            ops = ib[HEADER + LAYOUT_FIXED:HEADER + LAYOUT_FIXED + nops]
            ops[:] = 0
            opb = ops.view(np.int8)
            for i, op in b.f8_nonsum.items():
                opb[i - HEADER] = op
            if n2:
                opb[nf:nf + n2] = b.i8_ops
            segs = ib[HEADER + LAYOUT_FIXED + nops:d].reshape(-1, 4)
        pos = d + nf
        if n2:
            ib[pos:pos + n2] = b.i8
            pos += n2
        places = []
        for s, (acc, op, kind) in enumerate(arrs):
            w = acc.size * (2 if kind == W_C16 else 1)
            if kind == W_I8:
                ib[pos:pos + w] = acc
            else:
                fb[pos:pos + w] = acc.view(np.float64)
            if not allsum:
                segs[s] = (pos, w, op, kind)
            places.append((pos, w, kind))
            pos += w
        if pos < L:
            fb[pos:L] = 0.0
        return places

    def _segment_results(self, places: list) -> list:
        """Copies of the reduced array segments at ``places`` (from :meth:`_pack_general`),
        each in its working dtype."""
        fb = self._buf
        out = []
        for st, w, kind in places:
            if kind == W_I8:
                out.append(fb.view(np.int64)[st:st + w].copy())
            elif kind == W_C16:
                out.append(fb[st:st + w].copy().view(np.complex128))
            else:
                out.append(fb[st:st + w].copy())
        return out

    def _divergence(self, b: _Batch, words: int) -> SPMDDivergence:
        """Error path after a completed collective whose signatures differ: exchange the
        sequence logs, name the first difference (the same text on every rank). Waits
        long enough for ranks whose own collective could not complete to time out and
        join (see :meth:`_failed`)."""
        self._publish(self.seq - 1, words)   # ranks stuck in this collective compare sizes with it
        t = self.timeout
        logs = self._exchange_logs(b, words, None if t is None else 2.0 * t + 10.0)
        op = f"fused reduction #{self.seq - 1}"
        if logs is None:
            return SPMDDivergence(self.rank, op, "the signatures differ; the other ranks did not report their "
                                  "sequences in time, so the difference cannot be named")
        detail = _compare(logs) or _first_difference([lg for lg, _, _ in logs], logs[0][1] > 0)
        note = _size_note(logs)
        if note:
            self._ready = False
            self._broken = "the ranks' fused collectives had different sizes (an SPMD divergence)"
        return SPMDDivergence(self.rank, op, detail + note)

    def _exchange_logs(self, b: _Batch, words: int, timeout: Optional[float]) -> Optional[list]:
        """Every rank's ``(steps, folded, words)`` over the diagnosis communicator
        (error paths only); None if that exchange timed out (then never tried again)."""
        if self.diag is None or self._diag_broken:
            return None
        logs = exchange_logs(self.diag, self.rank, self.size, _decode_log(b.log, b.kmap), b.folded, words,
                             timeout)
        if logs is None:
            self._diag_broken = True
        return logs

    def _publish(self, seq: int, words: int) -> None:
        """This rank's size board says it is in (or diagnosing) collective #seq with ``words``."""
        if self._boards is not None:
            self._boards.publish(seq, words)
_FUSER: Optional[Fuser] = None


def fuser() -> Fuser:
    """This process's fuser (created on first use, no communication)."""
    global _FUSER
    if _FUSER is None:
        _FUSER = Fuser()
        if _core is not None:
            _core.state.fuser = _FUSER
    return _FUSER


def flush() -> int:
    """Force point: resolve all pending contributions now, in one collective call.

    Collective (every rank, same program point), blocking. Returns the number
    of variables resolved (0 and no communication if nothing is pending).
    """
    return fuser().flush()


@contextlib.contextmanager
def fused(strict: bool = False) -> Iterator[Fuser]:
    """Block whose contributions are resolved together when it ends (one collective).

    Leaving the block is a force point (collective; skipped if the block
    raised). With ``strict=True`` any force point inside the block (reading a
    shared value, ``flush()``, the size threshold) raises
    :class:`SharedVariableError`, which guarantees at most one collective for
    the block.
    """
    e = fuser()
    if strict:
        e._strict += 1
        e._ready = False
    try:
        yield e
    finally:
        if strict:
            e._strict -= 1
            e._ready = e.comm is not None and not e._strict and not e._broken
    e.flush()


def configure(threshold_bytes: Optional[int] = None, timeout: Any = ...) -> None:
    """Set the size threshold (pending bytes that force a flush early) and/or the
    timeout (seconds, ``None`` = forever) of force points. Local, but every
    rank must use the same threshold (it decides where collectives happen)."""
    e = fuser()
    if threshold_bytes is not None:
        if int(threshold_bytes) < 8:
            raise ValueError(f"threshold_bytes={threshold_bytes} is too small; expected at least 8 bytes")
        e.threshold_words = max(HEADER + 1, int(threshold_bytes) // 8)
        e._sync_core()
        e.batch.room = e.threshold_words - 1 - e.batch.words
    if timeout is not ...:
        e.timeout = None if timeout is None else float(timeout)


