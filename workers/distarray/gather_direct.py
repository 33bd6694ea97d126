"""``to_numpy`` of a whole block-distributed array without staging buffers.

A whole block-distributed array is already, rank after rank, the C-order bytes of the NumPy result: rank
``q``'s local buffer is the byte range ``[lo_q * row, hi_q * row)`` of it. So after the force point each
rank hands its local buffer straight to one ``Iallgatherv`` (``Igatherv`` to a root) whose receive buffer
is the result itself: no packing copy, no receive arena, no plan kept in the context (fewer fresh pages
on a first run, one copy fewer on every run). A lazy ``concatenate`` result (:mod:`.lazy_joins`) is gathered
part by part straight into the result (:func:`gather_join`). Other layouts and views go through the recorded
gather (:mod:`.operations.gather`).
"""
from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np

from ..core import runtime, waiting
from ..tracing import tracer as tracing
from .errors import DistArrayTimeout

__all__ = ["applies", "gather_block", "gather_into", "gather_join"]

K_GATHER = tracing.register_kind("distarray_gather_direct")
#: the largest per-rank byte count one MPI count can hold
_MAX_COUNT = (1 << 31) - 1


def applies(base, view) -> bool:
    """Whether :func:`gather_block` handles ``base`` seen through ``view``: a whole, non-empty,
    block-distributed array whose per-rank byte counts fit an MPI count. Local; the same on every rank
    (it depends on shapes and the layout only)."""
    if base.replicated or not view.is_full or base.dist.kind != "block" or not base.shape:
        return False
    row = int(np.prod(base.shape[1:], dtype=np.int64)) * base.dtype.itemsize
    d = base.dist
    sizes = [(d.block_range(q)[1] - d.block_range(q)[0]) * row for q in range(base.context.size)]
    return 0 < sum(sizes) and max(sizes) <= _MAX_COUNT


def gather_block(base, root: Optional[int], reason: str) -> Optional[np.ndarray]:
    """The whole array ``base`` (see :func:`applies`) as a new C-contiguous NumPy array on every rank
    (``root=None``) or on ``root`` only (the others get None). Collective over the base's communicator:
    every rank calls it with the same arguments; it is a force point (``ctx.flush(reason)`` first), then
    blocks in the gather, waited with the context's timeout (:class:`~.errors.DistArrayTimeout` names the
    rank, the root and the operation). A lazy ``concatenate`` result (:mod:`.lazy_joins`) is gathered from
    its parts, straight into the result (it is never stored)."""
    ctx = base.context
    if base.join is not None:
        return gather_join(base, root, reason)
    ctx.flush(reason, point=_point(base, root, reason))
    dest = root is None or ctx.rank == root
    out = np.empty(base.shape, dtype=base.dtype) if dest else None   # the user's: NumPy's own memory
    gather_into(base, root, out, reason)
    return out


def _point(base, root: Optional[int], reason: str) -> Any:
    """The gather of ``base`` as the :class:`~.scheduler.ForcePoint` its force point agrees on: a rank that
    gathers another array, or calls another collective, makes every rank raise DistArrayDivergence naming both,
    where the gathers would mix the two arrays' bytes (``if rank == 0: print(a)`` and the next gather)."""
    from .scheduler import ForcePoint
    return ForcePoint((30, base.serial, base.shape, base.dtype.num, base.dtype.itemsize, -1 if root is None else root),
                      f"{reason}: gather of {base.name()} {base.shape} {base.dtype} "
                      f"{'to every rank' if root is None else f'to rank {root}'} (a collective; to print on one "
                      "rank: x = a.to_numpy() on every rank, then print x)")


def gather_into(base, root: Optional[int], out: Optional[np.ndarray], reason: str) -> None:
    """Gather the whole array ``base`` (see :func:`applies`; evaluated: no pending write to it) into ``out``, a
    C-contiguous NumPy array of its shape and dtype on every rank (``root=None``) or on ``root`` (None on the
    others). Collective over the base's communicator, blocking, waited with the context's timeout (see
    :func:`gather_block`); not a force point."""
    ctx = base.context
    ctx.ensure_comm()
    MPI = runtime.MPI()
    rank, size = ctx.rank, ctx.size
    row = int(np.prod(base.shape[1:], dtype=np.int64)) * base.dtype.itemsize
    counts = np.array([(base.dist.block_range(q)[1] - base.dist.block_range(q)[0]) * row for q in range(size)],
                      dtype=np.int64)
    displs = np.zeros(size, dtype=np.int64)
    displs[1:] = np.cumsum(counts)[:-1]
    local = base.ensure().reshape(-1).view(np.uint8)
    dest = root is None or rank == root
    recv = [out.reshape(-1).view(np.uint8), (counts, displs), MPI.BYTE] if dest else None
    t0 = time.perf_counter_ns()
    if root is None:
        req = ctx.dcomm.Iallgatherv([local, MPI.BYTE], recv)
        op = f"{reason}: allgather of {base.name()}"
    else:
        req = ctx.dcomm.Igatherv([local, MPI.BYTE], recv, root=root)
        op = f"{reason}: gather of {base.name()} to rank {root}"
    waiting.wait(req, ctx.timeout, rank, root, op, DistArrayTimeout, cancellable=False)
    tr = tracing.get_tracer()
    if tr.enabled:
        tr.record(K_GATHER, tracing.DIR_NONE, -1 if root is None else root, 0, int(counts.sum()) if dest else
                  local.nbytes, t0, time.perf_counter_ns(), wait=-1, seq=ctx.flush_no, chan=ctx.chan, count=size)


def gather_join(base: Any, root: Optional[int], reason: str) -> Optional[np.ndarray]:
    """The whole lazy ``concatenate`` result ``base`` (:mod:`.lazy_joins`) as a new NumPy array on every rank
    (``root=None``) or on ``root`` (None on the others), each part gathered into its rows of it
    (:func:`_gather_into`): the result's own block is never stored. Collective, a force point (every rank calls
    it with the same arguments); ``base`` stays a lazy join."""
    ctx = base.context
    ctx.flush(reason, point=_point(base, root, reason))
    dest = root is None or ctx.rank == root
    out = np.empty(base.shape, dtype=base.dtype) if dest else None
    _gather_into(base, root, out, reason)
    return out


def _gather_into(base: Any, root: Optional[int], out: Optional[np.ndarray], reason: str) -> None:
    """Gather lazy join ``base`` into ``out`` (its shape and dtype, C-contiguous; None on a rank that is not
    ``root``): a block-distributed part of the same dtype straight from its local buffer
    (:func:`gather_into`), any other through its own ``to_numpy``. Collective, blocking; the
    caller has flushed."""
    dest = out is not None
    for lo, hi, x in list(base.join):
        into = out[lo:hi] if dest else None
        if x.dtype == base.dtype and applies(x._base, x._view):
            gather_into(x._base, root, into, reason)
        else:
            got = x.to_numpy(root, _reason=reason)
            if dest:
                into[...] = got
