"""Elementwise groups: the plan of a fused loop nest on this rank, its cache key and its lowering into units.

A group (:class:`~..fusion.ElementwiseGroup`: adjacent ``Assign`` / ``Reduce`` tasks over one row
space) runs as one compiled kernel (:mod:`~..fused_kernels`) per block of rows. The
:class:`ElementwisePlan` says which rows this rank computes, which operand rows it receives from
whom and sends to whom (one message per peer), and cuts the rows into blocks: a block is a run of
output rows whose operands each come from one place (the local buffer, or one received message)
with constant strides, so the kernel reads them in place. Blocks whose operands are all local run
while the messages are in flight.

Plans are cached by :func:`cache_key` (exact rows and views). An aligned local group (replicated rows, or every
distributed array on the rows computed; no message; reductions only over all axes) is cached by :func:`local_key`
instead (its shape class, without offsets or lengths), and that plan is rebound to each group of the class
(:meth:`ElementwisePlan.bound_to`: the rows, offsets and blocks recomputed, the addressing and instances shared,
the reduction slots grown if needed), so a window that moves every step (``M[k+1:, k:]``, a back substitution's
``x[k+1:]`` and scalars) does not build a plan per step.

Lowering (:func:`lower`): one send unit per outgoing message, one compute unit per block (waiting
for the messages it reads), and for reductions the units of :mod:`.reduction`. (What records the
elementwise operations is :mod:`~..elementwise`; what groups them, :mod:`~..fusion`.)
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..fp_errors import raise_flags
from ..fused_kernels import KernelSpec, get_kernel
from ..graph import Leaf
from ..indexing import _slice_of, c_strides
from ..plans import PartSpec, Plan, hull, prod, selector
from ..row_runs import RowPlan, row_plan
from ..units import GroupRun, Lowering, Unit, columns_of
from . import reduction

SlotAccess = Tuple[int, int, int, str]   # (array slot, lo, hi, mode) with mode R / W / A
_WRITERS = ("out", "red")

__all__ = ["ArrayMeta", "BlockSpec", "ElementwisePlan", "cache_key", "local_key", "lower", "LOWERINGS"]


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
        self.access: Tuple[SlotAccess, ...] = ()
        self.kernel = None
        self.index = 0




#: Memo of :func:`leaf_meta` (module wide: a meta depends only on its key, never on the rank or the plan);
#: cleared when full. An :class:`ArrayMeta` is never changed after :func:`leaf_meta` returns it.
_META_MEMO: Dict[Tuple, ArrayMeta] = {}
_META_MEMO_MAX = 4096


def leaf_meta(v, replicated: bool, dtype: np.dtype, sshape: Tuple[int, ...], reduced: Optional[int],
              identical: bool) -> ArrayMeta:
    """The :class:`ArrayMeta` of view ``v`` of a base (``replicated`` or distributed by rows) of ``dtype`` in a
    loop nest over ``sshape`` (axis 0 the rows); ``reduced``: the axis a reduction target misses; ``identical``:
    a distributed base's rows are exactly the rows of the space. Pure, one pass over the view's entries."""
    if replicated:
        return _rep_meta(v, dtype, sshape, reduced)
    return _dist_meta(v, dtype, sshape, reduced, identical)


def _rep_meta(v, dtype: np.dtype, sshape: Tuple[int, ...], reduced: Optional[int]) -> ArrayMeta:
    """:func:`leaf_meta` of a view of a replicated base: offset and strides over the whole base."""
    d = len(sshape)
    ents = v.entries
    m = ArrayMeta("repv", dtype)
    es = c_strides(v.base_shape)
    off = 0
    st: List[int] = []
    ushape: List[int] = []
    j = 0
    for e in ents:
        t = e[0]
        if t == "n":
            st.append(0)
            ushape.append(1)
            continue
        off += e[1] * es[j]
        if t == "s":
            st.append(e[2] * es[j])
            ushape.append(e[3])
        j += 1
    if reduced is not None:  # a reduction target misses the reduced axis
        ushape.insert(reduced, 1)
        st.insert(reduced, 0)
    pad = d - len(ushape)
    ishape = [1] * pad + ushape
    istr = [0] * pad + st
    m.off0 = off
    m.rows_full = ishape[0] == sshape[0] and sshape[0] > 1
    m.st0 = istr[0]
    m.trail_strides = tuple(istr[1:])
    m.bcast = tuple([(ishape[k] == 1 and sshape[k] > 1) or k == reduced for k in range(d)])
    m.reduced = reduced
    return m


def _dist_meta(v, dtype: np.dtype, sshape: Tuple[int, ...], reduced: Optional[int], identical: bool) -> ArrayMeta:
    """:func:`leaf_meta` of a view of a row-distributed base: per-row offset and strides over a local row, and
    the strides over a packed (received) row."""
    d = len(sshape)
    m = ArrayMeta("dist", dtype)
    row = v.lead_new()
    after = v.after_row()
    es = c_strides(v.base_shape[1:])
    m.row_elems = prod(v.base_shape[1:])
    toff = 0
    tstr: List[int] = []
    pshape: List[int] = []
    pkind: List[bool] = []        # per user axis after the row: True for a sliced base axis
    j = 0
    for e in after:
        t = e[0]
        if t == "n":
            tstr.append(0)
            pkind.append(False)
            continue
        toff += e[1] * es[j]
        if t == "s":
            tstr.append(e[2] * es[j])
            pshape.append(e[3])
            pkind.append(True)
        j += 1
    pes = c_strides(pshape)
    pstr: List[int] = []
    ushape: List[int] = []
    j = 0
    for k, sliced in enumerate(pkind):
        if sliced:
            pstr.append(pes[j])
            ushape.append(pshape[j])
            j += 1
        else:
            pstr.append(0)
            ushape.append(1)
    nlead = row if not v.row_kept else 0
    ushape = [1] * nlead + ushape
    if reduced is not None:
        ushape.insert(reduced - 1, 1)
        tstr.insert(reduced - 1, 0)
        pstr.insert(reduced - 1, 0)
    pad = (d - 1) - len(ushape)
    lead = [0] * (pad + nlead)
    m.trail_off = toff
    m.trail_strides = tuple(lead + tstr)
    m.packed_strides = tuple(lead + pstr)
    m.packed_row_elems = prod(pshape)
    ishape = [sshape[0]] + [1] * pad + ushape
    m.bcast = tuple([reduced == 0] + [(ishape[k] == 1 and sshape[k] > 1) or k == reduced for k in range(1, d)])
    m.reduced = reduced
    m.identical = identical
    return m


def _aligned(leaf: Leaf, space) -> bool:
    """True if distributed ``leaf`` shows exactly the rows of row space ``space`` in the same distribution (its
    rows are local wherever the space's are: no message)."""
    row = leaf.view.row_entry
    if row is None:
        same = not space.kept and space.start == 0 and space.step == 1 and space.count == 1
    elif row[0] == "s":
        same = space.kept and row[1] == space.start and row[2] == space.step and row[3] == space.count
    else:
        same = not space.kept and row[1] == space.start and space.step == 1 and space.count == 1
    return same and leaf.base.dist.key == space.dist.key


def _first_offset(v, replicated: bool) -> int:
    """The offset of view ``v``'s first element: in the whole base if ``replicated``, else in a local row (the
    entries after the row entry); what :func:`leaf_meta` puts in ``off0`` / ``trail_off``."""
    if replicated:
        ents, es = v.entries, c_strides(v.base_shape)
    else:
        ents, es = v.after_row(), c_strides(v.base_shape[1:])
    off = 0
    j = 0
    for e in ents:
        if e[0] != "n":
            off += e[1] * es[j]
            j += 1
    return off


def _skeleton(v) -> Tuple:
    """View ``v`` without its offsets and with its lengths reduced to 0, 1 or more (what addressing depends on)."""
    return (v.base_shape, tuple([(e[0], e[2], min(e[3], 2)) if e[0] == "s" else (e[0],) for e in v.entries]))


#: Bindings of one aligned local plan kept (:meth:`ElementwisePlan.bound_to`).
BOUND_MAX = 32


def _exact_key(g) -> Tuple:
    """What a plan of :func:`local_key` rebound to group ``g`` depends on beyond that key: the rows and views."""
    return (g.space.key, tuple([(obj.out if role == "red" else obj).view.key for role, obj in g.arrays]))


def local_key(g, chunk_elems: int) -> Optional[Tuple]:
    """The key of a plan shared by every aligned local group of the same shape class, or None if ``g`` is not
    one. Aligned local: no message on any rank, and reductions (if any) over all axes (``axis`` None: one
    partial per block, whatever the shape). Either replicated rows (every array replicated: a back substitution's
    scalar step) or distributed rows with every distributed array :func:`_aligned` with them. Its plan differs
    from another of the same key only in the rows, the offsets, the loop lengths and the number of blocks
    (:meth:`ElementwisePlan.rebound`), so a window that moves every step (``M[k+1:, k:]``, ``x[k+1:]``) finds it.
    The same on every rank (no rank in it)."""
    space = g.space
    descs = []
    for role, obj in g.arrays:
        if role == "red":
            if obj.axis is not None:
                return None
            descs.append((role, obj.op, obj.acc_dtype.str))
            continue
        rep = obj.base.replicated
        if not rep and (space.rep or not _aligned(obj, space)):
            return None
        descs.append((role, rep, obj.dtype.str, _skeleton(obj.view)))
    dkey = None if space.dist is None else space.dist.key
    return ("ewl", g.program_key, space.kind, dkey, space.step, space.kept, tuple([min(x, 2) for x in space.shape]),
            tuple(descs), chunk_elems)


#: Compiled kernels by ``(program key, bcast flags, unit inner strides)``: what a :class:`KernelSpec` is made
#: of (the program key holds the loop depth, the array dtypes, the statements and the reductions).
_KERNEL_MEMO: Dict[Tuple, Any] = {}


def _kernel_of(group, d: int, bcasts: Tuple[Tuple[bool, ...], ...], units: Tuple[bool, ...]):
    """The compiled kernel of ``group`` for arrays broadcast along ``bcasts`` with unit inner strides ``units``
    (:func:`~..fused_kernels.get_kernel`, without building a :class:`KernelSpec` when seen before)."""
    key = (group.program_key, bcasts, units)
    k = _KERNEL_MEMO.get(key)
    if k is None:
        arrays = [(group.array_dtype(a), bcasts[a], units[a]) for a in range(len(bcasts))]
        k = get_kernel(KernelSpec(d, arrays, len(group.consts), group.stmts, group.reductions))
        if len(_KERNEL_MEMO) >= _META_MEMO_MAX:
            _KERNEL_MEMO.clear()
        _KERNEL_MEMO[key] = k
    return k


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
        #: each array's offset of its first element (a local row's trailing part for a distributed one)
        self.offs = [m.off0 if m.kind == "repv" else m.trail_off for m in self.metas]
        self.blocks: List[BlockSpec] = []
        n = space.count
        trail_elems = prod(space.shape[1:])
        if prod(space.shape) > 0:
            max_rows = max(1, chunk_elems // max(1, trail_elems))
            if space.rep:
                self._build_rep(n, max_rows)
            else:
                self._build_dist(group, rank, nranks, n, max_rows)
        self._link_kernels(group)
        #: :func:`_exact_key` of the group it was built for, and of the groups it was rebound to, those plans
        self._ek = _exact_key(group)
        self._bound: Dict[Tuple, "ElementwisePlan"] = {}

    def _link_kernels(self, group, specs: Optional[Dict[Tuple[bool, ...], Any]] = None) -> None:
        """Replace each block's unit-stride flags by its compiled kernel (one per distinct combination). ``specs``:
        the kernels by flags already linked for the same program and addressing (a rebound plan is given its
        cached plan's, :meth:`_rebound`), extended here; kept as ``_kmap``."""
        if specs is None:
            specs = {}
        bcasts = None
        for blk in self.blocks:
            units = blk.kernel
            k = specs.get(units)
            if k is None:
                if bcasts is None:
                    bcasts = tuple([m.bcast for m in self.metas])
                k = specs[units] = _kernel_of(group, self.d, bcasts, units)
            blk.kernel = k
        self._kmap = specs

    def bound_to(self, group, rank: int, chunk_elems: int) -> Tuple["ElementwisePlan", bool]:
        """This plan (cached under :func:`local_key`) for ``group``, an aligned local group of the same
        :func:`local_key`, and whether it was rebound now: the same addressing (``metas``) and instances, the
        group's rows, offsets and blocks (:meth:`_rebound`). The last :data:`BOUND_MAX` bindings are kept, so a
        loop over the same views finds its plan as it is. Local, cheap. Called by :func:`lower` only."""
        ek = _exact_key(group)
        if ek == self._ek:
            return self, False
        p = self._bound.get(ek)
        if p is not None:
            return p, False
        p = self._rebound(group, rank, chunk_elems, ek)
        if len(self._bound) >= BOUND_MAX:
            del self._bound[next(iter(self._bound))]       # the oldest binding
        self._bound[ek] = p
        return p, True

    def _rebound(self, group, rank: int, chunk_elems: int, ek: Tuple) -> "ElementwisePlan":
        """A new plan sharing this one's addressing and instances, with ``group``'s rows, offsets and blocks."""
        p = ElementwisePlan.__new__(ElementwisePlan)
        p.msgs_in, p.msgs_out, p.instances = [], [], self.instances   # one instance pool, kept by the cached plan
        # reductions of a local key are over all axes: their (slot, op, axis, acc, ()) do not depend on the shape
        p._roles, p.metas, p.reds, p.d, p.rank = self._roles, self.metas, self.reds, self.d, rank
        space = group.space
        p.space, p.shape = space, space.shape
        p.offs = [0 if m.kind == "slot" else _first_offset(obj.view, m.kind == "repv")
                  for (_, obj), m in zip(group.arrays, self.metas)]
        p.blocks = []
        if prod(space.shape) > 0:
            max_rows = max(1, chunk_elems // max(1, prod(space.shape[1:])))
            if space.rep:
                p._build_rep(space.count, max_rows)
            else:
                need_i = any(m.kind == "repv" and m.rows_full for m in self.metas)
                rp = row_plan(space.dist, space.start, space.step, space.count, (), rank, need_i)
                p._dist_blocks([], rank, max_rows, rp, {})
        p._link_kernels(group, self._kmap)     # the same program (its local_key) and metas: the same kernels
        p._ek, p._bound = ek, {}          # never asked (only the cached plan is): no reference cycle
        return p

    # -- array addressing -----------------------------------------------------------
    def _meta(self, role: str, obj: Any, space) -> ArrayMeta:
        d = len(space.shape)
        if role == "red":
            if obj.axis is None or obj.axis == 0:
                m = ArrayMeta("slot", obj.acc_dtype)
                pshape = () if obj.axis is None else tuple(space.shape[1:])
                m.slot_elems = prod(pshape)
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
        """The addressing of ``leaf`` (a reduction target missing axis ``reduced`` if given), from the memo
        of :func:`leaf_meta` when the same view was addressed over the same row space before."""
        v = leaf.view
        rep = leaf.base.dist.replicated
        identical = rep or _aligned(leaf, space)
        key = (v.key, rep, leaf.dtype, space.shape, reduced, identical)
        m = _META_MEMO.get(key)
        if m is None:
            if len(_META_MEMO) >= _META_MEMO_MAX:
                _META_MEMO.clear()
            m = _META_MEMO[key] = leaf_meta(v, rep, leaf.dtype, space.shape, reduced, identical)
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
        """Messages and blocks of the rows computed here, from the :class:`~..row_runs.RowPlan` (runs of rows
        in closed form for block layouts, row by row otherwise)."""
        space = self.space
        nonid = [a for a, m in enumerate(self.metas) if m.kind == "dist" and not m.identical]
        leaves = [group.arrays[a][1] if group.arrays[a][0] != "red" else group.arrays[a][1].out for a in nonid]
        ops = [(leaf.base.dist, leaf.view.row_params[0], leaf.view.row_params[1]) for leaf in leaves]
        need_i = any(m.kind == "repv" and m.rows_full for m in self.metas)
        rp = row_plan(space.dist, space.start, space.step, n, ops, rank, need_i)
        part_index = self._operand_messages(nonid, leaves, rp)
        self._dist_blocks(nonid, rank, max_rows, rp, part_index)

    def _operand_messages(self, nonid: List[int], leaves: List[Leaf], rp: RowPlan) -> Dict[Tuple[int, int], int]:
        """Set ``msgs_in`` / ``msgs_out`` for the operands ``nonid`` laid out unlike the rows computed here.
        Returns ``(operand, source) -> index of its part in the message from that source``."""
        recv_parts: Dict[int, List[PartSpec]] = {}
        send_parts: Dict[int, List[PartSpec]] = {}
        part_index: Dict[Tuple[int, int], int] = {}
        for k, q, cnt in rp.recv:
            leaf = leaves[k]
            lst = recv_parts.setdefault(q, [])
            part_index[(nonid[k], q)] = len(lst)
            lst.append(PartSpec(nonid[k], cnt, leaf.dtype, leaf.view.packed_trail_shape()))
        for k, c, locs in rp.send:
            leaf = leaves[k]
            if isinstance(locs, tuple):        # (first, step, count): a slice, its hull in closed form
                l0, dl, cnt = locs
                last = l0 + dl * (cnt - 1)
                rows, hl, count = _slice_of(l0, dl, cnt), (min(l0, last), max(l0, last) + 1), cnt
            else:
                rows, hl, count = selector(locs), hull(locs), len(locs)
            send_parts.setdefault(c, []).append(
                PartSpec(nonid[k], count, leaf.dtype, leaf.view.packed_trail_shape(), rows=rows,
                         items=leaf.view.trail_items(), hull=hl))
        self.msgs_in = self._messages(recv_parts)
        self.msgs_out = self._messages(send_parts)
        return part_index

    def _dist_blocks(self, nonid: List[int], rank: int, max_rows: int, rp: RowPlan,
                     part_index: Dict[Tuple[int, int], int]) -> None:
        """Cut the segments of ``rp`` into blocks of at most ``max_rows`` rows and append them to ``blocks``."""
        msg_of_peer = {m.peer: k for k, m in enumerate(self.msgs_in)}
        bi = 0
        for (scnt, i0, di, o0, od, per) in rp.segs:
            for j in range(0, scnt, max_rows):
                cnt = min(max_rows, scnt - j)
                blk = BlockSpec()
                blk.cnt, blk.index = cnt, bi
                locs = {}
                parts = {}
                for a, (q, v0, dv) in zip(nonid, per):
                    if q == rank:
                        locs[a] = (v0 + j * dv, dv if cnt > 1 else 1)
                    else:
                        parts[a] = (msg_of_peer[q], part_index[(a, q)], v0 + j * dv)
                self._fill_block(blk, cnt, row_i0=i0 + j * di, row_di=di if cnt > 1 else 1, locs=locs,
                                 parts=parts, out_locs=(o0 + j * od, od if cnt > 1 else 1))
                self.blocks.append(blk)
                bi += 1

    def _fill_block(self, blk: BlockSpec, cnt: int, row_i0: int, row_di: int, locs, parts,
                    out_locs: Optional[Tuple[int, int]] = None) -> None:
        """Kernel arguments of block ``blk``: ``locs`` maps a local operand to ``(first local row, step)``,
        ``parts`` a received one to ``(message, part, first position)``; ``out_locs`` is the aligned rows'
        ``(first local row, step)``."""
        d = self.d
        last = d - 1
        tmpl: List[Any] = [cnt]
        tmpl.extend([int(x) for x in self.shape[1:]])
        refs: List[Tuple[int, Tuple]] = []
        needs = set()
        access: List[SlotAccess] = []
        units: List[bool] = []
        roles = self._roles
        offs = self.offs
        for a, m in enumerate(self.metas):
            kind = m.kind
            if kind == "slot":
                refs.append((len(tmpl), ("s", a)))
                tmpl.append(None)
                tmpl.append(blk.index * m.slot_elems)
                row_stride = 0
                trail = m.trail_strides
            elif kind == "repv":
                refs.append((len(tmpl), ("a", a)))
                tmpl.append(None)
                if m.rows_full:
                    tmpl.append(offs[a] + row_i0 * m.st0)
                    row_stride = row_di * m.st0
                else:
                    tmpl.append(offs[a])
                    row_stride = m.st0
                trail = m.trail_strides
                access.append((a, 0, 1 << 62, "W" if roles[a] in _WRITERS else "R"))
            elif parts is not None and a in parts:   # dist, received
                mi, pi, pos0 = parts[a]
                needs.add(mi)
                refs.append((len(tmpl), ("p", mi, pi)))
                tmpl.append(None)
                tmpl.append(pos0 * m.packed_row_elems)
                row_stride = m.packed_row_elems
                trail = m.packed_strides
            else:                                    # dist, local
                l0, dl = locs[a] if (locs is not None and a in locs) else out_locs
                refs.append((len(tmpl), ("a", a)))
                tmpl.append(None)
                tmpl.append(l0 * m.row_elems + offs[a])
                row_stride = dl * m.row_elems
                trail = m.trail_strides
                lo, hi = (l0, l0 + dl * (cnt - 1) + 1) if dl > 0 else (l0 + dl * (cnt - 1), l0 + 1)
                access.append((a, lo, hi, "W" if roles[a] in _WRITERS else "R"))
            bc = m.bcast
            unit = (not bc[last]) and (trail[last - 1] if last else row_stride) == 1
            units.append(unit)
            if not bc[0] and not (last == 0 and unit):
                tmpl.append(int(row_stride))
            for k in range(1, d):
                if bc[k] or (k == last and unit):
                    continue
                tmpl.append(int(trail[k - 1]))
        blk.template = tmpl
        blk.bufrefs = refs
        blk.needs = tuple(sorted(needs))
        blk.access = tuple(access)
        blk.kernel = tuple(units)  # replaced by the compiled kernel at the end of __init__

    def extra_buffers(self) -> Dict[str, Any]:
        nb = max(1, len(self.blocks))
        slots = {}
        for (a, op, axis, acc, pshape) in self.reds:
            if pshape is not None:
                slots[a] = np.zeros((nb,) + tuple(pshape), dtype=acc).reshape(-1)
        return {"slots": slots}

    def slots_of(self, inst) -> Dict[int, np.ndarray]:
        """The reduction slots of ``inst`` (an instance of this plan's pool), grown first if this plan (a
        rebound one) has more blocks than the plan that made them: a kernel writes block ``i``'s partial at
        ``i * slot_elems`` unchecked. Called by :func:`lower` before any unit runs."""
        slots = inst.extra.get("slots", {})
        nb = len(self.blocks)
        for (a, op, axis, acc, pshape) in self.reds:
            s = slots.get(a)
            if s is not None and s.size < nb * self.metas[a].slot_elems:
                slots[a] = np.zeros((nb,) + tuple(pshape), dtype=acc).reshape(-1)
        return slots




# =========================================================================== cache key and lowering
def cache_key(g, chunk_elems: int) -> Tuple:
    """The plan cache key of group ``g``: the program's shape, the row space, each array's layout and dtype
    (and each reduction's operator and axis) and the block size; no values, no array identities."""
    descs = []
    for role, obj in g.arrays:
        if role == "red":
            descs.append((role, obj.op, obj.axis, obj.acc_dtype.str, obj.out.base.dist.key, obj.out.view.key,
                          obj.out.dtype.str))
        else:
            descs.append((role, obj.base.dist.key, obj.view.key, obj.dtype.str))
    return ("ew", g.program_key, g.space.key, tuple(descs), chunk_elems)


def lower(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The units of elementwise group ``g`` in flush ``fl``: receives, one send per outgoing message, one
    kernel call per block (each waiting for the messages it reads; its accesses name the base columns of a
    view of some columns, :func:`~..units.columns_of`), then the reductions' units."""
    ctx = fl.ctx
    ce = ctx.chunk_elems
    lk = local_key(g, ce)
    if lk is None:
        plan: ElementwisePlan = ctx.plan(cache_key(g, ce), lambda: ElementwisePlan(g, fl.rank, fl.size, ce))
    else:
        plan, fresh = ctx.plan(lk, lambda: ElementwisePlan(g, fl.rank, fl.size, ce)).bound_to(g, fl.rank, ce)
        ctx.stats["plans_rebound"] += fresh
    inst, run = fl.group_run(plan, flush_no, g.label)
    bases = [obj.out.base if role == "red" else obj.base for role, obj in g.arrays]

    def local_of(a: int) -> np.ndarray:
        return bases[a].ensure()

    for k in range(len(plan.msgs_out)):
        run.sends.append(fl.send_unit(plan, inst, k, local_of, lambda a: bases[a].serial, g.label))
    slots = plan.slots_of(inst)
    recv_flat = [[p.reshape(-1) for p in parts] for parts in inst.recv_parts]
    scalars = [c.value for c in g.consts]
    serials = [b.serial for b in bases]
    cols = [columns_of(obj.out.view if role == "red" else obj.view) for role, obj in g.arrays]
    for blk in plan.blocks:
        u = Unit("compute", _block_fn(fl, blk, bases, recv_flat, slots, scalars), g.label,
                 tuple((serials[a], lo, hi, mode) if cols[a] is None else (serials[a], lo, hi, mode) + cols[a]
                       for (a, lo, hi, mode) in blk.access))
        u.ndeps = len(blk.needs)
        for mi in blk.needs:
            run.recvs[mi].units.append(u)
        run.computes.append(u)
    reduction.lower_partials(fl, g, plan, inst, run, slots, flush_no)
    return run


def _block_fn(fl: Lowering, blk: BlockSpec, bases: List[Any], recv_flat: List[List[np.ndarray]],
              slots: Dict[int, np.ndarray], scalars: List[Any]) -> Callable[[], None]:
    """The computation of one block: the kernel on the local buffers, received parts and reduction slots."""

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
        flags = blk.kernel(*args)
        if flags:              # an integer division by zero or overflow (the kernel counted it): NumPy's flags
            raise_flags(flags)
        fl.blocks += 1
    return fn


LOWERINGS = {"elementwise": lower}
