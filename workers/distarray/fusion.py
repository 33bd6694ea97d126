"""The fusion pass of a force point: what is computed by one kernel and what is never stored.

Input: the tasks recorded since the last force point, in program order. Output: a list of
groups, each executed as one unit of the flush. Every rewrite is local and checked against
the data hazards of the recorded order; ranks apply the same rewrites to the same tasks, so
they agree on the result without communicating.

1. **Hoisting**: a gather of a misaligned operand (:class:`~.graph.Replicate`) moves up
   past tasks that do not write its source, so elementwise tasks around it become adjacent.
1b. **Pieces** (:mod:`.piece_inlining`, after hoisting): a task reading a dying temporary written in pieces
   (``roll``) is split into one task per piece, each reading the pieces' sources in place.
2. **Inlining** (vertical fusion): ``t = a + b; c = t * 2`` where the user no longer holds
   ``t`` (``Base.nviews == 0``) and ``t`` has exactly one reading task: ``t``'s expression is
   substituted into the reader and ``t`` is never allocated. Chains of temporaries collapse
   into one expression. Writer and reader run over the same kind of rows, or ``t`` over replicated rows
   and the reader over distributed rows of no more elements (:func:`_inlinable_into`).
3. **Dead tasks**: a task whose results nobody can read any more is dropped.
4. **Swap**: ``x[v] = t[v]`` where the dying temporary ``t`` has ``x``'s shape, dtype and
   distribution (the copy-back of a Jacobi step, ``center[:] = work``) becomes a
   :class:`~.graph.Swap`: the few elements of ``x`` outside ``v`` are copied into ``t``'s buffer
   and the buffers are exchanged, instead of copying the whole view.
5. **Redistribution**: a remaining plain copy ``b[v] = a[w]`` between two distributed bases whose
   rows are laid out differently becomes a :class:`~.graph.Redistribute` (one aggregated
   transfer, :mod:`~.operations.redistribution`) instead of an elementwise task.
6. **Grouping** (horizontal fusion): adjacent elementwise tasks over the same rows and
   iteration shape (``Assign`` and ``Reduce``) run in one loop nest if no task reads or
   writes, at a different view, what an earlier one in the group writes. A value stored by
   one task and read by a later one at the same view is reused from a register.

An :class:`ElementwiseGroup` also builds its kernel program (the statements of a
:class:`~.fused_kernels.KernelSpec` without the per-block stride facts).
"""
from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

from .fp_errors import fusable, joined, merged
from .graph import (Assign, Const, Leaf, Op, Redistribute, Reduce, Replicate, RowSpace, Swap, Task, depth, leaves,
                    substitute)
from .operations.redistribution import copy_source
from .piece_inlining import split_pieces
from .units import Label

__all__ = ["ElementwiseGroup", "TaskGroup", "optimize", "MAX_GROUP_TASKS"]

#: Upper bound of tasks fused into one loop nest (keeps generated kernels small).
MAX_GROUP_TASKS = 12
#: Upper bound of statements in one kernel.
MAX_GROUP_STMTS = 400
#: Upper bound of the depth of an inlined expression: a longer chain of one-reader temporaries (``a = a + 1`` in
#: a loop of 500 steps) is cut into chains of at most this depth, each stored, so that the expression walks
#: (recursive: kernel generation, signatures, substitution) stay far below Python's recursion limit and a
#: loop's kernels repeat instead of growing with the number of steps.
MAX_INLINED_DEPTH = 64


def _dead(base) -> bool:
    """True if the user can no longer see ``base`` (no DistArray on it, no exported local view)."""
    return base.nviews == 0 and not base.exported


class TaskGroup:
    """A single non-elementwise task (matmul, transpose, replicate, swap, redistribute, indexed copy) run as
    one group; its ``kind`` is the task's."""

    def __init__(self, task: Task):
        self.task = task
        self.kind = task.kind
        self.tasks = [task]

    @property
    def desc(self) -> str:
        """The task's text (built on first use)."""
        return self.task.desc


class ElementwiseGroup:
    """Adjacent Assign/Reduce tasks over one row space, fused into one loop nest.

    After :meth:`build`: ``arrays`` lists the kernel's array arguments as ``(role, object)``
    with role ``'out'`` (an Assign target Leaf), ``'red'`` (a Reduce task's target) or
    ``'leaf'`` (an operand Leaf); ``consts`` the scalar arguments; ``stmts``/``reductions``
    the program; ``program_key`` identifies the program's shape (no values). ``label``: the first task's
    text, built only if shown (the units' label).
    """

    kind = "elementwise"

    def __init__(self, first: Task):
        self.tasks: List[Task] = [first]
        self.space: RowSpace = first.space
        self.label = Label(partial(getattr, first, "desc"))
        self.arrays: List[Tuple[str, Any]] = []
        self.consts: List[Const] = []
        self.stmts: List[Tuple] = []
        self.reductions: List[Tuple] = []
        self.program_key: Tuple = ()

    @property
    def desc(self) -> str:
        """The first task's text (built on first use)."""
        return self.tasks[0].desc

    # -- grouping rules ---------------------------------------------------------------
    @staticmethod
    def _loop_writes(t: Task) -> List[Tuple[Any, Any, bool]]:
        """(base, view, is_reduction) written inside the loop by ``t``."""
        if isinstance(t, Assign):
            return [(t.out.base, t.out.view, False)]
        return [(t.out.base, t.out.view, True)]

    def accepts(self, n: Task) -> bool:
        """True if ``n`` can join this group (same rows and shape, no hazard with the group)."""
        if not isinstance(n, (Assign, Reduce)) or n.space.key != self.space.key:
            return False
        if len(self.tasks) >= MAX_GROUP_TASKS:
            return False
        n_reads = n.reads()
        n_writes = self._loop_writes(n)
        for e in self.tasks:
            e_reads = e.reads()
            for (b, v, red) in self._loop_writes(e):
                for l in n_reads:
                    if l.base is b and (red or l.view != v):
                        return False
                for (b2, v2, red2) in n_writes:
                    if b2 is b and (red or red2 or v2 != v):
                        return False
            for (b, v, red) in n_writes:
                for l in e_reads:
                    if l.base is b and (red or l.view != v):
                        return False
        return True

    # -- the kernel program ---------------------------------------------------------------
    def build(self) -> None:
        """Build ``arrays``, ``consts``, ``stmts``, ``reductions`` and ``program_key``."""
        arrays: List[Tuple[str, Any]] = []
        consts: List[Const] = []
        stmts: List[Tuple] = []
        reductions: List[Tuple] = []
        known: Dict[Any, Tuple[int, str]] = {}     # leaf key -> its value: the last store, else its load
        adts: List[str] = []     # array_dtype of each array, as they are added
        counter = [0]
        dstr = _dtype_str

        def new_var() -> int:
            counter[0] += 1
            return counter[0]

        def emit(node, memo) -> Tuple[int, str]:
            got = memo.get(id(node))
            if got is not None:
                return got
            tn = type(node)
            if tn is Leaf:
                k = (node.base.serial, node.view.key)
                res = known.get(k)
                if res is None:
                    a = len(arrays)
                    arrays.append(("leaf", node))
                    dt = dstr(node.dtype)
                    adts.append(dt)
                    v = new_var()
                    stmts.append(("ld", v, a))
                    res = known[k] = (v, dt)
            elif tn is Const:
                s = len(consts)
                consts.append(node)
                v = new_var()
                stmts.append(("sc", v, s))
                res = (v, dstr(node.dtype))
            else:
                args = [emit(a, memo) for a in node.args]
                counter[0] += 1
                v = counter[0]
                dt = dstr(node.dtype)
                stmts.append(("op", v, node.name, tuple([x[0] for x in args]), tuple([x[1] for x in args]),
                              tuple([dstr(d) for d in node.in_dtypes]), dt))
                res = (v, dt)
            memo[id(node)] = res
            return res

        try:
            for t in self.tasks:
                memo: Dict[int, Tuple[int, str]] = {}
                v, dt = emit(t.expr, memo)
                if isinstance(t, Assign):
                    a = len(arrays)
                    arrays.append(("out", t.out))
                    stmts.append(("st", a, v, dt))
                    odt = dstr(t.out.dtype)
                    adts.append(odt)
                    if dt != odt:
                        v2 = new_var()
                        stmts.append(("op", v2, "cast", (v,), (dt,), (dt,), odt))
                        known[t.out.key] = (v2, odt)
                    else:
                        known[t.out.key] = (v, dt)
                else:
                    a = len(arrays)
                    arrays.append(("red", t))
                    acc = dstr(t.acc_dtype)
                    adts.append(acc if t.axis is None or t.axis == 0 else dstr(t.out.dtype))
                    r = len(reductions)
                    reductions.append((t.op, t.axis, _kernel_acc(t.op, t.axis, acc), a))
                    stmts.append(("rd", r, v, dt))
        finally:   # emit refers to itself through its closure: break that cycle, or the leaves it saw
            emit = None  # (and their buffers) would live until the garbage collector runs
        self.arrays, self.consts, self.stmts, self.reductions = arrays, consts, stmts, reductions
        self.program_key = (len(self.space.shape), tuple(adts),
                            tuple([r[0] for r in arrays]), tuple(stmts), tuple(reductions))

    def array_dtype(self, a: int) -> str:
        """dtype (``.str``) of kernel array ``a``."""
        role, obj = self.arrays[a]
        if role == "red":
            if obj.axis is None or obj.axis == 0:
                return obj.acc_dtype.str
            return obj.out.dtype.str
        return obj.dtype.str

    def stmt_count(self) -> int:
        return sum(_count_nodes(t.expr) for t in self.tasks)


#: ``dtype.str`` by dtype (building the text costs several times a dict lookup; a program has a few dtypes).
_DTYPE_STR: Dict[Any, str] = {}


def _dtype_str(d) -> str:
    """``d.str``, memoised."""
    s = _DTYPE_STR.get(d)
    if s is None:
        s = _DTYPE_STR[d] = d.str
    return s


def _count_nodes(node) -> int:
    n, stack, seen = 0, [node], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        n += 1
        if isinstance(x, Op):
            stack.extend(x.args)
    return n


# --------------------------------------------------------------------------- the pass
def _hoist_replicates(tasks: List[Task]) -> List[Task]:
    """``tasks`` with each :class:`~.graph.Replicate` moved up to just after the last earlier task writing its
    source (to the front if none does), so its messages start early. Linear in the number of tasks: each
    Replicate joins the slot of that writer (later ones before earlier ones, as successive insertions there)."""
    slots: List[List[Task]] = [[]]          # slot 0: the front; slot i: the i-th other task, then its Replicates
    last: Dict[int, int] = {}               # base serial -> slot of its last writer so far
    for t in tasks:
        if isinstance(t, Replicate):
            slots[last.get(t.src.base.serial, 0)].append(t)
        else:
            slots.append([t])
            for w in t.writes():
                last[w.base.serial] = len(slots) - 1
    out: List[Task] = list(reversed(slots[0]))
    for slot in slots[1:]:
        out.append(slot[0])
        out.extend(reversed(slot[1:]))
    return out


def _kernel_acc(op: str, axis: Optional[int], acc: str) -> str:
    """The dtype (``.str``) a kernel accumulates reduction ``op`` in: ``acc``, but float64 for a float32 ``sum`` or
    ``mean`` of a whole block (NumPy adds a float32 array pairwise; a running float32 sum over a rank's block would
    lose about an ulp per element, so the kernel adds in float64 and stores the float32 sum)."""
    return "<f8" if axis is None and op in ("sum", "mean") and acc == "<f4" else acc


def optimize(tasks: List[Task]) -> Tuple[List[Any], Dict[str, int]]:
    """Rewrite the recorded ``tasks`` (see the module doc) into groups. Local, deterministic."""
    recorded = len(tasks)
    if any(isinstance(t, Replicate) for t in tasks):
        tasks = _hoist_replicates(list(tasks))
    tasks, split = split_pieces(tasks)
    n = len(tasks)
    alive = [True] * n
    stats = dict(recorded=recorded, split=split, inlined=0, dropped=0, swapped=0, redistributed=0)
    readers: Dict[int, set] = defaultdict(set)
    writers: Dict[int, set] = defaultdict(set)
    dying = False     # some task writes a base the user cannot see: else inlining and dropping change nothing
    for k, t in enumerate(tasks):
        for l in t.reads():
            readers[l.base.serial].add(k)
        for w in t.writes():
            writers[w.base.serial].add(k)
            if not dying and _dead(w.base):
                dying = True
    if dying:
        stats["inlined"] = _inline(tasks, alive, readers, writers)
        stats["dropped"] = _drop_dead(tasks, alive)
    stats["swapped"] = _swap_copy_backs(tasks, alive, readers, writers)   # its temporary may come from a past flush
    stats["redistributed"] = _redistribute_copies(tasks, alive)
    groups = _group(tasks, alive)
    stats["groups"] = len(groups)
    return groups, stats


def _inline(tasks: List[Task], alive: List[bool], readers: Dict[int, set], writers: Dict[int, set]) -> int:
    """2. Inline each dying temporary with one reader into it (``readers`` follow); the number inlined."""
    count = 0
    order: Dict[int, List[int]] = {}   # base serial -> its writers' positions, sorted (made when first asked)
    for idx, t in enumerate(tasks):
        if not alive[idx] or not isinstance(t, Assign):
            continue
        out = t.out
        b = out.base
        if not _dead(b):
            continue
        ws = writers[b.serial]
        expr = t.expr
        if len(ws) != 1 or idx not in ws or expr.shape != out.view.shape:
            continue
        r = _only_later_reader(readers[b.serial], alive, idx)
        if r < 0:
            continue
        rt = tasks[r]
        if not isinstance(rt, (Assign, Reduce)) or not _inlinable_into(t.space, rt.space):
            continue
        if not fusable(getattr(t, "fpe", None), getattr(rt, "fpe", None)):
            continue     # recorded under different numpy.errstate: a flag must stay with its own operation
        ov = out.view
        if _reads_other_view(rt.reads(), b, ov):
            continue
        src = leaves(expr)
        src_serials = {l.base.serial for l in src}
        if any(_written_between(order, s, writers, alive, idx, r) for s in src_serials):
            continue
        if any(_reads_other_view(src, w.base, w.view) for w in rt.writes()):
            continue
        if depth(rt.expr) + depth(expr) >= MAX_INLINED_DEPTH:
            continue     # a long chain (``a = a + 1`` in a loop): this temporary is stored and the next chain starts
        repl = expr
        if repl.dtype != b.dtype:
            repl = Op("cast", (repl,), b.dtype, (repl.dtype,), repl.shape)
        rt.expr = substitute(rt.expr, lambda l, _b=b, _r=repl: _r if l.base is _b else None)
        rt.fpe = merged(getattr(rt, "fpe", None), getattr(t, "fpe", None))   # the inlined part's error handling
        alive[idx] = False
        count += 1
        for s in src_serials:
            readers[s].discard(idx)
            readers[s].add(r)
        readers[b.serial].discard(r)
    return count


def _reads_other_view(ls, b, view) -> bool:
    """True if a leaf of ``ls`` shows base ``b`` through another view than ``view``."""
    for l in ls:
        if l.base is b and l.view != view:
            return True
    return False


def _inlinable_into(src, dst) -> bool:
    """True if an expression computed over row space ``src`` may be substituted into a task over ``dst``: the
    same kind of rows, or replicated rows (every operand replicated, so readable on any rank) into distributed
    rows of at most as many elements (a back substitution's ``x[k] = (b - d) / m``: one group instead of two,
    and the expression is not recomputed for more elements than it had)."""
    if src.rep == dst.rep:
        return True
    return src.rep and _elements(dst.shape) <= _elements(src.shape)


def _elements(shape) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def _only_later_reader(readers: set, alive: List[bool], idx: int) -> int:
    """The position of the one alive task after ``idx`` among ``readers``, or -1 if there is none, or more than
    one, or an alive reader before ``idx``."""
    r = -1
    for k in readers:
        if k == idx or not alive[k]:
            continue
        if k < idx or r >= 0:
            return -1
        r = k
    return r


def _written_between(order: Dict[int, List[int]], serial: int, writers: Dict[int, set], alive: List[bool],
                     lo: int, hi: int) -> bool:
    """True if an alive task at a position strictly between ``lo`` and ``hi`` writes base ``serial``
    (``order`` caches each base's sorted writer positions: ``writers`` does not change while inlining)."""
    pos = order.get(serial)
    if pos is None:
        pos = order[serial] = sorted(writers[serial])
    i = bisect_right(pos, lo)
    while i < len(pos) and pos[i] < hi:
        if alive[pos[i]]:
            return True
        i += 1
    return False


def _drop_dead(tasks: List[Task], alive: List[bool]) -> int:
    """3. Drop the tasks whose results nobody alive reads later (a reverse pass); the number dropped."""
    count = 0
    live_readers: Dict[int, int] = defaultdict(int)
    for idx in range(len(tasks) - 1, -1, -1):
        if not alive[idx]:
            continue
        t = tasks[idx]
        ws = t.writes()
        if ws and all(_dead(w.base) and live_readers[w.base.serial] == 0 for w in ws):
            alive[idx] = False
            count += 1
            continue
        for l in t.reads():
            live_readers[l.base.serial] += 1
    return count


def _swap_copy_backs(tasks: List[Task], alive: List[bool], readers: Dict[int, set], writers: Dict[int, set]) -> int:
    """4. A copy-back out of a dying temporary laid out like the target becomes a Swap; the number rewritten."""
    count = 0
    for idx, t in enumerate(tasks):
        if not alive[idx] or not isinstance(t, Assign) or not isinstance(t.expr, Leaf):
            continue
        s, x = t.expr.base, t.out.base
        if s is x or not _dead(s) or x.exported or s.exported:
            continue
        if s.shape != x.shape or s.dtype != x.dtype or s.dist != x.dist or s.context is not x.context:
            continue
        if t.expr.view != t.out.view:
            continue
        box = t.out.view.box()
        if box is None:
            continue
        later = [k for k in (readers[s.serial] | writers[s.serial]) if alive[k] and k > idx]
        if later:
            continue
        tasks[idx] = Swap(t.out, t.expr, box, t)
        count += 1
    return count


def _redistribute_copies(tasks: List[Task], alive: List[bool]) -> int:
    """5. A copy between different row layouts becomes one aggregated transfer; the number rewritten."""
    count = 0
    for idx, t in enumerate(tasks):
        if alive[idx] and isinstance(t, Assign):
            src = copy_source(t)
            if src is not None:
                tasks[idx] = Redistribute(t.out, src, t)
                count += 1
    return count


def _group(tasks: List[Task], alive: List[bool]) -> List[Any]:
    """6. Group adjacent elementwise tasks (and build each group's program); every other task alone."""
    groups: List[Any] = []
    cur: Optional[ElementwiseGroup] = None
    cur_nodes = -1   # cur.stmt_count(), kept as the group grows (-1: not counted yet)
    cur_fpe = None   # the error state of cur's tasks (other than library steps'): only tasks fusable with it join
    for idx, t in enumerate(tasks):
        if not alive[idx]:
            continue
        if isinstance(t, (Assign, Reduce)):
            fpe = getattr(t, "fpe", None)
            if cur is not None and fusable(cur_fpe, fpe) and cur.accepts(t):
                cur_fpe = joined(cur_fpe, fpe)
                if cur_nodes < 0:
                    cur_nodes = cur.stmt_count()
                nodes = _count_nodes(t.expr)
                if cur_nodes + nodes < MAX_GROUP_STMTS:
                    cur.tasks.append(t)
                    cur_nodes += nodes
                    continue
            cur = ElementwiseGroup(t)
            cur_nodes = -1
            cur_fpe = fpe
            groups.append(cur)
        else:
            cur = None
            groups.append(TaskGroup(t))
    for g in groups:
        if isinstance(g, ElementwiseGroup):
            g.build()
    return groups
