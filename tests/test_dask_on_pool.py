"""Dask on a pool, through a real Jupyter kernel running the %distributed magics on a real 2-rank pool:
`%distributed dask` gives a distributed.Client whose workers run in the ranks' processes (pids), a Dask
computation runs there, a DistArray becomes a dask.array whose chunk r is held by rank r's worker and
comes back as a DistArray equal to NumPy (also with a rank holding no rows), and stopping the pool leaves
no process of it (ranks, mpiexec, controller with the scheduler). Also the example notebook
08-dask-on-the-pool.ipynb, executed top to bottom, and the link helper of jupyter-server-proxy."""
from __future__ import annotations

import json
import time

import numpy as np
import psutil
import pytest

from liveness import running
from test_kernel_ext import Kernel

from nbmpi.workers.launch.jupyter_proxy import base_url, proxied_path


def _lines(r) -> dict:
    """The ``KEY=JSON`` lines a cell printed."""
    out = {}
    for line in r["stdout"].splitlines():
        if "=" in line and line.split("=", 1)[0].isidentifier():
            k, v = line.split("=", 1)
            out[k] = json.loads(v)
    return out


def _ok(k: Kernel, code: str, timeout: float = 180) -> dict:
    r = k.run(code, timeout=timeout)
    assert r["status"] == "ok", (code, r["stdout"], r["tb"][-3000:])
    return r


def test_proxied_paths(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    assert proxied_path(8787, "status") == "/proxy/8787/status"
    assert proxied_path(8000, "/dashboard") == "/proxy/8000/dashboard"
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    assert base_url() == "/user/alice/"
    assert proxied_path(8000, "dashboard") == "/user/alice/proxy/8000/dashboard"
    assert proxied_path(8000, "dashboard", base="/lab") == "/lab/proxy/8000/dashboard"
    with pytest.raises(ValueError, match="TCP port"):
        proxied_path(0)


def _rank_pids(k: Kernel, pool_pids: list) -> list:
    """The pids of the pool's two ranks (asked from the ranks), checked to be the kernel's children."""
    _ok(k, "%%distributed\nimport os\nmy_pid = os.getpid()")
    r = _ok(k, "%distributed pull my_pid\nimport json\nprint('rank_pids=' + json.dumps(my_pid))")
    rank_pids = _lines(r)["rank_pids"]
    assert len(set(rank_pids)) == 2 and all(p in pool_pids for p in rank_pids), (rank_pids, pool_pids)
    return rank_pids


def _check_dask_runs_on_the_ranks(k: Kernel, rank_pids: list) -> None:
    """`%distributed dask` starts one worker per rank in the ranks' processes, a computation runs there,
    and a second `%distributed dask` keeps the same cluster."""
    r = _ok(k, "%distributed dask")
    assert "Dask on pool 'dk': 2 workers, one per rank" in r["stdout"], r
    assert f"rank 0: pid {rank_pids[0]}, rank 1: pid {rank_pids[1]}" in r["stdout"], r
    assert "/proxy/" in r["stdout"] and "/status" in r["stdout"], r
    r = _ok(k, "import os\n"
               "print('worker_pids=' + json.dumps(sorted(dask_client.run(os.getpid).values())))\n"
               "res = dask_client.gather(dask_client.map(lambda i: (os.getpid(), i * i), range(8)))\n"
               "print('task_pids=' + json.dumps(sorted({p for p, _ in res})))\n"
               "print('squares=' + json.dumps([v for _, v in res]))\n"
               "print('kernel_pid=' + json.dumps(os.getpid()))")
    got = _lines(r)
    assert got["worker_pids"] == sorted(rank_pids)
    assert set(got["task_pids"]) <= set(rank_pids) and got["squares"] == [i * i for i in range(8)]
    assert got["kernel_pid"] not in got["task_pids"]
    r = _ok(k, "%distributed dask\nprint('n_workers=' + json.dumps(len(dask_client.scheduler_info()['workers'])))")
    assert _lines(r)["n_workers"] == 2


def _check_distarray_to_dask_and_back(k: Kernel) -> None:
    """DistArray -> dask.array (chunk r held by rank r's worker) -> DistArray equal to NumPy, also with a
    rank holding no rows."""
    _ok(k, "%%distributed\nimport numpy as np\nimport nbmpi.workers.distarray as dnp\n"
           "x = np.arange(7 * 5, dtype=np.float64).reshape(7, 5)\n"
           "a = dnp.from_numpy(x, dist='cyclic')\nt = dnp.from_numpy(np.arange(3.0).reshape(1, 3))")
    r = _ok(k, "from nbmpi.workers.launch.dask_on_pool import to_dask, from_dask\n"
               "d = to_dask('a')\n"
               "print('chunks=' + json.dumps(d.chunks))\n"
               "held = dask_client.run(lambda dask_worker: sorted(str(key) for key in dask_worker.data "
               "if str(key).startswith('nbmpi-a-')))\n"
               "print('held=' + json.dumps({str(dask_client.scheduler_info()['workers'][w]['name']): v "
               "for w, v in held.items()}))\n"
               "y = (d * 2 + 1).T.T\n"
               "print('y=' + json.dumps(y.compute().tolist()))\n"
               "from_dask(y, 'b')\n"
               "dt = to_dask('t')\nprint('t_chunks=' + json.dumps(dt.chunks))\nfrom_dask(dt[:, ::-1], 'u')")
    got = _lines(r)
    x = np.arange(35.0).reshape(7, 5)
    assert got["chunks"] == [[4, 3], [5]]
    assert [len(got["held"][f"rank-{i}"]) for i in (0, 1)] == [1, 1], got["held"]
    assert got["held"]["rank-0"][0].endswith("-r0") and got["held"]["rank-1"][0].endswith("-r1")
    assert np.array_equal(np.array(got["y"]), 2 * x + 1)
    assert got["t_chunks"] == [[1], [3]]   # rank 1 holds no row of t: no chunk
    r = _ok(k, "%%distributed\nimport json\n"
               "print('b=' + json.dumps([b.dist.kind, b.local_rows.tolist(), b.local.tolist(), "
               "b.to_numpy().tolist()]))\n"
               "print('u=' + json.dumps([u.shape, u.local.tolist(), u.to_numpy().tolist()]))")
    per_rank = r["stdout"].split("[rank 1]")
    assert len(per_rank) == 2, r["stdout"]
    b0, b1 = (_lines(dict(stdout=s)) for s in per_rank)
    assert b0["b"][0] == "block" and b0["b"][1] == [0, 1, 2, 3] and b1["b"][1] == [4, 5, 6]
    assert np.array_equal(np.array(b0["b"][2]), 2 * x[:4] + 1)
    assert np.array_equal(np.array(b1["b"][2]), 2 * x[4:] + 1)
    assert np.array_equal(np.array(b0["b"][3]), 2 * x + 1) and b0["b"][3] == b1["b"][3]
    assert b0["u"] == [[1, 3], [[2.0, 1.0, 0.0]], [[2.0, 1.0, 0.0]]] and b1["u"][1] == []


def _check_stop_leaves_nothing(k: Kernel) -> None:
    """`%distributed stop` closes the Dask client and ends every process of the pool; Dask is then gone."""
    alive_before = [p for p in psutil.Process(k.pid).children(recursive=True)]
    assert len(alive_before) >= 4, alive_before
    r = _ok(k, "%distributed stop dk\nprint('status=' + json.dumps(dask_client.status))")
    assert _lines(r)["status"] == "closed"
    deadline = time.monotonic() + 20
    while [p for p in alive_before if running(p.pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [" ".join(p.cmdline()) for p in alive_before if running(p.pid)]
    assert not left, f"the pool left processes: {left}"
    assert not [c for c in psutil.Process(k.pid).children(recursive=True) if running(c.pid)]
    r = k.run("to_dask('a')")
    assert r["status"] == "error" and "Dask is not running" in r["tb"], r


def test_dask_on_pool_through_a_kernel():
    k = Kernel()
    pool_pids = []
    try:
        _ok(k, "%load_ext nbmpi.kernel_ext\n%distributed start -n 2 --name dk")
        pool_pids = [p.pid for p in psutil.Process(k.pid).children(recursive=True)]
        rank_pids = _rank_pids(k, pool_pids)
        _check_dask_runs_on_the_ranks(k, rank_pids)
        _check_distarray_to_dask_and_back(k)
        # a name that is not a DistArray: one clear error, the pool and Dask stay usable
        r = k.run("to_dask('my_pid')")
        assert r["status"] == "error" and "is int, not a DistArray" in r["tb"], r
        _check_stop_leaves_nothing(k)
    finally:
        if [p for p in pool_pids if running(p)]:
            k.run("%distributed stop dk")   # the pool's own end (its shared memory too), also after a failure
        k.shutdown()
        for pid in pool_pids:   # a failed test still ends what it started, by pid
            if running(pid):
                psutil.Process(pid).kill()


def test_dask_notebook(tmp_path):
    from test_notebooks import run_notebook

    run = run_notebook("08-dask-on-the-pool.ipynb", tmp_path)
    start, dask, _, tasks, ranks, arrays, back, stop = (run.text(i) for i in range(8))
    assert "2 ranks" in start and "ready" in start, start
    assert "Dask on pool 'pool0': 2 workers, one per rank (rank 0: pid " in dask, dask
    assert "Dask dashboard (through Jupyter, jupyter-server-proxy): /proxy/" in dask, dask
    assert tasks.endswith("longest Collatz chain below 2001 starts at 1161 with 181 steps\n"
                          "tasks ran in the ranks' processes only: True\nthe workers are the ranks: True\n"), tasks
    assert "[rank 0] rank 0 holds rows [0, 2, 4, 6, 8]" in ranks and "[rank 1] rank 1 holds rows [1, 3, 5, 7, 9]" in ranks
    assert arrays == ("chunks: ((5, 5), (4,))\nchunk of each worker: {'rank-0': ['r0'], 'rank-1': ['r1']}\n"
                      "row norms equal NumPy's: True\n"), arrays
    assert "[rank 0] rank 0 rows [0, 1, 2, 3, 4] | equal to NumPy: True" in back, back
    assert "[rank 1] rank 1 rows [5, 6, 7, 8, 9] | equal to NumPy: True" in back, back
    assert stop == ("pool 'pool0' stopped\ncell timelines server stopped (no pool started here runs)\n"
                    "Dask client: closed\n"), stop


def test_dask_from_python_restart_and_dashboard_through_jupyter(tmp_path):
    """From Python (no magics): start, the scheduler's dashboard through a real jupyter server with
    jupyter-server-proxy, a restart of the pool ends the Dask client and workers and Dask starts again on the
    new ranks, stop(pool) ends Dask and keeps the pool, and the pool's stop leaves no process."""
    import httpx

    from test_jupyter_proxy import JupyterServer

    from nbmpi.workers.launch import dask_on_pool
    from nbmpi.workers.launch.engine_pool import EnginePool, EnginePoolError

    pool = EnginePool(2, name="dpy")
    jup = None
    procs = []
    try:
        pool.start()
        client = dask_on_pool.start(pool)
        assert dask_on_pool.start(pool) is client
        d = dask_on_pool.running(pool)
        assert sorted(w["pid"] for w in d.workers.values()) == sorted(i["pid"] for i in pool.rank_info)
        assert d.dashboard_port and d.dashboard_path() == f"/proxy/{d.dashboard_port}/status"
        jup = JupyterServer(tmp_path).start()
        with httpx.Client(base_url=jup.url, timeout=60, follow_redirects=True) as web:
            assert web.get("/api/status", params={"token": jup.token}).status_code == 200
            page = web.get(d.dashboard_path())
            assert page.status_code == 200 and "Dask" in page.text, page.text[:300]
            workers = web.get(f"/proxy/{d.dashboard_port}/info/main/workers.html")
            assert workers.status_code == 200 and "rank-0" in workers.text and "rank-1" in workers.text
        old_pids = sorted(w["pid"] for w in d.workers.values())
        assert pool.restart() is pool
        assert client.status == "closed"
        with pytest.raises(EnginePoolError, match="Dask is not running on pool 'dpy'"):
            dask_on_pool.running(pool)
        client2 = dask_on_pool.start(pool)
        new = dask_on_pool.running(pool)
        assert sorted(w["pid"] for w in new.workers.values()) == sorted(i["pid"] for i in pool.rank_info)
        assert not set(old_pids) & {w["pid"] for w in new.workers.values()}
        assert client2.submit(lambda: 6 * 7).result(timeout=60) == 42
        host, port = new.scheduler.rsplit("/", 1)[1].rsplit(":", 1)
        dask_on_pool.stop(pool)
        assert client2.status == "closed" and pool.status()["state"] == "running"
        import socket
        with pytest.raises(OSError):   # the scheduler no longer listens
            socket.create_connection((host, int(port)), timeout=5).close()
        procs = [psutil.Process(p) for p in pool._descendants if running(p)]
        import os
        assert pool.client()[:].apply_sync(os.getpid) == [i["pid"] for i in pool.rank_info]   # the ranks go on
    finally:
        if jup is not None:
            jup.stop()
        pool.stop()
    deadline = time.monotonic() + 20
    while [p for p in procs if running(p.pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p.pid for p in procs if running(p.pid)]
