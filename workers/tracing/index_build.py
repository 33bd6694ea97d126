"""The index files of a finished job's streamed trace, built in bounded memory (:mod:`.index` runs it).

:func:`write_index` writes what :mod:`~nbmpi.workers.tracing.index` describes, equal to what the joined
:class:`~nbmpi.workers.tracing.analysis.Trace` and :func:`~nbmpi.workers.tracing.timeline.timeline_columns`
give, without ever holding the events: every step reads ``chunk`` rows at a time and the steps
that need an order (numbering blocking point-to-point calls, matching sends with receives,
collective steps, each rank's calls in time order, arrows by time) sort on disk
(:mod:`.external_sort`). What it holds is a few chunks of rows, whatever the trace's size:

1. the ranks' event files, checked block by block, copied into one file (``ev``); calls recorded
   with ``seq == -1`` listed by ``(chan, rank, peer, tag, dir, t_start)``: their number in that order;
2. the numbers applied; sends and receives listed by ``(chan, src, dst, tag, seq)``: the first send
   and the first receive of each key are a pair, and per (sender, receiver) rank the least
   ``recv t_end - send t_start`` is kept (an ``nranks x nranks`` matrix); from it the clock shift of
   each rank (:func:`~.analysis.clock_shifts`, the repair of the joined
   :class:`~.analysis.Trace`: within each rank's clock error, no receive ending before its send
   starts); on the shifted clocks, the pairs' waits (late sender / receiver) and those of the
   collective steps with unknown wait, listed by ``(chan, seq, kind)`` (wait for the last arrival);
3. the waits and shifts applied (unknown waits 0), ``events.npy`` / ``ranks.npy`` written, the
   analysis added up;
4. each rank's calls in time order: its state segments, open wait and compute filling, written lane
   by lane with their running maximum and time per state;
5. the arrows, from each send's transfer start to its receive's end, sorted by start.

Local files only; blocking; run it in its own process (the controller does).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np

from . import timeline
from .analysis import NO_BOUND, STATE_NAMES, clock_shifts
from .external_sort import RecordFile, group_blocks, sort_records
from .npy_column import NpyAppender, NpyColumn
from .records import DIR_NONE, DIR_RECV, DIR_SEND, FIELDS, NF
from .stream import MAX_SPAN_NS, TraceUnreadable, check_rows, events_path, read_states, row_counts

__all__ = ["write_index", "CHUNK_ROWS", "SEG"]

#: Rows read, sorted or written at a time (about 12 MB of events).
CHUNK_ROWS = 1 << 17
_I8 = "<i8"
EV = np.dtype([(f, _I8) for f in FIELDS])
_SEQ = np.dtype([(f, _I8) for f in ("chan", "rank", "peer", "tag", "dir", "t_start", "idx")])
_UPD = np.dtype([("idx", _I8), ("val", _I8)])
#: A send or receive: its key (chan, src, dst, tag, seq) byte-swapped, so that the numeric order is the
#: byte order in which the joined trace's matching lists the pairs (NumPy compares keys as raw bytes).
_MATCH = np.dtype([(f, "<u8") for f in ("chan", "src", "dst", "tag", "seq")]
                  + [(f, _I8) for f in ("side", "idx", "t_start", "t_end", "wait")])
_COLL = np.dtype([(f, _I8) for f in ("chan", "seq", "kind", "idx", "t_start", "t_end")])
#: A matched pair: its number ``k`` in key order, send and receive index, their ranks, times and recorded waits.
_PAIR = np.dtype([(f, _I8) for f in ("k", "sp", "rp", "sr", "rr", "s_start", "s_end", "s_wait",
                                     "r_start", "r_end", "r_wait")])
_CALL = np.dtype([(f, _I8) for f in ("rank", "t_start", "idx", "t_end", "wait")])
_COMM = np.dtype([("event", _I8), ("s", "<f8"), ("e", "<f8")])
#: One segment of a lane (``seg.npy``): what a view reads of it, in one piece.
SEG = np.dtype([("start", "<f8"), ("end", "<f8"), ("state", "i1"), ("event", "<i8"), ("cum", "<f8", (3,))])
_ARROW = np.dtype([("t0", "<f8"), ("k", _I8), ("t1", "<f8"), ("src", _I8), ("dst", _I8), ("sp", _I8),
                   ("rp", _I8)])


class _Updates:
    """A file of ``(idx, val)`` sorted by ``idx``, read alongside a walk over the events in order."""

    def __init__(self, f: RecordFile, chunk: int):
        self._blocks = f.blocks(chunk)
        self._buf = np.empty(0, _UPD)

    def upto(self, stop: int) -> np.ndarray:
        """The updates of the rows before ``stop`` not yet returned."""
        parts = []
        while True:
            if not len(self._buf):
                self._buf = next(self._blocks, np.empty(0, _UPD))
                if not len(self._buf):
                    break
            k = int(np.searchsorted(self._buf["idx"], stop, "left"))
            parts.append(self._buf[:k])
            self._buf = self._buf[k:]
            if len(self._buf):
                break
        return np.concatenate(parts) if parts else np.empty(0, _UPD)


def _ev_blocks(ev: RecordFile, chunk: int) -> Iterator[Tuple[int, np.ndarray]]:
    """``(first index, rows)`` of the events file, ``chunk`` rows at a time."""
    a = 0
    for rows in ev.blocks(chunk):
        yield a, rows
        a += len(rows)


# -- 1. copy and check ----------------------------------------------------------------------------------
def _copy_events(d: Path, nranks: int, counts: List[int], work: Path, chunk: int):
    """The ranks' rows into ``work/ev`` (checked), the seq == -1 calls listed; returns
    ``(ev, seq list, t0, t1)`` (t0, t1: None when there are no events)."""
    ev = RecordFile(work / "ev", EV)
    seq = RecordFile(work / "seq", _SEQ)
    t0 = t1 = None
    for r in range(nranks):
        name = events_path(d, r).name
        src = RecordFile(events_path(d, r), EV, existing=True) if counts[r] else None
        lo = hi = None
        for k in range(0, counts[r], chunk):
            try:
                rows = src.read(k, min(k + chunk, counts[r]))
            except OSError:
                raise TraceUnreadable(f"{name} of rank {r} shrank while it was read") from None
            if len(rows) < min(chunk, counts[r] - k):
                raise TraceUnreadable(f"{name} of rank {r} shrank while it was read")
            check_rows(rows.view(_I8).reshape(-1, NF), r, name)
            lo = min(int(rows["t_start"].min()), lo if lo is not None else int(rows["t_start"].min()))
            hi = max(int(rows["t_end"].max()), hi if hi is not None else int(rows["t_end"].max()))
            idx = len(ev) + np.arange(len(rows), dtype=np.int64)
            m = rows["seq"] == -1
            if m.any():
                s = np.empty(int(m.sum()), _SEQ)
                for f in ("chan", "peer", "tag", "dir", "t_start"):
                    s[f] = rows[f][m]
                s["rank"], s["idx"] = r, idx[m]
                seq.add(s)
            ev.add(rows)
        if lo is not None:
            if hi - lo > MAX_SPAN_NS:
                raise TraceUnreadable(f"{name} of rank {r} is not a trace the ranks wrote: it holds times "
                                      f"spread over more than 60 days")
            t0 = lo if t0 is None else min(t0, lo)
            t1 = hi if t1 is None else max(t1, hi)
    return ev, seq, t0, t1


# -- 2. numbers, matching, collectives ----------------------------------------------------------------------
def _numbers(seq: RecordFile, chunk: int) -> RecordFile:
    """``(idx, seq)`` of the calls recorded with seq == -1: their order per (chan, rank, peer, tag, dir)."""
    key = ("chan", "rank", "peer", "tag", "dir")
    srt = sort_records(seq, key + ("t_start", "idx"), chunk)
    out = RecordFile(seq.path.with_name("seq.upd"), _UPD)
    for block, _gid, pos in group_blocks(srt, key, chunk):
        u = np.empty(len(block), _UPD)
        u["idx"], u["val"] = block["idx"], pos
        out.add(u)
    srt.remove()
    return sort_records(out, ("idx",), chunk)


def _swapped(v: np.ndarray) -> np.ndarray:
    """int64 values as the unsigned number their little-endian bytes spell read big-endian."""
    return np.ascontiguousarray(v, "<i8").view("<u8").byteswap()


def _apply_numbers(ev: RecordFile, nums: RecordFile, off: np.ndarray, work: Path, chunk: int):
    """The numbered events (``ev2``) and the lists of point-to-point calls and collective steps."""
    ev2 = RecordFile(work / "ev2", EV)
    match = RecordFile(work / "match", _MATCH)
    coll = RecordFile(work / "coll", _COLL)
    upd = _Updates(nums, chunk)
    for a, rows in _ev_blocks(ev, chunk):
        rows = rows.copy()
        u = upd.upto(a + len(rows))
        rows["seq"][u["idx"] - a] = u["val"]
        idx = a + np.arange(len(rows), dtype=np.int64)
        rank = np.searchsorted(off, idx, "right") - 1
        for side, d in ((0, DIR_SEND), (1, DIR_RECV)):
            m = rows["dir"] == d
            x = np.empty(int(m.sum()), _MATCH)
            for f in ("chan", "tag", "seq"):
                x[f] = _swapped(rows[f][m])
            for f in ("t_start", "t_end", "wait"):
                x[f] = rows[f][m]
            src, dst = (rank[m], rows["peer"][m]) if d == DIR_SEND else (rows["peer"][m], rank[m])
            x["src"], x["dst"] = _swapped(src), _swapped(dst)
            x["side"], x["idx"] = side, idx[m]
            match.add(x)
        m = (rows["dir"] == DIR_NONE) & (rows["wait"] < 0)
        c = np.empty(int(m.sum()), _COLL)
        for f in ("chan", "seq", "kind", "t_start", "t_end"):
            c[f] = rows[f][m]
        c["idx"] = idx[m]
        coll.add(c)
        ev2.add(rows)
    ev.remove()
    nums.remove()
    return ev2, match, coll


def _pairs(match: RecordFile, off: np.ndarray, work: Path, chunk: int) -> Tuple[RecordFile, np.ndarray]:
    """The first send and first receive of each key as :data:`_PAIR` records in key order, and the clock
    bound matrix of :func:`~.analysis.clock_shifts` (per sender and receiver rank, the least
    ``recv t_end - send t_start`` of their messages, times as recorded)."""
    key = ("chan", "src", "dst", "tag", "seq")
    srt = sort_records(match, key + ("side", "idx"), chunk)
    pairs = RecordFile(work / "pairs", _PAIR)
    nranks = len(off) - 1
    bound = np.full((nranks, nranks), NO_BOUND, np.int64)
    held = np.empty(0, _MATCH)          # the first send of the last group seen, with its group id
    held_gid = np.empty(0, np.int64)
    last_side, last_gid = -1, -1
    for block, gid, pos in group_blocks(srt, key, chunk):
        side = block["side"]
        prev_side = np.concatenate([[last_side], side[:-1]])
        prev_gid = np.concatenate([[last_gid], gid[:-1]])
        fs = (pos == 0) & (side == 0)
        fr = (side == 1) & ((pos == 0) | ((prev_gid == gid) & (prev_side == 0)))
        s_rows, s_gid = np.concatenate([held, block[fs]]), np.concatenate([held_gid, gid[fs]])
        r_rows, r_gid = block[fr], gid[fr]
        j = np.searchsorted(s_gid, r_gid)
        ok = (j < len(s_gid)) & (s_gid[np.minimum(j, len(s_gid) - 1)] == r_gid) if len(s_gid) else j < 0
        s, r = s_rows[j[ok]], r_rows[ok]
        p = np.empty(len(s), _PAIR)
        p["k"], p["sp"], p["rp"] = len(pairs) + np.arange(len(s)), s["idx"], r["idx"]
        p["sr"] = np.searchsorted(off, s["idx"], "right") - 1
        p["rr"] = np.searchsorted(off, r["idx"], "right") - 1
        p["s_start"], p["s_end"], p["s_wait"] = s["t_start"], s["t_end"], s["wait"]
        p["r_start"], p["r_end"], p["r_wait"] = r["t_start"], r["t_end"], r["wait"]
        pairs.add(p)
        cross = p["sr"] != p["rr"]
        np.minimum.at(bound, (p["sr"][cross], p["rr"][cross]), (p["r_end"] - p["s_start"])[cross])
        held, held_gid = s_rows[-1:], s_gid[-1:]
        last_side, last_gid = int(side[-1]), int(gid[-1])
    srt.remove()
    return pairs, bound


def _pair_waits(pairs: RecordFile, shift: np.ndarray, waits: RecordFile, chunk: int) -> int:
    """The waits of late senders and receivers, on the clocks shifted by ``shift`` (ns per rank),
    appended to ``waits``; returns the clock violations (messages between two ranks whose receive
    still ends before its send starts)."""
    violations = 0
    for p in pairs.blocks(chunk):
        cs, cr = shift[p["sr"]], shift[p["rr"]]
        s_start, r_start = p["s_start"] + cs, p["r_start"] + cr
        violations += int(((p["sr"] != p["rr"]) & (p["r_end"] + cr < s_start)).sum())
        late_sender = np.clip(s_start - r_start, 0, p["r_end"] - p["r_start"])
        late_receiver = np.clip(r_start - s_start, 0, p["s_end"] - p["s_start"])
        for at, wait, val in ((p["rp"], p["r_wait"], late_sender), (p["sp"], p["s_wait"], late_receiver)):
            unknown = wait < 0
            u = np.empty(int(unknown.sum()), _UPD)
            u["idx"], u["val"] = at[unknown], val[unknown]
            waits.add(u)
    return violations


def _collectives(coll: RecordFile, waits: RecordFile, off: np.ndarray, shift: np.ndarray, work: Path,
                 chunk: int) -> None:
    """The waits of collective steps with unknown wait (for the last arrival), on the clocks shifted
    by ``shift`` (ns per rank; ``off``: each rank's first event index), appended to ``waits``."""
    key = ("chan", "seq", "kind")
    srt = sort_records(coll, key + ("idx",), chunk)
    last = RecordFile(work / "coll.last", np.dtype(_I8))     # latest start per group, by group id
    run, run_gid = None, -1
    for block, gid, _pos in group_blocks(srt, key, chunk):
        cut = np.concatenate([[0], np.nonzero(np.diff(gid))[0] + 1])
        mx = np.maximum.reduceat(block["t_start"] + shift[np.searchsorted(off, block["idx"], "right") - 1], cut)
        if run is not None and gid[0] == run_gid:
            mx[0] = max(mx[0], run)
        elif run is not None:
            last.add(np.array([run], _I8))
        last.add(mx[:-1])
        run, run_gid = int(mx[-1]), int(gid[-1])
    if run is not None:
        last.add(np.array([run], _I8))
    for block, gid, _pos in group_blocks(srt, key, chunk):
        mx = last.read(int(gid[0]), int(gid[-1]) + 1)[gid - gid[0]]
        u = np.empty(len(block), _UPD)
        u["idx"] = block["idx"]
        start = block["t_start"] + shift[np.searchsorted(off, block["idx"], "right") - 1]
        u["val"] = np.clip(mx - start, 0, block["t_end"] - block["t_start"])
        waits.add(u)
    srt.remove()
    last.remove()


# -- 3. waits applied, events written, analysis added up ----------------------------------------------------
def _apply_waits(ev: RecordFile, waits: RecordFile, off: np.ndarray, shift: np.ndarray, out: Path, work: Path,
                 chunk: int):
    """Write ``events.npy`` / ``ranks.npy`` with the waits and each rank's times shifted by ``shift``
    (ns); returns ``(calls by rank and time, per-rank sums, bytes, messages, unmatched, (t0, t1))``
    for :func:`~.timeline.analysis_from_sums` (``(t0, t1)`` the shifted events' span, None, None
    without events)."""
    nranks = len(off) - 1
    events, ranks = NpyAppender(out / "events.npy"), NpyAppender(out / "ranks.npy")
    events.add(np.empty((0, NF), np.int64))                 # the dtype and shape of a trace without events
    ranks.add(np.empty(0, np.int64))
    calls = RecordFile(work / "calls", _CALL)
    sums = [[0, 0, 0, {}] for _ in range(nranks)]
    nbytes, msgs = np.zeros((nranks, nranks), np.int64), np.zeros((nranks, nranks), np.int64)
    unmatched = 0
    t0 = t1 = None
    upd = _Updates(waits, chunk)
    for a, rows in _ev_blocks(ev, chunk):
        rows = rows.copy()
        u = upd.upto(a + len(rows))
        rows["wait"][u["idx"] - a] = u["val"]
        still = rows["wait"] < 0
        unmatched += int(still.sum())
        rows["wait"][still] = 0
        idx = a + np.arange(len(rows), dtype=np.int64)
        rank = np.searchsorted(off, idx, "right") - 1
        rows["t_start"] += shift[rank]
        rows["t_end"] += shift[rank]
        if len(rows):
            lo, hi = int(rows["t_start"].min()), int(rows["t_end"].max())
            t0, t1 = (lo, hi) if t0 is None else (min(t0, lo), max(t1, hi))
        events.add(rows.view(_I8).reshape(-1, NF).astype(np.int64))
        ranks.add(rank.astype(np.int64))
        c = np.empty(len(rows), _CALL)
        c["rank"], c["idx"] = rank, idx
        for f in ("t_start", "t_end", "wait"):
            c[f] = rows[f]
        calls.add(c)
        dur = np.maximum(rows["t_end"] - rows["t_start"], 0)
        w_eff = np.minimum(np.maximum(rows["wait"], 0), dur)
        for r in np.unique(rank).tolist():
            m = rank == r
            acc = sums[r]
            acc[0] += int(dur[m].sum())
            acc[1] += int(w_eff[m].sum())
            acc[2] += int(m.sum())
            ks, inv = np.unique(rows["kind"][m], return_inverse=True)
            for k, v in zip(ks.tolist(), np.bincount(inv, weights=w_eff[m].astype(np.float64)).tolist()):
                acc[3][k] = acc[3].get(k, 0.0) + v
        sends = rows["dir"] == DIR_SEND
        peer = rows["peer"][sends]
        ok = (peer >= 0) & (peer < nranks)
        np.add.at(nbytes, (rank[sends][ok], peer[ok]), rows["nbytes"][sends][ok])
        np.add.at(msgs, (rank[sends][ok], peer[ok]), 1)
    events.finish()
    ranks.finish()
    ev.remove()
    waits.remove()
    return calls, [tuple(s) for s in sums], nbytes, msgs, unmatched, (t0, t1)


# -- 4. lanes -----------------------------------------------------------------------------------------------
class _Lane:
    """One rank's lane, fed its calls in time order block by block (:meth:`feed`, then :meth:`finish`):
    the segments :func:`~.timeline.timeline_columns` gives that rank, appended to ``files``."""

    def __init__(self, t0: int, t1: int, has: bool, w0: int, span: float, blocked: List[Tuple[int, float]],
                 files: Dict[str, NpyAppender], comm: RecordFile):
        self.t0, self.t1, self.has, self.shift, self.span = t0, t1, has, t0 - w0, span
        self.blocked = blocked                     # (k, since s) of this rank's open waits
        self.pending = sorted(blocked, key=lambda b: b[1])
        self.files, self.comm = files, comm
        self.cur = t0                              # end of the lane's last call so far (ns)
        self.fill = 0.0                            # latest segment end written (s)
        self.endmax = -np.inf
        self.cum = np.zeros(len(STATE_NAMES))
        self.rows = 0

    def feed(self, st: np.ndarray, en: np.ndarray, wt: np.ndarray, idx: np.ndarray) -> None:
        """The next calls of the rank (start, end, wait ns; event index), in time order."""
        cursor = np.maximum(np.maximum.accumulate(np.maximum(np.maximum(st, en), self.t0)), self.cur)
        before = np.concatenate([[self.cur], cursor[:-1]]).astype(np.int64)
        self.cur = int(cursor[-1])
        s = np.maximum(st, before)
        e = np.maximum(en, s)
        w = np.minimum(wt, e - s)
        wp = np.maximum(w, 0)
        n = len(st)
        starts = np.stack([before, s, s + wp], axis=1)
        ends = np.stack([s, s + wp, e], axis=1)
        states = np.broadcast_to(np.array([0, 1, 2], np.int64), (n, 3))
        events = np.stack([np.full(n, -1, np.int64), idx, idx], axis=1)
        keep = np.stack([s > before, w > 0, np.ones(n, bool)], axis=1)
        self._segments(states[keep], (starts[keep] - self.t0 + self.shift) / 1e9,
                       (ends[keep] - self.t0 + self.shift) / 1e9, events[keep])

    def finish(self) -> None:
        """The lane's compute after its last call, open waits not yet placed, compute up to the end."""
        if self.has and self.cur < self.t1:
            self._segments(np.zeros(1, np.int64), np.array([self.cur - self.t0 + self.shift]) / 1e9,
                           np.array([self.t1 - self.t0 + self.shift]) / 1e9, np.full(1, -1, np.int64))
        self._segments(np.empty(0, np.int64), np.empty(0), np.empty(0), np.empty(0, np.int64), last=True)

    def _segments(self, st, s, e, ev, last: bool = False) -> None:
        ok = ~((e <= s) & (st == 0))                       # zero-length compute says nothing
        st, s, e, ev = st[ok], s[ok], e[ok], ev[ok]
        if self.blocked:                                    # a rank blocked at the end computes until then
            for _k, since in self.blocked:
                e = np.where((st == 0) & (e > since), np.maximum(since, s), e)
            ok = ~((e <= s) & (st == 0))
            st, s, e, ev = st[ok], s[ok], e[ok], ev[ok]
        while self.pending:                                 # its open wait, after what starts before it
            k, since = self.pending[0]
            p = int(np.searchsorted(s, since, "right"))
            if p == len(s) and not last:
                break
            self.pending.pop(0)
            st, s, e, ev = (np.insert(st, p, 1), np.insert(s, p, since), np.insert(e, p, self.span),
                            np.insert(ev, p, -2 - k))
        if len(s):                                          # compute wherever the lane has nothing
            ends = np.maximum.accumulate(np.concatenate([[self.fill], e]))
            cursor, self.fill = ends[:-1], float(ends[-1])
            gap = np.nonzero(s > cursor + 1e-12)[0]
            if len(gap):
                st, ev = np.insert(st, gap, 0), np.insert(ev, gap, -1)
                s, e = np.insert(s, gap, cursor[gap]), np.insert(e, gap, s[gap])
        if last and self.fill < self.span:
            st, s, e, ev = (np.append(st, 0), np.append(s, self.fill), np.append(e, self.span), np.append(ev, -1))
            self.fill = self.span
        if len(s):
            self._write(st.astype(np.int64), s.astype(np.float64), e.astype(np.float64), ev.astype(np.int64))

    def _write(self, st, s, e, ev) -> None:
        dur = np.maximum(e - s, 0.0)
        per_state = np.zeros((len(dur), len(STATE_NAMES)))
        per_state[np.arange(len(dur)), st] = dur
        cs = np.cumsum(np.concatenate([self.cum[None], per_state]), axis=0)
        self.cum = cs[-1]
        endmax = np.maximum.accumulate(np.concatenate([[self.endmax], e]))[1:]
        self.endmax = float(endmax[-1])
        rec = np.empty(len(s), SEG)
        rec["start"], rec["end"], rec["state"], rec["event"], rec["cum"] = s, e, st, ev, cs[:-1]
        for k, v in dict(start=s, endmax=endmax, seg=rec).items():
            self.files[k].add(v)
        comm = (st == 2) & (ev >= 0)
        c = np.empty(int(comm.sum()), _COMM)
        c["event"], c["s"], c["e"] = ev[comm], s[comm], e[comm]
        self.comm.add(c)
        self.rows += len(s)


def _lanes(calls: RecordFile, nranks: int, span_ns: Tuple[int, int, bool], window: Tuple[int, int],
           waits: List[Dict[str, Any]], out: Path, work: Path, chunk: int):
    """The segment files, lane by lane; returns ``(lane_off, duration_s, origin_ns, comm segments)``."""
    t0, t1, has = span_ns
    w0 = min(int(window[0]), t0)
    files = {k: NpyAppender(out / f"{k}.npy", skeleton=k in ("start", "endmax"))
             for k in ("start", "endmax", "seg")}
    comm = RecordFile(work / "comm", _COMM)
    srt = sort_records(calls, ("rank", "t_start", "idx"), chunk)
    blocks = srt.blocks(chunk)
    buf = np.empty(0, _CALL)
    lane_off, duration = [0], 0.0
    for r in range(nranks):
        mine = [(k, w) for k, w in enumerate(waits) if int(w["rank"]) == r]
        w1 = max([int(window[1]), t1] + [int(w["since_ns"]) for _, w in mine])
        duration = max(w1 - w0, 1) / 1e9
        lane = _Lane(t0, t1, has, w0, duration, [(k, (int(w["since_ns"]) - w0) / 1e9) for k, w in mine],
                     files, comm)
        while True:
            if not len(buf):
                buf = next(blocks, np.empty(0, _CALL))
                if not len(buf):
                    break
            k = int(np.searchsorted(buf["rank"], r, "right"))
            if k:
                b = buf[:k]
                lane.feed(b["t_start"], b["t_end"], b["wait"], b["idx"])
            buf = buf[k:]
            if len(buf):
                break
        lane.finish()
        lane_off.append(lane_off[-1] + lane.rows)
    for f in files.values():
        f.finish()
    srt.remove()
    return lane_off, duration, w0, comm


# -- 5. arrows ----------------------------------------------------------------------------------------------
def _arrows(pairs: RecordFile, comm: RecordFile, off: np.ndarray, out: Path, work: Path, chunk: int):
    """The arrow files (sorted by start); returns ``(arrows, longest |t1 - t0|)``."""
    srt = sort_records(comm, ("event",), chunk)
    c_start, c_end = NpyAppender(work / "c_start.npy"), NpyAppender(work / "c_end.npy")
    for block in srt.blocks(chunk):
        c_start.add(block["s"].copy())
        c_end.add(block["e"].copy())
    c_start.finish()
    c_end.finish()
    srt.remove()
    cs, ce = NpyColumn(work / "c_start.npy"), NpyColumn(work / "c_end.npy")
    arrows = RecordFile(work / "arrows", _ARROW)
    for block in pairs.blocks(chunk):
        a = np.empty(len(block), _ARROW)
        a["k"], a["sp"], a["rp"] = block["k"], block["sp"], block["rp"]
        a["t0"], a["t1"] = cs.take(block["sp"]), ce.take(block["rp"])
        a["src"] = np.searchsorted(off, block["sp"], "right") - 1
        a["dst"] = np.searchsorted(off, block["rp"], "right") - 1
        arrows.add(a)
    cs.close()
    ce.close()
    pairs.remove()
    srt = sort_records(arrows, ("t0", "k"), chunk)
    names = dict(a_src=("src", np.int32), a_dst=("dst", np.int32), a_t0=("t0", np.float64), a_t1=("t1", np.float64),
                 a_send=("sp", np.int64), a_recv=("rp", np.int64))
    files = {k: NpyAppender(out / f"{k}.npy", skeleton=k == "a_t0") for k in names}
    span = 0.0
    for block in srt.blocks(chunk):
        for k, (f, dt) in names.items():
            files[k].add(block[f].astype(dt))
        span = max(span, float(np.abs(block["t1"] - block["t0"]).max()))
    for k, f in files.items():
        if f.n == 0:
            f.add(np.empty(0, names[k][1]))
        f.finish()
    n = len(srt)
    srt.remove()
    return n, span


# -- all ----------------------------------------------------------------------------------------------------
def write_index(trace_dir: os.PathLike, nranks: int, out: Path, chunk: int = CHUNK_ROWS) -> Tuple[Dict[str, Any], Any]:
    """Write the index files of the trace in ``trace_dir`` (``nranks`` ranks, at least one streamed)
    into ``out``, ``chunk`` rows at a time (see the module docstring); returns ``(meta, job trace)``:
    the meta (unwritten) and the :class:`~.stream.JobTrace` (its ``trace`` None). Raises
    :class:`~.stream.TraceUnreadable` when the files are not what the ranks write."""
    d = Path(trace_dir)
    work = out / ".work"
    work.mkdir(parents=True, exist_ok=True)
    try:
        counts = row_counts(d, nranks)
        off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        ev, seq, _t0, _t1 = _copy_events(d, nranks, counts, work, chunk)
        states = read_states(d, nranks, counts)
        kinds = states.kinds or _kind_names()
        n = len(ev)
        ev, match, coll = _apply_numbers(ev, _numbers(seq, chunk), off, work, chunk)
        waits = RecordFile(work / "waits", _UPD)
        pairs, bound = _pairs(match, off, work, chunk)
        shift = clock_shifts(bound, states.clock_error_ns)
        violations = _pair_waits(pairs, shift, waits, chunk)
        _collectives(coll, waits, off, shift, work, chunk)
        calls, sums, nbytes, msgs, unmatched, (t0, t1) = _apply_waits(ev, sort_records(waits, ("idx",), chunk), off,
                                                                      shift, out, work, chunk)
        jt = states.job_trace(None, t0, t1)
        open_waits = jt.waits()
        window = (jt.start_ns, jt.now_ns)
        has = n > 0
        an = timeline.analysis_from_sums(nranks, (t0, t1) if has else None, window, sums, nbytes, msgs, unmatched,
                                         lambda c: kinds[c] if 0 <= c < len(kinds) else f"kind{c}", open_waits)
        span_ns = (t0, t1, True) if has else (int(window[0]), int(window[0]), False)
        lane_off, duration, origin, comm = _lanes(calls, nranks, span_ns, window, open_waits, out, work, chunk)
        arrows, arrow_span = _arrows(pairs, comm, off, out, work, chunk)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = dict(nranks=nranks, kinds=list(kinds), events=n, segments=lane_off[-1], lane_off=lane_off,
                duration_s=duration, origin_ns=int(origin), version=int(jt.version), waits=open_waits, analysis=an,
                arrows=int(arrows), arrow_span_s=arrow_span, done=bool(jt.done),
                dropped=[int(x) for x in states.dropped], clock_error_ns=[int(x) for x in states.clock_error_ns],
                clock_shift_ns=[int(x) for x in shift], clock_violations=violations, hosts=states.hosts)
    return meta, jt


def _kind_names() -> List[str]:
    from .records import kind_names
    return kind_names()
