"""Run code on the ranks of an engine pool under a deadline, with interrupts and liveness checks.

The one road for user code on a pool: ``%%distributed`` cells
(:mod:`nbmpi.kernel_ext.magics`) and the controller's jobs on a pool
(:mod:`nbmpi.server.pool_manager`) both start a :class:`PoolRun` and call
:meth:`PoolRun.wait`, which polls the request until one of these ends it:

* ``completed``: every rank answered (successfully or with an error);
* ``timed_out``: the ``deadline`` passed. Every rank still running is probed
  first (:func:`probe`: which communication call it is blocked in, with which
  peer, since when, its user-code line and the MPI call there; see
  :mod:`nbmpi.workers.launch.engine_side`), then interrupted (SIGINT through
  ipyparallel's nannies, again every second);
* ``interrupted``: the ``cancel`` event was set, or the caller's thread got a
  ``KeyboardInterrupt`` (the notebook's interrupt button); probed and
  interrupted as above;
* ``error``: a rank failed and the others did not finish within
  ``error_grace`` seconds (e.g. blocked receiving from the failed rank): they
  are probed and interrupted, so a failure never leaves the request hanging;
* ``dead``: a rank's process died, or the pool's controller or engines are
  gone (checked every :data:`LIVENESS_EVERY` s); no rank is interrupted (the
  pool must be ended by its owner).

Ranks that are still running :data:`INTERRUPT_GRACE` seconds after the first
SIGINT are *stuck* (blocked in C code: a raw ``comm.Recv`` never returns to
Python): :attr:`RunEnd.wedged` says so, and the caller ends the pool.
:func:`describe_state` turns a probe answer into the line people read
(``"take(src=0) waiting 12.0 s at cell line 4 `ch.take(0)`"``), the same for a
notebook cell and a controller job.

All of this runs on the caller's thread (the notebook kernel, or the
controller's job thread); it blocks until the run ended.
"""
from __future__ import annotations

import json
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

#: Seconds the other ranks get to finish after one rank failed, before they are interrupted.
ERROR_GRACE = 2.0
#: Seconds interrupted ranks get to stop after the first SIGINT before they count as stuck.
INTERRUPT_GRACE = 3.0
#: Seconds between two liveness checks of the pool while a run waits.
LIVENESS_EVERY = 0.5
#: Longest single wait for the request between two checks (seconds).
POLL_S = 0.1


def probe(pool, ranks: List[int], timeout: float = 1.0) -> Dict[int, Optional[dict]]:
    """Read the state probe of ``ranks`` of ``pool`` (an :class:`~nbmpi.workers.launch.engine_pool.EnginePool`;
    see :func:`nbmpi.workers.launch.engine_side.snapshot`); None where no answer came within
    ``timeout`` seconds. Blocking (at most ``timeout`` per rank); no request to the engines."""
    addrs = pool.probes()
    out: Dict[int, Optional[dict]] = {}
    for r in ranks:
        out[r] = None
        if r not in addrs:
            continue
        try:
            with socket.create_connection(addrs[r], timeout=timeout) as s:
                s.settimeout(timeout)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            out[r] = json.loads(data.decode())
        except (OSError, ValueError):
            pass
    return out


def describe_state(snap: Optional[dict]) -> str:
    """What a rank was doing, from its probe snapshot (:func:`nbmpi.workers.launch.engine_side.snapshot`):
    ``"take(src=0) waiting 12.0 s at cell line 4 `ch.take(0)`"``, ``"at cell line 3
    `comm.Recv(buf, source=1)`: MPI Recv from rank 1 (10.0 s into the cell)"``, ``"running user code
    (3.1 s)"``, ``"idle"``, or ``"no answer from its probe"`` (the rank holds the GIL in C code or died)."""
    from .rank_location import format_location

    if not snap:
        return "no answer from its probe (busy in C code holding the GIL, or the rank died)"
    where = format_location(snap.get("where"))
    if snap.get("op"):
        return f"{snap['op']} waiting {snap['waiting_s']:.1f} s" + (f" at {where}" if where else "")
    if snap.get("running"):
        if where:
            return f"at {where} ({snap['running_s']:.1f} s into the {snap.get('kind') or 'cell'})"
        return f"running user code ({snap['running_s']:.1f} s)"
    return "idle"


@dataclass
class RunEnd:
    """How a :class:`PoolRun` ended (see the module docstring for ``reason``).

    ``stopped``: the ranks that were still running when the run was stopped and were interrupted;
    ``states``: their probe answers then (None: no answer); ``described``: rank -> one line for
    every rank of the run (``stopped`` ones: :func:`describe_state`; the others: their outcome);
    ``stuck``: stopped ranks that ignored SIGINT for ``INTERRUPT_GRACE`` s; ``dead``: the sentence
    naming the ranks or processes that died (reason ``dead`` only).
    """
    reason: str
    stopped: List[int] = field(default_factory=list)
    states: Dict[int, Optional[dict]] = field(default_factory=dict)
    described: Dict[int, str] = field(default_factory=dict)
    stuck: List[int] = field(default_factory=list)
    interrupt_grace: float = INTERRUPT_GRACE
    dead: str = ""

    @property
    def wedged(self) -> str:
        """Why the pool cannot be used any more because ranks ignored SIGINT, or ``""``."""
        if not self.stuck:
            return ""
        where = "; ".join(f"rank {r}: {describe_state(self.states.get(r))}" for r in self.stuck)
        who = f"rank{'s' if len(self.stuck) > 1 else ''} {', '.join(str(r) for r in self.stuck)}"
        return f"{who} did not stop within {self.interrupt_grace:g} s of SIGINT, blocked in C code ({where})"

    def explain(self) -> str:
        """``"rank 0: idle; rank 1: take(src=0) waiting 4.9 s at job.py line 3 ..."``: every rank's line."""
        return "; ".join(f"rank {r}: {self.described[r]}" for r in sorted(self.described))


class PoolRun:
    """One request running on ``ranks`` of ``pool`` (started here by ``submit(view)``, which must
    return the ipyparallel ``AsyncResult`` of a non-blocking ``execute`` or ``apply``).

    Create it on the thread that will :meth:`wait` for it; not thread-safe. The request's
    per-rank metadata (output, errors, results) is :meth:`metadata`.
    """

    def __init__(self, pool, ranks: List[int], submit: Callable[[Any], Any]):
        self.pool = pool
        self.ranks = list(ranks)
        self.client = pool.client()
        self.ar = submit(self.client[self.ranks])
        self._index = {r: i for i, r in enumerate(self.ranks)}   # rank -> index in the request's parts

    # -- reading -------------------------------------------------------------------------------
    def pending(self) -> List[int]:
        """Ranks whose reply has not arrived yet. Local."""
        return [r for r, i in self._index.items() if not self.ar._children[i].done()]

    def metadata(self, rank: int) -> dict:
        """ipyparallel's metadata of ``rank``'s part (``stdout``, ``stderr``, ``status``, ``error``,
        ``outputs``, ``execute_result``). Local; it fills while the run goes on."""
        return self.ar._metadata[self._index[rank]]

    def failed(self) -> bool:
        """Whether some rank answered with an error. Local."""
        return any(self.ar._children[i].done() and self.ar._metadata[i].get("status") == "error"
                   for i in self._index.values())

    def outcome(self, rank: int) -> str:
        """How ``rank`` ended before the others were stopped: ``"raised ValueError before the interrupt"``
        or ``"had completed the cell"``."""
        md = self.metadata(rank)
        err = md.get("error")
        if md.get("status") == "error" and err is not None:
            return f"raised {getattr(err, 'ename', 'an error')} before the interrupt"
        return "had completed the cell"

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the ranks' last output messages (they can arrive after the
        reply, on another channel). Blocking; never raises."""
        try:
            self.ar.wait_for_output(timeout)
        except Exception:  # noqa: BLE001 - output of a rank that died
            pass

    # -- waiting ---------------------------------------------------------------------------------
    def wait(self, deadline: Optional[float] = None, cancel: Optional[threading.Event] = None,
             tick: Optional[Callable[["PoolRun"], None]] = None, error_grace: float = ERROR_GRACE,
             interrupt_grace: float = INTERRUPT_GRACE) -> RunEnd:
        """Block until the run ended (see the module docstring); ``deadline`` is a ``time.monotonic()``
        value, ``cancel`` an event another thread may set, ``tick(run)`` is called about every
        :data:`POLL_S` s while the ranks run (to show or store their output). A ``KeyboardInterrupt``
        on this thread interrupts the ranks and returns (reason ``interrupted``); it is not re-raised."""
        first_error_at: Optional[float] = None
        next_check = time.monotonic() + LIVENESS_EVERY
        try:
            while not self.ar.ready():
                now = time.monotonic()
                if cancel is not None and cancel.is_set():
                    return self.stop("interrupted", interrupt_grace)
                if deadline is not None and now >= deadline:
                    return self.stop("timed_out", interrupt_grace)
                if first_error_at is None and self.failed():
                    first_error_at = now
                if first_error_at is not None and now - first_error_at > error_grace:
                    return self.stop("error", interrupt_grace)
                if now >= next_check:   # a rank process that died never answers: do not wait for it
                    next_check = now + LIVENESS_EVERY
                    dead = self.dead()
                    if dead:
                        return RunEnd("dead", dead=dead)
                if tick is not None:
                    tick(self)
                wait = POLL_S if deadline is None else max(min(POLL_S, deadline - now), 0.001)
                self.ar.wait(wait)
        except KeyboardInterrupt:
            return self.stop("interrupted", interrupt_grace)
        return RunEnd("completed")

    def dead(self) -> str:
        """A sentence naming the ranks of the pool whose process died (as their guards reported it), or
        saying the pool's controller or engines are gone; ``""`` while all live. Local pid checks, then
        the controller's engine ids (no request to the engines)."""
        dead = self.pool.dead_ranks()
        if dead:
            return self.pool.describe_dead(dead)
        if not self.pool.alive():
            return "the pool's controller or engines died"
        return ""

    def stop(self, reason: str, interrupt_grace: float = INTERRUPT_GRACE) -> RunEnd:
        """Probe the ranks still running, interrupt them (SIGINT again every second) and describe every
        rank. Blocking, at most about ``interrupt_grace`` s plus one probe timeout."""
        stopped = self.pending()
        states = probe(self.pool, stopped)
        described = {r: describe_state(states[r]) for r in stopped}
        stuck = self.interrupt(stopped, interrupt_grace)
        for r in self.ranks:
            if r not in stopped:
                described[r] = self.outcome(r)
        return RunEnd(reason, stopped=stopped, states=states, described=described, stuck=stuck,
                      interrupt_grace=interrupt_grace)

    def interrupt(self, ranks: List[int], grace: float = INTERRUPT_GRACE) -> List[int]:
        """SIGINT ``ranks`` (again every second while they run); return those still running after ``grace`` s."""
        end = time.monotonic() + grace
        while True:
            pending = [r for r in self.pending() if r in ranks]
            if not pending:
                return []
            if time.monotonic() >= end:
                return pending
            try:
                self.client.send_signal(signal.SIGINT, targets=pending, block=False)
            except Exception:  # noqa: BLE001 - a nanny that is gone: the rank is reported stuck
                pass
            self.ar.wait(min(1.0, max(end - time.monotonic(), 0.01)))
