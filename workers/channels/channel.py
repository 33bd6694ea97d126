"""In-place array channels (the ArrayChannels.jl model).

Every participating rank owns ONE persistent buffer (``ch.buffer``) of the
channel's shape and dtype; every operation (put/take, reduce, allreduce,
bcast, scatter, gather) moves data into and out of that same buffer, so the
data a rank works on stays in cache between messages. Nothing is pickled:
transfers are MPI buffer operations on persistent requests that are created
once per (operation, peer) and restarted for each message.

Same-node put/take: a channel of at least ``NBMPI_SHM_MIN_BYTES`` (default 1
byte, i.e. every non-empty channel; ``off`` disables) keeps its buffers in shared memory
(:mod:`nbmpi.workers.channels.shared_memory`). Between two ranks on one node,
``put``/``take`` then move the data with ONE copy instead of MPI's two (sender
-> shared bounce buffer -> receiver), and both ranks copy at once: the lower rank
claims pieces from the front, the higher from the back, so each keeps copying the
same part of both buffers (it stays in its core's cache) and a rank that is
descheduled does not stall the transfer (the running one claims the rest; piece
sizes: see ``_shm_chunk``); the rendezvous is two flags in shared memory
(:mod:`nbmpi.workers.channels._node_copy`, compiled; without it, or without shared
memory, channels use MPI messages: :data:`SAME_NODE_COPY` and
``ch.same_node_how`` say which). ``ch.same_node_peers`` lists the partners
reached this way. Other ranks and all collectives use MPI messages as above.

Semantics (all ranks given as ranks of the channel's ``comm``):

* ``put(dest)`` / ``take(src)``: rendezvous point-to-point. ``put`` is a
  synchronous send (``MPI_Ssend``): it returns once ``dest`` has started the
  matching ``take`` and the buffer may be reused. ``take`` returns when the
  data is in this rank's buffer.
* ``reduce(op, root)``: binomial tree on point-to-point messages. The result
  lands in place in ``root``'s buffer; the other ranks' buffers are NOT
  modified (interior ranks accumulate in the first of two scratch buffers and
  receive into the second, as ArrayChannels.jl does).
* ``allreduce(op)``: reduce to the first participant, then ``bcast``; the
  result is in every rank's buffer.
* ``bcast(root)``: binomial tree; ``root``'s buffer is copied into all others.
* ``scatter(root, ...)`` / ``gather(root, ...)``: disjoint regions of the
  buffer, given by an axis split or a map rank -> index range (ArrayChannels.jl's
  ``dim_map``). After ``scatter`` each rank's region of its buffer equals that
  region of root's; after ``gather`` root's buffer holds every rank's region.
  Non-contiguous regions travel as MPI subarray datatypes (no copies).

Every operation is blocking and collective operations must be called by all
participants in the same order. Blocking waits honour ``timeout=`` (default:
the channel's ``timeout``, else ``NBMPI_TIMEOUT``, else forever) and raise
:class:`~nbmpi.workers.core.errors.ChannelTimeout` naming the waiting rank, the
peer and the operation. They are interruptible (Ctrl-C, Jupyter interrupt):
a pending receive is cancelled (a same-node take that the sender has not
reached is withdrawn) and the channel stays usable. A send cannot be cancelled
(MPICH), nor can a same-node transfer be undone halfway, so a timed-out or
interrupted ``put`` (and a same-node ``take`` caught in the middle of its copy)
makes the channel unusable: further calls raise :class:`ChannelError` saying
why; create a new channel. Same-node transfers check their timeout and Ctrl-C
every 50 ms.

Layout: this module holds the channel (construction, its buffer, checks,
put/take over MPI or shared memory, closing); the collective algorithms are
mixins of :class:`ArrayChannel` in their own modules: :mod:`.collectives`
(reduce, allreduce, bcast) and :mod:`.regions` (scatter, gather, regions).
"""
from __future__ import annotations

import atexit
import os
import time
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..tracing import tracer as _tracing
from ..core import waiting
from ..core import spmd
from ..core.errors import ChannelError, ChannelTimeout
from .shared_memory import NodeSegments
from ..core.runtime import MPI, default_timeout, world
from .collectives import _UNSET, _Collectives
from .regions import _Regions

try:
    from . import _node_copy
except ImportError:  # not compiled (no C compiler at install): channels use MPI messages only
    _node_copy = None

__all__ = ["ArrayChannel"]

TAG_PUT = 11   # reduce/bcast: 12, 13 (.collectives); scatter/gather: 14, 15 (.regions)
#: Channels of at least this many bytes move put/take data through shared memory
#: between ranks of one node (env ``NBMPI_SHM_MIN_BYTES``; ``off`` disables). Measured in
#: benchmarks/pingpong.py: faster than MPI messages from 8 B up (flags instead of a handshake).
SHM_MIN_BYTES_DEFAULT = 1
#: ``"compiled"`` when same-node put/take can use shared memory, else why not.
SAME_NODE_COPY = "compiled" if _node_copy is not None else "off: nbmpi.workers.channels._node_copy is not compiled"
_CONTROL_BYTES = _node_copy.CONTROL_BYTES if _node_copy is not None else 0
#: A same-node transfer works this long per compiled call before Python checks timeout and Ctrl-C.
_SLICE_S = 0.05
#: ... and, while it waits for the partner, polls at most this long between yields of the core.
_SPIN_S = 100e-6
K_PUT = _tracing.register_kind("put")
K_TAKE = _tracing.register_kind("take")
_SEND, _RECV = _tracing.DIR_SEND, _tracing.DIR_RECV
_now = time.perf_counter_ns
_get_tracer = _tracing.get_tracer
_HALF_DONE = "a same-node transfer cannot be undone halfway (the partner may be copying)"
_MAX_DIMS = 8


_open_channels: "weakref.WeakSet[ArrayChannel]" = weakref.WeakSet()


def _close_all() -> None:
    for ch in list(_open_channels):
        ch.close()


atexit.register(_close_all)


def _shm_min_bytes() -> Optional[int]:
    """The size from which put/take use same-node shared memory (None: never)."""
    v = os.environ.get("NBMPI_SHM_MIN_BYTES", "").strip().lower()
    if not v:
        return SHM_MIN_BYTES_DEFAULT
    if v in ("off", "no", "false", "never"):
        return None
    try:
        return max(1, int(v))
    except ValueError:
        raise ChannelError(f"NBMPI_SHM_MIN_BYTES={v!r} is not a byte count; expected an integer "
                           "(e.g. 65536) or 'off'") from None


#: Same-node transfers below this many bytes are copied in one piece (see _shm_chunk).
_SHM_ONE_PIECE_BELOW = 1 << 10
#: ... and up to this many bytes in two (one per rank).
_SHM_TWO_PIECES_MAX = 512 << 10


def _shm_chunk(nbytes: int) -> int:
    """Piece size of a same-node transfer of ``nbytes``.

    The lower rank of the pair claims pieces from the front, the higher one from
    the back (``_node_copy``), so each rank keeps copying the same part of both buffers and
    that part stays in its core's cache. ``NBMPI_SHM_CHUNK`` (bytes) overrides. Default:
    below 1 KiB one piece; up to 512 KiB two pieces split at a cache line (one per rank);
    above, 1/8 of the buffer, from 128 KiB to 1 MiB, a multiple of 4 KiB (a rank that is
    descheduled holds up at most one piece: the running one copies the rest). Measured
    with ``benchmarks/pingpong.py`` on this project's 2-core machine: two pieces against one
    took 1.0 us against 1.1 us one way at 1 KiB and 1.1 against 2.0 at 32 KiB; at 1 MiB two
    pieces and eight were within 10%. Checked to be the same on every participant at channel
    creation.
    """
    v = os.environ.get("NBMPI_SHM_CHUNK", "").strip()
    if v:
        try:
            c = int(v)
        except ValueError:
            c = 0
        if c < 1:
            raise ChannelError(f"NBMPI_SHM_CHUNK={v!r} is not a positive byte count; expected e.g. 65536, "
                               "or unset it")
        return c
    if nbytes < _SHM_ONE_PIECE_BELOW:
        return max(nbytes, 1)
    if nbytes <= _SHM_TWO_PIECES_MAX:
        return (nbytes + 127) // 128 * 64
    return min(max(nbytes // 8, 128 << 10), 1 << 20) & ~4095


def _address(a: np.ndarray) -> int:
    """The address of an array's first byte (``a.ctypes.data`` without importing ctypes' machinery)."""
    return a.__array_interface__["data"][0]


class _Peer:
    """put/take state of one peer: a persistent MPI request, or the same-node transfer (a compiled Pair)."""

    __slots__ = ("req", "pair", "wpeer")

    def __init__(self, req, pair, wpeer: int):
        self.req = req          # MPI persistent request, or None
        self.pair = pair        # _node_copy.Pair, or None
        self.wpeer = wpeer      # the peer's rank in the tracer's communicator


class ArrayChannel(_Collectives, _Regions):
    """A channel whose participants each own one persistent buffer of ``shape`` and ``dtype``.

    Collective constructor: every participant (and only participants) must
    create the channel, with the same ``shape`` and ``dtype``; a mismatch
    raises :class:`ChannelError` on every participant naming the rank that
    differs. ``participants`` are ranks of ``comm`` (default: all ranks of
    ``comm``, default ``COMM_WORLD``). ``timeout`` (seconds) is the default of
    every blocking operation. ``name`` labels errors.
    """

    def __init__(self, shape: Union[int, Sequence[int]], dtype: Any = np.float64,
                 participants: Optional[Iterable[int]] = None, comm: Any = None,
                 timeout: Optional[float] = None, name: Optional[str] = None):
        m = MPI()
        parent = world() if comm is None else comm
        self._parent = parent
        prank, psize = parent.Get_rank(), parent.Get_size()
        shape_t = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        if len(shape_t) > _MAX_DIMS or any(s < 0 for s in shape_t):
            raise ChannelError(f"rank {prank}: ArrayChannel shape {shape_t} is invalid; "
                               f"expected up to {_MAX_DIMS} non-negative extents")
        self.dtype = np.dtype(dtype)
        self.shape = shape_t
        self.name = name or "ArrayChannel"
        if participants is None:
            parts = list(range(psize))
        else:
            parts = sorted({int(p) for p in participants})
            bad = [p for p in parts if not 0 <= p < psize]
            if bad:
                raise ChannelError(f"rank {prank}: {self.name} participants {bad} are not ranks of a "
                                   f"communicator of size {psize}; use ranks 0..{psize - 1}")
        if prank not in parts:
            raise ChannelError(
                f"rank {prank} is not a participant of {self.name} (participants: {parts}); only "
                "participants may create or use the channel. Guard the call with `if rank in participants:`"
            )
        self.participants: List[int] = parts
        if len(parts) == psize:
            self.comm = parent.Dup()
        else:
            self.comm = parent.Create_group(parent.Get_group().Incl(parts), tag=7301)
        self._lrank = self.comm.Get_rank()
        self._n = self.comm.Get_size()
        self._local_of: Dict[int, int] = {p: i for i, p in enumerate(parts)}
        self.rank = prank
        tracer = _get_tracer()
        self._tracer_rank_of = self._translate_to(tracer.comm)
        self.timeout = default_timeout() if timeout is None else float(timeout)
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self._chunk = _shm_chunk(nbytes)
        self._check_same_everywhere()
        self.chan_id = tracer.new_channel_id(self.comm)

        shm_min = _shm_min_bytes()
        want = shm_min is not None and nbytes >= shm_min and _node_copy is not None
        self._segments = NodeSegments(self.comm, nbytes, want=want, header_bytes=self._n * _CONTROL_BYTES)
        if self._segments.enabled:
            self._buffer = self._segments.mine.view(self.dtype).reshape(self.shape)
        else:
            self._buffer = np.zeros(self.shape, dtype=self.dtype)
        if _node_copy is None:
            self.same_node_how = SAME_NODE_COPY
        elif shm_min is None:
            self.same_node_how = "off: NBMPI_SHM_MIN_BYTES=off"
        elif nbytes < shm_min:
            self.same_node_how = f"off: {nbytes} bytes < NBMPI_SHM_MIN_BYTES={shm_min}"
        else:
            self.same_node_how = self._segments.how
        self._token = np.zeros(1, dtype=np.uint8)
        self._flat = self._buffer.reshape(-1)
        self._bytes = self._flat.view(np.uint8)
        self.nbytes = int(self._buffer.nbytes)
        self._scratch: Optional[Tuple[np.ndarray, np.ndarray]] = None
        self._reqs: Dict[tuple, Any] = {}
        self._types: Dict[tuple, Any] = {}
        self._send_seq = [0] * self._n
        self._recv_seq = [0] * self._n
        self._put_peers: Dict[int, _Peer] = {}
        self._take_peers: Dict[int, _Peer] = {}
        self._broken: Optional[str] = None
        self._closed = False
        self._retired: List[Any] = []
        self._byte_type = m.BYTE
        _open_channels.add(self)

    # -- setup helpers ---------------------------------------------------------------
    def _translate_to(self, other_comm) -> List[int]:
        return spmd.translate_ranks(self._parent, self.participants, other_comm)

    def _check_same_everywhere(self) -> None:
        # the piece size is compared apart (below): it comes from the environment
        sig = (self.shape, self.dtype.str, repr(self.dtype.descr))
        diff = spmd.agree(self.comm, (sig, self._chunk), timeout=self.timeout, rank=self.rank,
                          op=f"creating {self.name} (checking that every participant creates it alike)",
                          error=ChannelTimeout)
        if diff is None:
            return
        # The reference is the signature most participants used (ties: the lowest rank's),
        # so the message names the rank(s) that differ, identically on every participant.
        d = spmd.first_difference([[s] for s, _ in diff.items])
        if d is None:
            chunks = [c for _, c in diff.items]
            raise ChannelError(
                f"rank {self.rank}: {self.name}: NBMPI_SHM_CHUNK differs between participants (piece sizes "
                f"{dict(zip(self.participants, chunks))} bytes); set it to the same value on every "
                "rank, or unset it")
        detail = "; ".join(f"rank {self.participants[i]} created it with {self._describe_sig(d.items[i])}"
                           for i in d.differing)
        raise ChannelError(
            f"rank {self.rank}: {self.name} mismatch: {detail}, but rank(s) "
            f"{[self.participants[i] for i in d.agreeing]} with {self._describe_sig(d.reference)}; every "
            "participant must create the channel with the same shape and dtype"
        )

    @staticmethod
    def _describe_sig(sig: tuple) -> str:
        shape, code, descr = sig
        try:
            dtype = f"dtype {np.dtype(code)}"
        except TypeError:
            dtype = f"dtype {descr}"
        return f"shape {tuple(shape)} {dtype}"

    # -- user-facing buffer ------------------------------------------------------------
    @property
    def buffer(self) -> np.ndarray:
        """This rank's persistent buffer (read and write it in place; never rebind it)."""
        return self._buffer

    @buffer.setter
    def buffer(self, value) -> None:
        # ``ch.buffer += 1`` modifies the buffer in place, then assigns the same array back: allowed.
        if value is self._buffer:
            return
        raise ChannelError(f"rank {self.rank}: {self.name}.buffer cannot be replaced (every operation "
                           "reuses this one persistent buffer); write into it instead: "
                           "ch.buffer[...] = value")

    @property
    def same_node_peers(self) -> List[int]:
        """Participants that put/take reach through shared memory (one copy shared by both
        ranks, no MPI message); empty when the channel is below ``NBMPI_SHM_MIN_BYTES``, no
        participant shares this rank's node or shared memory is not available
        (:attr:`same_node_how` says which). Local, no communication."""
        local = self._segments.peer_ranks()
        return [self.participants[i] for i in local]

    def __getitem__(self, idx):
        return self._buffer[idx]

    def __setitem__(self, idx, value) -> None:
        self._buffer[idx] = value

    def __array__(self, dtype=None, copy=None):
        return self._buffer if dtype is None else self._buffer.astype(dtype)

    def fill(self, value) -> None:
        """Fill this rank's buffer with ``value`` (local, no communication)."""
        self._buffer.fill(value)

    def __repr__(self) -> str:
        return (f"ArrayChannel(name={self.name!r}, shape={self.shape}, dtype={self.dtype}, "
                f"participants={self.participants}, rank={self.rank})")

    # -- checks ----------------------------------------------------------------------------
    def _usable(self, op: str) -> None:
        if self._closed:
            raise ChannelError(f"rank {self.rank}: {op} on {self.name} after close(); create a new channel")
        if self._broken:
            raise ChannelError(f"rank {self.rank}: {op} on {self.name}: the channel is unusable because "
                               f"{self._broken}; create a new channel")

    def _peer(self, peer: int, op: str) -> int:
        local = self._local_of.get(peer)
        if local is None:
            raise ChannelError(f"rank {self.rank}: {op} on {self.name}: rank {peer} is not a participant "
                               f"(participants: {self.participants})")
        if local == self._lrank:
            raise ChannelError(f"rank {self.rank}: {op} on {self.name}: a rank cannot {op.split('(')[0]} "
                               "with itself; name another participant")
        return local

    def _root(self, root: int, op: str) -> int:
        local = self._local_of.get(root)
        if local is None:
            raise ChannelError(f"rank {self.rank}: {op} on {self.name}: root {root} is not a participant "
                               f"(participants: {self.participants})")
        return local

    def _timeout(self, timeout) -> Optional[float]:
        return self.timeout if timeout is _UNSET else (None if timeout is None else float(timeout))

    def _abandoned(self, op: str, why: str = "its request could not be cancelled") -> Callable[[], None]:
        def mark() -> None:
            self._broken = f"{op} was abandoned (timeout or interrupt) and {why}"
            self._retire_fast_paths()
        return mark

    def _retire_fast_paths(self) -> None:
        """Route put/take through the checking slow path (after close or breakage)."""
        self._retired.extend(e.req for e in self._put_peers.values() if e.req is not None)
        self._retired.extend(e.req for e in self._take_peers.values() if e.req is not None)
        self._put_peers.clear()
        self._take_peers.clear()

    def _wait(self, req, timeout, local_peer: int, op: str, sending: bool = False) -> None:
        if not req.Test():
            waiting.wait(req, timeout, self.rank, self.participants[local_peer], op,
                         ChannelTimeout, self._abandoned(op), cancellable=not sending)

    def _req(self, key: tuple, make: Callable[[], Any]):
        req = self._reqs.get(key)
        if req is None:
            req = self._reqs[key] = make()
        return req

    # -- point to point -----------------------------------------------------------------------
    # put/take are the latency-critical path: the state for a peer is found with one dict
    # lookup (validation and creation happen on the first miss); the trace record is one
    # Tracer.record call after the operation. A same-node transfer is one compiled call
    # (Pair.start, which also takes the times) that usually completes it; only a transfer still
    # incomplete after _SLICE_S continues in _shm_finish (timeout, Ctrl-C). After an exception
    # (a Ctrl-C arriving between the calls included) _shm_abort decides whether anything is half
    # done: only then the channel is broken.
    def put(self, dest: int, timeout: Optional[float] = _UNSET) -> None:
        """Send this rank's whole buffer to ``dest``'s buffer. Blocking, rendezvous.

        Returns once ``dest`` has matched it with ``take(src=this rank)``; the
        buffer may then be modified. Raises ChannelTimeout after ``timeout`` s.
        """
        try:
            p = self._put_peers[dest]
        except KeyError:
            p = self._p2p_entry(dest, True)
        tr = _get_tracer()
        pair = p.pair
        if pair is not None:
            try:
                if not pair.start(_SLICE_S, _SPIN_S):
                    self._shm_finish(pair, dest, timeout)
            except BaseException:
                self._shm_abort(pair, "put(dest=%d)" % dest)
                raise
            if tr.enabled:
                tr.record(K_PUT, _SEND, p.wpeer, TAG_PUT, self.nbytes, pair.t_start, pair.t_end, -1, -1,
                          self.chan_id)
            return
        traced = tr.enabled
        if traced:
            t0 = _now()
        req = p.req
        req.Start()
        if not req.Test():
            self._block(req, timeout, dest, "put(dest=%d)" % dest, False)
        if traced:
            tr.record(K_PUT, _SEND, p.wpeer, TAG_PUT, self.nbytes, t0, _now(), -1, -1, self.chan_id)

    def take(self, src: int, timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Receive ``src``'s buffer into this rank's buffer, in place. Blocking.

        Returns the buffer. Raises ChannelTimeout after ``timeout`` s.
        """
        try:
            p = self._take_peers[src]
        except KeyError:
            p = self._p2p_entry(src, False)
        tr = _get_tracer()
        pair = p.pair
        if pair is not None:
            try:
                if not pair.start(_SLICE_S, _SPIN_S):
                    self._shm_finish(pair, src, timeout)
            except BaseException:
                self._shm_abort(pair, "take(src=%d)" % src)
                raise
            if tr.enabled:
                tr.record(K_TAKE, _RECV, p.wpeer, TAG_PUT, self.nbytes, pair.t_start, pair.t_end, -1, -1,
                          self.chan_id)
            return self._buffer
        traced = tr.enabled
        if traced:
            t0 = _now()
        req = p.req
        req.Start()
        if not req.Test():
            self._block(req, timeout, src, "take(src=%d)" % src)
        if traced:
            tr.record(K_TAKE, _RECV, p.wpeer, TAG_PUT, self.nbytes, t0, _now(), -1, -1, self.chan_id)
        return self._buffer

    def _p2p_entry(self, other: int, sending: bool) -> _Peer:
        """Slow path of put/take: validate, then create the peer's state once (a persistent MPI
        request, or the same-node transfer)."""
        op = f"put(dest={other})" if sending else f"take(src={other})"
        self._usable(op)
        peer = self._peer(other, op)
        wpeer = self._tracer_rank_of[peer]
        seg = self._segments
        view = seg.peer(peer)
        if view is not None:
            # the control block of the pair (s -> r) is slot s of r's header
            mine, theirs = seg.mine, view
            if sending:
                hdr, slot, src, dst = seg.peer_header(peer), self._lrank, mine, theirs
            else:
                hdr, slot, src, dst = seg.header, peer, theirs, mine
            ctl = hdr[slot * _CONTROL_BYTES:(slot + 1) * _CONTROL_BYTES]
            pair = _node_copy.Pair(_address(ctl), _address(src), _address(dst), self.nbytes, self._chunk,
                                   sending, self._lrank < peer, keep=(ctl, src, dst))
            entry = _Peer(None, pair, wpeer)
        elif sending:
            entry = _Peer(self.comm.Ssend_init([self._bytes, self._byte_type], peer, TAG_PUT), None, wpeer)
        else:
            entry = _Peer(self.comm.Recv_init([self._bytes, self._byte_type], peer, TAG_PUT), None, wpeer)
        (self._put_peers if sending else self._take_peers)[other] = entry
        return entry

    def _shm_finish(self, pair, other: int, timeout) -> None:
        """Go on with a same-node transfer that its first compiled call did not complete: in
        slices of at most ``_SLICE_S``, checking the timeout (and letting Ctrl-C in) between them.

        A take that times out before the sender reached it is withdrawn (the channel stays
        usable, as after a cancelled MPI receive); one the sender has reached gets one more
        timeout period to complete. A put cannot be withdrawn (nor can an MPI synchronous send).
        """
        sending = pair.sender
        op = ("put(dest=%d)" if sending else "take(src=%d)") % other
        t = self._timeout(timeout)
        t0 = time.monotonic()
        deadline = None if t is None else t0 + t
        extended = False
        waiting.current = (op, other, pair.t_start)   # blocked since the operation began
        try:
            while True:
                budget = _SLICE_S
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        if not sending and not extended and not pair.withdraw():
                            extended = True          # the sender is on it: let it finish
                            deadline += max(t, 1.0)
                            continue
                        raise ChannelTimeout(self.rank, other, op, time.monotonic() - t0)
                    budget = min(budget, left)
                if pair.resume(budget, _SPIN_S):
                    return
        finally:
            waiting.current = None

    def _shm_abort(self, pair, op: str) -> None:
        """After an exception in a same-node put/take (timeout, Ctrl-C): nothing to do if the transfer
        completed or never took place (a take is withdrawn if it can be); else the channel is unusable."""
        if pair.completed() or pair.withdraw():
            return
        self._abandoned(op, _HALF_DONE)()

    def _block(self, req, timeout, other: int, op: str, cancellable: bool = True) -> None:
        waiting.wait(req, self._timeout(timeout), self.rank, other, op, ChannelTimeout, self._abandoned(op),
                     cancellable=cancellable)

    # -- one trace event per step of the collectives (.collectives, .regions) ----------------------
    def _trace_p2p(self, kind: int, direction: int, peer: int, tag: int, nbytes: int, t0: int,
                   t1: Optional[int] = None) -> None:
        tr = _get_tracer()
        if not tr.enabled:
            return
        seqs = self._send_seq if direction == _SEND else self._recv_seq
        seq = seqs[peer]
        seqs[peer] = seq + 1
        tr.record(kind, direction, self._tracer_rank_of[peer], tag, nbytes, t0,
                  _now() if t1 is None else t1, -1, seq, self.chan_id)

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the persistent requests, datatypes and communicator (local). Idempotent.

        Must not be called while an operation is in progress. The buffer stays
        readable; further communication raises ChannelError.
        """
        if self._closed:
            return
        self._closed = True
        _open_channels.discard(self)
        try:
            from mpi4py import MPI as m

            if m.Is_finalized():
                return
            self._retire_fast_paths()
            reqs = list(self._reqs.values()) + self._retired
            for r in reqs:
                try:
                    if r.Test():
                        r.Free()
                except Exception:  # noqa: BLE001 - freeing is best effort at teardown
                    pass
            for t in self._types.values():
                t.Free()
            self._segments.close()
            try:
                self.comm.Free()
            except m.Exception as exc:
                # MPICH refuses to free a communicator holding unreceived messages, e.g. the
                # handshake of a partner's abandoned (timed-out) operation. Leak it, say so.
                warnings.warn(f"rank {self.rank}: {self.name}.close() left its communicator allocated: "
                              f"{str(exc).splitlines()[-1].strip()} (a partner abandoned an operation "
                              "on this channel)", RuntimeWarning, stacklevel=2)
        finally:
            self._reqs.clear()
            self._types.clear()

    def __enter__(self) -> "ArrayChannel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
