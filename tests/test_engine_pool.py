"""EnginePool restart on real processes: only the MPI job is replaced while the controller runs (work stuck
on the old ranks does not hold it up), and a pool whose controller died is started anew."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


_OWNER = """
import json, sys, time
from nbmpi.workers.launch.engine_pool import EnginePool
p = EnginePool(2, name="orphaned-shm").start(timeout=90)
print(json.dumps(dict(status_dir=p.status_dir, work_dir=p.work_dir)), flush=True)
time.sleep(600)
"""


def test_owner_dying_while_it_ends_the_pool_leaves_no_shared_memory():
    """The owner (a notebook kernel) dies after the pool's ranks and guards were SIGKILLed and before it
    removed their /dev/shm segments (jupyter_client kills a kernel that is slow to shut down): the pool's
    shared-memory sentinel removes MPICH's segment all the same."""
    import json
    import shutil
    import subprocess
    import sys

    from nbmpi.workers.launch.processes import noted_segments, remove_shm

    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    tree, segments, info = [], set(), {}
    try:
        info = json.loads(owner.stdout.readline())
        segments = {s for s in noted_segments(info["status_dir"]) if os.path.lexists(s)}
        assert any(os.path.basename(s).startswith("mpich_shm_") for s in segments), segments
        tree = psutil.Process(owner.pid).children(recursive=True)
        for p in list(tree):   # (the engines' nannies run in sessions of their own)
            tree += [c for c in p.children(recursive=True) if c not in tree]
        pool = [p for p in tree if "shm_sentinel" not in " ".join(p.cmdline())]
        assert len(pool) < len(tree), "the pool has no shared-memory sentinel"
        # as the owner's end_processes does after its grace period, but nobody gets to clean up after it:
        # everything is frozen first, so no guard sees its rank die and no rank sees its owner die
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in [owner.pid] + [p.pid for p in pool]:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
        owner.wait(timeout=10)
        assert _gone([p.pid for p in pool]), "the pool's processes survived SIGKILL"
        deadline = time.monotonic() + 40
        while [s for s in segments if os.path.lexists(s)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = sorted(s for s in segments if os.path.lexists(s))
        assert not left, f"the dead owner's pool left its shared memory in /dev/shm: {left}"
        assert _gone([p.pid for p in tree]), "the sentinel did not end after removing the segments"
    finally:
        for p in [owner.pid] + [p.pid for p in tree]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        owner.wait(timeout=10)
        _gone([p.pid for p in tree])
        remove_shm(segments)
        if info.get("work_dir"):
            shutil.rmtree(info["work_dir"], ignore_errors=True)


def test_attached_pool_disconnects_and_removes_only_its_own_directory(pool):
    """``attach`` makes a directory of its own; ``stop`` of the attached pool disconnects and removes it, and leaves
    the owner's pool, its processes and its directory alone; the owner's stop removes the owner's directory."""
    p = pool["pool"]
    attached = EnginePool.attach(p.connection_info())
    assert attached.attached and attached.work_dir != p.work_dir and os.path.isdir(attached.work_dir)
    assert attached.client()[attached.ranks].apply_sync(os.getpid) == _pids_of(p)
    attached.stop()
    assert not os.path.exists(attached.work_dir), f"the attached pool left {attached.work_dir}"
    assert p.status()["state"] == "running" and os.path.isdir(p.work_dir)
    assert len(_pids_of(p)) == 2
    # a process that attaches and exits without stopping: disconnected at exit, its directory removed
    code = ("import json, sys\nfrom nbmpi.workers.launch.engine_pool import EnginePool\n"
            "print(EnginePool.attach(json.loads(sys.stdin.read())).work_dir, flush=True)")
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(p.connection_info()), capture_output=True,
                          text=True, timeout=120)
    left = done.stdout.strip()
    assert done.returncode == 0 and left.startswith("/"), done
    assert not os.path.exists(left), f"an attaching process that exited left {left}"
    assert p.status()["state"] == "running" and len(_pids_of(p)) == 2
    p.stop(grace=0.0)
    assert not os.path.exists(p.work_dir), f"the owner's stop left {p.work_dir}"
