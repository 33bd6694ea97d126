"""Gathers of a distributed view to every rank (or one root): the plan, its cache key and its lowering.

A :class:`~..graph.Replicate` task (recorded for ``to_numpy``, for an operand replicated to meet a
misaligned one, ...) copies a view of a distributed base into a replicated base of shape
``(rows, *packed trailing)``: each owner sends its rows once to each destination, and the rows
it owns itself are copied while the messages fly.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from ..graph import Replicate
from ..indexing import _slice_of
from ..plans import PartSpec, Plan, hull, selector
from ..row_runs import block_i_range
from ..units import FULL, GroupRun, Lowering, Unit

__all__ = ["ReplicatePlan", "cache_key", "lower", "LOWERINGS"]


class ReplicatePlan(Plan):
    """Gather a view of a distributed base to every rank (or one root) into a replicated base of
    shape ``(rows, *packed trailing)``: each owner sends its rows once to each destination."""

    kind = "replicate"

    def __init__(self, task, rank: int, nranks: int):
        super().__init__()
        src = task.src
        v = src.view
        s, t, n = v.row_params
        trail = v.packed_trail_shape()
        items = v.trail_items()
        dests = list(range(nranks)) if task.root is None else [task.root]
        self.is_dest = rank in dests
        self.items = items
        per_rank = _rows_by_owner(src.base.dist, s, t, n, nranks)   # [(count, local rows, view rows)] per rank
        cnt, self.local_src, self.local_dst, self.hull = per_rank[rank]
        send: Dict[int, List[PartSpec]] = {}
        if cnt:
            for dd in dests:
                if dd != rank:
                    send[dd] = [PartSpec(0, cnt, src.dtype, trail, rows=self.local_src, items=items, hull=self.hull)]
        recv: Dict[int, List[PartSpec]] = {}
        self.recv_dst: List[Any] = []
        if self.is_dest:
            for q in range(nranks):
                qcnt, _, iq, _ = per_rank[q]
                if q != rank and qcnt:
                    recv[q] = [PartSpec(0, qcnt, src.dtype, trail)]
                    self.recv_dst.append(iq)
        self.msgs_in = self._messages(recv)
        self.msgs_out = self._messages(send)


def _rows_by_owner(dist, s: int, t: int, n: int, nranks: int) -> List[Tuple[int, Any, Any, Tuple[int, int]]]:
    """Per rank ``q``: (how many rows of the view ``s + i * t``, ``0 <= i < n``, ``q`` owns, their local rows
    there and their view rows ``i`` as selectors, the hull of the local rows). In closed form (one run of
    ``i`` per rank) for a block layout, row by row otherwise."""
    out = []
    if dist.kind == "block":
        for q in range(nranks):
            lo, hi = dist.block_range(q)
            i0, i1 = block_i_range(lo, hi, s, t, n)
            c = max(0, i1 - i0)
            l0 = s + i0 * t - lo
            last = l0 + t * (c - 1)
            out.append((c, _slice_of(l0, t if c > 1 else 1, c), _slice_of(i0, 1, c),
                        (min(l0, last), max(l0, last) + 1) if c else (0, 0)))
        return out
    rows = s + np.arange(n, dtype=np.int64) * t
    owner = dist.owner(rows)
    loc = dist.local_index(rows)
    for q in range(nranks):
        iq = np.flatnonzero(owner == q)
        out.append((len(iq), selector(loc[iq]), selector(iq), hull(loc[iq])))
    return out


def cache_key(t: Replicate) -> Tuple:
    """The plan cache key of ``t``: the source's layout, view and dtype and the root (None: every rank)."""
    src = t.src
    return ("rep", src.base.dist.key, src.view.key, src.dtype.str, t.root)


def lower(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The units of ``g.task`` (a :class:`~..graph.Replicate`) in flush ``fl``: one send per destination;
    on a destination, the copy of its own rows and one unpack per received message."""
    t: Replicate = g.task
    ctx = fl.ctx
    src, out = t.src, t.out
    plan: ReplicatePlan = ctx.plan(cache_key(t), lambda: ReplicatePlan(t, fl.rank, fl.size))
    inst = plan.acquire(ctx, flush_no)
    inst.uses += 1
    run = GroupRun(t.desc)
    fl.receives(run, plan, inst, t.desc)
    for k in range(len(plan.msgs_out)):
        run.sends.append(fl.send_unit(plan, inst, k, lambda i: src.base.ensure(), lambda i: src.base.serial,
                                      t.desc))
    if plan.is_dest:
        items = plan.items

        def local_fn() -> None:
            rl = out.base.ensure()
            sl = src.base.ensure()
            rl[plan.local_dst] = sl[(plan.local_src,) + items]

        run.computes.append(Unit("compute", local_fn, t.desc, ((src.base.serial, plan.hull[0], plan.hull[1], "R"),
                                                               (out.base.serial, 0, FULL, "A"))))
        for k in range(len(plan.msgs_in)):
            def unpack(k=k) -> None:
                out.base.ensure()[plan.recv_dst[k]] = inst.recv_parts[k][0]

            u = Unit("compute", unpack, t.desc, ((out.base.serial, 0, FULL, "A"),))
            u.ndeps = 1
            run.recvs[k].units.append(u)
            run.computes.append(u)
    return run


LOWERINGS = {"replicate": lower}
