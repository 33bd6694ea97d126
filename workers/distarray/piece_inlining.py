"""Piecewise inlining: a temporary written in pieces (``roll``) is read in place, never stored.

``numpy.roll`` of a distributed array is recorded as copies into a new temporary ``t``, one per
piece: ``t[k:] = a[:n-k]; t[:k] = a[n-k:]`` (along any axis; a roll of a roll gives four). The
vertical fusion of :mod:`.fusion` inlines only a temporary with one writer, so before it this
pass rewrites each elementwise task ``r: out = f(t, ...)`` that reads such a dying temporary
into one task per piece: ``out[P] = f(a[...], ...)[P]``, where piece ``P`` is where a writer's box
meets the box ``r`` reads. Each piece reads its source at a shifted view in place: along the
distributed axis the plan of :mod:`.operations.elementwise` fetches the rows owned by a neighbour
(the last rank's rows for the first rank's wrap-around), along other axes the kernel reads with an
offset. Pieces are rewritten again when they read another such temporary, so a stencil of rolls
(``sum(roll(roll(b, dy, 0), dx, 1))``, the game of life) becomes at most one task per region of
constant shifts (nine for shifts of -1, 0, 1 on both axes), each one fused loop nest.

Conditions (checked against the recorded order, so every rank rewrites alike): the temporary is
dead for the user, its writers are ``Assign`` tasks to disjoint boxes that together cover what is
read, written before the reader, whose sources nobody writes in between and which do not read the
temporary or the reader's target; the reader reads the temporary at one box view, unbroadcast;
a temporary whose writers compute more than a copy is inlined only into its only reader (no work
is repeated). The result equals the recorded program's element for element (only data moves).
Local, deterministic; called by :func:`.fusion.optimize`.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from .fp_errors import fusable, merged
from .graph import Assign, Const, Leaf, Op, Task, leaves
from .indexing import View

__all__ = ["split_pieces", "MAX_PIECES"]

#: Upper bound of the pieces one recorded task is split into.
MAX_PIECES = 32
#: Split along the axes after the first too (False: a temporary cut there is stored, as a local copy).
SPLIT_TRAILING_AXES = True
#: Upper bound of the nodes of a split task's expression (keeps generated kernels small).
MAX_NODES = 256

Box = Tuple[Tuple[int, int], ...]


def _dead(base) -> bool:
    return base.nviews == 0 and not base.exported


def _sliced(v: View, kb: Box) -> View:
    """``v[lo:hi, ...]`` for the non-empty ranges ``kb`` (one per user axis); ``View.index`` without its checks."""
    ents = []
    j = 0
    for e in v.entries:
        if e[0] == "i":
            ents.append(e)
            continue
        lo, hi = kb[j]
        j += 1
        ents.append(("s", e[1] + lo * e[2], e[2], hi - lo) if e[0] == "s" else e)
    return View(v.base_shape, tuple(ents))


def _key_box(shape: Tuple[int, ...], box: Box) -> Optional[Box]:
    """The part of ``box`` (over the broadcast shape) a node of ``shape`` covers; None if all of it."""
    off = len(box) - len(shape)
    kb = []
    whole = True
    for j, m in enumerate(shape):
        r = (0, 1) if m == 1 else box[off + j]
        whole = whole and r[0] == 0 and r[1] == m
        kb.append(r)
    return None if whole else tuple(kb)


def _restrict(node, box: Box, sub=None):
    """``node`` (of shape ``S``, broadcast to ``len(box)`` axes) restricted to ``box`` (``(lo, hi)`` per axis of
    the broadcast shape, none empty); ``sub(leaf)`` may return a replacement node (already restricted) for a
    leaf."""
    memo: Dict[int, object] = {}

    def go(n):
        got = memo.get(id(n))
        if got is not None:
            return got
        if isinstance(n, Const):
            return n
        if isinstance(n, Leaf):
            out = sub(n) if sub is not None else None
            if out is None:
                kb = _key_box(n.shape, box)
                out = n if kb is None else Leaf(n.base, _sliced(n.view, kb))
        else:
            kb = _key_box(n.shape, box)
            if kb is None and sub is None:
                out = n            # the whole node: unchanged (and its sub-nodes are not visited)
            else:
                kb = kb or tuple((0, m) for m in n.shape)
                out = Op(n.name, tuple(go(a) for a in n.args), n.dtype, n.in_dtypes, tuple(hi - lo for lo, hi in kb))
        memo[id(n)] = out
        return out

    return go(node)


def _nodes(node) -> int:
    """The number of nodes of ``node`` (shared sub-nodes counted at each use)."""
    count, stack = 0, [node]
    while stack:
        n = stack.pop()
        count += 1
        if isinstance(n, Op):
            stack.extend(n.args)
    return count


def _intersect(a: Box, b: Box) -> Optional[Box]:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return None if any(lo >= hi for lo, hi in out) else out


def _volume(box: Box) -> int:
    v = 1
    for lo, hi in box:
        v *= hi - lo
    return v


class _State:
    """The rewritten task list so far, with who writes each base where (positions in ``tasks``)."""

    def __init__(self, orig: List[Task]):
        self.tasks: List[Task] = []
        self.writers: Dict[int, List[int]] = defaultdict(list)
        self.readers_orig: Dict[int, set] = defaultdict(set)
        self.wcache: Dict[int, Tuple[int, object]] = {}
        for k, t in enumerate(orig):
            for l in t.reads():
                self.readers_orig[l.base.serial].add(k)

    def append(self, t: Task) -> None:
        for w in t.writes():
            self.writers[w.base.serial].append(len(self.tasks))
        self.tasks.append(t)

    def written_after(self, serial: int, pos: int) -> bool:
        return any(p > pos for p in self.writers.get(serial, ()))

    def writers_of(self, b) -> Optional[Tuple[List[Tuple[Box, Assign]], List[set], int]]:
        """([(box, writer)], [source serials per writer], the most nodes of a writer's expression) if every
        writer of ``b`` so far is an ``Assign`` of an expression to a box, the boxes disjoint, none reading
        ``b``, and (unless all are copies) there are several and one original reader; else None. Cached
        until ``b`` gets another writer."""
        pos = self.writers.get(b.serial, ())
        got = self.wcache.get(b.serial)
        if got is not None and got[0] == len(pos):
            return got[1]
        info = None
        ws = [self.tasks[p] for p in pos]
        copies = all(isinstance(w, Assign) and isinstance(w.expr, Leaf) for w in ws)
        if not copies and (len(ws) < 2 or len(self.readers_orig[b.serial]) != 1):
            ws = []   # a single computed writer, or several and more than one reader: nothing to split
        boxes = [w.out.view.box() if isinstance(w, Assign) else None for w in ws]
        if ws and all(bx is not None and w.expr.shape == w.out.shape and not isinstance(w.expr, Const)
                      for bx, w in zip(boxes, ws)):
            plain = all(isinstance(w.expr, Leaf) for w in ws)
            srcs = [{x.base.serial for x in leaves(w.expr)} for w in ws]
            if (plain or len(ws) >= 2 and len(self.readers_orig[b.serial]) == 1) and \
                    not any(b.serial in ss for ss in srcs) and \
                    not any(_intersect(boxes[i], boxes[j]) for i in range(len(boxes)) for j in range(i)):
                info = (list(zip(boxes, ws)), srcs, max(_nodes(w.expr) for w in ws))
        self.wcache[b.serial] = (len(pos), info)
        return info


def _eligible(st: _State, r: Assign, l: Leaf) -> Optional[Tuple[Box, List[Tuple[Box, Assign]]]]:
    """If ``r`` may read the temporary of ``l`` piecewise: (the box it reads, [(writer box, writer)])."""
    b = l.base
    info = st.writers_of(b)   # first: cached per base, and None for most temporaries (one computed writer)
    if info is None:
        return None
    if l.shape != r.expr.shape or any(x.base is b and x.view != l.view for x in r.reads()):
        return None
    rbox = l.view.box()
    if rbox is None or len(rbox) != len(l.shape):
        return None
    wboxes, srcs, _ = info
    if any(r.out.base.serial in ss for ss in srcs):
        return None
    pos = st.writers[b.serial]
    if any(st.written_after(s, p) for p, ss in zip(pos, srcs) for s in ss):
        return None
    pieces, covered = [], 0
    for wb, w in wboxes:
        got = _intersect(wb, rbox)
        if got is not None and not SPLIT_TRAILING_AXES and got[1:] != rbox[1:]:
            return None
        if got is not None:
            pieces.append((wb, w))
            covered += _volume(got)
    return (rbox, pieces) if pieces and covered == _volume(rbox) else None


def _candidates(st: _State, r: Assign) -> Dict[object, Tuple[Box, List[Tuple[Box, Assign]]]]:
    """The temporaries ``r`` may read piecewise: base -> (the box read, [(writer box, writer)])."""
    out: Dict[object, Tuple[Box, List[Tuple[Box, Assign]]]] = {}
    if r.expr.shape != r.out.shape or isinstance(r.expr, Const):
        return out
    tried = set()
    for l in r.reads():
        b = l.base
        if b.serial in tried or b is r.out.base or not b.temp or not _dead(b):
            continue
        tried.add(b.serial)
        if not st.writers.get(b.serial):
            continue   # not written since the last force point
        got = _eligible(st, r, l)
        if got is not None:
            out[b] = got
    return out


def _cells(shape: Tuple[int, ...], cands) -> List[Box]:
    """The common refinement (in ``r``'s coordinates) of the writer boxes of every candidate temporary."""
    cuts = [{0, n} for n in shape]
    for rbox, pieces in cands.values():
        for wb, _ in pieces:
            for k, ((lo, hi), (r0, _)) in enumerate(zip(wb, rbox)):
                for c in (lo - r0, hi - r0):
                    if 0 < c < shape[k]:
                        cuts[k].add(c)
    cells: List[Box] = [()]
    for k in range(len(shape)):
        edges = sorted(cuts[k])
        cells = [c + ((lo, hi),) for c in cells for lo, hi in zip(edges, edges[1:])]
    return cells


def _split(st: _State, r: Assign) -> List[Assign]:
    """``r`` as one task per cell of the pieces of the temporaries it reads, or ``[r]``."""
    cands = _candidates(st, r)
    if not cands:
        return [r]
    if not all(fusable(getattr(r, "fpe", None), getattr(w, "fpe", None)) for _, pieces in cands.values()
               for _, w in pieces):
        return [r]      # a piece recorded under another numpy.errstate: its flags must stay its own
    cells = _cells(r.out.shape, cands)
    if len(cells) > MAX_PIECES or _nodes(r.expr) + sum(st.writers_of(b)[2] for b in cands) > MAX_NODES:
        return [r]
    out: List[Assign] = []
    for cell in cells:
        vals = {}
        fpe = getattr(r, "fpe", None)
        for b, (rbox, pieces) in cands.items():
            at = tuple(lo + r0 for (lo, _), (r0, _) in zip(cell, rbox))
            wb, w = next((wb, w) for wb, w in pieces if all(x0 <= x < x1 for x, (x0, x1) in zip(at, wb)))
            fpe = merged(fpe, getattr(w, "fpe", None))
            val = _restrict(w.expr, tuple((lo + r0 - w0, hi + r0 - w0)
                                          for (lo, hi), (r0, _), (w0, _) in zip(cell, rbox, wb)))
            vals[b] = val if val.dtype == b.dtype else Op("cast", (val,), b.dtype, (val.dtype,), val.shape)
        expr = _restrict(r.expr, cell, lambda leaf, _v=vals: _v.get(leaf.base))
        target = Leaf(r.out.base, _sliced(r.out.view, cell))
        piece = Assign(target, expr, lambda _r=r, _p=cell: f"{_r.desc} (piece {_p})")
        piece.fpe = fpe
        out.append(piece)
    return out


def split_pieces(tasks: List[Task]) -> Tuple[List[Task], int]:
    """``tasks`` with every elementwise task reading a temporary written in pieces split per piece (see the
    module doc); and how many tasks were split. Local, deterministic."""
    if not _may_split(tasks):
        return list(tasks), 0
    st = _State(tasks)
    count = 0
    for t in tasks:
        parts = _split(st, t) if isinstance(t, Assign) else [t]
        if len(parts) > 1 or parts[0] is not t:
            count += 1
        for p in parts:
            st.append(p)
    return st.tasks, count


def _may_split(tasks: List[Task]) -> bool:
    """False if no task of ``tasks`` can be split, by a necessary condition cheaper than the pass: an
    ``Assign`` reads a dying temporary that earlier tasks wrote either by copies only or at least twice
    (:meth:`_State.writers_of` gives None for any other temporary, and nothing split means nothing
    changes: every writer list the pass looks at is that of the recorded tasks)."""
    seen: Dict[int, List] = {}   # serial of a dying temporary -> [writers so far, all of them copies]
    splittable = set()           # the serials of seen whose writers so far pass that test
    for t in tasks:
        if splittable and isinstance(t, Assign):
            for l in t.reads():
                if l.base.serial in splittable:
                    return True
        for w in t.writes():
            b = w.base
            if b.temp and _dead(b):
                got = seen.get(b.serial)
                copy = isinstance(t, Assign) and isinstance(t.expr, Leaf)
                if got is None:
                    got = seen[b.serial] = [1, copy]
                else:
                    got[0] += 1
                    got[1] = got[1] and copy
                if got[0] >= 2 or got[1]:
                    splittable.add(b.serial)
                else:
                    splittable.discard(b.serial)
    return False
