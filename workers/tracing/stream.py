"""Live per-rank trace files of a controller job: each rank streams its new events to disk while it runs,
and the controller joins the files into one :class:`~nbmpi.workers.tracing.analysis.Trace` at any moment.

Writer (:class:`TraceStreamer`, started by :mod:`nbmpi.workers.launch.rank_entry` when ``NBMPI_TRACE_OUT``
is set): a daemon thread of each rank wakes every ``interval`` seconds, takes the rows its tracer
recorded since the last time with :meth:`Tracer.snapshot` (no flush, no write to the tracer, no MPI
call: the thread level is ``funneled``) and appends them, shifted onto rank 0's clock by the tracer's
offset, to ``rank-R.events``; then it rewrites ``rank-R.live.json`` (atomically) with what the rank
is blocked in right now (:data:`nbmpi.workers.core.waiting.current`). :meth:`TraceStreamer.stop`, called by
the rank's main thread after the program, writes the rest and marks the
rank ``done``.

Files, in the job's trace directory, per rank ``R``:

* ``rank-R.events``: append-only rows of :data:`~nbmpi.workers.tracing.tracer.FIELDS` (little-endian int64,
  ``NF`` columns), times in ns on rank 0's clock; a reader ignores a trailing partial row;
* ``rank-R.live.json``: ``{"rank", "size", "pid", "host", "kinds", "rows", "dropped", "clock_error_ns",
  "start_ns", "now_ns", "time", "waiting", "done"}`` where ``start_ns`` is when the streamer started and
  ``now_ns`` the time of this write (both rank 0's clock), ``host`` the rank's hostname (the trace's lane
  names: ``rank R (HOST)``), ``time`` the Unix time of this write and
  ``waiting`` ``{"op", "peer", "since_ns"}`` or null.

Reader (:func:`read_job_trace`): the ranks' files as a :class:`JobTrace` (the trace, each rank's live
state, a version that changes whenever anything new was written); files that are not what the ranks
write raise :class:`TraceUnreadable`.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..core import waiting
from .tracer import FIELDS, NF, Tracer, kind_names

#: Seconds between two writes of the streaming thread (``NBMPI_TRACE_STREAM_INTERVAL``).
DEFAULT_INTERVAL = 0.5
_T_START, _T_END = FIELDS.index("t_start"), FIELDS.index("t_end")
_ROW_BYTES = 8 * NF


def events_path(out_dir: Path, rank: int) -> Path:
    """The append-only event file of ``rank`` in ``out_dir``."""
    return Path(out_dir) / f"rank-{rank}.events"


def live_path(out_dir: Path, rank: int) -> Path:
    """The live state file of ``rank`` in ``out_dir``."""
    return Path(out_dir) / f"rank-{rank}.live.json"


class TraceStreamer:
    """Streams one rank's tracer to ``out_dir`` from a daemon thread (see the module docstring).

    Create and :meth:`start` it on the rank's main thread after :func:`nbmpi.workers.tracing.startup.init`
    (the tracer's clock offset is known then); :meth:`stop` it on the same thread at the end. Local:
    no communication, ever.
    """

    def __init__(self, tracer: Tracer, out_dir: os.PathLike, interval: float = DEFAULT_INTERVAL, since: int = 0):
        """``since``: the first tracer row to stream (``tracer.mark()`` streams only what is recorded
        from now on, e.g. one job on a pool whose tracer holds earlier cells and jobs)."""
        if interval <= 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval}")
        self.tracer = tracer
        self.rank = tracer.rank
        self.size = tracer.size
        self.out_dir = Path(out_dir)
        self.interval = float(interval)
        self.sent = int(since)  # rows of the tracer already written (or not to be written)
        self.rows = 0          # rows in the file
        self.start_ns = time.perf_counter_ns() + tracer.offset_ns
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()   # one writer at a time (thread, then stop())
        self._kinds: List[str] = []
        self.host = socket.gethostname()

    def start(self) -> "TraceStreamer":
        """Create the files and start the thread. Returns self."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        events_path(self.out_dir, self.rank).write_bytes(b"")
        self._write(done=False)
        self._thread = threading.Thread(target=self._run, name=f"nbmpi-trace-stream-{self.rank}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._write(done=False)
            except Exception:  # noqa: BLE001 - a full disk must not end the rank; stop() reports
                pass

    def stop(self, open_wait: Optional[tuple] = None) -> None:
        """Stop the thread and write everything the tracer holds (call this from the rank's main thread,
        which owns the tracer); the rank is marked done. ``open_wait`` (``(op, peer, t_start_ns)`` as in
        :data:`nbmpi.workers.core.waiting.interrupted`): the program was interrupted in that wait, so the
        last state shows it still open up to now, as for a rank that was killed in it (not done)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self.interval + 5)
        self._write(done=open_wait is None, cur=open_wait)

    def _write(self, done: bool, cur: Optional[tuple] = None) -> None:
        with self._lock:
            tr = self.tracer
            if tr.n < self.sent:    # the tracer was cleared: its rows start again at 0
                self.sent = 0
            rows = tr.snapshot(self.sent)
            if len(rows):
                off = tr.offset_ns
                rows[:, _T_START] += off
                rows[:, _T_END] += off
                with open(events_path(self.out_dir, self.rank), "ab") as f:
                    f.write(rows.astype("<i8", copy=False).tobytes())
                self.sent += len(rows)
                self.rows += len(rows)
            cur = cur or waiting.current
            if len(self._kinds) != len(kind_names()):
                self._kinds = kind_names()
            state = dict(rank=self.rank, size=self.size, pid=os.getpid(), host=self.host, kinds=self._kinds,
                         rows=self.rows,
                         dropped=int(tr.dropped), clock_error_ns=int(tr.offset_err_ns), start_ns=self.start_ns,
                         now_ns=time.perf_counter_ns() + tr.offset_ns, time=time.time(),
                         waiting=None if cur is None or done else dict(op=str(cur[0]), peer=cur[1],
                                                                       since_ns=int(cur[2]) + tr.offset_ns),
                         done=done)
            path = live_path(self.out_dir, self.rank)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, path)


def start_streaming(out_dir: os.PathLike, from_now: bool = False) -> Optional[TraceStreamer]:
    """Start a :class:`TraceStreamer` of this rank's tracer into ``out_dir`` (every
    ``NBMPI_TRACE_STREAM_INTERVAL`` s, default :data:`DEFAULT_INTERVAL`); None when tracing is off.
    ``from_now``: stream only the events recorded from now on (a job on a pool whose tracer holds
    earlier cells and jobs). Call it on the rank's main thread; raises ``OSError`` when the files
    cannot be created."""
    from .tracer import get_tracer

    tracer = get_tracer()
    if not tracer.enabled:
        return None
    raw = os.environ.get("NBMPI_TRACE_STREAM_INTERVAL", "").strip()
    try:
        interval = float(raw) if raw else DEFAULT_INTERVAL
    except ValueError:
        interval = DEFAULT_INTERVAL
    return TraceStreamer(tracer, out_dir, interval=interval if interval > 0 else DEFAULT_INTERVAL,
                         since=tracer.mark() if from_now else 0).start()


@dataclass
class JobTrace:
    """The streamed trace of a job as read at one moment.

    ``trace``: every rank's events so far (waits attributed between what is there);
    ``live``: each rank's last live state (None for a rank that has not started streaming);
    ``version``: a checksum of each rank's row count, current wait, done flag and, while it runs,
    the time of its last write (it changes whenever a rank wrote new events, started or stopped
    waiting, finished, or, running, wrote again: a running job's timeline grows with time);
    ``start_ns`` / ``now_ns``: the earliest streamer start and the latest write (rank 0's clock).
    """
    trace: Any
    live: List[Optional[Dict[str, Any]]]
    version: int
    start_ns: int
    now_ns: int

    @property
    def done(self) -> bool:
        """True when every rank finished streaming (its program ended)."""
        return all(s is not None and s.get("done") for s in self.live)

    def waits(self) -> List[Dict[str, Any]]:
        """Ranks blocked right now: ``[{"rank", "op", "peer", "since_ns", "for_s"}]`` (``for_s`` up to
        that rank's last write)."""
        out = []
        for s in self.live:
            if s and s.get("waiting") and not s.get("done"):
                w = s["waiting"]
                out.append(dict(rank=s["rank"], op=w["op"], peer=w["peer"], since_ns=int(w["since_ns"]),
                                for_s=max(int(s["now_ns"]) - int(w["since_ns"]), 0) / 1e9))
        return out


class TraceUnreadable(ValueError):
    """A job's trace files are not what the ranks write (garbage, a foreign format, a truncated
    state file): the message says which file and what is wrong."""


#: Largest plausible span of one job's trace (ns): 60 days.
MAX_SPAN_NS = 60 * 86400 * 10**9
_C = {name: i for i, name in enumerate(FIELDS)}


def check_rows(rows: np.ndarray, rank: int, what: str) -> None:
    """Raise :class:`TraceUnreadable` unless ``rows`` (``(n, NF)`` int64 of ``rank``) look like
    tracer records: a known direction, kind and peer in range, ``t_end >= t_start``, sizes not
    negative, a plausible span. Vectorised, reads each column once; ``what`` names the file."""
    if not len(rows):
        return
    d, k, p = rows[:, _C["dir"]], rows[:, _C["kind"]], rows[:, _C["peer"]]
    t0, t1 = rows[:, _C["t_start"]], rows[:, _C["t_end"]]
    bad = []
    if ((d < 0) | (d > 2)).any():
        bad.append("a direction other than 0, 1, 2")
    if ((k < 0) | (k >= 1 << 16)).any():
        bad.append("an event kind out of range")
    if ((p < -1) | (p >= 1 << 24)).any():
        bad.append("a peer rank out of range")
    if (t1 < t0).any():
        bad.append("events that end before they start")
    if (rows[:, _C["nbytes"]] < 0).any():
        bad.append("negative sizes")
    if not bad and int(t1.max()) - int(t0.min()) > MAX_SPAN_NS:
        bad.append("times spread over more than 60 days")
    if bad:
        raise TraceUnreadable(f"{what} of rank {rank} is not a trace the ranks wrote: it holds {', '.join(bad)}")


def load_state(path: Path, rank: int) -> Optional[Dict[str, Any]]:
    """The live state of ``rank`` from ``path``; None when the file does not exist. Raises
    :class:`TraceUnreadable` when it is not the JSON object :class:`TraceStreamer` writes."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        state = json.loads(raw)
        ok = (isinstance(state, dict) and state.get("rank") == rank
              and all(isinstance(state.get(k), int) for k in ("start_ns", "now_ns", "rows"))
              and isinstance(state.get("kinds", []), list)
              and all(isinstance(x, str) for x in state.get("kinds", []))
              and (state.get("waiting") is None or (isinstance(state["waiting"], dict)
                                                    and isinstance(state["waiting"].get("since_ns"), int))))
    except (ValueError, RecursionError):
        ok = False
    if not ok:
        raise TraceUnreadable(f"{path.name} is not the live state file of rank {rank} "
                              f"(not the JSON object the trace streamer writes)")
    return state


def signature(trace_dir: os.PathLike, nranks: int) -> tuple:
    """Sizes and modification times of the job's stream files (changes whenever a rank writes)."""
    sig = []
    for r in range(nranks):
        for p in (events_path(Path(trace_dir), r), live_path(Path(trace_dir), r)):
            try:
                st = p.stat()
                sig.append((st.st_size, st.st_mtime_ns))
            except FileNotFoundError:
                sig.append(None)
    return tuple(sig)


def has_stream(trace_dir: os.PathLike, nranks: int) -> bool:
    """Whether any rank of the job has streamed (its live state file exists)."""
    return any(live_path(Path(trace_dir), r).exists() for r in range(nranks))


def read_job_trace(trace_dir: os.PathLike, nranks: int) -> Optional[JobTrace]:
    """The job's streamed events joined into one :class:`JobTrace`; None when no rank has streamed.

    Safe while the ranks write: a partial trailing row is ignored and the live states are replaced
    atomically. Local file reads only; the whole trace in memory (the controller serves a finished
    job from its index, :mod:`~nbmpi.workers.tracing.index`). Raises :class:`TraceUnreadable` when a
    file is not what the ranks write.
    """
    from .analysis import Trace

    d = Path(trace_dir)
    if not has_stream(d, nranks):
        return None
    counts = row_counts(d, nranks)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    events = np.empty((int(off[-1]), NF), np.int64)   # each rank's rows read straight into their place
    owners = np.repeat(np.arange(nranks, dtype=np.int64), counts)
    for r in range(nranks):
        rows = events[off[r]:off[r + 1]]
        if len(rows):
            with open(events_path(d, r), "rb") as f:
                got = f.readinto(memoryview(rows).cast("B"))
            if got != rows.nbytes:
                raise TraceUnreadable(f"{events_path(d, r).name} of rank {r} shrank while it was read")
            if np.dtype("<i8") != np.dtype(np.int64):
                rows.byteswap(inplace=True)
        check_rows(rows, r, events_path(d, r).name)
    st = read_states(d, nranks, counts)
    trace = Trace(events, owners, nranks, st.kinds or kind_names(), dropped=st.dropped,
                  clock_error_ns=st.clock_error_ns, hosts=st.hosts, copy=False)
    return st.job_trace(trace, trace.t0 if len(trace) else None, trace.t1 if len(trace) else None)


def row_counts(trace_dir: os.PathLike, nranks: int) -> List[int]:
    """Whole rows in each rank's event file now (a trailing partial row is not counted; 0 when missing)."""
    counts = []
    for r in range(nranks):
        try:
            counts.append(events_path(Path(trace_dir), r).stat().st_size // _ROW_BYTES)
        except FileNotFoundError:
            counts.append(0)
    return counts


@dataclass
class JobStates:
    """The ranks' live states of a job (:func:`read_states`): what a :class:`JobTrace` holds besides the events."""
    live: List[Optional[Dict[str, Any]]]
    kinds: List[str]
    dropped: np.ndarray
    clock_error_ns: np.ndarray
    version: int

    @property
    def hosts(self) -> List[str]:
        """Each rank's host name as its live state names it ("" when unknown)."""
        return [str(s.get("host", "")) if s else "" for s in self.live]

    def job_trace(self, trace: Any, t0: Optional[int], t1: Optional[int]) -> JobTrace:
        """The :class:`JobTrace` of ``trace`` (any object; the index build passes None) whose events
        span ``[t0, t1]`` ns (None, None: no events)."""
        starts = [int(s["start_ns"]) for s in self.live if s]
        nows = [int(s["now_ns"]) for s in self.live if s]
        start_ns = min(starts + ([int(t0)] if t0 is not None else []), default=0)
        now_ns = max(nows + ([int(t1)] if t1 is not None else []), default=start_ns)
        return JobTrace(trace=trace, live=self.live, version=self.version, start_ns=start_ns, now_ns=now_ns)


def read_states(trace_dir: os.PathLike, nranks: int, counts: Sequence[int]) -> JobStates:
    """The live states of the job's ranks whose event files hold ``counts`` rows (:func:`row_counts`).
    Raises :class:`TraceUnreadable` when a state file is not what the ranks write."""
    d = Path(trace_dir)
    live: List[Optional[Dict[str, Any]]] = []
    kinds: List[str] = []
    dropped = np.zeros(nranks, np.int64)
    clock_err = np.zeros(nranks, np.int64)
    marks: List[list] = []
    for r in range(nranks):
        state = load_state(live_path(d, r), r)
        live.append(state)
        if state:
            if len(state.get("kinds", [])) > len(kinds):
                kinds = list(state["kinds"])
            dropped[r] = state.get("dropped", 0)
            clock_err[r] = state.get("clock_error_ns", 0)
        done = bool(state and state.get("done"))
        marks.append([int(counts[r]), state.get("waiting") if state else None, done,
                      state.get("now_ns") if state and not done else None])
    version = zlib.crc32(json.dumps(marks, sort_keys=True).encode())
    return JobStates(live=live, kinds=kinds, dropped=dropped, clock_error_ns=clock_err, version=version)
