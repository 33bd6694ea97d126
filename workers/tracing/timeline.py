"""The per-rank timeline figure of a trace: its data, its level of detail, its analysis sentence,
the interactive Bokeh figure and the static SVG, for the notebook and the controller's dashboard alike.

Built only from :class:`~nbmpi.workers.tracing.analysis.Trace` data (:meth:`Trace.state_arrays`:
non-overlapping compute / wait / communication intervals per rank; ``Trace.flow_pairs``: matched
send -> receive; the events' kinds, peers, bytes and waits), so ``%%distributed --timeline`` and the
dashboard's job page show the same figure from the same code:

* :func:`timeline_columns`: the figure's data as columns (one lane per rank, segments, arrows),
  optionally with the waits a live job's ranks are blocked in right now;
* :meth:`TimelineColumns.view`: the columns of one time window at a given pixel width, with level of
  detail: segments narrower than a pixel are merged per lane and pixel (the dominant state shown,
  the count in the hover), arrows thinned to at most ``max_arrows``; so a view never holds more than
  about two segments per lane and pixel, whatever the trace's size;
* :func:`analysis`: per-rank compute / communication / wait, wait per call kind, the bytes and
  messages matrices and the straggler sentence (:func:`straggler`); :func:`blocked_sentences` says
  where each rank of a live job waits and for whom;
* :func:`figure_sources` / :func:`bokeh_figure`: the Bokeh figure (WebGL timeline with hover, zoom
  and pan; sender x receiver matrix; per-rank fractions) and the column data of its named sources,
  which the dashboard replaces when the window or the trace changes;
* :func:`timeline_data` / :func:`render_svg` / :func:`render_html`: plain data and the static SVG
  (README, notebooks saved without a kernel); :func:`notebook_bundle` / :func:`show`: the notebook
  output, Bokeh figure plus SVG fallback in one MIME bundle.
"""
from __future__ import annotations

import html
import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .analysis import STATE_NAMES
from .tracer import DIR_NONE, DIR_SEND, FIELDS

COLORS = {"compute": "#9ccc9c", "comm": "#4a7fc1", "wait": "#e0584f"}
LABELS = {"compute": "compute", "comm": "communication", "wait": "wait"}
_STATE_COLORS = [COLORS[s] for s in STATE_NAMES]
_COL = {name: i for i, name in enumerate(FIELDS)}
#: Source names of the Bokeh figure (the dashboard updates them by name).
SOURCES = ("nbmpi_segments", "nbmpi_arrows", "nbmpi_heads", "nbmpi_matrix", "nbmpi_fractions")
#: Half height of a lane's bars (lanes are 1 apart).
LANE_HALF = 0.35
#: Calls named in the hover of a merged row (its first distinct events).
CALLS_NAMED = 4
#: A view with at most this many segments in the whole trace is drawn without merging.
EXACT_LIMIT = 20_000


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(b) < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


# -- columns ----------------------------------------------------------------------------------
@dataclass
class TimelineColumns:
    """The whole timeline of a trace as columns (build with :func:`timeline_columns`).

    Segments (one row each, lane by lane, in time order): ``lane`` (index into ``ranks``),
    ``state`` (index into :data:`~nbmpi.workers.tracing.analysis.STATE_NAMES`), ``start``/``end``
    (seconds from the window's start), ``event`` (trace event index; -1 compute; ``-2 - k`` the
    k-th entry of ``blocked``). Arrows: ``a_src``/``a_dst`` (lane indices), ``a_t0`` (where the
    send's transfer starts), ``a_t1`` (where the receive ends), ``a_send``/``a_recv`` (event indices).
    """
    trace: Any
    ranks: List[int]
    duration_s: float
    lane: np.ndarray
    state: np.ndarray
    start: np.ndarray
    end: np.ndarray
    event: np.ndarray
    a_src: np.ndarray
    a_dst: np.ndarray
    a_t0: np.ndarray
    a_t1: np.ndarray
    a_send: np.ndarray
    a_recv: np.ndarray
    blocked: List[Dict[str, Any]]
    origin_ns: int

    @property
    def segments(self) -> int:
        """Number of segments of the whole timeline."""
        return len(self.lane)

    def label(self, event: int) -> str:
        """The call of segment event ``event`` (``compute`` for -1, the blocked call for ``-2 - k``)."""
        if event == -1:
            return "compute"
        if event <= -2:
            b = self.blocked[-2 - event]
            return f"{b['op']} (blocked now)"
        return self.trace.op_label(int(event))

    def _peer_bytes(self, event: int) -> Tuple[str, int]:
        if event == -1:
            return "", 0
        if event <= -2:
            p = self.blocked[-2 - event].get("peer")
            return ("" if p is None else str(p)), 0
        e = self.trace.events[event]
        d = int(e[_COL["dir"]])
        peer = int(e[_COL["peer"]])
        return ("" if d == DIR_NONE or peer < 0 else str(peer)), int(e[_COL["nbytes"]])

    def view(self, start_s: Optional[float] = None, end_s: Optional[float] = None, width: int = 1200,
             max_arrows: int = 2000) -> Dict[str, Any]:
        """The segments and arrows of window ``[start_s, end_s]`` (default: everything) for a plot
        ``width`` pixels wide, with level of detail (see the module docstring). ``width=0`` merges
        nothing (every segment and arrow of the window).

        Returns ``{"segments": {column: list}, "arrows": {...}, "heads": {...}, "meta": {...}}``:
        ``segments`` has ``left``, ``right``, ``bottom``, ``top``, ``rank``, ``state``, ``color``,
        ``call``, ``peer``, ``bytes``, ``duration``, ``count`` (intervals merged into the row);
        ``max_arrows=0`` sends every arrow of the window;
        ``arrows`` ``x0``, ``y0``, ``x1``, ``y1`` (from the send to the receive) and ``heads`` ``x``,
        ``y``, ``marker``, ``call``
        (the arrow's head at the receive). ``meta``: the window, ``in_window`` segments and
        ``shown`` rows, ``arrows_in_window`` / ``arrows_shown``, ``merged`` (bool), ``lanes`` (each
        lane's name: ``rank R (HOST)`` where the host is known).
        """
        s0 = 0.0 if start_s is None else float(start_s)
        s1 = self.duration_s if end_s is None else float(end_s)
        if s1 <= s0:
            s1 = s0 + 1e-9
        inside = (self.end >= s0) & (self.start <= s1)
        idx = np.nonzero(inside)[0]
        merged = False
        if width and width > 0:
            px = (s1 - s0) / width
            dur = self.end[idx] - self.start[idx]
            big = idx[dur >= px]
            small = idx[dur < px]
        else:
            px = 0.0
            big, small = idx, idx[:0]
        seg: Dict[str, list] = {k: [] for k in ("left", "right", "bottom", "top", "rank", "state", "color", "call",
                                               "peer", "bytes", "duration", "count")}
        if len(small):
            merged = True
            self._merge_small(seg, small, s0, px, width)
        for i in big.tolist():
            self._add_segment(seg, self.start[i], self.end[i], int(self.lane[i]), int(self.state[i]),
                              int(self.event[i]), 1, self.end[i] - self.start[i])
        arrows, heads, a_in, thinned = self._window_arrows(s0, s1, max_arrows)
        merged = merged or thinned
        meta = dict(start_s=s0, end_s=s1, duration_s=self.duration_s, width=int(width or 0), in_window=int(len(idx)),
                    shown=len(seg["left"]), arrows_in_window=int(a_in), arrows_shown=len(arrows["x0"]),
                    merged=merged, ranks=list(self.ranks), events=int(len(self.trace)),
                    lanes=[_lane_name(self.trace, int(r)) for r in self.ranks])
        return dict(segments=seg, arrows=arrows, heads=heads, meta=meta)

    def _add_segment(self, seg: Dict[str, list], left, right, lane: int, state: int, event: int, count, dur_s,
                     nbytes=None, call=None) -> None:
        """Append one row to the view's segment columns ``seg`` (hover text from ``event``, or ``call``)."""
        seg["left"].append(float(left))
        seg["right"].append(float(right))
        seg["bottom"].append(lane - LANE_HALF)
        seg["top"].append(lane + LANE_HALF)
        seg["rank"].append(self.ranks[lane])
        name = STATE_NAMES[state]
        seg["state"].append(LABELS[name])
        seg["color"].append(COLORS[name])
        peer, b = self._peer_bytes(int(event))
        seg["call"].append(call if call is not None else self.label(int(event)))
        seg["peer"].append(peer)
        seg["bytes"].append(_fmt_bytes(b if nbytes is None else nbytes) if (b or nbytes) else "")
        seg["duration"].append(_fmt_s(dur_s))
        seg["count"].append(int(count))

    def _merge_small(self, seg: Dict[str, list], small: np.ndarray, s0: float, px: float, width: int) -> None:
        """Merge the segments ``small`` (narrower than a pixel of ``px`` seconds) per lane and pixel into
        rows of ``seg``: the dominant state, the count and the shares and first calls in the hover."""
        lanes = self.lane[small]
        st = self.state[small]
        mid = 0.5 * (self.start[small] + self.end[small])
        b = np.clip(((mid - s0) / px).astype(np.int64), 0, width - 1)
        key = lanes * width + b
        uniq, inv = np.unique(key, return_inverse=True)
        d = self.end[small] - self.start[small]
        per_state = np.zeros((len(uniq), len(STATE_NAMES)))
        np.add.at(per_state, (inv, st), d)
        counts = np.bincount(inv, minlength=len(uniq))
        lo = np.full(len(uniq), np.inf)
        hi = np.full(len(uniq), -np.inf)
        np.minimum.at(lo, inv, self.start[small])
        np.maximum.at(hi, inv, self.end[small])
        ev_nbytes = np.zeros(len(uniq), np.int64)
        comm_rows = (st == 2) & (self.event[small] >= 0)
        if comm_rows.any():
            nb = self.trace.events[self.event[small][comm_rows], _COL["nbytes"]]
            np.add.at(ev_nbytes, inv[comm_rows], nb)
        dom = per_state.argmax(axis=1)
        # the calls of each bin (its first few distinct events, in time order) name it in the hover
        calls: Dict[int, List[int]] = {}
        has_ev = self.event[small] >= 0
        if has_ev.any():
            pairs = np.unique(np.stack([inv[has_ev], self.event[small][has_ev]], axis=1), axis=0)
            for k, ev in pairs.tolist():
                lst = calls.setdefault(k, [])
                if len(lst) <= CALLS_NAMED:
                    lst.append(ev)
        for k in range(len(uniq)):
            lane = int(uniq[k] // width)
            shares = per_state[k] / max(per_state[k].sum(), 1e-300)
            parts = ", ".join(f"{100 * shares[j]:.0f}% {LABELS[STATE_NAMES[j]]}"
                              for j in range(len(STATE_NAMES)) if shares[j] >= 0.005)
            evs = calls.get(k, [])
            named = ", ".join(self.label(e) for e in evs[:CALLS_NAMED]) + (" ..." if len(evs) > CALLS_NAMED else "")
            n = int(counts[k])
            call = (f"{n} interval{'s' if n != 1 else ''} ({parts})" + (f": {named}" if named else "")
                    + "; zoom in for each")
            self._add_segment(seg, lo[k], max(hi[k], lo[k] + px), lane, int(dom[k]), -1, counts[k],
                              hi[k] - lo[k], nbytes=int(ev_nbytes[k]), call=call)

    def _window_arrows(self, s0: float, s1: float, max_arrows: int
                       ) -> Tuple[Dict[str, list], Dict[str, list], int, bool]:
        """The arrows crossing ``[s0, s1]`` as line and head columns, thinned to about ``max_arrows``
        (per sender/receiver pair and time bin; 0: all); returns ``(arrows, heads, in window, thinned)``."""
        a_lo = np.minimum(self.a_t0, self.a_t1)
        a_hi = np.maximum(self.a_t0, self.a_t1)
        aidx = np.nonzero((a_hi >= s0) & (a_lo <= s1))[0]
        a_in = len(aidx)
        thinned = bool(max_arrows and a_in > max_arrows)
        if thinned:
            pairs = self.a_src[aidx] * len(self.ranks) + self.a_dst[aidx]
            npairs = max(len(np.unique(pairs)), 1)
            bins_per_pair = max(max_arrows // npairs, 1)
            step = (s1 - s0) / bins_per_pair
            b = np.clip(((self.a_t0[aidx] - s0) / step).astype(np.int64), -1, bins_per_pair)
            _, keep = np.unique(pairs * (bins_per_pair + 2) + (b + 1), return_index=True)
            aidx = aidx[np.sort(keep)]
        arrows: Dict[str, list] = {"x0": [], "y0": [], "x1": [], "y1": []}
        heads: Dict[str, list] = {"x": [], "y": [], "marker": [], "call": []}
        for k in aidx.tolist():
            src, dst = int(self.a_src[k]), int(self.a_dst[k])
            down = dst > src
            y0 = src + (LANE_HALF if down else -LANE_HALF)
            y1 = dst - (LANE_HALF if down else -LANE_HALF)
            x0, x1 = float(self.a_t0[k]), float(self.a_t1[k])
            arrows["x0"].append(x0)
            arrows["y0"].append(y0)
            arrows["x1"].append(x1)
            arrows["y1"].append(y1)
            heads["x"].append(x1)
            heads["y"].append(y1)
            heads["marker"].append("inverted_triangle" if down else "triangle")
            send, recv = int(self.a_send[k]), int(self.a_recv[k])
            nbytes = int(self.trace.events[send, _COL["nbytes"]])
            heads["call"].append(f"{self.trace.op_label(send)} -> {self.trace.op_label(recv)}, "
                                 f"{_fmt_bytes(nbytes)}, {_fmt_s(max(x1 - x0, 0.0))} from send to receive end")
        return arrows, heads, a_in, thinned


def _lane_name(trace, r: int) -> str:
    """``rank R (HOST)`` where the trace knows rank R's host (:meth:`~.analysis.Trace.lane_name`), else ``rank R``."""
    name = getattr(trace, "lane_name", None)
    return name(r) if name is not None else f"rank {r}"


def timeline_columns(trace, window: Optional[Tuple[int, int]] = None, ranks: Optional[Sequence[int]] = None,
                     blocked: Optional[Sequence[Dict[str, Any]]] = None) -> TimelineColumns:
    """The timeline of ``trace`` as :class:`TimelineColumns`.

    ``window`` = (start_ns, end_ns) on the trace's clock extends every lane with compute before
    the first and after the last event (a notebook cell's span, a job's run); default: the trace's
    own span. ``ranks``: the lanes (default every rank). ``blocked``: waits in progress,
    ``[{"rank", "op", "peer", "since_ns"}]`` (a live job's ranks, see
    :meth:`nbmpi.workers.tracing.stream.JobTrace.waits`): that rank's lane shows a wait from
    ``since_ns`` to the window's end instead of compute. Vectorised: fast on 10^5 events.
    """
    lanes_ranks = list(range(trace.nranks)) if ranks is None else sorted(int(r) for r in ranks)
    lane_of = np.full(max(trace.nranks, max(lanes_ranks, default=0) + 1), -1, np.int64)
    lane_of[lanes_ranks] = np.arange(len(lanes_ranks))
    blocked = [dict(b) for b in (blocked or []) if int(b["rank"]) in lanes_ranks]
    t0, w0, w1 = _span_ns(trace, window, blocked)
    span = max(w1 - w0, 1) / 1e9
    cols = _state_segments(trace, lane_of, t0 - w0, lanes_ranks if ranks is not None else None)
    cols = _with_blocked(cols, blocked, lane_of, w0, span)
    st, s, e, ev, ln = _fill_compute(cols, len(lanes_ranks), span)
    sp, rp, src, dst, a_t0, a_t1 = _flow_arrows(trace, lane_of, st, s, e, ev)
    return TimelineColumns(trace=trace, ranks=lanes_ranks, duration_s=span, lane=ln, state=st, start=s, end=e,
                           event=ev, a_src=src, a_dst=dst, a_t0=a_t0, a_t1=a_t1, a_send=sp, a_recv=rp,
                           blocked=blocked, origin_ns=w0)


def _span_ns(trace, window: Optional[Tuple[int, int]], blocked: List[Dict[str, Any]]) -> Tuple[int, int, int]:
    """``(t0, w0, w1)``: the trace's first event time and the timeline's span on the trace's clock
    (the trace's own span, widened to ``window`` and to the start of every wait in ``blocked``)."""
    has_events = len(trace) > 0
    t0 = trace.t0 if has_events else 0
    t1 = trace.t1 if has_events else 0
    if window is not None:
        w0, w1 = int(window[0]), int(window[1])
        if not has_events:
            t0 = t1 = w0
        w0, w1 = min(w0, t0), max(w1, t1)
    else:
        w0, w1 = t0, t1
    for b in blocked:
        w1 = max(w1, int(b["since_ns"]))
    return t0, w0, w1


_Cols = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]   # state, start, end, event, lane


def _state_segments(trace, lane_of: np.ndarray, shift: int, ranks: Optional[List[int]] = None) -> _Cols:
    """The trace's state intervals of the ranks shown (``lane_of[rank] >= 0``; ``ranks``: only
    those are analysed, default all), in seconds from the timeline's start (``shift`` ns after the
    trace's first event); zero-length compute dropped."""
    if len(trace) > 0:
        a = trace.state_arrays(ranks=ranks)
        keep = lane_of[a["rank"]] >= 0
        st = a["state"][keep]
        s = (a["start"][keep] + shift) / 1e9
        e = (a["end"][keep] + shift) / 1e9
        ev = a["event"][keep]
        ln = lane_of[a["rank"][keep]]
        ok = ~((e <= s) & (st == 0))                    # zero-length compute says nothing
        st, s, e, ev, ln = st[ok], s[ok], e[ok], ev[ok], ln[ok]
    else:
        st = s = e = ev = ln = np.empty(0)
        st, ev, ln = st.astype(np.int64), ev.astype(np.int64), ln.astype(np.int64)
    return st, s, e, ev, ln


def _with_blocked(cols: _Cols, blocked: List[Dict[str, Any]], lane_of: np.ndarray, w0: int, span: float) -> _Cols:
    """Waits in progress: the lane of each ``blocked`` rank computes until its wait began, then waits
    until the end (event ``-2 - k`` for the k-th wait)."""
    st, s, e, ev, ln = cols
    extra_ln, extra_st, extra_s, extra_e, extra_ev = [], [], [], [], []
    for k, b in enumerate(blocked):
        lane = lane_of[int(b["rank"])]
        since = (int(b["since_ns"]) - w0) / 1e9
        mine = (ln == lane) & (st == 0) & (e > since)
        e = np.where(mine, np.maximum(since, s), e)
        extra_ln.append(lane), extra_st.append(1), extra_s.append(since), extra_e.append(span)
        extra_ev.append(-2 - k)
    if extra_ln:
        ok = ~((e <= s) & (st == 0))
        st, s, e, ev, ln = st[ok], s[ok], e[ok], ev[ok], ln[ok]
        st = np.concatenate([st, extra_st]).astype(np.int64)
        s = np.concatenate([s, extra_s])
        e = np.concatenate([e, extra_e])
        ev = np.concatenate([ev, extra_ev]).astype(np.int64)
        ln = np.concatenate([ln, extra_ln]).astype(np.int64)
    return st, s, e, ev, ln


def _fill_compute(cols: _Cols, nlanes: int, span: float) -> _Cols:
    """The segments sorted lane by lane in time order, with compute wherever a lane has nothing
    (before its first, between and after its last segment, up to ``span`` seconds)."""
    st, s, e, ev, ln = cols
    order = np.lexsort((s, ln))
    st, s, e, ev, ln = st[order], s[order], e[order], ev[order], ln[order]
    fill_ln, fill_s, fill_e = [], [], []
    for lane in range(nlanes):
        m = np.nonzero(ln == lane)[0]
        if len(m) == 0:
            fill_ln.append(lane), fill_s.append(0.0), fill_e.append(span)
            continue
        ends = np.maximum.accumulate(e[m])
        cursor = np.concatenate([[0.0], ends[:-1]])
        gap = s[m] > cursor + 1e-12
        fill_ln += [lane] * int(gap.sum())
        fill_s += cursor[gap].tolist()
        fill_e += s[m][gap].tolist()
        if ends[-1] < span:
            fill_ln.append(lane), fill_s.append(float(ends[-1])), fill_e.append(span)
    if fill_ln:
        ln = np.concatenate([ln, fill_ln]).astype(np.int64)
        st = np.concatenate([st, np.zeros(len(fill_ln), np.int64)])
        s = np.concatenate([s, fill_s])
        e = np.concatenate([e, fill_e])
        ev = np.concatenate([ev, np.full(len(fill_ln), -1, np.int64)])
        order = np.lexsort((s, ln))
        st, s, e, ev, ln = st[order], s[order], e[order], ev[order], ln[order]
    return st, s, e, ev, ln


def _flow_arrows(trace, lane_of: np.ndarray, st: np.ndarray, s: np.ndarray, e: np.ndarray, ev: np.ndarray
                 ) -> Tuple[np.ndarray, ...]:
    """``(send events, receive events, source lanes, destination lanes, t0, t1)`` of the arrows: from
    where each send's transfer starts to where the matching receive ends, in order of t0."""
    comm = (st == 2) & (ev >= 0)
    n = len(trace)
    c_start = np.full(n, np.nan)
    c_end = np.full(n, np.nan)
    c_start[ev[comm]] = s[comm]
    c_end[ev[comm]] = e[comm]
    if n > 0 and len(trace.flow_pairs):
        sp, rp = trace.flow_pairs[:, 0], trace.flow_pairs[:, 1]
        src, dst = lane_of[trace.ranks[sp]], lane_of[trace.ranks[rp]]
        ok = (src >= 0) & (dst >= 0) & ~np.isnan(c_start[sp]) & ~np.isnan(c_end[rp])
        sp, rp, src, dst = sp[ok], rp[ok], src[ok], dst[ok]
        order = np.argsort(c_start[sp], kind="stable")
        sp, rp, src, dst = sp[order], rp[order], src[order], dst[order]
        a_t0, a_t1 = c_start[sp], c_end[rp]
    else:
        sp = rp = src = dst = np.empty(0, np.int64)
        a_t0 = a_t1 = np.empty(0)
    return sp, rp, src, dst, a_t0, a_t1


# -- analysis ---------------------------------------------------------------------------------
def analysis(trace, window: Optional[Tuple[int, int]] = None,
             open_waits: Optional[Sequence[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """Per-rank time split, waits per call kind, traffic matrices and the straggler sentence.

    Over ``window`` = (start_ns, end_ns) (default: the trace's span, as
    :meth:`Trace.summary`): ``wait`` is time spent waiting for a partner, ``comm`` the rest of the
    time inside communication calls, ``compute`` everything else. Returns ``{"nranks",
    "window_s", "ranks": [{"rank", "compute_s", "comm_s", "wait_s", "compute_frac", "comm_frac",
    "wait_frac", "events", "wait_by_kind": {kind: s}}], "bytes", "messages", "unmatched", "events",
    "open_waits", "straggler": straggler(...)}``. ``open_waits``: calls the ranks are blocked in at the
    window's end (a live job's, or a job ended while they waited: :meth:`JobTrace.waits`), counted as
    wait up to the window's end (:func:`add_open_waits`), as the timeline draws them.
    """
    n = trace.nranks
    has = len(trace) > 0
    start, end, wait = trace.col("t_start"), trace.col("t_end"), trace.col("wait")
    dur = np.maximum(end - start, 0)
    w_eff = np.minimum(np.maximum(wait, 0), dur)
    kinds = trace.col("kind")
    sums = []
    for r in range(n):
        m = trace.ranks == r
        by_kind: Dict[int, float] = {}
        if m.any():
            ks, inv = np.unique(kinds[m], return_inverse=True)
            by_kind = dict(zip(ks.tolist(), np.bincount(inv, weights=w_eff[m].astype(np.float64)).tolist()))
        sums.append((int(dur[m].sum()), int(w_eff[m].sum()), int(m.sum()), by_kind))
    nbytes = np.zeros((n, n), np.int64)
    msgs = np.zeros((n, n), np.int64)
    if has:
        sends = np.nonzero(trace.col("dir") == DIR_SEND)[0]
        peer = trace.col("peer")[sends]
        ok = (peer >= 0) & (peer < n)
        np.add.at(nbytes, (trace.ranks[sends][ok], peer[ok]), trace.col("nbytes")[sends][ok])
        np.add.at(msgs, (trace.ranks[sends][ok], peer[ok]), 1)
    return analysis_from_sums(n, (trace.t0, trace.t1) if has else None, window, sums, nbytes, msgs,
                              int(trace.unmatched) if has else 0, trace.kind_name, open_waits)


def analysis_from_sums(nranks: int, span: Optional[Tuple[int, int]], window: Optional[Tuple[int, int]],
                       sums: Sequence[Tuple[int, int, int, Dict[int, float]]], nbytes: np.ndarray, msgs: np.ndarray,
                       unmatched: int, kind_name: Callable[[int], str],
                       open_waits: Optional[Sequence[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """:func:`analysis` from per-rank totals (what the index build adds up block by block):
    ``span`` the events' ``(t0, t1)`` ns (None: no events); ``sums[r]`` = ``(time in calls ns,
    wait ns, events, {kind code: wait ns})``; ``nbytes`` / ``msgs`` the traffic matrices;
    ``kind_name`` names a kind code. Local, cheap (no per-event work)."""
    n = nranks
    has = span is not None
    t0, t1 = (int(span[0]), int(span[1])) if has else (0, 0)
    if window is not None:
        t0, t1 = (min(int(window[0]), t0), max(int(window[1]), t1)) if has else (int(window[0]), int(window[1]))
    total = max(t1 - t0, 0) / 1e9
    ranks = []
    events = 0
    for r in range(n):
        dur_ns, wait_ns, count, kinds = sums[r]
        events += count
        w = float(wait_ns) / 1e9
        c = float(dur_ns) / 1e9 - w
        comp = max(total - c - w, 0.0)
        by_kind = {kind_name(int(k)): float(v) / 1e9 for k, v in sorted(kinds.items()) if v > 0}
        ranks.append(dict(rank=r, compute_s=comp, comm_s=c, wait_s=w,
                          compute_frac=comp / total if total else 0.0, comm_frac=c / total if total else 0.0,
                          wait_frac=w / total if total else 0.0, events=int(count), wait_by_kind=by_kind))
    out = dict(nranks=n, window_s=total, ranks=ranks, bytes=np.asarray(nbytes).tolist(),
               messages=np.asarray(msgs).tolist(), unmatched=int(unmatched) if has else 0, events=int(events),
               open_waits=0)
    if open_waits:
        add_open_waits(out, open_waits, t1)
    out["straggler"] = straggler(out)
    return out


def add_open_waits(an: Dict[str, Any], waits: Sequence[Dict[str, Any]], end_ns: int) -> Dict[str, Any]:
    """Count waits still open at ``end_ns`` into an :func:`analysis` (in place; returns it).

    ``waits``: ``[{"rank", "op", "peer", "since_ns"}]`` (:meth:`JobTrace.waits`), ``end_ns`` the
    end of the analysis' window on the same clock. Each open wait adds ``end_ns - since_ns``
    (clipped to the window) to that rank's ``wait_s`` and to ``wait_by_kind`` under the call's kind
    (``take`` for ``take(src=0)``), taken from its compute time; the fractions follow and
    ``open_waits`` counts them. The straggler sentence is not recomputed (call :func:`straggler`).
    """
    total = an["window_s"]
    start_ns = int(end_ns) - int(round(total * 1e9))
    for w in waits:
        r = int(w["rank"])
        if not 0 <= r < len(an["ranks"]):
            continue
        since = min(max(int(w["since_ns"]), start_ns), int(end_ns))
        add = (int(end_ns) - since) / 1e9
        row = an["ranks"][r]
        add = min(add, row["compute_s"])    # never more than the time the lane shows as not communicating
        kind = str(w["op"]).split("(", 1)[0].split("[", 1)[0] or str(w["op"])
        row["wait_s"] += add
        row["compute_s"] -= add
        row["wait_by_kind"][kind] = row["wait_by_kind"].get(kind, 0.0) + add
        if total:
            row["wait_frac"] = row["wait_s"] / total
            row["compute_frac"] = row["compute_s"] / total
        an["open_waits"] = an.get("open_waits", 0) + 1
        an.setdefault("blocked_ranks", []).append(r)
    return an


def straggler(an: Dict[str, Any], ratio_at_least: float = 1.2, wait_at_least: float = 0.05) -> Dict[str, Any]:
    """Name the straggler of an :func:`analysis` in one sentence.

    The straggler is the rank that computes longest; it is named when it computes at least
    ``ratio_at_least`` times as long as the median of the others and the others wait at least
    ``wait_at_least`` of the time: "rank 1 computes 2.3x longer; the others wait 38% of the time
    in allreduce" (the call kind in which the others wait longest). Otherwise the sentence says the
    ranks are balanced and which rank waits most. Returns ``{"rank" (or None), "ratio",
    "others_wait_frac", "kind", "sentence"}``.
    """
    ranks = an["ranks"]
    n = len(ranks)
    none = dict(rank=None, ratio=None, others_wait_frac=None, kind=None)
    if an.get("events", 1) == 0 and not an.get("open_waits"):
        return dict(none, sentence="no communication was recorded")
    if n < 2:
        return dict(none, sentence="one rank: no other rank to wait for")
    compute = np.array([r["compute_s"] for r in ranks])
    wait_frac = np.array([r["wait_frac"] for r in ranks])
    s = int(compute.argmax())
    others = [r for r in range(n) if r != s]
    ref = float(np.median(compute[others]))
    ratio = compute[s] / ref if ref > 0 else float("inf")
    others_wait = float(wait_frac[others].mean())
    by_kind: Dict[str, float] = {}
    for r in others:
        for k, v in ranks[r]["wait_by_kind"].items():
            by_kind[k] = by_kind.get(k, 0.0) + v
    kind = max(by_kind, key=by_kind.get) if by_kind else None
    who = f"rank {others[0]} waits" if n == 2 else "the others wait"
    blocked = set(an.get("blocked_ranks") or [])
    if blocked and len(blocked) == n:   # nobody computes: say so before any straggler arithmetic
        w = int(wait_frac.argmax())
        wk = ranks[w]["wait_by_kind"]
        k = max(wk, key=wk.get) if wk else None
        sentence = (f"every rank is blocked in a communication call (see below); rank {w} waits most, "
                    f"{100 * wait_frac[w]:.0f}% of the time" + (f" in {k}" if k else ""))
        return dict(none, others_wait_frac=others_wait, kind=k, sentence=sentence)
    if ratio >= ratio_at_least and others_wait >= wait_at_least and s not in blocked:
        how = f"{ratio:.1f}x longer" if np.isfinite(ratio) else f"{compute[s]:.3g} s while the others compute nothing"
        sentence = f"rank {s} computes {how}; {who} {100 * others_wait:.0f}% of the time" + (
            f" in {kind}" if kind else "")
        return dict(rank=s, ratio=float(ratio), others_wait_frac=others_wait, kind=kind, sentence=sentence)
    w = int(wait_frac.argmax())
    spread = (compute.max() / compute.min() - 1) if compute.min() > 0 else float("inf")
    balanced = (f"no straggler: the ranks compute within {100 * spread:.0f}% of each other"
                if np.isfinite(spread) else "no straggler")
    if wait_frac[w] >= wait_at_least:
        wk = ranks[w]["wait_by_kind"]
        k = max(wk, key=wk.get) if wk else None
        sentence = f"{balanced}; rank {w} waits most, {100 * wait_frac[w]:.0f}% of the time" + (f" in {k}" if k else "")
    else:
        sentence = f"{balanced}; no rank waits more than {100 * wait_at_least:.0f}% of the time"
    return dict(rank=None, ratio=float(ratio) if np.isfinite(ratio) else None, others_wait_frac=others_wait,
                kind=kind, sentence=sentence)


def blocked_sentences(blocked: Sequence[Dict[str, Any]], nranks: int) -> List[str]:
    """Where each rank of a live job waits and for whom, one sentence per rank, e.g.
    ``"rank 1 has waited 12.3 s in take(src=0) for rank 0, which is not blocked in a communication
    call"``. ``blocked``: :meth:`JobTrace.waits` rows. Ranks not in ``blocked`` are not listed."""
    by_rank = {int(b["rank"]): b for b in blocked}
    out = []
    for r in sorted(by_rank):
        b = by_rank[r]
        peer = b.get("peer")
        text = f"rank {r} has waited {_fmt_s(float(b.get('for_s', 0.0)))} in {b['op']}"
        if peer is not None and 0 <= int(peer) < nranks:
            p = int(peer)
            text += f" for rank {p}"
            if p in by_rank:
                text += f", which itself waits in {by_rank[p]['op']}" + (
                    f" for rank {by_rank[p]['peer']}" if by_rank[p].get("peer") is not None else "")
                if by_rank[p].get("peer") == r:
                    text += " (they wait for each other: a deadlock)"
            else:
                text += ", which is not blocked in a communication call (computing, or stuck elsewhere)"
        else:
            text += " (a collective: every rank of it must arrive)"
        out.append(text)
    return out


def _blend(lo: str, hi: str, f: float) -> str:
    a = [int(lo[i:i + 2], 16) for i in (1, 3, 5)]
    b = [int(hi[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(round(x + (y - x) * f)):02x}" for x, y in zip(a, b))


# -- Bokeh --------------------------------------------------------------------------------------
def figure_sources(view: Dict[str, Any], an: Dict[str, Any]) -> Dict[str, Dict[str, list]]:
    """The column data of every named source of :func:`bokeh_figure` (:data:`SOURCES`) for a
    :meth:`TimelineColumns.view` and an :func:`analysis`; the dashboard sets them on the page's
    figure as they are."""
    n = an["nranks"]
    mat: Dict[str, list] = {k: [] for k in ("sender", "receiver", "bytes", "messages", "text", "color")}
    peak = max((max(row) for row in an["bytes"]), default=0) or 1
    for i in range(n):
        for j in range(n):
            b, m = an["bytes"][i][j], an["messages"][i][j]
            mat["sender"].append(str(i))
            mat["receiver"].append(str(j))
            mat["bytes"].append(_fmt_bytes(b))
            mat["messages"].append(int(m))
            mat["text"].append(f"{_fmt_bytes(b)}\n{m} msg" if m else "")
            mat["color"].append(_blend("#deebf7", "#4a90d0", (b / peak) ** 0.5) if b else "#f4f4f4")
    frac: Dict[str, list] = {k: [] for k in ("rank", "compute", "comm", "wait", "label", "wait_text")}
    for r in an["ranks"]:
        frac["rank"].append(str(r["rank"]))
        frac["compute"].append(100 * r["compute_frac"])
        frac["comm"].append(100 * r["comm_frac"])
        frac["wait"].append(100 * r["wait_frac"])
        frac["label"].append(f"rank {r['rank']}")
        frac["wait_text"].append(f"wait {100 * r['wait_frac']:.1f}%")
    return {"nbmpi_segments": view["segments"], "nbmpi_arrows": view["arrows"], "nbmpi_heads": view["heads"],
            "nbmpi_matrix": mat, "nbmpi_fractions": frac}


def bokeh_figure(view: Dict[str, Any], an: Dict[str, Any], title: Optional[str] = None, width: int = 1100,
                 x_label: str = "seconds from the start", backend: str = "webgl"):
    """The interactive figure (a Bokeh layout) of a view and its analysis.

    Timeline: one lane per rank (rank 0 on top), compute / wait / communication as WebGL quads,
    an arrow per message from the send to the end of its receive; hover shows rank, state, call,
    peer, bytes and duration; x-only pan, wheel zoom and box zoom; Bokeh's own level of detail
    during interaction (``backend="canvas"`` draws the timeline without WebGL: faster where WebGL
    is emulated in software). Below: the sender x receiver matrix (bytes and messages) and the per-rank
    compute / communication / wait percentages. Every source is named (:data:`SOURCES`), the x
    range ``nbmpi_x``; a change of the x range calls ``window.nbmpiRangeChanged(start, end)`` and
    the reset tool ``window.nbmpiReset()`` when the page defines them (the dashboard fetches that
    window's detail then; in a notebook they do nothing).
    """
    from bokeh.layouts import column, row
    from bokeh.models import ColumnDataSource

    src = figure_sources(view, an)
    cds = {name: ColumnDataSource(data=src[name], name=name) for name in SOURCES}
    tl = _timeline_figure(cds, view, title, width, x_label, backend)
    mx, mwidth, cell = _matrix_figure(cds, an)
    fr = _fractions_figure(cds, an, width, mwidth, cell)
    return column(tl, row(mx, fr, sizing_mode="stretch_width"), sizing_mode="stretch_width", name="nbmpi_figure")


def _timeline_figure(cds: Dict[str, Any], view: Dict[str, Any], title: Optional[str], width: int, x_label: str,
                     backend: str):
    """The timeline panel of :func:`bokeh_figure` (lanes, arrows, hovers, legend, range hooks) on the
    named sources ``cds``."""
    from bokeh.models import CustomJS, FixedTicker, HoverTool, Legend, LegendItem, Range1d
    from bokeh.plotting import figure

    ranks = view["meta"]["ranks"]
    n = len(ranks)
    meta = view["meta"]
    x_range = Range1d(meta["start_s"], meta["end_s"], name="nbmpi_x")
    tl = figure(title=title, x_range=x_range, y_range=Range1d(n - 0.5, -0.5), height=150 + (46 if n <= 16 else 18) * n,
                width=width,
                sizing_mode="stretch_width", tools="xpan,xwheel_zoom,xbox_zoom,reset,save",
                active_scroll="xwheel_zoom", active_drag="xpan", output_backend=backend, name="nbmpi_timeline",
                x_axis_label=x_label, toolbar_location="above", lod_threshold=2000, lod_factor=10,
                lod_interval=300, lod_timeout=500)
    tl.yaxis.ticker = FixedTicker(ticks=list(range(n)))
    lanes = meta.get("lanes") or [f"rank {r}" for r in ranks]
    tl.yaxis.major_label_overrides = {k: lanes[k] for k in range(n)}
    tl.ygrid.grid_line_color = None
    tl.xaxis.formatter.use_scientific = False
    quads = tl.quad(left="left", right="right", bottom="bottom", top="top", fill_color="color", line_color=None,
                    source=cds["nbmpi_segments"], name="nbmpi_quads")
    # segments, not multi_line: BokehJS draws WebGL multi_lines one call per line (measured: ~450 ms a
    # frame for 500 arrows in software WebGL); segments fall back to the canvas and take a few ms
    tl.segment(x0="x0", y0="y0", x1="x1", y1="y1", source=cds["nbmpi_arrows"], line_color="#333333",
               line_width=1, line_alpha=0.6, name="nbmpi_arrow_lines")
    heads = tl.scatter(x="x", y="y", marker="marker", size=5, fill_color="#333333", line_color=None,
                       source=cds["nbmpi_heads"], name="nbmpi_arrow_heads")
    tl.add_tools(HoverTool(renderers=[quads], tooltips=[
        ("rank", "@rank"), ("state", "@state"), ("call", "@call"), ("peer", "@peer"), ("bytes", "@bytes"),
        ("duration", "@duration"), ("start", "@left{0.000000} s")]))
    tl.add_tools(HoverTool(renderers=[heads], tooltips=[("message", "@call")]))
    legend_quads = [tl.quad(left=[0], right=[0], bottom=[0], top=[0], fill_color=COLORS[s], line_color=None,
                            visible=True) for s in ("compute", "comm", "wait")]
    tl.add_layout(Legend(items=[LegendItem(label=LABELS[s], renderers=[q])
                                for s, q in zip(("compute", "comm", "wait"), legend_quads)],
                         orientation="horizontal", location="top_right"), "above")
    hook = CustomJS(args=dict(r=x_range), code="if (window.nbmpiRangeChanged) window.nbmpiRangeChanged(r.start, r.end)")
    x_range.js_on_change("start", hook)
    x_range.js_on_change("end", hook)
    tl.js_on_event("reset", CustomJS(code="if (window.nbmpiReset) window.nbmpiReset()"))
    return tl


def _matrix_figure(cds: Dict[str, Any], an: Dict[str, Any]) -> Tuple[Any, int, int]:
    """The sender x receiver panel of :func:`bokeh_figure`; returns ``(figure, its width, cell size)``."""
    from bokeh.models import HoverTool, LabelSet
    from bokeh.plotting import figure

    names = [str(i) for i in range(an["nranks"])]
    cell = 70 if an["nranks"] <= 8 else max(600 // an["nranks"], 8)
    mwidth = max(110 + cell * an["nranks"], 280)
    mx = figure(title="bytes sent, sender -> receiver", x_range=names, y_range=list(reversed(names)),
                width=mwidth, height=90 + max(cell * an["nranks"], 120), tools="save",
                toolbar_location=None, name="nbmpi_matrix_figure", x_axis_label="receiver", y_axis_label="sender")
    cells = mx.rect(x="receiver", y="sender", width=0.95, height=0.95, fill_color="color", line_color="#cccccc",
                    source=cds["nbmpi_matrix"], name="nbmpi_matrix_cells")
    if an["nranks"] <= 8:   # cells too small for text beyond that: the hover tells
        mx.add_layout(LabelSet(x="receiver", y="sender", text="text", source=cds["nbmpi_matrix"], text_align="center",
                               text_baseline="middle", text_font_size="10px"))
    mx.add_tools(HoverTool(renderers=[cells], tooltips=[("from rank", "@sender"), ("to rank", "@receiver"),
                                                        ("bytes", "@bytes"), ("messages", "@messages")]))
    mx.grid.grid_line_color = None
    return mx, mwidth, cell


def _fractions_figure(cds: Dict[str, Any], an: Dict[str, Any], width: int, mwidth: int, cell: int):
    """The per-rank compute / communication / wait panel of :func:`bokeh_figure`, beside the matrix
    (``mwidth`` pixels, ``cell`` pixels a rank)."""
    from bokeh.models import HoverTool, LabelSet, Range1d
    from bokeh.plotting import figure

    lanes = [str(r["rank"]) for r in an["ranks"]]
    fr = figure(title="time per rank (%)", y_range=list(reversed(lanes)), x_range=Range1d(0, 118),
                width=max(width - mwidth - 40, 360), height=90 + max(cell * an["nranks"], 120),
                tools="save", toolbar_location=None, name="nbmpi_fractions_figure", y_axis_label="rank")
    bars = fr.hbar_stack(["compute", "comm", "wait"], y="rank", height=0.6, source=cds["nbmpi_fractions"],
                         color=[COLORS["compute"], COLORS["comm"], COLORS["wait"]], line_color=None)
    fr.add_tools(HoverTool(renderers=bars, tooltips=[("rank", "@rank"), ("compute %", "@compute{0.0}"),
                                                     ("communication %", "@comm{0.0}"), ("wait %", "@wait{0.0}")]))
    fr.add_layout(LabelSet(x=100, y="rank", text="wait_text", source=cds["nbmpi_fractions"], text_align="left",
                           text_baseline="middle", x_offset=4, text_font_size="11px"))
    fr.ygrid.grid_line_color = None
    return fr


def bokeh_item(view: Dict[str, Any], an: Dict[str, Any], **kw) -> Dict[str, Any]:
    """:func:`bokeh_figure` as Bokeh's JSON item (``Bokeh.embed.embed_item(item, element_id)`` draws it)."""
    from bokeh.embed import json_item

    return json_item(bokeh_figure(view, an, **kw))


# -- plain data and static SVG --------------------------------------------------------------------
def timeline_data(trace, window: Optional[Tuple[int, int]] = None, ranks: Optional[Sequence[int]] = None,
                  width: Optional[int] = None) -> Dict[str, Any]:
    """The timeline of ``trace`` as plain data.

    ``window`` = (start_ns, end_ns) on the trace's clock (e.g. a notebook cell's start and end)
    extends every lane with compute before the first and after the last event; default: the
    trace's own span. ``ranks``: the lanes to draw (default all ranks of the trace). ``width``
    (pixels): merge segments narrower than a pixel (level of detail, see
    :meth:`TimelineColumns.view`); default exact.

    Returns ``{"duration_s", "lanes": [{"rank", "segments": [{"state", "start_s", "end_s",
    "label"}], "wait_s", "wait_pct"}], "arrows": [{"src", "dst", "t_send_s", "t_recv_s",
    "label"}], "messages", "unmatched", "events"}``; times in seconds from the window's start;
    ``messages`` counts every matched message (``arrows`` may be thinned when ``width`` is given).
    """
    cols = timeline_columns(trace, window=window, ranks=ranks)
    an = analysis(trace)
    lanes = []
    if width:
        v = cols.view(width=width)
        sg = v["segments"]
        by_rank: Dict[int, list] = {r: [] for r in cols.ranks}
        inv = {LABELS[k]: k for k in LABELS}
        for i in range(len(sg["left"])):
            by_rank[sg["rank"][i]].append(dict(state=inv[sg["state"][i]], start_s=sg["left"][i],
                                               end_s=sg["right"][i], label=sg["call"][i]))
        for r in by_rank:
            by_rank[r].sort(key=lambda x: x["start_s"])
        arrows = []
        va = v["arrows"]
        for x0, y0, x1, y1, call in zip(va["x0"], va["y0"], va["x1"], va["y1"], v["heads"]["call"]):
            src, dst = cols.ranks[int(round(y0))], cols.ranks[int(round(y1))]
            arrows.append(dict(src=src, dst=dst, t_send_s=x0, t_recv_s=x1, label=call))
    else:
        by_rank = {r: [] for r in cols.ranks}
        labels: Dict[int, str] = {}
        for ln, st, s, e, ev in zip(cols.lane.tolist(), cols.state.tolist(), cols.start.tolist(), cols.end.tolist(),
                                    cols.event.tolist()):
            lab = labels.get(ev)
            if lab is None:
                lab = labels[ev] = cols.label(ev)
            by_rank[cols.ranks[ln]].append(dict(state=STATE_NAMES[st], start_s=s, end_s=e, label=lab))
        arrows = [dict(src=cols.ranks[int(a)], dst=cols.ranks[int(b)], t_send_s=float(t0), t_recv_s=float(t1),
                       label=f"{trace.op_label(int(sp))} -> {trace.op_label(int(rp))}")
                  for a, b, t0, t1, sp, rp in zip(cols.a_src, cols.a_dst, cols.a_t0, cols.a_t1, cols.a_send,
                                                  cols.a_recv)]
    for r in cols.ranks:
        wait_s = an["ranks"][r]["wait_s"] if len(trace) else 0.0
        lanes.append(dict(rank=r, segments=by_rank[r], wait_s=wait_s, wait_pct=100.0 * wait_s / cols.duration_s))
    return dict(duration_s=cols.duration_s, lanes=lanes, arrows=arrows, messages=int(len(cols.a_t0)),
                unmatched=int(trace.unmatched) if len(trace) else 0, events=len(trace))


def render_svg(data: Dict[str, Any], width: int = 900, lane_height: int = 22) -> str:
    """Draw :func:`timeline_data` output as one ``<svg>`` element (string)."""
    left, right, top = 64, 90, 8
    gap = 10
    n = len(data["lanes"])
    plot_w = max(width - left - right, 100)
    axis_y = top + n * (lane_height + gap)
    height = axis_y + 30
    dur = max(data["duration_s"], 1e-12)

    def x(t: float) -> float:
        return left + plot_w * (t / dur)

    y_of = {}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           '<defs><marker id="nbmpi-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
           'markerHeight="6" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#222"/>'
           '</marker></defs>']
    for k, lane in enumerate(data["lanes"]):
        y = top + k * (lane_height + gap)
        y_of[lane["rank"]] = y
        out.append(f'<text x="{left - 6}" y="{y + lane_height * 0.7:.1f}" text-anchor="end">rank {lane["rank"]}'
                   '</text>')
        for sg in lane["segments"]:
            x0, x1 = x(sg["start_s"]), x(sg["end_s"])
            w = max(x1 - x0, 0.6)
            tip = html.escape(f'rank {lane["rank"]} {LABELS[sg["state"]]}: {sg["label"]}, '
                              f'{_fmt_s(sg["end_s"] - sg["start_s"])} at {_fmt_s(sg["start_s"])}')
            out.append(f'<rect class="nbmpi-{sg["state"]}" x="{x0:.2f}" y="{y}" width="{w:.2f}" '
                       f'height="{lane_height}" fill="{COLORS[sg["state"]]}"><title>{tip}</title></rect>')
        out.append(f'<text x="{left + plot_w + 6}" y="{y + lane_height * 0.7:.1f}">wait {lane["wait_pct"]:.1f}%'
                   '</text>')
    for a in data["arrows"]:
        ys, yd = y_of[a["src"]], y_of[a["dst"]]
        down = yd > ys
        y0 = ys + (lane_height if down else 0)
        y1 = yd + (0 if down else lane_height)
        out.append(f'<line class="nbmpi-arrow" x1="{x(a["t_send_s"]):.2f}" y1="{y0}" x2="{x(a["t_recv_s"]):.2f}" '
                   f'y2="{y1}" stroke="#222" stroke-width="1" marker-end="url(#nbmpi-arrow)">'
                   f'<title>{html.escape(a["label"])}</title></line>')
    out.append(f'<line x1="{left}" y1="{axis_y}" x2="{left + plot_w}" y2="{axis_y}" stroke="#888"/>')
    for i in range(5):
        t = dur * i / 4
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 14}" text-anchor="middle" fill="#555">{_fmt_s(t)}</text>')
    out.append("</svg>")
    return "".join(out)


def _legend_html() -> str:
    return " ".join(
        f'<span style="display:inline-block;width:10px;height:10px;background:{COLORS[k]};'
        f'margin:0 3px 0 10px"></span>{LABELS[k]}' for k in ("compute", "comm", "wait"))


def _title(data: Dict[str, Any]) -> str:
    return (f"timeline: {len(data['lanes'])} ranks, {_fmt_s(data['duration_s'])}, "
            f"{data['events']} communication events, {data.get('messages', len(data['arrows']))} messages")


def _note(data: Dict[str, Any]) -> str:
    if data["events"] == 0:
        return '<div style="color:#555">no communication was recorded in this window</div>'
    if data["unmatched"]:
        return f'<div style="color:#555">{data["unmatched"]} events had no matching partner</div>'
    return ""


def render_html(trace, window: Optional[Tuple[int, int]] = None, ranks: Optional[Sequence[int]] = None,
                title: Optional[str] = None, width: int = 900) -> str:
    """The static timeline of ``trace`` as an HTML fragment: title, legend, straggler sentence and
    SVG (self-contained, no script; segments narrower than a pixel merged)."""
    data = timeline_data(trace, window=window, ranks=ranks, width=width)
    head = html.escape(title or _title(data))
    sentence = html.escape(analysis(trace, window=window)["straggler"]["sentence"])
    return (f'<div class="nbmpi-timeline"><div style="font-family:sans-serif;font-size:12px">'
            f'<b>{head}</b>{_legend_html()}</div><div style="font-family:sans-serif;font-size:12px">{sentence}</div>'
            f'{_note(data)}{render_svg(data, width=width)}</div>')


# -- notebook -------------------------------------------------------------------------------------
_EMBED_JS = """
(function () {
  var root = document.getElementById("%(id)s");
  if (!root) return;
  var tries = 0;
  function draw() {
    if (!(window.Bokeh && window.Bokeh.embed)) {
      if (++tries < 100) setTimeout(draw, 100);
      return;
    }
    var item = JSON.parse(document.getElementById("%(id)s-item").textContent);
    window.Bokeh.embed.embed_item(item, "%(id)s-bokeh").then(function () {
      root.querySelector(".nbmpi-static").style.display = "none";
    });
  }
  draw();
})();
"""


def notebook_bundle(trace, window: Optional[Tuple[int, int]] = None, ranks: Optional[Sequence[int]] = None,
                    title: Optional[str] = None, width: int = 900) -> Dict[str, str]:
    """The notebook output of a timeline: a MIME bundle with ``text/html`` (the Bokeh figure,
    drawn once BokehJS is on the page, over the static SVG it replaces: a notebook saved without
    a kernel or not trusted keeps the SVG), ``image/svg+xml`` (the static figure alone) and
    ``text/plain`` (its title and the straggler sentence). Traces of at most :data:`EXACT_LIMIT`
    segments are embedded exactly, larger ones at 4,000 pixels of detail."""
    cols = timeline_columns(trace, window=window, ranks=ranks)
    an = analysis(trace, window=window)
    view = cols.view(width=0 if cols.segments <= EXACT_LIMIT else 4000)
    data = timeline_data(trace, window=window, ranks=ranks, width=width)
    svg = render_svg(data, width=width)
    head = title or _title(data)
    sentence = an["straggler"]["sentence"]
    fid = f"nbmpi-tl-{uuid.uuid4().hex[:12]}"
    item = json.dumps(bokeh_item(view, an, title=None, width=width + 200,
                                 x_label="seconds from the start of the window")).replace("</", "<\\/")
    text_html = (f'<div class="nbmpi-timeline" id="{fid}"><div style="font-family:sans-serif;font-size:12px">'
                 f'<b>{html.escape(head)}</b>{_legend_html()}</div>'
                 f'<div style="font-family:sans-serif;font-size:12px">{html.escape(sentence)}</div>{_note(data)}'
                 f'<div class="nbmpi-static">{svg}</div><div id="{fid}-bokeh"></div>'
                 f'<script type="application/json" id="{fid}-item">{item}</script>'
                 f'<script type="text/javascript">{_EMBED_JS % {"id": fid}}</script></div>')
    return {"text/plain": f"{head}\n{sentence}", "text/html": text_html, "image/svg+xml": svg}


_BOKEHJS_LOADED = False


def bokehjs_html() -> str:
    """BokehJS (from the installed bokeh wheel, inline: no network) as one ``<script>`` element."""
    from bokeh.resources import Resources

    js = "\n".join(Resources(mode="inline", components=["bokeh", "bokeh-gl"]).js_raw)
    js = re.sub(r"</(script)", r"<\\/\1", js, flags=re.IGNORECASE)   # nothing may end the script tag early
    return f'<script type="text/javascript">{js}</script>'


def load_bokehjs() -> None:
    """Put BokehJS into the notebook once per kernel, as ONE output holding it once
    (:func:`bokehjs_html` in ``text/html``; Bokeh's own ``load_notebook`` publishes the 1.5 MB
    bundle twice, as JavaScript and as its own MIME type); :func:`show` calls it. Must run inside
    an IPython kernel."""
    global _BOKEHJS_LOADED
    if _BOKEHJS_LOADED:
        return
    from IPython.display import display

    display({"text/html": bokehjs_html(), "text/plain": "(BokehJS loaded for the nbmpi timelines)"}, raw=True)
    _BOKEHJS_LOADED = True


def show(trace, window: Optional[Tuple[int, int]] = None, ranks: Optional[Sequence[int]] = None,
         title: Optional[str] = None, width: int = 900) -> None:
    """Display the timeline of ``trace`` in the running notebook (:func:`notebook_bundle`, BokehJS
    loaded first if needed). Called by ``%%distributed --timeline``; usable on any :class:`Trace`,
    e.g. a controller job's (``Client.job_trace``)."""
    from IPython.display import display

    load_bokehjs()
    display(notebook_bundle(trace, window=window, ranks=ranks, title=title, width=width), raw=True)
