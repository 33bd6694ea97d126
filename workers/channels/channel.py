"""In-place array channels (the ArrayChannels.jl model, seed 000).

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
  receive into the second, as the seed describes).
* ``allreduce(op)``: reduce to the first participant, then ``bcast``; the
  result is in every rank's buffer.
* ``bcast(root)``: binomial tree; ``root``'s buffer is copied into all others.
* ``scatter(root, ...)`` / ``gather(root, ...)``: disjoint regions of the
  buffer, given by an axis split or a map rank -> index range (the seed's
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
"""
from __future__ import annotations

import atexit
import os
import time
import warnings
import weakref
import zlib
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..tracing import tracer as _tracing
from ..core import waiting
from ..core.errors import ChannelError, ChannelTimeout
from ..core.kernels import combiner, describe_op
from .shared_memory import NodeSegments
from ..core.runtime import MPI, default_timeout, world

try:
    from . import _node_copy
except ImportError:  # not compiled (no C compiler at install): channels use MPI messages only
    _node_copy = None

__all__ = ["ArrayChannel"]

TAG_PUT, TAG_REDUCE, TAG_BCAST, TAG_SCATTER, TAG_GATHER = 11, 12, 13, 14, 15
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
K_REDUCE = _tracing.register_kind("reduce")
K_BCAST = _tracing.register_kind("bcast")
K_SCATTER = _tracing.register_kind("scatter")
K_GATHER = _tracing.register_kind("gather")
_SEND, _RECV = _tracing.DIR_SEND, _tracing.DIR_RECV
_now = time.perf_counter_ns
_get_tracer = _tracing.get_tracer
_UNSET: Any = object()
_HALF_DONE = "a same-node transfer cannot be undone halfway (the partner may be copying)"
_MAX_DIMS = 8

Box = Tuple[Tuple[int, int], ...]
RegionSpec = Union[slice, range, Tuple[int, int], Tuple[slice, ...]]

_open_channels: "weakref.WeakSet[ArrayChannel]" = weakref.WeakSet()
#: (kernel id, dtype) pairs already compiled and tried once (see ArrayChannel._kernel).
_CHECKED_KERNELS: set = set()


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


class ArrayChannel:
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
        m = MPI()
        ranks = m.Group.Translate_ranks(self._parent.Get_group(), self.participants, other_comm.Get_group())
        return [(-1 if r == m.UNDEFINED else int(r)) for r in ranks]

    def _check_same_everywhere(self) -> None:
        sig = np.zeros(5 + _MAX_DIMS, dtype=np.int64)
        sig[-1] = self._chunk  # compared apart (below): it comes from the environment
        sig[0] = len(self.shape)
        sig[1] = self.dtype.itemsize
        sig[2] = zlib.crc32(self.dtype.str.encode() + repr(self.dtype.descr).encode())
        code = self.dtype.str.encode()  # e.g. b'<f8', shown in the message when it fits
        sig[3] = int.from_bytes(code.ljust(8, b"\0"), "little", signed=True) if len(code) <= 8 else 0
        sig[4: 4 + len(self.shape)] = self.shape
        allsig = np.empty((self._n, sig.size), dtype=np.int64)
        self.comm.Allgather(sig, allsig)
        chunks = allsig[:, -1]
        allsig = allsig[:, :-1]
        if all(np.array_equal(allsig[i], allsig[0]) for i in range(1, self._n)):
            if (chunks != chunks[0]).any():
                raise ChannelError(
                    f"rank {self.rank}: {self.name}: NBMPI_SHM_CHUNK differs between participants (piece sizes "
                    f"{dict(zip(self.participants, chunks.tolist()))} bytes); set it to the same value on every "
                    "rank, or unset it")
            return
        # The reference is the signature most participants used (ties: the lowest rank's),
        # so the message names the rank(s) that differ, identically on every participant.
        keys = [allsig[i].tobytes() for i in range(self._n)]
        ref_key = max(keys, key=lambda k: (keys.count(k), -keys.index(k)))
        ref = allsig[keys.index(ref_key)]
        same = [self.participants[i] for i in range(self._n) if keys[i] == ref_key]
        differ = [i for i in range(self._n) if keys[i] != ref_key]
        detail = "; ".join(f"rank {self.participants[i]} created it with {self._describe_sig(allsig[i])}"
                           for i in differ)
        raise ChannelError(
            f"rank {self.rank}: {self.name} mismatch: {detail}, but rank(s) {same} with "
            f"{self._describe_sig(ref)}; every participant must create the channel with the same "
            "shape and dtype"
        )

    @staticmethod
    def _describe_sig(sig: np.ndarray) -> str:
        nd = int(sig[0])
        code = int(sig[3]).to_bytes(8, "little", signed=True).rstrip(b"\0").decode(errors="replace")
        dtype = f"dtype {np.dtype(code)}" if code else f"a dtype of itemsize {int(sig[1])}"
        return f"shape {tuple(int(s) for s in sig[4:4 + nd])} {dtype}"

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

    # -- traced step helpers for the collective algorithms ---------------------------------
    def _send_step(self, kind: int, tag: int, buf: np.ndarray, role: str, peer: int, timeout, op: str,
                   synchronous: bool = False) -> None:
        key = (role, peer)
        req = self._reqs.get(key)
        if req is None:
            init = self.comm.Ssend_init if synchronous else self.comm.Send_init
            req = self._reqs[key] = init([buf.reshape(-1).view(np.uint8), self._byte_type], peer, tag)
        t0 = _now()
        req.Start()
        self._wait(req, timeout, peer, op, sending=True)
        self._trace_p2p(kind, _SEND, peer, tag, buf.nbytes, t0)

    def _recv_step(self, kind: int, tag: int, buf: np.ndarray, role: str, peer: int, timeout, op: str) -> None:
        key = (role, peer)
        req = self._reqs.get(key)
        if req is None:
            req = self._reqs[key] = self.comm.Recv_init([buf.reshape(-1).view(np.uint8), self._byte_type],
                                                        peer, tag)
        t0 = _now()
        req.Start()
        self._wait(req, timeout, peer, op)
        self._trace_p2p(kind, _RECV, peer, tag, buf.nbytes, t0)

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

    # -- reductions ------------------------------------------------------------------------------
    def _kernel(self, op, opname: str):
        if self.dtype.kind not in "biufc" or self.dtype.fields is not None:
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: dtype {self.dtype} cannot be "
                               "reduced; reductions need a numeric dtype")
        if isinstance(op, str) and op in ("min", "max") and self.dtype.kind == "c":
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: op {op!r} is not defined for "
                               f"complex dtype {self.dtype} (complex numbers are unordered); use 'sum', "
                               "'prod' or a numba.njit function that compares e.g. abs()")
        try:
            kernel = combiner(op)
        except ValueError as exc:
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: {exc}") from None
        key = (id(kernel), self.dtype.str)
        if key not in _CHECKED_KERNELS:
            # Compile and run it on one element BEFORE communicating: a user function that
            # does not type for this dtype fails here on every rank, not mid-tree on some.
            one = np.ones(1, dtype=self.dtype)
            try:
                kernel(np.empty_like(one), one, one.copy())
            except Exception as exc:  # noqa: BLE001 - numba typing/lowering errors
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ChannelError(
                    f"rank {self.rank}: {opname} on {self.name}: op {describe_op(op)!r} cannot combine "
                    f"elements of dtype {self.dtype} ({type(exc).__name__}: {first}); it must be a binary "
                    "function f(a, b) of two scalars of the channel's dtype returning one") from exc
            _CHECKED_KERNELS.add(key)
        return kernel

    def _scratch_bufs(self) -> Tuple[np.ndarray, np.ndarray]:
        if self._scratch is None:
            self._scratch = (np.empty_like(self._flat), np.empty_like(self._flat))
        return self._scratch

    def reduce(self, op: Union[str, Callable] = "sum", root: int = 0,
               timeout: Optional[float] = _UNSET) -> Optional[np.ndarray]:
        """Combine all participants' buffers with ``op`` into ``root``'s buffer, in place.

        Collective over the participants; blocking until this rank's part of
        the binomial tree is done. ``op``: ``'sum'``, ``'prod'``, ``'min'``,
        ``'max'`` or a ``numba.njit`` binary function ``f(a, b) -> value``
        (assumed associative and commutative). Only ``root``'s buffer changes.
        Returns the buffer on ``root``, ``None`` elsewhere.
        """
        opname = f"reduce(op={describe_op(op)}, root={root})"
        self._usable(opname)
        lroot = self._root(root, opname)
        kernel = self._kernel(op, opname)
        self._reduce_tree(kernel, lroot, self._timeout(timeout), opname)
        return self._buffer if self._lrank == lroot else None

    def _reduce_tree(self, kernel, lroot: int, timeout, opname: str) -> None:
        n, me = self._n, self._lrank
        vrank = (me - lroot) % n
        acc_is_buffer = vrank == 0
        have_acc = acc_is_buffer
        acc = self._flat
        mask = 1
        while mask < n:
            if vrank & mask == 0:
                vsrc = vrank | mask
                if vsrc < n:
                    src = (vsrc + lroot) % n
                    acc_s, recv_s = self._scratch_bufs()
                    self._recv_step(K_REDUCE, TAG_REDUCE, recv_s, "reduce-recv", src, timeout, opname)
                    if have_acc:
                        kernel(acc, acc, recv_s)
                    else:
                        kernel(acc_s, self._flat, recv_s)
                        acc, have_acc = acc_s, True
            else:
                dst = ((vrank & ~mask) + lroot) % n
                role = "reduce-send-buf" if acc is self._flat else "reduce-send-acc"
                self._send_step(K_REDUCE, TAG_REDUCE, acc, role, dst, timeout, opname)
                break
            mask <<= 1

    def bcast(self, root: int = 0, timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Copy ``root``'s buffer into every participant's buffer (binomial tree). Collective, blocking.

        Returns this rank's buffer.
        """
        opname = f"bcast(root={root})"
        self._usable(opname)
        self._bcast_tree(self._root(root, opname), self._timeout(timeout), opname)
        return self._buffer

    def _bcast_tree(self, lroot: int, timeout, opname: str) -> None:
        n, me = self._n, self._lrank
        vrank = (me - lroot) % n
        mask = 1
        while mask < n:
            if vrank & mask:
                src = ((vrank - mask) + lroot) % n
                self._recv_step(K_BCAST, TAG_BCAST, self._flat, "bcast-recv", src, timeout, opname)
                break
            mask <<= 1
        mask >>= 1
        while mask > 0:
            if vrank + mask < n:
                dst = ((vrank + mask) + lroot) % n
                self._send_step(K_BCAST, TAG_BCAST, self._flat, "bcast-send", dst, timeout, opname)
            mask >>= 1

    def allreduce(self, op: Union[str, Callable] = "sum", timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Combine all buffers with ``op``; the result is in place in every participant's buffer.

        Collective, blocking. Reduce to the first participant, then bcast.
        """
        opname = f"allreduce(op={describe_op(op)})"
        self._usable(opname)
        kernel = self._kernel(op, opname)
        t = self._timeout(timeout)
        self._reduce_tree(kernel, 0, t, opname)
        self._bcast_tree(0, t, opname)
        return self._buffer

    # -- scatter / gather -------------------------------------------------------------------------
    def regions(self, axis: int = 0, regions: Optional[Union[Mapping[int, RegionSpec],
                                                            Callable[[int], RegionSpec]]] = None
                ) -> Dict[int, Tuple[slice, ...]]:
        """The region (tuple of slices) of each participant for scatter/gather (local, no communication).

        Without ``regions``: ``axis`` is split into nearly equal contiguous
        blocks in participant order (``numpy.array_split`` sizes). With
        ``regions``: a mapping or callable ``rank -> spec``, where spec is a
        slice or ``(start, stop)`` along ``axis``, or a tuple of slices (one per
        dimension). Regions must be in bounds, have step 1 and be disjoint.
        """
        boxes = self._boxes(axis, regions, "regions")
        return {self.participants[i]: tuple(slice(a, b) for a, b in box) for i, box in boxes.items()}

    def _boxes(self, axis: int, regions, opname: str) -> Dict[int, Box]:
        nd = len(self.shape)
        if nd == 0:
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: a 0-d buffer has no regions")
        if not -nd <= axis < nd:
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: axis {axis} out of range "
                               f"for shape {self.shape}")
        axis %= nd
        full = [(0, s) for s in self.shape]
        boxes: Dict[int, Box] = {}
        if regions is None:
            edges = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(self.shape[axis]), self._n)])
            for i in range(self._n):
                b = list(full)
                b[axis] = (int(edges[i]), int(edges[i + 1]))
                boxes[i] = tuple(b)
            return boxes
        getter = regions if callable(regions) else (lambda p: regions.get(p))
        if not callable(regions):
            extra = [p for p in regions if p not in self._local_of]
            if extra:
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: regions given for "
                                   f"non-participants {extra} (participants: {self.participants})")
        for i, p in enumerate(self.participants):
            spec = getter(p)
            if spec is None:
                continue
            boxes[i] = self._box(spec, axis, full, p, opname)
        items = list(boxes.items())
        for x in range(len(items)):
            for y in range(x + 1, len(items)):
                (i, bi), (j, bj) = items[x], items[y]
                if all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(bi, bj)) and \
                        all(a1 > a0 for a0, a1 in bi) and all(b1 > b0 for b0, b1 in bj):
                    raise ChannelError(
                        f"rank {self.rank}: {opname} on {self.name}: regions of ranks {self.participants[i]} "
                        f"{bi} and {self.participants[j]} {bj} overlap; regions must be disjoint")
        return boxes

    def _box(self, spec, axis: int, full: List[Tuple[int, int]], p: int, opname: str) -> Box:
        def one(s, extent: int, dim: int) -> Tuple[int, int]:
            if isinstance(s, range):
                s = slice(s.start, s.stop, s.step)
            if isinstance(s, tuple) and len(s) == 2 and all(isinstance(v, (int, np.integer)) for v in s):
                s = slice(int(s[0]), int(s[1]))
            if not isinstance(s, slice):
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: region of rank {p} is "
                                   f"{spec!r}; expected a slice, range or (start, stop) along the axis, "
                                   "or a tuple of slices")
            if s.step not in (None, 1):
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: region of rank {p} has step "
                                   f"{s.step}; only contiguous ranges (step 1) are supported")
            a = 0 if s.start is None else int(s.start)
            b = extent if s.stop is None else int(s.stop)
            if not 0 <= a <= b <= extent:
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: region of rank {p} "
                                   f"[{a}:{b}] is out of bounds for dimension {dim} of extent {extent}")
            return a, b

        if isinstance(spec, tuple) and spec and all(isinstance(s, slice) for s in spec):
            if len(spec) > len(full):
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: region of rank {p} has "
                                   f"{len(spec)} slices for a {len(full)}-d buffer")
            box = [one(s, full[d][1], d) for d, s in enumerate(spec)] + full[len(spec):]
            return tuple(box)
        box = list(full)
        box[axis] = one(spec, full[axis][1], axis)
        return tuple(box)

    def _region_type(self, box: Box):
        t = self._types.get(box)
        if t is None:
            m = MPI()
            elem = m.BYTE.Create_contiguous(self.dtype.itemsize)
            t = elem.Create_subarray(list(self.shape), [b - a for a, b in box], [a for a, _ in box],
                                     order=m.ORDER_C).Commit()
            elem.Free()
            self._types[box] = t
        return t

    def scatter(self, root: int = 0, axis: int = 0, regions=None,
                timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Send each participant its region of ``root``'s buffer, into the same region of its own buffer.

        Collective over the participants (same ``axis``/``regions`` everywhere),
        blocking: root returns when every region was received. Returns this
        rank's region of its buffer (a view).
        """
        return self._scatter_gather(root, axis, regions, timeout, scatter=True)

    def gather(self, root: int = 0, axis: int = 0, regions=None,
               timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Collect each participant's region of its buffer into the same region of ``root``'s buffer.

        Collective over the participants, blocking. Returns root's whole
        buffer on root and this rank's region elsewhere.
        """
        return self._scatter_gather(root, axis, regions, timeout, scatter=False)

    def _scatter_gather(self, root: int, axis: int, regions, timeout, scatter: bool) -> np.ndarray:
        what = "scatter" if scatter else "gather"
        opname = f"{what}(root={root})"
        self._usable(opname)
        lroot = self._root(root, opname)
        boxes = self._boxes(axis, regions, opname)
        t = self._timeout(timeout)
        kind, tag = (K_SCATTER, TAG_SCATTER) if scatter else (K_GATHER, TAG_GATHER)
        me = self._lrank
        mine = boxes.get(me)
        if me == lroot:
            peers, reqs = [], []
            for i, box in boxes.items():
                if i == me or any(b <= a for a, b in box):
                    continue
                key = (what, i, box)
                dtype = self._region_type(box)
                if scatter:
                    req = self._req(key, lambda: self.comm.Ssend_init([self._bytes, 1, dtype], i, tag))
                else:
                    req = self._req(key, lambda: self.comm.Recv_init([self._bytes, 1, dtype], i, tag))
                peers.append(i)
                reqs.append(req)
            t0 = _now()
            for req in reqs:
                req.Start()
            prev = t0
            direction = _SEND if scatter else _RECV
            for k in waiting.wait_each(reqs, t, self.rank, [self.participants[i] for i in peers], opname,
                                       ChannelTimeout, self._abandoned(opname), cancellable=not scatter):
                i = peers[k]
                nb = int(np.prod([b - a for a, b in boxes[i]])) * self.dtype.itemsize
                t1 = _now()
                self._trace_p2p(kind, direction, i, tag, nb, prev, t1)
                prev = t1
            return self._buffer if not scatter else self._region_view(mine)
        if mine is not None and all(b > a for a, b in mine):
            dtype = self._region_type(mine)
            key = (what, lroot, mine)
            if scatter:
                req = self._req(key, lambda: self.comm.Recv_init([self._bytes, 1, dtype], lroot, tag))
            else:
                req = self._req(key, lambda: self.comm.Ssend_init([self._bytes, 1, dtype], lroot, tag))
            t0 = _now()
            req.Start()
            self._wait(req, t, lroot, opname, sending=not scatter)
            nb = int(np.prod([b - a for a, b in mine])) * self.dtype.itemsize
            self._trace_p2p(kind, _RECV if scatter else _SEND, lroot, tag, nb, t0)
        return self._region_view(mine)

    def _region_view(self, box: Optional[Box]) -> np.ndarray:
        if box is None:
            return self._buffer[tuple(slice(0, 0) for _ in self.shape)]
        return self._buffer[tuple(slice(a, b) for a, b in box)]

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
