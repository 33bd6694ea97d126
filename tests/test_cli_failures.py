"""What a user sees on the command line when things go wrong, through the real CLI (subprocesses),
real mpiexec and a real controller (`nbmpi serve` on a random 127.0.0.1 port): `nbmpi run` tracebacks,
--timeout and Ctrl-C (no MPICH banner, where each rank was), `nbmpi submit` failures, syntax errors,
-n 0, Ctrl-C on --wait, the reason a queued job waits for a pool, `nbmpi pool start|stop`, `nbmpi jobs`
names."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from test_server import Server, job_processes, pool_processes, wait_state

RUN = [sys.executable, "-m", "nbmpi.workers.launch.cli", "run"]
NBMPI = [sys.executable, "-m", "nbmpi.server.cli"]
BANNER = "BAD TERMINATION"
LAUNCH_FRAMES = ("rank_entry.py", "rebinding_guard.py", "ast.py", "runpy.py")


def script(tmp_path: Path, code: str) -> Path:
    path = tmp_path / f"prog_{uuid.uuid4().hex[:8]}.py"
    path.write_text(textwrap.dedent(code).lstrip())
    return path


def run_env():
    env = dict(os.environ)
    env["NBMPI_TIMEOUT"] = ""   # blocking waits wait forever unless a test says otherwise
    return env


def start_until(cmd, marker: str, n: int, env, cwd, timeout: float = 90) -> subprocess.Popen:
    """Start ``cmd``; return once its stdout showed ``marker`` ``n`` times (each line is kept in ``proc.seen``)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    proc.seen = []
    deadline = time.monotonic() + timeout
    while sum(marker in line for line in proc.seen) < n:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError(f"exited {proc.wait()} before {marker!r}: {proc.stderr.read()}")
        proc.seen.append(line)
        assert time.monotonic() < deadline, f"no {marker!r} within {timeout} s"
    return proc


def finish(proc: subprocess.Popen, timeout: float = 90) -> str:
    try:
        proc.wait(timeout=timeout)
        return proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


HUNG = """
import numpy as np
from nbmpi.workers import ArrayChannel, world
comm = world()
rank = comm.Get_rank()
ch = ArrayChannel(8)
print("RUNNING", rank, flush=True)
if rank == 0:
    ch.take(1)
else:
    buf = np.zeros(1)
    peer = 0
    comm.Recv(buf, source=peer)
"""


def _assert_where(err: str, name: str) -> None:
    lines = err.splitlines()
    assert f"nbmpi run:   rank 0: take(src=1) waiting" in err and f"at {name} line 8 `ch.take(1)`" in err, err
    assert (f"nbmpi run:   rank 1: at {name} line 12 `comm.Recv(buf, source=peer)`: MPI Recv from rank 0"
            in lines), err
    assert BANNER not in err and "EXIT CODE" not in err and "=====" not in err, err


def test_run_timeout_says_where_each_rank_hung_without_mpich_banner(tmp_path):
    prog = script(tmp_path, HUNG)
    proc = start_until([*RUN, "-n", "2", "--timeout", "5", str(prog)], "RUNNING", 2, run_env(), tmp_path)
    err = finish(proc)
    assert proc.returncode == 124, err
    assert "nbmpi run: timed out after 5.0 s; all ranks terminated; where they were:" in err, err
    _assert_where(err, prog.name)


def test_run_ctrl_c_says_where_each_rank_was_without_mpich_banner(tmp_path):
    prog = script(tmp_path, HUNG)
    proc = start_until([*RUN, "-n", "2", str(prog)], "RUNNING", 2, run_env(), tmp_path)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    err = finish(proc)
    assert proc.returncode == 130, err
    assert "nbmpi run: interrupted; all ranks terminated; where they were:" in err, err
    _assert_where(err, prog.name)


FAILING = """
from nbmpi.workers import world
rank = world().Get_rank()
def inner():
    raise ValueError(f"bad value on rank {rank}")
if rank == 1:
    inner()
"""


def test_run_failure_prints_the_users_traceback_once(tmp_path):
    prog = script(tmp_path, FAILING)
    p = subprocess.run([*RUN, "-n", "2", "--timeout", "60", str(prog)], capture_output=True, text=True,
                       env=run_env(), cwd=tmp_path, timeout=120)
    assert p.returncode == 1, p.stderr
    assert p.stderr.count("Traceback (most recent call last):") == 1, p.stderr
    assert "[rank 1] Traceback (most recent call last):" in p.stderr.splitlines(), p.stderr
    assert f'File "{prog}", line 6, in <module>' in p.stderr and "ValueError: bad value on rank 1" in p.stderr
    assert not any(f in p.stderr for f in LAUNCH_FRAMES), p.stderr


# -- the controller ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("cli") / "data", max_ranks=2).start()
    yield srv
    srv.stop()
    leftovers = job_processes(srv.data_dir) + pool_processes(srv.data_dir)
    for p in leftovers:
        p.kill()
    assert leftovers == [], "a job or pool process survived the service"


def client_env(server, tmp_path):
    return dict(os.environ, NBMPI_SERVER=server.url, NBMPI_TOKEN=server.token,
                NBMPI_CONFIG=str(tmp_path / "none.json"))


def nbmpi(server, tmp_path, *argv, timeout=120):
    return subprocess.run([*NBMPI, *argv], capture_output=True, text=True, env=client_env(server, tmp_path),
                          timeout=timeout)


def test_submit_wait_failure_traceback_once_user_frames_only(server, tmp_path):
    prog = script(tmp_path, FAILING)
    p = nbmpi(server, tmp_path, "submit", str(prog), "-n", "2", "--wait")
    assert p.returncode == 1, p.stderr
    job_id = int(p.stdout.splitlines()[0])
    err = p.stderr.splitlines()
    assert err.count("[rank 1] Traceback (most recent call last):") == 1, p.stderr
    assert "[rank 1] [rank 1]" not in p.stderr and "[rank 1] ValueError: bad value on rank 1" in err, p.stderr
    assert any(line.startswith("[rank 1]   File ") and f'{prog.name}", line 6, in <module>' in line
               for line in err), p.stderr
    assert not any(f in p.stderr for f in LAUNCH_FRAMES), p.stderr
    assert f"nbmpi: job {job_id} failed" in p.stderr


def test_submit_checks_syntax_and_ranks_before_submitting(server, tmp_path):
    before = nbmpi(server, tmp_path, "jobs", "--json").stdout
    bad = script(tmp_path, "x = 1\nif x\n    print(x)\n")
    p = nbmpi(server, tmp_path, "submit", str(bad), "-n", "2", "--wait")
    assert p.returncode == 2 and p.stdout == "", p.stdout + p.stderr
    assert p.stderr == f"nbmpi submit: {bad}, line 2: expected ':' (nothing was submitted)\n", p.stderr
    ok = script(tmp_path, "print('hi')\n")
    p = nbmpi(server, tmp_path, "submit", str(ok), "-n", "0")
    assert p.returncode == 2 and p.stderr == ("nbmpi submit: -n must be at least 1 (the number of MPI ranks), "
                                              "got 0; nothing was submitted\n"), p.stderr
    assert nbmpi(server, tmp_path, "jobs", "--json").stdout == before
    # what the service itself answers to ranks 0 (an old client, curl): one readable line, not pydantic's dump
    from nbmpi.server.client import ApiError, Client

    with Client(server.url, server.token) as c, pytest.raises(ApiError) as info:
        c.submit("print(1)", ranks=0)
    assert str(info.value) == "422: invalid request: body.ranks: Input should be greater than or equal to 1"


SLEEPER = """
import time
from nbmpi.workers import world
print("RUNNING", world().Get_rank(), flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("cancel", [False, True])
def test_ctrl_c_on_submit_wait(server, tmp_path, cancel):
    prog = script(tmp_path, SLEEPER)
    extra = ["--cancel-on-interrupt"] if cancel else []
    proc = start_until([*NBMPI, "submit", str(prog), "-n", "1", "--wait", "--name", "sleepy", *extra], "RUNNING",
                       1, client_env(server, tmp_path), tmp_path)
    job_id = int(proc.seen[0])
    proc.send_signal(signal.SIGINT)
    err = finish(proc, timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    with server.client() as c:
        if cancel:
            assert err.strip() == f"nbmpi: interrupted; job {job_id} cancelled (cancelled)", err
            assert c.get(f"/api/v1/jobs/{job_id}").json()["state"] == "cancelled"
        else:
            assert err.strip() == (f"nbmpi: stopped following job {job_id}; it is still running on the controller "
                                   f"(cancel it with `nbmpi cancel {job_id}`; `submit --wait --cancel-on-interrupt` "
                                   "cancels on Ctrl-C)"), err
            assert c.get(f"/api/v1/jobs/{job_id}").json()["state"] == "running"
            listing = nbmpi(server, tmp_path, "jobs").stdout.splitlines()
            row = next(line for line in listing if line.split()[0] == str(job_id))
            assert row.split()[1] == "running" and " sleepy " in row and row.endswith(prog.name), listing
            p = nbmpi(server, tmp_path, "cancel", str(job_id))
            assert p.returncode == 0 and p.stdout == f"job {job_id}: cancelled\n", p.stdout + p.stderr


def test_pool_cli_and_the_reason_a_queued_job_waits(server, tmp_path):
    p = nbmpi(server, tmp_path, "pool", "start", "-n", "2", "--name", "mine", timeout=300)
    assert p.returncode == 0, p.stderr
    pool_id = int(p.stdout.split()[1].rstrip(":"))
    assert p.stdout == (f"pool {pool_id}: running, 2 ranks; run a job on it with `nbmpi submit SCRIPT --pool "
                        f"{pool_id}`; stop it with `nbmpi pool stop {pool_id}`\n"), p.stdout
    try:
        listing = nbmpi(server, tmp_path, "pools").stdout.splitlines()
        assert any(line.split()[:3] == [str(pool_id), "mine", "running"] for line in listing), listing
        p = nbmpi(server, tmp_path, "submit", str(script(tmp_path, "print('batch')\n")), "-n", "1")
        job_id = int(p.stdout)
        with server.client() as c:
            deadline = time.monotonic() + 30
            while not (c.get(f"/api/v1/jobs/{job_id}").json()["message"] or "").startswith("waiting: "):
                assert time.monotonic() < deadline, "no reason given for the queued job"
                time.sleep(0.2)
            job = c.get(f"/api/v1/jobs/{job_id}").json()
            assert job["state"] == "queued" and job["message"] == (
                f"waiting: needs 1 ranks, 0 of 2 free; held by pool {pool_id} (2 ranks) (a pool holds its ranks "
                "until it is stopped: `nbmpi pool stop ID`)"), job
            p = nbmpi(server, tmp_path, "pool", "stop", str(pool_id), timeout=180)
            assert p.returncode == 0 and p.stdout.startswith(f"pool {pool_id}: stopped"), p.stdout + p.stderr
            job = wait_state(c, job_id, ("succeeded", "failed"))
            assert job["state"] == "succeeded" and job["message"] is None, job
    finally:
        nbmpi(server, tmp_path, "pool", "stop", str(pool_id), timeout=180)
    assert pool_processes(server.data_dir) == []
    p = nbmpi(server, tmp_path, "pool", "stop", "9999")
    assert p.returncode == 1 and p.stderr.startswith("nbmpi: 404: "), p.stderr


def test_remote_traceback_of_code_without_source_has_no_repeated_could_not_get_source():
    """A real IPython traceback (as the engines format it) through five frames of dynamically compiled
    code carries IPython's "Could not get source" line five times; the rendered error has none of them
    and keeps every frame's header."""
    from IPython.core.ultratb import VerboseTB

    from nbmpi.kernel_ext.output import NO_SOURCE, DistributedCellError

    ns: dict = {}
    exec(compile("def f(n):\n    if n == 0:\n        raise ValueError('deep')\n    f(n - 1)\n", "<dyn>", "exec"), ns)
    try:
        ns["f"](4)
    except ValueError:
        tb = VerboseTB(theme_name="nocolor").text(*sys.exc_info())
    assert tb.count(NO_SOURCE) == 5
    text = "\n".join(DistributedCellError({0: ("ValueError", "deep", tb), 1: ("ValueError", "deep", tb)}, {})
                     ._render_traceback_())
    assert NO_SOURCE not in text and text.count("File <dyn>:4, in f(n=") == 4, text
    assert text.startswith("[ranks 0-1] remote traceback:") and text.endswith("DistributedCellError: ValueError on "
                                                                                "ranks 0-1: deep"), text
