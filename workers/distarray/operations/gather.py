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
from ..plans import PartSpec, Plan, hull, selector
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
        rows = s + np.arange(n, dtype=np.int64) * t
        owner = src.base.dist.owner(rows)
        loc = src.base.dist.local_index(rows)
        trail = v.packed_trail_shape()
        items = v.trail_items()
        dests = list(range(nranks)) if task.root is None else [task.root]
        self.is_dest = rank in dests
        mine_i = np.flatnonzero(owner == rank)
        self.local_src = selector(loc[mine_i])
        self.local_dst = selector(mine_i)
        self.items = items
        self.hull = hull(loc[mine_i])
        send: Dict[int, List[PartSpec]] = {}
        if len(mine_i):
            for dd in dests:
                if dd != rank:
                    send[dd] = [PartSpec(0, len(mine_i), src.dtype, trail, rows=selector(loc[mine_i]), items=items,
                                         hull=self.hull)]
        recv: Dict[int, List[PartSpec]] = {}
        self.recv_dst: List[Any] = []
        if self.is_dest:
            for q in range(nranks):
                iq = np.flatnonzero(owner == q)
                if q != rank and len(iq):
                    recv[q] = [PartSpec(0, len(iq), src.dtype, trail)]
                    self.recv_dst.append(selector(iq))
        self.msgs_in = self._messages(recv)
        self.msgs_out = self._messages(send)


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
