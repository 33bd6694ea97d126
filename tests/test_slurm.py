"""The Slurm backend and the deploy/slurm/ scripts against a real single-node Slurm.

The module fixture ``slurm`` configures and starts Debian's Slurm 22.05 on
127.0.0.1: a munged with a generated key, slurmctld and slurmd (as root, in
the foreground, stopped by pid afterwards) with a ``slurm.conf`` in a
temporary directory: one node named like this host with this machine's CPUs,
one partition, ``proctrack/linuxproc`` (no cgroups in a container),
``select/cons_tres`` with ``CR_Core``, no accounting storage (``sacct`` then
answers "accounting storage is disabled": ended jobs are seen with
``squeue --states=all`` for ``MinJobAge`` seconds), ``EnforcePartLimits=ALL``
(``sbatch`` refuses a job larger than the partition). Every job left is
cancelled before the daemons stop. It skips only when the packages are
missing and cannot be installed with apt-get.

Slurm enforces time limits in whole minutes and checks them every 30 s, so a
time-limit kill takes 60-90 s. To keep the file short, the controller tests
share one controller and run in file order: the time-limit job is submitted
first, and the restart, cancel and bad-case checks run while Slurm lets it
run out; later tests say so when an earlier one did not leave what they need.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict, Optional

import httpx
import psutil
import pytest

from nbmpi.workers.launch.engine_pool import EnginePool
from nbmpi.workers.launch.processes import noted_segments

from liveness import running
from test_isolation import accounts, shared_python  # noqa: F401 - fixtures: real UNIX accounts, a Python they run
from test_server import CHANNEL_JOB, SLEEP_JOB, submit

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client"}
PARTITION = "debug"

SLEEP_JOB = SLEEP_JOB.format(seconds=600)


# -- the cluster -----------------------------------------------------------------------------------
def _find(cmd: str) -> Optional[str]:
    return shutil.which(cmd) or next((p for p in (f"/usr/sbin/{cmd}", f"/usr/bin/{cmd}") if os.access(p, os.X_OK)),
                                     None)


def _ensure_packages() -> Optional[str]:
    """None when Slurm's and munge's programs are there (installing them with apt-get if they are
    not and this is root on Debian); else why they cannot be."""
    missing = [pkg for cmd, pkg in DAEMONS.items() if _find(cmd) is None]
    if not missing:
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return (f"Slurm test cluster needs the Debian packages {', '.join(PACKAGES)} ({', '.join(missing)} "
                "missing) and they cannot be installed here (no root or no apt-get); .ci/run installs them")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                                                   *PACKAGES]):
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if p.returncode != 0:
                return f"Slurm packages missing and `{' '.join(cmd)}` failed: {p.stderr.strip()[-500:]}"
    except subprocess.TimeoutExpired:
        return "Slurm packages missing and apt-get did not finish within 15 minutes"
    still = [cmd for cmd in DAEMONS if _find(cmd) is None]
    return f"apt-get installed {', '.join(PACKAGES)} but {', '.join(still)} still missing" if still else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_cpus() -> int:
    """This machine's CPUs as slurmd counts them (``slurmd -C``), else os.cpu_count()."""
    p = subprocess.run([_find("slurmd"), "-C"], capture_output=True, text=True)
    m = re.search(r"\bCPUs=(\d+)", p.stdout)
    return int(m.group(1)) if m else (os.cpu_count() or 1)


class SlurmCluster:
    """A private Slurm cluster of one node (this host) on 127.0.0.1, all files under ``root``."""

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]
        self.cpus = _node_cpus()
        self.procs: Dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.settings = {"EnforcePartLimits": "ALL"}

    def write_conf(self) -> None:
        r = self.root
        if not hasattr(self, "first_job_id"):   # job ids (and MPICH's segment names) new on every run
            self.first_job_id = int.from_bytes(os.urandom(3), "big") + 1000
        cpus = max(self.cpus, 2)   # the tests run 2-rank jobs; a 1-CPU machine is declared with 2
        lines = f"""
            ClusterName=nbmpitest
            FirstJobId={self.first_job_id}
            SlurmctldHost={self.host}(127.0.0.1)
            SlurmctldPort={self.ctld_port}
            SlurmdPort={self.d_port}
            AuthType=auth/munge
            AuthInfo=socket={r}/munge/munge.sock
            CredType=cred/munge
            SlurmUser=root
            SlurmdUser=root
            StateSaveLocation={r}/state
            SlurmdSpoolDir={r}/spool
            SlurmctldPidFile={r}/slurmctld.pid
            SlurmdPidFile={r}/slurmd.pid
            SlurmctldLogFile={r}/log/slurmctld.log
            SlurmdLogFile={r}/log/slurmd.log
            PlugStackConfig={r}/plugstack.conf
            MailProg=/bin/true
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            SelectType=select/cons_tres
            SelectTypeParameters=CR_Core
            MpiDefault=none
            ReturnToService=2
            SchedulerType=sched/backfill
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            JobCompType=jobcomp/none
            KillWait=10
            MinJobAge=600
            InactiveLimit=0
            {'SlurmdParameters=config_overrides' if cpus != self.cpus else ''}
            NodeName={self.host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
            PartitionName={PARTITION} Nodes={self.host} Default=YES MaxTime=INFINITE State=UP
            """
        extra = "".join(f"{k}={v}\n" for k, v in self.settings.items())
        self.conf.write_text(textwrap.dedent(lines).lstrip() + extra)

    def start(self) -> "SlurmCluster":
        """Start munged and slurmctld (:meth:`start_controller`), then the nodes (:meth:`start_nodes`)."""
        self.start_controller()
        self.start_nodes()
        return self

    def start_controller(self) -> None:
        """Make the cluster's directories, munge key and slurm.conf; start munged and slurmctld."""
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir()
        (r / "munge").chmod(0o755)            # munged wants the socket's directory open to all
        key_dir = r / "key"
        key_dir.mkdir(mode=0o700)
        (key_dir / "munge.key").write_bytes(os.urandom(1024))
        (key_dir / "munge.key").chmod(0o600)
        (r / "plugstack.conf").write_text("")
        self.ctld_port, self.d_port = _free_port(), _free_port()
        self.write_conf()
        self._spawn("munged", [_find("munged"), "-F", f"--key-file={key_dir}/munge.key",
                               f"--socket={r}/munge/munge.sock", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/seed"])
        self._wait(lambda: (r / "munge" / "munge.sock").exists(), "munged to create its socket", "munged")
        self._spawn("slurmctld", [_find("slurmctld"), "-D", "-f", str(self.conf)])

    def start_nodes(self) -> None:
        """Start slurmd (one node, this host) and wait until it is idle."""
        self._spawn("slurmd", [_find("slurmd"), "-D", "-f", str(self.conf)])
        self._wait(lambda: self.run(["sinfo", "--noheader", "--format=%T"]).stdout.strip() == "idle",
                   "the node to be idle", "slurmd")

    def _spawn(self, name: str, cmd) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        out.close()

    def _wait(self, cond, what: str, log: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"Slurm test cluster: waiting for {what} failed ({', '.join(dead) or 'timeout'}); "
                                   + (self.root / "log" / f"{log}.out").read_text(errors="replace")[-3000:])
            time.sleep(0.2)

    def run(self, cmd, env=None, **kw) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster (``env`` adds to its environment)."""
        return subprocess.run(cmd, capture_output=True, text=True, env=dict(self.env, **(env or {})), timeout=60,
                              **kw)

    def reconfigure(self, **settings: str) -> None:
        """Change slurm.conf settings and make slurmctld read it again."""
        self.settings.update(settings)
        self.write_conf()
        p = self.run(["scontrol", "reconfigure"])
        assert p.returncode == 0, p.stderr

    def job(self, job_id) -> Optional[str]:
        """Slurm's state of ``job_id`` (squeue --states=all), None if it does not know it."""
        out = self.run(["squeue", "--noheader", "--states=all", "--format=%i %T %r"]).stdout
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0] == str(job_id):
                return " ".join(parts[1:])
        return None

    def wait_job(self, job_id, states, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while True:
            st = self.job(job_id) or ""
            if st.split(" ")[0] in states:
                return st
            assert time.monotonic() < deadline, f"Slurm job {job_id} still {st!r} after {timeout} s"
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel every job, wait until none runs, then end the daemons by pid."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            ids = self.run(["squeue", "--noheader", "--format=%i"]).stdout.split()
            if ids:
                self.run(["scancel", *ids])
                deadline = time.monotonic() + 60
                while self.run(["squeue", "--noheader", "--format=%i"]).stdout.split() and \
                        time.monotonic() < deadline:
                    time.sleep(0.3)
        slurmds = [name for name in self.procs if name.startswith("slurmd")]   # "slurmd", or one per node
        for name in (*slurmds, "slurmctld", "munged"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


@pytest.fixture(scope="module")
def slurm():
    reason = _ensure_packages()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="nbmpi-slurm-", dir="/tmp"))
    root.chmod(0o755)   # munged checks every directory above its socket
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        leftovers = _processes_under(root)
        for p in leftovers:
            p.kill()
        shutil.rmtree(root, ignore_errors=True)
        assert not leftovers, f"processes of the Slurm tests survived: {[p.info['cmdline'] for p in leftovers]}"


def _processes_under(path: Path):
    """Processes whose command line or environment mentions ``path`` (jobs, pools, daemons)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            if any(str(path) in a for a in (p.info["cmdline"] or [])) or \
                    str(path) in p.environ().get("SLURM_CONF", ""):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


# -- the controller ------------------------------------------------------------------------------
class Controller:
    """A real ``nbmpi serve --backend slurm`` subprocess on a free 127.0.0.1 port."""

    def __init__(self, cluster: SlurmCluster, data_dir: Path, *extra: str):
        self.cluster = cluster
        self.data_dir = data_dir
        self.extra = list(extra)
        self.proc: Optional[subprocess.Popen] = None
        self.url = self.token = None
        self.output = ""

    def command(self):
        return [sys.executable, "-m", "nbmpi.server.cli", "serve", "--backend", "slurm", "--port", "0",
                "--data-dir", str(self.data_dir), *self.extra]

    def start(self) -> "Controller":
        env = dict(self.cluster.env, NBMPI_CONFIG=str(self.data_dir.parent / "client.json"), NBMPI_TIMEOUT="60")
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, start_new_session=True)
        self.url = None
        deadline = time.monotonic() + 60
        while self.url is None:
            line = self.proc.stdout.readline()
            self.output += line
            if not line:
                raise RuntimeError(f"nbmpi serve exited {self.proc.wait()} before listening:\n{self.output}")
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
        config = self.data_dir.parent / "client.json"   # absent when the test wrote the users file itself
        self.token = json.loads(config.read_text())["token"] if config.exists() else None
        return self

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, headers={"Authorization": f"Bearer {self.token}"})

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout and not self.proc.stdout.closed:
            self.output += self.proc.stdout.read() or ""
            self.proc.stdout.close()


def wait_job(c: httpx.Client, job_id: int, cond, what: str, timeout: float = 120) -> dict:
    """Poll the job's record until ``cond(record)``."""
    deadline = time.monotonic() + timeout
    while True:
        job = c.get(f"/api/v1/jobs/{job_id}").json()
        if cond(job):
            return job
        assert time.monotonic() < deadline, f"job {job_id} not {what} after {timeout} s: {job}"
        time.sleep(0.1)


def final(job: dict) -> bool:
    return job["state"] not in ("queued", "running")


def slurm_id(ctl: Controller, job_id: int) -> str:
    """The Slurm job id of the controller's job ``job_id`` (the API does not show the backend's
    state: Slurm is asked for the job's name, nbmpi-job-ID)."""
    deadline = time.monotonic() + 30
    while True:
        out = ctl.cluster.run(["squeue", "--noheader", "--states=all", f"--name=nbmpi-job-{job_id}",
                               "--format=%i"]).stdout.split()
        if out:
            return out[-1]
        assert time.monotonic() < deadline, f"Slurm has no job named nbmpi-job-{job_id}"
        time.sleep(0.2)


def rank_pid(c: httpx.Client, job_id: int, rank: int = 0, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while True:
        text = c.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": rank}).text
        if text.startswith("pid "):
            return int(text.split()[1])
        assert time.monotonic() < deadline, f"rank {rank} of job {job_id} did not start"
        time.sleep(0.1)


def leftover_shm(status_dir: Path):
    """Shared-memory segments the ranks noted in ``status_dir`` that still exist."""
    noted = noted_segments(str(status_dir))
    assert noted, f"no rank noted its shared memory in {status_dir}"
    return sorted(p for p in noted if os.path.exists(p))


@pytest.fixture(scope="module")
def ctl(slurm):
    """One controller shared by the ordered tests below, and the jobs they pass on."""
    data = Path(tempfile.mkdtemp(prefix="ctl-", dir=slurm.root))
    c = Controller(slurm, data / "data").start()
    c.jobs = {}
    yield c
    c.stop()


def need(ctl: Controller, *names: str):
    missing = [n for n in names if n not in ctl.jobs]
    if missing:
        pytest.fail(f"an earlier test did not leave job(s) {missing}; run the whole file")
    return [ctl.jobs[n] for n in names]


# -- the ordered controller tests ---------------------------------------------------------------
def test_jobs_wait_in_slurms_queue_with_its_reason(ctl, slurm):
    """Two 1-rank jobs fill the node (one will hit its 1-minute time limit); a 2-rank job then
    waits in Slurm's queue and its record shows Slurm's pending reason."""
    assert "backend slurm" in ctl.output and "max ranks per job" in ctl.output
    with ctl.client() as c:
        limited = submit(c, SLEEP_JOB, ranks=1, timeout=20, name="limited")    # --time=1 (minute)
        sleeper = submit(c, SLEEP_JOB, ranks=1, name="sleeper")
        for job in (limited, sleeper):
            wait_job(c, job["id"], lambda j: j["state"] == "running", "running")
        ctl.jobs.update(limited=limited["id"], sleeper=sleeper["id"])
        ctl.jobs["limited_pid"] = rank_pid(c, limited["id"])
        ctl.jobs["sleeper_pid"] = rank_pid(c, sleeper["id"])
        waiting = submit(c, CHANNEL_JOB, ranks=2, args=["a", "b c"], timeout=300, name="waiting")
        ctl.jobs["waiting"] = waiting["id"]
        job = wait_job(c, waiting["id"], lambda j: j["message"] == "waiting: Resources", "waiting for resources")
        assert job["state"] == "queued" and job["started_at"] is None
    sid = slurm_id(ctl, limited["id"])
    assert "#   sbatch " in (ctl.data_dir / "jobs" / str(limited["id"]) / "job.sbatch").read_text()
    assert "--time=1" in (ctl.data_dir / "jobs" / str(limited["id"]) / "job.sbatch").read_text()
    assert slurm.job(sid).startswith("RUNNING")
    assert slurm.job(slurm_id(ctl, waiting["id"])) == "PENDING Resources"


def test_restart_reattaches_to_slurm_jobs(ctl, slurm):
    """A graceful stop leaves Slurm's jobs running; after a kill -9 too, the next controller
    re-attaches to every job Slurm still knows instead of recording it lost."""
    limited, sleeper, waiting = need(ctl, "limited", "sleeper", "waiting")
    ctl.stop()   # SIGTERM: the scheduler stops following; the cluster's jobs run on
    assert ctl.proc.returncode in (0, -signal.SIGTERM)   # uvicorn re-raises the signal after its shutdown
    assert slurm.job(slurm_id(ctl, sleeper)).startswith("RUNNING")
    ctl.start()
    with ctl.client() as c:
        for jid in (limited, sleeper):
            job = c.get(f"/api/v1/jobs/{jid}").json()
            assert job["state"] == "running" and job["message"] == "re-attached after a restart of the service", job
    ctl.proc.send_signal(signal.SIGKILL)
    ctl.proc.wait()
    ctl.stop()
    for pid in (ctl.jobs["limited_pid"], ctl.jobs["sleeper_pid"]):
        assert running(pid)   # the ranks are Slurm's, not the controller's
    ctl.start()
    with ctl.client() as c:
        for jid in (limited, sleeper):
            job = c.get(f"/api/v1/jobs/{jid}").json()
            assert job["state"] == "running" and job["message"] == "re-attached after a restart of the service", job
        wait_job(c, waiting, lambda j: j["state"] == "queued" and j["message"] == "waiting: Resources",
                 "waiting again", timeout=30)
        assert not c.get("/api/v1/jobs", params={"state": "lost"}).json()["jobs"]


def test_cancel_running_job_is_scancel(ctl, slurm):
    (sleeper,) = need(ctl, "sleeper")
    sid = slurm_id(ctl, sleeper)
    with ctl.client() as c:
        r = c.delete(f"/api/v1/jobs/{sleeper}")
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
        job = c.get(f"/api/v1/jobs/{sleeper}").json()
        assert job["exit_code"] == 130 and job["message"] == f"cancelled by its owner (scancel {sid})"
    # cancel returns once Slurm reports the end: the rank is gone by then, and its MPI shared memory
    assert slurm.job(sid).startswith("CANCELLED")
    assert not running(ctl.jobs["sleeper_pid"])
    assert leftover_shm(ctl.data_dir / "jobs" / str(sleeper) / "status") == []


def test_bad_cases_have_clear_messages(ctl, slurm, tmp_path):
    """sbatch missing, an unknown partition (at start and at submit), too many tasks (refused by
    sbatch, or left pending by Slurm), --slurm-* options with the local backend."""
    base = [sys.executable, "-m", "nbmpi.server.cli", "serve", "--port", "0", "--data-dir"]
    env = dict(slurm.env, NBMPI_CONFIG=str(tmp_path / "client.json"))
    no_slurm = dict(env, PATH=os.path.dirname(sys.executable))
    p = subprocess.run(base + [str(tmp_path / "a"), "--backend", "slurm"], capture_output=True, text=True,
                       env=no_slurm, timeout=60)
    assert p.returncode == 2
    assert "sbatch, squeue, scancel, sinfo, scontrol not found on PATH: the slurm backend submits jobs with " \
           "Slurm's client commands" in p.stderr, p.stderr
    p = subprocess.run(base + [str(tmp_path / "b"), "--backend", "slurm", "--slurm-partition", "nosuch"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2
    assert f"Slurm partition 'nosuch' does not exist (Partition nosuch not found); this cluster has: {PARTITION}" \
           in p.stderr, p.stderr
    p = subprocess.run(base + [str(tmp_path / "c"), "--slurm-partition", PARTITION], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 2 and "--slurm-partition: only for --backend slurm (this service uses --backend " \
        "local)" in p.stderr, p.stderr

    too_many = slurm.cpus * 32
    with ctl.client() as c:
        job = wait_job(c, submit(c, "print(1)", ranks=too_many)["id"], final, "final")
        assert job["state"] == "failed" and job["exit_code"] == 1
        cpus = max(slurm.cpus, 2)
        assert job["message"] == (f"sbatch refused the job ({too_many} tasks): sbatch: error: Batch job "
                                  "submission failed: More processors requested than permitted; partition "
                                  f"{PARTITION} has {cpus} CPUs in all: ask for at most {cpus} ranks"), job
    # a partition that vanished after the start: sbatch's error passed through
    other = Controller(slurm, tmp_path / "d", "--slurm-sbatch-arg=--partition=nosuch").start()
    try:
        with other.client() as c:
            job = wait_job(c, submit(c, "print(1)", ranks=1)["id"], final, "final")
            assert job["state"] == "failed"
            assert job["message"].startswith("sbatch refused the job (1 tasks): sbatch: error: invalid partition "
                                             "specified: nosuch"), job
    finally:
        other.stop()
    # a cluster without EnforcePartLimits accepts the job and leaves it pending forever: failed too
    slurm.reconfigure(EnforcePartLimits="NO")
    try:
        with ctl.client() as c:
            job = wait_job(c, submit(c, "print(1)", ranks=too_many)["id"], final, "final", timeout=60)
            assert job["state"] == "failed"
            assert job["message"] == (f"Slurm cannot run this job: it asks for {too_many} tasks but partition "
                                      f"{PARTITION} has {max(slurm.cpus, 2)} CPUs in all (Slurm's pending reason: "
                                      f"PartitionConfig); it was cancelled: ask for at most {max(slurm.cpus, 2)} "
                                      "ranks"), job
    finally:
        slurm.reconfigure(EnforcePartLimits="ALL")


def test_time_limit_kill_is_timed_out(ctl, slurm):
    (limited,) = need(ctl, "limited")
    with ctl.client() as c:
        job = wait_job(c, limited, final, "ended by Slurm", timeout=180)
    assert job["state"] == "timed_out" and job["exit_code"] == 124, job
    assert job["message"] == (f"Slurm ended job {slurm_id(ctl, limited)} at its time limit (--time=1 min; the "
                              "job's timeout of 20 s rounded up to whole minutes); all ranks were ended")
    assert slurm.job(slurm_id(ctl, limited)) == "TIMEOUT TimeLimit"
    assert not running(ctl.jobs["limited_pid"])
    assert leftover_shm(ctl.data_dir / "jobs" / str(limited) / "status") == []


def test_job_end_to_end_logs_exit_codes_trace(ctl, slurm):
    """The job that waited runs once the node is free: per-rank logs, exit codes, trace; a failing
    rank fails the job and Slurm ends the others."""
    (waiting,) = need(ctl, "waiting")
    with ctl.client() as c:
        job = wait_job(c, waiting, final, "final", timeout=120)
        assert job["state"] == "succeeded", job
        assert job["rank_exit_codes"] == [0, 0] and job["exit_code"] == 0 and job["message"] is None
        assert job["started_at"] >= job["created_at"]
        for r in (0, 1):
            assert c.get(f"/api/v1/jobs/{waiting}/logs", params={"rank": r}).text == \
                f"rank {r} value 2.0 args ['a', 'b c']\n"
            assert c.get(f"/api/v1/jobs/{waiting}/logs", params={"rank": r, "stream": "stderr"}).text == \
                f"stderr of rank {r}\n"
        trace = c.get(f"/api/v1/jobs/{waiting}/trace").json()
        assert {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == {0, 1}
        summary = c.get(f"/api/v1/jobs/{waiting}/summary").json()
        assert summary["nranks"] == 2 and summary["bytes"][0][1] >= 8000

        bad = submit(c, """
            import sys, time
            from nbmpi.workers import world
            if world().Get_rank() == 1:
                raise SystemExit(3)
            time.sleep(600)
            """)
        job = wait_job(c, bad["id"], final, "final")
        assert job["state"] == "failed" and job["exit_code"] == 3 and job["rank_exit_codes"] == [None, 3], job
        assert job["message"] == "rank 1 exited 3; ranks [0] were terminated"
        failed_trace = c.get(f"/api/v1/jobs/{bad['id']}/trace")      # what was recorded up to the end
        assert failed_trace.status_code == 200 and "traceEvents" in failed_trace.json(), failed_trace.text[:300]
    assert slurm.job(slurm_id(ctl, bad["id"])).startswith("FAILED")
    # rank 0 was ended by --kill-on-bad-exit before MPI_Finalize: the job removed its shared memory
    assert leftover_shm(ctl.data_dir / "jobs" / str(bad["id"]) / "status") == []


def test_pool_on_slurm(ctl, slurm):
    """A pool is one Slurm allocation (controller + srun engines): it starts, runs jobs, is
    re-attached after a kill -9 of the controller, and stopping it ends its allocation."""
    with ctl.client() as c:
        r = c.post("/api/v1/pools", json={"ranks": 2, "name": "sp"})
        assert r.status_code == 201, r.text
        pool = r.json()
        assert pool["state"] == "running", pool["message"]
        conn = pool["connection"]
        sid = conn["slurm_job_id"]
        assert slurm.job(sid).startswith("RUNNING") and conn["ranks"] == [0, 1]
        job = wait_job(c, submit(c, """
            import numpy as np, os
            x = np.zeros(1)
            comm.Allreduce(np.full(1, rank + 1.0), x)
            print("rank", rank, "of", size, x[0], os.environ["SLURM_JOB_ID"])
            """, ranks=None, pool=pool["id"])["id"], final, "final")
        assert job["state"] == "succeeded", job
        for r in (0, 1):
            assert c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text == f"rank {r} of 2 3.0 {sid}\n"
    ctl.proc.send_signal(signal.SIGKILL)
    ctl.proc.wait()
    ctl.stop()
    ctl.start()
    with ctl.client() as c:
        again = c.get(f"/api/v1/pools/{pool['id']}").json()
        assert again["state"] == "running" and "re-attached" in again["message"], again
        job = wait_job(c, submit(c, "print('again', rank)", ranks=None, pool=pool["id"])["id"], final, "final")
        assert job["state"] == "succeeded"
        stopped = c.delete(f"/api/v1/pools/{pool['id']}").json()
        assert stopped["state"] == "stopped", stopped
    # released: asked to end itself (TERM to its batch script), it ended its engines and Slurm
    # reported the allocation's end before the answer
    assert slurm.job(sid).startswith("COMPLETED")
    out = (ctl.data_dir / "pools" / str(pool["id"]) / f"slurm-{sid}.out").read_text()
    assert "slurm_allocation: SIGTERM received; ending the pool\n" in out and out.endswith("pool ended\n"), out
    assert leftover_shm(ctl.data_dir / "pools" / str(pool["id"]) / "status") == []
    assert not [p for p in _processes_under(ctl.data_dir / "pools")]


# -- the deploy/slurm scripts --------------------------------------------------------------------
def _sbatch(slurm: SlurmCluster, cwd: Path, *args: str, env=None) -> str:
    p = slurm.run(["sbatch", "--parsable", *args], cwd=str(cwd), env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_run_script_runs_a_2_rank_job_with_its_trace(slurm, tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import sys
        from nbmpi.workers import ArrayChannel, world
        r = world().Get_rank()
        ch = ArrayChannel(4); ch.fill(r + 1); ch.allreduce("sum")
        print("rank", r, "of", world().Get_size(), float(ch[0]), sys.argv[1:])
        """))
    sid = _sbatch(slurm, tmp_path, "--ntasks=2", str(REPO / "deploy" / "slurm" / "nbmpi-run.sbatch"), "prog.py",
                  "x", env={"NBMPI_PYTHON": sys.executable})
    assert slurm.wait_job(sid, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")).startswith("COMPLETED")
    out = (tmp_path / f"nbmpi-run-{sid}.out").read_text()
    assert "0: rank 0 of 2 3.0 ['x']\n" in out and "1: rank 1 of 2 3.0 ['x']\n" in out, out
    trace_dir = tmp_path / f"nbmpi-run-{sid}.trace"
    assert f"nbmpi run: exit code 0; trace: {trace_dir}/trace.json" in out
    trace = json.loads((trace_dir / "trace.json").read_text())
    assert {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"} == {0, 1}
    assert json.loads((trace_dir / "summary.json").read_text())["nranks"] == 2
    names = {p.name for p in trace_dir.iterdir()}   # the gathered trace (Chrome, summary, raw), the live streams
    gathered = {"summary.json", "trace.json", "trace.npz"}
    assert gathered <= names and names <= gathered | {"rank-0.events", "rank-1.events", "rank-0.live.json",
                                                      "rank-1.live.json"}, names


def test_session_script_controller_and_pool_in_one_allocation(slurm, tmp_path):
    script = REPO / "deploy" / "slurm" / "nbmpi-session.sbatch"
    sid = _sbatch(slurm, tmp_path, "--ntasks=2", str(script),
                  env={"NBMPI_PYTHON": sys.executable, "NBMPI_DATA_DIR": str(tmp_path / "data")})
    out_path = tmp_path / f"nbmpi-session-{sid}.out"
    deadline = time.monotonic() + 120
    while "%distributed connect" not in (out_path.read_text() if out_path.exists() else ""):
        state = slurm.job(sid) or ""
        assert not state.startswith(("COMPLETED", "FAILED", "CANCELLED")), out_path.read_text()
        assert time.monotonic() < deadline, f"no connect line after 120 s: {state}"
        time.sleep(0.3)
    out = out_path.read_text()
    url, token = re.search(r"%distributed connect (\S+) --token (\S+)", out).groups()
    port = url.rsplit(":", 1)[1]
    assert f"ssh -N -L {port}:{slurm.host}:{port} " in out
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        (pool,) = c.get("/api/v1/pools").json()["pools"]
        assert pool["state"] == "running" and pool["ranks"] == 2
        # what %distributed connect does: attach to the pool the controller reports
        attached = EnginePool.attach(c.get(f"/api/v1/pools/{pool['id']}").json()["connection"])
        try:
            view = attached.client()[:]
            view.execute("import os; where = (rank, size, os.environ['SLURM_JOB_ID'])", block=True)
            assert view.pull("where", block=True) == [(0, 2, sid), (1, 2, sid)]
        finally:
            attached.stop()
        job = wait_job(c, submit(c, "print('rank', rank, 'of', size)", ranks=None, pool=pool["id"])["id"],
                       final, "final")
        assert job["state"] == "succeeded"
        assert [c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text for r in (0, 1)] == \
            ["rank 0 of 2\n", "rank 1 of 2\n"]
    # what Slurm does at the end of the allocation's time (--signal=B:TERM@60): TERM to the script
    p = slurm.run(["scancel", "--batch", "--signal=TERM", sid])
    assert p.returncode == 0, p.stderr
    assert slurm.wait_job(sid, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=90).startswith("COMPLETED")
    out = out_path.read_text()
    assert "nbmpi session: stopping: the controller ends the pool, then exits\n" \
           "nbmpi session: controller and pool stopped\n" in out, out
    assert not _processes_under(tmp_path / "data")


def test_service_unit_and_config_example_start_a_controller(slurm, tmp_path):
    """The systemd unit's ExecStart, with the example configuration's variables (paths pointed
    at this test), starts a controller with the slurm backend."""
    unit = (REPO / "deploy" / "slurm" / "nbmpi-controller.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
    assert re.search(r"^EnvironmentFile=%h/.config/nbmpi/controller.env$", unit, re.M)
    cfg = {}
    for line in (REPO / "deploy" / "slurm" / "nbmpi-controller.env").read_text().splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            cfg[k] = v
    assert set(cfg) == {"NBMPI_PYTHON", "NBMPI_HOST", "NBMPI_PORT", "NBMPI_DATA_DIR", "NBMPI_SERVE_OPTIONS"}
    cfg.update(NBMPI_PYTHON=sys.executable, NBMPI_PORT="0", NBMPI_DATA_DIR=str(tmp_path / "data"),
               NBMPI_SERVE_OPTIONS=cfg["NBMPI_SERVE_OPTIONS"].replace("--slurm-sbatch-arg=--account=myproject ", ""))
    assert f"--slurm-partition={PARTITION}" in cfg["NBMPI_SERVE_OPTIONS"]
    proc = subprocess.Popen(shlex.split(exec_start), env=dict(slurm.env, NBMPI_CONFIG=str(tmp_path / "c.json"),
                                                              **cfg),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "nbmpi serve: listening on http://127.0.0.1:" in line and "(backend slurm," in line, line
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode in (0, -signal.SIGTERM)   # uvicorn re-raises the signal after its shutdown


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                    reason="submitting as other UNIX accounts needs root and useradd")
def test_jobs_are_submitted_as_their_users_account(slurm, accounts, shared_python):  # noqa: F811
    """As root with an account per user, the slurm backend submits as the user: Slurm lists the job
    under bob's account, its ranks run as it and cannot read the users file."""
    from test_isolation import ALICE, BOB, TOKENS

    base = Path(tempfile.mkdtemp(prefix="ctl-accounts-", dir=slurm.root))
    base.chmod(0o711)
    data = base / "data"
    data.mkdir(mode=0o700)
    users = data / "users.json"
    users.write_text(json.dumps({TOKENS[u]: {"user": u.split("-")[-1], "account": u} for u in (ALICE, BOB)}))
    users.chmod(0o600)
    ctl = Controller(slurm, data)
    python, _ = shared_python
    ctl.command = lambda: [python, "-m", "nbmpi.server.cli", "serve", "--backend", "slurm", "--port", "0",
                           "--data-dir", str(data)]
    ctl.start()
    try:
        assert httpx.get(ctl.url + "/api/health").json()["isolation"] == "accounts"
        code = f"""
            import subprocess
            print(subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip())
            try:
                open({str(users)!r}).read()
                print("users file READ")
            except PermissionError:
                print("users file denied")
            """
        with httpx.Client(base_url=ctl.url, timeout=120, headers={"Authorization": f"Bearer {TOKENS[BOB]}"}) as c:
            job = wait_job(c, submit(c, code, ranks=2)["id"], final, "final")
            assert job["state"] == "succeeded", job
            # (Slurm keeps ended jobs for MinJobAge s; other controllers of this file used the same name)
            assert slurm.run(["squeue", "--noheader", "--states=all", f"--name=nbmpi-job-{job['id']}",
                              f"--user={BOB}", "--format=%u"]).stdout.split() == [BOB]
            for r in (0, 1):
                assert c.get(f"/api/v1/jobs/{job['id']}/logs", params={"rank": r}).text == \
                    f"{BOB}\nusers file denied\n"
    finally:
        ctl.stop()
