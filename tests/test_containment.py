"""Nothing a controller job or pool starts outlives it, even when the job kills its own rank guard.

A job runs in the same UNIX account as its rank guard (a child subreaper), so it can kill the
guard and the Hydra proxy above it and leave a daemon (double fork, ``setsid``, every fd closed,
sleeping forever) re-parented to init, out of every process tree the controller follows. A
controller run by root with a writable cgroup v2 hierarchy starts each job and pool in a cgroup
of its own (:mod:`nbmpi.workers.launch.cgroups`) and ends everything in it. Against a real
``nbmpi serve`` run as root with two users mapped to real UNIX accounts (``nbmpi-t-carol``,
``nbmpi-t-dave``, made here and removed after, also on failure), real mpiexec, real cgroups:

* a job that starts a daemon, then kills its Hydra proxy and its guard, and exits: after it
  ends the daemon is gone;
* the same with the proxy stopped (``SIGSTOP``) instead of killed, so the job still runs: after
  its cancel the daemon is gone;
* the same from a job on a pool's engine: after the pool is deleted the daemon is gone;
* the controller's cgroups are gone after it stops; a stale one of a previous run is ended and
  removed at start; ``/api/health`` says which containment is in force.

The log cap with ``NBMPI_RANK_GUARD=0`` / ``NBMPI_LOG_LIMIT`` in a job's env is
tests/test_isolation.py's ``test_job_env_cannot_lift_the_log_cap``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from test_isolation import _write_users, made_accounts, reachable_tmp, shared_python  # noqa: F401 (fixtures)
from test_server import Server, job_processes, submit, wait_state

from nbmpi.workers.launch.cgroups import CGROUP_PHRASE, ControllerCgroups, cgroup2_mount, freezer_mount, members
from nbmpi.workers.launch.identity import Identity, start_options
from nbmpi.workers.launch.processes import end_cgroup, end_processes

CAROL, DAVE = "nbmpi-t-carol", "nbmpi-t-dave"
TOKENS = {CAROL: "carol-token-0123456789abcdefghijklmnop", DAVE: "dave-token-0123456789abcdefghijklmnopq"}


def _cgroups_usable() -> bool:
    if os.geteuid() != 0 or cgroup2_mount() is None:
        return False
    probe = ControllerCgroups.open(f"/nbmpi-test-probe-{os.getpid()}")
    if probe is None:
        return False
    os.rmdir(probe.base)
    return True


needs_cgroups = pytest.mark.skipif(not _cgroups_usable(), reason="needs root and a writable cgroup v2 hierarchy")
needs_accounts = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                    reason="creating UNIX accounts and dropping to them needs root and useradd")


@pytest.fixture(scope="module")
def accounts():
    """Two accounts of this module's own (made now, removed after with anything running as them)."""
    yield from made_accounts((CAROL, DAVE), grace=0.5)


ESCAPE = r"""
import ctypes, os, signal, time
out = {out!r}
def ppid_of(pid):
    with open(f"/proc/{{pid}}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
def comm(pid):
    with open(f"/proc/{{pid}}/comm") as f:
        return f.read().strip()
if os.fork() == 0:                        # the daemon: double fork, setsid, every fd closed, forever
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    os.closerange(0, 65536)
    with open(os.path.join(out, "daemon.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(out, "daemon.tmp"), os.path.join(out, "daemon.pid"))
    while True:
        time.sleep(60)
while not os.path.exists(os.path.join(out, "daemon.pid")):
    time.sleep(0.02)
guard = os.getppid()
proxy = ppid_of(guard)
with open(os.path.join(out, "escape.tmp"), "w") as f:   # then renamed: the test never reads it half written
    f.write(f"{{os.getpid()}} {{guard}} {{proxy}} {{comm(proxy)}}\n")
os.rename(os.path.join(out, "escape.tmp"), os.path.join(out, "escape.txt"))
ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)   # PR_SET_PDEATHSIG off: the rank outlives its guard too
os.kill(proxy, signal.{proxy_signal})
os.kill(guard, signal.SIGKILL)
with open(os.path.join(out, "escaped"), "w") as f:
    f.write("guard killed")
{after}
"""


def _escape_code(out: Path, proxy_signal: str, after: str = "time.sleep(600)") -> str:
    return ESCAPE.format(out=str(out), proxy_signal=proxy_signal, after=after)


def _wait_file(path: Path, within: float = 90.0) -> str:
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared: the job did not get that far"
        time.sleep(0.05)
    return path.read_text()


def _escapees(out: Path):
    """The daemon and the rank of an escaping job, as processes (checked while they still run)."""
    daemon = int(_wait_file(out / "daemon.pid"))
    rank, guard, proxy, proxy_name = _wait_file(out / "escape.txt").split()
    assert "hydra" in proxy_name, f"the rank's guard's parent is {proxy_name}, not the Hydra proxy"
    found = []
    for pid in (daemon, int(rank)):
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:   # already ended: nothing to follow
            pass
    return found


def _all_gone(procs, within: float = 30.0) -> list:
    """Those of ``procs`` still running (not zombies) after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _shared_out(root: Path, name: str) -> Path:
    d = root / name
    d.mkdir()
    os.chmod(d, 0o1777)   # the job's account writes its pids there
    return d


@pytest.fixture()
def two_user_server(accounts, reachable_tmp, shared_python):  # noqa: F811 (fixtures)
    data = reachable_tmp / "data"
    _write_users(data / "users.json", {TOKENS[u]: {"user": u.split("-")[-1], "account": u} for u in (CAROL, DAVE)})
    srv = Server(data, python=shared_python[0], env=shared_python[1]).start()
    base = ControllerCgroups(os.path.join(cgroup2_mount(), "nbmpi", ControllerCgroups.key_of(str(data))))
    try:
        yield srv, base
    finally:
        srv.stop()
        leftovers = job_processes(data)
        end_processes(pids=[p.pid for p in leftovers], grace=0.5)
        for name in base.names():   # (only when the controller failed to)
            end_cgroup(base.path(name))
        if os.path.isdir(base.base):
            os.rmdir(base.base)
        assert leftovers == []


@needs_cgroups
@needs_accounts
def test_a_job_that_kills_its_guard_and_proxy_leaves_nothing(two_user_server, reachable_tmp, accounts):  # noqa: F811
    srv, base = two_user_server
    assert httpx.get(srv.url + "/api/health").json()["containment"] == CGROUP_PHRASE
    out = _shared_out(reachable_tmp, "ended")
    escapees = []
    try:
        with srv.client(TOKENS[DAVE]) as dave:
            # the rank then exits at once: holding the proxy's sockets it would keep mpiexec waiting
            job = submit(dave, _escape_code(out, "SIGKILL", after="os._exit(3)"), ranks=1)
            escapees = _escapees(out)
            assert {p.uids().real for p in escapees} <= {accounts[DAVE].pw_uid}
            done = wait_state(dave, job["id"], ("succeeded", "failed", "cancelled"))
            assert done["state"] == "failed", done
            left = _all_gone(escapees)
            assert not left, f"outlived their job: {[(p.pid, p.name()) for p in left]}"
            assert f"job-{job['id']}" not in base.names()
    finally:
        end_processes(pids=[p.pid for p in escapees if p.is_running()], grace=0.2)


@needs_cgroups
@needs_accounts
def test_a_running_job_that_killed_its_guard_leaves_nothing_after_its_cancel(two_user_server, reachable_tmp):  # noqa: F811
    srv, base = two_user_server
    out = _shared_out(reachable_tmp, "cancelled")
    escapees = []
    try:
        with srv.client(TOKENS[CAROL]) as carol:
            job = submit(carol, _escape_code(out, "SIGSTOP"), ranks=1)   # the proxy stopped: mpiexec waits on
            escapees = _escapees(out)
            _wait_file(out / "escaped")
            group = base.path(f"job-{job['id']}")
            assert {p.pid for p in escapees} <= set(members(group)), "the job's processes are not in its cgroup"
            time.sleep(0.5)
            assert carol.get(f"/api/v1/jobs/{job['id']}").json()["state"] == "running"
            assert carol.delete(f"/api/v1/jobs/{job['id']}").status_code == 200
            assert wait_state(carol, job["id"], ("cancelled",))["state"] == "cancelled"
            left = _all_gone(escapees)
            assert not left, f"outlived the cancel of their job: {[(p.pid, p.name()) for p in left]}"
            assert not os.path.exists(group)
    finally:
        end_processes(pids=[p.pid for p in escapees if p.is_running()], grace=0.2)


@needs_cgroups
@needs_accounts
def test_a_pool_engine_that_kills_its_guard_leaves_nothing_after_the_pool(two_user_server, reachable_tmp):  # noqa: F811
    srv, base = two_user_server
    out = _shared_out(reachable_tmp, "pool")
    escapees = []
    try:
        with srv.client(TOKENS[DAVE]) as dave:
            r = dave.post("/api/v1/pools", json={"ranks": 1, "name": "escape"})
            assert r.status_code == 201 and r.json()["state"] == "running", r.text
            pool = r.json()
            group = base.path(f"pool-{pool['id']}")
            assert set(pool["connection"]["pids"]) <= set(members(group))
            submit(dave, _escape_code(out, "SIGSTOP", after="pass"), ranks=None, pool=pool["id"])
            escapees = _escapees(out)
            _wait_file(out / "escaped")
            assert dave.delete(f"/api/v1/pools/{pool['id']}").status_code == 200
            left = _all_gone(escapees)
            assert not left, f"outlived their pool: {[(p.pid, p.name()) for p in left]}"
            assert not os.path.exists(group)
    finally:
        end_processes(pids=[p.pid for p in escapees if p.is_running()], grace=0.2)


@needs_cgroups
def test_stale_cgroups_of_a_previous_run_are_ended_at_start(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    cgroups = ControllerCgroups.open(str(data))
    stale = cgroups.create("job-999")
    cmd, options = start_options(["sh", "-c", "(setsid sleep 600 &); exec sleep 600"], None, stale)
    proc = subprocess.Popen(cmd, start_new_session=True, **options)
    srv = None
    try:
        deadline = time.monotonic() + 30
        while len(members(stale)) < 2:
            assert time.monotonic() < deadline, "the stale cgroup's processes did not start"
            time.sleep(0.05)
        victims = [psutil.Process(p) for p in members(stale)]
        srv = Server(data).start()
        assert not os.path.exists(stale) and _all_gone(victims) == []
        srv.stop()
        srv = None
        assert cgroups.names() == []
    finally:
        if srv is not None:
            srv.stop()
        end_cgroup(stale)
        proc.wait(timeout=10)
        if os.path.isdir(cgroups.base):
            os.rmdir(cgroups.base)


@needs_cgroups
def test_a_cgroup_is_made_after_a_previous_run_removed_the_controller_directory(tmp_path):
    # a previous run of the same controller (same data directory) that is still stopping removes the controller's
    # directory when empty, also after the new run opened it: the new run's first pool must still get its cgroup
    # (CI once failed: "could not make the cgroup .../c-.../pool-1: No such file or directory")
    cgroups = ControllerCgroups.open(str(tmp_path))
    try:
        os.rmdir(cgroups.base)              # what the stopping run's close() does
        path = cgroups.create("pool-1")
        assert os.path.isdir(path) and os.path.exists(os.path.join(path, "cgroup.procs"))
        os.rmdir(path)
    finally:
        if os.path.isdir(cgroups.base):
            os.rmdir(cgroups.base)


@pytest.mark.parametrize("hierarchy", ["v2", "v1-freezer"])
def test_end_cgroup_ends_what_escaped_every_process_tree(hierarchy):
    mount = cgroup2_mount() if hierarchy == "v2" else freezer_mount()
    cgroups = ControllerCgroups.open(f"/nbmpi-test-{os.getpid()}", mount=mount) if mount else None
    if cgroups is None:
        pytest.skip(f"needs root and a writable cgroup {hierarchy} hierarchy")
    group = cgroups.create("job-1")
    nobody = Identity.of("nobody")
    # the wrapper enters the cgroup, then drops to the account: `id -u` says so; the daemon's parent exits
    cmd, options = start_options(["sh", "-c", "id -u; (setsid sh -c 'exec 0<&- 1>&- 2>&-; sleep 600' &)"],
                                 nobody, group)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, **options)
        assert res.returncode == 0 and res.stdout.split() == [str(nobody.uid)], res
        deadline = time.monotonic() + 30
        while not members(group):
            assert time.monotonic() < deadline, "the daemon never ran"
            time.sleep(0.05)
        daemon = [psutil.Process(p) for p in members(group)]
        assert {p.ppid() for p in daemon} != {os.getpid()} and {p.uids().real for p in daemon} == {nobody.uid}
        assert end_cgroup(group) and not os.path.exists(group)
        assert _all_gone(daemon, within=5) == []
    finally:
        end_cgroup(group)
        os.rmdir(cgroups.base)


def test_a_service_not_root_makes_no_cgroups(tmp_path):
    if os.geteuid() != 0:
        assert ControllerCgroups.open(str(tmp_path)) is None
        return
    os.seteuid(65534)   # a root test process drops its effective uid for the check
    try:
        assert ControllerCgroups.open(str(tmp_path)) is None
    finally:
        os.seteuid(0)


def test_no_cgroup2_mount_means_no_cgroups(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ncgroup /sys/fs/cgroup/pids cgroup rw,pids 0 0\n")
    assert cgroup2_mount(str(mounts)) is None
    assert freezer_mount(str(mounts)) is None
    mounts.write_text("cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n"
                      "cgroup /sys/fs/cgroup/freezer cgroup rw,nosuid,freezer 0 0\n")
    assert cgroup2_mount(str(mounts)) == "/sys/fs/cgroup"
    assert freezer_mount(str(mounts)) == "/sys/fs/cgroup/freezer"
