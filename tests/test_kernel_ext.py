"""The %distributed magics driven through a real Jupyter kernel (jupyter_client) on a real 2-rank pool."""
from __future__ import annotations

import json
import os
import re
import time

import psutil
import pytest
from jupyter_client.manager import KernelManager

from nbmpi.kernel_ext.output import format_ranks, group_identical, render_groups


def _alive(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


class Kernel:
    """A real ipykernel (jupyter_client), started with ``env`` as its whole environment when given."""

    def __init__(self, env: dict | None = None):
        self.km = KernelManager(kernel_name="python3")   # ipykernel's spec: jupyter_client runs "python" as this interpreter
        self.km.start_kernel(**({"env": dict(env)} if env is not None else {}))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    @property
    def pid(self) -> int:
        return self.km.provisioner.process.pid

    def run(self, code: str, timeout: float = 120, interrupt_after: float | None = None):
        """Execute ``code``; return (status, ename, stdout, stderr, texts of display/results, traceback)."""
        msg_id = self.kc.execute(code)
        out, err, texts, tb, ename = [], [], [], [], None
        t0 = time.monotonic()
        interrupted = False
        while True:
            if interrupt_after is not None and not interrupted and time.monotonic() - t0 > interrupt_after:
                self.km.interrupt_kernel()
                interrupted = True
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except Exception:  # noqa: BLE001 - queue.Empty
                assert time.monotonic() - t0 < timeout, f"cell did not finish within {timeout} s: {code}"
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "stream":
                (out if c["name"] == "stdout" else err).append(c["text"])
            elif t in ("display_data", "execute_result", "update_display_data"):
                texts.append(c["data"].get("text/plain", "") + c["data"].get("text/html", ""))
            elif t == "error":
                ename = c["ename"]
                tb = c["traceback"]
            elif t == "status" and c["execution_state"] == "idle":
                break
        reply = self.kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = self.kc.get_shell_msg(timeout=30)
        return dict(status=reply["content"]["status"], ename=ename, stdout="".join(out), stderr="".join(err),
                    texts=texts, tb="\n".join(tb))

    def shutdown(self):
        if not self.km.has_kernel:
            return
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    r = k.run("%load_ext nbmpi.kernel_ext\n%distributed start -n 2 --name p")
    assert r["status"] == "ok", r
    pids = [p.pid for p in psutil.Process(k.pid).children(recursive=True)]
    yield k, pids
    k.run("%distributed stop p") if _alive(pids) else None
    k.shutdown()


def test_output_grouping_unit():
    assert format_ranks([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    assert group_identical({1: "a", 0: "a", 2: "b", 3: ""}) == [([0, 1], "a"), ([2], "b")]
    assert render_groups({0: "x\n", 1: "x\n"}) == "[ranks 0-1] x\n"


def test_cells_dedupe_and_namespace(kernel):
    k, _ = kernel
    r = k.run("%%distributed\nprint('same')\nprint('mine', rank)\nvalue = rank * 10\nsize")
    assert r["status"] == "ok", r
    assert r["stdout"] == "[rank 0]\nsame\nmine 0\n[rank 1]\nsame\nmine 1\n"
    r = k.run("%%distributed\nprint('identical')\nvalue + 1")
    assert r["stdout"] == "[ranks 0-1] identical\n"
    assert any("[rank 0]: 1" in t and "[rank 1]: 11" in t for t in r["texts"]), r
    r = k.run("%%distributed\nsize")
    assert any("[ranks 0-1]: 2" in t for t in r["texts"]), r


def test_ranks_pull_push(kernel):
    k, _ = kernel
    r = k.run("%%distributed --ranks 1\nprint('only', rank)")
    assert r["stdout"] == "[rank 1] only 1\n"
    r = k.run("%distributed pull value\nprint(value)")
    assert r["stdout"].strip() == "[0, 10]", r
    r = k.run("%distributed pull value --rank 1\nprint(value)")
    assert r["stdout"].strip() == "10", r
    r = k.run("pushed = {'a': 7}\n%distributed push pushed")
    assert r["status"] == "ok", r
    r = k.run("%%distributed\nprint(pushed['a'] + rank)")
    assert r["stdout"] == "[rank 0] 7\n[rank 1] 8\n"
    r = k.run("%%distributed --ranks 0:5\n1")
    assert r["status"] == "error" and "ranks [2, 3, 4]" in r["stderr"], r
    r = k.run("%distributed frobnicate")
    assert r["status"] == "error" and "unknown subcommand 'frobnicate'" in r["stderr"], r
    r = k.run("%%distributed --timeout soon\n1")
    assert r["status"] == "error" and "'soon' is not a number of seconds" in r["stderr"], r


def test_error_on_one_rank(kernel):
    k, _ = kernel
    r = k.run("%%distributed\nfrom nbmpi.workers import ArrayChannel\nch = ArrayChannel(4)\n"
              "if rank == 1:\n    raise ValueError('broken on one')\nch.take(1)")
    assert r["status"] == "error" and r["ename"] == "DistributedCellError", r
    assert "[rank 1] remote traceback:" in r["tb"] and "broken on one" in r["tb"]
    assert "rank 0: was in take(src=1) waiting" in r["tb"], r["tb"]
    r = k.run("%%distributed\nraise RuntimeError('everywhere')")
    assert "[ranks 0-1] remote traceback:" in r["tb"], r["tb"]
    r = k.run("%%distributed\nprint('fine', rank)")
    assert r["status"] == "ok" and "[rank 1] fine 1" in r["stdout"]


def test_rebinding_a_shared_variable_to_a_local_value_is_an_error(kernel):
    k, _ = kernel
    r = k.run("%%distributed\nfrom nbmpi.workers import shared\nsv = shared(0.0)\nsv += 1.0\nsv = shared(5.0)\n"
              "for i in range(2):\n    sv += float(rank)\nprint('value', float(sv))")
    assert r["status"] == "ok" and r["stdout"] == "[ranks 0-1] value 7.0\n", r
    r = k.run("%%distributed\nsv = 2.5 * rank")
    assert r["status"] == "error" and "SharedVariableError" in r["tb"], r
    for q in (0, 1):
        assert f"[rank {q}] remote traceback:" in r["tb"] and f"rank {q}: `sv = ...` assigns a rank-local float" \
            in r["tb"], r["tb"]
    r = k.run("%%distributed\nprint(type(sv).__name__)\nsv_keep = sv\ndel sv\nsv = 2.5 * rank\nprint(sv)")
    assert r["status"] == "ok" and r["stdout"] == "[rank 0]\nSharedVar\n0.0\n[rank 1]\nSharedVar\n2.5\n", r
    # IPython's output cache names are free: `_` holds a shared result after this cell
    r = k.run("%%distributed\nsv_keep * 2.0")
    assert r["status"] == "ok", r
    r = k.run("%%distributed\n_ = [1, 2]\nprint(_)")
    assert r["status"] == "ok" and r["stdout"] == "[ranks 0-1] [1, 2]\n", r


def test_timeout_explains_hang(kernel):
    k, _ = kernel
    r = k.run("%%distributed --timeout 3\nimport time\nif rank == 1:\n    ch.take(0)\nelse:\n    time.sleep(60)")
    assert r["status"] == "error" and r["ename"] == "DistributedTimeout", r
    assert "rank 1: take(src=0) waiting 3." in r["tb"], r["tb"]
    assert "rank 0: at cell line 5 `time.sleep(60)`" in r["tb"], r["tb"]
    r = k.run("%%distributed\nprint('next', rank)")
    assert r["status"] == "ok" and "[rank 0] next 0" in r["stdout"]


def test_interrupt_blocked_take(kernel):
    k, _ = kernel
    r = k.run("%%distributed\nch.take(1 - rank)", interrupt_after=3.0)
    assert r["status"] == "error" and r["ename"] == "DistributedInterrupt", r
    assert "take(src=" in r["tb"], r["tb"]
    r = k.run("%%distributed\nprint('after interrupt', rank)")
    assert r["status"] == "ok" and "[rank 1] after interrupt 1" in r["stdout"], r


def test_timeline_and_trace_save(kernel, tmp_path):
    k, _ = kernel
    r = k.run("%%distributed --timeline\nfor i in range(3):\n    if rank == 0:\n        ch.put(1); ch.take(1)\n"
              "    else:\n        ch.take(0); ch.put(0)")
    assert r["status"] == "ok", r
    bokehjs = [t for t in r["texts"] if "bokeh.min.js" in t]
    html = "".join(t for t in r["texts"] if "bokeh.min.js" not in t)
    assert html.count("<svg") == 1 and "rank 1" in html and "nbmpi-arrow" in html and "wait " in html
    # BokehJS (~1.5 MB) is in the first timeline's output once, and in no later one
    assert len(bokehjs) == 1 and bokehjs[0].count("bokeh.min.js */") == 2, [len(t) for t in bokehjs]
    assert 1_000_000 < len(html) + len(bokehjs[0]) < 2_000_000, len(html) + len(bokehjs[0])
    path = tmp_path / "cell.json"
    r = k.run(f"%distributed trace save {path}")
    assert r["status"] == "ok", r
    data = json.loads(path.read_text())
    assert sum(1 for e in data["traceEvents"] if e.get("flow_out")) == 6
    for _ in range(2):
        r = k.run("%%distributed --timeline\nch.put(1 - rank) if rank == 0 else ch.take(0)")
        assert r["status"] == "ok", r
        later = "".join(r["texts"])
        assert "bokeh.min.js" not in later and later.count("<svg") == 1 and len(later) < 300_000, len(later)


def test_restart_stop_and_shutdown_leave_no_process(kernel):
    k, pids = kernel
    assert len(_alive(pids)) >= 4  # controller (+schedulers), mpiexec, 2 engines
    controller = set()
    for p in psutil.Process(k.pid).children():
        # what a restart keeps: the controller, and the pool's shared-memory sentinel
        if any(w in " ".join(p.cmdline()) for w in ("ipyparallel.controller", "shm_sentinel")):
            controller.add(p.pid)
            controller.update(c.pid for c in p.children(recursive=True))
    ranks_side = set(pids) - controller
    assert controller and len(ranks_side) >= 3, (controller, ranks_side)  # mpiexec (+proxy), 2 engines
    r = k.run("%distributed restart")
    assert r["status"] == "ok", r
    assert not _alive(ranks_side), "processes of the first MPI job survived restart"
    assert sorted(_alive(controller)) == sorted(controller), "restart replaces the ranks, not the controller"
    r = k.run("%%distributed\nprint(rank, size)")
    assert r["stdout"] == "[rank 0] 0 2\n[rank 1] 1 2\n", r
    pids2 = [p.pid for p in psutil.Process(k.pid).children(recursive=True)]
    grand = set(pids2)
    for p in pids2:  # nannies run in their own sessions but are children of the engines
        try:
            grand.update(c.pid for c in psutil.Process(p).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    r = k.run("%distributed status")
    assert "p: 2 ranks (0-1)" in r["stdout"] and "running" in r["stdout"], r
    r = k.run("%distributed stop")
    assert r["status"] == "ok" and "stopped" in r["stdout"], r
    time.sleep(0.5)
    assert not _alive(grand), f"left running after stop: {_alive(grand)}"
    # a pool still running at kernel shutdown is ended too
    r = k.run("%distributed start -n 2 --name q")
    assert r["status"] == "ok", r
    pids3 = set(p.pid for p in psutil.Process(k.pid).children(recursive=True))
    for p in list(pids3):
        pids3.update(c.pid for c in psutil.Process(p).children(recursive=True))
    k.shutdown()
    deadline = time.monotonic() + 15
    while _alive(pids3) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pids3), f"left running after kernel shutdown: {_alive(pids3)}"
    kernel[1].clear()


def test_wedged_and_dead_ranks_break_the_pool():
    """A rank stuck in a raw mpi4py call past --timeout is located (line and MPI call with its peer)
    and the pool is ended (it ignores SIGINT); a rank killed between cells is named; in both cases
    the pool shows as broken and the next cell starts a fresh one instead of hanging."""
    from nbmpi.kernel_ext.magics import INTERRUPT_GRACE

    k = Kernel()
    try:
        r = k.run("%load_ext nbmpi.kernel_ext\n%distributed start -n 2 --name w")
        assert r["status"] == "ok", r
        first = set(p.pid for p in psutil.Process(k.pid).children(recursive=True))
        t0 = time.monotonic()
        r = k.run("%%distributed --timeout 4\nimport time\nimport numpy as np\nbuf = np.zeros(1)\n"
                  "if rank == 0:\n    comm.Recv(buf, source=1)\nelse:\n    time.sleep(60)")
        took = time.monotonic() - t0
        assert r["status"] == "error" and r["ename"] == "DistributedTimeout", r
        assert "rank 0: at cell line 5 `comm.Recv(buf, source=1)`: MPI Recv from rank 1" in r["tb"], r["tb"]
        assert "rank 1: at cell line 7 `time.sleep(60)`" in r["tb"], r["tb"]
        assert "did not stop within" in r["tb"] and "the pool was ended" in r["tb"], r["tb"]
        # documented bound: --timeout + INTERRUPT_GRACE + about 2 s to end the pool (generous margin here)
        assert took < 4 + INTERRUPT_GRACE + 20, f"the timed-out cell returned after {took:.1f} s"
        assert not _alive(first - {k.pid}), "the wedged pool's processes survived"
        r = k.run("%distributed status")
        assert "w: 2 ranks, broken: rank 0 did not stop" in r["stdout"], r
        r = k.run("%%distributed\nimport os\nprint('fresh', rank, os.getpid())")
        assert r["status"] == "ok" and "starting it again" in r["stderr"], r
        pids = {int(line.split()[-1]) for line in r["stdout"].splitlines() if "fresh" in line}
        assert len(pids) == 2, r
        victim = max(pids)   # one rank's pid; which rank it is does not matter
        psutil.Process(victim).kill()
        time.sleep(1.0)
        r = k.run("%%distributed\nprint('never runs')")
        assert r["status"] == "error" and f"(pid {victim}) was killed by SIGKILL" in r["stderr"], r
        assert "never runs" not in r["stdout"], r
        r = k.run("%distributed status")
        assert "broken" in r["stdout"] and "killed by SIGKILL" in r["stdout"], r
        r = k.run("%%distributed\nprint('again', rank)")
        assert r["status"] == "ok" and r["stdout"] == "[rank 0] again 0\n[rank 1] again 1\n", r
    finally:
        k.shutdown()


def test_quickstart_notebook_runs_top_to_bottom(tmp_path):
    from notebook_outputs import execute_notebook

    nb = execute_notebook("01-quickstart.ipynb", tmp_path, timeout=180)
    texts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            texts.append(o.get("text", "") + json.dumps(o.get("data", {})) + "\n".join(o.get("traceback", [])))
    allout = "\n".join(texts)
    assert "[ranks 0-1] buffer[0] = 0.0" in allout  # rank 1 ends holding rank 0's buffer
    assert "<svg" in allout and "[rank 0] sum of (rank+1) over ranks: 3.0" in allout
    assert "something is wrong on rank 1" in allout and "rank 0: completed the cell" in allout
    assert nb.cells[6]["outputs"][0]["data"]["text/plain"] == "[0, 1]"
    assert re.search(r"cell timelines: /proxy/\d+/\?key=[\w-]+ under Jupyter's address", allout), allout[:3000]
    assert "cell timelines server stopped" in allout


def test_connect_to_controller_pool(tmp_path):
    """`%distributed connect` attaches to a pool run by a real `nbmpi serve`; stop only disconnects."""
    from test_server import Server

    srv = Server(tmp_path / "data").start()
    k = None
    try:
        with srv.client() as c:
            r = c.post("/api/v1/pools", json={"ranks": 2, "name": "shared"})
            assert r.status_code == 201, r.text
            pool_id = r.json()["id"]
            k = Kernel()
            r = k.run(f"%load_ext nbmpi.kernel_ext\n%distributed connect {srv.url} --token wrong")
            assert r["status"] == "error" and "401" in r["stderr"], r
            r = k.run(f"%distributed connect {srv.url} --token {srv.token}")
            assert r["status"] == "ok" and "connected to pool 'shared' (2 ranks)" in r["stdout"], r
            r = k.run("%%distributed\nprint('remote', rank, size)")
            assert r["stdout"] == "[rank 0] remote 0 2\n[rank 1] remote 1 2\n", r
            r = k.run(f"%distributed stop\n%distributed connect {srv.url} --token {srv.token} --pool {pool_id} "
                      "--name again\n%distributed status")
            assert "disconnected" in r["stdout"] and "again: 2 ranks" in r["stdout"], r
            assert c.get(f"/api/v1/pools/{pool_id}").json()["state"] == "running"
            k.shutdown()
            assert c.get(f"/api/v1/pools/{pool_id}").json()["state"] == "running"
            c.delete(f"/api/v1/pools/{pool_id}")
    finally:
        if k is not None:
            k.shutdown()
        srv.stop()


def test_notebook_and_controller_run_code_on_a_pool_the_same_way(tmp_path):
    """The same hanging program on the same controller pool, once as a `%%distributed --timeout` cell
    and once as a controller job with a timeout: both go through one runner
    (:mod:`nbmpi.workers.launch.pool_runner`), so both name each rank's operation, peer and line in
    the same words; the pool is usable after each."""
    import re

    from test_server import HANG_JOB, Server, submit, wait_state

    srv = Server(tmp_path / "data").start()
    k = None
    try:
        with srv.client() as c:
            pool = c.post("/api/v1/pools", json={"ranks": 2, "name": "shared"}).json()
            assert pool["state"] == "running", pool
            k = Kernel()
            r = k.run(f"%load_ext nbmpi.kernel_ext\n%distributed connect {srv.url} --token {srv.token}")
            assert r["status"] == "ok", r
            cell = k.run("%%distributed --timeout 3\n" + HANG_JOB)
            assert cell["status"] == "error" and cell["ename"] == "DistributedTimeout", cell
            job = wait_state(c, submit(c, HANG_JOB, ranks=None, pool=pool["id"], timeout=3)["id"],
                             ("succeeded", "failed", "timed_out"), timeout=120)
            assert job["state"] == "timed_out", job

            def said(text: str, rank: int) -> str:
                m = re.search(rf"rank {rank}: (.*?)(?:;|\n|$)", text)
                assert m, (rank, text)
                return re.sub(r"\d+\.\d s", "T s", m.group(1))

            assert said(cell["tb"], 1) == "take(src=0) waiting T s at cell line 5 `ch.take(0)`", cell["tb"]
            assert said(job["message"], 1) == "take(src=0) waiting T s at job.py line 5 `ch.take(0)`", job
            assert said(cell["tb"], 0) == "at cell line 7 `time.sleep(60)` (T s into the cell)", cell["tb"]
            assert said(job["message"], 0) == "at job.py line 7 `time.sleep(60)` (T s into the job)", job
            r = k.run("%%distributed\nprint('still', rank)")
            assert r["status"] == "ok" and r["stdout"] == "[rank 0] still 0\n[rank 1] still 1\n", r
            k.run("%distributed stop")
            c.delete(f"/api/v1/pools/{pool['id']}")
    finally:
        if k is not None:
            k.shutdown()
        srv.stop()


def test_killed_kernel_leaves_no_rank():
    """A kernel killed outright (SIGKILL, no exit handlers) while its ranks spin in a raw MPI receive
    still leaves no engine or mpiexec behind (the owner watchdog and the parent-death signal; about a
    second is expected, the bound here is generous), nor the pool's work directory."""
    k = Kernel()
    try:
        r = k.run("%load_ext nbmpi.kernel_ext\n%distributed start -n 2")
        assert r["status"] == "ok", r
        pids = set(p.pid for p in psutil.Process(k.pid).children(recursive=True))
        for p in list(pids):
            pids.update(c.pid for c in psutil.Process(p).children(recursive=True))
        assert len(pids) >= 4
        # the pool's own work directory: its controller and mpiexec run in it
        work = {c.cwd() for c in psutil.Process(k.pid).children()} - {os.getcwd()}
        assert len(work) == 1 and os.path.basename(next(iter(work))).startswith("nbmpi-pool0-"), work
        k.kc.execute("%%distributed\nimport numpy as np\nbuf = np.zeros(1)\ncomm.Recv(buf, source=1 - rank)")
        time.sleep(2.0)   # both ranks are now blocked in MPI_Recv (MPICH polls: they spin)
        psutil.Process(k.pid).kill()
        t0 = time.monotonic()
        while _alive(pids) and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        took = time.monotonic() - t0
        assert not _alive(pids), f"left running {took:.1f} s after the kernel was killed: {_alive(pids)}"
        assert took < 10, f"the ranks of a killed kernel took {took:.1f} s to go"
        assert not os.path.exists(next(iter(work))), f"the killed kernel's pool left its directory {work}"
    finally:
        k.kc.stop_channels()
        k.km.cleanup_resources()
