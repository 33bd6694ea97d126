"""Which rows an elementwise plan computes on this rank, receives, sends, and how it cuts them into blocks.

The elementwise plan (:class:`~.operations.elementwise.ElementwisePlan`) computes the rows
``i`` (``0 <= i < n``) of a row space whose global row ``s0 + i * t0`` is owned by this rank
in the space's distribution. Each operand laid out unlike the space (``ops``: its
distribution and view rows ``ls + i * lt``) has, for each computed row, a source rank and a
local index there. This module answers, as a :class:`RowPlan`:

* ``recv``: per operand and source rank, how many rows come from there;
* ``send``: per operand and destination rank, which local rows go there;
* ``segs``: the computed rows cut into maximal segments where every operand comes from one
  place (local buffer or one received part) and every index is an arithmetic progression.

Two builders give the same answer. :func:`by_runs` works on runs of rows in closed form
(``O(ranks x operands)`` whatever the number of rows) and applies when the space and every
operand are ``block`` distributed (the default layout). :func:`by_rows` works row by row over
every global row (vectorised NumPy) and applies to any layout (cyclic, block-cyclic).
:func:`row_plan` picks one. Pure functions: no MPI, no context, the same on every rank.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .plans import my_rows, segments

__all__ = ["RowPlan", "row_plan", "by_runs", "by_rows", "block_i_range"]

#: One operand laid out unlike the row space: (its distribution, view start row, view row step).
Operand = Tuple[Any, int, int]
#: ``(first, step, count)`` of an arithmetic progression of local rows.
AP = Tuple[int, int, int]


class RowPlan:
    """The rows of one elementwise plan on one rank (see the module doc).

    ``count``: rows computed here. ``recv``: ``(operand k, source rank, rows)`` in operand order, then
    source order. ``send``: ``(operand k, destination rank, local rows)`` in the same order, the local
    rows as an int64 array or an :data:`AP`. ``segs``: ``(cnt, i0, di, out0, outd, ops)`` in order: ``cnt``
    rows whose space index is ``i0 + j * di``, output local index ``out0 + j * outd`` and, per operand,
    ``(q, v0, dv)``: from rank ``q``, at local index (``q`` is this rank) or position in the received
    part ``v0 + j * dv``. A step of a one-row segment is 1.
    """

    __slots__ = ("count", "recv", "send", "segs")

    def __init__(self, count: int, recv: List[Tuple[int, int, int]], send: List[Tuple[int, int, Any]],
                 segs: List[Tuple[int, int, int, int, int, Tuple[Tuple[int, int, int], ...]]]):
        self.count, self.recv, self.send, self.segs = count, recv, send, segs


#: Row plans by everything they depend on (see :func:`row_plan`); cleared when full. A :class:`RowPlan` is
#: never changed once built, so plans of different groups over the same rows share it.
_MEMO: Dict[Tuple, RowPlan] = {}
_MEMO_MAX = 2048


def row_plan(sd, s0: int, t0: int, n: int, ops: Sequence[Operand], rank: int, need_i: bool) -> RowPlan:
    """The :class:`RowPlan` of rank ``rank``: :func:`by_runs` when the space ``sd`` and every operand are
    block distributed, else :func:`by_rows`. ``need_i``: segments must also keep ``i`` arithmetic.
    Memoised by the distributions' keys, the view rows, ``rank`` and ``need_i`` (a pivot step's groups
    often run over the same rows)."""
    key = (sd.key, s0, t0, n, tuple([(d.key, ls, lt) for d, ls, lt in ops]), rank, need_i)
    rp = _MEMO.get(key)
    if rp is not None:
        return rp
    if sd.kind == "block" and all(d.kind == "block" for d, _, _ in ops):
        rp = by_runs(sd, s0, t0, n, ops, rank)
    else:
        rp = by_rows(sd, s0, t0, n, ops, rank, need_i)
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    _MEMO[key] = rp
    return rp


def block_i_range(lo: int, hi: int, s: int, t: int, n: int) -> Tuple[int, int]:
    """``[i0, i1)``: the ``i`` (``0 <= i < n``) whose row ``s + i * t`` falls in ``[lo, hi)`` (``t != 0``);
    contiguous since rows are monotone in ``i``. Empty ranges have ``i1 <= i0``."""
    if hi <= lo or n <= 0:
        return 0, 0
    if t > 0:                                   # s + i*t >= lo  and  s + i*t < hi
        return max(0, -(-(lo - s) // t)), min(n, -(-(hi - s) // t))
    u = -t                                      # t < 0: s + i*t <= hi - 1  and  s + i*t >= lo
    return max(0, -(-(s - (hi - 1)) // u)), min(n, (s - lo) // u + 1)


def _step(d: int, cnt: int) -> int:
    return d if cnt > 1 else 1


def by_runs(sd, s0: int, t0: int, n: int, ops: Sequence[Operand], rank: int) -> RowPlan:
    """:class:`RowPlan` for a block-distributed space and block-distributed operands, in closed form.

    Every rank's rows of a block layout seen through a strided view are one run of ``i``; intersecting
    the runs of the space and of each operand gives the messages and the segments without touching rows."""
    lo, hi = sd.block_range(rank)
    m0, m1 = block_i_range(lo, hi, s0, t0, n)
    m1 = max(m0, m1)
    if not ops:                                  # every operand aligned: one segment, nothing exchanged
        segs = [(m1 - m0, m0, 1, s0 + m0 * t0 - lo, _step(t0, m1 - m0), ())] if m1 > m0 else []
        return RowPlan(m1 - m0, [], [], segs)
    comp = [block_i_range(*sd.block_range(c), s0, t0, n) for c in range(sd.nranks)]
    recv: List[Tuple[int, int, int]] = []
    send: List[Tuple[int, int, Any]] = []
    runs: List[List[Tuple[int, int, int, int]]] = []   # per operand: (x, y, q, first row of q), increasing x
    for k, (dist, ls, lt) in enumerate(ops):
        mine_k = []
        for q in range(dist.nranks):
            qlo, qhi = dist.block_range(q)
            a0, a1 = block_i_range(qlo, qhi, ls, lt, n)
            x, y = max(a0, m0), min(a1, m1)
            if x < y:
                mine_k.append((x, y, q, qlo))
            if q == rank:
                for c in range(sd.nranks):
                    cx, cy = max(a0, comp[c][0]), min(a1, comp[c][1])
                    if c != rank and cx < cy:
                        send.append((k, c, (ls + cx * lt - qlo, _step(lt, cy - cx), cy - cx)))
        recv.extend((k, q, y - x) for (x, y, q, _) in sorted(mine_k, key=lambda r: r[2]) if q != rank)
        runs.append(sorted(mine_k))
    cuts = sorted({m0, m1}.union(x for rk in runs for (x, _, _, _) in rk))
    segs = []
    at = [0] * len(ops)
    for x, y in zip(cuts[:-1], cuts[1:]):
        cnt = y - x
        per = []
        for k, (dist, ls, lt) in enumerate(ops):
            rk = runs[k]
            while rk[at[k]][1] <= x:
                at[k] += 1
            rx, _, q, qlo = rk[at[k]]
            per.append((q, ls + x * lt - qlo, _step(lt, cnt)) if q == rank else (q, x - rx, 1))
        segs.append((cnt, x, 1, s0 + x * t0 - lo, _step(t0, cnt), tuple(per)))
    return RowPlan(m1 - m0, recv, send, segs)


def by_rows(sd, s0: int, t0: int, n: int, ops: Sequence[Operand], rank: int, need_i: bool) -> RowPlan:
    """:class:`RowPlan` for any layouts, row by row over every global row (vectorised NumPy, ``O(n)``)."""
    if not ops:
        mine, out_loc = my_rows(sd, s0, t0, n, rank)
        comp = None
    else:
        comp = sd.owner(s0 + np.arange(n, dtype=np.int64) * t0)
        mine = np.flatnonzero(comp == rank).astype(np.int64)
        out_loc = sd.local_index(s0 + mine * t0)
    i_all = np.arange(n, dtype=np.int64)
    recv: List[Tuple[int, int, int]] = []
    send: List[Tuple[int, int, Any]] = []
    srcs: List[np.ndarray] = []
    seqs: List[np.ndarray] = [out_loc] + ([mine] if need_i else [])
    for k, (dist, ls, lt) in enumerate(ops):
        rows_all = ls + i_all * lt
        src_all = dist.owner(rows_all)
        loc_all = dist.local_index(rows_all)
        sm = src_all[mine]
        pos = np.zeros(len(mine), dtype=np.int64)
        for q in np.unique(sm):
            q = int(q)
            if q == rank:
                continue
            mask = sm == q
            cnt = int(mask.sum())
            pos[mask] = np.arange(cnt, dtype=np.int64)
            recv.append((k, q, cnt))
        srcs.append(sm)
        seqs.append(np.where(sm == rank, loc_all[mine], pos))
        smask = (src_all == rank) & (comp != rank)
        if smask.any():
            dests = comp[smask]
            rows_i = np.flatnonzero(smask)
            for c in np.unique(dests):
                send.append((k, int(c), loc_all[rows_i[dests == c]]))
    segs = []
    for (s, e) in segments(len(mine), srcs, seqs):
        cnt = e - s

        def ap(seq: np.ndarray) -> Tuple[int, int]:
            return int(seq[s]), (int(seq[s + 1] - seq[s]) if cnt > 1 else 1)

        per = tuple((int(srcs[k][s]),) + ap(seqs[k + 1 + need_i]) for k in range(len(ops)))
        segs.append((cnt,) + ap(mine) + ap(out_loc) + (per,))
    return RowPlan(len(mine), recv, send, segs)
