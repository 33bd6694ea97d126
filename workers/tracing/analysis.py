"""The gathered trace of all ranks: wait attribution, per-rank summary, Chrome trace export.

A :class:`Trace` is what :func:`nbmpi.workers.tracing.tracer.gather_trace` returns on
the root. It is plain data (numpy arrays), so the notebook timeline and the
controller's dashboard build their figures from :meth:`Trace.summary` and
:meth:`Trace.states` rather than re-deriving anything.

Wait attribution (for events recorded with ``wait=-1``):

* a receive waited for a *late sender*: ``clamp(send.start - recv.start, 0, recv.duration)``;
* a synchronous send waited for a *late receiver*: ``clamp(recv.start - send.start, 0, send.duration)``;
* a collective step (``dir == DIR_NONE``, same ``chan`` and ``seq`` on every
  rank taking part) waited for the *last arrival*: ``clamp(max(start) - start, 0, duration)``;
* an unmatched event keeps wait 0 and is counted in ``summary()["unmatched"]``.

Sends are matched with receives on ``(chan, src, dst, tag, seq)``. Events
recorded with ``seq == -1`` (blocking point-to-point) get their seq from their
order: the k-th such send from s to d on (chan, tag) is number k, likewise for
receives, which is exactly MPI's non-overtaking matching rule.

Clocks: before waits are attributed, each rank's times are shifted within its clock error
(``clock_error_ns``, from ``Tracer.align_clocks``) so that no matched receive ends before its send
starts (``clock_shift_ns``); pairs that still do are counted in ``summary()["clock_violations"]``.
A rank's slices may overlap (a root's messages in flight together); :meth:`Trace.states` and the
summary count overlapping time once.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .records import DIR_NONE, DIR_RECV, DIR_SEND, FIELDS, NF

_COL = {name: i for i, name in enumerate(FIELDS)}
_T_START, _T_END = _COL["t_start"], _COL["t_end"]
#: Names of the states of :meth:`Trace.states`, indexed by the codes of :meth:`Trace.state_arrays`.
STATE_NAMES = ("compute", "wait", "comm")


def op_label(row, kinds: List[str]) -> str:
    """Human label of one event row (columns :data:`FIELDS`), e.g. ``take(src=0)``; ``kinds`` the
    trace's kind names (an unknown code reads ``kindN``)."""
    code = int(row[_COL["kind"]])
    kind = kinds[code] if 0 <= code < len(kinds) else f"kind{code}"
    peer, d = int(row[_COL["peer"]]), int(row[_COL["dir"]])
    if d == DIR_SEND:
        return f"{kind}(dest={peer})"
    if d == DIR_RECV:
        return f"{kind}(src={peer})"
    count = int(row[_COL["count"]])
    return f"{kind}[{count}]" if count else kind


def _keys(cols: List[np.ndarray]) -> np.ndarray:
    """Rows of int64 columns as one void scalar each (for exact matching)."""
    stacked = np.ascontiguousarray(np.stack(cols, axis=1).astype(np.int64, copy=False))
    return stacked.view(np.dtype((np.void, 8 * len(cols)))).ravel()


#: The entry of a clock bound matrix (:func:`clock_shifts`) between two ranks no message joins.
NO_BOUND = np.iinfo(np.int64).max


def clock_shifts(bound: np.ndarray, clock_error_ns: np.ndarray) -> np.ndarray:
    """Per-rank clock shifts (ns, int64, rank 0's is 0) within ``clock_error_ns`` meeting ``bound``.

    ``bound`` is the ``(n, n)`` int64 matrix of, per (sender rank a, receiver rank b), the least
    ``recv t_end - send t_start`` over their matched messages (:data:`NO_BOUND` where none): shifts
    ``c`` added to each rank's times keep every such receive from ending before its send starts when
    ``c[a] - c[b] <= bound[a, b]``. Starting from 0 the pairs are relaxed one by one (the sender's
    clock moved back first, then the receiver's forward), each shift clamped to ``+-clock_error_ns``
    of its rank (rank 0 stays put; errors missing for some rank: no shift at all), so times that already
    satisfy every bound stay put. When that greedy pass leaves a bound unmet although shifts within the
    errors meeting every bound exist (it moved a sender back where the receiver had to move forward),
    the feasible shifts nearest to 0 of the two extreme ones (:func:`_extreme_shifts`) are taken; when
    none exist, the greedy shifts stay and the caller counts the messages still violated.
    Used by :class:`Trace` and the chunked index build alike; pure, cheap (``O(n^3)`` at most)."""
    n = len(bound)
    err = np.abs(np.asarray(clock_error_ns)[:n]).astype(np.int64) if len(clock_error_ns) >= n \
        else np.zeros(n, np.int64)
    if n:
        err[0] = 0
    c = np.zeros(n, np.int64)
    pairs = list(zip(*np.nonzero(bound < NO_BOUND)))
    for _ in range(2 * n):
        changed = False
        for a, b in pairs:
            excess = int(c[a] - c[b] - bound[a, b])
            if excess <= 0:
                continue
            down = min(excess, int(c[a] + err[a]))   # move the sender's clock back first
            c[a] -= down
            up = min(excess - down, int(err[b] - c[b]))   # then the receiver's forward
            c[b] += max(up, 0)
            changed = changed or down > 0 or up > 0
        if not changed:
            break
    finite = bound < NO_BOUND
    if not (c[:, None] - c[None, :] > np.where(finite, bound, 0))[finite].any():
        return c
    exact = [x for x in (_extreme_shifts(bound, err, True), _extreme_shifts(bound, err, False)) if x is not None]
    return min(exact, key=lambda x: int(np.abs(x).sum())) if exact else c


def _extreme_shifts(bound: np.ndarray, err: np.ndarray, greatest: bool) -> Optional[np.ndarray]:
    """The greatest (or least) shifts ``c``, ``|c| <= err``, with ``c[a] - c[b] <= bound[a, b]`` for
    every pair (Bellman-Ford on the difference constraints); None when there are none."""
    n = len(bound)
    w = np.minimum(bound, 1 << 62)                  # no overflow adding a shift to "no bound"
    c = err.copy() if greatest else -err
    for _ in range(n + 1):
        if greatest:                                # c[a] <= c[b] + bound[a, b]
            new = np.minimum(c, (c[None, :] + w).min(axis=1))
        else:                                       # c[b] >= c[a] - bound[a, b]
            new = np.maximum(c, (c[:, None] - w).max(axis=0))
        if np.array_equal(new, c):
            return c if ((c >= -err) & (c <= err)).all() else None
        c = new
    return None


class Trace:
    """Events of all ranks on rank 0's clock (ns). Built by ``Tracer.gather``.

    ``events`` is an ``(n, NF)`` int64 array with columns :data:`FIELDS` (copied, unless
    ``copy=False``: then an int64 array is used, and changed, in place);
    ``ranks[i]`` is the rank that recorded event ``i``; ``hosts[r]`` the name of the node rank
    ``r`` ran on ("" where unknown), which names its lane next to the rank number.
    """

    def __init__(self, events: np.ndarray, ranks: np.ndarray, nranks: int, kinds: List[str],
                 dropped: Optional[np.ndarray] = None, clock_error_ns: Optional[np.ndarray] = None,
                 hosts: Optional[Sequence[str]] = None, copy: bool = True):
        # copy=False: ``events`` (an int64 array the caller gives away) gets its waits in place
        self.events = np.array(events, dtype=np.int64, copy=copy or None).reshape(-1, NF)
        self.ranks = np.asarray(ranks, dtype=np.int64)
        self.nranks = int(nranks)
        self.kinds = list(kinds)
        self.dropped = np.zeros(self.nranks, np.int64) if dropped is None else np.asarray(dropped)
        self.clock_error_ns = (np.zeros(self.nranks, np.int64) if clock_error_ns is None
                               else np.asarray(clock_error_ns))
        self.hosts = [str(h) for h in hosts] if hosts is not None else [""] * self.nranks
        self.flow_pairs = np.empty((0, 2), dtype=np.int64)  # (send index, recv index)
        self.unmatched = 0
        #: per rank, the shift (ns) :meth:`_repair_clocks` added to its times, within its clock error
        self.clock_shift_ns = np.zeros(self.nranks, np.int64)
        #: matched message pairs whose receive still ends before its send starts (beyond the clock errors)
        self.clock_violations = 0
        self._attribute_waits()

    def lane_name(self, r: int) -> str:
        """The name of rank ``r``'s lane: ``"rank 1 (node2)"``, or ``"rank 1"`` when its host is unknown."""
        host = self.hosts[r] if 0 <= r < len(self.hosts) else ""
        return f"rank {r} ({host})" if host else f"rank {r}"

    # -- columns --------------------------------------------------------------
    def col(self, name: str) -> np.ndarray:
        """Column ``name`` of :data:`FIELDS` (a view)."""
        return self.events[:, _COL[name]]

    def __len__(self) -> int:
        return self.events.shape[0]

    def kind_name(self, code: int) -> str:
        """Name of kind ``code``."""
        return self.kinds[code] if 0 <= code < len(self.kinds) else f"kind{code}"

    def op_label(self, i: int) -> str:
        """Human label of event ``i``, e.g. ``take(src=0)``."""
        return op_label(self.events[i], self.kinds)

    # -- wait attribution ------------------------------------------------------------
    def _number_by_order(self) -> None:
        """Give blocking point-to-point events (seq == -1) their order number per
        (chan, rank, peer, tag, dir)."""
        seq = self.col("seq")
        idx = np.nonzero(seq == -1)[0]
        if len(idx) == 0:
            return
        c = self.col
        order = np.lexsort((c("t_start")[idx], c("dir")[idx], c("tag")[idx], c("peer")[idx],
                            self.ranks[idx], c("chan")[idx]))
        sidx = idx[order]
        keys = _keys([c("chan")[sidx], self.ranks[sidx], c("peer")[sidx], c("tag")[sidx], c("dir")[sidx]])
        new_group = np.ones(len(sidx), dtype=bool)
        new_group[1:] = keys[1:] != keys[:-1]
        group_start = np.maximum.accumulate(np.where(new_group, np.arange(len(sidx)), 0))
        seq[sidx] = np.arange(len(sidx)) - group_start

    def _attribute_waits(self) -> None:
        ev = self.events
        if len(ev) == 0:
            return
        self._number_by_order()
        c = self.col
        start, end, wait = c("t_start"), c("t_end"), c("wait")
        dur = end - start
        d = c("dir")
        send = np.nonzero(d == DIR_SEND)[0]
        recv = np.nonzero(d == DIR_RECV)[0]
        if len(send) and len(recv):
            sk = _keys([c("chan")[send], self.ranks[send], c("peer")[send], c("tag")[send], c("seq")[send]])
            rk = _keys([c("chan")[recv], c("peer")[recv], self.ranks[recv], c("tag")[recv], c("seq")[recv]])
            _, si, ri = np.intersect1d(sk, rk, assume_unique=False, return_indices=True)
            s_idx, r_idx = send[si], recv[ri]
            self.flow_pairs = np.stack([s_idx, r_idx], axis=1)
            self._repair_clocks(s_idx, r_idx)
            late_sender = np.clip(start[s_idx] - start[r_idx], 0, dur[r_idx])
            late_receiver = np.clip(start[r_idx] - start[s_idx], 0, dur[s_idx])
            unknown_r = wait[r_idx] < 0
            wait[r_idx[unknown_r]] = late_sender[unknown_r]
            unknown_s = wait[s_idx] < 0
            wait[s_idx[unknown_s]] = late_receiver[unknown_s]
        coll = np.nonzero((d == DIR_NONE) & (wait < 0))[0]
        if len(coll):
            ck = _keys([c("chan")[coll], c("seq")[coll], c("kind")[coll]])
            uniq, inv = np.unique(ck, return_inverse=True)
            last = np.full(len(uniq), np.iinfo(np.int64).min)
            np.maximum.at(last, inv, start[coll])
            wait[coll] = np.clip(last[inv] - start[coll], 0, dur[coll])
        still = wait < 0
        self.unmatched = int(still.sum())
        wait[still] = 0

    def _repair_clocks(self, s_idx: np.ndarray, r_idx: np.ndarray) -> None:
        """Shift each rank's times, within its clock error, so that no receive ends before its send starts.

        The clock offsets of ``Tracer.align_clocks`` are exact only to ``clock_error_ns`` (half the best round
        trip): a message faster than that may seem to arrive before it left. Every matched pair between two
        ranks bounds their shifts (``c_s - c_r <= recv end - send start``); the shifts start at 0 (rank 0
        stays put) and are relaxed pair by pair, each clamped to ``+-clock_error_ns`` of its rank, so a
        trace that already satisfies every pair is left alone. Pairs still violated after that are counted
        in :attr:`clock_violations` (a recording error, not the clocks), never hidden."""
        ranks_s, ranks_r = self.ranks[s_idx], self.ranks[r_idx]
        cross = ranks_s != ranks_r
        if not cross.any():
            return
        n = self.nranks
        slack = self.col("t_end")[r_idx[cross]] - self.col("t_start")[s_idx[cross]]
        bound = np.full((n, n), NO_BOUND, dtype=np.int64)   # bound[a, b] >= c_a - c_b
        np.minimum.at(bound, (ranks_s[cross], ranks_r[cross]), slack)
        c = clock_shifts(bound, self.clock_error_ns)
        if c.any():
            shift = c[self.ranks]
            self.events[:, _T_START] += shift
            self.events[:, _T_END] += shift
            self.clock_shift_ns = c
        gap = self.col("t_end")[r_idx[cross]] - self.col("t_start")[s_idx[cross]]
        self.clock_violations = int((gap < 0).sum())

    # -- derived views ---------------------------------------------------------------
    @property
    def t0(self) -> int:
        """Earliest start over all ranks (ns, rank 0's clock)."""
        return int(self.col("t_start").min()) if len(self) else 0

    @property
    def t1(self) -> int:
        """Latest end over all ranks (ns)."""
        return int(self.col("t_end").max()) if len(self) else 0

    def rank_order(self, rank: int) -> np.ndarray:
        """Indices of ``rank``'s events sorted by start time."""
        idx = np.nonzero(self.ranks == rank)[0]
        return idx[np.argsort(self.col("t_start")[idx], kind="stable")]

    def state_arrays(self, ranks: Optional[List[int]] = None) -> Dict[str, np.ndarray]:
        """:meth:`states` as columns (vectorised; the timeline figure uses this on large traces).

        Keys ``rank``, ``state`` (index into :data:`STATE_NAMES`), ``start``, ``end`` (ns from
        :attr:`t0`), ``event`` (index or -1), all int64 of one length, in the order of :meth:`states`
        (rank by rank, each rank's intervals in time order); only those of ``ranks`` when given.
        """
        cols: Dict[str, List[np.ndarray]] = {k: [] for k in ("rank", "state", "start", "end", "event")}
        t0, t1 = self.t0, self.t1
        start_all, end_all, wait_all = self.col("t_start"), self.col("t_end"), self.col("wait")
        for r in (range(self.nranks) if ranks is None else ranks):
            idx = self.rank_order(r)
            st, en, wt = start_all[idx], end_all[idx], wait_all[idx]
            cursor = np.maximum.accumulate(np.maximum(np.maximum(st, en), t0)) if len(idx) else np.empty(0, np.int64)
            before = np.concatenate([[t0], cursor[:-1]]).astype(np.int64) if len(idx) else cursor
            s = np.maximum(st, before)
            e = np.maximum(en, s)
            w = np.minimum(wt, e - s)
            n = len(idx)
            # three slots per event (gap compute, wait, comm), flattened in that order
            starts = np.stack([before, s, s + np.maximum(w, 0)], axis=1)
            ends = np.stack([s, s + np.maximum(w, 0), e], axis=1)
            states = np.broadcast_to(np.array([0, 1, 2], np.int64), (n, 3))
            events = np.stack([np.full(n, -1, np.int64), idx, idx], axis=1)
            keep = np.stack([s > before, w > 0, np.ones(n, bool)], axis=1)
            last = int(cursor[-1]) if n else t0
            tail = last < t1
            cols["rank"].append(np.full(int(keep.sum()) + int(tail), r, np.int64))
            cols["state"].append(np.concatenate([states[keep], [0] if tail else []]).astype(np.int64))
            cols["start"].append(np.concatenate([starts[keep], [last] if tail else []]).astype(np.int64) - t0)
            cols["end"].append(np.concatenate([ends[keep], [t1] if tail else []]).astype(np.int64) - t0)
            cols["event"].append(np.concatenate([events[keep], [-1] if tail else []]).astype(np.int64))
        return {k: (np.concatenate(v) if v else np.empty(0, np.int64)) for k, v in cols.items()}

    def states(self) -> List[Dict[str, Any]]:
        """Non-overlapping state intervals of every rank, for timelines.

        Each item: ``rank``, ``state`` (``compute`` / ``wait`` / ``comm``),
        ``start``/``end`` (ns from :attr:`t0`), ``event`` (index or -1), ``label``.
        Compute fills the gaps between communication over the whole window.
        """
        a = self.state_arrays()
        labels: Dict[int, str] = {}
        out: List[Dict[str, Any]] = []
        for r, k, s, e, i in zip(a["rank"].tolist(), a["state"].tolist(), a["start"].tolist(), a["end"].tolist(),
                                 a["event"].tolist()):
            if i < 0:
                label = "compute"
            else:
                label = labels.get(i)
                if label is None:
                    label = labels[i] = self.op_label(i)
            out.append(dict(rank=r, state=STATE_NAMES[k], start=s, end=e, event=i, label=label))
        return out

    def summary(self) -> Dict[str, Any]:
        """Per-rank compute / communication / wait time and fractions, and traffic matrices.

        Over the common window [t0, t1]: ``wait`` is time spent waiting for a
        partner, ``comm`` the rest of the time inside communication calls,
        ``compute`` everything else. ``bytes[i][j]`` / ``messages[i][j]``: sent
        from rank i to rank j (point-to-point events).
        """
        n = self.nranks
        window = max(self.t1 - self.t0, 0)
        # from the states, where a rank's overlapping slices (a root's messages in flight together) count once
        st = self.state_arrays()
        spent = np.zeros((n, len(STATE_NAMES)), np.int64)
        np.add.at(spent, (st["rank"], st["state"]), st["end"] - st["start"])
        ranks: List[Dict[str, Any]] = []
        kinds = self.col("kind")
        for r in range(n):
            m = self.ranks == r
            w = float(spent[r, STATE_NAMES.index("wait")]) / 1e9
            comm = float(spent[r, STATE_NAMES.index("comm")]) / 1e9
            total = window / 1e9
            compute = max(total - comm - w, 0.0)
            by_kind: Dict[str, int] = {}
            for k, cnt in zip(*np.unique(kinds[m], return_counts=True)):
                by_kind[self.kind_name(int(k))] = int(cnt)
            ranks.append(dict(
                rank=r, host=self.hosts[r] if r < len(self.hosts) else "", total_s=total, compute_s=compute, comm_s=comm, wait_s=w,
                compute_frac=compute / total if total else 0.0,
                comm_frac=comm / total if total else 0.0,
                wait_frac=w / total if total else 0.0,
                events=int(m.sum()), events_by_kind=by_kind, dropped=int(self.dropped[r]),
            ))
        sends = np.nonzero(self.col("dir") == DIR_SEND)[0]
        nbytes = np.zeros((n, n), dtype=np.int64)
        msgs = np.zeros((n, n), dtype=np.int64)
        peer = self.col("peer")[sends]
        ok = (peer >= 0) & (peer < n)
        np.add.at(nbytes, (self.ranks[sends][ok], peer[ok]), self.col("nbytes")[sends][ok])
        np.add.at(msgs, (self.ranks[sends][ok], peer[ok]), 1)
        return dict(nranks=n, window_s=window / 1e9, ranks=ranks, bytes=nbytes.tolist(),
                    messages=msgs.tolist(), unmatched=self.unmatched,
                    clock_error_us=(self.clock_error_ns / 1e3).tolist(),
                    clock_shift_us=(self.clock_shift_ns / 1e3).tolist(), clock_violations=self.clock_violations)

    # -- export ------------------------------------------------------------------------
    def iter_chrome(self, extra: Optional[List[Dict[str, Any]]] = None):
        """The Chrome Trace Event objects of :meth:`to_chrome`, one at a time (rank by rank, in time
        order), then ``extra`` (more events in the same form, e.g. waits still open at the end).
        Holds one rank's state columns at a time, never a list of every slice."""
        for r in range(self.nranks):
            yield dict(ph="M", name="process_name", pid=r, tid=0, args=dict(name=self.lane_name(r)))
            yield dict(ph="M", name="process_sort_index", pid=r, tid=0, args=dict(sort_index=r))
            yield dict(ph="M", name="thread_name", pid=r, tid=0, args=dict(name="state"))
            yield dict(ph="M", name="thread_sort_index", pid=r, tid=0, args=dict(sort_index=0))
        flow_out = dict(zip(self.flow_pairs[:, 0].tolist(), range(1, len(self.flow_pairs) + 1)))
        flow_in = dict(zip(self.flow_pairs[:, 1].tolist(), range(1, len(self.flow_pairs) + 1)))
        a = self.state_arrays()
        c = self.events
        labels: Dict[int, str] = {}
        for r, k, s, e, i in zip(a["rank"].tolist(), a["state"].tolist(), a["start"].tolist(), a["end"].tolist(),
                                 a["event"].tolist()):
            state = STATE_NAMES[k]
            label = "compute" if i < 0 else labels.get(i) or labels.setdefault(i, self.op_label(i))
            ev: Dict[str, Any] = dict(ph="X", name=label if state != "wait" else f"wait: {label}", cat=state, pid=r,
                                      tid=0, ts=s / 1e3, dur=max(e - s, 0) / 1e3)
            if i >= 0:
                row = c[i]
                ev["args"] = dict(op=label, bytes=int(row[_COL["nbytes"]]), peer=int(row[_COL["peer"]]),
                                  tag=int(row[_COL["tag"]]), seq=int(row[_COL["seq"]]), count=int(row[_COL["count"]]),
                                  wait_us=int(row[_COL["wait"]]) / 1e3)
                if state == "comm" and (i in flow_out or i in flow_in):
                    ev["bind_id"] = flow_out[i] if i in flow_out else flow_in[i]
                    ev["flow_out" if i in flow_out else "flow_in"] = True
            yield ev
        yield from extra or []

    def to_chrome(self) -> Dict[str, Any]:
        """Chrome Trace Event JSON (object form) that Perfetto and chrome://tracing open.

        One process per rank (``pid`` = rank, sorted by rank, named by :meth:`lane_name`), one state thread
        per rank whose ``ph:"X"`` slices never overlap (compute / wait / comm),
        timestamps in microseconds from :attr:`t0`, and a flow arrow
        (``bind_id`` with ``flow_out`` on the send, ``flow_in`` on the receive)
        for every matched message.
        """
        return dict(traceEvents=list(self.iter_chrome()), displayTimeUnit="ns",
                    otherData=dict(generator="nbmpi", nranks=self.nranks, unmatched=self.unmatched))

    def save_chrome(self, path: str, extra: Optional[List[Dict[str, Any]]] = None) -> None:
        """Write :meth:`to_chrome` (plus ``extra`` events, see :meth:`iter_chrome`) as JSON to ``path``,
        streamed: one event in memory at a time."""
        with open(path, "w") as f:
            f.write('{"traceEvents": [')
            for k, ev in enumerate(self.iter_chrome(extra)):
                f.write((",\n" if k else "\n") + json.dumps(ev))
            f.write('\n], "displayTimeUnit": "ns", "otherData": ')
            f.write(json.dumps(dict(generator="nbmpi", nranks=self.nranks, unmatched=self.unmatched)) + "}")

    def save(self, path: str) -> None:
        """Save the raw trace (``.npz``) for later analysis with :meth:`load`."""
        np.savez_compressed(path, events=self.events, ranks=self.ranks, nranks=self.nranks,
                            kinds=np.array(self.kinds), dropped=self.dropped,
                            clock_error_ns=self.clock_error_ns, hosts=np.array(self.hosts, dtype=str))

    @classmethod
    def load(cls, path: str) -> "Trace":
        """Load a trace written by :meth:`save` (waits are already attributed)."""
        z = np.load(path)
        return cls(z["events"], z["ranks"], int(z["nranks"]), [str(k) for k in z["kinds"]],
                   dropped=z["dropped"], clock_error_ns=z["clock_error_ns"],
                   hosts=[str(h) for h in z["hosts"]] if "hosts" in z.files else None)
