"""Redistribution between distributions (Chapel's data re-allocation by aggregation): ``b[...] = a`` and
``a.redistribute(dist)`` as ONE aggregated transfer, at most one message per peer, packed and unpacked by numba kernels.

Chapel's baseline (Sanz et al., SBAC-PAD 2012) assigns a Block array to a Cyclic one element by element, one message per
remote element; aggregating the transfer per destination is up to 1000x faster. Here every
copy ``out[view] = src[view]`` between two distributed bases whose rows are laid out
differently (block, cyclic, block-cyclic with any block size, any start and step, negative
steps, any trailing view) becomes a :class:`~..graph.Redistribute` task (the fusion pass
rewrites the recorded assignment, after inlining, so ``b[...] = a + 1`` still runs as one
fused kernel) lowered into units by :func:`lower` from a :class:`RedistributionPlan`:

* each rank derives, from the two distributions alone and without communicating, which of
  its source rows go to which peer and which of its target rows come from which peer, as
  runs of rows (:func:`~..packing.ap_runs`) and row patterns (:mod:`~..packing`); this is
  vectorized and done once per pair of layouts (the plan is cached by layout, so a time loop
  that redistributes again builds nothing);
* per peer and direction there is at most ONE message, holding every element that peer
  needs, in view order. A message whose elements are one contiguous range of the local block
  (a block of whole rows) is sent from, or received into, the local block itself; any other
  is packed by :func:`~..packing.pack` straight from the local block into a pre-allocated send
  buffer and unpacked by :func:`~..packing.unpack` from a pre-allocated receive buffer straight
  into the target block, on persistent requests (the plan's :class:`~..plans.Instance`);
* the rows that stay on the rank are copied by :func:`~..packing.copy_rows` while the messages fly.

Nothing is allocated when the same redistribution repeats: plan, buffers and requests are
reused; the only objects made per call are the request handles of in-place messages.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional, Tuple

import numpy as np

from ..graph import Leaf, Op, Redistribute
from ..packing import (OP_COPY, OP_PACK, OP_UNPACK, Interleave, RowPattern, ap_runs, contiguous_range, copy_rows,
                       group_by, joint_patterns, joint_runs, pack, row_pattern, unpack)
from ..plans import PartSpec, Plan, arena_layout, hull, my_rows
from ..row_runs import block_i_range
from ..units import GroupRun, Lowering, Unit, Waitable

_now = time.perf_counter_ns

__all__ = ["RedistributionPlan", "copy_source", "cache_key", "lower", "LOWERINGS"]


def copy_source(task: Any) -> Optional[Leaf]:
    """The source Leaf if ``task`` (an Assign) is a plain copy, possibly with a cast, between two distributed
    bases whose rows are laid out differently, with the row axis first and equal shapes; else None (the
    copy stays an elementwise task: row-aligned copies need no communication, broadcasts and gathers
    of a single row go through the replicated path)."""
    expr = task.expr
    if isinstance(expr, Op) and expr.name == "cast" and len(expr.args) == 1 and isinstance(expr.args[0], Leaf):
        leaf = expr.args[0]
    elif isinstance(expr, Leaf):
        leaf = expr
    else:
        return None
    out = task.out
    sb, ob = leaf.base, out.base
    if sb.replicated or ob.replicated or sb is ob or sb.context is not ob.context:
        return None
    sv, tv = leaf.view, out.view
    if not (sv.row_kept and tv.row_kept) or sv.lead_new() or tv.lead_new():
        return None
    if sv.shape != tv.shape or not sv.shape:
        return None
    if (sb.dist.key, sv.row_params) == (ob.dist.key, tv.row_params):
        return None
    return leaf


class RedistributionPlan(Plan):
    """This rank's part of ``out[view] = src[view]`` between two row layouts (see the module doc).

    Packed messages are ``msgs_out`` / ``msgs_in`` (their buffers and persistent requests live in the
    plan's instances), with their rows in ``send_runs`` / ``recv_runs``. In-place messages are
    ``direct_out`` / ``direct_in``: ``(peer, first element, stop element, first row, stop row)`` of the
    local block. ``local_runs`` are the joint runs copied on the rank. ``spat`` / ``tpat``: row patterns
    of source and target (``lspat`` / ``ltpat``: the joint pair for the local copy). ``*_hull``: local
    row ranges touched, for the scheduler's dependencies.
    """

    kind = "redistribute"

    def __init__(self, src: Leaf, out: Leaf, rank: int, nranks: int):
        super().__init__()
        sv, tv = src.view, out.view
        ss, st, n = sv.row_params
        ts, tt, n2 = tv.row_params
        if n != n2:  # pragma: no cover - copy_source checks the shapes
            raise ValueError(f"row counts differ: {n} vs {n2}")
        sd, td = src.base.dist, out.base.dist
        self.src_dtype, self.out_dtype = src.dtype, out.dtype
        self.spat: RowPattern = row_pattern(sv, src.base.shape[1:])
        self.tpat: RowPattern = row_pattern(tv, out.base.shape[1:])
        self.lspat, self.ltpat = joint_patterns(sv, src.base.shape[1:], tv, out.base.shape[1:])
        elems = self.spat.count
        self.send_runs: List[np.ndarray] = []
        self.recv_runs: List[np.ndarray] = []
        self.send_hulls: List[Tuple[int, int]] = []
        self.recv_hulls: List[Tuple[int, int]] = []
        self.direct_out: List[Tuple[int, int, int, int, int]] = []
        self.direct_in: List[Tuple[int, int, int, int, int]] = []
        self.local_runs = np.empty((0, 5), dtype=np.int64)
        self.local_src_hull = self.local_out_hull = (0, 0)
        self.rows_moved = 0
        #: the packed messages (and the local copy, if ``*_local``) walked in one pass (see packing.Interleave)
        self.send_group: Optional[Interleave] = None
        self.recv_group: Optional[Interleave] = None
        self.send_group_local = self.recv_group_local = False
        if n == 0 or elems == 0:
            return
        same_dtype = self.src_dtype == self.out_dtype
        # -- what leaves this rank: view rows whose source row is here, grouped by the target row's owner
        send_parts = {}
        for q, cnt, runs, h, local in _by_peer(sd, ss, st, td, ts, tt, n, rank, nranks):
            if q == rank:
                self.local_runs, self.local_src_hull, self.local_out_hull = local
                continue
            rng = contiguous_range(runs, self.spat)
            self.rows_moved += cnt
            if rng is not None:
                self.direct_out.append((q, rng[0], rng[1], h[0], h[1]))
            else:
                send_parts[q] = [PartSpec(0, cnt, self.src_dtype, (elems,), hull=h)]
                self.send_runs.append(runs)
                self.send_hulls.append(h)
        # -- what arrives: view rows whose target row is here, grouped by the source row's owner
        recv_parts = {}
        for q, cnt, runs, h, _ in _by_peer(td, ts, tt, sd, ss, st, n, rank, nranks):
            if q == rank:
                continue
            rng = contiguous_range(runs, self.tpat) if same_dtype else None
            if rng is not None:
                self.direct_in.append((q, rng[0], rng[1], h[0], h[1]))
            else:
                recv_parts[q] = [PartSpec(0, cnt, self.src_dtype, (elems,), hull=h)]
                self.recv_runs.append(runs)
                self.recv_hulls.append(h)
        self.msgs_out = self._messages(send_parts)
        self.msgs_in = self._messages(recv_parts)
        self._find_groups(elems)

    def _find_groups(self, elems: int) -> None:
        """Interleaved streams (whole rows only): the packed sends with the local copy on the sending side,
        else the packed receives with the local copy on the receiving side."""
        if not (self.spat.whole_row and self.tpat.whole_row and self.lspat.whole_row and self.ltpat.whole_row):
            return
        isz = self.src_dtype.itemsize
        lr = self.local_runs
        local = len(lr) == 1
        if self.msgs_out:
            offs, _ = arena_layout(self.msgs_out)
            parts = [(OP_PACK, self.send_runs[k], offs[k] // isz, elems) for k in range(len(self.msgs_out))]
            if local:
                parts.append((OP_COPY, lr[:, [0, 1, 4]], int(lr[0, 2]), int(lr[0, 3])))
            self.send_group = Interleave.find(True, parts, elems)
            self.send_group_local = self.send_group is not None and local
        if self.msgs_in and not self.send_group_local:
            offs, _ = arena_layout(self.msgs_in)
            parts = [(OP_UNPACK, self.recv_runs[k], offs[k] // isz, elems) for k in range(len(self.msgs_in))]
            if local:
                parts.append((OP_COPY, lr[:, [2, 3, 4]], int(lr[0, 0]), int(lr[0, 1])))
            self.recv_group = Interleave.find(False, parts, elems)
            self.recv_group_local = self.recv_group is not None and local

    @property
    def messages_out(self) -> int:
        """Messages this rank sends per use (packed and in place): at most one per peer."""
        return len(self.msgs_out) + len(self.direct_out)

    def flat_parts(self, inst) -> Tuple[List[np.ndarray], List[np.ndarray], np.ndarray, np.ndarray]:
        """The instance's send and receive buffers as flat arrays of the source dtype, and its two arenas as
        such arrays (made once per instance)."""
        got = inst.extra.get("flat")
        if got is None:
            got = inst.extra["flat"] = ([p[0].reshape(-1) for p in inst.send_parts],
                                        [p[0].reshape(-1) for p in inst.recv_parts],
                                        inst.send_arena.view(self.src_dtype), inst.recv_arena.view(self.src_dtype))
        return got

    def describe(self) -> str:
        """One line: messages and rows of this rank's part."""
        inter = ""
        if self.send_group is not None:
            inter = f"; sends{' and local copy' if self.send_group_local else ''} packed in one interleaved pass"
        elif self.recv_group is not None:
            inter = f"; receives{' and local copy' if self.recv_group_local else ''} unpacked in one interleaved pass"
        return (f"redistribution plan: {len(self.msgs_out)} packed + {len(self.direct_out)} in-place sends, "
                f"{len(self.msgs_in)} packed + {len(self.direct_in)} in-place receives, "
                f"{int(self.local_runs[:, 4].sum()) if len(self.local_runs) else 0} rows copied locally in "
                f"{len(self.local_runs)} runs{inter}")


# =========================================================================== cache key and lowering

def _by_peer(hd, hs: int, ht: int, od, os_: int, ot: int, n: int, rank: int, nranks: int):
    """For the view rows ``i`` (``0 <= i < n``) whose row ``hs + i * ht`` of layout ``hd`` is on ``rank``, grouped
    by the owner ``q`` of their row ``os_ + i * ot`` in layout ``od`` (increasing ``q``, rows in increasing ``i``):
    ``(q, count, runs of local rows here (start, step, count), their hull, local)``, where for ``q == rank``
    ``local`` is ``(joint runs with the local rows there, hull here, hull there)``. In closed form (one run per
    peer) when both layouts are block, row by row otherwise."""
    if hd.kind == "block" and od.kind == "block":
        lo, hi = hd.block_range(rank)
        a, b = block_i_range(lo, hi, hs, ht, n)
        for q in range(nranks):
            qlo, qhi = od.block_range(q)
            qa, qb = block_i_range(qlo, qhi, os_, ot, n)
            x, y = max(a, qa), min(b, qb)
            if x >= y:
                continue
            c = y - x
            r0, d = hs + x * ht - lo, (ht if c > 1 else 1)
            h = _ap_hull(r0, d, c)
            local = None
            if q == rank:
                o0, od_ = os_ + x * ot - qlo, (ot if c > 1 else 1)
                local = (np.array([[r0, d, o0, od_, c]], dtype=np.int64), h, _ap_hull(o0, od_, c))
            yield q, c, np.array([[r0, d, c]], dtype=np.int64), h, local
        return
    i_h, lh = my_rows(hd, hs, ht, n, rank)
    order, bounds = group_by(od.owner(os_ + i_h * ot), nranks)
    for q in range(nranks):
        a, b = int(bounds[q]), int(bounds[q + 1])
        if b <= a:
            continue
        sel = order[a:b]
        rows = lh[sel]
        local = None
        if q == rank:
            lo_ = od.local_index(os_ + i_h[sel] * ot)
            local = (joint_runs(rows, lo_), hull(rows), hull(lo_))
        yield q, len(rows), ap_runs(rows), hull(rows), local


def _ap_hull(start: int, step: int, count: int) -> Tuple[int, int]:
    """``(min, max + 1)`` of the progression ``start + k * step``, ``0 <= k < count`` (``count >= 1``)."""
    last = start + step * (count - 1)
    return min(start, last), max(start, last) + 1

def cache_key(t: Redistribute) -> Tuple:
    """The plan cache key of ``t``: layouts, views and dtypes of source and target."""
    src, out = t.src, t.out
    return ("rd", src.base.dist.key, src.view.key, src.dtype.str, out.base.dist.key, out.view.key, out.dtype.str)


def _flat(b) -> np.ndarray:
    if b.flat is None:
        b.ensure()
    return b.flat


def _span(hulls) -> Tuple[int, int]:
    hulls = [h for h in hulls if h[1] > h[0]]
    return (min(h[0] for h in hulls), max(h[1] for h in hulls)) if hulls else (0, 0)


def lower(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The units of ``g.task`` (a :class:`~..graph.Redistribute`) in flush ``fl``: one aggregated transfer,
    at most one message per peer and direction.

    Packed messages: pack kernel + persistent send; persistent receive + unpack kernel (for the streams
    of a cyclic exchange, all packs, or all unpacks, with the local copy in one interleaved pass).
    In-place messages: the send (or receive) is started from (into) the local block by a communication
    unit that waits for the earlier units touching those rows, and a no-op unit holding the rows until
    the request completes orders the later ones. The rows that stay here are copied meanwhile."""
    t: Redistribute = g.task
    ctx = fl.ctx
    src, out = t.src, t.out
    plan: RedistributionPlan = ctx.plan(cache_key(t), lambda: RedistributionPlan(src, out, fl.rank, fl.size))
    inst, run = fl.group_run(plan, flush_no, t.desc)
    sb, ob = src.base, out.base
    _lower_sends(fl, t, plan, inst, run)
    _lower_unpacks(fl, t, plan, inst, run)
    for (peer, lo, hi, rlo, rhi) in plan.direct_in:
        _lower_in_place(fl, t, inst, run, ob, peer, lo, hi, rlo, rhi, False)
    for (peer, lo, hi, rlo, rhi) in plan.direct_out:
        _lower_in_place(fl, t, inst, run, sb, peer, lo, hi, rlo, rhi, True)
    if len(plan.local_runs) and not plan.send_group_local and not plan.recv_group_local:
        def local_fn() -> None:
            copy_rows(_flat(ob), plan.ltpat, _flat(sb), plan.lspat, plan.local_runs)

        sh, oh = plan.local_src_hull, plan.local_out_hull
        run.computes.append(Unit("compute", local_fn, t.desc, ((sb.serial, sh[0], sh[1], "R"),
                                                               (ob.serial, oh[0], oh[1], "W"))))
    return run


def _lower_sends(fl: Lowering, t: Redistribute, plan: RedistributionPlan, inst, run: GroupRun) -> None:
    """The packed sends: one unit packing every message (and maybe the local copy) in one interleaved pass
    and starting them, else one pack-and-send unit per message."""
    sb, ob = t.src.base, t.out.base
    sflat, rflat, sarena, rarena = plan.flat_parts(inst)
    if plan.send_group is not None and plan.msgs_out:
        def pack_all_and_send(group=plan.send_group) -> None:
            t0 = _now()
            group.run(_flat(sb), _flat(ob), sarena, rarena)
            t1 = _now()
            for k, m in enumerate(plan.msgs_out):
                req = inst.send_reqs[k]
                req.Start()
                fl.sent(req, m.peer, m.nbytes, inst, t0 if k == 0 else t1, f"send for {t.desc} to rank {m.peer}")

        acc = [(sb.serial,) + _span(plan.send_hulls + ([plan.local_src_hull] if plan.send_group_local else []))
               + ("R",)]
        if plan.send_group_local:
            acc.append((ob.serial,) + plan.local_out_hull + ("W",))
        run.sends.append(Unit("send", pack_all_and_send, f"pack and send {t.desc}", tuple(acc)))
        return
    for k in range(len(plan.msgs_out)):
        def pk(k=k) -> None:
            pack(_flat(sb), plan.send_runs[k], plan.spat, sflat[k])

        u = fl.send_unit(plan, inst, k, None, None, t.desc, pack=pk)
        h = plan.send_hulls[k]
        u.access = ((sb.serial, h[0], h[1], "R"),)
        run.sends.append(u)


def _lower_unpacks(fl: Lowering, t: Redistribute, plan: RedistributionPlan, inst, run: GroupRun) -> None:
    """The packed receives: one unit unpacking every message (and maybe the local copy) in one interleaved
    pass when all have arrived, else one unpack unit per message."""
    sb, ob = t.src.base, t.out.base
    sflat, rflat, sarena, rarena = plan.flat_parts(inst)
    if plan.recv_group is not None and plan.msgs_in:
        def unpack_all(group=plan.recv_group) -> None:
            group.run(_flat(sb), _flat(ob), sarena, rarena)

        acc = [(ob.serial,) + _span(plan.recv_hulls + ([plan.local_out_hull] if plan.recv_group_local else []))
               + ("W",)]
        if plan.recv_group_local:
            acc.append((sb.serial,) + plan.local_src_hull + ("R",))
        u = Unit("compute", unpack_all, t.desc, tuple(acc))
        u.ndeps = len(plan.msgs_in)
        for w in run.recvs:
            w.units.append(u)
        run.computes.append(u)
        return
    for k in range(len(plan.msgs_in)):
        def unp(k=k) -> None:
            unpack(_flat(ob), plan.recv_runs[k], plan.tpat, rflat[k])

        h = plan.recv_hulls[k]
        u = Unit("compute", unp, t.desc, ((ob.serial, h[0], h[1], "W"),))
        u.ndeps = 1
        run.recvs[k].units.append(u)
        run.computes.append(u)


def _lower_in_place(fl: Lowering, t: Redistribute, inst: Any, run: GroupRun, base: Any, peer: int, lo: int,
                    hi: int, rlo: int, rhi: int, sending: bool) -> None:
    """An in-place message: a communication unit starting the send from (receive into) elements ``[lo, hi)``
    of the local block, and a no-op unit holding local rows ``[rlo, rhi)`` until the request completes."""
    mode = "R" if sending else "W"
    nbytes = (hi - lo) * base.dtype.itemsize
    what = f"{'send' if sending else 'receive'} for {t.desc} {'to' if sending else 'from'} rank {peer}"
    held = Unit("compute", lambda: None, t.desc, ((base.serial, rlo, rhi, mode),))
    held.ndeps = 1
    comm, MPI = fl.ctx.dcomm, fl.MPI

    def start() -> None:
        t0 = _now()
        mem = _flat(base)[lo:hi].view(np.uint8)
        if sending:
            req = comm.Isend([mem, MPI.BYTE], dest=peer, tag=inst.tag)
            w = fl.sent(req, peer, nbytes, inst, t0, what)
        else:
            req = comm.Irecv([mem, MPI.BYTE], source=peer, tag=inst.tag)
            w = Waitable(req, "recv", peer, inst.tag, nbytes, inst.uses, what, inst)
            fl.start(w)
        w.units.append(held)

    run.sends.append(Unit("send", start, what, ((base.serial, rlo, rhi, mode),)))
    run.computes.append(held)


LOWERINGS = {"redistribute": lower}
