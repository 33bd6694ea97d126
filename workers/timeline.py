"""The per-rank timeline figure of a trace, as self-contained SVG/HTML.

Built only from :class:`~nbmpi.workers.trace_analysis.Trace` data —
:meth:`Trace.states` (non-overlapping compute / comm / wait intervals per
rank), :meth:`Trace.summary` (per-rank wait seconds) and ``Trace.flow_pairs``
(matched send -> receive) — so the notebook (``%%distributed --timeline``)
and the controller's dashboard show the same figure. No plotting library:
plain SVG with ``<title>`` tooltips, embeddable in any HTML page.

* :func:`timeline_data`: the figure as plain data (lanes, segments, arrows,
  wait percentages), JSON-serialisable;
* :func:`render_svg` / :func:`render_html`: that data drawn.

One lane per rank (rank order); compute, communication and wait in distinct
colours; an arrow from each send (where its transfer starts) to the end of
the matching receive; the per-rank wait percentage at the end of each lane.
"""
from __future__ import annotations

import html
from typing import Any, Dict, List, Optional, Sequence, Tuple

COLORS = {"compute": "#9ccc9c", "comm": "#4a7fc1", "wait": "#e0584f"}
LABELS = {"compute": "compute", "comm": "communication", "wait": "wait"}


def timeline_data(trace, window: Optional[Tuple[int, int]] = None,
                  ranks: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """The timeline of ``trace`` as plain data.

    ``window`` = (start_ns, end_ns) on the trace's clock (e.g. a notebook
    cell's start and end) extends every lane with compute before the first
    and after the last event; default: the trace's own span. ``ranks``: the
    lanes to draw (default all ranks of the trace).

    Returns ``{"duration_s", "lanes": [{"rank", "segments": [{"state",
    "start_s", "end_s", "label"}], "wait_s", "wait_pct"}], "arrows":
    [{"src", "dst", "t_send_s", "t_recv_s", "label"}], "unmatched"}``;
    times in seconds from the window's start.
    """
    lanes_ranks = list(range(trace.nranks)) if ranks is None else sorted(int(r) for r in ranks)
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
    span_ns = max(w1 - w0, 1)
    shift = t0 - w0  # states() times are relative to trace.t0
    segs: Dict[int, List[Dict[str, Any]]] = {r: [] for r in lanes_ranks}
    comm_start: Dict[int, float] = {}
    comm_end: Dict[int, float] = {}
    for st in (trace.states() if has_events else []):
        r = st["rank"]
        if r not in segs:
            continue
        s, e = (st["start"] + shift) / 1e9, (st["end"] + shift) / 1e9
        if e <= s and st["state"] == "compute":
            continue
        segs[r].append(dict(state=st["state"], start_s=s, end_s=e, label=st["label"]))
        if st["event"] >= 0 and st["state"] == "comm":
            comm_start[st["event"]] = s
            comm_end[st["event"]] = e
    summary = trace.summary() if has_events else None
    lanes = []
    for r in lanes_ranks:
        lane = segs[r]
        cursor = 0.0
        filled: List[Dict[str, Any]] = []
        for sg in lane:
            if sg["start_s"] > cursor + 1e-12:
                filled.append(dict(state="compute", start_s=cursor, end_s=sg["start_s"], label="compute"))
            filled.append(sg)
            cursor = max(cursor, sg["end_s"])
        if cursor < span_ns / 1e9:
            filled.append(dict(state="compute", start_s=cursor, end_s=span_ns / 1e9, label="compute"))
        wait_s = summary["ranks"][r]["wait_s"] if summary else 0.0
        lanes.append(dict(rank=r, segments=filled, wait_s=wait_s, wait_pct=100.0 * wait_s / (span_ns / 1e9)))
    arrows = []
    ranks_of = trace.ranks
    for s_idx, r_idx in (trace.flow_pairs.tolist() if has_events else []):
        src, dst = int(ranks_of[s_idx]), int(ranks_of[r_idx])
        if src in segs and dst in segs and s_idx in comm_start and r_idx in comm_end:
            arrows.append(dict(src=src, dst=dst, t_send_s=comm_start[s_idx], t_recv_s=comm_end[r_idx],
                               label=f"{trace.op_label(s_idx)} -> {trace.op_label(r_idx)}"))
    return dict(duration_s=span_ns / 1e9, lanes=lanes, arrows=arrows,
                unmatched=int(trace.unmatched) if has_events else 0, events=len(trace))


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


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


def render_html(trace, window: Optional[Tuple[int, int]] = None, ranks: Optional[Sequence[int]] = None,
                title: Optional[str] = None, width: int = 900) -> str:
    """The timeline of ``trace`` as an HTML fragment: title, legend, SVG (self-contained)."""
    data = timeline_data(trace, window=window, ranks=ranks)
    legend = " ".join(
        f'<span style="display:inline-block;width:10px;height:10px;background:{COLORS[k]};'
        f'margin:0 3px 0 10px"></span>{LABELS[k]}' for k in ("compute", "comm", "wait"))
    head = html.escape(title or f"timeline: {len(data['lanes'])} ranks, {_fmt_s(data['duration_s'])}, "
                                f"{data['events']} communication events, {len(data['arrows'])} messages")
    note = ""
    if data["events"] == 0:
        note = '<div style="color:#555">no communication was recorded in this window</div>'
    elif data["unmatched"]:
        note = f'<div style="color:#555">{data["unmatched"]} events had no matching partner</div>'
    return (f'<div class="nbmpi-timeline"><div style="font-family:sans-serif;font-size:12px">'
            f'<b>{head}</b>{legend}</div>{note}{render_svg(data, width=width)}</div>')
