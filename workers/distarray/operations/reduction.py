"""Reductions inside an elementwise group: combining the blocks' partial results, then the ranks'.

A ``Reduce`` task over all rows (``axis`` None or 0) is fused into its group's kernel, which
writes one partial result per block into a slot of the plan's instance (:mod:`.elementwise`).
This module lowers what follows the blocks: over replicated rows one unit combines the slots
and stores the result; over distributed rows one allgather unit (a collective, started when the
rank's blocks are done, in the same order on every rank) sends this rank's combined partials to
every rank, and a finish unit combines every rank's partials and stores the result, the same on
every rank. The operators' identities and combinations are in :mod:`~..reductions`.

A ``Reduce`` along another axis is written by the kernel itself, element by element of its
target. When the group's iteration space is empty (a reduced axis of length 0: ``zeros((3, 0))
.sum(axis=1)``) the plan has no block and no kernel call writes the target; one unit then sets
this rank's part of it to the reduction over no element (the identity, NaN for ``mean``), as
NumPy: a sum over an empty axis is 0, a product 1, ``any`` False, ``all`` True.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ..graph import Leaf
from ..plans import my_rows, selector
from ..reductions import combine_partials, identity_array
from ..units import FULL, GroupRun, Label, Lowering, Unit, Waitable, after

__all__ = ["lower_partials"]


def lower_partials(fl: Lowering, g: Any, plan: Any, inst: Any, run: GroupRun, slots: Dict[int, np.ndarray],
                   flush_no: int) -> None:
    """Add to ``run`` the units that turn the blocks' partial results of ``g``'s reductions into their
    targets (nothing if the group has no reduction over all rows). Called while lowering ``g``, after its
    block units."""
    _lower_empty_targets(fl, g, plan, run)
    slot_reds = [r for r in plan.reds if r[4] is not None]
    if not slot_reds:
        return
    nblocks = len(plan.blocks)

    def local_partials() -> List[np.ndarray]:
        out = []
        for (a, op, axis, acc, pshape) in slot_reds:
            if nblocks == 0:
                out.append(identity_array(op, acc, pshape))
            else:
                sl = slots[a].reshape((-1,) + tuple(pshape))[:nblocks]
                out.append(combine_partials(op, sl, acc))
        return out

    finalize = _finalizer(g, slot_reds)
    out_serials = tuple((g.arrays[a][1].out.base.serial, 0, FULL, "W") for (a, *_r) in slot_reds)
    if g.space.rep:
        fin = Unit("compute", lambda: finalize(local_partials()), g.label, out_serials)
        for u in run.computes:
            after(fin, u)
        run.finish = fin
        return
    _lower_allgather(fl, g, inst, run, slot_reds, local_partials, finalize, out_serials, flush_no)


def _empty_result(op: str, dtype: np.dtype) -> np.ndarray:
    """The 0-d value of reduction ``op`` over no element in ``dtype`` (NumPy's): the operator's identity
    (``sum`` 0, ``prod`` 1, ``any`` False, ``all`` True), NaN for ``mean``. ``min``/``max`` have none
    (recording them over an empty axis raises, :func:`~..reductions.record_reduce`): ValueError."""
    if op in ("min", "max"):
        raise ValueError(f"reduction {op!r} over no element has no value")
    if op == "mean":
        return np.array(np.nan).astype(dtype)
    return identity_array(op, dtype, ())


def _fill_local(leaf: Leaf, value: np.ndarray, rank: int) -> None:
    """Set this rank's elements of ``leaf`` (a reduction target: a replicated base, or a distributed base
    viewed along its rows) to ``value``. Local."""
    b, v = leaf.base, leaf.view
    loc = b.ensure()
    if b.replicated:
        loc[v.numpy_index()] = value
        return
    s, t, n = v.row_params
    _, lidx = my_rows(b.dist, s, t, n, rank)
    if len(lidx):
        loc[v.numpy_index(row_sel=selector(lidx))] = value


def _lower_empty_targets(fl: Lowering, g: Any, plan: Any, run: GroupRun) -> None:
    """Over an empty iteration space (no block, no kernel call), add to ``run`` one unit writing the
    reduction over no element (:func:`_empty_result`) into this rank's part of each target of a reduction
    along a non-row axis (the kernel writes those targets, so nothing else would; the reductions over all
    rows get their identity from :func:`lower_partials`). A non-empty target over an empty space means an
    empty reduced axis, which ``min``/``max`` never get here with (recording raises NumPy's error)."""
    if math.prod(plan.shape) != 0:
        return
    targets = [(op, g.arrays[a][1].out) for (a, op, axis, acc, pshape) in plan.reds
               if pshape is None and math.prod(g.arrays[a][1].out.shape) > 0]   # an empty result: nothing to write
    if not targets:
        return
    rank = fl.rank

    def fill() -> None:
        for op, leaf in targets:
            _fill_local(leaf, _empty_result(op, leaf.dtype), rank)

    access = tuple((leaf.base.serial, 0, FULL, "W") for _, leaf in targets)
    run.computes.append(Unit("compute", fill, g.label, access))


def _finalizer(g, slot_reds: List[Tuple]) -> Callable[[List[np.ndarray]], None]:
    """The function storing each reduction's combined result (a mean divided by its count) in its target."""
    def finalize(parts_per_red: List[np.ndarray]) -> None:
        for (a, op, axis, acc, pshape), part in zip(slot_reds, parts_per_red):
            task = g.arrays[a][1]
            res = np.asarray(part)
            if op == "mean":
                res = res / task.count if task.count else res * np.nan
            ob = task.out.base
            dst = ob.ensure()
            dst[...] = np.asarray(res).astype(ob.dtype, copy=False).reshape(ob.shape)
    return finalize


def _lower_allgather(fl: Lowering, g: Any, inst: Any, run: GroupRun, slot_reds: List[Tuple],
                     local_partials: Callable[[], List[Any]], finalize: Callable[[List[np.ndarray]], None],
                     out_serials: Tuple, flush_no: int) -> None:
    """Distributed rows: an allgather unit after every block (and after the previous group's allgather,
    see the scheduler), then a finish unit combining every rank's partials when it has completed."""
    size = fl.size
    layout = []
    off = 0
    for (a, op, axis, acc, pshape) in slot_reds:
        nb = math.prod(pshape) * np.dtype(acc).itemsize
        layout.append((off, nb, np.dtype(acc), tuple(pshape)))
        off = (off + nb + 7) & ~7
    total = max(off, 8)
    ex = inst.extra
    if "gsend" not in ex or ex["gsend"].nbytes != total:
        ex["gsend"] = np.zeros(total, dtype=np.uint8)
        ex["grecv"] = np.zeros(total * size, dtype=np.uint8)
    gsend, grecv = ex["gsend"], ex["grecv"]
    fin = Unit("compute", lambda: None, g.label, out_serials)
    ctx = fl.ctx

    def start_coll() -> None:
        for (o, nb, dt, ps), part in zip(layout, local_partials()):
            gsend[o:o + nb] = np.ascontiguousarray(np.asarray(part, dtype=dt)).view(np.uint8).reshape(-1)
        req = ctx.dcomm.Iallgather([gsend, fl.MPI.BYTE], [grecv, fl.MPI.BYTE])
        w = Waitable(req, "coll", -1, 0, total, flush_no,
                     Label(lambda: f"allgather of the partial results of {g.desc}"))
        w.units.append(fin)
        fin.ndeps += 1
        fl.start(w)

    def finish() -> None:
        allp = grecv.reshape(size, total)
        parts = []
        for (a, op, axis, acc, pshape), (o, nb, dt, ps) in zip(slot_reds, layout):
            per_rank = np.ascontiguousarray(allp[:, o:o + nb]).view(dt).reshape((size,) + ps)
            parts.append(combine_partials(op, per_rank, acc))
        finalize(parts)

    fin.fn = finish
    coll = Unit("coll", start_coll, g.label)
    for u in run.computes:
        after(coll, u)
    after(fin, coll)
    run.coll = coll
    run.finish = fin
    ctx.stats["collectives"] += 1
