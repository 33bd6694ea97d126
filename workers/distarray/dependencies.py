"""The order between the units of a flush's groups: which earlier unit each unit must wait for.

Two units of different groups conflict when they access the same base on overlapping local rows and
overlapping columns (an access of some columns names its base columns, see :data:`~.units.Access`; the
others cover every column) and not both read (``'R'``) nor both accumulate (``'A'``). Every conflicting
pair must run in group order; :func:`order_units` makes each unit wait (:func:`~.units.after`) for the
earlier units it conflicts with, except those it already waits for through another unit.

The :class:`AccessIndex` keeps, per base serial, the rows cut into segments; a segment holds its current
epoch: the units of the last group that wrote it (``W``, each with its columns) and the readers (``R``)
and accumulators (``A``, with their columns) since, and the epoch it superseded. A write (of any columns)
waits for every unit of the current epoch of its rows and opens a new one: whatever conflicts with an
earlier unit on those rows is then ordered after it through the writer. A read of every column waits for
the current epoch's writers and accumulators; a read of some columns waits for the current epoch's
accumulators of overlapping columns and walks back through the older epochs to the first one with a writer
of overlapping columns (the older ones are behind that writer), so the writes of other columns of its rows
in this flush do not hold it (LU's send of ``L[k, :n/2]`` does not wait for the write of column ``k - 1`` of
rows ``k:``). An accumulation waits for the current epoch's writers and readers. So a unit only looks at
the units still visible on its own rows, and the work is near-linear in the accesses of a flush instead of
quadratic (a read of some columns also walks the epochs of other columns written since its own).

Compared with pairing every earlier conflicting unit (DistNumPy's per-base access lists): every conflicting
pair is ordered, directly or through a chain of edges; an edge to a reader joins a conflicting pair, an edge
to a writer (an accumulator) may join units of different columns of the same rows (the cost of keeping one
epoch per segment: a write that waited only for its own columns could not supersede the others, and LU's
reads of ``L[k+1:, :k]`` would then wait for each column written in the flush: quadratic). A small flush
is ordered pair by pair, exactly (:func:`_order_pairs`). Local, no communication; called while the
scheduler builds a flush's units.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Dict, List, Optional, Sequence, Tuple

from .units import FULL, Access, GroupRun, Unit, after

__all__ = ["AccessIndex", "order_units", "PAIRWISE_ACCESSES"]


#: The columns of an access of every column.
_ALL = (0, FULL)


def _columns(acc: Access) -> Tuple[Tuple[int, int], int, int]:
    """``(cols, c0, c1)`` of an access: :data:`_ALL`, 0, FULL for an access of every column (a 4-tuple), else its
    ``(c0, c1)`` and both bounds."""
    if len(acc) == 4:
        return _ALL, 0, FULL
    return (acc[4], acc[5]), acc[4], acc[5]


class _Rows:
    """The segments of one base's local rows: ``bounds[i] <= row < bounds[i + 1]`` has ``states[i]``, its
    current epoch (None: untouched in this flush).

    An epoch is a list ``[group, W, R, A, older, wa0, wa1, Wc, Ac]``: the writers of the group that opened it
    (none for a segment only read or accumulated so far), then the readers and the accumulators since (units);
    ``older``: the epoch it superseded (never changed again, shared by the segments split from it); ``[wa0, wa1)``
    the hull of the columns of every writer and accumulator of this epoch and the older ones (empty:
    ``(FULL, 0)``); ``Wc``, ``Ac``: the columns ``(c0, c1)`` of each unit of ``W``, ``A``, or None while they are
    all :data:`_ALL` (a reader's columns are not kept: only a reader waits for columns)."""

    __slots__ = ("bounds", "states")

    def __init__(self) -> None:
        self.bounds: List[int] = []
        self.states: List[Optional[list]] = []

    def split(self, x: int) -> int:
        """Make ``x`` a segment bound; its index."""
        b = self.bounds
        i = bisect_left(b, x)
        if i < len(b) and b[i] == x:
            return i
        if not b:
            b.append(x)
        elif i == 0:
            b.insert(0, x)
            self.states.insert(0, None)
        elif i == len(b):
            b.append(x)
            self.states.append(None)
        else:
            b.insert(i, x)
            s = self.states[i - 1]
            self.states.insert(i, None if s is None else
                               [s[0], list(s[1]), list(s[2]), list(s[3]), s[4], s[5], s[6],
                                s[7] and list(s[7]), s[8] and list(s[8])])
        return i

    def cut(self, lo: int, hi: int) -> range:
        """The indices of the segments of ``[lo, hi)`` (bounds made at ``lo`` and ``hi``)."""
        i = self.split(lo)
        return range(i, self.split(hi))


def _overlapping(units: List[Unit], cols: Optional[List[Tuple[int, int]]], c0: int, c1: int) -> List[Unit]:
    """The units of ``units`` whose columns (``cols``, None: every column) overlap ``[c0, c1)``."""
    if cols is None:
        return units
    return [u for u, c in zip(units, cols) if c[0] < c1 and c0 < c[1]]


class AccessIndex:
    """The units of a flush's groups so far, indexed by base serial and local rows, with the columns of writers and
    accumulators (see the module doc).

    Used by the scheduler while it builds a flush: :meth:`prerequisites` of each unit of a group, then
    :meth:`add_group` with the group's units. Not thread-safe; nothing here blocks."""

    __slots__ = ("_bases", "_group")

    def __init__(self) -> None:
        self._bases: Dict[int, _Rows] = {}
        self._group = 0

    def prerequisites(self, access: Sequence[Access]) -> List[Unit]:
        """The units of the groups added so far that a unit with ``access`` must wait for (each once, in a
        deterministic order), on overlapping rows of the same base: for a write, every unit of the current
        epochs of its rows; for an accumulation, their writers and readers; for a read, the writers and
        accumulators of overlapping columns, from the current epoch back to the first epoch with a writer of
        those columns."""
        out: List[Unit] = []
        seen: Optional[set] = None   # the units of ``out``, once it is long (a read over many rows written apart)
        bases = self._bases
        for acc in access:
            rows = bases.get(acc[0])
            if rows is None or acc[2] <= acc[1]:
                continue
            lo, hi, mode = acc[1], acc[2], acc[3]
            b = rows.bounds
            i = bisect_right(b, lo) - 1
            if i < 0:
                i = 0
            hits: List[Unit] = []
            if mode != "R":                 # an accumulation does not wait for accumulations
                for s in rows.states[i:bisect_left(b, hi, i)]:
                    if s is not None:
                        hits.extend(s[1])
                        hits.extend(s[2])
                        if mode == "W":
                            hits.extend(s[3])
            elif len(acc) == 4:      # every column: the current epoch (its writers, or the segment's first)
                for s in rows.states[i:bisect_left(b, hi, i)]:
                    if s is not None:
                        hits.extend(s[3])
                        hits.extend(s[1])
            else:
                c0, c1 = acc[4], acc[5]
                for s in rows.states[i:bisect_left(b, hi, i)]:
                    while s is not None and s[5] < c1 and c0 < s[6]:
                        if s[3]:
                            hits.extend(_overlapping(s[3], s[8], c0, c1))
                        w = s[1]
                        if w:
                            wc = s[7]
                            if wc is None:
                                hits.extend(w)
                                break
                            if len(w) == 1:
                                if wc[0][0] < c1 and c0 < wc[0][1]:
                                    hits.append(w[0])
                                    break
                            else:
                                got = _overlapping(w, wc, c0, c1)
                                if got:
                                    hits.extend(got)
                                    break
                        s = s[4]
            for p in hits:
                if seen is None:
                    if p not in out:   # short lists: a scan costs less than a set (measured)
                        out.append(p)
                        if len(out) > _SCAN_MAX:
                            seen = set(out)
                elif p not in seen:
                    seen.add(p)
                    out.append(p)
        return out

    def add_group(self, units: Sequence[Unit]) -> None:
        """Record the accesses of one group's ``units`` (after their :meth:`prerequisites` were taken): the
        rows its units write get a new epoch (shared by the group's writers), then its reads and accumulations
        join their rows' current epochs."""
        self._group += 1
        g = self._group
        bases = self._bases
        later = []
        for u in units:
            for acc in u.access:
                if acc[2] <= acc[1]:
                    continue
                if acc[3] != "W":
                    later.append((u, acc))
                    continue
                rows = bases.get(acc[0])
                if rows is None:
                    rows = bases[acc[0]] = _Rows()
                st = rows.states
                cols, c0, c1 = _columns(acc)
                for i in rows.cut(acc[1], acc[2]):
                    s = st[i]
                    if s is None:
                        st[i] = [g, [u], [], [], None, c0, c1, None if cols is _ALL else [cols], None]
                    elif s[0] == g:
                        s[1].append(u)
                        if s[7] is not None:
                            s[7].append(cols)
                        elif cols is not _ALL:
                            s[7] = [_ALL] * (len(s[1]) - 1) + [cols]
                        s[5], s[6] = min(s[5], c0), max(s[6], c1)
                    else:
                        st[i] = [g, [u], [], [], s, min(s[5], c0), max(s[6], c1), None if cols is _ALL else [cols],
                                 None]
        for u, acc in later:
            rows = bases.get(acc[0])
            if rows is None:
                rows = bases[acc[0]] = _Rows()
            st = rows.states
            if acc[3] == "R":
                for i in rows.cut(acc[1], acc[2]):
                    s = st[i]
                    if s is None:
                        s = st[i] = [0, [], [], [], None, FULL, 0, None, None]
                    lst = s[2]
                    if not lst or lst[-1] is not u:
                        lst.append(u)
                continue
            cols, c0, c1 = _columns(acc)
            for i in rows.cut(acc[1], acc[2]):
                s = st[i]
                if s is None:
                    s = st[i] = [0, [], [], [], None, FULL, 0, None, None]
                lst = s[3]
                cl = s[8]
                if not lst or lst[-1] is not u or (cl is not None and cl[-1] != cols):
                    lst.append(u)
                    if cl is not None:
                        cl.append(cols)
                    elif cols is not _ALL:
                        s[8] = [_ALL] * (len(lst) - 1) + [cols]
                    if c0 < s[5]:
                        s[5] = c0
                    if c1 > s[6]:
                        s[6] = c1


#: Past this many prerequisites :meth:`AccessIndex.prerequisites` looks them up in a set instead of scanning the
#: list (a back substitution's read of ``x[k+1:]`` meets the writer of every ``x[j]`` recorded since the last
#: force point: quadratic with the scan).
_SCAN_MAX = 16

#: The lists of a segment's state an access of each mode waits for (1: writers, 2: readers, 3: accumulators).
_CONFLICTS = {"R": (1, 3), "W": (1, 2, 3), "A": (1, 2)}


#: A flush whose units declare at most this many accesses in all is ordered pair by pair (:func:`_order_pairs`):
#: for the few groups of a small flush (a pivot step) that costs less than building the index.
PAIRWISE_ACCESSES = 48


def order_units(runs: Sequence[GroupRun], pairwise_accesses: int = PAIRWISE_ACCESSES) -> None:
    """Make each unit of ``runs`` (one flush's groups, in program order) wait for the units of earlier
    groups it conflicts with (see the module doc), and each group's collective for the previous one's
    (every rank starts them in the same order). Called by the scheduler, with latency hiding, before
    any unit runs. A flush with at most ``pairwise_accesses`` accesses in all is ordered pair by pair
    (every conflicting pair gets its own edge, no other pair: more edges, no index)."""
    total = 0
    for run in runs:
        for u in run.sends:
            total += len(u.access)
        for u in run.computes:
            total += len(u.access)
        if run.finish is not None:
            total += len(run.finish.access)
        if total > pairwise_accesses:
            break
    else:
        _order_pairs(runs)
        return
    index = AccessIndex()
    prev_coll: Optional[Unit] = None
    last = len(runs) - 1
    for k, run in enumerate(runs):
        units = run.sends + run.computes + ([run.finish] if run.finish is not None else [])
        if k > 0:
            for u in units:
                if u.access:
                    pre = index.prerequisites(u.access)
                    if pre:   # after(u, p) for each p, inlined (LU: ~100k edges a run)
                        u.ndeps += len(pre)
                        for p in pre:
                            p.dependents.append(u)
        if k < last:   # no later group asks about the last one's accesses
            index.add_group(units)
        if run.coll is not None:
            if prev_coll is not None:
                after(run.coll, prev_coll)
            prev_coll = run.coll


def _order_pairs(runs: Sequence[GroupRun]) -> None:
    """:func:`order_units` for a small flush: each unit waits for every unit of an earlier group with a
    conflicting access (same base, overlapping rows and columns, not both reading, not both accumulating), found by
    scanning the earlier accesses of the same base; collectives chained in group order."""
    seen: Dict[int, List[tuple]] = {}    # base serial -> (lo, hi, mode, unit, c0, c1) of the earlier groups' accesses
    prev_coll: Optional[Unit] = None
    last = len(runs) - 1
    for k, run in enumerate(runs):
        units = run.sends + run.computes
        if run.finish is not None:
            units.append(run.finish)
        if seen:
            for u in units:
                pre: List[Unit] = []
                for acc in u.access:
                    serial, lo, hi, mode = acc[0], acc[1], acc[2], acc[3]
                    earlier = seen.get(serial)
                    if earlier is None or hi <= lo:
                        continue
                    c0, c1 = (0, FULL) if len(acc) == 4 else (acc[4], acc[5])
                    for (lo2, hi2, mode2, p, d0, d1) in earlier:
                        if lo < hi2 and lo2 < hi and (mode != mode2 or mode == "W") and d0 < c1 and c0 < d1 \
                                and p not in pre:
                            pre.append(p)
                if pre:
                    u.ndeps += len(pre)
                    for p in pre:
                        p.dependents.append(u)
        if k < last:
            for u in units:
                for acc in u.access:
                    serial, lo, hi = acc[0], acc[1], acc[2]
                    if lo < hi:
                        e = (lo, hi, acc[3], u, 0, FULL) if len(acc) == 4 else (lo, hi, acc[3], u, acc[4], acc[5])
                        got = seen.get(serial)
                        if got is None:
                            seen[serial] = [e]
                        else:
                            got.append(e)
        if run.coll is not None:
            if prev_coll is not None:
                after(run.coll, prev_coll)
            prev_coll = run.coll
