"""``argmax`` / ``argmin`` over all elements (``axis=None``) as one collective step: a force point, then one
small allgather.

The recorded form (``max``, then ``a == m``, then ``min`` of the positions of the hits) costs two reductions
one after the other (two allgathers, the second waiting for the first) and about eight recorded operations.
Here each rank takes NumPy's ``argmax`` (``argmin``) of the elements it holds, in increasing global order
(the first extreme, or the first NaN, as NumPy), and the ranks exchange one candidate each ``(has, flat index,
value)``; every rank combines them in rank order the same way: the first NaN if any, else the extreme value
with the smallest flat index. The result is a 0-d replicated ``intp`` DistArray, as the recorded form's.

:func:`flat_arg` is collective over the array's communicator and blocking (the allgather is waited for with
the context's timeout, ``NBMPI_TIMEOUT``: a rank that does not arrive raises
:class:`~.errors.DistArrayTimeout` naming this rank and the operation). Call it SPMD on every rank with the
same array. It returns None (nothing done, nothing collective) for views it does not handle (new axes before
the distributed axis); the caller then records the general form.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Optional, Tuple

import numpy as np

from ..core import waiting
from .array import DistArray
from .creation import from_numpy
from .errors import DistArrayTimeout
from .indexing import _slice_of
from .plans import my_rows, selector

__all__ = ["flat_arg"]


def _local_candidate(a: DistArray, op: str) -> Optional[Tuple[bool, int, Any]]:
    """``(has, flat index, value)`` of this rank's first extreme of ``a`` (``has`` False when it holds none
    of ``a``'s elements); None if the view is not handled. Local; ``a`` must be evaluated."""
    b, v = a._base, a._view
    loc = b.ensure()
    if b.replicated:
        data = loc[v.numpy_index()]
        j = int(getattr(np, f"arg{op}")(data))
        return True, j, data.reshape(-1)[j]
    if v.row_kept and v.lead_new():
        return None
    s, t, n = v.row_params
    rows, lidx = my_rows(b.dist, s, t, n, a.context.rank)
    if len(lidx) == 0:
        return False, 0, None
    if not v.row_kept:                      # one fixed base row: its owner holds the whole view
        data = loc[v.numpy_index(row_sel=int(lidx[0]))]
        j = int(getattr(np, f"arg{op}")(data))
        return True, j, data.reshape(-1)[j]
    if b.dist.kind == "block":               # my_rows gave one arithmetic run of local rows
        sel = _slice_of(int(lidx[0]), t if len(lidx) > 1 else 1, len(lidx))
    else:
        sel = selector(lidx)
    data = loc[v.numpy_index(row_sel=sel)]   # this rank's rows of the view, increasing order
    j = int(getattr(np, f"arg{op}")(data))
    trail = math.prod(a.shape[1:])
    r, c = divmod(j, trail) if trail else (0, 0)
    return True, int(rows[r]) * trail + c, data.reshape(-1)[j]


@functools.lru_cache(maxsize=None)
def _record_type(dtype: np.dtype) -> np.dtype:
    """The structured dtype of one rank's candidate ``(has, idx, val)`` for values of ``dtype``."""
    return np.dtype([("has", np.int64), ("idx", np.int64), ("val", dtype)])


def _combine(recs: np.ndarray, op: str) -> int:
    """The flat index chosen from every rank's candidate (rank order; the same on every rank)."""
    best_i, best_v, best_nan = -1, None, False
    for rec in recs:
        if not rec["has"]:
            continue
        i, val = int(rec["idx"]), rec["val"]
        isnan = val != val
        if best_i < 0:
            best_i, best_v, best_nan = i, val, isnan
        elif best_nan:
            if isnan and i < best_i:
                best_i = i
        elif isnan:
            best_i, best_v, best_nan = i, val, True
        elif (val > best_v if op == "max" else val < best_v) or (val == best_v and i < best_i):
            best_i, best_v = i, val
    return best_i


def flat_arg(a: DistArray, op: str) -> Optional[DistArray]:
    """``numpy.arg<op>(a)`` (``op`` "max" or "min", ``axis=None``) of a non-empty, non-complex DistArray as a
    0-d replicated intp DistArray, or None if the view is not handled (see the module doc). Collective, a force
    point, blocking."""
    from ..core import runtime

    ctx = a.context
    ctx.flush(f"arg{op}()")
    cand = _local_candidate(a, op)
    if cand is None:
        return None
    if a._base.replicated:
        return from_numpy(np.array(cand[1], dtype=np.intp), dist="replicated", comm=a.comm)
    rec_t = _record_type(a.dtype)
    mine = np.zeros(1, dtype=rec_t)
    if cand[0]:
        mine[0] = (1, cand[1], cand[2])
    recs = np.zeros(ctx.size, dtype=rec_t)
    MPI = runtime.MPI()
    ctx.ensure_comm()
    req = ctx.dcomm.Iallgather([mine.view(np.uint8), MPI.BYTE], [recs.view(np.uint8), MPI.BYTE])
    waiting.wait(req, ctx.timeout, ctx.rank, None, f"arg{op}: allgather of every rank's candidate",
                 DistArrayTimeout, cancellable=False)
    ctx.stats["collectives"] += 1
    return from_numpy(np.array(_combine(recs, op), dtype=np.intp), dist="replicated", comm=a.comm)
