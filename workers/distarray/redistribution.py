"""Redistribution between distributions (seed 004): ``b[...] = a`` and ``a.redistribute(dist)`` as ONE
aggregated transfer, at most one message per peer, packed and unpacked by numba kernels.

The seed's baseline assigns a Block array to a Cyclic one element by element, one message per
remote element; aggregating the transfer per destination is up to 1000x faster. Here every
copy ``out[view] = src[view]`` between two distributed bases whose rows are laid out
differently (block, cyclic, block-cyclic with any block size, any start and step, negative
steps, any trailing view) becomes a :class:`~.graph.Redistribute` task (the fusion pass
rewrites the recorded assignment, after inlining, so ``b[...] = a + 1`` still runs as one
fused kernel) executed by the scheduler from a :class:`RedistributionPlan`:

* each rank derives, from the two distributions alone and without communicating, which of
  its source rows go to which peer and which of its target rows come from which peer, as
  runs of rows (:func:`~.packing.ap_runs`) and row patterns (:mod:`~.packing`); this is
  vectorized and done once per pair of layouts (the plan is cached by layout, so a time loop
  that redistributes again builds nothing);
* per peer and direction there is at most ONE message, holding every element that peer
  needs, in view order. A message whose elements are one contiguous range of the local block
  (a block of whole rows) is sent from, or received into, the local block itself; any other
  is packed by :func:`~.packing.pack` straight from the local block into a pre-allocated send
  buffer and unpacked by :func:`~.packing.unpack` from a pre-allocated receive buffer straight
  into the target block, on persistent requests (the plan's :class:`~.plans.Instance`);
* the rows that stay on the rank are copied by :func:`~.packing.copy_rows` while the messages fly.

Nothing is allocated when the same redistribution repeats: plan, buffers and requests are
reused; the only objects made per call are the request handles of in-place messages.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from .graph import Leaf, Op
from .packing import (OP_COPY, OP_PACK, OP_UNPACK, Interleave, RowPattern, ap_runs, contiguous_range, group_by,
                      joint_patterns, joint_runs, row_pattern)
from .plans import PartSpec, Plan, _hull, _my_rows_fast, arena_layout

__all__ = ["RedistributionPlan", "copy_source"]


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
    if sb.replicated or ob.replicated or sb is ob or sb.engine is not ob.engine:
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
        i_s, ls = _my_rows_fast(sd, ss, st, n, rank)
        order, bounds = group_by(td.owner(ts + i_s * tt), nranks)
        send_parts = {}
        for q in range(nranks):
            a, b = int(bounds[q]), int(bounds[q + 1])
            if b <= a:
                continue
            sel = order[a:b]
            rows = ls[sel]
            if q == rank:
                lt = td.local_index(ts + i_s[sel] * tt)
                self.local_runs = joint_runs(rows, lt)
                self.local_src_hull = _hull(rows)
                self.local_out_hull = _hull(lt)
                continue
            runs = ap_runs(rows)
            rng = contiguous_range(runs, self.spat)
            hull = _hull(rows)
            self.rows_moved += len(rows)
            if rng is not None:
                self.direct_out.append((q, rng[0], rng[1], hull[0], hull[1]))
            else:
                send_parts[q] = [PartSpec(0, len(rows), self.src_dtype, (elems,), hull=hull)]
                self.send_runs.append(runs)
                self.send_hulls.append(hull)
        # -- what arrives: view rows whose target row is here, grouped by the source row's owner
        i_t, lt_all = _my_rows_fast(td, ts, tt, n, rank)
        order, bounds = group_by(sd.owner(ss + i_t * st), nranks)
        recv_parts = {}
        for q in range(nranks):
            a, b = int(bounds[q]), int(bounds[q + 1])
            if b <= a or q == rank:
                continue
            rows = lt_all[order[a:b]]
            runs = ap_runs(rows)
            rng = contiguous_range(runs, self.tpat) if same_dtype else None
            hull = _hull(rows)
            if rng is not None:
                self.direct_in.append((q, rng[0], rng[1], hull[0], hull[1]))
            else:
                recv_parts[q] = [PartSpec(0, len(rows), self.src_dtype, (elems,), hull=hull)]
                self.recv_runs.append(runs)
                self.recv_hulls.append(hull)
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
