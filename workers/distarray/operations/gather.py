"""Gathers of a distributed view to every rank (or one root): the plan, its cache key and its lowering.

A :class:`~..graph.Replicate` task (recorded for ``to_numpy``, for an operand replicated to meet a
misaligned one, ...) copies a view of a distributed base into a replicated base of shape
``(rows, *packed trailing)``: each owner sends its rows once to each destination, and the rows
it owns itself are copied while the messages fly. A gather of one fixed row (``a[k, j:]``, what a loop over
``k`` reads) takes its plan by owner, not by row (:func:`row_key`): one plan, and its instances, serve every row.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..graph import Replicate
from ..indexing import _slice_of
from ..plans import PartSpec, Plan, hull, selector
from ..row_runs import block_i_range
from ..units import FULL, GroupRun, Label, Lowering, Unit

__all__ = ["ReplicatePlan", "cache_key", "fixed_row", "row_key", "lower", "LOWERINGS"]


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


def fixed_row(t: Replicate) -> Optional[Tuple[int, int]]:
    """``(owner, local row there)`` when ``t`` gathers a view of one fixed base row (``a[k, j:]``), else None."""
    v = t.src.view
    if v.row_entry is None or v.row_kept:
        return None
    dist = t.src.base.dist
    r = v.row_entry[1]
    return dist.owner_of(r), dist.local_index_of(r)


def row_key(t: Replicate, owner: int) -> Tuple:
    """The plan cache key of ``t``, a gather of one fixed row owned by ``owner``: what the plan depends on (the
    owner, the view without its row, dtype, root), not which row nor the layout, so that the gathers of every
    row of a loop share one plan and reuse its instances (the local row is given when lowering)."""
    v, src = t.src.view, t.src
    rest = v.entries[:v.lead_new()] + v.entries[v.lead_new() + 1:]
    return ("rep-row", owner, v.base_shape[1:], rest, src.dtype.str, t.root)


def lower(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The units of ``g.task`` (a :class:`~..graph.Replicate`) in flush ``fl``: one send per destination;
    on a destination, the copy of its own rows and one unpack per received message."""
    t: Replicate = g.task
    ctx = fl.ctx
    src, out = t.src, t.out
    row = fixed_row(t)
    if row is None:
        plan: ReplicatePlan = ctx.plan(cache_key(t), lambda: ReplicatePlan(t, fl.rank, fl.size))
        local_src, rhull = plan.local_src, plan.hull
    else:           # one plan per owner; this row's place in the owner's buffer is given here
        plan = ctx.plan(row_key(t, row[0]), lambda: ReplicatePlan(t, fl.rank, fl.size))
        local_src, rhull = row[1], ((row[1], row[1] + 1) if fl.rank == row[0] else (0, 0))
    desc = Label(lambda: t.desc)        # the task's text, built only if an error shows it
    inst, run = fl.group_run(plan, flush_no, desc)
    items = plan.items
    for k in range(len(plan.msgs_out)):
        if row is None:
            run.sends.append(fl.send_unit(plan, inst, k, lambda i: src.base.ensure(), lambda i: src.base.serial,
                                          desc))
            continue

        def pack(k=k) -> None:
            inst.send_parts[k][0][0] = src.base.ensure()[(local_src,) + items]

        run.sends.append(fl.send_unit(plan, inst, k, None, None, desc, pack=pack))
        run.sends[-1].access = ((src.base.serial, rhull[0], rhull[1], "R"),)
    if plan.is_dest:
        def local_fn() -> None:
            rl = out.base.ensure()
            sl = src.base.ensure()
            if row is None:
                rl[plan.local_dst] = sl[(local_src,) + items]
            elif fl.rank == row[0]:
                rl[0] = sl[(local_src,) + items]

        run.computes.append(Unit("compute", local_fn, desc, ((src.base.serial, rhull[0], rhull[1], "R"),
                                                               (out.base.serial, 0, FULL, "A"))))
        for k in range(len(plan.msgs_in)):
            def unpack(k=k) -> None:
                out.base.ensure()[plan.recv_dst[k]] = inst.recv_parts[k][0]

            u = Unit("compute", unpack, desc, ((out.base.serial, 0, FULL, "A"),))
            u.ndeps = 1
            run.recvs[k].units.append(u)
            run.computes.append(u)
    return run


LOWERINGS = {"replicate": lower}
