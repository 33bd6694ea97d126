"""The controller under hostile input and crashes, against a real `nbmpi serve` subprocess (random 127.0.0.1
port, temporary data directory, real SQLite, real mpiexec): hashed tokens, bodies refused before they are
read, odd strings, stored rows no answer can choke on, security headers, crash recovery and idempotent
submits."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from nbmpi.server.auth import hash_token, is_hashed
from test_dashboard import needs_browser
from test_server import Server, job_processes, submit, wait_state

MiB = 1 << 20


@pytest.fixture()
def server(tmp_path):
    srv = Server(tmp_path / "data", max_ranks=2, extra_args=["--unsafe-shared-account"]).start()   # bob joins later
    try:
        yield srv
    finally:
        srv.stop()


# -- tokens --------------------------------------------------------------------------------------
def _start_lines(srv: Server) -> str:
    """What `nbmpi serve` printed after its "listening on" line, up to the dashboard line."""
    lines = []
    while not lines or "dashboard at" not in lines[-1]:
        lines.append(srv.proc.stdout.readline())
        assert lines[-1], "nbmpi serve ended"
    return "".join(lines)


def test_users_file_holds_only_hashes_and_the_token_is_shown_once(tmp_path):
    srv = Server(tmp_path / "data").start()
    try:
        shown = _start_lines(srv)
        assert f"generated token {srv.token}\n" in shown and "shown only now" in shown
        users = json.loads((srv.data_dir / "users.json").read_text())
        assert len(users) == 1 and all(is_hashed(k) for k in users)
        assert srv.token not in (srv.data_dir / "users.json").read_text()
        with srv.client() as c:
            assert c.get("/api/v1/jobs").status_code == 200
        env = dict(os.environ, NBMPI_CONFIG=str(tmp_path / "client.json"))
        cli = [sys.executable, "-m", "nbmpi.server.cli"]
        p = subprocess.run(cli + ["users", "add", "carol", "--data-dir", str(srv.data_dir)], capture_output=True,
                           text=True, timeout=60, env=env)
        assert p.returncode == 0 and "shown only now" in p.stderr, p.stderr
        carol = p.stdout.strip()
        assert carol and carol not in (srv.data_dir / "users.json").read_text()
        with srv.client(carol) as c:   # picked up without a restart
            assert c.get("/api/v1/dashboard/me").json() == {"user": "carol"}
        p = subprocess.run(cli + ["users", "list", "--data-dir", str(srv.data_dir)], capture_output=True, text=True,
                           timeout=60, env=env)
        assert "carol\t1 token(s)" in p.stdout
        p = subprocess.run(cli + ["users", "remove", "carol", "--data-dir", str(srv.data_dir)], capture_output=True,
                           text=True, timeout=60, env=env)
        assert p.returncode == 0
        with srv.client(carol) as c:
            assert c.get("/api/v1/jobs").status_code == 401
    finally:
        srv.stop()
    srv = Server(tmp_path / "data").start()   # restart: the configured token works on, none is shown
    try:
        assert srv.token not in _start_lines(srv)
        with srv.client() as c:
            assert c.get("/api/v1/jobs").status_code == 200
    finally:
        srv.stop()


def test_plain_text_users_file_is_migrated_on_load(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    old_token = "old-plain-token-0123456789abcdef"
    (data / "users.json").write_text(json.dumps({old_token: "alice"}))
    (tmp_path / "client.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "token": old_token}))
    srv = Server(data).start()
    try:
        users = json.loads((data / "users.json").read_text())
        assert list(users.values()) == ["alice"] and all(is_hashed(k) for k in users)
        assert old_token not in (data / "users.json").read_text()
        assert (data / "users.json").stat().st_mode & 0o777 == 0o600
        assert srv.token == old_token   # the configured token still works and is kept
        with srv.client() as c:
            assert c.get("/api/v1/dashboard/me").json() == {"user": "alice"}
        # a plain token added by hand to the running service's file is migrated as well
        users["another-plain-token-0123456789"] = "bob"
        (data / "users.json").write_text(json.dumps(users))
        with srv.client("another-plain-token-0123456789") as c:
            assert c.get("/api/v1/dashboard/me").json() == {"user": "bob"}
        assert all(is_hashed(k) for k in json.loads((data / "users.json").read_text()))
    finally:
        srv.stop()


# -- bodies refused before they are read ---------------------------------------------------------------
def _whole_answer(answer: bytes) -> bool:
    """Whether ``answer`` holds an HTTP answer's headers and all of its Content-Length body."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return length is None or len(body) >= int(length.group(1))


def _flood(url: str, path: str, token, chunks: int = 1000, chunk: int = MiB,
           content_type: str = "application/json", prefix: bytes = b"") -> dict:
    """POST a chunked body of ``chunks`` x ``chunk`` bytes on a raw socket, reading the answer meanwhile;
    stops sending when the server closes the connection. Returns the status, the chunks sent before the
    answer came, and the chunks sent in all."""
    u = urlsplit(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    head = [f"POST {path} HTTP/1.1", f"Host: {u.netloc}", f"Content-Type: {content_type}",
            "Transfer-Encoding: chunked"] + ([f"Authorization: Bearer {token}"] if token else [])
    answer = bytearray()
    got = threading.Event()

    def read():
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                answer.extend(data)
                if _whole_answer(bytes(answer)):   # headers and body, which may come in separate reads
                    got.set()
        except OSError:
            pass
        got.set()

    reader = threading.Thread(target=read, daemon=True)
    block = f"{chunk:x}\r\n".encode() + b"x" * chunk + b"\r\n"
    sent = before = 0
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        reader.start()
        if prefix:
            sock.sendall(f"{len(prefix):x}\r\n".encode() + prefix + b"\r\n")
        for _ in range(chunks):
            if got.is_set() and not before:
                before = sent
            sock.sendall(block)
            sent += 1
        sock.sendall(b"0\r\n\r\n")
    except OSError:   # the server closed the connection: nothing more is read
        pass
    got.wait(30)
    sock.close()
    reader.join(5)
    status = int(bytes(answer).split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None
    return dict(status=status, before=before or sent, sent=sent, answer=bytes(answer[:2000]))


def test_chunked_flood_is_refused_early_and_memory_stays_flat(server):
    proc = psutil.Process(server.proc.pid)
    with server.client() as c:   # warm up every path once, so their imports count in the baseline
        c.get("/api/v1/jobs")
        c.post("/api/v1/jobs", json={"code": "x" * 100})
    rss0 = proc.memory_info().rss
    peak = [rss0]
    health = []
    stop = threading.Event()

    def watch():
        with httpx.Client(base_url=server.url, timeout=30) as h:
            while not stop.is_set():
                peak[0] = max(peak[0], proc.memory_info().rss)
                t = time.monotonic()
                health.append((h.get("/api/health").status_code, time.monotonic() - t))
                time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        anonymous = _flood(server.url, "/api/v1/jobs", None)
        user = _flood(server.url, "/api/v1/jobs", server.token)
        upload = _flood(server.url, "/api/v1/jobs/upload", server.token,
                        content_type="multipart/form-data; boundary=nbmpi-flood",
                        prefix=b'--nbmpi-flood\r\nContent-Disposition: form-data; name="script"; '
                               b'filename="a.py"\r\nContent-Type: text/x-python\r\n\r\n')
    finally:
        stop.set()
        watcher.join(30)
    peak[0] = max(peak[0], proc.memory_info().rss)
    grown = (peak[0] - rss0) / MiB
    worst = max(t for _, t in health)
    print(f"flood: no token {anonymous['status']} after {anonymous['before']} chunks ({anonymous['sent']} sent); "
          f"with token {user['status']} after {user['before']} ({user['sent']} sent); upload {upload['status']} "
          f"after {upload['before']}; RSS {rss0 / MiB:.0f} MB -> peak {peak[0] / MiB:.0f} MB (+{grown:.1f}); "
          f"health {len(health)} answers, slowest {worst * 1000:.0f} ms")
    assert anonymous["status"] == 401, anonymous["answer"]
    assert user["status"] == 413 and b"exceeds the limit" in user["answer"], user["answer"]
    assert upload["status"] == 413, upload["answer"]
    for f in (anonymous, user, upload):
        assert f["before"] < 100, f   # answered long before the 1,000 MiB were sent
    assert grown < 50, f"the controller grew by {grown:.0f} MB during the floods"
    assert health and all(s == 200 for s, _ in health)
    u = urlsplit(server.url)   # a declared 1 GiB body: 413 from the headers alone
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        sock.sendall(f"POST /api/v1/jobs HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {server.token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {1 << 30}\r\n\r\n{{".encode())
        answer = b""
        while b"exceeds the limit" not in answer:   # headers and body may come in separate reads
            part = sock.recv(65536)
            if not part:
                break
            answer += part
    assert answer.startswith(b"HTTP/1.1 413 ") and b"exceeds the limit" in answer, answer


# -- strings that cannot be stored or run ------------------------------------------------------------
ODD_JOBS = [   # (raw JSON body, the field the answer must name)
    ('{"code": "print(1)", "ranks": 1, "args": ["ok", "\\udfff"]}', "args"),
    ('{"code": "print(1)", "ranks": 1, "args": ["a\\u0000b"]}', "args"),
    ('{"code": "print(1)", "ranks": 1, "env": {"A=B": "x"}}', "env"),
    ('{"code": "print(1)", "ranks": 1, "env": {"A\\u0000": "x"}}', "env"),
    ('{"code": "print(1)", "ranks": 1, "env": {"A\\n": "x"}}', "env"),
    ('{"code": "print(1)", "ranks": 1, "env": {"\\udfff": "x"}}', "env"),
    ('{"code": "print(1)", "ranks": 1, "env": {"A": "x\\u0000"}}', "env"),
    ('{"code": "print(1)", "ranks": 1, "env": {"A": "\\ud800"}}', "env"),
    ('{"code": "print(1)", "ranks": 1, "name": "\\udfff"}', "name"),
    ('{"code": "print(1)", "ranks": 1, "name": "a\\u0000"}', "name"),
    ('{"code": "print(1)\\u0000", "ranks": 1}', "code"),
    ('{"code": "print(\'\\udfff\')", "ranks": 1}', "code"),
    ('{"code": "print(1)", "ranks": 1, "script_name": "a.py\\n"}', "script_name"),
    ('{"code": "print(1)", "ranks": 1, "\\udfff": 1}', "body"),   # an unknown name: the body is named
]


def test_odd_strings_are_refused_naming_the_field(server):
    with server.client() as c:
        for body, field in ODD_JOBS:
            r = c.post("/api/v1/jobs", content=body.encode(), headers={"Content-Type": "application/json"})
            assert r.status_code == 422, (body, r.status_code, r.text)
            err = r.json()
            named = any(field in [str(x) for x in e["loc"]] for e in err["errors"])
            assert field in err["detail"] and named, (body, err)
        r = c.post("/api/v1/pools", content=b'{"ranks": 1, "name": "\\udfff"}',
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "name" in r.json()["detail"]
        r = c.post("/api/v1/jobs/upload", files={"script": ("a.py", b"print(1)")},
                   data={"ranks": "1", "name": "a\x00b"})
        assert r.status_code == 422 and "name" in r.json()["detail"], r.text
        r = c.post("/api/v1/jobs/upload", files={"script": ("a.py", b"print(1)")},
                   data={"ranks": "1", "env": "A\x00=1"})
        assert r.status_code == 422 and "env" in r.json()["detail"], r.text
        r = c.get("/api/v1/jobs")
        assert r.status_code == 200 and r.json()["jobs"] == []   # nothing was stored


def _insert(db: Path, table: str, rows) -> None:
    """Store ``rows`` (dicts; bytes values stored as TEXT that is not UTF-8) directly, as an old database
    or a hand edit might hold them."""
    con = sqlite3.connect(db, timeout=30)
    try:
        for row in rows:
            cols = ", ".join(row)
            marks = ", ".join("CAST(? AS TEXT)" if isinstance(v, bytes) else "?" for v in row.values())
            con.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", list(row.values()))
        con.commit()
    finally:
        con.close()


def test_stored_odd_strings_never_break_a_list(server):
    with server.client() as c:
        user = c.get("/api/v1/dashboard/me").json()["user"]
        job = dict(owner=user, state="failed", ranks=2, script_name="job.py", args="[]", env="{}", created_at=1.0,
                   job_dir="/nonexistent", script_path="/nonexistent/job.py", log_dir="/nonexistent/logs")
        odd = [dict(name=b"\xed\xbf\xbf"),                      # a surrogate as raw bytes: not UTF-8
               dict(name=b"\xff\xfe\x00name"), dict(message="a\x00b"),
               dict(args='["\\udfff", "a\\u0000b", 3]'),        # JSON with a lone surrogate escape
               dict(args="not json"), dict(args='{"a": 1}'), dict(env="[[["),
               dict(rank_exit_codes='["x", null, 3]'), dict(rank_exit_codes="{"),
               dict(state="weird\x00"), dict(state=b"\xff"), dict(script_name=b"\xffjob.py"),
               dict(log_dir=b"/x/\xff"), dict(message=b"\xed\xa0\x80 half a pair"),
               dict(backend_state="{not json"), dict(owner=user, name="\U0001F600 fine")]
        _insert(server.data_dir / "nbmpi.db", "jobs", [dict(job, **o) for o in odd])
        pool = dict(owner=user, ranks=2, target="running", state="running", created_at=1.0, work_dir="/nonexistent")
        _insert(server.data_dir / "nbmpi.db", "pools",
                [dict(pool, name=b"\xed\xbf\xbf"), dict(pool, connection='{"k": "\\udfff", "\\ud800": [1]}'),
                 dict(pool, state="bogus", target="\x00"), dict(pool, connection="]"), dict(pool, message=b"\xff")])
        r = c.get("/api/v1/jobs")
        assert r.status_code == 200, r.text
        jobs = r.json()["jobs"]
        assert len(jobs) == len(odd)
        for j in jobs:
            assert c.get(f"/api/v1/jobs/{j['id']}").status_code == 200
        assert any(j["args"] == ["\\udfff", "a\x00b", "3"] for j in jobs)
        assert any(j["state"] == "lost" and "unknown state" in j["message"] for j in jobs)
        for state in ("failed", "lost"):
            assert c.get("/api/v1/jobs", params={"state": state}).status_code == 200
        r = c.get("/api/v1/pools")
        assert r.status_code == 200, r.text
        pools = r.json()["pools"]
        assert len(pools) == 5 and any(p["connection"] == {"k": "\\udfff", "\\ud800": [1]} for p in pools)
        for p in pools:
            assert c.get(f"/api/v1/pools/{p['id']}").status_code == 200


# -- records tell the truth after a crash; submits are idempotent --------------------------------------
FINISHING_JOB = """
import os, sys, time
from nbmpi.workers import world
comm = world()
r = comm.Get_rank()
print(f"rank {{r}} started", flush=True)
while not os.path.exists("go"):   # created in the job's directory by the test, after the kill -9
    time.sleep(0.05)
comm.Barrier()
print(f"rank {{r}} done", flush=True)
if r == 1:
    time.sleep(1.0)     # rank 0 has ended when rank 1 fails
    sys.exit({code})
"""


def _job_ranks_gone(data: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while job_processes(data):
        assert time.monotonic() < deadline, "the job's processes did not end"
        time.sleep(0.2)


def test_job_that_finished_while_the_controller_was_down_keeps_its_exit_codes(tmp_path):
    data = tmp_path / "data"
    srv = Server(data, max_ranks=4).start()   # both jobs run at once
    try:
        with srv.client() as c:
            ok = submit(c, FINISHING_JOB.format(code=0), ranks=2)
            bad = submit(c, FINISHING_JOB.format(code=3), ranks=2)
            for job in (ok, bad):
                deadline = time.monotonic() + 90
                while "started" not in c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": 1}).text:
                    assert time.monotonic() < deadline, "the job did not start"
                    time.sleep(0.1)
        srv.proc.send_signal(signal.SIGKILL)   # kill -9 while both jobs run
        srv.proc.wait()
        assert job_processes(data), "the jobs must outlive the killed controller"
        for job in (ok, bad):
            (data / "jobs" / str(job["id"]) / "go").touch()
        _job_ranks_gone(data)                  # ... and finish on their own
        srv.stop()
        srv = Server(data, max_ranks=4).start()
        with srv.client() as c:
            ok, bad = (c.get(f"/api/v1/jobs/{j['id']}").json() for j in (ok, bad))
            assert ok["state"] == "succeeded" and ok["exit_code"] == 0 and ok["rank_exit_codes"] == [0, 0], ok
            assert "finished while the service was down" in ok["message"]
            assert bad["state"] == "failed" and bad["exit_code"] == 3 and bad["rank_exit_codes"] == [0, 3], bad
            assert "rank 1 exited 3" in bad["message"]
            for job in (ok, bad):
                for r in (0, 1):
                    log = c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text
                    assert log == f"rank {r} started\nrank {r} done\n"
            assert c.get(f"/api/v1/jobs/{ok['id']}/trace").status_code == 200
    finally:
        srv.stop()
        for p in job_processes(data):
            p.kill()


class DroppingProxy:
    """A real TCP proxy to ``upstream`` that lets the first request reach the server, reads the server's
    whole answer and then closes the client's connection without passing it on (a connection lost after
    the server committed); later connections pass both ways."""

    def __init__(self, upstream: str):
        u = urlsplit(upstream)
        self.upstream = (u.hostname, u.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.dropped = 0
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.conns += [client, server]
            drop = self.dropped == 0
            self.dropped += drop
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, drop), daemon=True).start()

    @staticmethod
    def _pipe(src, dst, drop):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if drop:   # the answer arrived: the client never gets it
                    dst.shutdown(socket.SHUT_RDWR)
                    return
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        self.listener.close()
        for s in self.conns:
            s.close()


def test_retried_submit_runs_the_job_once(server):
    from nbmpi.server.client import Client

    proxy = DroppingProxy(server.url)
    try:
        with Client(proxy.url, server.token) as c:
            job = c.submit("print('ran')", ranks=1, name="once")
        assert proxy.dropped == 1
    finally:
        proxy.close()
    with server.client() as c:
        jobs = c.get("/api/v1/jobs").json()["jobs"]
        assert [j["id"] for j in jobs] == [job["id"]], jobs   # the lost answer's job, not a second one
        assert wait_state(c, job["id"], ("succeeded", "failed"))["state"] == "succeeded"
        assert c.get(f"/api/v1/jobs/{job['id']}/logs").text == "ran\n"
        body = {"code": "print('k')", "ranks": 1}
        first = c.post("/api/v1/jobs", json=body, headers={"Idempotency-Key": "key-1"})
        again = c.post("/api/v1/jobs", json=body, headers={"Idempotency-Key": "key-1"})
        assert first.status_code == 201 and again.status_code == 200 and again.json()["id"] == first.json()["id"]
        other = c.post("/api/v1/jobs", json=dict(body, ranks=2), headers={"Idempotency-Key": "key-1"})
        assert other.status_code == 409 and "another request" in other.json()["detail"]
        up = [c.post("/api/v1/jobs/upload", files={"script": ("u.py", b"print('u')")}, data={"ranks": "1"},
                     headers={"Idempotency-Key": "key-2"}) for _ in range(2)]
        assert [u.status_code for u in up] == [201, 200] and up[0].json()["id"] == up[1].json()["id"]
    server.add_bob()
    with server.client("bob-token-0123456789abcdefghijklmnop") as bob:   # keys are per user
        r = bob.post("/api/v1/jobs", json=body, headers={"Idempotency-Key": "key-1"})
        assert r.status_code == 201 and r.json()["id"] != first.json()["id"]


# -- pages and method errors --------------------------------------------------------------------------
def test_security_headers_and_405_allow(server):
    page = httpx.get(server.url + "/dashboard")
    csp = page.headers["content-security-policy"]
    for path in ("/dashboard/static/index.html", "/dashboard/static/dashboard.js", "/dashboard/jobs/1"):
        r = httpx.get(server.url + path)
        assert r.status_code == 200, path
        assert r.headers["content-security-policy"] == csp, path
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    for path in ("/api/health", "/openapi.json", "/api/v1/jobs"):
        r = httpx.get(server.url + path)
        assert r.headers["content-security-policy"].startswith("default-src 'none'"), path
        assert r.headers["x-content-type-options"] == "nosniff"
    for method, path, allow in (("POST", "/api/health", "GET, HEAD"), ("DELETE", "/dashboard", "GET, HEAD"),
                                ("PUT", "/docs/static/swagger-ui.css", "GET, HEAD")):
        r = httpx.request(method, server.url + path)
        assert r.status_code == 405 and r.headers["allow"] == allow, (path, r.headers)
        assert r.json()["detail"] == f"method {method} is not allowed on {path}; use GET or HEAD"
    with server.client() as c:
        r = c.put("/api/v1/jobs")
        assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, POST", r.headers
        assert r.json()["detail"].endswith("use GET or HEAD or POST")
    assert httpx.get(server.url + "/redoc").status_code == 404   # it would load from a CDN


@needs_browser
def test_docs_page_loads_nothing_from_outside(server, tmp_path):
    from test_dashboard import Browser

    page = httpx.get(server.url + "/docs")
    assert page.status_code == 200 and "http" not in page.text   # only paths of this origin
    assert "script-src 'self';" in page.headers["content-security-policy"]
    browser = Browser(tmp_path / "downloads")
    try:
        browser.driver.get(server.url + "/docs")
        n = browser.wait_for("return document.querySelectorAll('.opblock').length", what="Swagger UI's operations")
        assert n >= 14
        urls = [u for u in browser.collect() if not u.startswith("chrome://")]   # the browser's own new tab
        assert any(u.endswith("/openapi.json") for u in urls), urls
        assert all(u.startswith(server.url) or u.startswith(("data:", "blob:")) for u in urls), urls
        refused = [e["message"] for e in browser.driver.get_log("browser") if "Content Security Policy" in e["message"]]
        assert refused == []
    finally:
        browser.quit()


def test_new_tokens_never_start_like_an_option():
    """A token is passed on command lines (``--token T``): one starting with ``-`` would be read as an option
    (1 in 64 of ``secrets.token_urlsafe`` do)."""
    from nbmpi.server.auth import new_token

    tokens = [new_token() for _ in range(5000)]
    assert not [t for t in tokens if t.startswith("-")]
    assert len(set(tokens)) == len(tokens) and {len(t) for t in tokens} == {43}
