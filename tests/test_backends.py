"""The controller's backend interface, driven directly with the local backend (real mpiexec, real
ipyparallel engines), and the rank ledger."""
from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from nbmpi.server.backends import BackendError, JobSpec, PoolSpec, make_backend
from nbmpi.server.backends.local import LocalBackend
from nbmpi.server.ledger import RankLedger
from liveness import running


def spec(tmp_path: Path, code: str, ranks: int = 2, job_id: int = 1, **kw) -> JobSpec:
    job_dir = tmp_path / f"job{job_id}"
    (job_dir / "logs").mkdir(parents=True)
    script = job_dir / "job.py"
    script.write_text(code)
    return JobSpec(id=job_id, owner="alice", ranks=ranks, job_dir=job_dir, script_path=script,
                   log_dir=job_dir / "logs", trace_dir=job_dir / "trace", **kw)


def follow(backend, s, state, timeout=90.0):
    deadline = time.monotonic() + timeout
    while True:
        st = backend.poll(s, state)
        if st.phase == "ended":
            return st
        assert time.monotonic() < deadline, f"job still {st.phase}"
        time.sleep(0.05)


def test_make_backend_names_the_choices():
    assert isinstance(make_backend("local"), LocalBackend)
    with pytest.raises(BackendError, match="unknown backend 'nope'; expected one of local"):
        make_backend("nope")


def test_local_job_succeeds_with_logs_and_trace(tmp_path):
    b = LocalBackend()
    s = spec(tmp_path, "import sys\nfrom nbmpi.workers import ArrayChannel, world\n"
                       "r = world().Get_rank()\nch = ArrayChannel(4)\nch.fill(r + 1)\nch.allreduce('sum')\n"
                       "print('rank', r, float(ch[0]), sys.argv[1:])\n", args=["x"])
    state = b.submit(s)
    assert set(state) == {"pgid", "status_dir", "cgroup"} and json.dumps(state)  # opaque but JSON for the record
    st = follow(b, s, state)
    assert (st.outcome, st.exit_code, st.codes, st.message) == ("succeeded", 0, [0, 0], None)
    for r in (0, 1):
        assert (s.log_dir / f"rank-{r}.stdout").read_text() == f"rank {r} 3.0 ['x']\n"
    assert (s.trace_dir / "trace.json").exists() and (s.trace_dir / "summary.json").exists()


def test_local_job_failure_and_cancel_end_every_rank(tmp_path):
    b = LocalBackend()
    s = spec(tmp_path, "import sys, time\nfrom nbmpi.workers import world\n"
                       "if world().Get_rank() == 1:\n    sys.exit(7)\ntime.sleep(120)\n")
    st = follow(b, s, b.submit(s))
    assert st.outcome == "failed" and st.exit_code == 7 and st.codes == [None, 7]
    assert "rank 1 exited 7; ranks [0] were terminated" in st.message

    s2 = spec(tmp_path, "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n", job_id=2)
    state = b.submit(s2)
    deadline = time.monotonic() + 60
    while len([p for p in s2.log_dir.glob("rank-*.stdout") if p.read_text()]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pids = [int((s2.log_dir / f"rank-{r}.stdout").read_text()) for r in (0, 1)]
    assert b.poll(s2, state).phase == "running"
    st = b.cancel(s2, state)
    assert st.outcome == "cancelled" and st.exit_code == 130
    assert not any(running(p) for p in pids)


def test_local_recover_ends_a_job_it_cannot_follow(tmp_path):
    first = LocalBackend()
    s = spec(tmp_path, "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)\n", ranks=1)
    state = first.submit(s)
    deadline = time.monotonic() + 60
    while not (s.log_dir / "rank-0.stdout").exists() or not (s.log_dir / "rank-0.stdout").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int((s.log_dir / "rank-0.stdout").read_text())
    # a new backend (as after a restart of the service) cannot follow it: it ends it and says so
    assert LocalBackend().recover(s, json.loads(json.dumps(state))) is False
    assert not running(pid)
    first.cancel(s, state)  # reaps the mpiexec child of this test process


def test_local_submit_without_mpiexec_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("NBMPI_MPIEXEC", str(tmp_path / "no-such-mpiexec"))
    s = spec(tmp_path, "print(1)\n")
    with pytest.raises(BackendError, match="could not start mpiexec: NBMPI_MPIEXEC=.*is not an executable"):
        LocalBackend().submit(s)


def test_local_pool_start_stop_and_recover(tmp_path):
    b = LocalBackend()
    ps = PoolSpec(id=1, owner="alice", ranks=2, name="p", work_dir=tmp_path / "pool", timeout=120)
    pool, state = b.start_pool(ps)
    try:
        assert pool.alive() and sorted(state["pids"]) == ["controller", "mpiexec", "ranks"]
        assert pool.client()[:].apply_sync(int, "42") == [42, 42]
        conn = pool.connection_info()
        again = b.recover_pool(conn, state)   # as after a restart: re-attached, not restarted
        assert again is not None and again.attached and again.alive()
        again.stop()                          # an attached pool only disconnects
        assert pool.alive()
    finally:
        b.stop_pool(pool, state)
    ranks = state["pids"]["ranks"]
    assert not any(running(p) for p in ranks)
    assert b.recover_pool(conn, state) is None  # nothing answers any more


def test_rank_ledger_holds_within_capacity():
    led = RankLedger(4)
    assert led.try_hold(("job", 1), 3) and not led.try_hold(("pool", 1), 2)
    assert led.in_use() == 3 and led.free() == 1 and led.holds(("job", 1))
    with pytest.raises(ValueError, match="already holds"):
        led.try_hold(("job", 1), 1)
    led.release(("job", 1))
    assert led.try_hold(("pool", 1), 4) and led.free() == 0
    led.hold(("job", 9), 2)  # found running after a restart: counted even above capacity
    assert led.in_use() == 6
    unlimited = RankLedger(None)
    assert unlimited.try_hold("a", 10**6) and unlimited.free() is None
    with pytest.raises(ValueError, match="at least 1"):
        RankLedger(0)
