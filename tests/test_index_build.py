"""The bounded-memory index build (nbmpi.workers.tracing.index_build, external_sort) on real stream files:
a build a few rows at a time writes the very files of a one-chunk build, and both equal what the joined
in-memory trace (Trace, timeline_columns, analysis) gives; property-based over random traces (ties in
time, duplicate and unmatched messages, collectives, ranks blocked at the end, rank clocks skewed within
their clock error, which both repair alike)."""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nbmpi.workers.tracing import index as trace_index
from nbmpi.workers.tracing import timeline
from nbmpi.workers.tracing.external_sort import RecordFile, group_blocks, sort_records
from nbmpi.workers.tracing.records import FIELDS, NF, kind_names
from nbmpi.workers.tracing.stream import read_job_trace

C = {f: i for i, f in enumerate(FIELDS)}


def _write_stream(d: Path, ranks, waiting, clock_error=None) -> None:
    """Stream files as the ranks write them: ``ranks[r]`` the rows of rank r, ``waiting[r]`` None or
    the ns (from the first event) since which rank r is blocked at the end, ``clock_error[r]`` the
    clock error (ns) rank r reports (default 0)."""
    base = 10**12
    for r, rows in enumerate(ranks):
        a = np.array(rows, np.int64).reshape(-1, NF)
        a[:, C["t_start"]] += base
        a[:, C["t_end"]] += base
        a.astype("<i8").tofile(d / f"rank-{r}.events")
        w = waiting[r]
        (d / f"rank-{r}.live.json").write_text(json.dumps(dict(
            rank=r, size=len(ranks), pid=1, kinds=kind_names(), rows=len(a), dropped=r,
            clock_error_ns=0 if clock_error is None else int(clock_error[r]),
            start_ns=base - 50, now_ns=base + 400, time=time.time(), done=w is None,
            waiting=None if w is None else dict(op="take(src=0)", peer=0, since_ns=base + w))))


def _row(nranks):
    return st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(-1, nranks - 1), st.integers(0, 1),
                     st.integers(0, 99), st.integers(0, 300), st.integers(0, 40), st.sampled_from([-1, -1, 0, 7]),
                     st.sampled_from([-1, -1, -1, 0, 1]), st.integers(0, 1), st.integers(0, 2)).map(
        lambda t: list(t[:6]) + [t[5] + t[6]] + list(t[7:]))


@st.composite
def traces(draw):
    nranks = draw(st.integers(1, 3))
    ranks = [draw(st.lists(_row(nranks), max_size=25)) for _ in range(nranks)]
    waiting = [draw(st.one_of(st.none(), st.integers(0, 390))) for _ in range(nranks)]
    return ranks, waiting


def _files(d: Path) -> dict:
    """Every file of an index, loaded; the meta without the build time."""
    out = {p.name: np.load(p) for p in sorted(d.glob("*.npy"))}
    meta = json.loads((d / "meta.json").read_text())
    meta.pop("built_at")
    out["meta"] = meta
    return out


def _same(a, b) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if k == "meta":
            assert a[k] == b[k]
        else:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def _reference(d: Path, nranks: int) -> dict:
    """What the index holds, from the joined trace in memory (what the build did before it was bounded)."""
    jt = read_job_trace(d, nranks)
    trace, waits = jt.trace, jt.waits()
    window = (jt.start_ns, jt.now_ns)
    seg = {k: [] for k in ("start", "end", "state", "event")}
    lane_off = [0]
    c_start, c_end = np.full(len(trace), np.nan), np.full(len(trace), np.nan)
    for r in range(nranks):
        cols = timeline.timeline_columns(trace, window=window, ranks=[r], blocked=waits)
        mine = np.array([k for k, w in enumerate(waits) if int(w["rank"]) == r] or [0], np.int64)
        o = cols.event <= -2
        cols.event[o] = -2 - mine[-2 - cols.event[o]]
        comm = (cols.state == 2) & (cols.event >= 0)
        c_start[cols.event[comm]], c_end[cols.event[comm]] = cols.start[comm], cols.end[comm]
        for k in seg:
            seg[k].append(getattr(cols, k))
        lane_off.append(lane_off[-1] + len(cols.start))
    sp, rp = trace.flow_pairs[:, 0], trace.flow_pairs[:, 1]
    order = np.argsort(c_start[sp], kind="stable")
    sp, rp = sp[order], rp[order]
    return dict(seg={k: np.concatenate(v) for k, v in seg.items()}, lane_off=lane_off, events=trace.events,
                clock_shift_ns=trace.clock_shift_ns.tolist(), clock_violations=trace.clock_violations,
                analysis=timeline.analysis(trace, window=window, open_waits=waits), a_send=sp, a_recv=rp,
                a_t0=c_start[sp], a_t1=c_end[rp], duration_s=cols.duration_s, origin_ns=cols.origin_ns)


@settings(max_examples=60, deadline=None)
@given(traces(), st.integers(2, 7))
def test_small_chunks_build_the_one_chunk_index_and_the_joined_traces(trace, chunk):
    ranks, waiting = trace
    _check_index(ranks, waiting, None, chunk)


@st.composite
def skewed(draw):
    """A random trace whose ranks' clocks (but rank 0's) are off by up to their clock error, and the errors."""
    ranks, waiting = draw(traces())
    err = [0] + [draw(st.integers(0, 300)) for _ in ranks[1:]]
    for r, rows in enumerate(ranks):
        k = draw(st.integers(-err[r], err[r]))
        for row in rows:
            row[C["t_start"]] += k + 300        # + 300: times stay after the live state's start
            row[C["t_end"]] += k + 300
    return ranks, waiting, err


@settings(max_examples=60, deadline=None)
@given(skewed(), st.integers(2, 7))
def test_skewed_clocks_are_repaired_by_the_index_as_by_the_joined_trace(trace, chunk):
    ranks, waiting, err = trace
    meta = _check_index(ranks, waiting, err, chunk)
    assert all(abs(c) <= e for c, e in zip(meta["clock_shift_ns"], err))


def _check_index(ranks, waiting, clock_error, chunk) -> dict:
    """Build the index of the trace in one chunk and in ``chunk`` rows at a time; assert both hold the
    same files, equal to what the joined trace gives; returns the meta."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _write_stream(d, ranks, waiting, clock_error)
        assert trace_index.build(d, len(ranks), chunk=1 << 20)["state"] == "ok"
        one = _files(d / "index")
        assert trace_index.build(d, len(ranks), chunk=chunk)["state"] == "ok"
        _same(_files(d / "index"), one)
        assert not list(d.glob("index/.work*")) and not list(d.glob(".index.tmp*"))
        ref = _reference(d, len(ranks))
    meta = one["meta"]
    assert meta["lane_off"] == ref["lane_off"] and meta["analysis"] == ref["analysis"]
    assert meta["duration_s"] == ref["duration_s"] and meta["origin_ns"] == ref["origin_ns"]
    for k, v in ref["seg"].items():
        assert np.array_equal(one["seg.npy"][k], v.astype(one["seg.npy"][k].dtype)), k
    assert np.array_equal(one["start.npy"], ref["seg"]["start"])
    off = ref["lane_off"]
    endmax = [np.maximum.accumulate(ref["seg"]["end"][a:b]) for a, b in zip(off[:-1], off[1:])]
    assert np.array_equal(one["endmax.npy"], np.concatenate(endmax))
    assert np.array_equal(one["events.npy"], ref["events"])
    for k in ("a_send", "a_recv", "a_t0", "a_t1"):
        assert np.array_equal(one[f"{k}.npy"], ref[k]), k
    assert meta["clock_shift_ns"] == ref["clock_shift_ns"] and meta["clock_violations"] == ref["clock_violations"]
    return meta


@st.composite
def messages(draw):
    """Messages one after the other between random ranks (each rank's calls never overlap), recorded on
    clocks skewed within the ranks' clock errors: ``(ranks, clock errors, skews)``; in true time every
    receive ends after its send starts, so the repair can always undo the skew."""
    nranks = draw(st.integers(2, 4))
    err = [0] + [draw(st.integers(0, 500)) for _ in range(nranks - 1)]
    skew = [0] + [draw(st.integers(-e, e)) for e in err[1:]]
    rows = [[] for _ in range(nranks)]
    t = 1000
    for seq in range(draw(st.integers(1, 12))):
        src, dst = draw(st.lists(st.integers(0, nranks - 1), min_size=2, max_size=2, unique=True))
        length = draw(st.integers(1, 200))
        ds, dr = draw(st.integers(0, length)), draw(st.integers(0, length))   # send ends, receive starts
        for r, d, peer, a, b in ((src, 1, dst, t, t + ds), (dst, 2, src, t + dr, t + length)):
            row = [0] * NF
            row[C["kind"]], row[C["dir"]], row[C["peer"]], row[C["nbytes"]] = d - 1, d, peer, 8
            row[C["t_start"]], row[C["t_end"]] = a + skew[r], b + skew[r]
            row[C["wait"]], row[C["seq"]] = -1, -1
            rows[r].append(row)
        t += length + draw(st.integers(0, 50))
    return rows, err, skew


@settings(max_examples=40, deadline=None)
@given(messages(), st.integers(2, 5))
def test_repaired_index_has_no_arrow_ending_before_it_starts(msgs, chunk):
    ranks, err, skew = msgs
    meta = _check_index(ranks, [None] * len(ranks), err, chunk)
    assert meta["clock_violations"] == 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _write_stream(d, ranks, [None] * len(ranks), err)
        assert trace_index.build(d, len(ranks), chunk=chunk)["state"] == "ok"
        a_t0, a_t1 = np.load(d / "index" / "a_t0.npy"), np.load(d / "index" / "a_t1.npy")
        assert len(a_t0) == sum(len(r) for r in ranks) // 2 and (a_t1 >= a_t0).all()
        _write_stream(d, ranks, [None] * len(ranks), [0] * len(ranks))   # no clock error: nothing to repair
        assert trace_index.build(d, len(ranks), chunk=chunk)["state"] == "ok"
        raw = json.loads((d / "index" / "meta.json").read_text())
        late = np.load(d / "index" / "a_t1.npy") < np.load(d / "index" / "a_t0.npy")
    assert raw["clock_shift_ns"] == [0] * len(ranks) and raw["clock_violations"] == int(late.sum())
    if late.any():               # the skew made arrows run backwards: the repair moved a clock
        assert any(meta["clock_shift_ns"])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 2)), max_size=60), st.integers(2, 9))
def test_sort_on_disk_is_numpys_stable_sort_and_groups_span_blocks(rows, chunk):
    dt = np.dtype([("a", "<i8"), ("b", "<i8"), ("i", "<i8")])
    data = np.array([(a, b, i) for i, (a, b) in enumerate(rows)], dt)
    with tempfile.TemporaryDirectory() as tmp:
        f = RecordFile(Path(tmp) / "x", dt)
        f.add(data)
        out = sort_records(f, ("a", "b"), chunk)
        got = out.read(0, len(out))
        assert np.array_equal(got, data[np.lexsort((data["b"], data["a"]))])
        gids, pos = [], []
        for _block, g, p in group_blocks(out, ("a",), 3):
            gids += g.tolist()
            pos += p.tolist()
        _, first, inv = np.unique(got["a"], return_index=True, return_inverse=True)
        assert gids == inv.ravel().tolist() and pos == (np.arange(len(got)) - first[inv.ravel()]).tolist()
        assert [p.name for p in Path(tmp).iterdir()] == ["x.sorted"]     # runs and input removed
