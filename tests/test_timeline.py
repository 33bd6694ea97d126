"""The timeline figure from a hand-built trace (known times, so the geometry is checkable)."""
from __future__ import annotations

import numpy as np

from nbmpi.workers.timeline import COLORS, render_html, timeline_data
from nbmpi.workers.trace_analysis import Trace
from nbmpi.workers.tracing import DIR_RECV, DIR_SEND, NF, kind_names, register_kind


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
    assert data["arrows"] == [dict(src=0, dst=1, t_send_s=0.016, t_recv_s=0.020,
                                   label="put(dest=1) -> take(src=0)")]
    html = render_html(tr, window=(-10 * ms, 20 * ms))
    assert html.count("<svg") == 1 and html.count('class="nbmpi-arrow"') == 1
    assert COLORS["wait"] in html and "wait 20.0%" in html and "wait 0.0%" in html


def test_timeline_without_events():
    tr = Trace(np.empty((0, NF), np.int64), np.empty(0, np.int64), 2, kind_names())
    data = timeline_data(tr, window=(0, 5_000_000))
    assert [len(l["segments"]) for l in data["lanes"]] == [1, 1]
    assert "no communication was recorded" in render_html(tr, window=(0, 5_000_000))
