"""EnginePool restart on real processes: only the MPI job is replaced while the controller runs (work stuck
on the old ranks does not hold it up), and a pool whose controller died is started anew."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from nbmpi.workers.launch.engine_pool import EnginePool


def _pids_of(pool: EnginePool):
    return pool.client()[pool.ranks].apply_sync(os.getpid)


def _gone(pids, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def pool():
    p = EnginePool(2, name="restart-test")
    p.start(timeout=90)
    holder = {"pool": p}
    yield holder
    holder["pool"].stop(grace=0.0)
    p.stop(grace=0.0)


def test_restart_replaces_stuck_ranks_and_keeps_the_controller(pool):
    p = pool["pool"]
    old = _pids_of(p)
    controller = p.status()["pids"]["controller"]
    stuck = p.client()[1].apply_async(time.sleep, 600)   # a rank that would never answer a clean shutdown
    time.sleep(0.3)
    steps = []
    again = p.restart(progress=steps.append, timeout=90)
    assert again is p and p.status()["state"] == "running"
    assert any("controller stays" in s for s in steps) and steps[-1].endswith("new ranks ready"), steps
    assert _gone(old), f"ranks of the old MPI job survived the restart: {old}"
    assert p.status()["pids"]["controller"] == controller
    new = _pids_of(p)
    assert set(new).isdisjoint(old) and sorted(p.client().ids) == [0, 1]
    # fresh namespaces, a working MPI job
    view = p.client()[p.ranks]
    view.execute("from mpi4py import MPI\ntotal = MPI.COMM_WORLD.allreduce(rank + 1)", block=True)
    assert view.pull("total", block=True) == [3, 3]
    assert not (stuck.ready() and stuck.successful())


def test_restart_after_the_controller_died_starts_a_new_pool(pool):
    p = pool["pool"]
    old = _pids_of(p)
    os.kill(p.status()["pids"]["controller"], signal.SIGKILL)
    fresh = p.restart(timeout=90)
    pool["pool"] = fresh
    assert fresh is not p and fresh.name == p.name and fresh.status()["state"] == "running"
    assert _gone(old), f"ranks of the old pool survived the restart: {old}"
    assert set(_pids_of(fresh)).isdisjoint(old)
