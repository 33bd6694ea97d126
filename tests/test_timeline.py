"""The timeline figure module from hand-built traces (known times, so geometry, level of detail, the
straggler sentence and where ranks wait are checkable exactly)."""
from __future__ import annotations

import numpy as np

from nbmpi.workers.tracing.timeline import (COLORS, SOURCES, analysis, blocked_sentences, bokeh_item, figure_sources,
                                    notebook_bundle, render_html, straggler, timeline_columns, timeline_data)
from nbmpi.workers.tracing.analysis import STATE_NAMES, Trace
from nbmpi.workers.tracing.tracer import DIR_RECV, DIR_SEND, NF, kind_names, register_kind


def _ev(kind, d, peer, t0, t1, seq=0):
    row = np.zeros(NF, np.int64)
    row[:] = [kind, d, peer, 11, 64, t0, t1, -1, seq, 1, 0]
    return row


def test_timeline_lanes_arrows_and_wait():
    put, take = register_kind("put"), register_kind("take")
    ms = 1_000_000
    # rank 1 starts take(src=0) at 0 ms, rank 0 puts at 6 ms, both end at 10 ms: rank 1 waits 6 ms
    ev = np.stack([_ev(put, DIR_SEND, 1, 6 * ms, 10 * ms), _ev(take, DIR_RECV, 0, 0, 10 * ms)])
    tr = Trace(ev, np.array([0, 1]), 2, kind_names())
    data = timeline_data(tr, window=(-10 * ms, 20 * ms))
    assert data["duration_s"] == 0.03
    lane1 = data["lanes"][1]
    assert [s["state"] for s in lane1["segments"]] == ["compute", "wait", "comm", "compute"]
    wait = lane1["segments"][1]
    assert abs(wait["start_s"] - 0.010) < 1e-9 and abs(wait["end_s"] - 0.016) < 1e-9
    assert abs(lane1["wait_pct"] - 20.0) < 1e-6 and data["lanes"][0]["wait_pct"] == 0.0
    assert data["messages"] == 1 and data["arrows"] == [dict(src=0, dst=1, t_send_s=0.016, t_recv_s=0.020,
                                   label="put(dest=1) -> take(src=0)")]
    html = render_html(tr, window=(-10 * ms, 20 * ms))
    assert html.count("<svg") == 1 and html.count('class="nbmpi-arrow"') == 1
    assert COLORS["wait"] in html and "wait 20.0%" in html and "wait 0.0%" in html


def test_timeline_without_events():
    tr = Trace(np.empty((0, NF), np.int64), np.empty(0, np.int64), 2, kind_names())
    data = timeline_data(tr, window=(0, 5_000_000))
    assert [len(l["segments"]) for l in data["lanes"]] == [1, 1]
    assert "no communication was recorded" in render_html(tr, window=(0, 5_000_000))


def _coll(kind, t0, t1, seq):
    row = np.zeros(NF, np.int64)
    row[:] = [kind, 0, -1, 0, 8, t0, t1, -1, seq, 7, 1]   # a collective step (dir none) on channel 7
    return row


def _straggler_trace():
    """3 ranks, two allreduces; ranks 0 and 2 compute 10 ms before each, rank 1 23 ms; each ends 2 ms
    after rank 1 arrives. Window 0..50 ms: ranks 0, 2 wait 26 ms (52%) and compute 20 ms; rank 1 46 ms."""
    ar = register_kind("allreduce")
    ms = 1_000_000
    rows, ranks = [], []
    for r, arrive in ((0, (10, 35)), (1, (23, 48)), (2, (10, 35))):
        for seq, (a, end) in enumerate(zip(arrive, (25, 50))):
            rows.append(_coll(ar, a * ms, end * ms, seq))
            ranks.append(r)
    return Trace(np.stack(rows), np.array(ranks), 3, kind_names()), ms


def test_straggler_sentence_from_trace_data():
    tr, ms = _straggler_trace()
    an = analysis(tr, window=(0, 50 * ms))
    r0, r1 = an["ranks"][0], an["ranks"][1]
    assert abs(r0["wait_s"] - 0.026) < 1e-12 and abs(r0["compute_s"] - 0.020) < 1e-12
    assert abs(r1["compute_s"] - 0.046) < 1e-12 and r1["wait_s"] == 0
    assert r0["wait_by_kind"] == {"allreduce": 0.026}
    s = an["straggler"]
    assert s["rank"] == 1 and abs(s["ratio"] - 2.3) < 1e-9 and s["kind"] == "allreduce"
    assert s["sentence"] == "rank 1 computes 2.3x longer; the others wait 52% of the time in allreduce"
    # two ranks: the other rank is named
    two = Trace(tr.events[tr.ranks < 2], tr.ranks[tr.ranks < 2], 2, kind_names())
    assert straggler(analysis(two, window=(0, 50 * ms)))["sentence"] == (
        "rank 1 computes 2.3x longer; rank 0 waits 52% of the time in allreduce")


def test_balanced_and_degenerate_sentences():
    ms = 1_000_000
    ar = register_kind("allreduce")
    ev = np.stack([_coll(ar, 10 * ms, 12 * ms, 0), _coll(ar, 10 * ms, 12 * ms, 0)])
    s = analysis(Trace(ev, np.array([0, 1]), 2, kind_names()), window=(0, 20 * ms))["straggler"]
    assert s["rank"] is None and s["sentence"] == ("no straggler: the ranks compute within 0% of each other; "
                                                   "no rank waits more than 5% of the time")
    empty = Trace(np.empty((0, NF), np.int64), np.empty(0, np.int64), 2, kind_names())
    assert analysis(empty)["straggler"]["sentence"] == "no communication was recorded"
    one = Trace(ev[:1], np.array([0]), 1, kind_names())
    assert analysis(one)["straggler"]["sentence"] == "one rank: no other rank to wait for"


def test_blocked_sentences_name_the_peer_and_deadlocks():
    waits = [dict(rank=1, op="take(src=0)", peer=0, since_ns=0, for_s=12.5)]
    assert blocked_sentences(waits, 2) == [
        "rank 1 has waited 12.50 s in take(src=0) for rank 0, which is not blocked in a communication call "
        "(computing, or stuck elsewhere)"]
    both = waits + [dict(rank=0, op="take(src=1)", peer=1, since_ns=0, for_s=3.0)]
    out = blocked_sentences(both, 2)
    assert out[1].startswith("rank 1 has waited 12.50 s in take(src=0) for rank 0, which itself waits in take(src=1)")
    assert all("deadlock" in s for s in out)
    assert "a collective" in blocked_sentences([dict(rank=0, op="barrier", peer=None, for_s=1.0)], 2)[0]


def test_level_of_detail_bounds_a_view_and_keeps_wide_segments():
    """20,000 tiny ping-pong events and one long computation: a view at 200 px holds at most two
    rows per lane and pixel, the long compute segment exactly, and at most max_arrows arrows."""
    put, take = register_kind("put"), register_kind("take")
    us = 1000
    rows, ranks = [], []
    for i in range(5000):           # 1 ms of messages every 2 us ...
        t = i * 200
        rows += [_ev(put, DIR_SEND, 1, t, t + 100, seq=i), _ev(take, DIR_RECV, 0, t, t + 150, seq=i),
                 _ev(take, DIR_RECV, 1, t + 100, t + 190, seq=i), _ev(put, DIR_SEND, 0, t + 150, t + 190, seq=i)]
        ranks += [0, 1, 0, 1]
    tr = Trace(np.stack(rows), np.array(ranks), 2, kind_names())
    end = tr.t1 + 1000 * us                                            # ... then 1 ms of computing
    cols = timeline_columns(tr, window=(tr.t0, end))
    assert len(tr.flow_pairs) == 10_000 and cols.segments > 20_000
    v = cols.view(width=200, max_arrows=300)
    m = v["meta"]
    assert m["merged"] and m["in_window"] == cols.segments and m["shown"] <= 2 * 2 * 200
    assert m["arrows_in_window"] == 10_000 and 0 < m["arrows_shown"] <= 300
    seg = v["segments"]
    last = [i for i in range(m["shown"]) if seg["rank"][i] == 0 and seg["left"][i] >= tr.t1 / 1e9 - tr.t0 / 1e9 - 1e-9]
    assert len(last) == 1 and seg["count"][last[0]] == 1 and seg["state"][last[0]] == "compute"
    assert abs(seg["right"][last[0]] - cols.duration_s) < 1e-12
    assert max(seg["count"]) > 1 and any("zoom in" in c for c in seg["call"])
    # zoomed to 1 us (5 ns a pixel): nothing to merge, every segment of the window as it is
    z = cols.view(0.0005, 0.0005 + 1e-6, width=200)
    assert not z["meta"]["merged"] and z["meta"]["shown"] == z["meta"]["in_window"] > 0
    assert all(c == 1 for c in z["segments"]["count"])
    exact = cols.view(width=0, max_arrows=0)
    assert exact["meta"]["shown"] == cols.segments and exact["meta"]["arrows_shown"] == 10_000


def test_blocked_wait_extends_a_lane_to_the_end():
    put, take = register_kind("put"), register_kind("take")
    ms = 1_000_000
    ev = np.stack([_ev(put, DIR_SEND, 1, 6 * ms, 10 * ms), _ev(take, DIR_RECV, 0, 0, 10 * ms)])
    tr = Trace(ev, np.array([0, 1]), 2, kind_names())
    cols = timeline_columns(tr, window=(0, 30 * ms), blocked=[dict(rank=1, op="take(src=0)", peer=0, since_ns=20 * ms)])
    lane1 = [(STATE_NAMES[s], round(a, 6), round(b, 6)) for ln, s, a, b in
             zip(cols.lane, cols.state, cols.start, cols.end) if ln == 1]
    assert lane1 == [("wait", 0.0, 0.006), ("comm", 0.006, 0.01), ("compute", 0.01, 0.02), ("wait", 0.02, 0.03)]
    v = cols.view(width=0)
    assert v["segments"]["call"][-1] == "take(src=0) (blocked now)" and v["segments"]["peer"][-1] == "0"


def test_bokeh_figure_and_notebook_bundle():
    tr, ms = _straggler_trace()
    cols = timeline_columns(tr, window=(0, 50 * ms))
    an = analysis(tr, window=(0, 50 * ms))
    item = bokeh_item(cols.view(width=800), an)
    names = {m.get("name") for m in _models(item)}
    assert set(SOURCES) <= names and "nbmpi_x" in names and "nbmpi_timeline" in names
    src = figure_sources(cols.view(width=800), an)
    assert len(src["nbmpi_matrix"]["sender"]) == 9 and src["nbmpi_fractions"]["wait_text"][0] == "wait 52.0%"
    b = notebook_bundle(tr, window=(0, 50 * ms))
    assert set(b) == {"text/plain", "text/html", "image/svg+xml"}
    assert b["image/svg+xml"].startswith("<svg") and b["text/html"].count("<svg") == 1
    assert "Bokeh.embed.embed_item" in b["text/html"] and "rank 1 computes 2.3x longer" in b["text/plain"]
    assert "</script" not in b["text/html"].split('type="application/json"')[1].split("</script>")[0]


def _models(item):
    """Every object with a name in a Bokeh JSON item (walks the serialized document)."""
    out = []

    def walk(x):
        if isinstance(x, dict):
            if "name" in x and isinstance(x.get("name"), str):
                out.append(x)
            attrs = x.get("attributes")
            if isinstance(attrs, dict) and isinstance(attrs.get("name"), str):
                out.append({"name": attrs["name"]})
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(item)
    return out
