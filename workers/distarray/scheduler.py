"""The scheduler of a force point: every transfer first, local work while they fly, waits last.

:func:`run_flush` evaluates the operations recorded since the last force point:

1. **Agreement** (collective): the ranks compare a hash of what they recorded (one small
   non-blocking allreduce; with latency hiding it completes while the rank works, and is
   checked before any collective of the flush starts). If it differs, each rank learns the
   first differing operation of every rank and all raise :class:`DistArrayDivergence` with the
   same text; none hangs.
2. **Fusion** (:mod:`~.fusion`) and **plans** (:mod:`~.plans`, cached): groups of work, each
   with its messages and blocks.
3. **Execution**, with latency hiding (the seed's operation flush):

   * all receives are started at once (persistent requests on pre-allocated buffers);
   * units are kept in two ready queues: communication (pack + start a send, start a
     reduction's allgather) and computation (a block of a fused kernel, an unpack, a
     matrix product). A unit is ready when the messages it reads have arrived and the
     earlier units it conflicts with (same base, overlapping local rows, one of them
     writing) are done: per-base access lists, the seed's dependency heuristic;
   * communication units always go first; then one computation unit runs, and
     ``Testsome`` polls the requests in flight before the next one;
   * only when no unit is ready the rank blocks, in :func:`nbmpi.workers.core.waiting.wait_each`
     (``NBMPI_TIMEOUT``, Ctrl-C), until some request completes.

   Without latency hiding (``NBMPI_LATENCY_HIDING=0`` or ``evaluate(latency_hiding=False)``)
   each group in turn exchanges its messages with blocking waits, then computes.

Tracing: each send is recorded when started; each blocked interval is recorded once, as the
receive (or allgather) that ended it, with its full length as ``wait`` (so
``Trace.summary()`` gives each rank's wait %); receives that completed while the rank
computed are recorded with zero wait. Sends and receives carry matching (tag, seq), so the
timeline draws their arrows.
"""
from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..core import runtime
from ..tracing import tracer as tracing
from ..core import waiting
from .errors import DistArrayDivergence, DistArrayError, DistArrayTimeout
from .fusion import ElementwiseGroup, optimize
from . import irregular
from .fusion import TaskGroup
from .graph import IndexedCopy, Matmul, Redistribute, Replicate, Swap, Transpose
from .packing import copy_rows, pack, unpack
from .plans import ElementwisePlan, MatmulPlan, ReplicatePlan, TransposePlan, selector
from .redistribution import RedistributionPlan
from .reductions import combine_partials, identity_array

__all__ = ["run_flush"]

K_SEND = tracing.register_kind("distarray_send")
K_RECV = tracing.register_kind("distarray_recv")
K_COLL = tracing.register_kind("distarray_allgather")
K_CHECK = tracing.register_kind("distarray_check")
K_WAIT = tracing.register_kind("distarray_wait")
_now = time.perf_counter_ns
_FULL = 1 << 62


class Waitable:
    """A started request and the units that wait for it."""

    __slots__ = ("req", "kind", "peer", "tag", "nbytes", "seq", "units", "label", "inst", "done", "cancellable")

    def __init__(self, req, kind: str, peer: int, tag: int, nbytes: int, seq: int, label: str, inst=None):
        """``kind``: 'recv', 'send', 'coll' (a reduction's allgather) or 'check' (the agreement)."""
        self.req, self.kind, self.peer, self.tag, self.nbytes, self.seq = req, kind, peer, tag, nbytes, seq
        self.units: List["Unit"] = []
        self.label = label
        self.inst = inst
        self.done = False
        self.cancellable = kind == "recv"


class Unit:
    """A piece of work of a flush: ``kind`` 'send' or 'coll' (communication), 'compute' (everything else)."""

    __slots__ = ("kind", "fn", "ndeps", "dependents", "label", "done", "access")

    def __init__(self, kind: str, fn: Callable[[], None], label: str, access=()):
        self.kind, self.fn, self.label = kind, fn, label
        self.ndeps = 0
        self.dependents: List["Unit"] = []
        self.done = False
        self.access = access


def _after(u: "Unit", prereq: "Unit") -> None:
    prereq.dependents.append(u)
    u.ndeps += 1


class _Complement(list):
    """Index tuples of the local elements of a base outside a box (what a swap copies); a cached plan."""

    def free(self) -> None:
        pass


def _complement(x, box, rank: int) -> _Complement:
    """The local elements of base ``x`` outside ``box`` (per base axis ``(start, stop)``) as a few
    NumPy index tuples: the rows outside the box, then per trailing axis the two slabs beside it."""
    g = x.dist.global_rows(rank) if not x.replicated else np.arange(x.shape[0], dtype=np.int64)
    r0, r1 = box[0]
    rows_in = (g >= r0) & (g < r1)
    out = _Complement()
    if not rows_in.all():
        out.append((selector(np.flatnonzero(~rows_in)),))
    in_rows = selector(np.flatnonzero(rows_in))
    for k in range(1, len(x.shape)):
        prefix = [in_rows] + [slice(box[j][0], box[j][1]) for j in range(1, k)]
        for (lo, hi) in ((0, box[k][0]), (box[k][1], x.shape[k])):
            if hi > lo:
                out.append(tuple(prefix + [slice(lo, hi)]))
    return out


class _Record:
    """The accesses of one group's units to one base with one mode: their hull and the units, kept
    in the order they were added (blocks come in row order, so lows and highs usually both grow
    and :meth:`overlapping` bisects; otherwise it scans)."""

    __slots__ = ("mode", "lo", "hi", "units", "los", "his", "monotonic")

    def __init__(self, mode: str):
        self.mode = mode
        self.lo, self.hi = 1 << 62, -1
        self.units: List[Tuple[Unit, int, int]] = []
        self.los: List[int] = []
        self.his: List[int] = []
        self.monotonic = True

    def add(self, u: Unit, lo: int, hi: int) -> None:
        if self.units and (lo < self.los[-1] or hi < self.his[-1]):
            self.monotonic = False
        self.units.append((u, lo, hi))
        self.los.append(lo)
        self.his.append(hi)
        self.lo = min(self.lo, lo)
        self.hi = max(self.hi, hi)

    def overlapping(self, lo: int, hi: int) -> List[Tuple[Unit, int, int]]:
        """The units whose rows overlap ``[lo, hi)``."""
        if self.monotonic:
            return self.units[bisect_right(self.his, lo):bisect_left(self.los, hi)]
        return [e for e in self.units if e[2] > lo and e[1] < hi]

    def coverage(self) -> List[Tuple[int, int]]:
        """The union of the units' row intervals, merged and sorted."""
        out: List[Tuple[int, int]] = []
        for lo, hi in sorted((lo, hi) for (_, lo, hi) in self.units):
            if out and lo <= out[-1][1]:
                if hi > out[-1][1]:
                    out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        return out


def _covers(intervals: List[Tuple[int, int]], lo: int, hi: int) -> bool:
    """True if the merged ``intervals`` contain ``[lo, hi)``."""
    for a, b in intervals:
        if a <= lo and hi <= b:
            return True
    return False


class _GroupRun:
    """The units of one group in one flush: receives (started at once), sends, computations, and for
    a reduction its allgather (``coll``) and the unit that combines the ranks' partials (``finish``)."""

    __slots__ = ("recvs", "sends", "computes", "coll", "finish", "label", "inst")

    def __init__(self, label: str):
        self.recvs: List[Waitable] = []
        self.sends: List[Unit] = []
        self.computes: List[Unit] = []
        self.coll: Optional[Unit] = None
        self.finish: Optional[Unit] = None
        self.label = label
        self.inst = None


class _Flush:
    """One force point on this rank: builds the units of every group (:meth:`build`), runs them
    (:meth:`execute`) and records every transfer and wait into the tracer."""

    def __init__(self, engine, reason: str, hiding: bool):
        self.eng = engine
        self.reason = reason
        self.hiding = hiding
        self.MPI = runtime.MPI()
        self.tr = tracing.get_tracer()
        self.trace_on = bool(self.tr.enabled)
        self.rank, self.size = engine.rank, engine.size
        self.active: List[Waitable] = []
        self.ready_comm: deque = deque()
        self.ready_comp: deque = deque()
        self.nunits = 0
        self.ndone = 0
        self.wait_ns = 0
        self.runs: List[_GroupRun] = []
        self.prev_coll: Optional[Unit] = None
        self.msgs_sent = 0
        self.bytes_sent = 0
        self.msgs_recv = 0
        self.blocks = 0
        self.agreement: Optional["_Agreement"] = None

    # -- tracing ---------------------------------------------------------------------
    def _rec(self, kind: int, direction: int, peer: int, tag: int, nbytes: int, t0: int, t1: int, wait: int,
             seq: int, count: int = 0) -> None:
        if self.trace_on:
            p = self.eng.tracer_ranks[peer] if peer >= 0 else -1
            self.tr.record(kind, direction, p, tag, nbytes, t0, t1, wait=wait, seq=seq, chan=self.eng.chan,
                           count=count)

    def op_name(self, what: str) -> str:
        return f"distributed-array force point ({self.reason}) flush {self.eng.flush_no}: {what}"

    # -- blocking waits (the only place a rank blocks) ----------------------------------
    def _wait_one(self, waitables: List[Waitable], what: str) -> int:
        """Block until one of ``waitables`` completes; return its index. Records the blocked time."""
        reqs = [w.req for w in waitables]
        peers = [w.peer if w.peer >= 0 else None for w in waitables]
        t0 = _now()
        gen = waiting.wait_each(reqs, self.eng.timeout, self.rank, peers, self.op_name(what), DistArrayTimeout,
                                on_abandon=None, cancellable=False)
        try:
            idx = next(gen)
        finally:
            gen.close()
        t1 = _now()
        self.wait_ns += t1 - t0
        w = waitables[idx]
        self._completed(w, t0, t1, t1 - t0)
        return idx

    def _completed(self, w: Waitable, t0: int, t1: int, wait: int) -> None:
        w.done = True
        if w.kind == "recv":
            self.msgs_recv += 1
            self._rec(K_RECV, tracing.DIR_RECV, w.peer, w.tag, w.nbytes, t0, t1, wait, w.seq)
        elif w.kind == "coll":
            self._rec(K_COLL, tracing.DIR_NONE, -1, w.tag, w.nbytes, t0, t1, wait, w.seq, count=self.size)
        elif w.kind == "check":
            self._rec(K_CHECK, tracing.DIR_NONE, -1, w.tag, w.nbytes, t0, t1, wait, w.seq, count=self.size)
        elif wait > 0:
            self._rec(K_WAIT, tracing.DIR_NONE, w.peer, w.tag, w.nbytes, t0, t1, wait, w.seq)
        for u in w.units:
            u.ndeps -= 1
            if u.ndeps == 0:
                self._enqueue(u)

    def _poll(self) -> None:
        """Test every request in flight at once (``Testsome``) and release what they unblock."""
        act = self.active
        if not act:
            return
        idx = self.MPI.Request.Testsome([w.req for w in act])
        if not idx:
            return
        t = _now()
        done = set(idx)
        for i in sorted(done):
            self._completed(act[i], t, t, 0)
        self.active = [w for i, w in enumerate(act) if i not in done]

    def _start(self, w: Waitable) -> None:
        self.active.append(w)

    # -- unit queues -------------------------------------------------------------------
    def _enqueue(self, u: Unit) -> None:
        (self.ready_comm if u.kind in ("send", "coll") else self.ready_comp).append(u)

    def _run_unit(self, u: Unit) -> None:
        u.fn()
        u.done = True
        self.ndone += 1
        for d in u.dependents:
            d.ndeps -= 1
            if d.ndeps == 0:
                self._enqueue(d)

    # -- building the units ----------------------------------------------------------------
    def build(self, groups: List[Any]) -> None:
        """Build the units of ``groups`` (one segment of the flush: a previous segment, if any, has been
        executed completely)."""
        eng = self.eng
        flush_no = eng.flush_no
        self.runs = []
        self.prev_coll = None
        self.nunits = self.ndone = 0
        for g in groups:
            if isinstance(g, ElementwiseGroup):
                run = self._elementwise(g, flush_no)
            else:
                t = g.task
                if isinstance(t, Swap):
                    run = self._swap(t)
                elif isinstance(t, Matmul):
                    run = self._matmul(t, flush_no)
                elif isinstance(t, Transpose):
                    run = self._transpose(t, flush_no)
                elif isinstance(t, Replicate):
                    run = self._replicate(t, flush_no)
                elif isinstance(t, Redistribute):
                    run = self._redistribute(t, flush_no)
                else:  # pragma: no cover - every task kind is handled above
                    raise DistArrayError(f"internal error: no executor for task {type(t).__name__}")
            self.runs.append(run)
        if self.hiding:
            self._dependencies()

    def _recvs(self, run: _GroupRun, plan, inst, label: str) -> None:
        for k, m in enumerate(plan.msgs_in):
            run.recvs.append(Waitable(inst.recv_reqs[k], "recv", m.peer, inst.tag, m.nbytes, inst.uses,
                                      f"receive for {label} from rank {m.peer}", inst))

    def _send_unit(self, plan, inst, k: int, local_of: Callable[[int], np.ndarray], serial_of, label: str,
                   pack: Optional[Callable[[], None]] = None) -> Unit:
        m = plan.msgs_out[k]

        def fn() -> None:
            t0 = _now()
            if pack is None:
                plan.pack(inst, k, local_of)
            else:
                pack()
            req = inst.send_reqs[k]
            req.Start()
            t1 = _now()
            self.msgs_sent += 1
            self.bytes_sent += m.nbytes
            self._rec(K_SEND, tracing.DIR_SEND, m.peer, inst.tag, m.nbytes, t0, t1, 0, inst.uses)
            self._start(Waitable(req, "send", m.peer, inst.tag, m.nbytes, inst.uses,
                                 f"send for {label} to rank {m.peer}", inst))

        access = () if serial_of is None else tuple((serial_of(p.array), p.hull[0], p.hull[1], "R")
                                                    for p in m.parts)
        return Unit("send", fn, f"send to {m.peer}", access)

    def _elementwise(self, g: ElementwiseGroup, flush_no: int) -> _GroupRun:
        eng = self.eng
        descs = []
        for role, obj in g.arrays:
            if role == "red":
                descs.append((role, obj.op, obj.axis, obj.acc_dtype.str, obj.out.base.dist.key, obj.out.view.key,
                              obj.out.dtype.str))
            else:
                descs.append((role, obj.base.dist.key, obj.view.key, obj.dtype.str))
        key = ("ew", g.program_key, g.space.key, tuple(descs), eng.chunk_elems)
        plan: ElementwisePlan = eng.plan(key, lambda: ElementwisePlan(g, self.rank, self.size, eng.chunk_elems))
        inst = plan.acquire(eng, flush_no)
        inst.uses += 1
        bases = [obj.out.base if role == "red" else obj.base for role, obj in g.arrays]
        scalars = [c.value for c in g.consts]
        run = _GroupRun(g.desc)
        run.inst = inst
        self._recvs(run, plan, inst, g.desc)

        def local_of(a: int) -> np.ndarray:
            return bases[a].ensure()

        for k in range(len(plan.msgs_out)):
            run.sends.append(self._send_unit(plan, inst, k, local_of, lambda a: bases[a].serial, g.desc))
        slots = inst.extra.get("slots", {})
        recv_flat = [[p.reshape(-1) for p in parts] for parts in inst.recv_parts]

        def block_fn(blk) -> Callable[[], None]:
            def fn() -> None:
                args = list(blk.template)
                for pos, ref in blk.bufrefs:
                    if ref[0] == "a":
                        b = bases[ref[1]]
                        if b.flat is None:
                            b.ensure()
                        args[pos] = b.flat
                    elif ref[0] == "p":
                        args[pos] = recv_flat[ref[1]][ref[2]]
                    else:
                        args[pos] = slots[ref[1]]
                args.extend(scalars)
                blk.kernel(*args)
                self.blocks += 1
            return fn

        for blk in plan.blocks:
            u = Unit("compute", block_fn(blk), g.desc,
                     tuple((bases[a].serial, lo, hi, mode) for (a, lo, hi, mode) in blk.access))
            u.ndeps = len(blk.needs)
            for mi in blk.needs:
                run.recvs[mi].units.append(u)
            run.computes.append(u)
        slot_reds = [r for r in plan.reds if r[4] is not None]
        if slot_reds:
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

            def finalize(parts_per_red: List[np.ndarray]) -> None:
                for (a, op, axis, acc, pshape), part in zip(slot_reds, parts_per_red):
                    task = g.arrays[a][1]
                    res = np.asarray(part)
                    if op == "mean":
                        res = res / task.count if task.count else res * np.nan
                    ob = task.out.base
                    dst = ob.ensure()
                    dst[...] = np.asarray(res).astype(ob.dtype, copy=False).reshape(ob.shape)

            out_serials = tuple((g.arrays[a][1].out.base.serial, 0, _FULL, "W") for (a, *_r) in slot_reds)
            if g.space.rep:
                fin = Unit("compute", lambda: finalize(local_partials()), g.desc, out_serials)
                for u in run.computes:
                    _after(fin, u)
                run.finish = fin
            else:
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
                    ex["grecv"] = np.zeros(total * self.size, dtype=np.uint8)
                gsend, grecv = ex["gsend"], ex["grecv"]
                fin = Unit("compute", lambda: None, g.desc, out_serials)

                def start_coll() -> None:
                    for (o, nb, dt, ps), part in zip(layout, local_partials()):
                        gsend[o:o + nb] = np.ascontiguousarray(np.asarray(part, dtype=dt)).view(np.uint8).reshape(-1)
                    req = eng.dcomm.Iallgather([gsend, self.MPI.BYTE], [grecv, self.MPI.BYTE])
                    w = Waitable(req, "coll", -1, 0, total, flush_no, f"allgather of the partial results of {g.desc}")
                    w.units.append(fin)
                    fin.ndeps += 1
                    self._start(w)

                def finish() -> None:
                    allp = grecv.reshape(self.size, total)
                    parts = []
                    for (a, op, axis, acc, pshape), (o, nb, dt, ps) in zip(slot_reds, layout):
                        per_rank = np.ascontiguousarray(allp[:, o:o + nb]).view(dt).reshape((self.size,) + ps)
                        parts.append(combine_partials(op, per_rank, acc))
                    finalize(parts)

                fin.fn = finish
                coll = Unit("coll", start_coll, g.desc)
                for u in run.computes:
                    _after(coll, u)
                _after(fin, coll)
                run.coll = coll
                run.finish = fin
                eng.stats["collectives"] += 1
        return run

    def _swap(self, t: Swap) -> _GroupRun:
        x, s = t.target.base, t.source.base
        idx = self.eng.plan(("swap", x.dist.key, x.shape, t.box), lambda: _complement(x, t.box, self.rank))

        def fn() -> None:
            xl, sl = x.ensure(), s.ensure()
            for ix in idx:
                sl[ix] = xl[ix]
            x.set_local(sl)
            s.set_local(xl)

        run = _GroupRun(t.desc)
        run.computes.append(Unit("compute", fn, t.desc, ((s.serial, 0, _FULL, "W"), (x.serial, 0, _FULL, "W"))))
        return run

    def _matmul(self, t: Matmul, flush_no: int) -> _GroupRun:
        eng = self.eng
        a, b, out = t.a, t.b, t.out
        key = ("mm", a.base.dist.key, a.view.key, a.dtype.str, b.base.dist.key, b.view.key, b.dtype.str,
               out.base.dist.key, out.view.key, out.dtype.str)
        plan: MatmulPlan = eng.plan(key, lambda: MatmulPlan(t, self.rank, self.size))
        inst = plan.acquire(eng, flush_no)
        inst.uses += 1
        run = _GroupRun(t.desc)
        self._recvs(run, plan, inst, t.desc)
        bases = {0: a.base, 1: b.base}
        for k in range(len(plan.msgs_out)):
            run.sends.append(self._send_unit(plan, inst, k, lambda i: bases[i].ensure(), lambda i: bases[i].serial,
                                             t.desc))
        oview = out.view
        b_items = b.view.trail_items()

        def product(rows_sel, js: np.ndarray, bdata: np.ndarray, accumulate: bool) -> None:
            al = a.base.ensure()
            yl = out.base.ensure()
            ysub = yl[oview.numpy_index(row_sel=rows_sel)]
            if len(js) == 0:
                if not accumulate:
                    ysub[...] = 0
                return
            cols = plan.a_cols(js)
            asub = al[rows_sel, cols] if not (isinstance(rows_sel, np.ndarray) and isinstance(cols, np.ndarray)) \
                else al[rows_sel][:, cols]
            prod = asub @ bdata
            if accumulate:
                ysub += prod
            else:
                ysub[...] = prod

        for (lo, hi) in plan.row_blocks:
            rows_sel = selector(plan.a_loc[lo:hi])
            hull = (int(plan.a_loc[lo:hi].min()), int(plan.a_loc[lo:hi].max()) + 1)

            def local_fn(rows_sel=rows_sel) -> None:
                if plan.b_rep:
                    bl = b.base.ensure()[b.view.numpy_index()]
                else:
                    bl = b.base.ensure()[(plan.local_b_rows,) + b_items]
                product(rows_sel, plan.local_j, bl, False)

            u0 = Unit("compute", local_fn, t.desc, ((a.base.serial, hull[0], hull[1], "R"),
                                                    (b.base.serial, 0, _FULL, "R"),
                                                    (out.base.serial, hull[0], hull[1], "W")))
            run.computes.append(u0)
            for k in range(len(plan.msgs_in)):
                def acc_fn(rows_sel=rows_sel, k=k) -> None:
                    product(rows_sel, plan.recv_j[k], inst.recv_parts[k][0], True)

                u = Unit("compute", acc_fn, t.desc, ((a.base.serial, hull[0], hull[1], "R"),
                                                     (out.base.serial, hull[0], hull[1], "A")))
                u.ndeps = 1
                run.recvs[k].units.append(u)
                _after(u, u0)
                run.computes.append(u)
        return run

    def _transpose(self, t: Transpose, flush_no: int) -> _GroupRun:
        eng = self.eng
        src, out = t.src, t.out
        key = ("tr", src.base.dist.key, src.view.key, src.dtype.str, out.base.dist.key, out.dtype.str)
        plan: TransposePlan = eng.plan(key, lambda: TransposePlan(t, self.rank, self.size))
        inst = plan.acquire(eng, flush_no)
        inst.uses += 1
        run = _GroupRun(t.desc)
        self._recvs(run, plan, inst, t.desc)
        for k in range(len(plan.msgs_out)):
            run.sends.append(self._send_unit(
                plan, inst, k, None, None, t.desc,
                pack=lambda k=k: plan.pack_transposed(inst, k, src.base.ensure())))
            run.sends[-1].access = ((src.base.serial, plan.send_hull[0], plan.send_hull[1], "R"),)
        from .fused_kernels import transpose_copy

        def put(dst_cols, block: np.ndarray, transpose: bool) -> None:
            """Columns ``dst_cols`` of the local rows of the result = ``block`` (or ``block.T``)."""
            tl = out.base.ensure()
            if isinstance(dst_cols, slice):
                dst = tl[:, dst_cols]
                if transpose:
                    transpose_copy(dst, block)
                else:
                    np.copyto(dst, block)
            else:
                tl[:, dst_cols] = block.T if transpose else block

        def local_fn() -> None:
            if len(plan.mine) == 0 or out.base.local_shape()[0] == 0:
                return
            al = src.base.ensure()
            if isinstance(plan.a_rows, slice):
                blk = al[plan.a_rows, plan.local_cols]
            else:
                blk = al[plan.a_rows][:, plan.local_cols]
            put(plan.local_tcols, blk, True)

        nloc = out.base.local_shape()[0]
        u0 = Unit("compute", local_fn, t.desc, ((src.base.serial, plan.send_hull[0], plan.send_hull[1], "R"),
                                                (out.base.serial, 0, nloc, "A")))
        run.computes.append(u0)
        for k in range(len(plan.msgs_in)):
            u = Unit("compute", lambda k=k: put(plan.recv_tcols[k], inst.recv_parts[k][0], False), t.desc,
                     ((out.base.serial, 0, nloc, "A"),))
            u.ndeps = 1
            run.recvs[k].units.append(u)
            run.computes.append(u)
        return run

    def _replicate(self, t: Replicate, flush_no: int) -> _GroupRun:
        eng = self.eng
        src, out = t.src, t.out
        key = ("rep", src.base.dist.key, src.view.key, src.dtype.str, t.root)
        plan: ReplicatePlan = eng.plan(key, lambda: ReplicatePlan(t, self.rank, self.size))
        inst = plan.acquire(eng, flush_no)
        inst.uses += 1
        run = _GroupRun(t.desc)
        self._recvs(run, plan, inst, t.desc)
        for k in range(len(plan.msgs_out)):
            run.sends.append(self._send_unit(plan, inst, k, lambda i: src.base.ensure(), lambda i: src.base.serial,
                                             t.desc))
        if plan.is_dest:
            items = plan.items

            def local_fn() -> None:
                rl = out.base.ensure()
                sl = src.base.ensure()
                rl[plan.local_dst] = sl[(plan.local_src,) + items]

            run.computes.append(Unit("compute", local_fn, t.desc, ((src.base.serial, plan.hull[0], plan.hull[1], "R"),
                                                                   (out.base.serial, 0, _FULL, "A"))))
            for k in range(len(plan.msgs_in)):
                def unpack(k=k) -> None:
                    out.base.ensure()[plan.recv_dst[k]] = inst.recv_parts[k][0]

                u = Unit("compute", unpack, t.desc, ((out.base.serial, 0, _FULL, "A"),))
                u.ndeps = 1
                run.recvs[k].units.append(u)
                run.computes.append(u)
        return run

    def _redistribute(self, t: Redistribute, flush_no: int) -> _GroupRun:
        """One aggregated transfer (:mod:`~.redistribution`): at most one message per peer and direction.
        Packed messages: pack kernel + persistent send; persistent receive + unpack kernel (for the streams
        of a cyclic exchange, all packs, or all unpacks, with the local copy in one interleaved pass).
        In-place messages: the send (or receive) is started from (into) the local block by a communication
        unit that waits for the earlier units touching those rows, and a no-op unit holding the rows until
        the request completes orders the later ones. The rows that stay here are copied meanwhile."""
        eng = self.eng
        src, out = t.src, t.out
        key = ("rd", src.base.dist.key, src.view.key, src.dtype.str, out.base.dist.key, out.view.key,
               out.dtype.str)
        plan: RedistributionPlan = eng.plan(key, lambda: RedistributionPlan(src, out, self.rank, self.size))
        inst = plan.acquire(eng, flush_no)
        inst.uses += 1
        run = _GroupRun(t.desc)
        run.inst = inst
        self._recvs(run, plan, inst, t.desc)
        sb, ob = src.base, out.base
        sflat, rflat, sarena, rarena = plan.flat_parts(inst)
        MPI, comm = self.MPI, eng.dcomm

        def flat(b) -> np.ndarray:
            if b.flat is None:
                b.ensure()
            return b.flat

        def span(hulls) -> Tuple[int, int]:
            hulls = [h for h in hulls if h[1] > h[0]]
            return (min(h[0] for h in hulls), max(h[1] for h in hulls)) if hulls else (0, 0)

        if plan.send_group is not None and plan.msgs_out:
            def pack_all_and_send(group=plan.send_group) -> None:
                t0 = _now()
                group.run(flat(sb), flat(ob), sarena, rarena)
                t1 = _now()
                for k, m in enumerate(plan.msgs_out):
                    req = inst.send_reqs[k]
                    req.Start()
                    self.msgs_sent += 1
                    self.bytes_sent += m.nbytes
                    self._rec(K_SEND, tracing.DIR_SEND, m.peer, inst.tag, m.nbytes, t0 if k == 0 else t1, _now(), 0,
                              inst.uses)
                    self._start(Waitable(req, "send", m.peer, inst.tag, m.nbytes, inst.uses,
                                         f"send for {t.desc} to rank {m.peer}", inst))

            acc = [(sb.serial,) + span(plan.send_hulls + ([plan.local_src_hull] if plan.send_group_local else []))
                   + ("R",)]
            if plan.send_group_local:
                acc.append((ob.serial,) + plan.local_out_hull + ("W",))
            run.sends.append(Unit("send", pack_all_and_send, f"pack and send {t.desc}", tuple(acc)))
        else:
            for k in range(len(plan.msgs_out)):
                def pk(k=k) -> None:
                    pack(flat(sb), plan.send_runs[k], plan.spat, sflat[k])

                u = self._send_unit(plan, inst, k, None, None, t.desc, pack=pk)
                h = plan.send_hulls[k]
                u.access = ((sb.serial, h[0], h[1], "R"),)
                run.sends.append(u)
        if plan.recv_group is not None and plan.msgs_in:
            def unpack_all(group=plan.recv_group) -> None:
                group.run(flat(sb), flat(ob), sarena, rarena)

            acc = [(ob.serial,) + span(plan.recv_hulls + ([plan.local_out_hull] if plan.recv_group_local else []))
                   + ("W",)]
            if plan.recv_group_local:
                acc.append((sb.serial,) + plan.local_src_hull + ("R",))
            u = Unit("compute", unpack_all, t.desc, tuple(acc))
            u.ndeps = len(plan.msgs_in)
            for w in run.recvs:
                w.units.append(u)
            run.computes.append(u)
        else:
            for k in range(len(plan.msgs_in)):
                def unp(k=k) -> None:
                    unpack(flat(ob), plan.recv_runs[k], plan.tpat, rflat[k])

                h = plan.recv_hulls[k]
                u = Unit("compute", unp, t.desc, ((ob.serial, h[0], h[1], "W"),))
                u.ndeps = 1
                run.recvs[k].units.append(u)
                run.computes.append(u)

        def in_place(base, peer: int, lo: int, hi: int, rlo: int, rhi: int, sending: bool) -> None:
            mode = "R" if sending else "W"
            nbytes = (hi - lo) * base.dtype.itemsize
            what = f"{'send' if sending else 'receive'} for {t.desc} {'to' if sending else 'from'} rank {peer}"
            held = Unit("compute", lambda: None, t.desc, ((base.serial, rlo, rhi, mode),))
            held.ndeps = 1

            def start() -> None:
                t0 = _now()
                mem = flat(base)[lo:hi].view(np.uint8)
                if sending:
                    req = comm.Isend([mem, MPI.BYTE], dest=peer, tag=inst.tag)
                    self.msgs_sent += 1
                    self.bytes_sent += nbytes
                    self._rec(K_SEND, tracing.DIR_SEND, peer, inst.tag, nbytes, t0, _now(), 0, inst.uses)
                    w = Waitable(req, "send", peer, inst.tag, nbytes, inst.uses, what, inst)
                else:
                    req = comm.Irecv([mem, MPI.BYTE], source=peer, tag=inst.tag)
                    w = Waitable(req, "recv", peer, inst.tag, nbytes, inst.uses, what, inst)
                w.units.append(held)
                self._start(w)

            run.sends.append(Unit("send", start, what, ((base.serial, rlo, rhi, mode),)))
            run.computes.append(held)

        for (peer, lo, hi, rlo, rhi) in plan.direct_in:
            in_place(ob, peer, lo, hi, rlo, rhi, False)
        for (peer, lo, hi, rlo, rhi) in plan.direct_out:
            in_place(sb, peer, lo, hi, rlo, rhi, True)
        if len(plan.local_runs) and not plan.send_group_local and not plan.recv_group_local:
            def local_fn() -> None:
                copy_rows(flat(ob), plan.ltpat, flat(sb), plan.lspat, plan.local_runs)

            sh, oh = plan.local_src_hull, plan.local_out_hull
            run.computes.append(Unit("compute", local_fn, t.desc, ((sb.serial, sh[0], sh[1], "R"),
                                                                   (ob.serial, oh[0], oh[1], "W"))))
        return run

    # -- dependencies between groups (latency hiding only) ---------------------------------
    def _dependencies(self) -> None:
        """Make each unit wait for the earlier groups' units it conflicts with (same base, overlapping
        local rows, not both reading, not both accumulating): per-base lists of access records, the
        seed's dependency heuristic, with one record per group and access kind. A record whose rows a
        later group overwrites entirely is dropped (anything after depends on the overwriting units,
        which depend on it), so the lists stay short in time loops."""
        records: Dict[int, List["_Record"]] = {}
        for run in self.runs:
            units = run.sends + run.computes + ([run.finish] if run.finish is not None else [])
            new: Dict[Tuple[int, str], "_Record"] = {}
            for u in units:
                seen = set()
                for (serial, lo, hi, mode) in u.access:
                    for rec in records.get(serial, ()):
                        if rec.hi <= lo or hi <= rec.lo:
                            continue
                        if (mode == "R" and rec.mode == "R") or (mode == "A" and rec.mode == "A"):
                            continue
                        for (p, plo, phi) in rec.overlapping(lo, hi):
                            if id(p) in seen:
                                continue
                            seen.add(id(p))
                            _after(u, p)
                    rec = new.get((serial, mode))
                    if rec is None:
                        rec = new[(serial, mode)] = _Record(mode)
                    rec.add(u, lo, hi)
            if run.coll is not None:
                if self.prev_coll is not None:
                    _after(run.coll, self.prev_coll)
                self.prev_coll = run.coll
            for (serial, mode), rec in new.items():
                lst = records.setdefault(serial, [])
                if mode == "W":
                    covered = rec.coverage()
                    lst[:] = [r for r in lst if not _covers(covered, r.lo, r.hi)]
                lst.append(rec)

    # -- execution -------------------------------------------------------------------
    def all_units(self, run: _GroupRun) -> List[Unit]:
        out = run.sends + run.computes
        if run.coll is not None:
            out.append(run.coll)
        if run.finish is not None:
            out.append(run.finish)
        return out

    def execute(self) -> None:
        if self.hiding:
            self._execute_hiding()
        else:
            self._execute_blocking()

    def _execute_hiding(self) -> None:
        MPI = self.MPI
        recvs = [w for run in self.runs for w in run.recvs]
        if recvs:
            MPI.Prequest.Startall([w.req for w in recvs])
            self.active.extend(recvs)
        units = [u for run in self.runs for u in self.all_units(run)]
        agr = self.agreement
        verify = Unit("compute", agr.verify, "verify the agreement")
        if not agr.waitable.done:
            verify.ndeps = 1
            agr.waitable.units.append(verify)
            self.active.append(agr.waitable)
        for run in self.runs:
            if run.coll is not None:
                _after(run.coll, verify)
        units.append(verify)
        self.nunits = len(units)
        for u in units:
            if u.ndeps == 0:
                self._enqueue(u)
        comm_q, comp_q = self.ready_comm, self.ready_comp
        while True:
            while comm_q:
                self._run_unit(comm_q.popleft())
            if comp_q:
                self._run_unit(comp_q.popleft())
                self._poll()
                continue
            if not self.active:
                break
            self._wait_one(self.active, self._blocked_on())
            self.active = [w for w in self.active if not w.done]
            self._poll()
        if self.ndone != self.nunits:
            stuck = [u.label for u in units if not u.done][:3]
            raise DistArrayError(f"internal error: {self.nunits - self.ndone} units of the flush never became "
                                 f"ready (first: {stuck}); please report this with the program")

    def _blocked_on(self) -> str:
        w = self.active[0]
        return f"waiting for {w.label}"

    def _execute_blocking(self) -> None:
        MPI = self.MPI
        for run in self.runs:
            units = self.all_units(run)
            self.nunits += len(units)
            if run.recvs:
                MPI.Prequest.Startall([w.req for w in run.recvs])
                self.active.extend(run.recvs)
            for u in run.sends:
                self._run_unit(u)
            # blocking exchange: every message of this group, before any computation
            while self.active:
                self._wait_one(self.active, self._blocked_on())
                self.active = [w for w in self.active if not w.done]
            for u in run.computes:
                u.fn()
                u.done = True
                self.ndone += 1
            if run.coll is not None:
                run.coll.fn()
                self.ndone += 1
                while self.active:
                    self._wait_one(self.active, self._blocked_on())
                    self.active = [w for w in self.active if not w.done]
            if run.finish is not None:
                run.finish.fn()
                self.ndone += 1

    def dispose(self) -> None:
        """Break the reference cycles of the flush (units' closures refer back to it, the agreement to
        its verify unit), so that the bases they hold die, and their buffers return to the pool, as
        soon as the flush returns instead of at the next cyclic garbage collection."""
        for run in self.runs:
            for w in run.recvs:
                w.units = []
            for u in self.all_units(run):
                u.fn = None
                u.dependents = []
        if self.agreement is not None:
            self.agreement.waitable.units = []
            self.agreement.tasks = None
        self.runs = []
        self.active = []
        self.ready_comm.clear()
        self.ready_comp.clear()
        self.agreement = None

    def abort(self) -> None:
        """After an error: cancel the receives still in flight; instances with a send or collective
        in flight are never reused (their buffers may still be read)."""
        for w in self.active:
            if w.done:
                continue
            if w.cancellable:
                if not waiting.cancel(w.req) and w.inst is not None:
                    w.inst.broken = True
            elif w.inst is not None:
                w.inst.broken = True
        self.active = []


# --------------------------------------------------------------------------- agreement
def _hash_tasks(tasks) -> Tuple[int, np.ndarray]:
    """Per-task hashes and their combination (Python's ``hash`` of tuples of numbers: the same in every
    process), reduced to 62 bits so that ``-h`` never overflows."""
    per = [hash(t.sig) >> 2 for t in tasks]
    total = hash(tuple(per)) >> 2
    return total, np.array(per, dtype=np.int64)


class _Agreement:
    """The collective check that every rank recorded the same operations (one small non-blocking
    allreduce of a hash). With latency hiding it is started first and completes while the rank
    works; it must be verified before any collective of the flush starts."""

    def __init__(self, fl: _Flush, tasks):
        self.fl, self.tasks = fl, tasks
        eng = fl.eng
        total, self.per = _hash_tasks(tasks)
        self.mine = np.array([total, -total, len(tasks), -len(tasks)], dtype=np.int64)
        self.got = np.empty(4, dtype=np.int64)
        self.t0 = _now()
        self.req = eng.dcomm.Iallreduce(self.mine, self.got, op=fl.MPI.MAX)
        self.waitable = Waitable(self.req, "check", -1, 0, 32, eng.flush_no, "agreeing on the recorded operations")
        self.verified = False

    def wait(self) -> None:
        """Block until the check completed (if it has not), then :meth:`verify`."""
        if not self.waitable.done:
            waiting.wait(self.req, self.fl.eng.timeout, self.fl.rank, None,
                         self.fl.op_name("agreeing on the recorded operations"), DistArrayTimeout, cancellable=False)
            self.waitable.done = True
            self.fl._rec(K_CHECK, tracing.DIR_NONE, -1, 0, 32, self.t0, _now(), -1, self.fl.eng.flush_no,
                         count=self.fl.size)
        self.verify()

    def verify(self) -> None:
        """Raise DistArrayDivergence (on every rank) if the ranks' hashes differ."""
        if self.verified:
            return
        self.verified = True
        got = self.got
        if got[0] == -got[1] and got[2] == -got[3]:
            return
        _diagnose(self.fl, self.tasks, self.per)


def _diagnose(fl: _Flush, tasks, per: np.ndarray) -> None:
    """The ranks' hashes differ: find the first differing operation and raise on every rank."""
    eng, MPI = fl.eng, fl.MPI
    # diagnosis: every rank's per-operation hashes, then the first differing operation's text
    counts = np.empty(eng.size, dtype=np.int64)
    req = eng.dcomm.Iallgather(np.array([len(tasks)], dtype=np.int64), counts)
    waiting.wait(req, eng.timeout, eng.rank, None, fl.op_name("diagnosing a divergence"), DistArrayTimeout,
                 cancellable=False)
    allh = np.empty(int(counts.sum()), dtype=np.int64)
    displs = np.zeros(eng.size, dtype=np.int64)
    displs[1:] = np.cumsum(counts)[:-1]
    req = eng.dcomm.Iallgatherv(per, [allh, (counts, displs), MPI.INT64_T])
    waiting.wait(req, eng.timeout, eng.rank, None, fl.op_name("diagnosing a divergence"), DistArrayTimeout,
                 cancellable=False)
    lists = [allh[displs[r]:displs[r] + counts[r]] for r in range(eng.size)]
    k = 0
    while True:
        vals = [lst[k] if k < len(lst) else None for lst in lists]
        if any(v != vals[0] for v in vals):
            break
        k += 1
    mine_text = tasks[k].desc if k < len(tasks) else f"nothing (this rank recorded only {len(tasks)} operations)"
    width = 400
    buf = np.zeros(width, dtype=np.uint8)
    raw = mine_text.encode("utf-8", "replace")[:width]
    buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    texts = np.empty(width * eng.size, dtype=np.uint8)
    req = eng.dcomm.Iallgather(buf, texts)
    waiting.wait(req, eng.timeout, eng.rank, None, fl.op_name("diagnosing a divergence"), DistArrayTimeout,
                 cancellable=False)
    descs = [bytes(texts[r * width:(r + 1) * width]).rstrip(b"\0").decode("utf-8", "replace")
             for r in range(eng.size)]
    detail = f"operation {k + 1} since the previous force point: " + "; ".join(
        f"rank {r} recorded {d}" for r, d in enumerate(descs))
    # the ranks may have created different numbers of arrays: agree on the serial numbers of the
    # next ones, so that consistent operations after the error are recognized as equal again
    ser = np.array([eng._serial], dtype=np.int64)
    top = np.empty(1, dtype=np.int64)
    req = eng.dcomm.Iallreduce(ser, top, op=MPI.MAX)
    waiting.wait(req, eng.timeout, eng.rank, None, fl.op_name("diagnosing a divergence"), DistArrayTimeout,
                 cancellable=False)
    eng._serial = int(top[0])
    raise DistArrayDivergence(eng.rank, f"force point {fl.reason}", detail)


def run_flush(engine, tasks, reason: str, hiding: bool) -> None:
    """Evaluate ``tasks`` (see the module doc). Collective over the engine's communicator."""
    t_start = _now()
    engine.ensure_comm()
    engine.flush_no += 1
    fl = _Flush(engine, reason, hiding)
    agr = fl.agreement = _Agreement(fl, tasks)
    if not hiding:
        agr.wait()  # blocking: agree first
    groups, fstats = optimize(tasks)
    try:
        # irregular copies (Aggregator) are barriers: the groups before one run to completion first
        segment: List[Any] = []
        for g in groups + [None]:
            if g is not None and not (isinstance(g, TaskGroup) and isinstance(g.task, IndexedCopy)):
                segment.append(g)
                continue
            if segment:
                fl.build(segment)
                fl.execute()
                segment = []
            if g is not None:
                agr.wait()  # the ranks agreed on the recorded operations before this collective step
                irregular.execute(engine, g.task, fl.op_name(g.task.kind))
    except BaseException as err:
        fl.abort()
        if not agr.verified and not isinstance(err, (DistArrayTimeout, KeyboardInterrupt)):
            agr.wait()  # a divergence explains the error better (raises DistArrayDivergence)
        raise
    finally:
        fl.dispose()
    st = engine.stats
    st["flushes"] += 1
    st["groups"] += len(groups)
    st["inlined"] += fstats["inlined"]
    st["dropped"] += fstats["dropped"]
    st["swapped"] += fstats["swapped"]
    st["redistributed"] += fstats["redistributed"]
    st["blocks"] += fl.blocks
    st["messages_sent"] += fl.msgs_sent
    st["bytes_sent"] += fl.bytes_sent
    st["messages_received"] += fl.msgs_recv
    st["wait_ns"] += fl.wait_ns
    dt = _now() - t_start
    st["flush_ns"] += dt
    engine.last = dict(reason=reason, latency_hiding=hiding, tasks=len(tasks),
                       kinds=[g.kind if isinstance(g, ElementwiseGroup) else g.task.kind for g in groups],
                       blocks=fl.blocks, messages_sent=fl.msgs_sent, bytes_sent=fl.bytes_sent,
                       messages_received=fl.msgs_recv, wait_ns=fl.wait_ns, flush_ns=dt, **fstats)
