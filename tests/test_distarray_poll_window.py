"""The scheduler's poll (workers/distarray/scheduler.py ``_Flush._poll``) tests the oldest ``POLL_WINDOW`` requests
in flight, and all of them every ``FULL_POLL_EVERY``-th poll: a completed request inside the window is found by the
next poll, one outside it by the next full poll at the latest, and the units waiting for either are released then.

Real MPI requests on ``COMM_SELF`` in this process (receives from this rank, completed by sends to it), a real
flush object of this process's context; nothing is stubbed."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from nbmpi.workers.distarray import scheduler
from nbmpi.workers.distarray.context import context_for
from nbmpi.workers.distarray.units import Unit, Waitable


@pytest.fixture
def flush_and_requests():
    """A flush with ``POLL_WINDOW + 8`` receives in flight, each with a unit waiting for it; the send buffers."""
    fl = scheduler._Flush(context_for(), "poll window test", True)
    comm = MPI.COMM_SELF
    n = scheduler.POLL_WINDOW + 8
    bufs = [np.zeros(1) for _ in range(n)]
    for k in range(n):
        w = Waitable(comm.Irecv(bufs[k], source=0, tag=100 + k), "recv", 0, 100 + k, 8, 0, f"receive {k}")
        u = Unit("compute", lambda: None, f"unit {k}")
        u.ndeps = 1
        w.units.append(u)
        fl.start(w)
    sends = []
    yield fl, comm, sends
    for w in fl.active:             # complete what is left, so that no request outlives the test
        if not w.req.Test():
            comm.Send(np.zeros(1), dest=0, tag=w.tag)
            w.req.Wait()
    MPI.Request.Waitall(sends)
    fl.dispose()


def _released(fl):
    """Labels of the units made ready (the heap of ready computation units)."""
    return {entry[2].label for entry in fl.ready_comp}


def test_request_outside_the_window_found_by_the_next_full_poll(flush_and_requests):
    fl, comm, sends = flush_and_requests
    n = len(fl.active)
    last = fl.active[-1]                      # outside the window
    sends.append(comm.Isend(np.ones(1), dest=0, tag=last.tag))
    polls = 0
    while not last.done:
        fl._poll()
        polls += 1
        assert polls <= scheduler.FULL_POLL_EVERY, "a completed request outside the window was never found"
    assert polls > 1, "the first poll tested every request: no window"
    assert len(fl.active) == n - 1 and last not in fl.active
    assert _released(fl) == {f"unit {n - 1}"}


def test_request_inside_the_window_found_by_the_next_poll(flush_and_requests):
    fl, comm, sends = flush_and_requests
    n = len(fl.active)
    first = fl.active[0]
    for _ in range(3):                        # polls with nothing complete move the full-poll count on
        fl._poll()
    sends.append(comm.Isend(np.ones(1), dest=0, tag=first.tag))
    sends[-1].Wait()
    fl._poll()
    assert first.done and first not in fl.active and len(fl.active) == n - 1
    assert _released(fl) == {"unit 0"}
    # the request list follows the active list after a completion and after a new request started
    extra = np.zeros(1)
    w = Waitable(comm.Irecv(extra, source=0, tag=99), "recv", 0, 99, 8, 0, "receive extra")
    fl.start(w)
    fl._poll()
    assert [x.req for x in fl.active] == fl._polled_reqs
