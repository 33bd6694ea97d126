"""What every per-rank plan of a flush is made of: messages, their parts, buffers and persistent requests.

A plan says, for one operation on this rank, which rows it computes, which remote rows it
receives from whom, what it sends, and its blocks of work. Each operation's own plan lives
with its cache key and its lowering in :mod:`~.operations`; this module holds what they share.

Every rank knows every distribution, so each rank derives its own part of the plan from the
recorded task alone, without asking anyone (DistNumPy's "global knowledge of the data
distribution"). A plan depends only on layouts (distributions, views, dtypes, shapes) and on
the program's shape, never on values or array identities, so the plan of a time step is
found in the context's cache at the next step and nothing is recomputed.

Transfers are aggregated: per task, each rank sends at most ONE message to each peer,
holding every row that peer needs from it (for every operand), packed into a pre-allocated
buffer; the receiver gets it into a pre-allocated buffer on a persistent request
(``Recv_init``/``Send_init``, restarted every time the plan is used). Nothing is pickled.
The buffers and requests belong to a plan :class:`Instance`; a plan used twice in one flush
gets a second instance. Tags are allocated in plan-creation order, identical on every rank.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..core import runtime
from .indexing import _slice_of

__all__ = ["PartSpec", "MsgSpec", "Instance", "arena_layout", "Plan", "ap_of", "selector", "segments",
           "my_rows"]

_MPI: Any = None


def _mpi() -> Any:
    """The ``mpi4py.MPI`` module (:func:`~..core.runtime.MPI`, looked up once per process)."""
    global _MPI
    if _MPI is None:
        _MPI = runtime.MPI()
    return _MPI


def _align8(n: int) -> int:
    return (n + 7) & ~7


def ap_of(seq: np.ndarray) -> Optional[Tuple[int, int]]:
    """``(start, step)`` if ``seq`` is an arithmetic progression (a single item has step 1), else None."""
    m = len(seq)
    if m == 0:
        return (0, 1)
    if m == 1:
        return (int(seq[0]), 1)
    d = int(seq[1]) - int(seq[0])
    if d == 0:
        return None
    if m == 2 or bool(np.all(np.diff(seq) == d)):
        return (int(seq[0]), d)
    return None


def selector(seq: np.ndarray) -> Any:
    """A basic slice for an arithmetic progression of indices, else the index array itself."""
    ap = ap_of(seq)
    if ap is None:
        return np.asarray(seq, dtype=np.int64)
    return _slice_of(ap[0], ap[1], len(seq))


def hull(seq: np.ndarray) -> Tuple[int, int]:
    if len(seq) == 0:
        return (0, 0)
    return (int(seq.min()), int(seq.max()) + 1)


def prod(shape: Sequence[int]) -> int:
    p = 1
    for s in shape:
        p *= int(s)
    return p


class PartSpec:
    """One operand's rows inside one message: ``count`` rows of ``shape[1:]`` elements of ``dtype``
    at byte ``offset``. On the sending side ``rows`` selects them in the local buffer (a slice or
    an index array), ``items`` the trailing index; ``array`` is the operand's slot."""

    __slots__ = ("array", "count", "dtype", "shape", "offset", "nbytes", "rows", "items", "hull")

    def __init__(self, array: int, count: int, dtype: np.dtype, trail: Tuple[int, ...], rows: Any = None,
                 items: Tuple = (), hull: Tuple[int, int] = (0, 0)):
        self.array, self.count, self.dtype = array, int(count), np.dtype(dtype)
        self.shape = (int(count),) + tuple(trail)
        self.nbytes = prod(self.shape) * self.dtype.itemsize
        self.offset = 0
        self.rows, self.items, self.hull = rows, items, hull


class MsgSpec:
    """All parts exchanged with ``peer`` in one direction for one task (one MPI message).

    ``nbytes`` is the message's room in the arena (each part starts at an 8-byte boundary); ``payload``
    the bytes actually sent: up to the end of the last part, without the padding after it. The MPI
    message carries ``payload`` bytes, so a packed message matches a peer that receives the same
    elements in place (exactly their bytes) whatever the element size."""

    __slots__ = ("peer", "parts", "nbytes", "payload")

    def __init__(self, peer: int, parts: List[PartSpec]):
        self.peer = int(peer)
        self.parts = parts
        off = end = 0
        for p in parts:
            p.offset = off
            end = off + p.nbytes
            off = _align8(end)
        self.nbytes = off
        self.payload = end


def arena_layout(msgs: List["MsgSpec"]) -> Tuple[List[int], int]:
    """Byte offset of each message of ``msgs`` in an instance's arena (64-byte aligned) and the arena's size."""
    offsets = []
    total = 0
    for m in msgs:
        offsets.append(total)
        total += (max(m.nbytes, 8) + 63) & ~63
    return offsets, total


class Instance:
    """The buffers and persistent requests of one use of a plan within a flush.

    Created collectively in effect (every rank creates the instances of the same plans in the
    same order, so the tag agrees); each instance is reused by later flushes. The receive buffers
    of all incoming messages are slices of one arena (``recv_arena``, bytes), those of all outgoing
    messages of another (``send_arena``), each message starting at a 64-byte boundary
    (``recv_offsets`` / ``send_offsets``), so a kernel can fill or drain every message in one call.
    """

    __slots__ = ("plan", "tag", "recv_bufs", "send_bufs", "recv_reqs", "send_reqs", "recv_parts", "send_parts",
                 "recv_arena", "send_arena", "recv_offsets", "send_offsets", "extra", "flush_no", "uses", "broken")

    def __init__(self, plan: "Plan", context):
        self.plan = plan
        self.tag = context.next_tag()     # taken on every rank, messages or not: tags agree by creation order
        self.extra = plan.extra_buffers()
        self.flush_no = -1
        self.uses = 0
        self.broken = False
        if not plan.msgs_in and not plan.msgs_out:      # a local plan: no buffers, no requests
            self.recv_arena, self.send_arena = np.empty(64, dtype=np.uint8), np.empty(64, dtype=np.uint8)
            self.recv_offsets, self.recv_bufs, self.recv_reqs, self.recv_parts = [], [], [], []
            self.send_offsets, self.send_bufs, self.send_reqs, self.send_parts = [], [], [], []
            return
        MPI = _mpi()
        comm = context.dcomm
        self.recv_arena, self.recv_offsets, self.recv_bufs = self._arena(plan.msgs_in)
        self.recv_reqs = [comm.Recv_init([buf[:m.payload], MPI.BYTE], source=m.peer, tag=self.tag)
                          for m, buf in zip(plan.msgs_in, self.recv_bufs)]
        self.recv_parts = [[buf[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape) for p in m.parts]
                           for m, buf in zip(plan.msgs_in, self.recv_bufs)]
        self.send_arena, self.send_offsets, self.send_bufs = self._arena(plan.msgs_out)
        self.send_reqs = [comm.Send_init([buf[:m.payload], MPI.BYTE], dest=m.peer, tag=self.tag)
                          for m, buf in zip(plan.msgs_out, self.send_bufs)]
        self.send_parts = [[buf[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape) for p in m.parts]
                           for m, buf in zip(plan.msgs_out, self.send_bufs)]

    @staticmethod
    def _arena(msgs: List["MsgSpec"]) -> Tuple[np.ndarray, List[int], List[np.ndarray]]:
        """One byte buffer for ``msgs``: (arena, byte offset of each message, each message's slice)."""
        offsets, total = arena_layout(msgs)
        arena = np.empty(max(total, 64), dtype=np.uint8)
        return arena, offsets, [arena[o:o + max(m.nbytes, 8)] for o, m in zip(offsets, msgs)]

    def free(self) -> None:
        """Free the persistent requests (they must be inactive)."""
        for r in self.recv_reqs + self.send_reqs:
            try:
                r.Free()
            except Exception:  # noqa: BLE001 - already freed or never started
                pass
        self.recv_reqs, self.send_reqs = [], []


class Plan:
    """Base of the per-rank plans: messages in and out, and a pool of :class:`Instance`."""

    kind = "plan"

    def __init__(self) -> None:
        self.msgs_in: List[MsgSpec] = []
        self.msgs_out: List[MsgSpec] = []
        self.instances: List[Instance] = []

    def extra_buffers(self) -> Dict[str, Any]:
        """Per-instance scratch buffers (reduction slots...)."""
        return {}

    def acquire(self, context, flush_no: int) -> Instance:
        """An instance not yet used in flush ``flush_no`` (created when all are in use)."""
        for inst in self.instances:
            if inst.flush_no != flush_no and not inst.broken:
                inst.flush_no = flush_no
                return inst
        inst = Instance(self, context)
        inst.flush_no = flush_no
        self.instances.append(inst)
        return inst

    def free(self) -> None:
        """Free the instances' persistent requests and drop them; each instance forgets its plan, so that no
        reference cycle (plan, instance list, instance, the plan bound to it) outlives the eviction: reference
        counting frees an evicted plan even after ``gc.freeze()`` (``NBMPI_DISTARRAY_GC_FREEZE``)."""
        for inst in self.instances:
            inst.free()
            inst.plan = None
        self.instances = []

    @staticmethod
    def _messages(parts_by_peer: Dict[int, List[PartSpec]]) -> List[MsgSpec]:
        return [MsgSpec(q, parts_by_peer[q]) for q in sorted(parts_by_peer) if parts_by_peer[q]]

    def pack(self, inst: Instance, k: int, local_of) -> None:
        """Copy the parts of outgoing message ``k`` from the local buffers into its send buffer.
        ``local_of(array)`` returns the local buffer of operand slot ``array``."""
        for p, dst in zip(self.msgs_out[k].parts, inst.send_parts[k]):
            src = local_of(p.array)
            np.copyto(dst, src[(p.rows,) + p.items])


def segments(m: int, srcs: List[np.ndarray], seqs: List[np.ndarray]) -> List[Tuple[int, int]]:
    """Cut ``range(m)`` into maximal runs where every ``srcs`` array is constant and every
    ``seqs`` array is an arithmetic progression (greedy, left to right)."""
    if m == 0:
        return []
    srcbrk = np.zeros(m, dtype=bool)
    for s in srcs:
        srcbrk[1:] |= s[1:] != s[:-1]
    chg = np.zeros(m, dtype=bool)
    if m >= 3:
        for q in seqs:
            dq = np.diff(q)
            chg[2:] |= dq[1:] != dq[:-1]
    sb = np.flatnonzero(srcbrk)
    cb = np.flatnonzero(chg)
    out: List[Tuple[int, int]] = []
    s = 0
    while s < m:
        i1 = int(np.searchsorted(sb, s, side="right"))
        nb = int(sb[i1]) if i1 < len(sb) else m
        i2 = int(np.searchsorted(cb, s + 1, side="right"))
        nc = int(cb[i2]) if i2 < len(cb) else m
        e = min(nb, nc)
        out.append((s, e))
        s = e
    return out


def my_rows(dist, s: int, t: int, n: int, rank: int) -> Tuple[np.ndarray, np.ndarray]:
    """(row numbers i of the view owned by ``rank``, their local indices), increasing i."""
    if dist.kind == "block" and n > 0:       # one run of rows: the answer in closed form, O(rows) aranges only
        lo, hi = dist.block_range(rank)
        return _block_rows(lo, hi, s, t, n)
    g = dist.global_rows(rank)
    if t == 1 and s == 0 and n == dist.nrows:  # the whole base: every local row, in order
        return g, np.arange(len(g), dtype=np.int64)
    rel = g - s
    q = rel // t
    ok = (rel % t == 0) & (q >= 0) & (q < n)
    i = q[ok]
    loc = np.flatnonzero(ok).astype(np.int64)
    if t < 0:
        i, loc = i[::-1].copy(), loc[::-1].copy()
    return i.astype(np.int64), loc




def _block_rows(lo: int, hi: int, s: int, t: int, n: int) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`my_rows` for a rank owning global rows ``[lo, hi)`` and the view rows ``s + i * t``, ``0 <= i < n``:
    the ``i`` whose row falls in ``[lo, hi)`` (increasing) and ``row - lo``."""
    if hi <= lo:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if t > 0:                                   # s + i*t >= lo  and  s + i*t < hi
        i0 = max(0, -(-(lo - s) // t))
        i1 = min(n, -(-(hi - s) // t))
    else:                                       # t < 0: s + i*t <= hi - 1  and  s + i*t >= lo
        u = -t
        i0 = max(0, -(-(s - (hi - 1)) // u))
        i1 = min(n, (s - lo) // u + 1)
    if i1 <= i0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    i = np.arange(i0, i1, dtype=np.int64)
    return i, (s - lo) + i * t
