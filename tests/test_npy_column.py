"""Bounded reads of the trace index's files (nbmpi.workers.tracing.npy_column), checked against numpy on
real files, and a trace index's windows against the timeline drawn from the joined trace itself."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from nbmpi.workers.tracing import index as trace_index
from nbmpi.workers.tracing import timeline
from nbmpi.workers.tracing.npy_column import (SKELETON_STRIDE, NpyAppender, NpyColumn, save_with_skeleton)
from nbmpi.workers.tracing.records import DIR_RECV, DIR_SEND, FIELDS, NF, kind_names
from nbmpi.workers.tracing.stream import read_job_trace

C = {f: i for i, f in enumerate(FIELDS)}


@pytest.mark.parametrize("n", [0, 1, SKELETON_STRIDE - 1, SKELETON_STRIDE, SKELETON_STRIDE + 1, 5000, 70_000])
def test_searchsorted_matches_numpy_on_every_range(tmp_path, n):
    rng = np.random.default_rng(n)
    values = np.sort(rng.integers(0, 40, n)).astype(np.float64)      # many equal values
    save_with_skeleton(tmp_path / "v.npy", values)
    col = NpyColumn(tmp_path / "v.npy")
    keys = np.concatenate([rng.uniform(-3, 43, 200), np.arange(-1, 42, dtype=np.float64)])
    for lo, hi in [(0, n), (n // 3, n // 2), (n // 2, n), (min(7, n), min(7, n))]:
        for side in ("left", "right"):
            want = lo + np.searchsorted(values[lo:hi], keys, side)
            assert (col.searchsorted(keys, side, lo, hi) == want).all(), (lo, hi, side)
    col.close()


def test_take_and_indexing_match_numpy(tmp_path):
    rng = np.random.default_rng(3)
    m = rng.integers(-10**12, 10**12, (90_000, NF))
    np.save(tmp_path / "m.npy", m)
    col = NpyColumn(tmp_path / "m.npy")
    idx = np.concatenate([rng.integers(0, len(m), 3000), np.arange(500, 900), [-1, 0]])
    assert (col.take(idx) == m[idx]).all() and (col[idx, 4] == m[idx, 4]).all()
    assert (col[17] == m[17]).all() and col[17, 3] == m[17, 3] and (col[40:60_000] == m[40:60_000]).all()
    assert col.take(idx.reshape(-1, 2)).shape == (len(idx) // 2, 2, NF)
    with pytest.raises(IndexError):
        col[len(m)]


def test_appender_writes_what_save_writes(tmp_path):
    rng = np.random.default_rng(5)
    pieces = [np.sort(rng.uniform(0, 1, k)) + i for i, k in enumerate([0, 3000, 1, 7000, 1024])]
    app = NpyAppender(tmp_path / "a.npy", skeleton=True)
    for p in pieces:
        app.add(p)
    app.finish()
    whole = np.concatenate(pieces)
    save_with_skeleton(tmp_path / "b.npy", whole)
    assert np.array_equal(np.load(tmp_path / "a.npy"), whole)
    assert np.array_equal(np.load(tmp_path / "a.skel.npy"), np.load(tmp_path / "b.skel.npy"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "a.skel.npy", "b.npy", "b.skel.npy"]
    app2 = NpyAppender(tmp_path / "c.npy")
    app2.add(np.zeros((4, 3)))
    with pytest.raises(ValueError, match="c.npy"):
        app2.add(np.zeros((4, 2)))


def _stream_files(d, n, seed=0):
    """Two ranks' stream files as the streamer writes them: put/take pairs with jittered times."""
    rng = np.random.default_rng(seed)
    t = 10**12
    for r in range(2):
        rows = np.zeros((n, NF), np.int64)
        b = t + np.cumsum(rng.integers(500, 3000, n // 2))
        for j, (kind, di, s, e) in enumerate([(0, DIR_SEND, 0, 300), (1, DIR_RECV, 500, 900)] if r == 0 else
                                             [(1, DIR_RECV, 100, 400), (0, DIR_SEND, 600, 700)]):
            a = rows[j::2]
            a[:, C["kind"]], a[:, C["dir"]], a[:, C["peer"]], a[:, C["tag"]] = kind, di, 1 - r, 7
            a[:, C["nbytes"]], a[:, C["wait"]], a[:, C["seq"]], a[:, C["chan"]] = 800, -1, -1, 1
            a[:, C["t_start"]] = b + s + rng.integers(0, 200, len(b))
            a[:, C["t_end"]] = b + e + rng.integers(200, 400, len(b))
        rows.astype("<i8").tofile(d / f"rank-{r}.events")
        (d / f"rank-{r}.live.json").write_text(json.dumps(dict(
            rank=r, size=2, pid=1, kinds=kind_names(), rows=n, dropped=0, clock_error_ns=0, start_ns=t - 10**5,
            now_ns=int(b[-1]) + 5000, time=time.time(), waiting=None, done=True)))


def test_index_windows_equal_the_joined_traces_timeline(tmp_path):
    _stream_files(tmp_path, 4000)
    meta = trace_index.build(tmp_path, 2)
    assert meta["state"] == "ok" and meta["events"] == 8000
    ix = trace_index.TraceIndex.open(tmp_path)
    jt = read_job_trace(tmp_path, 2)
    cols = timeline.timeline_columns(jt.trace, window=(jt.start_ns, jt.now_ns), blocked=jt.waits())
    dur = cols.duration_s
    for s0, s1 in [(None, None), (0.1 * dur, 0.4 * dur), (0.5 * dur, 0.5001 * dur)]:
        want = cols.view(s0, s1, width=0, max_arrows=0)
        got = ix.view(s0, s1, width=0, max_arrows=0)
        assert got["segments"] == want["segments"] and got["arrows"] == want["arrows"]
        assert got["heads"] == want["heads"]
    merged = ix.view(None, None, width=300)
    assert merged["meta"]["merged"] and merged["meta"]["in_window"] == cols.segments
    assert sum(merged["segments"]["count"]) >= cols.segments // 2
    ix.close()
