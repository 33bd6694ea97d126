"""The bounded-memory index build (nbmpi.workers.tracing.index_build, external_sort) on real stream files:
a build a few rows at a time writes the very files of a one-chunk build, and both equal what the joined
in-memory trace (Trace, timeline_columns, analysis) gives; property-based over random traces (ties in
time, duplicate and unmatched messages, collectives, ranks blocked at the end)."""
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


def _write_stream(d: Path, ranks, waiting) -> None:
    """Stream files as the ranks write them: ``ranks[r]`` the rows of rank r, ``waiting[r]`` None or
    the ns (from the first event) since which rank r is blocked at the end."""
    base = 10**12
    for r, rows in enumerate(ranks):
        a = np.array(rows, np.int64).reshape(-1, NF)
        a[:, C["t_start"]] += base
        a[:, C["t_end"]] += base
        a.astype("<i8").tofile(d / f"rank-{r}.events")
        w = waiting[r]
        (d / f"rank-{r}.live.json").write_text(json.dumps(dict(
            rank=r, size=len(ranks), pid=1, kinds=kind_names(), rows=len(a), dropped=r, clock_error_ns=0,
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
                analysis=timeline.analysis(trace, window=window, open_waits=waits), a_send=sp, a_recv=rp,
                a_t0=c_start[sp], a_t1=c_end[rp], duration_s=cols.duration_s, origin_ns=cols.origin_ns)


@settings(max_examples=60, deadline=None)
@given(traces(), st.integers(2, 7))
def test_small_chunks_build_the_one_chunk_index_and_the_joined_traces(trace, chunk):
    ranks, waiting = trace
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        _write_stream(d, ranks, waiting)
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
