"""Users kept apart by the operating system, and jobs that leave nothing behind, against a real
`nbmpi serve` (tests/test_server.py's Server) and real mpiexec.

* As root: two real UNIX accounts (``nbmpi-t-alice``, ``nbmpi-t-bob``, created here and removed
  after, also on failure); bob's job runs as ``nbmpi-t-bob`` and cannot read the users file, the
  records database, nor list or read alice's job directory; several users sharing one account
  are refused.
* Any user: several users without accounts are refused unless ``--unsafe-shared-account``
  (then ``/api/health`` and the dashboard say it is unsafe); a daemonising job (double fork,
  ``setsid``, closed fds, ``sleep 600``) leaves no process after it ends nor after a cancel;
  ``NBMPI_RANK_GUARD=0`` in a job's env does not lift the log cap.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from test_server import Server, job_processes, submit, wait_state

from nbmpi.server.accounts import open_in_job
from nbmpi.workers.launch.environment import GUARD_ENV, LOG_LIMIT_ENV, STATUS_DIR_ENV, job_environment
from nbmpi.workers.launch.processes import end_processes

ALICE, BOB = "nbmpi-t-alice", "nbmpi-t-bob"
TOKENS = {ALICE: "alice-token-0123456789abcdefghijklmnop", BOB: "bob-token-0123456789abcdefghijklmnopq"}

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="creating UNIX accounts and dropping to them needs root and useradd")


def _write_users(path: Path, entries: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries))
    os.chmod(path, 0o600)


def _serve_once(data_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run `nbmpi serve` expecting it to refuse to start (it must exit by itself)."""
    env = dict(os.environ, NBMPI_CONFIG=str(data_dir.parent / "client.json"))
    return subprocess.run([sys.executable, "-m", "nbmpi.server.cli", "serve", "--port", "0", "--data-dir",
                           str(data_dir), *extra], capture_output=True, text=True, env=env, timeout=120)


def _processes_of(uid: int):
    out = []
    for p in psutil.process_iter(["pid", "uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real == uid:
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


def made_accounts(names, grace: float = 1.0):
    """Create the UNIX accounts ``names`` (removing a leftover of an interrupted run first) and yield
    ``{name: pwd entry}``; afterwards end anything still running as them and remove them (also on failure).
    A generator for module fixtures: ``yield from made_accounts((...))``."""
    made = []
    try:
        for name in names:
            subprocess.run(["userdel", "-r", name], capture_output=True)   # a leftover of an interrupted run
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
            made.append(name)
        yield {n: pwd.getpwnam(n) for n in made}
    finally:
        for name in made:
            end_processes(pids=_processes_of(pwd.getpwnam(name).pw_uid), grace=grace)
            subprocess.run(["userdel", "-r", name], capture_output=True)


@pytest.fixture(scope="module")
def accounts():
    """The two test accounts (created now, removed after, with anything still running as them)."""
    yield from made_accounts((ALICE, BOB))


@pytest.fixture(scope="module")
def shared_python():
    """A Python every account can run, with this test run's packages: the ranks of each user run as
    that user's account, and this run's interpreter may sit in a directory only root can enter
    (e.g. pyenv under /root). A virtual environment of the system's Python of the same minor
    version whose ``.pth`` adds this environment's site-packages."""
    import sysconfig

    here = Path(os.path.realpath(sys.executable))
    if all(os.stat(d).st_mode & 0o001 for d in here.parents):
        yield sys.executable, {}
        return
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
    if system is None or not all(os.stat(d).st_mode & 0o001 for d in Path(os.path.realpath(system)).parents):
        pytest.skip(f"this Python ({here}) is not reachable by other accounts and no system "
                    f"python{sys.version_info.major}.{sys.version_info.minor} is")
    d = Path(tempfile.mkdtemp(prefix="nbmpi-iso-py-"))
    try:
        os.chmod(d, 0o755)
        subprocess.run([system, "-m", "venv", "--without-pip", str(d / "venv")], check=True, capture_output=True)
        ours = sysconfig.get_paths()["purelib"]
        theirs = subprocess.run([str(d / "venv" / "bin" / "python"), "-c",
                                 "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
        Path(theirs, "nbmpi-test.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        for lib in Path(sys.prefix, "lib").iterdir():   # the mpich wheel's libmpi, found under sys.prefix/lib
            if not lib.name.startswith("python"):
                os.symlink(lib, d / "venv" / "lib" / lib.name)
        mpiexec = Path(sys.executable).parent / "mpiexec"   # the mpich wheel's, in this environment
        yield str(d / "venv" / "bin" / "python"), {"NBMPI_MPIEXEC": str(mpiexec)}
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def reachable_tmp():
    """A temporary directory other accounts may traverse (their job directories lie inside)."""
    d = Path(tempfile.mkdtemp(prefix="nbmpi-iso-"))
    os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


PROBE_JOB = """
import os, subprocess
print("account", subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip())
def attempt(what, fn):
    try:
        fn()
        print(what, "READ")
    except PermissionError:
        print(what, "denied")
attempt("users-file", lambda: open({users!r}).read())
attempt("database", lambda: open({db!r}, "rb").read())
attempt("alice-list", lambda: os.listdir({alice_dir!r}))
attempt("alice-log", lambda: open({alice_log!r}).read())
attempt("jobs-list", lambda: os.listdir({jobs!r}))
attempt("data-list", lambda: os.listdir({data!r}))
"""


@needs_root
def test_each_user_runs_as_their_own_account(accounts, reachable_tmp, shared_python):
    data = reachable_tmp / "data"
    users = data / "users.json"
    _write_users(users, {TOKENS[u]: {"user": u.split("-")[-1], "account": u} for u in (ALICE, BOB)})
    srv = Server(data, python=shared_python[0], env=shared_python[1]).start()
    try:
        health = httpx.get(srv.url + "/api/health").json()
        assert {k: health[k] for k in ("status", "isolation", "warning")} == {"status": "ok", "isolation": "accounts", "warning": None}
        with srv.client(TOKENS[ALICE]) as alice, srv.client(TOKENS[BOB]) as bob:
            a = submit(alice, "print('alice secret')", ranks=1)
            done = wait_state(alice, a["id"], ("succeeded", "failed"))
            assert done["state"] == "succeeded", (done, alice.get(f"/api/v1/jobs/{a['id']}/logs",
                                                                  params={"stream": "stderr"}).text)
            alice_dir = data / "jobs" / str(a["id"])
            st = alice_dir.stat()
            assert (st.st_uid, st.st_mode & 0o777) == (accounts[ALICE].pw_uid, 0o700)
            code = PROBE_JOB.format(users=str(users), db=str(data / "nbmpi.db"), alice_dir=str(alice_dir),
                                    alice_log=str(alice_dir / "logs" / "rank-0.stdout"), jobs=str(data / "jobs"),
                                    data=str(data))
            b = submit(bob, code, ranks=2)
            done = wait_state(bob, b["id"], ("succeeded", "failed"))
            out = bob.get(f"/api/v1/jobs/{b['id']}/logs", params={"rank": 0}).text
            assert done["state"] == "succeeded", (done, out, bob.get(f"/api/v1/jobs/{b['id']}/logs",
                                                                     params={"rank": 0, "stream": "stderr"}).text)
            lines = dict(line.split(" ", 1) for line in out.splitlines())
            assert lines == {"account": BOB, "users-file": "denied", "database": "denied", "alice-list": "denied",
                             "alice-log": "denied", "jobs-list": "denied", "data-list": "denied"}
            assert alice.get(f"/api/v1/jobs/{a['id']}/logs").text == "alice secret\n"
            # a pool's engines run as its owner's account too (and end with it)
            r = bob.post("/api/v1/pools", json={"ranks": 2, "name": "bobs"})
            assert r.status_code == 201 and r.json()["state"] == "running", r.text
            pool = r.json()
            try:
                on_pool = submit(bob, "import os, pwd; print(pwd.getpwuid(os.getuid()).pw_name, rank)",
                                 ranks=None, pool=pool["id"])
                done = wait_state(bob, on_pool["id"], ("succeeded", "failed"))
                assert done["state"] == "succeeded", done
                for r in (0, 1):
                    assert bob.get(f"/api/v1/jobs/{on_pool['id']}/logs", params={"rank": r}).text == f"{BOB} {r}\n"
                pids = bob.get(f"/api/v1/pools/{pool['id']}").json()["connection"]["pids"]
                assert {psutil.Process(p).uids().real for p in pids} == {accounts[BOB].pw_uid}
            finally:
                assert bob.delete(f"/api/v1/pools/{pool['id']}").status_code == 200
        for f in (users, data / "nbmpi.db"):
            assert (f.stat().st_uid, f.stat().st_mode & 0o777) == (0, 0o600), f
    finally:
        srv.stop()
    assert job_processes(data) == []


@needs_root
def test_two_users_in_one_account_are_refused(accounts, reachable_tmp, shared_python):
    data = reachable_tmp / "data"
    _write_users(data / "users.json", {TOKENS[ALICE]: {"user": "alice", "account": ALICE},
                                       TOKENS[BOB]: {"user": "bob", "account": ALICE}})
    res = _serve_once(data)
    assert res.returncode == 2 and "share the account" in res.stderr, res.stderr


def test_several_users_without_accounts_need_the_unsafe_flag(tmp_path):
    data = tmp_path / "data"
    _write_users(data / "users.json", {TOKENS[ALICE]: "alice", TOKENS[BOB]: "bob"})
    res = _serve_once(data)
    assert res.returncode == 2 and "--unsafe-shared-account" in res.stderr, res.stderr
    srv = Server(data, extra_args=["--unsafe-shared-account"]).start()
    try:
        health = httpx.get(srv.url + "/api/health").json()
        assert health["isolation"] == "shared-account" and health["warning"].startswith("UNSAFE")
        assert 'id="isolation-warning"' in httpx.get(srv.url + "/dashboard").text
    finally:
        srv.stop()


DAEMON_JOB = """
import os, sys, time
if os.fork() == 0:                      # a daemon: double fork, setsid, every fd closed
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    with open("daemon.pid", "w") as f:
        f.write(str(os.getpid()))
    os.closerange(0, 1024)
    time.sleep(600)
    os._exit(0)
while not os.path.exists("daemon.pid") or not open("daemon.pid").read():
    time.sleep(0.02)
print("daemon", open("daemon.pid").read(), flush=True)
time.sleep({after})
"""


def _daemon_pid(c: httpx.Client, job_id: int) -> psutil.Process:
    deadline = time.monotonic() + 90
    while True:
        text = c.get(f"/api/v1/jobs/{job_id}/logs").text
        if text.startswith("daemon "):
            return psutil.Process(int(text.split()[1]))
        assert time.monotonic() < deadline, f"the job's daemon did not start: {text!r}"
        time.sleep(0.1)


def _gone(proc: psutil.Process, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("iso") / "data", extra_args=["--max-log-bytes", "2000"]).start()
    yield srv
    srv.stop()
    assert job_processes(srv.data_dir) == []


def test_daemon_of_a_job_ends_with_the_job(capped_server):
    with capped_server.client() as c:
        job = submit(c, DAEMON_JOB.format(after=0), ranks=1)
        daemon = _daemon_pid(c, job["id"])
        try:
            assert wait_state(c, job["id"], ("succeeded", "failed"))["state"] == "succeeded"
            assert _gone(daemon), f"daemon {daemon.pid} outlived its job"
        finally:
            end_processes(pids=[daemon.pid] if daemon.is_running() else [], grace=0.5)


def test_daemon_of_a_job_ends_with_its_cancel(capped_server):
    with capped_server.client() as c:
        job = submit(c, DAEMON_JOB.format(after=600), ranks=1)
        daemon = _daemon_pid(c, job["id"])
        try:
            assert c.delete(f"/api/v1/jobs/{job['id']}").status_code == 200
            assert wait_state(c, job["id"], ("cancelled",))["state"] == "cancelled"
            assert _gone(daemon), f"daemon {daemon.pid} outlived the cancel of its job"
        finally:
            end_processes(pids=[daemon.pid] if daemon.is_running() else [], grace=0.5)


def test_job_env_cannot_lift_the_log_cap(capped_server):
    with capped_server.client() as c:
        job = c.post("/api/v1/jobs", json={"code": "print('x' * 100_000)", "ranks": 1,
                                           "env": {GUARD_ENV: "0", LOG_LIMIT_ENV: "0"}}).json()
        assert wait_state(c, job["id"], ("succeeded", "failed"))["state"] == "succeeded"
        log = c.get(f"/api/v1/jobs/{job['id']}/logs").text
    assert "[nbmpi: output truncated here" in log and len(log) < 2000 + 500


class _Job:
    env = {GUARD_ENV: "0", STATUS_DIR_ENV: "/elsewhere", "MINE": "1"}
    log_dir, trace_dir, log_limit = "/j/logs", "/j/trace", 123


def test_job_environment_sets_what_the_launcher_owns():
    env = job_environment(_Job(), "/j/status", {"PATH": "/bin", "NBMPI_LOG_LIMIT": "0"})
    assert env[GUARD_ENV] == "1" and env[STATUS_DIR_ENV] == "/j/status" and env[LOG_LIMIT_ENV] == "123"
    assert env["MINE"] == "1" and env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"


def test_job_files_are_read_without_following_links(tmp_path):
    job = tmp_path / "job"
    (job / "logs").mkdir(parents=True)
    (tmp_path / "secret").write_text("secret")
    (job / "logs" / "rank-0.stdout").write_text("mine")
    os.symlink(tmp_path / "secret", job / "logs" / "rank-1.stdout")
    os.symlink(tmp_path, job / "linked")
    with open(open_in_job(job, "logs", "rank-0.stdout")) as f:
        assert f.read() == "mine"
    for parts in (("logs", "rank-1.stdout"), ("linked", "secret")):
        with pytest.raises(OSError):
            os.close(open_in_job(job, *parts))
    with pytest.raises(FileNotFoundError):
        open_in_job(job, "logs", "rank-2.stdout")


def test_every_nbmpi_variable_is_named_in_the_environment_module():
    import re

    from nbmpi.workers.launch import environment

    repo = Path(__file__).resolve().parent.parent
    named = {v for v in vars(environment).values() if isinstance(v, str) and v.startswith("NBMPI_")}
    named |= set(environment.RUNTIME_VARIABLES)
    used = {}
    for folder in ("workers", "server", "kernel_ext"):
        for path in (repo / folder).rglob("*.py"):
            for name in re.findall(r"[\"'](NBMPI_[A-Z0-9_]+)[\"']", path.read_text()):
                used.setdefault(name, str(path.relative_to(repo)))
    missing = {n: p for n, p in used.items() if n not in named}
    assert not missing, f"NBMPI_* variables not named in nbmpi.workers.launch.environment: {missing}"


def test_noted_segments_outside_dev_shm_are_never_removed(tmp_path):
    from nbmpi.workers.launch.processes import remove_shm

    victim = tmp_path / "victim"
    victim.write_text("keep")
    assert remove_shm([f"/dev/shm/../..{victim}", f"/dev/shm/{'../' * 5}{str(victim).lstrip('/')}"]) == []
    assert victim.read_text() == "keep"
    mine = Path(f"/dev/shm/nbmpi-test-remove-{os.getpid()}")
    mine.write_bytes(b"x")
    try:
        assert remove_shm([str(mine)]) == [str(mine)] and not mine.exists()
    finally:
        mine.unlink(missing_ok=True)
