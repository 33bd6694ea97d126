"""The controller against a real `nbmpi serve` subprocess (random 127.0.0.1 port, temporary
data directory, real SQLite, real mpiexec): jobs, logs, trace, cancel, timeout, queue,
restart with a lost job, tokens and users, malformed requests, the CLI client."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional

import httpx
import psutil
import pytest

from liveness import running
from nbmpi.server.auth import hash_token

REPO = Path(__file__).resolve().parent.parent
BOB_TOKEN = "bob-token-0123456789abcdefghijklmnop"

CHANNEL_JOB = """
import sys
import numpy as np
from nbmpi.workers import ArrayChannel, world
r = world().Get_rank()
ch = ArrayChannel((1000,), np.float64)
ch.fill(r)
if r == 0:
    ch.put(1); ch.take(1)
else:
    ch.take(0); ch[...] += 1; ch.put(0)
ch.allreduce("sum")
print(f"rank {r} value {ch[0]} args {sys.argv[1:]}")
print(f"stderr of rank {r}", file=sys.stderr)
"""

SLEEP_JOB = """
import os, time
from nbmpi.workers import world
print("pid", os.getpid(), flush=True)
time.sleep({seconds})
print("slept", flush=True)
"""


class Server:
    """A real `nbmpi serve` subprocess on a free port with its own data directory."""

    def __init__(self, data_dir: Path, max_ranks: int = 2, extra_args=(), python: str = sys.executable,
                 env: Optional[dict] = None):
        self.python = python
        self.env = dict(env or {})
        self.data_dir = data_dir
        self.max_ranks = max_ranks
        self.extra_args = list(extra_args)
        self.proc = None
        self.url = None

    def start(self) -> "Server":
        env = dict(os.environ, NBMPI_CONFIG=str(self.data_dir.parent / "client.json"), NBMPI_TIMEOUT="60",
                   **self.env)
        self.proc = subprocess.Popen(
            [self.python, "-m", "nbmpi.server.cli", "serve", "--port", "0", "--data-dir", str(self.data_dir),
             "--max-ranks", str(self.max_ranks), *self.extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while self.url is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"nbmpi serve exited {self.proc.wait()} before listening")
            if "listening on " in line:
                self.url = line.split("listening on ")[1].split()[0]
            assert time.monotonic() < deadline, "nbmpi serve did not start"
        while True:
            try:
                if httpx.get(self.url + "/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "nbmpi serve did not answer /api/health"
            time.sleep(0.1)
        # the users file keeps only hashes: the token is the one `nbmpi serve` wrote to the client config
        config = self.data_dir.parent / "client.json"   # absent when the test wrote the users file itself
        self.token = json.loads(config.read_text())["token"] if config.exists() else None
        return self

    def add_bob(self) -> None:
        users = json.loads((self.data_dir / "users.json").read_text())
        users[hash_token(BOB_TOKEN)] = "bob"
        (self.data_dir / "users.json").write_text(json.dumps(users))

    def client(self, token=None) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60,
                            headers={"Authorization": f"Bearer {token or self.token}"})

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()


def job_processes(data_dir: Path):
    """Processes (mpiexec, ranks) whose launcher status directory lies in ``data_dir``."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("NBMPI_STATUS_DIR", "").startswith(str(data_dir)):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def wait_state(c: httpx.Client, job_id: int, states, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = c.get(f"/api/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['state']} after {timeout} s"
        time.sleep(0.1)


def submit(c: httpx.Client, code: str, ranks: Optional[int] = 2, **kw) -> dict:
    """POST a job of ``code`` (dedented) on ``ranks`` ranks (None: the service's default); its record."""
    body = dict(code=textwrap.dedent(code), **kw)
    if ranks is not None:
        body["ranks"] = ranks
    r = c.post("/api/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def pids_from_logs(c: httpx.Client, job_id: int, ranks: int, timeout: float = 60):
    deadline = time.monotonic() + timeout
    pids = {}
    while len(pids) < ranks:
        for r in range(ranks):
            text = c.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": r}).text
            if text.startswith("pid "):
                pids[r] = int(text.split()[1])
        assert time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.1)
    return pids


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # alice and bob in the service's own account: the unsafe mode (tests/test_isolation.py: one account each)
    srv = Server(tmp_path_factory.mktemp("srv") / "data", extra_args=["--unsafe-shared-account"]).start()
    srv.add_bob()
    yield srv
    srv.stop()
    assert srv.proc.returncode is not None
    assert job_processes(srv.data_dir) == [], "a job process survived the service"


def test_open_endpoints_and_tokens(server):
    health = httpx.get(server.url + "/api/health").json()
    assert health["status"] == "ok" and health["isolation"] == "shared-account"
    assert "UNSAFE" in health["warning"] and "UNSAFE" in httpx.get(server.url + "/dashboard").text
    assert httpx.get(server.url + "/api/version").json()["api"] == "v1"
    for path in ("/api/v1/jobs", "/api/v1/jobs/1", "/api/v1/pools"):
        r = httpx.get(server.url + path)
        assert r.status_code == 401 and "token" in r.json()["detail"]
        r = httpx.get(server.url + path, headers={"Authorization": "Bearer wrong-token-wrong-token"})
        assert r.status_code == 401
        r = httpx.get(server.url + path, headers={"Authorization": "Basic abc"})
        assert r.status_code == 401
    assert (server.data_dir / "users.json").stat().st_mode & 0o777 == 0o600


def test_users_file_created_owner_only(tmp_path):
    srv = Server(tmp_path / "data").start()
    try:
        assert (tmp_path / "data" / "users.json").stat().st_mode & 0o777 == 0o600
        cfg = tmp_path / "client.json"
        assert cfg.stat().st_mode & 0o777 == 0o600
        assert json.loads(cfg.read_text()) == {"url": srv.url, "token": srv.token}
    finally:
        srv.stop()


def test_channel_job_logs_trace_summary(server):
    with server.client() as c:
        job = submit(c, CHANNEL_JOB, args=["a", "b c"])
        assert job["state"] in ("queued", "running")
        job = wait_state(c, job["id"], ("succeeded", "failed"))
        assert job["state"] == "succeeded", job
        assert job["rank_exit_codes"] == [0, 0] and job["exit_code"] == 0
        assert job["started_at"] >= job["created_at"] and job["finished_at"] >= job["started_at"]
        for r in (0, 1):
            out = c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text
            assert out == f"rank {r} value 2.0 args ['a', 'b c']\n"
            err = c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r, "stream": "stderr"}).text
            assert err == f"stderr of rank {r}\n"
        assert c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": 2}).status_code == 404
        trace = c.get(f"/api/v1/jobs/{job['id']}/trace").json()
        pids = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
        assert pids == {0, 1}
        names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
        assert "put(dest=1)" in names and "take(src=0)" in names
        summary = c.get(f"/api/v1/jobs/{job['id']}/summary").json()
        assert summary["nranks"] == 2
        assert summary["bytes"][0][1] >= 8000 and summary["bytes"][1][0] >= 8000
        for r in summary["ranks"]:
            assert {"compute_s", "comm_s", "wait_s"} <= set(r)
        listed = c.get("/api/v1/jobs", params={"state": "succeeded"}).json()["jobs"]
        assert job["id"] in [j["id"] for j in listed]


def test_failing_rank(server):
    with server.client() as c:
        job = submit(c, """
            import sys, time
            from nbmpi.workers import world
            if world().Get_rank() == 1:
                raise SystemExit(3)
            time.sleep(60)
            """)
        job = wait_state(c, job["id"], ("succeeded", "failed"))
        assert job["state"] == "failed" and job["exit_code"] == 3
        assert job["rank_exit_codes"][1] == 3 and job["rank_exit_codes"][0] is None
        assert "rank 1 exited 3" in job["message"]
        trace = c.get(f"/api/v1/jobs/{job['id']}/trace")   # what was recorded up to the end
        lanes = {f"rank {r} ({socket.gethostname()})" for r in (0, 1)}   # the streamed trace knows each rank's host
        assert trace.status_code == 200 and lanes <= {e["args"]["name"] for e in trace.json()["traceEvents"]
                                                      if e["name"] == "process_name"}


def test_cancel_leaves_no_process(server):
    with server.client() as c:
        job = submit(c, SLEEP_JOB.format(seconds=120))
        pids = pids_from_logs(c, job["id"], 2)
        assert all(psutil.pid_exists(p) for p in pids.values())
        r = c.delete(f"/api/v1/jobs/{job['id']}")
        assert r.status_code == 200 and r.json()["state"] == "cancelled"
        for p in pids.values():
            assert not running(p)
        assert job_processes(server.data_dir) == []
        job = c.get(f"/api/v1/jobs/{job['id']}").json()
        assert job["state"] == "cancelled" and job["exit_code"] == 130
        # cancelling again changes nothing
        assert c.delete(f"/api/v1/jobs/{job['id']}").json()["state"] == "cancelled"


def test_timeout(server):
    with server.client() as c:
        job = submit(c, SLEEP_JOB.format(seconds=120), timeout=3)
        pids = pids_from_logs(c, job["id"], 2)
        job = wait_state(c, job["id"], ("timed_out", "succeeded", "failed"))
        assert job["state"] == "timed_out" and job["exit_code"] == 124
        assert not any(running(p) for p in pids.values())
        assert job_processes(server.data_dir) == []


def test_queue_respects_max_ranks(server):
    with server.client() as c:
        ids = [submit(c, SLEEP_JOB.format(seconds=1))["id"] for _ in range(3)]
        jobs = [wait_state(c, i, ("succeeded", "failed", "lost")) for i in ids]
        assert [j["state"] for j in jobs] == ["succeeded"] * 3
        spans = sorted((j["started_at"], j["finished_at"], j["id"]) for j in jobs)
        assert [s[2] for s in spans] == ids  # admitted in submission order
        for (s0, e0, _), (s1, e1, _) in zip(spans, spans[1:]):
            assert s1 >= e0  # --max-ranks 2: one 2-rank job at a time


def test_other_users_jobs_are_invisible(server):
    with server.client() as c:
        job = submit(c, "print('mine')", ranks=1)
        wait_state(c, job["id"], ("succeeded", "failed"))
    with server.client(BOB_TOKEN) as bob:
        for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/logs"), ("GET", "/trace"),
                             ("GET", "/summary")):
            r = bob.request(method, f"/api/v1/jobs/{job['id']}{path}")
            assert r.status_code == 404, (method, path, r.text)
        assert job["id"] not in [j["id"] for j in bob.get("/api/v1/jobs").json()["jobs"]]
        mine = submit(bob, "print('bob')", ranks=1)
        assert mine["owner"] == "bob"
    with server.client() as c:
        assert c.get(f"/api/v1/jobs/{mine['id']}").status_code == 404
        assert c.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "succeeded"


def test_malformed_requests_are_4xx(server):
    with server.client() as c:
        before = len(c.get("/api/v1/jobs").json()["jobs"])
        bad = [
            ("POST", "/api/v1/jobs", {"content": b"{not json"}),
            ("POST", "/api/v1/jobs", {"content": b"[1, 2]"}),
            ("POST", "/api/v1/jobs", {"content": b"", "headers": {"content-type": "application/json"}}),
            ("POST", "/api/v1/jobs", {"data": {"code": "x"}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)"}}),  # no ranks, no pool
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": 0}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": 3}}),  # > --max-ranks
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": "two"}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": 2, "colour": "red"}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "", "ranks": 1}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "x" * (1 << 20 + 1), "ranks": 1}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "x" * ((1 << 20) + 1), "ranks": 1}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": 1, "timeout": -1}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": 1, "env": {"A B": "x"}}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": 1, "args": "notalist"}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": 1, "script_name": "../x.py"}}),
            ("POST", "/api/v1/jobs", {"json": {"code": "print(1)", "ranks": 1, "pool": 999}}),
            ("GET", "/api/v1/jobs/abc", {}),
            ("GET", "/api/v1/jobs/0", {}),
            ("GET", "/api/v1/jobs/99999999999999999999999", {}),
            ("GET", "/api/v1/jobs/424242", {}),
            ("GET", "/api/v1/jobs", {"params": {"state": "exploded"}}),
            ("GET", "/api/v1/jobs/1/logs", {"params": {"stream": "stdin"}}),
            ("GET", "/api/v1/jobs/1/logs", {"params": {"rank": -1}}),
            ("PUT", "/api/v1/jobs/1", {"json": {}}),
            ("POST", "/api/v1/pools", {"json": {"ranks": 0}}),
            ("POST", "/api/v1/pools", {"json": {"ranks": 1, "bogus": True}}),
            ("POST", "/api/v1/jobs/upload", {"files": {"script": ("x.py", b"print(1)")},
                                             "data": {"ranks": "1", "env": "{nope"}}),
        ]
        for method, path, kw in bad:
            r = c.request(method, path, **kw)
            assert 400 <= r.status_code < 500, (method, path, r.status_code, r.text)
            assert r.json()["detail"], (method, path)
        assert len(c.get("/api/v1/jobs").json()["jobs"]) == before
        r = c.post("/api/v1/jobs/upload", files={"script": ("up.py", b"import os\nprint('uploaded', os.environ['A'])")},
                   data={"ranks": "1", "env": ["A=b=c"]})
        assert r.status_code == 201 and r.json()["script_name"] == "up.py"
        job = wait_state(c, r.json()["id"], ("succeeded", "failed"))
        assert job["state"] == "succeeded"
        assert c.get(f"/api/v1/jobs/{job['id']}/logs").text == "uploaded b=c\n"
        # an uploaded file is stored as it is (a schema-valid request is accepted): Python decides
        r = c.post("/api/v1/jobs/upload", files={"script": ("../x", b"\xff\xfe")}, data={"ranks": "1"})
        assert r.status_code == 201 and r.json()["script_name"] == "job.py", r.text
        job = wait_state(c, r.json()["id"], ("succeeded", "failed"))
        assert job["state"] == "failed" and "SyntaxError" in c.get(f"/api/v1/jobs/{job['id']}/logs",
                                                                     params={"stream": "stderr"}).text


def test_openapi_schema(server):
    spec = httpx.get(server.url + "/openapi.json").json()
    paths = spec["paths"]
    for p in ("/api/health", "/api/version", "/api/v1/jobs", "/api/v1/jobs/upload", "/api/v1/jobs/{job_id}",
              "/api/v1/jobs/{job_id}/logs", "/api/v1/jobs/{job_id}/trace", "/api/v1/jobs/{job_id}/summary",
              "/api/v1/pools", "/api/v1/pools/{pool_id}"):
        assert p in paths, p
    assert set(paths["/api/v1/jobs/{job_id}"]) == {"get", "delete"}
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "security" in paths["/api/v1/jobs"]["post"] and "security" not in paths["/api/health"]["get"]
    job_create = spec["components"]["schemas"]["JobCreate"]
    assert job_create["additionalProperties"] is False and "code" in job_create["required"]


def test_cli_client(server, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import sys\nfrom nbmpi.workers import world\nr = world().Get_rank()\n"
                      "print('hello from', r, sys.argv[1:])\nsys.exit(5 if r == 1 else 0)\n")
    env = dict(os.environ, NBMPI_SERVER=server.url, NBMPI_TOKEN=server.token,
               NBMPI_CONFIG=str(tmp_path / "none.json"))
    cli = [sys.executable, "-m", "nbmpi.server.cli"]
    p = subprocess.run(cli + ["submit", str(script), "-n", "2", "--wait", "--args", "x 'y z'"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 5, p.stderr
    job_id = int(p.stdout.splitlines()[0])
    assert "[rank 0] hello from 0 ['x', 'y z']" in p.stdout and "[rank 1] hello from 1" in p.stdout
    assert f"job {job_id} failed" in p.stderr
    p = subprocess.run(cli + ["logs", str(job_id), "--rank", "1"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and p.stdout == "hello from 1 ['x', 'y z']\n"
    p = subprocess.run(cli + ["jobs", "--state", "failed"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and any(line.split()[0] == str(job_id) for line in p.stdout.splitlines()[1:])
    p = subprocess.run(cli + ["submit", str(script), "-n", "1"], capture_output=True, text=True, env=env)
    assert p.returncode == 0
    queued = int(p.stdout.strip())
    p = subprocess.run(cli + ["cancel", str(queued)], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and str(queued) in p.stdout
    p = subprocess.run(cli + ["pools"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 or "unavailable" in p.stderr
    p = subprocess.run(cli + ["jobs", "--token", "wrong-token-wrong-token"], capture_output=True, text=True,
                       env=env)
    assert p.returncode == 1 and "401" in p.stderr


def test_restart_marks_running_job_lost(tmp_path):
    """kill -9 of the controller while 2 jobs run and 20 are queued: no record is lost, the running
    ones are recorded lost (their ranks ended), the queued ones run after the restart."""
    srv = Server(tmp_path / "data").start()
    try:
        with srv.client() as c:
            done = submit(c, "print('done')", ranks=1)
            wait_state(c, done["id"], ("succeeded",))
            sleeping = [submit(c, SLEEP_JOB.format(seconds=120), ranks=1) for _ in range(2)]
            pids = [pid for job in sleeping for pid in pids_from_logs(c, job["id"], 1).values()]
            queued = [submit(c, f"import sys\nprint('after restart', {i})", ranks=1) for i in range(20)]
            assert {c.get(f"/api/v1/jobs/{q['id']}").json()["state"] for q in queued} == {"queued"}
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
        assert all(psutil.pid_exists(p) for p in pids)  # the ranks outlive a killed service
        srv.stop()
        srv = Server(tmp_path / "data").start()
        with srv.client() as c:
            for job in sleeping:
                job = c.get(f"/api/v1/jobs/{job['id']}").json()
                assert job["state"] == "lost" and job["finished_at"] is not None
            for p in pids:
                assert not running(p)
            assert c.get(f"/api/v1/jobs/{done['id']}").json()["state"] == "succeeded"
            assert c.get(f"/api/v1/jobs/{done['id']}/logs").text == "done\n"
            for i, q in enumerate(queued):
                job = wait_state(c, q["id"], ("succeeded", "failed", "lost"))
                assert job["state"] == "succeeded", job
                assert c.get(f"/api/v1/jobs/{q['id']}/logs").text == f"after restart {i}\n"
            assert len(c.get("/api/v1/jobs").json()["jobs"]) == 23
    finally:
        srv.stop()
        for p in job_processes(tmp_path / "data"):
            p.kill()
    assert job_processes(tmp_path / "data") == []


def test_killed_rank_fails_the_job_naming_it(server):
    with server.client() as c:
        job = submit(c, SLEEP_JOB.format(seconds=120))
        pids = pids_from_logs(c, job["id"], 2)
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        job = wait_state(c, job["id"], ("failed", "succeeded", "lost"), timeout=60)
        took = time.monotonic() - t0
        assert job["state"] == "failed" and job["exit_code"] == 128 + signal.SIGKILL, job
        assert job["message"] == "rank 1 was killed by SIGKILL; ranks [0] were terminated", (job, took)
        assert job_processes(server.data_dir) == []


def test_read_only_data_directory(tmp_path):
    """With the data directory read-only (chattr +i, which binds root too) a submit is refused with a
    clear 503, no record is written or damaged, and the service works again once it is writable."""
    import shutil

    probe = tmp_path / "probe"
    probe.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(probe)]).returncode != 0:
        pytest.skip("this filesystem does not support the immutable flag (chattr +i) used to make it read-only")
    subprocess.run(["chattr", "-i", str(probe)], check=True)
    srv = Server(tmp_path / "data").start()
    data = srv.data_dir
    try:
        with srv.client() as c:
            first = wait_state(c, submit(c, "print('before')", ranks=1)["id"], ("succeeded",))
            subprocess.run(["chattr", "-R", "+i", str(data)], check=True)
            try:
                r = c.post("/api/v1/jobs", json={"code": "print('while read-only')", "ranks": 1})
                assert r.status_code == 503, r.text
                assert "cannot write its records or files" in r.json()["detail"] and str(data) in r.json()["detail"]
                assert r.headers.get("Retry-After")
                listed = c.get("/api/v1/jobs")
                assert listed.status_code == 200 and [j["id"] for j in listed.json()["jobs"]] == [first["id"]]
                assert httpx.get(srv.url + "/api/health").status_code == 200
            finally:
                subprocess.run(["chattr", "-R", "-i", str(data)], check=True)
            job = wait_state(c, submit(c, "print('after')", ranks=1)["id"], ("succeeded", "failed"))
            assert job["state"] == "succeeded" and job["id"] == first["id"] + 1, job
            assert c.get(f"/api/v1/jobs/{job['id']}/logs").text == "after\n"
            assert c.get(f"/api/v1/jobs/{first['id']}").json()["state"] == "succeeded"
        import sqlite3

        with sqlite3.connect(data / "nbmpi.db") as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        subprocess.run(["chattr", "-R", "-i", str(data)])
        srv.stop()


def test_benchmark_quick(tmp_path):
    out = tmp_path / "results"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "server_jobs.py"), "--quick", "--out-dir", str(out)],
                       capture_output=True, text=True, timeout=280)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((out / "server_jobs_quick.json").read_text())
    b = data["burst"]
    assert b["submitted"] == 20 and b["succeeded"] == 20 and b["lost"] == 0 and b["missing_records"] == 0, b
    assert 1 <= b["max_concurrent_ranks"] <= b["max_ranks"] == 4, b   # capacity is never exceeded
    assert b["health_samples"] > 0 and data["latency"]["samples"] == 3
    assert {t["status"] for t in data["targets"]} <= {"PASS", "FAIL"} and len(data["targets"]) == 5
    assert all(isinstance(t["measured"], (int, float)) for t in data["targets"])
    assert (out / "server_jobs_quick.md").read_text().startswith("# server_jobs_quick")


def pool_processes(data_dir: Path):
    """Processes of the pools of ``data_dir`` (controller, mpiexec, engines)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(str(data_dir / "pools") in a for a in (p.info["cmdline"] or [])):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def stop_and_kill_pools(srv: Server, data_dir: Path) -> list:
    """Stop the controller ``srv``, then kill every pool process of ``data_dir`` still alive (the test
    fails on them afterwards, but leaves nothing running); returns those leftovers."""
    srv.stop()
    leftovers = pool_processes(data_dir)
    for p in leftovers:
        p.kill()
    return leftovers


def wait_pool(c: httpx.Client, pool_id: int, states, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        pool = c.get(f"/api/v1/pools/{pool_id}").json()
        if pool["state"] in states:
            return pool
        assert time.monotonic() < deadline, f"pool {pool_id} still {pool['state']}"
        time.sleep(0.2)


def _start_pool_holding_all_ranks(c: httpx.Client) -> tuple:
    """Start a 2-rank pool (all ranks): it is listed, a second pool is refused and a batch job waits.
    Returns ``(the pool, the waiting batch job)``."""
    r = c.post("/api/v1/pools", json={"ranks": 2, "name": "p1"})
    assert r.status_code == 201, r.text
    pool = r.json()
    assert pool["state"] == "running" and pool["target"] == "running", pool
    got = c.get(f"/api/v1/pools/{pool['id']}").json()
    assert got["connection"]["ranks"] == [0, 1] and "client" in got["connection"]
    assert [p["id"] for p in c.get("/api/v1/pools").json()["pools"]] == [pool["id"]]
    # all ranks are held by the pool: a new pool is refused, a batch job waits
    assert c.post("/api/v1/pools", json={"ranks": 1}).status_code == 409
    batch = submit(c, "print('batch')", ranks=1)
    return pool, batch


def _check_jobs_on_pool(c: httpx.Client, pool_id: int) -> None:
    """Jobs on the pool: one succeeds with its logs and args, one fails with its traceback, and each job runs
    in a namespace of its own."""
    job = submit(c, """
        import sys
        import numpy as np
        x = np.full(3, rank + 1.0)
        comm.Allreduce(np.full(3, rank + 1.0), x)
        print("rank", rank, "of", size, x.tolist(), sys.argv[1:])
        """, ranks=None, pool=pool_id, args=["q"])
    job = wait_state(c, job["id"], ("succeeded", "failed"))
    assert job["state"] == "succeeded" and job["rank_exit_codes"] == [0, 0], job
    for r in (0, 1):
        assert c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text == \
            f"rank {r} of 2 [3.0, 3.0, 3.0] ['q']\n"
    bad = wait_state(c, submit(c, "raise ValueError('boom')", ranks=None, pool=pool_id)["id"],
                     ("succeeded", "failed"))
    assert bad["state"] == "failed" and bad["rank_exit_codes"] == [1, 1] and "boom" in bad["message"]
    err = c.get(f"/api/v1/jobs/{bad['id']}/logs", params={"rank": 1, "stream": "stderr"}).text
    assert "Traceback" in err and "ValueError: boom" in err, err   # the job's log shows why
    # each job runs in a namespace of its own, like a script (not the previous job's or a cell's)
    first = wait_state(c, submit(c, "leaked = 1", ranks=None, pool=pool_id)["id"], ("succeeded", "failed"))
    second = wait_state(c, submit(c, "print('leaked' in globals())", ranks=None, pool=pool_id)["id"],
                        ("succeeded", "failed"))
    assert first["state"] == second["state"] == "succeeded", (first, second)
    assert c.get(f"/api/v1/jobs/{second['id']}/logs").text == "False\n"


def _check_cancel_and_other_user(srv: Server, c: httpx.Client, pool_id: int, batch_id: int) -> None:
    """A running pool job is cancelled (the batch job still waits); another user sees no pool."""
    long = submit(c, "import time\nprint('sleeping', flush=True)\ntime.sleep(120)", ranks=None, pool=pool_id)
    wait_state(c, long["id"], ("running",))
    time.sleep(1)
    assert c.delete(f"/api/v1/jobs/{long['id']}").json()["state"] == "cancelled"
    assert c.get(f"/api/v1/jobs/{batch_id}").json()["state"] == "queued"
    with srv.client(BOB_TOKEN) as bob:
        assert bob.get(f"/api/v1/pools/{pool_id}").status_code == 404
        assert bob.delete(f"/api/v1/pools/{pool_id}").status_code == 404
        assert bob.post("/api/v1/jobs", json={"code": "print(1)", "pool": pool_id}).status_code == 404


def _check_engine_death_and_idle_timeout(c: httpx.Client, data_dir: Path, pool_id: int, batch_id: int) -> None:
    """An engine killed: the pool is failed, its ranks freed (the batch job runs), no process left; a pool
    without a job stops after its idle timeout."""
    engine = c.get(f"/api/v1/pools/{pool_id}").json()["connection"]["pids"][1]
    os.kill(engine, signal.SIGKILL)
    failed = wait_pool(c, pool_id, ("failed",))
    assert failed["connection"] is None and "died" in failed["message"]
    assert wait_state(c, batch_id, ("succeeded", "failed"))["state"] == "succeeded"
    assert pool_processes(data_dir) == []
    idle = c.post("/api/v1/pools", json={"ranks": 1, "idle_timeout": 1}).json()
    assert idle["state"] == "running"
    stopped = wait_pool(c, idle["id"], ("stopped", "failed"))
    assert stopped["state"] == "stopped" and "without a job" in stopped["message"]


def test_pools(tmp_path):
    srv = Server(tmp_path / "data", extra_args=["--unsafe-shared-account"]).start()
    srv.add_bob()
    try:
        with srv.client() as c:
            pool, batch = _start_pool_holding_all_ranks(c)
            _check_jobs_on_pool(c, pool["id"])
            _check_cancel_and_other_user(srv, c, pool["id"], batch["id"])
            # an engine dies: the pool is reported failed, not running, and its ranks are freed; idle timeout
            _check_engine_death_and_idle_timeout(c, tmp_path / "data", pool["id"], batch["id"])
            # a pool survives a killed service and is re-attached after the restart
            kept = c.post("/api/v1/pools", json={"ranks": 2}).json()
            assert kept["state"] == "running"
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait()
        srv.stop()
        attach_dir = tmp_path / "data" / "attach"    # a killed service's connection folders: removed at start
        (attach_dir / "nbmpi-attach-left-by-a-killed-service").mkdir(parents=True)
        srv = Server(tmp_path / "data", extra_args=["--unsafe-shared-account"]).start()   # alice and bob
        with srv.client() as c:
            again = c.get(f"/api/v1/pools/{kept['id']}").json()
            assert again["state"] == "running" and "re-attached" in again["message"]
            assert [d.name.startswith("nbmpi-attach-") for d in attach_dir.iterdir()] == [True]
            assert not (attach_dir / "nbmpi-attach-left-by-a-killed-service").exists()
            job = wait_state(c, submit(c, "print('after', rank)", ranks=None, pool=kept["id"])["id"],
                             ("succeeded", "failed"))
            assert job["state"] == "succeeded"
            assert c.delete(f"/api/v1/pools/{kept['id']}").json()["state"] == "stopped"
            assert pool_processes(tmp_path / "data") == []
            assert c.get(f"/api/v1/pools/{kept['id']}").json()["state"] == "stopped"
            assert list(attach_dir.iterdir()) == []      # the re-attached pool's folder went with it
    finally:
        leftovers = stop_and_kill_pools(srv, tmp_path / "data")
    assert leftovers == []


HANG_JOB = """from nbmpi.workers import ArrayChannel
ch = ArrayChannel(4)
import time
if rank == 1:
    ch.take(0)
else:
    time.sleep(60)
"""


def _check_pool_job_trace(c: httpx.Client, pool_id: int) -> None:
    """A channel job on the pool has its trace, summary and dashboard figure; the next job's trace holds
    its own events only."""
    job = wait_state(c, submit(c, CHANNEL_JOB, ranks=None, pool=pool_id, args=["a"])["id"],
                     ("succeeded", "failed"))
    assert job["state"] == "succeeded", job
    assert c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": 1}).text == "rank 1 value 2.0 args ['a']\n"
    r = c.get(f"/api/v1/jobs/{job['id']}/trace")
    assert r.status_code == 200, r.text
    slices = [e for e in r.json()["traceEvents"] if e.get("ph") == "X"]
    assert {e["pid"] for e in slices} == {0, 1}
    assert {"put(dest=1)", "take(src=0)", "put(dest=0)", "take(src=1)"} <= {e["name"] for e in slices}
    summary = c.get(f"/api/v1/jobs/{job['id']}/summary").json()
    assert summary["bytes"][0][1] >= 8000 and summary["bytes"][1][0] >= 8000, summary["bytes"]
    fig = c.get(f"/api/v1/dashboard/jobs/{job['id']}/figure", params={"width": 800}).json()
    assert fig["available"] and fig["item"]["doc"] and fig["meta"]["ranks"] == [0, 1], fig.get("reason")
    arrows = fig["sources"]["nbmpi_arrows"]
    assert len(arrows["x0"]) >= 2, arrows   # the two messages between the ranks
    # the next job's trace holds its own events only (the pool's tracer keeps the earlier ones)
    quiet = wait_state(c, submit(c, "print(rank)", ranks=None, pool=pool_id)["id"], ("succeeded", "failed"))
    assert quiet["state"] == "succeeded", quiet
    names = {e["name"] for e in c.get(f"/api/v1/jobs/{quiet['id']}/trace").json()["traceEvents"]
             if e.get("ph") == "X"}
    assert not {n for n in names if n.startswith(("put(", "take("))}, names


def _check_pool_job_deadline(c: httpx.Client, pool_id: int) -> None:
    """A pool job past its deadline names each rank's state, as the notebook says it, and has the trace of
    what was recorded up to the end."""
    hung = wait_state(c, submit(c, HANG_JOB, ranks=None, pool=pool_id, timeout=4)["id"],
                      ("succeeded", "failed", "timed_out"), timeout=120)
    assert hung["state"] == "timed_out", hung
    assert "rank 1: take(src=0) waiting " in hung["message"], hung["message"]
    assert "rank 0: at job.py line 7 `time.sleep(60)`" in hung["message"], hung["message"]
    assert hung["rank_exit_codes"] == [1, 1], hung
    r = c.get(f"/api/v1/jobs/{hung['id']}/trace")
    assert r.status_code == 200, r.text
    waits = [e for e in r.json()["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 1
             and "take(src=0)" in e["name"]]
    assert waits, "the timed-out job's trace lacks rank 1's open take"
    fig = c.get(f"/api/v1/dashboard/jobs/{hung['id']}/timeline", params={"width": 400}).json()
    assert fig["available"], fig


def _check_failing_rank_interrupts_the_other(c: httpx.Client, pool_id: int) -> None:
    """A rank fails while the other waits for it: the other is interrupted and named, the pool stays usable."""
    failed = wait_state(c, submit(c, """
        from nbmpi.workers import ArrayChannel
        ch = ArrayChannel(4)
        if rank == 1:
            raise ValueError("broken on one")
        ch.take(1)
        """, ranks=None, pool=pool_id)["id"], ("succeeded", "failed", "timed_out"), timeout=120)
    assert failed["state"] == "failed" and failed["rank_exit_codes"] == [1, 1], failed
    assert "rank 1: ValueError: broken on one" in failed["message"], failed["message"]
    assert "rank 0 was in take(src=1) waiting" in failed["message"], failed["message"]
    after = wait_state(c, submit(c, "print('after', rank)", ranks=None, pool=pool_id)["id"],
                       ("succeeded", "failed"))
    assert after["state"] == "succeeded", after
    assert c.get(f"/api/v1/pools/{pool_id}").json()["state"] == "running"


def _check_wedged_ranks_end_the_pool(c: httpx.Client, data_dir: Path, pool_id: int) -> None:
    """Ranks stuck in C code ignore the interrupt: the pool is ended, no process left, and the job says where
    they were."""
    wedged = wait_state(c, submit(c, """
        import time
        import numpy as np
        buf = np.zeros(1)
        if rank == 0:
            comm.Recv(buf, source=1)
        else:
            time.sleep(60)
        """, ranks=None, pool=pool_id, timeout=3)["id"], ("succeeded", "failed", "timed_out"),
        timeout=120)
    assert wedged["state"] == "timed_out", wedged
    assert "rank 0: at job.py line 6 `comm.Recv(buf, source=1)`: MPI Recv from rank 1" in wedged["message"]
    assert "did not stop within" in wedged["message"] and "was ended" in wedged["message"], wedged
    gone = wait_pool(c, pool_id, ("failed",))
    assert "did not stop within" in gone["message"], gone
    assert pool_processes(data_dir) == []


def test_pool_jobs_are_traced_like_batch_jobs(tmp_path):
    """A job on a pool streams its ranks' trace as a batch job does: the trace and summary endpoints
    and the dashboard's figure answer with the ranks' communication, and only the job's own events
    (not an earlier job's on the same ranks). A pool job past its deadline names what each rank was
    doing (operation and peer, the job's line) as a notebook cell does, has a trace of what was
    recorded up to the end, and leaves the pool usable; a rank that fails does not leave the others
    hanging (they are interrupted and named)."""
    srv = Server(tmp_path / "data").start()
    try:
        with srv.client() as c:
            pool = c.post("/api/v1/pools", json={"ranks": 2, "name": "traced"}).json()
            assert pool["state"] == "running", pool
            _check_pool_job_trace(c, pool["id"])
            _check_pool_job_deadline(c, pool["id"])
            _check_failing_rank_interrupts_the_other(c, pool["id"])
            _check_wedged_ranks_end_the_pool(c, tmp_path / "data", pool["id"])
    finally:
        leftovers = stop_and_kill_pools(srv, tmp_path / "data")
    assert leftovers == []


def test_demo_main_job(tmp_path):
    p = subprocess.run([sys.executable, "-m", "nbmpi.server.cli", "demo", "-n", "2", "--data-dir",
                        str(tmp_path / "demo")], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[rank 0] done: 2 ranks" in p.stdout and "succeeded (exit code 0, per rank [0, 0])" in p.stdout
    # the controller stops at the end: no link to it is printed, only the trace file that stays
    assert "controller stopped" in p.stdout and "http://" not in p.stdout.split("== job 1 succeeded")[1], p.stdout
    trace = tmp_path / "demo" / "jobs" / "1" / "trace" / "trace.json"
    assert f"== Chrome trace: {trace} (open in https://ui.perfetto.dev)\n" in p.stdout and trace.exists()
    assert job_processes(tmp_path / "demo") == []
    # without --data-dir the demo's temporary data directory (it holds a token) is removed at the end
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run([sys.executable, "-m", "nbmpi.server.cli", "demo", "-n", "1"], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, TMPDIR=str(tmp)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "temporary data directory" in p.stdout and "was removed" in p.stdout
    assert "== Chrome trace" not in p.stdout and "== dashboard" not in p.stdout, p.stdout
    assert not [x for x in tmp.iterdir() if x.name.startswith("nbmpi-demo-")], sorted(tmp.rglob("*"))


def test_demo_removal_names_what_stays(tmp_path):
    """The demo's temporary directory is removed whole; what cannot be removed (here a mount point, which
    rmdir refuses with EBUSY) is named with its error, never reported as removed."""
    from nbmpi.server.demo import remove_data_dir

    d = tmp_path / "done"
    (d / "jobs" / "1" / "trace").mkdir(parents=True)
    (d / "jobs" / "1" / "trace" / "trace.json").write_text("[]")
    assert remove_data_dir(d) == [] and not d.exists()
    if os.geteuid() != 0:
        return
    m = tmp_path / "mounted" / "m"
    m.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "nbmpi-test", str(m)], check=True)
    try:
        left = remove_data_dir(tmp_path / "mounted")
        assert left[0].startswith(f"{m}: ") and "busy" in left[0], left   # then its parent, not empty
    finally:
        subprocess.run(["umount", str(m)], check=True)


@pytest.mark.parametrize("chunks", [[8, 8, 4], [16, 4], [20], [10, 6, 0, 4], [16]])
def test_capped_log_marks_the_cut_wherever_the_writes_split(tmp_path, chunks):
    """The truncation marker appears exactly once when output passes the limit, however the
    pipe reads split it (also when one read ends exactly at the limit), and never when the
    output fits."""
    from nbmpi.workers.launch.rank_guard import CappedLog, truncation_marker

    limit = 16
    log = CappedLog(str(tmp_path / "log"), limit)
    data = bytes(range(65, 65 + sum(chunks)))
    at = 0
    for n in chunks:
        log.write(data[at:at + n])
        at += n
    log.close()
    written = (tmp_path / "log").read_bytes()
    if len(data) <= limit:
        assert written == data
    else:
        discarded = len(data) - limit
        assert written == (data[:limit] + truncation_marker(limit)
                           + f"[nbmpi: {discarded} more bytes of output were discarded]\n".encode())


def test_large_logs_are_complete_or_visibly_cut(tmp_path):
    """A log larger than one response arrives whole through `nbmpi logs` (following offsets), the size
    header is the file's size, and past --max-log-bytes the log ends with a visible truncation line."""
    srv = Server(tmp_path / "data", extra_args=["--max-log-bytes", "24M"]).start()
    try:
        with srv.client() as c:
            big = submit(c, """
                import sys
                from nbmpi.workers import world
                n = 20 if world().Get_rank() == 0 else 30
                line = b"x" * 1023 + b"\\n"
                for _ in range(n * 1024):
                    sys.stdout.buffer.write(line)
                """)
            job = wait_state(c, big["id"], ("succeeded", "failed"))
            assert job["state"] == "succeeded", job
            r = c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": 0})
            size = (Path(job["log_dir"]) / "rank-0.stdout").stat().st_size
            assert size == 20 << 20 and int(r.headers["X-Log-Size"]) == size
            assert len(r.content) == 16 << 20 and int(r.headers["X-Log-Next-Offset"]) == 16 << 20
            cli = [sys.executable, "-m", "nbmpi.server.cli", "logs", str(job["id"]), "--server", srv.url,
                   "--token", srv.token]
            p = subprocess.run(cli, capture_output=True, timeout=120)
            assert p.returncode == 0 and len(p.stdout) == 20 << 20 and p.stdout.count(b"\n") == 20 * 1024
            p = subprocess.run(cli + ["--rank", "1"], capture_output=True, timeout=120)
            assert p.returncode == 0, p.stderr
            kept, _, tail = p.stdout.partition(b"\n[nbmpi: output truncated here")
            assert len(kept) == 24 << 20, len(kept)
            assert b"reached its limit of 25165824 bytes" in tail
            assert tail.endswith(b"[nbmpi: 6291456 more bytes of output were discarded]\n"), tail[-200:]
    finally:
        srv.stop()
