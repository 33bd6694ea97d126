"""The index of a finished job's streamed trace: built once, in its own process, when the job ends;
any window of the timeline is then read from its files in time and memory independent of the trace's size.

Build (:func:`build`, or ``python -m nbmpi.workers.tracing.index TRACE_DIR NRANKS [--chrome] [--nice]``,
what the controller runs when a job ends, whatever its outcome): joins the ranks' stream files
(:mod:`~nbmpi.workers.tracing.stream`), attributes waits, and writes ``TRACE_DIR/index/``, in
memory bounded whatever the trace's size (:mod:`.index_build`: a few chunks of rows at a time):

* ``meta.json``: ``{"format", "state": "ok" | "unreadable", "reason", "nranks", "kinds", "events",
  "segments", "lane_off", "duration_s", "origin_ns", "version", "waits", "analysis", "arrows",
  "arrow_span_s", "done", "dropped", "clock_error_ns", "clock_shift_ns", "clock_violations", "hosts"}``
  (``hosts[r]``: rank r's hostname, for the lane names; ``clock_shift_ns[r]``: what the clock repair of
  :class:`~.analysis.Trace` added to rank r's times, which every file holds shifted; ``clock_violations``:
  messages whose receive still ends before its send starts); written last (a directory without it is
  not an index);
* per segment of the timeline (lane by lane, in time order; what
  :func:`~nbmpi.workers.tracing.timeline.timeline_columns` makes): ``seg.npy``, records
  (:data:`~.index_build.SEG`) of ``start`` / ``end`` (s from the job's start), ``state``, ``event``
  and ``cum`` (time the lane spent in each state before the segment), so a view reads what it shows
  of a segment in one piece and the time per state between any two instants is two binary searches;
  ``start.npy`` and ``endmax.npy`` (running maximum of ``end`` within the lane), searched;
* per message arrow, sorted by ``t0``: ``a_src``, ``a_dst``, ``a_t0``, ``a_t1``, ``a_send``, ``a_recv``;
* ``start.skel.npy``, ``endmax.skel.npy``, ``a_t0.skel.npy``: every 1024th value of those sorted
  files (:func:`~.npy_column.save_with_skeleton`), so a search reads one small block per key;
* ``events.npy`` / ``ranks.npy``: the events with their attributed waits and who recorded them
  (labels of what a view shows; :meth:`TraceIndex.save_npz`);
* with ``--chrome``, when the ranks did not write them (a failed, cancelled or timed-out job) and
  there are at most :data:`CHROME_EVENTS_LIMIT` events:
  ``trace.json`` (Chrome/Perfetto, streamed to disk, open waits as ``wait`` slices up to the end) and
  ``summary.json`` next to the index.

Files that are not what the ranks write give ``state: "unreadable"`` with the reason (exit status 3).

Read (:class:`TraceIndex`): :meth:`TraceIndex.view` answers what
:meth:`~nbmpi.workers.tracing.timeline.TimelineColumns.view` answers, reading only the window's rows
(at most a few per lane and pixel) with bounded ``pread`` calls (:mod:`.npy_column`), never a memory
map: a long-lived reader holds what it asked for, not the pages of the files it touched.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import index_build, timeline
from .analysis import STATE_NAMES, Trace, op_label
from .npy_column import BLOCK_BYTES, NpyColumn
from .stream import TraceUnreadable, has_stream, read_job_trace

__all__ = ["FORMAT", "INDEX_DIR", "build", "index_dir", "TraceIndex", "EventTable", "lowest_priority", "main"]

FORMAT = 2
INDEX_DIR = "index"
#: Largest window drawn from its segments one by one (more: one row per lane and pixel).
EXACT_ROWS = 40_000
#: A Chrome trace is written for at most this many events: it is made from the joined trace (held whole in
#: memory, about 0.8 kB an event with its JSON), so the build stays within ~200 MB; beyond, the dashboard's
#: ``trace.npz`` holds every event (and Perfetto's JSON import gives up near 1 M events anyway).
CHROME_EVENTS_LIMIT = 200_000
#: Exit status of the build when the files are unreadable.
UNREADABLE_EXIT = 3


def index_dir(trace_dir: os.PathLike) -> Path:
    """Where the index of the trace in ``trace_dir`` lives."""
    return Path(trace_dir) / INDEX_DIR


# -- build ---------------------------------------------------------------------------------------------
def _write_chrome(trace_dir: Path, jt) -> None:
    """``trace.json`` and ``summary.json`` of a job whose ranks did not write them (see the module
    docstring), each written to a temporary name and renamed (removed if the write stops half-way)."""
    trace = jt.trace
    origin = trace.t0 if len(trace) else jt.start_ns
    extra = [dict(ph="X", name=f"wait: {w['op']} (still blocked at the end)", cat="wait", pid=int(w["rank"]), tid=0,
                  ts=(int(w["since_ns"]) - origin) / 1e3, dur=max(int(jt.now_ns) - int(w["since_ns"]), 0) / 1e3,
                  args=dict(op=w["op"], peer=w["peer"], open=True)) for w in jt.waits()]
    tmp = trace_dir / ".trace.json.tmp"
    try:
        trace.save_chrome(str(tmp), extra=extra)
        os.replace(tmp, trace_dir / "trace.json")
        summary = trace.summary()
        summary["open_waits"] = jt.waits()
        tmp = trace_dir / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary))
        os.replace(tmp, trace_dir / "summary.json")
    finally:   # stopped half-way (SIGTERM, a full disk): no unfinished file stays
        tmp.unlink(missing_ok=True)


def build(trace_dir: os.PathLike, nranks: int, chrome: bool = False,
          chunk: int = index_build.CHUNK_ROWS) -> Optional[Dict[str, Any]]:
    """Build the index of the streamed trace in ``trace_dir`` (``nranks`` ranks), replacing any
    older one; with ``chrome``, also ``trace.json`` / ``summary.json`` when they do not exist.
    Returns the meta (``state`` ``"unreadable"`` with the ``reason`` when the files are not what
    the ranks write), or None when no rank streamed. Local files only, in bounded memory
    (:mod:`.index_build`, ``chunk`` rows at a time) except the Chrome trace (the joined trace of at
    most :data:`CHROME_EVENTS_LIMIT` events); run it in its own process (the controller does, :func:`main`)."""
    trace_dir = Path(trace_dir)
    final = index_dir(trace_dir)
    tmp = trace_dir / f".{INDEX_DIR}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    jt = None
    try:
        try:
            if not has_stream(trace_dir, nranks):
                shutil.rmtree(tmp, ignore_errors=True)
                return None
            meta, jt = index_build.write_index(trace_dir, nranks, tmp, chunk)
            meta.update(format=FORMAT, state="ok", reason=None, built_at=time.time())
        except TraceUnreadable as exc:
            meta = dict(format=FORMAT, state="unreadable", reason=str(exc), nranks=nranks, built_at=time.time())
        except (ValueError, IndexError, OverflowError, MemoryError) as exc:   # garbage that passed the checks
            meta = dict(format=FORMAT, state="unreadable", nranks=nranks, built_at=time.time(),
                        reason=f"the trace files could not be joined ({type(exc).__name__}: {exc})")
        (tmp / "meta.json").write_text(json.dumps(meta))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if chrome and jt is not None and meta["state"] == "ok" and not (trace_dir / "trace.json").exists():
        if meta["events"] <= CHROME_EVENTS_LIMIT:
            _write_chrome(trace_dir, read_job_trace(trace_dir, nranks))
        else:
            print(f"no trace.json: {meta['events']} events is more than a Chrome trace viewer opens "
                  f"({CHROME_EVENTS_LIMIT}); the dashboard's trace.npz holds them all", file=sys.stderr)
    return meta


def lowest_priority() -> List[str]:
    """Put the calling process at the lowest CPU priority of its scheduling group: ``nice`` 19 and
    ``SCHED_IDLE`` (it runs only when no other task of its group wants the CPU, and any waking task of
    the group preempts it at once). With ``kernel.sched_autogroup_enabled`` the group is the session:
    start the process in a session of its own, else the CPU it uses is charged to its parent's
    session and delays the parent's wakeups whatever its own priority (its own session then competes
    as any other session does, so it is not starved on a busy machine). The process itself calls it,
    at its start; non-blocking. Returns what could not be set (each says why)."""
    failed = []
    os.nice(19 - os.nice(0))
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError) as exc:
        failed.append(f"SCHED_IDLE: {exc}")
    return failed


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signal.SIGTERM)   # so that build()'s clean-up runs


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m nbmpi.workers.tracing.index TRACE_DIR NRANKS [--chrome] [--nice]``: :func:`build`
    (``--nice``: at the lowest CPU priority, :func:`lowest_priority`, so the process that started it
    keeps its CPU); prints the state in one line. Exit 0 (built, or nothing streamed), 3 (unreadable),
    2 (usage), 143 (SIGTERM: the build stops and removes its unfinished files; the index stays as it was)."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = list(sys.argv[1:] if argv is None else argv)
    chrome = "--chrome" in args
    if "--nice" in args:
        lowest_priority()
    args = [a for a in args if a not in ("--chrome", "--nice")]
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m nbmpi.workers.tracing.index TRACE_DIR NRANKS [--chrome] [--nice]", file=sys.stderr)
        return 2
    meta = build(args[0], int(args[1]), chrome=chrome)
    if meta is None:
        print("no rank streamed a trace")
        return 0
    print(f"{meta['state']}: {meta.get('events', 0)} events" if meta["state"] == "ok"
          else f"unreadable: {meta['reason']}")
    return 0 if meta["state"] == "ok" else UNREADABLE_EXIT


# -- read ----------------------------------------------------------------------------------------------
class _CachedRows:
    """The rows of an events file read for one view, each once (a view asks one row for its label,
    its peer and its size): ``rows[i]``, ``rows[i, j]``, ``rows[idx, j]``, :meth:`prefetch`."""

    def __init__(self, col: NpyColumn):
        self.col = col
        self.shape = col.shape
        self._rows: Dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.col)

    def prefetch(self, idx) -> None:
        """Read the rows ``idx`` (not yet read) together."""
        want = [i for i in np.unique(np.asarray(idx, np.int64)).tolist() if i not in self._rows]
        if want:
            self._rows.update(zip(want, self.col.take(np.array(want, np.int64))))

    def __getitem__(self, key):
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], (int, np.integer)):
            return self[key[0]][key[1]]
        if isinstance(key, (int, np.integer)):
            i = int(key) + (len(self.col) if int(key) < 0 else 0)
            row = self._rows.get(i)
            if row is None:
                row = self._rows[i] = self.col[i]
            return row
        return self.col[key]


class EventTable:
    """The indexed events (an :class:`~.npy_column.NpyColumn`: rows read when asked for) with what a
    timeline view asks of a trace: ``events`` rows, ``len()``, :meth:`op_label`."""

    def __init__(self, events: NpyColumn, kinds: List[str], hosts: Optional[List[str]] = None):
        self.events = _CachedRows(events)
        self.kinds = kinds
        self.hosts = list(hosts or [])

    def __len__(self) -> int:
        return int(self.events.shape[0])

    def op_label(self, i: int) -> str:
        """Human label of event ``i``, e.g. ``take(src=0)``."""
        return op_label(self.events[int(i)], self.kinds)

    #: Rank ``r``'s lane name from :attr:`hosts` (``rank R (HOST)``), the trace's own method.
    lane_name = Trace.lane_name


class TraceIndex:
    """A built index, opened read-only (:meth:`open`). Thread-safe: it only reads."""

    def __init__(self, path: Path, meta: Dict[str, Any]):
        self.path = path
        self.meta = meta
        self._arrays: Dict[str, np.ndarray] = {}

    @classmethod
    def open(cls, trace_dir: os.PathLike) -> Optional["TraceIndex"]:
        """The index of ``trace_dir``; None when none was built (or it is of another format)."""
        path = index_dir(trace_dir)
        try:
            meta = json.loads((path / "meta.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return cls(path, meta) if isinstance(meta, dict) and meta.get("format") == FORMAT else None

    @property
    def readable(self) -> bool:
        """False when the trace files were not what the ranks write (see :attr:`reason`)."""
        return self.meta.get("state") == "ok"

    @property
    def reason(self) -> Optional[str]:
        """Why the trace is unreadable (None when it is readable)."""
        return self.meta.get("reason")

    @property
    def analysis(self) -> Dict[str, Any]:
        """:func:`~nbmpi.workers.tracing.timeline.analysis` of the whole run, open waits counted."""
        return self.meta["analysis"]

    @property
    def waits(self) -> List[Dict[str, Any]]:
        """The waits open when the job ended (:meth:`JobTrace.waits`)."""
        return self.meta["waits"]

    @property
    def version(self) -> int:
        """The version of the trace that was indexed."""
        return int(self.meta["version"])

    def a(self, name: str) -> NpyColumn:
        """The index file ``name`` (opened once; read in bounded pieces, never mapped)."""
        col = self._arrays.get(name)
        if col is None:
            col = self._arrays.setdefault(name, NpyColumn(self.path / f"{name}.npy"))
        return col

    def close(self) -> None:
        """Close the index's files (idempotent; the object answers again after, reopening them)."""
        cols, self._arrays = self._arrays, {}
        for col in cols.values():
            col.close()

    def table(self) -> EventTable:
        """The events for labels (rows read when asked for)."""
        return EventTable(self.a("events"), self.meta["kinds"], self.meta.get("hosts"))

    def save_npz(self, path: os.PathLike) -> None:
        """Write the indexed trace as a :meth:`Trace.save` file (uncompressed; :meth:`Trace.load` reads
        it), copying the event columns in blocks of at most :data:`~.npy_column.BLOCK_BYTES`."""
        small = dict(nranks=np.asarray(self.meta["nranks"]), kinds=np.array(self.meta["kinds"]),
                     dropped=np.array(self.meta["dropped"], np.int64),
                     clock_error_ns=np.array(self.meta["clock_error_ns"], np.int64),
                     hosts=np.array(self.meta.get("hosts") or [""] * int(self.meta["nranks"]), dtype=str))
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name in ("events", "ranks"):
                col = self.a(name)
                with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array_header_2_0(f, dict(descr=np.lib.format.dtype_to_descr(col.dtype),
                                                                 fortran_order=False, shape=col.shape))
                    step = max(BLOCK_BYTES // max(col.row_bytes, 1), 1)
                    for i in range(0, len(col), step):
                        f.write(col.read(i, i + step).tobytes())
            for name, value in small.items():
                with zf.open(f"{name}.npy", "w") as f:
                    np.lib.format.write_array(f, value, allow_pickle=False)

    def view(self, start_s: Optional[float] = None, end_s: Optional[float] = None, width: int = 1200,
             max_arrows: int = 2000) -> Dict[str, Any]:
        """What :meth:`TimelineColumns.view` answers for the window ``[start_s, end_s]`` (default the
        whole run) at ``width`` pixels, reading only that window's rows: a window of at most
        :data:`EXACT_ROWS` segments is passed to that very method; a larger one gets one row per lane
        and pixel (a pixel inside one segment shows that segment, a pixel over several shows their
        dominant state, shares and first calls), ``width=0`` then meaning 20,000 pixels. Blocking
        (local reads); what it holds is proportional to the window's rows shown, not to the trace."""
        dur = float(self.meta["duration_s"])
        s0 = 0.0 if start_s is None else float(start_s)
        s1 = dur if end_s is None else float(end_s)
        if s1 <= s0:
            s1 = s0 + 1e-9
        off = self.meta["lane_off"]
        start, endmax = self.a("start"), self.a("endmax")
        spans = []
        for lane in range(len(off) - 1):
            a, b = off[lane], off[lane + 1]
            i0 = int(endmax.searchsorted(s0, "left", a, b))
            i1 = int(start.searchsorted(s1, "right", a, b))
            spans.append((i0, max(i1, i0)))
        rows = sum(i1 - i0 for i0, i1 in spans)
        if rows <= EXACT_ROWS:
            return self._exact_view(spans, s0, s1, width, max_arrows)
        return self._binned_view(spans, s0, s1, width or 20_000, max_arrows, rows)

    def _columns(self, spans, arrows: np.ndarray) -> "timeline.TimelineColumns":
        lane = np.concatenate([np.full(i1 - i0, k, np.int64) for k, (i0, i1) in enumerate(spans)])
        take = np.concatenate([np.arange(i0, i1) for i0, i1 in spans]).astype(np.int64)
        blocked = [dict(w) for w in self.meta["waits"]]
        a = self.a
        rows = a("seg")[take]
        return timeline.TimelineColumns(
            trace=self.table(), ranks=list(range(self.meta["nranks"])), duration_s=float(self.meta["duration_s"]),
            lane=lane, state=rows["state"].astype(np.int64), start=rows["start"], end=rows["end"],
            event=rows["event"], a_src=a("a_src")[arrows].astype(np.int64),
            a_dst=a("a_dst")[arrows].astype(np.int64), a_t0=a("a_t0")[arrows], a_t1=a("a_t1")[arrows],
            a_send=a("a_send")[arrows], a_recv=a("a_recv")[arrows], blocked=blocked,
            origin_ns=int(self.meta["origin_ns"]))

    def _arrow_rows(self, s0: float, s1: float, limit: int) -> Tuple[np.ndarray, int]:
        """Indices of the arrows crossing ``[s0, s1]`` (about ``4 * limit`` evenly spread ones when
        more start in it; 0: no limit) and how many cross it (those starting in it, when spread)."""
        t0, span = self.a("a_t0"), float(self.meta["arrow_span_s"])   # |t1 - t0| <= span for every arrow
        lo = int(t0.searchsorted(s0 - span, "left"))
        hi = int(t0.searchsorted(s1 + span, "right"))
        spread = bool(limit and hi - lo > 4 * limit)
        idx = np.unique(np.linspace(lo, hi - 1, 4 * limit).astype(np.int64)) if spread else np.arange(lo, hi)
        a0, a1 = t0[idx], self.a("a_t1")[idx]
        out = idx[(np.maximum(a0, a1) >= s0) & (np.minimum(a0, a1) <= s1)]   # as TimelineColumns.view
        return out, (hi - lo if spread else len(out))

    def _exact_view(self, spans, s0, s1, width, max_arrows) -> Dict[str, Any]:
        arrows, n_in = self._arrow_rows(s0, s1, max_arrows)
        view = self._columns(spans, arrows).view(s0, s1, width=width, max_arrows=max_arrows)
        view["meta"]["arrows_in_window"] = int(n_in)
        return view

    def _binned_view(self, spans, s0, s1, width, max_arrows, rows) -> Dict[str, Any]:
        px = (s1 - s0) / width
        edges = s0 + px * np.arange(width + 1)
        off = self.meta["lane_off"]
        cols = self._columns([(0, 0)] * len(spans), np.empty(0, np.int64))
        seg: Dict[str, list] = {k: [] for k in ("left", "right", "bottom", "top", "rank", "state", "color", "call",
                                               "peer", "bytes", "duration", "count")}
        for lane in range(len(off) - 1):
            if off[lane + 1] > off[lane]:
                self._binned_lane(seg, cols, lane, off[lane], off[lane + 1], edges, px)
        arrows, n_in = self._arrow_rows(s0, s1, max_arrows)
        view = self._columns([(0, 0)] * len(spans), arrows).view(s0, s1, width=0, max_arrows=max_arrows)
        view["segments"] = seg
        view["meta"].update(in_window=int(rows), shown=len(seg["left"]), merged=True, width=int(width),
                            arrows_in_window=int(n_in))
        return view

    def _binned_lane(self, seg, cols, lane: int, a: int, b: int, edges: np.ndarray, px: float) -> None:
        """The rows of lane ``lane`` (segments ``[a, b)``) for the pixels between ``edges``: one
        read of the few segment records each pixel starts at."""
        start, endmax, segs = self.a("start"), self.a("endmax"), self.a("seg")
        width = len(edges) - 1
        at, after = endmax.searchsorted_both(edges, a, b)
        at, first = np.minimum(at, b - 1), np.minimum(after[:-1], b - 1)
        last = np.maximum(start.searchsorted(edges[1:], "left", a, b) - 1, a)
        # the rows each pixel names: its first segment and the next few (their calls); with the
        # segment at each edge, read together (one piece per pixel)
        near = np.minimum(first[:, None] + np.arange(timeline.CALLS_NAMED + 1), b - 1)
        rows = segs.take(np.concatenate([at, near.ravel()]))
        r_at, r_near = rows[:len(at)], rows[len(at):].reshape(near.shape)
        # time spent in each state up to each edge: before segment `at`, plus its part before the edge
        c = r_at["cum"].copy()
        st_at = r_at["state"].astype(np.int64)
        inside = np.clip(np.minimum(edges, r_at["end"]) - r_at["start"], 0, None)
        c[np.arange(len(at)), st_at] += inside
        per = np.maximum(np.diff(c, axis=0), 0)
        ev_near = r_near["event"]
        cols.trace.events.prefetch(ev_near[ev_near >= 0])
        f_start, f_end, f_state = r_near["start"][:, 0], r_near["end"][:, 0], r_near["state"][:, 0]
        table = cols.trace
        shown = -1
        for k in range(width):
            f, g = int(first[k]), int(last[k])
            if g < f:
                continue
            if g == f:      # the pixel lies in one segment: that segment, once
                if f != shown:
                    shown = f
                    self._add_segment(seg, cols, lane, f_start[k], f_end[k], f_state[k], ev_near[k, 0])
                continue
            self._add_bin(seg, cols, table, lane, edges[k], px, per[k], g - f + 1, ev_near[k, :g - f + 1])

    @staticmethod
    def _add_segment(seg, cols, lane, left, right, state, ev) -> None:
        ev = int(ev)
        peer, nbytes = cols._peer_bytes(ev)
        st = STATE_NAMES[int(state)]
        _append(seg, float(left), float(right), lane, cols.ranks[lane], st, cols.label(ev), peer,
                timeline._fmt_bytes(nbytes) if nbytes else "", float(right - left), 1)

    @staticmethod
    def _add_bin(seg, cols, table, lane, left, px, per, count, events) -> None:
        total = max(float(per.sum()), 1e-300)
        parts = ", ".join(f"{100 * per[j] / total:.0f}% {timeline.LABELS[STATE_NAMES[j]]}"
                          for j in range(len(STATE_NAMES)) if per[j] / total >= 0.005)
        evs = [int(e) for e in dict.fromkeys(np.asarray(events).tolist()) if e >= 0]
        named = ", ".join(cols.label(e) for e in evs[:timeline.CALLS_NAMED]) + (
            " ..." if len(evs) > timeline.CALLS_NAMED else "")
        call = f"{count} intervals ({parts})" + (f": {named}" if named else "") + "; zoom in for each"
        _append(seg, float(left), float(left + px), lane, cols.ranks[lane], STATE_NAMES[int(per.argmax())], call, "",
                "", total, count)


def _append(seg, left, right, lane, rank, state, call, peer, nbytes, dur_s, count) -> None:
    seg["left"].append(left)
    seg["right"].append(right)
    seg["bottom"].append(lane - timeline.LANE_HALF)
    seg["top"].append(lane + timeline.LANE_HALF)
    seg["rank"].append(rank)
    seg["state"].append(timeline.LABELS[state])
    seg["color"].append(timeline.COLORS[state])
    seg["call"].append(call)
    seg["peer"].append(peer)
    seg["bytes"].append(nbytes)
    seg["duration"].append(timeline._fmt_s(dur_s))
    seg["count"].append(int(count))


if __name__ == "__main__":
    sys.exit(main())
