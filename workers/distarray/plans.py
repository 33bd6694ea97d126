"""Per-rank plans of a flush: which rows each rank computes, which remote rows it receives from
whom, what it sends, and the blocks of work with their kernel arguments.

Every rank knows every distribution, so each rank derives its own part of the plan from the
recorded task alone, without asking anyone (the seed's "global knowledge of the data
distribution"). A plan depends only on layouts (distributions, views, dtypes, shapes) and on
the program's shape, never on values or array identities, so the plan of a time step is
found in the engine's cache at the next step and nothing is recomputed.

Transfers are aggregated: per task, each rank sends at most ONE message to each peer,
holding every row that peer needs from it (for every operand), packed into a pre-allocated
buffer; the receiver gets it into a pre-allocated buffer on a persistent request
(``Recv_init``/``Send_init``, restarted every time the plan is used). Nothing is pickled.
The buffers and requests belong to a plan :class:`Instance`; a plan used twice in one flush
gets a second instance. Tags are allocated in plan-creation order, identical on every rank.

Work is cut into blocks: a block is a run of this rank's output rows whose operands each
come from one place (the local buffer, or one received message) with constant strides, so
the block's operands are strided views and the fused kernel reads them in place. Blocks
whose operands are all local can run while the messages are in flight.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .fused_kernels import KernelSpec, get_kernel, transpose_copy
from .graph import Leaf
from .indexing import _slice_of, c_strides

__all__ = ["PartSpec", "MsgSpec", "Instance", "arena_layout", "Plan", "ElementwisePlan", "MatmulPlan", "TransposePlan",
           "ReplicatePlan", "BlockSpec", "ap_of", "selector"]

Access = Tuple[int, int, int, str]   # (array slot, lo, hi, mode) with mode R / W / A


def _align8(n: int) -> int:
    return (n + 7) & ~7


def ap_of(seq: np.ndarray) -> Optional[Tuple[int, int]]:
    """``(start, step)`` if ``seq`` is an arithmetic progression (a single item has step 1), else None."""
    m = len(seq)
    if m == 0:
        return (0, 1)
    if m == 1:
        return (int(seq[0]), 1)
    d = int(seq[1]) - int(seq[0])
    if d == 0:
        return None
    if m == 2 or bool(np.all(np.diff(seq) == d)):
        return (int(seq[0]), d)
    return None


def selector(seq: np.ndarray) -> Any:
    """A basic slice for an arithmetic progression of indices, else the index array itself."""
    ap = ap_of(seq)
    if ap is None:
        return np.asarray(seq, dtype=np.int64)
    return _slice_of(ap[0], ap[1], len(seq))


def _hull(seq: np.ndarray) -> Tuple[int, int]:
    if len(seq) == 0:
        return (0, 0)
    return (int(seq.min()), int(seq.max()) + 1)


def _prod(shape: Sequence[int]) -> int:
    p = 1
    for s in shape:
        p *= int(s)
    return p


class PartSpec:
    """One operand's rows inside one message: ``count`` rows of ``shape[1:]`` elements of ``dtype``
    at byte ``offset``. On the sending side ``rows`` selects them in the local buffer (a slice or
    an index array), ``items`` the trailing index; ``array`` is the operand's slot."""

    __slots__ = ("array", "count", "dtype", "shape", "offset", "nbytes", "rows", "items", "hull")

    def __init__(self, array: int, count: int, dtype: np.dtype, trail: Tuple[int, ...], rows: Any = None,
                 items: Tuple = (), hull: Tuple[int, int] = (0, 0)):
        self.array, self.count, self.dtype = array, int(count), np.dtype(dtype)
        self.shape = (int(count),) + tuple(trail)
        self.nbytes = _prod(self.shape) * self.dtype.itemsize
        self.offset = 0
        self.rows, self.items, self.hull = rows, items, hull


class MsgSpec:
    """All parts exchanged with ``peer`` in one direction for one task (one MPI message)."""

    __slots__ = ("peer", "parts", "nbytes")

    def __init__(self, peer: int, parts: List[PartSpec]):
        self.peer = int(peer)
        self.parts = parts
        off = 0
        for p in parts:
            p.offset = off
            off = _align8(off + p.nbytes)
        self.nbytes = off


def arena_layout(msgs: List["MsgSpec"]) -> Tuple[List[int], int]:
    """Byte offset of each message of ``msgs`` in an instance's arena (64-byte aligned) and the arena's size."""
    offsets = []
    total = 0
    for m in msgs:
        offsets.append(total)
        total += (max(m.nbytes, 8) + 63) & ~63
    return offsets, total


class Instance:
    """The buffers and persistent requests of one use of a plan within a flush.

    Created collectively in effect (every rank creates the instances of the same plans in the
    same order, so the tag agrees); each instance is reused by later flushes. The receive buffers
    of all incoming messages are slices of one arena (``recv_arena``, bytes), those of all outgoing
    messages of another (``send_arena``), each message starting at a 64-byte boundary
    (``recv_offsets`` / ``send_offsets``), so a kernel can fill or drain every message in one call.
    """

    __slots__ = ("plan", "tag", "recv_bufs", "send_bufs", "recv_reqs", "send_reqs", "recv_parts", "send_parts",
                 "recv_arena", "send_arena", "recv_offsets", "send_offsets", "extra", "flush_no", "uses", "broken")

    def __init__(self, plan: "Plan", engine):
        from ..core import runtime

        MPI = runtime.MPI()
        comm = engine.dcomm
        self.plan = plan
        self.tag = engine.next_tag()
        self.recv_arena, self.recv_offsets, self.recv_bufs = self._arena(plan.msgs_in)
        self.recv_reqs = [comm.Recv_init([buf[:m.nbytes], MPI.BYTE], source=m.peer, tag=self.tag)
                          for m, buf in zip(plan.msgs_in, self.recv_bufs)]
        self.recv_parts = [[buf[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape) for p in m.parts]
                           for m, buf in zip(plan.msgs_in, self.recv_bufs)]
        self.send_arena, self.send_offsets, self.send_bufs = self._arena(plan.msgs_out)
        self.send_reqs = [comm.Send_init([buf[:m.nbytes], MPI.BYTE], dest=m.peer, tag=self.tag)
                          for m, buf in zip(plan.msgs_out, self.send_bufs)]
        self.send_parts = [[buf[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape) for p in m.parts]
                           for m, buf in zip(plan.msgs_out, self.send_bufs)]
        self.extra = plan.extra_buffers()
        self.flush_no = -1
        self.uses = 0
        self.broken = False

    @staticmethod
    def _arena(msgs: List["MsgSpec"]) -> Tuple[np.ndarray, List[int], List[np.ndarray]]:
        """One byte buffer for ``msgs``: (arena, byte offset of each message, each message's slice)."""
        offsets, total = arena_layout(msgs)
        arena = np.empty(max(total, 64), dtype=np.uint8)
        return arena, offsets, [arena[o:o + max(m.nbytes, 8)] for o, m in zip(offsets, msgs)]

    def free(self) -> None:
        """Free the persistent requests (they must be inactive)."""
        for r in self.recv_reqs + self.send_reqs:
            try:
                r.Free()
            except Exception:  # noqa: BLE001 - already freed or never started
                pass
        self.recv_reqs, self.send_reqs = [], []


class Plan:
    """Base of the per-rank plans: messages in and out, and a pool of :class:`Instance`."""

    kind = "plan"

    def __init__(self) -> None:
        self.msgs_in: List[MsgSpec] = []
        self.msgs_out: List[MsgSpec] = []
        self.instances: List[Instance] = []

    def extra_buffers(self) -> Dict[str, Any]:
        """Per-instance scratch buffers (reduction slots...)."""
        return {}

    def acquire(self, engine, flush_no: int) -> Instance:
        """An instance not yet used in flush ``flush_no`` (created when all are in use)."""
        for inst in self.instances:
            if inst.flush_no != flush_no and not inst.broken:
                inst.flush_no = flush_no
                return inst
        inst = Instance(self, engine)
        inst.flush_no = flush_no
        self.instances.append(inst)
        return inst

    def free(self) -> None:
        for inst in self.instances:
            inst.free()
        self.instances = []

    @staticmethod
    def _messages(parts_by_peer: Dict[int, List[PartSpec]]) -> List[MsgSpec]:
        return [MsgSpec(q, parts_by_peer[q]) for q in sorted(parts_by_peer) if parts_by_peer[q]]

    def pack(self, inst: Instance, k: int, local_of) -> None:
        """Copy the parts of outgoing message ``k`` from the local buffers into its send buffer.
        ``local_of(array)`` returns the local buffer of operand slot ``array``."""
        for p, dst in zip(self.msgs_out[k].parts, inst.send_parts[k]):
            src = local_of(p.array)
            np.copyto(dst, src[(p.rows,) + p.items])


# =========================================================================== elementwise
class ArrayMeta:
    """How kernel array ``a`` of an elementwise group is addressed (see :class:`ElementwisePlan`)."""

    __slots__ = ("kind", "dtype", "bcast", "trail_off", "trail_strides", "row_elems", "packed_strides",
                 "packed_row_elems", "rows_full", "off0", "st0", "identical", "slot_elems", "reduced")

    def __init__(self, kind: str, dtype: np.dtype):
        self.kind, self.dtype = kind, np.dtype(dtype)
        self.bcast: Tuple[bool, ...] = ()
        self.trail_off = 0
        self.trail_strides: Tuple[int, ...] = ()
        self.row_elems = 0
        self.packed_strides: Tuple[int, ...] = ()
        self.packed_row_elems = 0
        self.rows_full = False
        self.off0 = 0
        self.st0 = 0
        self.identical = True
        self.slot_elems = 0
        self.reduced: Optional[int] = None


class BlockSpec:
    """One block: ``cnt`` rows; ``template`` holds the kernel arguments with None where a buffer
    goes (``bufrefs``: ``(position, ('a', slot) | ('p', msg, part) | ('s', reduction))``);
    ``needs``: indices of incoming messages it waits for; ``access``: local rows it touches."""

    __slots__ = ("cnt", "template", "bufrefs", "needs", "access", "kernel", "index")

    def __init__(self) -> None:
        self.cnt = 0
        self.template: List[Any] = []
        self.bufrefs: List[Tuple[int, Tuple]] = []
        self.needs: Tuple[int, ...] = ()
        self.access: Tuple[Access, ...] = ()
        self.kernel = None
        self.index = 0


def _segments(m: int, srcs: List[np.ndarray], seqs: List[np.ndarray]) -> List[Tuple[int, int]]:
    """Cut ``range(m)`` into maximal runs where every ``srcs`` array is constant and every
    ``seqs`` array is an arithmetic progression (greedy, left to right)."""
    if m == 0:
        return []
    srcbrk = np.zeros(m, dtype=bool)
    for s in srcs:
        srcbrk[1:] |= s[1:] != s[:-1]
    chg = np.zeros(m, dtype=bool)
    if m >= 3:
        for q in seqs:
            dq = np.diff(q)
            chg[2:] |= dq[1:] != dq[:-1]
    sb = np.flatnonzero(srcbrk)
    cb = np.flatnonzero(chg)
    out: List[Tuple[int, int]] = []
    s = 0
    while s < m:
        i1 = int(np.searchsorted(sb, s, side="right"))
        nb = int(sb[i1]) if i1 < len(sb) else m
        i2 = int(np.searchsorted(cb, s + 1, side="right"))
        nc = int(cb[i2]) if i2 < len(cb) else m
        e = min(nb, nc)
        out.append((s, e))
        s = e
    return out


def _my_rows_fast(dist, s: int, t: int, n: int, rank: int) -> Tuple[np.ndarray, np.ndarray]:
    """(row numbers i of the view owned by ``rank``, their local indices), increasing i."""
    g = dist.global_rows(rank)
    if t == 1 and s == 0 and n == dist.nrows:  # the whole base: every local row, in order
        return g, np.arange(len(g), dtype=np.int64)
    rel = g - s
    q = rel // t
    ok = (rel % t == 0) & (q >= 0) & (q < n)
    i = q[ok]
    loc = np.flatnonzero(ok).astype(np.int64)
    if t < 0:
        i, loc = i[::-1].copy(), loc[::-1].copy()
    return i.astype(np.int64), loc


class ElementwisePlan(Plan):
    """The plan of one fused elementwise group on this rank.

    Array kinds: ``'dist'`` (a distributed operand or target aligned with the rows: read from the
    local buffer or, for rows owned elsewhere, from a received part), ``'repv'`` (a view of a
    replicated base), ``'slot'`` (a reduction's per-block partial results, in the instance).
    """

    kind = "elementwise"

    def __init__(self, group, rank: int, nranks: int, chunk_elems: int):
        super().__init__()
        self._roles = tuple(role for role, _ in group.arrays)
        space = group.space
        self.space = space
        self.d = len(space.shape)
        self.shape = space.shape
        self.rank = rank
        self.metas: List[ArrayMeta] = []
        self.reds = []  # (array slot, op, axis, acc dtype, partial shape)
        for a, (role, obj) in enumerate(group.arrays):
            self.metas.append(self._meta(role, obj, space))
            if role == "red":
                pshape = () if obj.axis is None else tuple(space.shape[1:]) if obj.axis == 0 else None
                self.reds.append((a, obj.op, obj.axis, obj.acc_dtype, pshape))
        self.blocks: List[BlockSpec] = []
        n = space.count
        trail_elems = _prod(space.shape[1:])
        if _prod(space.shape) > 0:
            max_rows = max(1, chunk_elems // max(1, trail_elems))
            if space.rep:
                self._build_rep(n, max_rows)
            else:
                self._build_dist(group, rank, nranks, n, max_rows)
        # one compiled kernel per distinct combination of unit inner strides
        specs: Dict[Tuple[bool, ...], Any] = {}
        for blk in self.blocks:
            units = blk.kernel
            k = specs.get(units)
            if k is None:
                arrays = [(group.array_dtype(a), self.metas[a].bcast, units[a]) for a in range(len(self.metas))]
                k = specs[units] = get_kernel(KernelSpec(self.d, arrays, len(group.consts), group.stmts,
                                                         group.reductions))
            blk.kernel = k
        self.kernels = list(specs.values())

    # -- array addressing -----------------------------------------------------------
    def _meta(self, role: str, obj: Any, space) -> ArrayMeta:
        d = len(space.shape)
        if role == "red":
            if obj.axis is None or obj.axis == 0:
                m = ArrayMeta("slot", obj.acc_dtype)
                pshape = () if obj.axis is None else tuple(space.shape[1:])
                m.slot_elems = _prod(pshape)
                bc = [True] * d
                m.trail_strides = (0,) * (d - 1)
                if obj.axis == 0:
                    for k in range(1, d):
                        bc[k] = False
                    m.trail_strides = c_strides(pshape)
                m.bcast = tuple(bc)
                return m
            leaf = obj.out
            m = self._leaf_meta(leaf, space, reduced=obj.axis)
            return m
        return self._leaf_meta(obj, space)

    def _leaf_meta(self, leaf: Leaf, space, reduced: Optional[int] = None) -> ArrayMeta:
        d = len(space.shape)
        v = leaf.view
        b = leaf.base
        if b.replicated:
            m = ArrayMeta("repv", leaf.dtype)
            off, st = v.full_strides()
            ushape = list(v.shape)
            if reduced is not None:  # a reduction target misses the reduced axis
                ushape.insert(reduced, 1)
                st = st[:reduced] + (0,) + st[reduced:]
            pad = d - len(ushape)
            ishape = (1,) * pad + tuple(ushape)
            istr = (0,) * pad + tuple(st)
            m.off0 = off
            m.rows_full = ishape[0] == space.shape[0] and space.shape[0] > 1
            m.st0 = istr[0]
            m.trail_strides = istr[1:]
            m.bcast = tuple(ishape[k] == 1 and space.shape[k] > 1 for k in range(d))
            if reduced is not None:
                m.bcast = tuple(True if k == reduced else m.bcast[k] for k in range(d))
            m.reduced = reduced
            return m
        m = ArrayMeta("dist", leaf.dtype)
        trail_shape = b.shape[1:]
        m.row_elems = _prod(trail_shape)
        toff, tstr = v.trail_strides(trail_shape)
        pstr = v.packed_strides()
        lead = (0,) * (v.lead_new() if not v.row_kept else 0)
        uafter = [e for e in v.after_row() if e[0] != "i"]
        ushape_after = [1] * len(lead) + [e[3] if e[0] == "s" else 1 for e in uafter]
        if reduced is not None:
            ushape_after.insert(reduced - 1, 1)
            tstr = tstr[:reduced - 1] + (0,) + tstr[reduced - 1:]
            pstr = pstr[:reduced - 1] + (0,) + pstr[reduced - 1:]
        pad = (d - 1) - len(ushape_after)
        m.trail_off = toff
        m.trail_strides = (0,) * pad + lead + tuple(tstr)
        m.packed_strides = (0,) * pad + lead + tuple(pstr)
        m.packed_row_elems = _prod(v.packed_trail_shape())
        ishape = (space.shape[0],) + (1,) * pad + tuple(ushape_after)
        m.bcast = (False,) + tuple(ishape[k] == 1 and space.shape[k] > 1 for k in range(1, d))
        if reduced is not None:
            m.bcast = tuple(True if k == reduced else m.bcast[k] for k in range(d))
        m.reduced = reduced
        layout = (b.dist.key, v.row_params, v.row_kept)
        m.identical = layout == (space.dist.key, (space.start, space.step, space.count), space.kept)
        return m

    # -- replicated rows: every rank computes everything --------------------------------
    def _build_rep(self, n: int, max_rows: int) -> None:
        bi = 0
        for s in range(0, n, max_rows):
            cnt = min(max_rows, n - s)
            blk = BlockSpec()
            blk.cnt, blk.index = cnt, bi
            self._fill_block(blk, cnt, row_i0=s, row_di=1, locs=None, parts=None)
            self.blocks.append(blk)
            bi += 1

    # -- distributed rows ------------------------------------------------------------
    def _build_dist(self, group, rank: int, nranks: int, n: int, max_rows: int) -> None:
        space = self.space
        sd = space.dist
        s0, t0 = space.start, space.step
        nonid = [a for a, m in enumerate(self.metas) if m.kind == "dist" and not m.identical]
        need_i = any(m.kind == "repv" and m.rows_full for m in self.metas)
        if not nonid:
            mine, out_loc = _my_rows_fast(sd, s0, t0, n, rank)
            comp = None
        else:
            i_all = np.arange(n, dtype=np.int64)
            comp = sd.owner(s0 + i_all * t0)
            mine = np.flatnonzero(comp == rank).astype(np.int64)
            out_loc = sd.local_index(s0 + mine * t0)
        m_count = len(mine)
        # per non-identical operand: source rank and local index of each needed row
        src_m: Dict[int, np.ndarray] = {}
        loc_m: Dict[int, np.ndarray] = {}
        pos_m: Dict[int, np.ndarray] = {}
        recv_parts: Dict[int, List[PartSpec]] = {}
        send_parts: Dict[int, List[PartSpec]] = {}
        part_index: Dict[Tuple[int, int], Tuple[int, int]] = {}  # (array, src) -> (peer, index in peer's list)
        for a in nonid:
            leaf = group.arrays[a][1] if group.arrays[a][0] != "red" else group.arrays[a][1].out
            v, b = leaf.view, leaf.base
            ls, lt, _ = v.row_params
            rows_all = ls + i_all * lt
            src_all = b.dist.owner(rows_all)
            loc_all = b.dist.local_index(rows_all)
            trail = v.packed_trail_shape()
            items = v.trail_items()
            # receiving
            sm = src_all[mine]
            lm = loc_all[mine]
            pos = np.zeros(m_count, dtype=np.int64)
            for q in np.unique(sm):
                q = int(q)
                if q == rank:
                    continue
                mask = sm == q
                cnt = int(mask.sum())
                pos[mask] = np.arange(cnt, dtype=np.int64)
                lst = recv_parts.setdefault(q, [])
                part_index[(a, q)] = (q, len(lst))
                lst.append(PartSpec(a, cnt, leaf.dtype, trail))
            src_m[a], loc_m[a], pos_m[a] = sm, lm, pos
            # sending: rows computed elsewhere whose operand rows live here
            smask = (src_all == rank) & (comp != rank)
            if smask.any():
                dests = comp[smask]
                rows_i = np.flatnonzero(smask)
                for c in np.unique(dests):
                    c = int(c)
                    sel = rows_i[dests == c]
                    locs = loc_all[sel]
                    send_parts.setdefault(c, []).append(
                        PartSpec(a, len(locs), leaf.dtype, trail, rows=selector(locs), items=items,
                                 hull=_hull(locs)))
        self.msgs_in = self._messages(recv_parts)
        self.msgs_out = self._messages(send_parts)
        msg_of_peer = {m.peer: k for k, m in enumerate(self.msgs_in)}
        # blocks
        srcs = [src_m[a] for a in nonid]
        seqs = [out_loc] + ([mine] if need_i else [])
        for a in nonid:
            seqs.append(np.where(src_m[a] == rank, loc_m[a], pos_m[a]))
        bi = 0
        for (s, e) in _segments(m_count, srcs, seqs):
            for cs in range(s, e, max_rows):
                ce = min(e, cs + max_rows)
                cnt = ce - cs
                blk = BlockSpec()
                blk.cnt, blk.index = cnt, bi
                locs = {}
                parts = {}
                for a in nonid:
                    q = int(src_m[a][cs])
                    if q == rank:
                        locs[a] = loc_m[a][cs:ce]
                    else:
                        peer, pi = part_index[(a, q)]
                        parts[a] = (msg_of_peer[peer], pi, int(pos_m[a][cs]))
                di = int(mine[cs + 1] - mine[cs]) if cnt > 1 else 1
                self._fill_block(blk, cnt, row_i0=int(mine[cs]), row_di=di, locs=locs, parts=parts,
                                 out_locs=out_loc[cs:ce])
                self.blocks.append(blk)
                bi += 1

    def _fill_block(self, blk: BlockSpec, cnt: int, row_i0: int, row_di: int, locs, parts,
                    out_locs: Optional[np.ndarray] = None) -> None:
        d = self.d
        tmpl: List[Any] = [cnt] + [int(x) for x in self.shape[1:]]
        refs: List[Tuple[int, Tuple]] = []
        needs = set()
        access: List[Access] = []
        units: List[bool] = []
        for a, m in enumerate(self.metas):
            if m.kind == "slot":
                refs.append((len(tmpl), ("s", a)))
                tmpl.append(None)
                tmpl.append(blk.index * m.slot_elems)
                strides = [0] + list(m.trail_strides)
                row_stride = 0
            elif m.kind == "repv":
                refs.append((len(tmpl), ("a", a)))
                tmpl.append(None)
                if m.rows_full:
                    tmpl.append(m.off0 + row_i0 * m.st0)
                    row_stride = row_di * m.st0
                else:
                    tmpl.append(m.off0)
                    row_stride = m.st0
                strides = [row_stride] + list(m.trail_strides)
                access.append((a, 0, 1 << 62, "W" if self._writes(a) else "R"))
            else:  # dist
                if parts is not None and a in parts:
                    mi, pi, pos0 = parts[a]
                    needs.add(mi)
                    refs.append((len(tmpl), ("p", mi, pi)))
                    tmpl.append(None)
                    tmpl.append(pos0 * m.packed_row_elems)
                    row_stride = m.packed_row_elems
                    strides = [row_stride] + list(m.packed_strides)
                else:
                    seq = locs[a] if (locs is not None and a in locs) else out_locs
                    l0 = int(seq[0])
                    dl = int(seq[1] - seq[0]) if cnt > 1 else 1
                    refs.append((len(tmpl), ("a", a)))
                    tmpl.append(None)
                    tmpl.append(l0 * m.row_elems + m.trail_off)
                    row_stride = dl * m.row_elems
                    strides = [row_stride] + list(m.trail_strides)
                    lo, hi = (l0, l0 + dl * (cnt - 1) + 1) if dl > 0 else (l0 + dl * (cnt - 1), l0 + 1)
                    access.append((a, lo, hi, "W" if self._writes(a) else "R"))
            unit = (not m.bcast[d - 1]) and strides[d - 1] == 1
            units.append(unit)
            for k in range(d):
                if m.bcast[k] or (k == d - 1 and unit):
                    continue
                tmpl.append(int(strides[k]))
        blk.template = tmpl
        blk.bufrefs = refs
        blk.needs = tuple(sorted(needs))
        blk.access = tuple(access)
        blk.kernel = tuple(units)  # replaced by the compiled kernel at the end of __init__

    def _writes(self, a: int) -> bool:
        return self._roles[a] in ("out", "red")

    def extra_buffers(self) -> Dict[str, Any]:
        nb = max(1, len(self.blocks))
        slots = {}
        for (a, op, axis, acc, pshape) in self.reds:
            if pshape is not None:
                slots[a] = np.zeros((nb,) + tuple(pshape), dtype=acc).reshape(-1)
        return {"slots": slots}


# =========================================================================== matmul
class MatmulPlan(Plan):
    """``out = a @ b`` on this rank: ``out``'s rows are ``a``'s rows (aligned); ``b``'s rows come
    from their owners (one message per peer, sent to every rank that has rows of ``a``). Units:
    the product with the local part of ``b`` (writes), then one accumulation per received part."""

    kind = "matmul"

    def __init__(self, task, rank: int, nranks: int):
        super().__init__()
        a, b = task.a, task.b
        va = a.view
        s, t, n = va.row_params
        self.mine, self.a_loc = _my_rows_fast(a.base.dist, s, t, n, rank)
        self.row_blocks = [(lo, hi) for lo, hi in _segments(len(self.mine), [], [self.a_loc])]
        col = va.after_row()[0]
        self.a_col = (col[1], col[2])
        self.a_items_after = va.after_row()
        k = b.view.shape[0]
        self.b_rep = b.base.replicated
        self.b_trail = b.view.packed_trail_shape()
        self.local_j: Optional[np.ndarray] = None
        self.local_b_rows: Any = None
        self.recv_j: List[np.ndarray] = []
        if self.b_rep:
            self.local_j = np.arange(k, dtype=np.int64)
            return
        bs, bt, _ = b.view.row_params
        rows_b = bs + np.arange(k, dtype=np.int64) * bt
        src = b.base.dist.owner(rows_b)
        loc = b.base.dist.local_index(rows_b)
        comp_ranks = set(int(x) for x in np.unique(a.base.dist.owner(s + np.arange(n, dtype=np.int64) * t)))
        items = b.view.trail_items()
        mine_j = np.flatnonzero(src == rank)
        self.local_j = mine_j
        self.local_b_rows = selector(loc[mine_j])
        send: Dict[int, List[PartSpec]] = {}
        if len(mine_j):
            for c in sorted(comp_ranks):
                if c != rank:
                    send[c] = [PartSpec(1, len(mine_j), b.dtype, self.b_trail, rows=selector(loc[mine_j]),
                                        items=items, hull=_hull(loc[mine_j]))]
        recv: Dict[int, List[PartSpec]] = {}
        if len(self.mine):
            for q in range(nranks):
                if q == rank:
                    continue
                jq = np.flatnonzero(src == q)
                if len(jq):
                    recv[q] = [PartSpec(1, len(jq), b.dtype, self.b_trail)]
                    self.recv_j.append(jq)
        self.msgs_in = self._messages(recv)
        self.msgs_out = self._messages(send)

    def a_cols(self, js: np.ndarray) -> Any:
        c0, ct = self.a_col
        return selector(c0 + js * ct)


# =========================================================================== transpose
class TransposePlan(Plan):
    """``out = src.T``: ``src`` rows owned here become columns of ``out`` everywhere. Message r->c
    holds ``src[rows of r, columns that are rows of c]`` already transposed; the local block is
    transposed in place while the messages fly."""

    kind = "transpose"

    def __init__(self, task, rank: int, nranks: int):
        super().__init__()
        src, out = task.src, task.out
        vs = src.view
        s, t, n = vs.row_params
        col = vs.after_row()[0]
        c0, ct = col[1], col[2]
        self.mine, self.a_loc = _my_rows_fast(src.base.dist, s, t, n, rank)
        self.a_rows = selector(self.a_loc)
        od = out.base.dist
        self.t_rows: Dict[int, np.ndarray] = {}
        for c in range(nranks):
            self.t_rows[c] = od.global_rows(c)  # out rows j owned by c (out is a full fresh base)
        my_j = self.t_rows[rank]
        self.t_loc_sel = selector(np.arange(len(my_j), dtype=np.int64))
        self.local_cols = selector(c0 + my_j * ct)
        self.local_tcols = selector(self.mine)
        send: Dict[int, List[PartSpec]] = {}
        recv: Dict[int, List[PartSpec]] = {}
        self.send_cols: Dict[int, Any] = {}
        if len(self.mine):
            for c in range(nranks):
                jc = self.t_rows[c]
                if c != rank and len(jc):
                    send[c] = [PartSpec(0, len(jc), src.dtype, (len(self.mine),))]
                    self.send_cols[c] = selector(c0 + jc * ct)
        self.recv_tcols: List[Any] = []
        src_owner = src.base.dist.owner(s + np.arange(n, dtype=np.int64) * t)
        if len(my_j):
            for q in range(nranks):
                iq = np.flatnonzero(src_owner == q)
                if q != rank and len(iq):
                    recv[q] = [PartSpec(0, len(my_j), src.dtype, (len(iq),))]
                    self.recv_tcols.append(selector(iq))
        self.msgs_in = self._messages(recv)
        self.msgs_out = self._messages(send)
        self.send_hull = _hull(self.a_loc)

    def pack_transposed(self, inst: Instance, k: int, local: np.ndarray) -> None:
        c = self.msgs_out[k].peer
        dst = inst.send_parts[k][0]
        blk = local[self.a_rows][:, self.send_cols[c]] if not isinstance(self.a_rows, slice) else \
            local[self.a_rows, self.send_cols[c]]
        transpose_copy(dst, blk)


# =========================================================================== replicate
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
        self.hull = _hull(loc[mine_i])
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
