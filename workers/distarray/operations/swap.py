"""Swaps: the copy-back out of a dying temporary laid out like its target, done by exchanging buffers.

The fusion pass rewrites ``x[v] = t[v]`` (``t`` dying, with ``x``'s shape, dtype and distribution;
the copy-back of a Jacobi step, ``center[:] = work``) into a :class:`~..graph.Swap`. Its plan is
the few local elements of ``x`` outside the box ``v`` (:func:`complement`), copied into ``t``'s buffer
before the two buffers are exchanged. No communication.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ..graph import Swap
from ..plans import selector
from ..units import FULL, GroupRun, Lowering, Unit

__all__ = ["Complement", "complement", "cache_key", "lower", "LOWERINGS"]


class Complement(list):
    """Index tuples of the local elements of a base outside a box (what a swap copies); a cached plan."""

    def free(self) -> None:
        """Nothing to free (the context's plan cache calls it on eviction)."""


def complement(x, box, rank: int) -> Complement:
    """The local elements of base ``x`` outside ``box`` (per base axis ``(start, stop)``) as a few
    NumPy index tuples: the rows outside the box, then per trailing axis the two slabs beside it.
    A 0-d base has nothing outside its (whole) box."""
    if not x.shape:
        return Complement()
    g = x.dist.global_rows(rank) if not x.replicated else np.arange(x.shape[0], dtype=np.int64)
    r0, r1 = box[0]
    rows_in = (g >= r0) & (g < r1)
    out = Complement()
    if not rows_in.all():
        out.append((selector(np.flatnonzero(~rows_in)),))
    in_rows = selector(np.flatnonzero(rows_in))
    for k in range(1, len(x.shape)):
        prefix = [in_rows] + [slice(box[j][0], box[j][1]) for j in range(1, k)]
        for (lo, hi) in ((0, box[k][0]), (box[k][1], x.shape[k])):
            if hi > lo:
                out.append(tuple(prefix + [slice(lo, hi)]))
    return out


def cache_key(t: Swap) -> Tuple:
    """The plan cache key of ``t``: the target's layout and shape and the box."""
    x = t.target.base
    return ("swap", x.dist.key, x.shape, t.box)


def lower(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The one unit of ``g.task`` (a :class:`~..graph.Swap`): copy the complement, exchange the buffers."""
    t: Swap = g.task
    x, s = t.target.base, t.source.base
    idx = fl.ctx.plan(cache_key(t), lambda: complement(x, t.box, fl.rank))

    def fn() -> None:
        xl, sl = x.ensure(), s.ensure()
        for ix in idx:
            sl[ix] = xl[ix]
        xp, sp = x.pooled, s.pooled
        x.set_local(sl, sp)
        s.set_local(xl, xp)

    run = GroupRun(t.desc)
    run.computes.append(Unit("compute", fn, t.desc, ((s.serial, 0, FULL, "W"), (x.serial, 0, FULL, "W"))))
    return run


LOWERINGS = {"swap": lower}
