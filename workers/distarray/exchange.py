"""Element exchange by global position: the collective step under the native sort, reshape, nonzero and
repeat of the distributed arrays (:mod:`.numpy_sorting`, :mod:`.numpy_reshaping`).

Each rank holds some elements of a result together with their global flat (C-order) indices;
:func:`from_elements` sends every element to the rank owning its row in the result's layout (one
``alltoallv`` of bytes, at most one message per peer, nothing gathered to one rank) and builds the
result there. :func:`local_part` is the other end: this rank's rows of an array (a view included)
and their global row numbers. :func:`alltoallv` and :func:`allgather_int` are the two collectives,
non-blocking underneath and waited for with the context's timeout (``NBMPI_TIMEOUT``): a rank that
does not arrive raises :class:`~.errors.DistArrayTimeout` naming this rank and the operation.

All functions are collective over the array's communicator and blocking unless said otherwise; call
them SPMD on every rank with the same arguments. They run at a force point: the recorded operations
are evaluated first.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ..core import waiting
from .array import DistArray
from .distribution import Distribution, make_distribution
from .errors import DistArrayTimeout
from .graph import Base
from .indexing import View

__all__ = ["local_part", "alltoallv", "allgather_int", "allreduce_sum", "from_elements", "from_local_part",
           "result_dist"]


def local_part(a: DistArray) -> Tuple[np.ndarray, np.ndarray]:
    """(global row numbers along axis 0 of ``a``, this rank's rows of ``a`` as a C-contiguous array of shape
    ``(len(rows),) + a.shape[1:]``). Every row is held by exactly one rank; a replicated array is split into
    blocks (no communication). A view that does not keep axis 0 as its distributed axis is redistributed to
    blocks first. Collective (a force point), blocking."""
    if a.ndim == 0:
        raise ValueError("local_part of a 0-d array")
    ctx = a.context
    if a._base.replicated:
        rows = Distribution("block", a.shape[0], ctx.size).global_rows(ctx.rank)
        return rows, np.ascontiguousarray(a.local[rows])
    v = a._view
    if not v.row_kept or v.lead_new():
        a = a.redistribute("block")
    data = a.local
    return np.asarray(a.local_rows, dtype=np.int64), np.ascontiguousarray(data)


def allgather_int(ctx: Any, value: int, what: str) -> np.ndarray:
    """Every rank's integer ``value`` (int64, rank order). Collective, blocking; ``DistArrayTimeout`` after
    the context's timeout."""
    from ..core import runtime

    out = np.zeros(ctx.size, dtype=np.int64)
    ctx.ensure_comm()
    req = ctx.dcomm.Iallgather(np.array([value], dtype=np.int64), [out, runtime.MPI().INT64_T])
    waiting.wait(req, ctx.timeout, ctx.rank, None, f"{what}: allgather of counts", DistArrayTimeout,
                 cancellable=False)
    return out


def allreduce_sum(ctx: Any, values: np.ndarray, what: str) -> np.ndarray:
    """The elementwise sum over the ranks of the int64 array ``values`` (same length on every rank).
    Collective, blocking; ``DistArrayTimeout`` after the context's timeout."""
    from ..core import runtime

    MPI = runtime.MPI()
    mine = np.ascontiguousarray(values, dtype=np.int64)
    out = np.zeros_like(mine)
    ctx.ensure_comm()
    if mine.size:
        req = ctx.dcomm.Iallreduce([mine, MPI.INT64_T], [out, MPI.INT64_T], op=MPI.SUM)
        waiting.wait(req, ctx.timeout, ctx.rank, None, f"{what}: allreduce of counts", DistArrayTimeout,
                     cancellable=False)
    return out


def alltoallv(ctx: Any, send: np.ndarray, counts: np.ndarray, what: str) -> np.ndarray:
    """Send ``counts[q]`` consecutive items of ``send`` (a 1-D array, grouped by destination in rank order) to
    each rank ``q``; return the items received, grouped by source in rank order (same dtype). One message
    per peer; collective, blocking; ``DistArrayTimeout`` after the context's timeout."""
    from ..core import runtime

    MPI = runtime.MPI()
    ctx.ensure_comm()
    comm = ctx.dcomm
    isz = send.dtype.itemsize
    scounts = np.ascontiguousarray(counts, dtype=np.int64)
    rcounts = np.zeros(ctx.size, dtype=np.int64)
    req = comm.Ialltoall([scounts, MPI.INT64_T], [rcounts, MPI.INT64_T])
    waiting.wait(req, ctx.timeout, ctx.rank, None, f"{what}: exchanging counts", DistArrayTimeout,
                 cancellable=False)
    recv = np.empty(int(rcounts.sum()), dtype=send.dtype)
    sb = (scounts * isz).astype(np.int64)
    rb = (rcounts * isz).astype(np.int64)
    sd = np.concatenate(([0], np.cumsum(sb)[:-1])).astype(np.int64)
    rd = np.concatenate(([0], np.cumsum(rb)[:-1])).astype(np.int64)
    sbuf = np.ascontiguousarray(send).view(np.uint8).reshape(-1)
    rbuf = recv.view(np.uint8).reshape(-1)
    if sbuf.size == 0:
        sbuf = np.zeros(1, dtype=np.uint8)
    if rbuf.size == 0:
        rbuf = np.zeros(1, dtype=np.uint8)
    req = comm.Ialltoallv([sbuf, (sb, sd), MPI.BYTE], [rbuf, (rb, rd), MPI.BYTE])
    waiting.wait(req, ctx.timeout, ctx.rank, None, f"{what}: exchanging elements", DistArrayTimeout,
                 cancellable=False)
    return recv


def result_dist(like: DistArray, nrows: int) -> Any:
    """The layout of a result of ``nrows`` rows computed from ``like``: ``like``'s kind and block size, or
    block if ``like`` is replicated. Local."""
    d = like.dist
    if d.kind == "replicated":
        return "block"
    return d.kind if d.kind != "block-cyclic" else ("block-cyclic", d.block)


def from_elements(ctx: Any, shape: Tuple[int, ...], dtype: Any, flat: np.ndarray, values: np.ndarray,
                  dist: Any = "block", what: str = "exchange") -> DistArray:
    """A new distributed array of ``shape`` whose element at global flat (C-order) index ``flat[k]`` is
    ``values[k]``: every rank passes the elements it holds (together the ranks pass each index exactly
    once); each is sent to the rank owning its row under ``dist``. Collective, blocking (one exchange of
    counts, one ``alltoallv``); the result is a new array (nothing recorded)."""
    shape = tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    d = make_distribution(dist, shape[0], ctx.size)
    inner = int(np.prod(shape[1:], dtype=np.int64))
    flat = np.asarray(flat, dtype=np.int64).reshape(-1)
    values = np.asarray(values, dtype=dtype).reshape(-1)
    rec = np.empty(len(flat), dtype=[("f", "<i8"), ("v", dtype)])
    if inner == 0 or len(flat) == 0:
        owner = np.zeros(0, dtype=np.int64)
        rec = rec[:0]
    else:
        owner = d.owner(flat // inner)
        order = np.argsort(owner, kind="stable")
        rec["f"], rec["v"] = flat[order], values[order]
        owner = owner[order]
    counts = np.bincount(owner, minlength=ctx.size).astype(np.int64)
    got = alltoallv(ctx, rec, counts, what)
    base = Base(ctx, shape, dtype, d, origin=what)
    local = np.empty(base.local_shape(), dtype=dtype)
    if len(got):
        rows = got["f"] // inner
        pos = d.local_index(rows) * inner + got["f"] % inner
        local.reshape(-1)[pos] = got["v"]
    base.set_local(local)
    return DistArray(base, View.full(shape))


def from_local_part(ctx: Any, shape: Tuple[int, ...], dist: Distribution, local: np.ndarray) -> DistArray:
    """A new array of ``shape`` laid out by ``dist`` whose rows on this rank are ``local`` (in the order of
    ``dist.global_rows(rank)``; its dtype is the result's). Local: every rank passes its own part."""
    base = Base(ctx, tuple(shape), local.dtype, dist, origin="local parts")
    base.set_local(np.ascontiguousarray(local).reshape(base.local_shape()))
    return DistArray(base, View.full(tuple(shape)))
