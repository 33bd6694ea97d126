"""The dependency index of a flush (workers/distarray/dependencies.py) against the quadratic rule it replaces.

The quadratic rule pairs every unit with every unit of an earlier group it conflicts with (same base,
overlapping rows and columns, not both reading, not both accumulating). Every conflicting pair must be ordered by
a chain of edges; collectives stay chained in group order. Pair by pair (a small flush) only conflicting pairs get
an edge; the index also orders a writer after every earlier access of its rows (whatever the columns), a reader
or an accumulator only after units it conflicts with.
"""
from __future__ import annotations

from typing import Dict, List, Set, Tuple

import pytest
from hypothesis import given, settings, strategies as st

from nbmpi.workers.distarray.dependencies import _SCAN_MAX, PAIRWISE_ACCESSES, AccessIndex, order_units
from nbmpi.workers.distarray.units import FULL, GroupRun, Unit


def _cols(a) -> Tuple[int, int]:
    """The columns of access ``a``: its own (``c0, c1``) or every column."""
    return (a[4], a[5]) if len(a) > 4 else (0, FULL)


def _conflict(a, b) -> bool:
    (s1, lo1, hi1, m1), (s2, lo2, hi2, m2) = a[:4], b[:4]
    (c1, d1), (c2, d2) = _cols(a), _cols(b)
    return s1 == s2 and lo1 < hi2 and lo2 < hi1 and c1 < d2 and c2 < d1 and not (m1 == m2 and m1 in "RA")


def _writes_rows_of(a, b) -> bool:
    """``b`` writes rows that ``a`` accesses, or accumulates into rows ``a`` writes or reads, whatever the columns
    (the index may order such a pair)."""
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2] and (b[3] == "W" or (b[3] == "A" and a[3] != "A"))


def _quadratic(runs: List[GroupRun], rule=_conflict) -> Set[Tuple[int, int]]:
    """Every (earlier unit, later unit) pair of different groups with accesses ``rule`` pairs (by unit id)."""
    out = set()
    groups = [r.units() for r in runs]
    for gi, later in enumerate(groups):
        for earlier in groups[:gi]:
            for p in earlier:
                for u in later:
                    if any(rule(a, b) for a in p.access for b in u.access):
                        out.add((id(p), id(u)))
    return out


def _allowed(runs: List[GroupRun]) -> Set[Tuple[int, int]]:
    """The pairs the index may order: the conflicting ones, a writer after any earlier access of its rows, an
    accumulator after any earlier write or read of its rows."""
    return _quadratic(runs) | _quadratic(runs, _writes_rows_of)


def _edges(runs: List[GroupRun]) -> Set[Tuple[int, int]]:
    return {(id(p), id(u)) for r in runs for p in r.units() for u in p.dependents}


def _closure_has(edges: Set[Tuple[int, int]], pairs: Set[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """The pairs of ``pairs`` not joined by a chain of ``edges``."""
    succ: Dict[int, List[int]] = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    reach: Dict[int, Set[int]] = {}

    def reachable(x: int) -> Set[int]:
        if x not in reach:
            seen, stack = set(), [x]
            while stack:
                for y in succ.get(stack.pop(), ()):
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
            reach[x] = seen
        return reach[x]

    return [(a, b) for a, b in pairs if b not in reachable(a)]


def _with_cols(t) -> tuple:
    """A generated access: rows ``[lo, lo + n)`` (or to FULL), every column or columns ``[c0, c0 + w)``."""
    serial, lo, n, mode, to_full, cols = t
    acc = (serial, lo, FULL if to_full and n > 5 else lo + n, mode)
    return acc if cols is None else acc + (cols[0], cols[0] + cols[1])


_access = st.tuples(st.integers(1, 3), st.integers(0, 10), st.integers(1, 6), st.sampled_from("RWA"),
                    st.booleans(), st.none() | st.tuples(st.integers(0, 5), st.integers(1, 3))).map(_with_cols)
_unit = st.lists(_access, min_size=0, max_size=3)
_group = st.tuples(st.lists(_unit, min_size=1, max_size=4), st.booleans())


def _runs(spec) -> List[GroupRun]:
    runs = []
    for gi, (units, coll) in enumerate(spec):
        run = GroupRun(f"group {gi}")
        run.computes = [Unit("compute", lambda: None, f"g{gi}u{k}", tuple(acc)) for k, acc in enumerate(units[:-1])]
        if len(units) > 1:
            run.sends = [Unit("send", lambda: None, f"g{gi}s", tuple(units[-1]))]
        else:
            run.computes.append(Unit("compute", lambda: None, f"g{gi}u", tuple(units[-1])))
        if coll:
            run.coll = Unit("coll", lambda: None, f"g{gi}c")
            run.finish = Unit("compute", lambda: None, f"g{gi}f", ((9, 0, FULL, "W"),))
        runs.append(run)
    return runs


@pytest.mark.parametrize("pairwise", [0, PAIRWISE_ACCESSES, 10 ** 6], ids=["index", "default", "pairs"])
@settings(max_examples=300, deadline=None)
@given(spec=st.lists(_group, min_size=1, max_size=9))
def test_index_orders_exactly_the_conflicting_pairs(pairwise, spec):
    runs = _runs(spec)
    order_units(runs, pairwise)
    made = _edges(runs)
    conflicting = _quadratic(runs)
    colls = [r.coll for r in runs if r.coll is not None]
    chain = {(id(a), id(b)) for a, b in zip(colls, colls[1:])}
    exact = pairwise >= 10 ** 6            # pair by pair: only conflicting pairs
    assert made - chain <= (conflicting if exact else _allowed(runs)), "an edge between units that do not conflict"
    writers = {id(u) for r in runs for u in r.units() if any(a[3] != "R" for a in u.access)}
    assert {(p, u) for p, u in made - chain if u not in writers} <= conflicting, \
        "a reader waits for a unit it does not conflict with"
    assert chain <= made, "the collectives are not chained in group order"
    assert not _closure_has(made, conflicting), "a conflicting pair is left unordered"
    for r in runs:
        for u in r.units():
            assert u.ndeps == sum(u in p.dependents for q in runs for p in q.units()), "ndeps is not the edge count"


def test_a_writer_replaces_what_it_overwrites():
    """Rows written again: a later reader waits for the last writer only; a reader of rows written once
    by each of several groups waits for each of them."""
    w1 = Unit("compute", lambda: None, "w1", ((1, 0, 10, "W"),))
    w2 = Unit("compute", lambda: None, "w2", ((1, 0, 10, "W"),))
    w3 = Unit("compute", lambda: None, "w3", ((1, 10, 11, "W"),))
    r = Unit("compute", lambda: None, "r", ((1, 5, 11, "R"),))
    runs = []
    for u in (w1, w2, w3, r):
        run = GroupRun(u.label)
        run.computes = [u]
        runs.append(run)
    order_units(runs, pairwise_accesses=0)   # the index (a small flush is ordered pair by pair)
    assert w2 in w1.dependents and r not in w1.dependents
    assert r in w2.dependents and r in w3.dependents and r.ndeps == 2


def test_readers_and_accumulators_since_the_last_write():
    """Readers do not wait for each other, a writer waits for every reader since the last write, an
    accumulation waits for the readers but not for another accumulation."""
    idx = AccessIndex()
    r1 = Unit("compute", lambda: None, "r1", ((4, 0, 5, "R"),))
    r2 = Unit("compute", lambda: None, "r2", ((4, 3, 8, "R"),))
    a1 = Unit("compute", lambda: None, "a1", ((4, 0, FULL, "A"),))
    idx.add_group([r1])
    assert idx.prerequisites(r2.access) == []
    idx.add_group([r2])
    assert idx.prerequisites(a1.access) == [r1, r2]
    idx.add_group([a1])
    assert idx.prerequisites(((4, 6, 7, "A"),)) == [r2]
    assert idx.prerequisites(((4, 6, 7, "R"),)) == [a1]
    assert idx.prerequisites(((4, 4, 5, "W"),)) == [r1, r2, a1]
    assert idx.prerequisites(((5, 0, FULL, "W"),)) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(_group, min_size=1, max_size=6))
def test_a_small_flush_pairs_every_conflicting_pair(spec):
    """Ordered pair by pair, every conflicting pair of units gets its own edge, and no other pair."""
    runs = _runs(spec)
    order_units(runs, 10 ** 6)
    colls = [r.coll for r in runs if r.coll is not None]
    chain = {(id(a), id(b)) for a, b in zip(colls, colls[1:])}
    assert _edges(runs) - chain == _quadratic(runs) - chain


def test_a_small_flush_takes_the_pairwise_path():
    """A flush of a few groups within :data:`PAIRWISE_ACCESSES` is ordered pair by pair (the reader of rows
    written twice waits for both writers), a larger one through the index (only for the last writer)."""
    def runs_of(n_extra):
        us = [Unit("compute", lambda: None, "w1", ((1, 0, 10, "W"),)),
              Unit("compute", lambda: None, "w2", ((1, 0, 10, "W"),)),
              Unit("compute", lambda: None, "r", ((1, 5, 11, "R"),) + ((2, 0, 1, "R"),) * n_extra)]
        out = []
        for u in us:
            run = GroupRun(u.label)
            run.computes = [u]
            out.append(run)
        return us, out
    (w1, w2, r), runs = runs_of(0)
    order_units(runs)
    assert r in w1.dependents and r in w2.dependents and r.ndeps == 2
    (w1, w2, r), runs = runs_of(PAIRWISE_ACCESSES)
    order_units(runs)
    assert r not in w1.dependents and r in w2.dependents and r.ndeps == 1


@pytest.mark.parametrize("pairwise", [0, 10 ** 6], ids=["index", "pairs"])
def test_a_read_over_many_rows_written_apart_waits_once_for_each_writer(pairwise):
    """A back substitution: group k writes row k of x (descending k) and reads rows k+1.. , twice over (a
    duplicate access), plus a reader of the whole vector: the later reads meet more writers than the index
    scans for duplicates (its set path), each exactly once."""
    n = 3 * _SCAN_MAX
    spec = []
    for k in range(n - 1, -1, -1):
        spec.append(([[(1, k + 1, n, "R"), (1, k + 1, n, "R"), (2, 0, 1, "R")], [(1, k, k + 1, "W")]], k % 5 == 0))
    spec.append(([[(1, 0, n, "R"), (1, 0, n, "A")]], False))
    runs = _runs(spec)
    order_units(runs, pairwise)
    made = _edges(runs)
    colls = [r.coll for r in runs if r.coll is not None]
    chain = {(id(a), id(b)) for a, b in zip(colls, colls[1:])}
    assert made - chain <= _quadratic(runs), "an edge between units that do not conflict"
    assert not _closure_has(made, _quadratic(runs)), "a conflicting pair is left unordered"
    for r in runs:
        for u in r.units():
            assert u.ndeps == sum(u in p.dependents for q in runs for p in q.units()), "a prerequisite counted twice"
    last = runs[-1].computes[0]
    assert last.ndeps >= n, ("the final reader does not wait for every writer of x", last.ndeps)


@pytest.mark.parametrize("pairwise", [0, 10 ** 6], ids=["index", "pairs"])
def test_columns_written_apart_do_not_order_a_read_of_other_columns(pairwise):
    """LU's relay: group k writes column k of rows k+1.. of L and reads row k, columns [0, h) (the send of its
    first half): the read of row k waits for no column write of columns >= h, and a reader of every column of
    those rows waits for each column's writer."""
    h, n = 4, 12
    spec = []
    for k in range(h, n - 1):
        spec.append(([[(1, k, k + 1, "R", 0, h)], [(1, k + 1, n, "W", k, k + 1)]], False))
    spec.append(([[(1, 0, n, "R")]], False))
    runs = _runs(spec)
    order_units(runs, pairwise)
    for run in runs[:-1]:
        assert run.computes[0].ndeps == 0, "a read of columns [0, h) waits for a write of a column >= h"
    assert runs[-1].computes[0].ndeps == len(runs) - 1
    assert not _closure_has(_edges(runs), _quadratic(runs))


def test_a_write_of_some_columns_keeps_the_other_columns_state():
    """A write of columns [2, 4) of rows [2, 4) waits for every unit of its rows' current epoch; a later reader of
    its columns waits for it alone, a reader of other columns for their last writer (of an older epoch), a
    reader of columns nobody wrote for nobody; a write of every column ends that."""
    idx = AccessIndex()
    w1 = Unit("compute", lambda: None, "w1", ((1, 0, 5, "W", 0, 3),))
    w2 = Unit("compute", lambda: None, "w2", ((1, 0, 5, "W", 3, 4),))
    r1 = Unit("compute", lambda: None, "r1", ((1, 0, 5, "R"),))
    a1 = Unit("compute", lambda: None, "a1", ((1, 0, 5, "A", 0, 1),))
    w3 = Unit("compute", lambda: None, "w3", ((1, 2, 4, "W", 2, 4),))
    for u in (w1, w2, r1, a1):
        idx.add_group([u])
    assert idx.prerequisites(w3.access) == [w2, r1, a1]
    idx.add_group([w3])
    assert idx.prerequisites(((1, 3, 4, "R", 3, 4),)) == [w3]
    assert idx.prerequisites(((1, 3, 4, "R", 0, 1),)) == [a1, w1]
    assert idx.prerequisites(((1, 1, 2, "R", 0, 1),)) == [a1, w1]
    assert idx.prerequisites(((1, 1, 2, "A", 0, 1),)) == [w2, r1]
    assert idx.prerequisites(((1, 4, 5, "R", 3, 4),)) == [w2]
    assert idx.prerequisites(((1, 0, 5, "R", 9, 10),)) == []
    w4 = Unit("compute", lambda: None, "w4", ((1, 0, 5, "W"),))
    idx.add_group([w4])
    assert idx.prerequisites(((1, 3, 4, "R", 0, 1),)) == [w4]
