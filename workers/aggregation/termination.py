"""The aggregators' termination detection: the counting waves of ``flush``.

``Aggregator.flush`` is collective over the aggregator's communicator and
covers it and every aggregator reachable through ``reply`` links (the *group*);
it returns on a rank only when every item pushed into any of them (before the
flush, on any rank, or by handlers during it) has been handled on its
destination. :meth:`_Termination._terminate` decides that by repeated
counting with non-blocking ``Iallreduce`` waves (the double-counting / "four
counter" scheme of Mattern, 1987):

* ``s_i`` = buffers rank i has sent (synchronous sends started, all linked
  aggregators), ``r_i`` = buffers rank i has received AND handled; both only
  grow.
* A rank joins a wave only when *idle* for the whole group: no partial buffer
  (they are sent first), no send in flight, no received or local buffer
  unhandled, no staged or overflow reply rows. It contributes its
  ``(s_i, r_i)`` of that instant and keeps progressing while the wave
  completes.
* Termination is declared when two consecutive waves give the same global
  sums ``(S, R)`` with ``S == R``.

Why this is correct: (1) rank i's wave-k snapshot is taken after its
wave-(k-1) Iallreduce completed, which needs every rank's wave-(k-1)
contribution, so all wave-(k-1) snapshots precede all wave-k ones; (2) the
counters are monotone, so equal sums mean every rank's own counters did not
change between its two snapshots: it neither sent nor handled anything in
between; (3) a rank becomes busy only by receiving a buffer (users are inside
flush, handlers run only on received buffers), so each rank stayed idle over
its interval, and all intervals share the instant T = end of wave k-1; (4) at
T the total sent equals the total handled (S == R) and all ranks are idle: no
buffer is in transit or unhandled, no handler can produce more traffic, and
the state is stable. Handler-generated traffic (into any linked aggregator,
whose counters are part of the sums) is covered because a rank with staged,
overflow or partial reply rows is not idle; cycles change nothing in this
argument (it never uses the shape of the links), and they cannot deadlock
because handlers on a cycle spill to the overflow instead of waiting. A single
wave with S == R is NOT enough (a buffer may be sent after its sender was
counted and received before its receiver was), hence two. The decision is
taken on identical global values on every rank, so all ranks leave in the same
wave. A rank that already left may push again at once; another rank still
polling the last wave may receive and handle such a buffer early, which is
harmless (it belongs to the next epoch and its counts are cumulative).

A wave outlives a flush timeout (``_wave``), so the next ``flush()`` resumes
it and the ranks stay in step; if the pending wave ends the old epoch while
this rank has pushed since (``user_pushes`` grew), the rank starts a new epoch
instead of returning.

:class:`_Termination` is a mixin of ``Aggregator``.
"""
from __future__ import annotations

import time
from typing import Any, List, Optional

import numpy as np

from ..tracing import tracer as _tracing
from ..core import waiting
from ..core.errors import AggregationTimeout
from ..core.runtime import MPI
from .progress import _POLLS_BETWEEN_CLOCK_CHECKS, _SPIN_POLLS, _progress_all, _yield

__all__: list = []

K_FLUSH = _tracing.register_kind("agg_flush")
_NONE = _tracing.DIR_NONE
_get_tracer = _tracing.get_tracer
_now = time.perf_counter_ns


class _Termination:
    """Mixin of ``Aggregator``: the counting waves that end a flush. Blocking, collective."""

    def _terminate(self, group: List[Any], timeout: Optional[float]) -> None:
        """Progress every live aggregator and run counting waves over ``group`` (this aggregator
        first) until termination; then count the flush and record one ``agg_flush`` trace event.

        Called by ``flush`` on every rank, after its checks. Blocks; raises
        :class:`AggregationTimeout` after ``timeout`` seconds (None: never) with the wave left
        posted for the next flush; an interrupt marks the aggregator unusable.
        """
        m = MPI()
        t_start = _now()
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        if self._wave is None:  # [request, local, global, previous sums, waves, user pushes at contribution]
            self._wave = [None, np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64), None, 0, 0]
        wave = self._wave
        local, glob = wave[1], wave[2]
        polls = spins = 0
        waiting.current = ("flush", None, t_start)
        try:
            while True:
                req = wave[0]
                if req is not None:
                    if req.Test():
                        spins = 0
                        wave[0] = None
                        wave[4] += 1
                        g = (int(glob[0]), int(glob[1]))
                        if g[0] == g[1] and g == wave[3]:
                            if sum(a._st["user_pushes"] for a in group) == wave[5]:
                                break
                            g = None  # the old epoch ended, but this rank pushed since (resumed flush)
                        wave[3] = g
                        continue
                    _progress_all(True)
                    spins += 1
                    if spins > _SPIN_POLLS:  # spin briefly (a wave takes tens of us), then share the core
                        _yield()
                else:
                    _progress_all(True)
                    if not any(a._busy() for a in group):
                        for a in group:
                            a._send_partials()
                        if not any(a._busy() for a in group):
                            local[0] = sum(a._st["messages_sent"] for a in group)
                            local[1] = sum(a._st["messages_handled"] for a in group)
                            wave[5] = sum(a._st["user_pushes"] for a in group)
                            wave[0] = self.comm.Iallreduce(local, glob, op=m.SUM)
                            continue
                for a in group:
                    if a._broken is not None:
                        a._usable("flush")
                polls += 1
                if polls >= _POLLS_BETWEEN_CLOCK_CHECKS:
                    polls = 0
                    if deadline is not None and time.monotonic() > deadline:
                        self._st["flush_timeouts"] += 1
                        raise self._flush_timeout(wave, t0)
        except KeyboardInterrupt:
            self._broken = "flush was interrupted"
            raise
        finally:
            waiting.current = None
        self._end_flush(group, t_start)

    def _flush_timeout(self, wave: list, t0: float) -> AggregationTimeout:
        """The error of a flush that timed out (``t0``: its start on the monotonic clock)."""
        return AggregationTimeout(
            self.rank, None, f"flush on {self.name}", time.monotonic() - t0,
            f"{'a counting wave is pending' if wave[0] is not None else 'this rank is not idle yet'}"
            f"; last global (sent, handled) = {wave[3]}; here: {self._describe_state()}. "
            f"Nothing is lost and {self.name} stays usable: call flush() again to resume this flush "
            "(every rank must complete it), or close()")

    def _end_flush(self, group: List[Any], t_start: int) -> None:
        """After termination: drop the wave, count the flush and its waves on every aggregator of
        ``group``, record the ``agg_flush`` event (started at ``t_start``)."""
        waves = self._wave[4]
        self._wave = None
        for a in group:
            a._st["flushes"] += 1
            a._st["waves"] += waves
        self._flush_seq += 1
        tr = _get_tracer()
        if tr.enabled:
            tr.record(K_FLUSH, _NONE, -1, 0, 0, t_start, _now(), -1, self._flush_seq, self.chan_id, waves)
