"""Matrix product and transpose: their plans on this rank, cache keys and lowerings into units.

What :mod:`~..linalg` records (:class:`~..graph.Matmul`, :class:`~..graph.Transpose`) is evaluated here.

* ``out = a @ b`` (:class:`MatmulPlan`): ``out``'s rows are ``a``'s rows (aligned); ``b``'s rows come
  from their owners, one message per peer. Units: per run of local rows, the product with the local
  part of ``b`` (writes), then one accumulation per received part (waits for that message).
* ``out = v @ b`` (:class:`VecMatPlan`, ``b``'s rows distributed, ``v`` replicated or one fixed row of a
  distributed base, whose owner sends each rank the entries it needs): the product of the local rows of ``b``
  with their entries of ``v`` (NumPy's ``@``), then the partial products summed in rank order: with ``v`` one
  fixed row, on ``v``'s owner alone (each other rank with rows of ``b`` sends it its partial product; the result
  lives there), with ``v`` replicated, on every rank after one allgather.
* In block layouts both products take a plan of their shape class (:class:`BlockMatmulPlan`,
  :class:`BlockVecMatPlan`): each message's room is rounded up (:func:`room`) and the plan is bound to each use in
  closed form, so that the steps of a loop over a moving window (LU) share a few plans, their buffers and
  persistent requests instead of building them every step. The local product of a matrix product reads only its
  rows of ``b``: a later write of another row of ``b`` does not wait for it.
* ``out = src.T`` (:class:`TransposePlan`): the rows of ``src`` owned here become columns of ``out``
  everywhere; each message is packed already transposed, and the local block is transposed while
  the messages fly.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..fused_kernels import transpose_copy
from ..graph import Matmul, Transpose, VecMat
from ..indexing import _slice_of
from ..reductions import combine_partials
from ..plans import Instance, PartSpec, Plan, hull, my_rows, prod, segments, selector
from ..row_runs import block_i_range
from ..units import FULL, GroupRun, Label, Lowering, Unit, Waitable, access_of, after, columns_of

__all__ = ["MatmulPlan", "BlockMatmulPlan", "VecMatPlan", "BlockVecMatPlan", "room", "block_matmul_key",
           "block_vecmat_key", "TransposePlan", "matmul_key", "vecmat_key", "transpose_key", "lower_matmul",
           "lower_vecmat", "lower_transpose", "LOWERINGS"]


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
        self.mine, self.a_loc = my_rows(a.base.dist, s, t, n, rank)
        if a.base.dist.kind == "block":         # my_rows gave one arithmetic run of local rows (step t)
            self.row_blocks = [(0, len(self.mine))] if len(self.mine) else []
            self.row_sels = [_run_entry(self.a_loc, t)] if len(self.mine) else []
        else:
            self.row_blocks = [(lo, hi) for lo, hi in segments(len(self.mine), [], [self.a_loc])]
            #: Per row block: (selector of its local rows of ``a``, lowest local row, highest + 1).
            self.row_sels = [(selector(self.a_loc[lo:hi]), int(self.a_loc[lo:hi].min()),
                              int(self.a_loc[lo:hi].max()) + 1) for lo, hi in self.row_blocks]
        col = va.after_row()[0]
        self.a_col = (col[1], col[2])
        self.a_items_after = va.after_row()
        k = b.view.shape[0]
        self.b_rep = b.base.replicated
        #: Whether every rank's rows ``j`` of ``b`` are one run (step 1): ``b`` replicated or in a block layout.
        self.b_runs = self.b_rep or b.base.dist.kind == "block"
        self.b_trail = b.view.packed_trail_shape()
        self.local_j: Optional[np.ndarray] = None
        self.local_b_rows: Any = None
        #: The local rows of ``b`` the local product reads (their hull; every row when ``b`` is replicated): a
        #: later write of another row of ``b`` (the next row of a factorization) does not wait for the product.
        self.b_hull: Tuple[int, int] = (0, FULL)
        self.recv_j: List[np.ndarray] = []
        if self.b_rep:
            self.local_j = np.arange(k, dtype=np.int64)
            self.local_cols = self.a_cols(self.local_j)
            self.recv_cols = []
            self.b_send_hull = (0, 0)
            self._counts()
            return
        bs, bt, _ = b.view.row_params
        comp_ranks = _ranks_with_rows(a.base.dist, s, t, n, nranks)
        b_rows = _b_rows_by_owner(b.base.dist, bs, bt, k, nranks)     # per rank: (view rows j, local rows there)
        items = b.view.trail_items()
        mine_j, my_loc = b_rows[rank]
        self.local_j = mine_j
        self.local_b_rows = _rows_sel(my_loc, bt, self.b_runs)
        self.b_hull = _rows_hull(my_loc, self.b_runs) if len(my_loc) else (0, 0)
        send: Dict[int, List[PartSpec]] = {}
        if len(mine_j):
            for c in sorted(comp_ranks):
                if c != rank:
                    send[c] = [PartSpec(1, len(mine_j), b.dtype, self.b_trail, rows=self.local_b_rows,
                                        items=items, hull=_rows_hull(my_loc, self.b_runs))]
        recv: Dict[int, List[PartSpec]] = {}
        if len(self.mine):
            for q in range(nranks):
                if q == rank:
                    continue
                jq = b_rows[q][0]
                if len(jq):
                    recv[q] = [PartSpec(1, len(jq), b.dtype, self.b_trail)]
                    self.recv_j.append(jq)
        self.msgs_in = self._messages(recv)
        self.msgs_out = self._messages(send)
        self.local_cols = self.a_cols(self.local_j)
        self.recv_cols = [self.a_cols(j) for j in self.recv_j]
        self.b_send_hull = _rows_hull(my_loc, self.b_runs)
        self._counts()

    def _counts(self) -> None:
        """How many rows of ``b`` this rank multiplies locally and receives per message (a message's room may
        be larger: :class:`BlockMatmulPlan`)."""
        self.n_local = len(self.local_j)
        self.recv_n = [len(j) for j in self.recv_j]

    def a_cols(self, js: np.ndarray) -> Any:
        """The columns of ``a``'s local rows that multiply the rows ``js`` of ``b`` (a slice for a run)."""
        c0, ct = self.a_col
        if self.b_runs and len(js):         # js is one run (step 1): the columns are, in closed form
            return _slice_of(c0 + int(js[0]) * ct, ct if len(js) > 1 else 1, len(js))
        return selector(c0 + js * ct)


def _run_entry(loc: np.ndarray, step: int) -> Tuple[Any, int, int]:
    """``(slice, lowest, highest + 1)`` of the non-empty arithmetic run ``loc`` of step ``step`` (no pass over it)."""
    first, last = int(loc[0]), int(loc[-1])
    return _slice_of(first, step if len(loc) > 1 else 1, len(loc)), min(first, last), max(first, last) + 1


def _rows_sel(loc: np.ndarray, step: int, run: bool) -> Any:
    """The selector of local rows ``loc``: in closed form when ``run`` says they are an arithmetic run of step
    ``step``, else :func:`~..plans.selector`."""
    return _run_entry(loc, step)[0] if run and len(loc) else selector(loc)


def _rows_hull(loc: np.ndarray, run: bool) -> Tuple[int, int]:
    """:func:`~..plans.hull` of ``loc``, from its ends when ``run`` says it is an arithmetic run."""
    return _run_entry(loc, 1)[1:] if run and len(loc) else hull(loc)


def _ranks_with_rows(dist, s: int, t: int, n: int, nranks: int) -> set:
    """The ranks owning at least one of the rows ``s + i * t`` (``0 <= i < n``) of ``dist``: in closed form for
    a block layout, row by row otherwise."""
    if dist.kind == "block":
        out = set()
        for q in range(nranks):
            i0, i1 = block_i_range(*dist.block_range(q), s, t, n)
            if i1 > i0:
                out.add(q)
        return out
    return set(int(x) for x in np.unique(dist.owner(s + np.arange(n, dtype=np.int64) * t)))


def _b_rows_by_owner(dist, s: int, t: int, k: int, nranks: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Per rank ``q``: (the view rows ``j`` (``0 <= j < k``, increasing) whose base row ``s + j * t`` ``q`` owns,
    their local indices there). In closed form for a block layout (one run of ``j`` per rank), row by row
    otherwise."""
    if dist.kind == "block":
        out = []
        for q in range(nranks):
            lo, hi = dist.block_range(q)
            j0, j1 = block_i_range(lo, hi, s, t, k)
            j = np.arange(j0, max(j0, j1), dtype=np.int64)
            out.append((j, (s - lo) + j * t))
        return out
    rows_b = s + np.arange(k, dtype=np.int64) * t
    src = dist.owner(rows_b)
    loc = dist.local_index(rows_b)
    out = []
    for q in range(nranks):
        jq = np.flatnonzero(src == q)
        out.append((jq, loc[jq]))
    return out


#: Bytes of a message above which its room is its exact size (:func:`room`): a large message costs more to send
#: padded than its plan costs to build.
ROOM_EXACT_BYTES = 1 << 20


def room(count: int, row_bytes: int = 8) -> int:
    """The room, in rows, of a message holding ``count`` rows of ``row_bytes`` bytes in a plan shared by a shape
    class: ``count`` up to 16 rows or above :data:`ROOM_EXACT_BYTES`, else ``count`` rounded up to ``m * 2**e``
    with ``8 <= m < 16`` (at most 1/8 more), so that the steps of a loop whose messages grow by a row share a few
    plans."""
    if count <= 16 or count * row_bytes > ROOM_EXACT_BYTES:
        return count
    e = count.bit_length() - 4
    return -(-count >> e) << e


def _block_rows(dist, q: int, s: int, t: int, n: int) -> Tuple[int, int, int]:
    """``(i0, count, first local row)``: the view rows ``s + i * t`` (``i0 <= i < i0 + count``) that rank ``q``
    owns in the block layout ``dist`` and the local row of the first one there (local rows step by ``t``)."""
    lo, hi = dist.block_range(q)
    i0, i1 = block_i_range(lo, hi, s, t, n)
    return i0, max(0, i1 - i0), s + i0 * t - lo


def _run(first: int, step: int, count: int) -> Tuple[Any, int, int]:
    """``(slice, lowest, highest + 1)`` of the ``count`` local rows ``first + r * step`` (``(0, 0)`` when none)."""
    if count <= 0:
        return slice(0, 0), 0, 0
    last = first + step * (count - 1)
    return _slice_of(first, step if count > 1 else 1, count), min(first, last), max(first, last) + 1


def block_matmul_key(t: Matmul, nranks: int) -> Optional[Tuple[Tuple, List, List]]:
    """``(key, rows of a, rows of b)``: the key of the :class:`BlockMatmulPlan` serving ``t`` and, per rank,
    :func:`_block_rows` of ``a`` and of ``b``; None when ``t`` is not one: ``a`` and ``b`` (not replicated) in
    block layouts. What its messages depend on: which ranks hold rows of ``a``, the :func:`room` of each rank's
    rows of ``b``, ``b``'s dtype and packed trailing shape. The same on every rank."""
    a, b = t.a, t.b
    if a.base.dist.kind != "block" or b.base.replicated or b.base.dist.kind != "block":
        return None
    s, st, n = a.view.row_params
    bs, bt, k = b.view.row_params
    da, db = a.base.dist, b.base.dist
    ra = [_block_rows(da, q, s, st, n) for q in range(nranks)]
    rb = [_block_rows(db, q, bs, bt, k) for q in range(nranks)]
    trail = b.view.packed_trail_shape()
    rb_bytes = b.dtype.itemsize * prod(trail)
    key = ("mm-block", tuple([r[1] > 0 for r in ra]), tuple([room(r[1], rb_bytes) for r in rb]), b.dtype.str,
           trail)
    return key, ra, rb


class BlockMatmulPlan(Plan):
    """``out = a @ b`` with ``a`` and ``b`` in block layouts (:func:`block_matmul_key`): the messages of
    :class:`MatmulPlan` with each message's room rounded up (:func:`room`, the whole room is sent), so that the
    steps of a loop over a moving window (LU's ``L[k+1:, :k] @ U[:k, k]``) share this plan and its instances;
    :meth:`bound_to` gives the rows of one use in closed form (no pass over the rows). Same fields as
    :class:`MatmulPlan` read by :func:`lower_matmul`."""

    kind = "matmul"

    def __init__(self, task, rank: int, ra: List, rb: List):
        """``ra``, ``rb``: :func:`_block_rows` of ``a`` and ``b`` per rank (:func:`block_matmul_key`)."""
        super().__init__()
        comp = self._bind(task, rank, ra, rb)
        b = task.b
        row_bytes = b.dtype.itemsize * prod(self.b_trail)
        send: Dict[int, List[PartSpec]] = {}
        recv: Dict[int, List[PartSpec]] = {}
        if self.n_local:
            for c in sorted(comp):
                if c != rank:
                    send[c] = [PartSpec(1, room(self.n_local, row_bytes), b.dtype, self.b_trail)]
        if self.row_sels:
            for q, cnt in enumerate(self._b_counts):
                if q != rank and cnt:
                    recv[q] = [PartSpec(1, room(cnt, row_bytes), b.dtype, self.b_trail)]
        self.msgs_in = self._messages(recv)
        self.msgs_out = self._messages(send)

    def bound_to(self, task, rank: int, ra: List, rb: List) -> "BlockMatmulPlan":
        """A plan for ``task`` (same :func:`block_matmul_key`, which gave ``ra`` and ``rb``) sharing this one's
        messages and instances. Local, cheap; called by :func:`lower_matmul` only."""
        p = BlockMatmulPlan.__new__(BlockMatmulPlan)
        p.msgs_in, p.msgs_out, p.instances = self.msgs_in, self.msgs_out, self.instances
        p._bind(task, rank, ra, rb)
        return p

    def _bind(self, task, rank: int, ra: List, rb: List) -> set:
        """Set the rows of ``task`` on this rank; the ranks with rows of ``a``."""
        a, b = task.a, task.b
        t = a.view.row_params[1]
        comp = set()
        for q, (i0, cnt, first) in enumerate(ra):
            if cnt:
                comp.add(q)
            if q == rank:
                self.row_sels = [_run(first, t, cnt)] if cnt else []
        col = a.view.after_row()[0]
        self.a_col = (col[1], col[2])
        c0, ct = self.a_col
        self.b_rep, self.b_runs = False, True
        self.b_trail = b.view.packed_trail_shape()
        bt = b.view.row_params[1]
        self._b_counts = []
        self.recv_n, self.recv_cols = [], []
        for q, (j0, cnt, first) in enumerate(rb):
            self._b_counts.append(cnt)
            cols = _slice_of(c0 + j0 * ct, ct if cnt > 1 else 1, cnt)
            if q == rank:
                self.n_local, self.local_cols = cnt, cols
                self.local_b_rows, lo, hi = _run(first, bt, cnt)
                self.b_hull = self.b_send_hull = (lo, hi)
            elif cnt and self.row_sels:
                self.recv_n.append(cnt)
                self.recv_cols.append(cols)
        return comp


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
        self.mine, self.a_loc = my_rows(src.base.dist, s, t, n, rank)
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
        self.send_hull = hull(self.a_loc)

    def pack_transposed(self, inst: Instance, k: int, local: np.ndarray) -> None:
        c = self.msgs_out[k].peer
        dst = inst.send_parts[k][0]
        blk = local[self.a_rows][:, self.send_cols[c]] if not isinstance(self.a_rows, slice) else \
            local[self.a_rows, self.send_cols[c]]
        transpose_copy(dst, blk)




# =========================================================================== cache keys and lowerings
def matmul_key(t: Matmul) -> Tuple:
    """The plan cache key of ``t``: layouts, views and dtypes of ``a``, ``b`` and ``out``."""
    a, b, out = t.a, t.b, t.out
    return ("mm", a.base.dist.key, a.view.key, a.dtype.str, b.base.dist.key, b.view.key, b.dtype.str,
            out.base.dist.key, out.view.key, out.dtype.str)


def _plan_of(fl: Lowering, t: Any, block_key: Callable, exact_key: Callable, cls: type, block_cls: type) -> Any:
    """The plan of ``t`` (a Matmul or VecMat task) on this rank: in block layouts (``block_key(t, nranks)`` gives
    ``(shape class key, *args)``) the ``block_cls`` plan of its shape class, built as ``block_cls(t, rank, *args)``
    on a miss, else the cached one bound to ``t`` (counted in ``plans_rebound``); otherwise the ``cls`` plan
    cached under ``exact_key(t)``. Local."""
    ctx = fl.ctx
    got = block_key(t, fl.size)
    if got is None:
        return ctx.plan(exact_key(t), lambda: cls(t, fl.rank, fl.size))
    key, *args = got
    built = []
    plan = ctx.plan(key, lambda: built.append(1) or block_cls(t, fl.rank, *args))
    if not built:
        plan = plan.bound_to(t, fl.rank, *args)
        ctx.stats["plans_rebound"] += 1
    return plan


def lower_matmul(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The units of ``g.task`` (a :class:`~..graph.Matmul`) in flush ``fl``: the sends of this rank's rows of ``b``
    (packed into the start of each message's room), the product with them, one accumulation per received
    message."""
    t: Matmul = g.task
    a, b, out = t.a, t.b, t.out
    plan = _plan_of(fl, t, block_matmul_key, matmul_key, MatmulPlan, BlockMatmulPlan)
    desc = Label(lambda: t.desc)        # the task's text, built only if an error shows it
    inst, run = fl.group_run(plan, flush_no, desc)
    b_items = b.view.trail_items()
    nl = plan.n_local
    ac, bc, oc = columns_of(a.view), columns_of(b.view), columns_of(out.view)
    for k in range(len(plan.msgs_out)):
        def pack(k=k) -> None:
            np.copyto(inst.send_parts[k][0][:nl], b.base.ensure()[(plan.local_b_rows,) + b_items])

        run.sends.append(fl.send_unit(plan, inst, k, None, None, desc, pack=pack))
        run.sends[-1].access = (access_of(b.base.serial, plan.b_send_hull[0], plan.b_send_hull[1], "R", bc),)
    product = _product(t, plan)
    for (rows_sel, rlo, rhi) in plan.row_sels:
        def local_fn(rows_sel=rows_sel) -> None:
            if plan.b_rep:
                bl = b.base.ensure()[b.view.numpy_index()]
            else:
                bl = b.base.ensure()[(plan.local_b_rows,) + b_items]
            product(rows_sel, plan.local_cols, nl, bl, False)

        u0 = Unit("compute", local_fn, desc, (access_of(a.base.serial, rlo, rhi, "R", ac),
                                              access_of(b.base.serial, plan.b_hull[0], plan.b_hull[1], "R", bc),
                                              access_of(out.base.serial, rlo, rhi, "W", oc)))
        run.computes.append(u0)
        for k in range(len(plan.msgs_in)):
            def acc_fn(rows_sel=rows_sel, k=k) -> None:
                nk = plan.recv_n[k]
                product(rows_sel, plan.recv_cols[k], nk, inst.recv_parts[k][0][:nk], True)

            u = Unit("compute", acc_fn, desc, (access_of(a.base.serial, rlo, rhi, "R", ac),
                                               access_of(out.base.serial, rlo, rhi, "A", oc)))
            u.ndeps = 1
            run.recvs[k].units.append(u)
            after(u, u0)
            run.computes.append(u)
    return run


def _product(t: Matmul, plan: MatmulPlan):
    """``product(rows_sel, cols, nj, bdata, accumulate)``: rows ``rows_sel`` of the result (=, or +=) the
    columns ``cols`` of ``a`` (``nj`` of them, :meth:`MatmulPlan.a_cols` of rows ``js`` of ``b``) times ``bdata``
    (the rows ``js`` of ``b``)."""
    a, out = t.a, t.out
    oview = out.view

    def product(rows_sel, cols: Any, nj: int, bdata: np.ndarray, accumulate: bool) -> None:
        al = a.base.ensure()
        yl = out.base.ensure()
        ysub = yl[oview.numpy_index(row_sel=rows_sel)]
        if nj == 0:
            if not accumulate:
                ysub[...] = 0
            return
        asub = al[rows_sel, cols] if not (isinstance(rows_sel, np.ndarray) and isinstance(cols, np.ndarray)) \
            else al[rows_sel][:, cols]
        prod = asub @ bdata
        if accumulate:
            ysub += prod
        else:
            ysub[...] = prod
    return product


class VecMatPlan(Plan):
    """``out = v @ b`` on this rank (``b``'s rows distributed): the view rows ``j`` of ``b``
    owned here, their local rows and where ``v[j]`` comes from. ``v`` is replicated (read here), or one fixed row
    of a distributed base: its owner sends each rank with rows of ``b`` the entries ``v[j]`` for them (one
    message; none to a rank without rows of ``b``) and receives their partial products back (``out`` on the owner
    alone, :attr:`to_owner`). With ``v`` replicated the partial products travel in one allgather (see
    :func:`lower_vecmat`)."""

    kind = "vecmat"

    def __init__(self, task, rank: int, nranks: int):
        super().__init__()
        v, b = task.v, task.b
        bs, bt, k = b.view.row_params
        per_rank = _b_rows_by_owner(b.base.dist, bs, bt, k, nranks)
        js, loc = per_rank[rank]
        runs = b.base.dist.kind == "block"      # one run of j (step 1) and of local rows (step bt) per rank
        #: The entries ``j`` of ``v`` this rank multiplies (a slice for a run), and its rows of ``b``.
        self.js = _rows_sel(js, 1, runs)
        self.local_b_rows = _rows_sel(loc, bt, runs)
        self.hull = _rows_hull(loc, runs) if len(loc) else (0, 0)
        self.nrows = len(js)
        #: ``v``'s owner (None: ``v`` replicated) and its local row there.
        self.v_owner: Optional[int] = None
        self.v_row = 0
        self.v_items = v.view.trail_items()
        self.send_js: List[Any] = []
        #: How many entries of ``v`` each outgoing message of them holds (its room may be larger:
        #: :class:`BlockVecMatPlan`).
        self.send_n: List[int] = []
        #: Whether the result lives on ``v``'s owner alone (its partial products are sent there, no allgather),
        #: whether this rank receives ``v``'s entries (message 0 in), and on the owner the ranks whose partial
        #: products come in (in message order).
        self.to_owner = not task.out.base.replicated
        self.v_in = False
        self.part_from: List[int] = []
        if v.base.replicated:
            return
        r = v.view.row_params[0]
        dist = v.base.dist
        self.v_owner = dist.owner_of(r)
        self.v_row = int(dist.local_index(np.array([r], dtype=np.int64))[0])
        send: Dict[int, List[PartSpec]] = {}
        recv: Dict[int, List[PartSpec]] = {}
        m, odt = task.out.shape[0], task.out.dtype
        if rank == self.v_owner:
            for q in range(nranks):
                if q != rank and len(per_rank[q][0]):
                    send[q] = [PartSpec(0, len(per_rank[q][0]), v.dtype, ())]
                    self.send_js.append(_rows_sel(per_rank[q][0], 1, runs))
                    self.send_n.append(len(per_rank[q][0]))
                    if self.to_owner:
                        recv[q] = [PartSpec(1, m, odt, ())]
                        self.part_from.append(q)
        elif self.nrows:
            recv[self.v_owner] = [PartSpec(0, self.nrows, v.dtype, ())]
            self.v_in = True
            if self.to_owner:
                send[self.v_owner] = [PartSpec(1, m, odt, ())]
        self.msgs_in = self._messages(recv)
        self.msgs_out = self._messages(send)


def block_vecmat_key(t: VecMat, nranks: int) -> Optional[Tuple[Tuple, List, Optional[int], int]]:
    """``(key, rows of b, v's owner, v's local row there)``: the key of the :class:`BlockVecMatPlan` serving
    ``t``, :func:`_block_rows` of ``b`` per rank, ``v``'s owner (None: replicated) and local row; None when ``b``
    is not in a block layout. What its messages depend on: ``v``'s owner, whether ``out`` lives there alone, the
    :func:`room` of each rank's rows of ``b`` and of ``out``, the dtypes. The same on every rank."""
    v, b, out = t.v, t.b, t.out
    if b.base.dist.kind != "block":
        return None
    bs, bt, k = b.view.row_params
    db = b.base.dist
    rb = [_block_rows(db, q, bs, bt, k) for q in range(nranks)]
    owner, vrow = _owner_row(v.base.dist, v.view.row_params[0], nranks) if not v.base.replicated else (None, 0)
    key = ("vm-block", owner, not out.base.replicated, tuple([room(r[1], v.dtype.itemsize) for r in rb]),
           room(out.shape[0], out.dtype.itemsize),
           v.dtype.str, out.dtype.str)
    return key, rb, owner, vrow


def _owner_row(dist, r: int, nranks: int) -> Tuple[int, int]:
    """``(owner, local row there)`` of base row ``r`` of ``dist`` (without an array for a block layout)."""
    if dist.kind == "block":
        for q in range(nranks):
            lo, hi = dist.block_range(q)
            if lo <= r < hi:
                return q, r - lo
    return dist.owner_of(r), dist.local_index_of(r)


class BlockVecMatPlan(Plan):
    """``out = v @ b`` with ``b`` in a block layout (:func:`block_vecmat_key`): the messages of
    :class:`VecMatPlan` with each message's room rounded up (:func:`room`: ``v``'s entries and the partial
    products, the whole room is sent), so that the steps of a loop over a moving window (LU's
    ``L[k, :k] @ U[:k, k:]``) share this plan and its instances; :meth:`bound_to` gives the rows of one use in
    closed form. Same fields as :class:`VecMatPlan` read by :func:`lower_vecmat`."""

    kind = "vecmat"

    def __init__(self, task, rank: int, rb: List, owner: Optional[int], vrow: int):
        """``rb``, ``owner``, ``vrow``: what :func:`block_vecmat_key` gave with the key."""
        super().__init__()
        self._bind(task, rank, rb, owner, vrow)
        send: Dict[int, List[PartSpec]] = {}
        recv: Dict[int, List[PartSpec]] = {}
        if self.v_owner is not None:
            vdt, odt = task.v.dtype, task.out.dtype
            mr = room(task.out.shape[0], odt.itemsize)
            if rank == self.v_owner:
                for q, cnt in enumerate(self._counts):
                    if q != rank and cnt:
                        send[q] = [PartSpec(0, room(cnt, vdt.itemsize), vdt, ())]
                        if self.to_owner:
                            recv[q] = [PartSpec(1, mr, odt, ())]
            elif self.nrows:
                recv[self.v_owner] = [PartSpec(0, room(self.nrows, vdt.itemsize), vdt, ())]
                if self.to_owner:
                    send[self.v_owner] = [PartSpec(1, mr, odt, ())]
        self.msgs_in = self._messages(recv)
        self.msgs_out = self._messages(send)

    def bound_to(self, task, rank: int, rb: List, owner: Optional[int], vrow: int) -> "BlockVecMatPlan":
        """A plan for ``task`` (same :func:`block_vecmat_key`, which gave ``rb``, ``owner``, ``vrow``) sharing this
        one's messages and instances. Local, cheap; called by :func:`lower_vecmat` only."""
        p = BlockVecMatPlan.__new__(BlockVecMatPlan)
        p.msgs_in, p.msgs_out, p.instances = self.msgs_in, self.msgs_out, self.instances
        p._bind(task, rank, rb, owner, vrow)
        return p

    def _bind(self, task, rank: int, rb: List, owner: Optional[int], vrow: int) -> None:
        """Set the rows of ``task`` on this rank (every field :func:`lower_vecmat` reads but the messages)."""
        v, b = task.v, task.b
        bt = b.view.row_params[1]
        self._counts: List[int] = []
        self.send_js: List[Any] = []
        self.send_n: List[int] = []
        self.part_from: List[int] = []
        self.v_items = v.view.trail_items()
        self.to_owner = not task.out.base.replicated
        self.v_owner, self.v_row = owner, vrow
        for q, (j0, cnt, first) in enumerate(rb):
            self._counts.append(cnt)
            if q == rank:
                self.js = _slice_of(j0, 1, cnt)
                self.local_b_rows, lo, hi = _run(first, bt, cnt)
                self.hull, self.nrows = (lo, hi), cnt
            elif cnt and rank == self.v_owner:
                self.send_js.append(_slice_of(j0, 1, cnt))
                self.send_n.append(cnt)
                if self.to_owner:
                    self.part_from.append(q)
        self.v_in = self.v_owner is not None and rank != self.v_owner and self.nrows > 0


def vecmat_key(t: VecMat) -> Tuple:
    """The plan cache key of ``t``: ``v``'s and ``b``'s layouts and views, ``v``'s dtype, ``out``'s layout (on
    every rank or on ``v``'s owner) and dtype."""
    v, b, out = t.v, t.b, t.out
    return ("vm", v.base.dist.key, v.view.key, v.dtype.str, b.base.dist.key, b.view.key, out.base.dist.key,
            out.dtype.str)


def _first_last(sel: Any, v: Any) -> Optional[Tuple[int, int]]:
    """The lowest and highest positions that ``sel`` (a slice or an index array) takes of the entries of vector
    ``v``; None if it takes none."""
    if isinstance(sel, slice):
        r = range(v.shape[0])[sel]
        return None if not r else ((r[0], r[-1]) if r[0] <= r[-1] else (r[-1], r[0]))
    return (int(sel.min()), int(sel.max())) if len(sel) else None


def lower_vecmat(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The units of ``g.task`` (a :class:`~..graph.VecMat`) in flush ``fl``: on ``v``'s owner the sends of its
    entries to the ranks with rows of ``b``; the product of this rank's rows of ``b`` with their entries of ``v``
    (one NumPy ``@``, after the message of ``v`` if it comes from another rank); then, ``out`` on ``v``'s owner,
    the sends of the partial products to it and its unit storing their sum in rank order
    (:func:`_lower_sum_on_owner`), or, ``out`` replicated, one allgather of the ranks' partial products (started in
    the same order on every rank, after the previous collective) and a finish unit storing their sum in rank
    order in ``out`` (the same bits on every rank)."""
    t: VecMat = g.task
    v, b, out = t.v, t.b, t.out
    plan = _plan_of(fl, t, block_vecmat_key, vecmat_key, VecMatPlan, BlockVecMatPlan)
    desc = Label(lambda: t.desc)        # the task's text, built only if an error shows it
    inst, run = fl.group_run(plan, flush_no, desc)
    m = out.shape[0]
    dt = out.dtype
    ex = inst.extra
    if "part" not in ex or ex["part"].size < m or ex["part"].dtype != dt:     # room for the partial products
        r = room(m, dt.itemsize)
        ex["part"] = np.zeros(r, dtype=dt)
        ex["all"] = np.zeros(fl.size * r, dtype=dt)
    part, allp = ex["part"][:m], ex["all"][:fl.size * m].reshape(fl.size, m)
    b_items = b.view.trail_items()
    vs = v.base.serial
    if fl.rank == plan.v_owner:     # each send reads only the columns of v it packs (LU: not the ones written now)
        for k in range(len(plan.msgs_out)):
            def pack(k=k) -> None:
                row = v.base.ensure()[(plan.v_row,) + plan.v_items]
                np.copyto(inst.send_parts[k][0][:plan.send_n[k]], row[plan.send_js[k]])

            run.sends.append(fl.send_unit(plan, inst, k, None, None, desc, pack=pack))
            run.sends[-1].access = (access_of(vs, plan.v_row, plan.v_row + 1, "R",
                                              columns_of(v.view, _first_last(plan.send_js[k], v))),)

    def local_fn() -> None:
        if plan.nrows == 0 or m == 0:
            part[...] = 0
            return
        if plan.v_in:
            vl = inst.recv_parts[0][0][:plan.nrows]
        elif plan.v_owner is None:
            vl = v.base.ensure()[v.view.numpy_index()][plan.js]
        else:
            vl = v.base.ensure()[(plan.v_row,) + plan.v_items][plan.js]
        bl = b.base.ensure()[(plan.local_b_rows,) + b_items]
        np.matmul(vl, bl, out=part)

    if plan.v_owner is None:
        v_read: Tuple = (access_of(vs, 0, FULL, "R", columns_of(v.view)),)
    elif fl.rank == plan.v_owner and plan.nrows:
        v_read = (access_of(vs, plan.v_row, plan.v_row + 1, "R", columns_of(v.view, _first_last(plan.js, v))),)
    else:
        v_read = ()
    u0 = Unit("compute", local_fn, desc,
              v_read + (access_of(b.base.serial, plan.hull[0], plan.hull[1], "R", columns_of(b.view)),))
    if plan.v_in:
        u0.ndeps = 1
        run.recvs[0].units.append(u0)
    run.computes.append(u0)
    if plan.to_owner:
        _lower_sum_on_owner(fl, t, plan, inst, run, u0, part, allp)
    else:
        _lower_partial_sum(fl, t, run, u0, part, allp, flush_no)
    return run


def _lower_sum_on_owner(fl: Lowering, t: VecMat, plan: VecMatPlan, inst: Instance, run: GroupRun, u0: Unit,
                        part: np.ndarray, allp: np.ndarray) -> None:
    """Add to ``run`` (the result on ``v``'s owner alone): on another rank with rows of ``b``, the send of its
    partial product to the owner (after ``u0``); on the owner, the unit storing the sum in rank order of every
    rank's partial product (its own, the received ones, zeros for ranks without rows of ``b``: the same bits as
    the allgather's sum) in ``t.out``, after ``u0`` and the messages."""
    out = t.out
    desc = run.label
    if fl.rank != plan.v_owner:
        if plan.msgs_out:
            m = len(part)
            s = fl.send_unit(plan, inst, 0, None, None, desc,
                             pack=lambda: np.copyto(inst.send_parts[0][0][:m], part))
            after(s, u0)
            run.sends.append(s)
        return
    me, m = fl.rank, len(part)
    dst = out.view.numpy_index(row_sel=int(out.base.dist.local_index(np.array([out.view.row_entry[1]]))[0]))

    def finish() -> None:
        allp[...] = 0
        allp[me] = part
        for k, q in enumerate(plan.part_from):
            allp[q] = inst.recv_parts[k][0][:m]
        out.base.ensure()[dst] = combine_partials("sum", allp, out.dtype)

    fin = Unit("compute", finish, desc, ((out.base.serial, 0, FULL, "W"),))
    after(fin, u0)
    for k in range(len(plan.part_from)):
        fin.ndeps += 1
        run.recvs[k].units.append(fin)
    run.computes.append(fin)


def _lower_partial_sum(fl: Lowering, t: VecMat, run: GroupRun, u0: Unit, part: np.ndarray, allp: np.ndarray,
                       flush_no: int) -> None:
    """Add to ``run`` the allgather of ``part`` (after ``u0``) into ``allp`` and the finish unit storing the sum
    of its rows (rank order) in ``t.out``."""
    ctx = fl.ctx
    out = t.out
    fin = Unit("compute", lambda: None, run.label, ((out.base.serial, 0, FULL, "W"),))

    def start_coll() -> None:
        req = ctx.dcomm.Iallgather([part.view(np.uint8), fl.MPI.BYTE], [allp.view(np.uint8), fl.MPI.BYTE])
        w = Waitable(req, "coll", -1, 0, part.nbytes, flush_no,
                     Label(lambda: f"allgather of the partial products of {t.desc}"))
        w.units.append(fin)
        fin.ndeps += 1
        fl.start(w)

    def finish() -> None:
        out.base.ensure()[out.view.numpy_index()] = combine_partials("sum", allp, out.dtype)

    fin.fn = finish
    coll = Unit("coll", start_coll, run.label)
    after(coll, u0)
    after(fin, coll)
    run.coll = coll
    run.finish = fin
    ctx.stats["collectives"] += 1


def transpose_key(t: Transpose) -> Tuple:
    """The plan cache key of ``t``: layouts, views and dtypes of ``src`` and ``out``."""
    src, out = t.src, t.out
    return ("tr", src.base.dist.key, src.view.key, src.dtype.str, out.base.dist.key, out.dtype.str)


def lower_transpose(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The units of ``g.task`` (a :class:`~..graph.Transpose`) in flush ``fl``."""
    t: Transpose = g.task
    ctx = fl.ctx
    src, out = t.src, t.out
    plan: TransposePlan = ctx.plan(transpose_key(t), lambda: TransposePlan(t, fl.rank, fl.size))
    inst, run = fl.group_run(plan, flush_no, t.desc)
    for k in range(len(plan.msgs_out)):
        run.sends.append(fl.send_unit(
            plan, inst, k, None, None, t.desc,
            pack=lambda k=k: plan.pack_transposed(inst, k, src.base.ensure())))
        run.sends[-1].access = ((src.base.serial, plan.send_hull[0], plan.send_hull[1], "R"),)

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


LOWERINGS = {"matmul": lower_matmul, "vecmat": lower_vecmat, "transpose": lower_transpose}
