"""The order between the units of a flush's groups: which earlier unit each unit must wait for.

Two units of different groups conflict when they access the same base on overlapping local rows and
overlapping columns (an access of some columns names them, see :data:`~.units.Access`; others cover
every column) and not both read (``'R'``) nor both accumulate (``'A'``). Every conflicting pair must
run in group order; :func:`order_units` makes each unit wait (:func:`~.units.after`) for the earlier
units it conflicts with, except those it already waits for through another unit.

The :class:`AccessIndex` keeps, per base serial, the rows cut into segments; a segment holds the units
of the last group that wrote every column of it (``W``), the readers (``R``) and accumulators (``A``)
of every column since, and the accesses of some columns since with their columns (``P``). A later
write of every column of a segment replaces its state: whatever conflicts with an earlier unit on those
rows also conflicts with the writer, which waits for that unit. A later write of some columns drops,
by the same argument, only the accesses of ``P`` within its columns (of earlier groups); the rest stays.
So a unit only looks at the units still visible on its own rows, and the work is near-linear in the
accesses of a flush instead of quadratic (writes of disjoint columns of the same rows, such as LU's
column of ``L`` per step, stay visible side by side until a write of every column: a reader of all of
them meets each, as a reader of many rows written apart meets each writer).

Compared with pairing every earlier conflicting unit (DistNumPy's per-base access lists): every edge
made here joins a conflicting pair, and every conflicting pair is ordered, directly or through a
chain of edges. Local, no communication; called while the scheduler builds a flush's units.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Dict, List, Optional, Sequence

from .units import FULL, Access, GroupRun, Unit, after

__all__ = ["AccessIndex", "order_units", "PAIRWISE_ACCESSES"]


class _Rows:
    """The segments of one base's local rows: ``bounds[i] <= row < bounds[i + 1]`` has ``states[i]``, a list
    ``[writing group, W units, R units, A units, P]`` (None: untouched in this flush): the units of the last
    group that wrote every column of the segment, the units reading or accumulating every column since, and
    ``P``, None or the list of the accesses of some columns since, each ``(c0, c1, k, unit, group)`` with ``k``
    the list it would be in (1: W, 2: R, 3: A)."""

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
                               [s[0], list(s[1]), list(s[2]), list(s[3]), None if s[4] is None else list(s[4])])
        return i

    def cut(self, lo: int, hi: int) -> range:
        """The indices of the segments of ``[lo, hi)`` (bounds made at ``lo`` and ``hi``)."""
        i = self.split(lo)
        return range(i, self.split(hi))


class AccessIndex:
    """The units of a flush's groups so far, indexed by base serial and local rows, with the columns of the
    accesses of some columns (see the module doc).

    Used by the scheduler while it builds a flush: :meth:`prerequisites` of each unit of a group, then
    :meth:`add_group` with the group's units. Not thread-safe; nothing here blocks."""

    __slots__ = ("_bases", "_group")

    def __init__(self) -> None:
        self._bases: Dict[int, _Rows] = {}
        self._group = 0

    def prerequisites(self, access: Sequence[Access]) -> List[Unit]:
        """The units of the groups added so far that a unit with ``access`` must wait for (each once, in a
        deterministic order): on overlapping rows and columns of the same base, the last writers, and the
        accumulators (for a read) or readers (for an accumulation) or both (for a write) since."""
        out: List[Unit] = []
        seen: Optional[set] = None   # the units of ``out``, once it is long (a read over many rows written apart)
        bases = self._bases
        for acc in access:
            if len(acc) == 4:
                serial, lo, hi, mode = acc
                c0, c1 = 0, FULL
            else:
                serial, lo, hi, mode, c0, c1 = acc
            rows = bases.get(serial)
            if rows is None or hi <= lo:
                continue
            b = rows.bounds
            i = bisect_right(b, lo) - 1
            if i < 0:
                i = 0
            kinds = _CONFLICTS[mode]
            for s in rows.states[i:bisect_left(b, hi, i)]:
                if s is None:
                    continue
                hits = [p for k in kinds for p in s[k]]
                if s[4] is not None:
                    hits.extend([e[3] for e in s[4] if e[2] in kinds and e[0] < c1 and c0 < e[1]])
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
        rows its units write get a new state (every column) or drop the earlier accesses within the columns
        written (some columns), then its reads and accumulations join their rows' states."""
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
                serial, lo, hi = acc[0], acc[1], acc[2]
                rows = bases.get(serial)
                if rows is None:
                    rows = bases[serial] = _Rows()
                st = rows.states
                if len(acc) == 4:
                    for i in rows.cut(lo, hi):
                        s = st[i]
                        if s is not None and s[0] == g:
                            s[1].append(u)
                        else:
                            # this group's accesses of some columns stay: no order within a group
                            mine = None if s is None or s[4] is None else [e for e in s[4] if e[4] == g] or None
                            st[i] = [g, [u], [], [], mine]
                    continue
                c0, c1 = acc[4], acc[5]
                entry = (c0, c1, 1, u, g)
                for i in rows.cut(lo, hi):
                    s = st[i]
                    if s is None:
                        st[i] = [0, [], [], [], [entry]]
                    elif s[4] is None:
                        s[4] = [entry]
                    else:   # the writer waits for the earlier accesses within its columns: they need not stay
                        kept = [e for e in s[4] if e[4] == g or e[0] < c0 or e[1] > c1]
                        kept.append(entry)
                        s[4] = kept
        for u, acc in later:
            serial, lo, hi, mode = acc[0], acc[1], acc[2], acc[3]
            rows = bases.get(serial)
            if rows is None:
                rows = bases[serial] = _Rows()
            k = 2 if mode == "R" else 3
            st = rows.states
            if len(acc) == 4:
                for i in rows.cut(lo, hi):
                    s = st[i]
                    if s is None:
                        s = st[i] = [0, [], [], [], None]
                    lst = s[k]
                    if not lst or lst[-1] is not u:
                        lst.append(u)
                continue
            entry = (acc[4], acc[5], k, u, g)
            for i in rows.cut(lo, hi):
                s = st[i]
                if s is None:
                    st[i] = [0, [], [], [], [entry]]
                elif s[4] is None:
                    s[4] = [entry]
                elif s[4][-1] != entry:
                    s[4].append(entry)


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
    (every conflicting pair gets its own edge: the same order, more edges, no index)."""
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
