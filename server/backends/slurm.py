"""The Slurm backend: the controller's jobs become ``sbatch`` submissions and its pools Slurm allocations.

Selected with ``nbmpi serve --backend slurm``. The controller and the
cluster must share the filesystem of the data directory (job scripts, logs,
exit codes, traces and pool connection files are files there), and the
controller's host must have Slurm's client commands (``sbatch``, ``squeue``,
``scancel``, ``sinfo``, ``scontrol``; ``sacct`` is used when accounting works).

Jobs. :meth:`SlurmBackend.submit` writes ``JOB_DIR/job.sbatch`` (one job step:
``srun --ntasks=N --mpi=pmi2 --kill-on-bad-exit=1 PYTHON -m
nbmpi.workers.launch.rank_entry SCRIPT ARGS``; when it fails or Slurm ends the job, the
MPI shared memory of the killed ranks is removed with
:mod:`~nbmpi.server.backends.slurm_allocation` ``clean-shm``) and submits it with ``sbatch
--ntasks=N [--time=M] [--partition=P] [extra sbatch args]`` and the job's
environment (``--export=ALL`` of :func:`nbmpi.workers.launch.environment.job_environment`:
the ranks' environment, the job's own, the variables the launcher owns). With an
account per user (:mod:`nbmpi.server.accounts`, the service run by root) ``sbatch``
runs as the job's account, so Slurm runs the job as that user, and ``squeue`` lists
every user's jobs. Every
rank runs :mod:`nbmpi.workers.launch.rank_entry`, so, as with the local backend,
rank R writes ``logs/rank-R.stdout``/``.stderr``, its exit code to
``JOB_DIR/status`` and, when every rank succeeded, the trace to
``JOB_DIR/trace``. The batch script's own output (Slurm's and ``srun``'s
messages) is ``JOB_DIR/slurm.out``/``slurm.err``. The job's timeout becomes
``--time`` in whole minutes, rounded up (Slurm's unit; at least 1); Slurm ends
the job at that limit (:attr:`SlurmBackend.enforces_timeout`). The bundled
MPICH wheel's PMI client works with Slurm's ``pmi2`` plugin, so ``srun``
wires up the ranks itself (``--slurm-mpi`` chooses another plugin, e.g.
``pmix`` for a site MPI). ``--kill-on-bad-exit`` makes Slurm end the step
as soon as one rank fails, so no rank stays blocked on the failed one.

State. One ``squeue --me --states=all`` query, cached for
``poll_interval`` seconds, answers every followed job's poll (the scheduler
polls each job every 50 ms). ``PENDING`` is reported with Slurm's reason
(``Resources``, ``Priority`` ...), ``RUNNING``/``COMPLETING``/... as running,
and a final state as the end: ``TIMEOUT`` -> ``timed_out`` (the message says
Slurm ended the job at its time limit), ``CANCELLED`` -> ``cancelled``, anything
else -> ``succeeded`` or ``failed`` from the ranks' exit codes (as for the
local backend). A job Slurm no longer lists (it ended more than
``MinJobAge`` ago) is looked up with ``sacct`` when accounting storage is
enabled, else ended from the ranks' exit-code files. A job that asks for more
tasks than its partition has CPUs is either refused by ``sbatch``
(``EnforcePartLimits``; the job fails with sbatch's error) or left pending by
Slurm with reason ``PartitionConfig``/``PartitionNodeLimit``: the backend
then cancels it and fails it with a message saying so.

Cancel is ``scancel``, then waiting until Slurm reports the job ended. After
a restart of the controller, :meth:`~SlurmBackend.recover` re-attaches to every
job Slurm still knows (pending, running, or ended while the controller was
down: the next poll then reports its real end); jobs outlive the service
(:attr:`SlurmBackend.jobs_outlive_service`), so stopping the controller does
not cancel them.

Pools. A pool is one Slurm job of N tasks whose batch script runs
:mod:`nbmpi.server.backends.slurm_allocation` ``pool`` on the allocation's first node: the
ipyparallel controller there and the N engines as an ``srun`` job step
(engine id == MPI rank, :func:`nbmpi.workers.launch.engine_side.setup` on every rank),
then it writes ``WORK_DIR/connection.json``. The service attaches with
:meth:`nbmpi.workers.launch.engine_pool.EnginePool.attach` (:class:`SlurmPool`, alive only
while Slurm runs its job). Stop or idle timeout asks the batch script to end
the pool (``scancel --batch --signal=TERM``: engines, controller, shared
memory) and ``scancel`` s the job if it has not ended within
:data:`POOL_STOP_GRACE_S`; after a restart the pool is re-attached if Slurm
still runs it and all engines answer.

Stored state: ``{"job_id", "status_dir", "time_min"}`` for a job,
``{"job_id", "work_dir"}`` for a pool.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from nbmpi.workers.launch import launcher
from nbmpi.workers.launch.engine_pool import EnginePool, EnginePoolError
from nbmpi.workers.launch.environment import job_environment, rank_environment
from nbmpi.workers.launch.identity import Identity, base_environment, open_beneath, open_no_link, popen_options

from . import Backend, BackendError, JobSpec, JobStatus, PoolSpec

#: Slurm job states after which nothing of the job runs any more.
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                          "DEADLINE", "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED"})
#: Slurm job states reported as pending (the job holds no running rank yet).
PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
#: Pending reasons Slurm gives a job whose request exceeds its partition's configuration.
NEVER_FITS_REASONS = frozenset({"PartitionConfig", "PartitionNodeLimit"})
#: Slurm client commands the backend runs; ``nbmpi serve --backend slurm`` refuses to start without them.
COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol")
#: Seconds a Slurm command may take before the backend gives up on it.
COMMAND_TIMEOUT_S = 60.0
#: Seconds :meth:`SlurmBackend.cancel` / :meth:`~SlurmBackend.stop_pool` wait for Slurm to report the end.
CANCEL_WAIT_S = 90.0
#: Seconds to wait for exit-code files still missing when Slurm already reports the end (NFS caches).
STATUS_GRACE_S = 2.0
#: File the pool's batch job writes once every engine runs (JSON: ``slurm_job_id`` + EnginePool.connection_info()).
POOL_CONNECTION_FILE = "connection.json"
#: Module the job and pool batch scripts run inside the allocation (pool; shared-memory cleanup).
SLURM_ALLOCATION = "nbmpi.server.backends.slurm_allocation"
#: Seconds a stopped pool gets to end itself (engines, controller, cleanup) before a hard scancel.
POOL_STOP_GRACE_S = 20.0


def slurm_minutes(timeout: float) -> int:
    """``--time`` for a timeout of ``timeout`` seconds: whole minutes, rounded up, at least 1."""
    if not timeout or timeout <= 0:
        raise ValueError(f"a timeout must be positive seconds, got {timeout!r}")
    return max(1, math.ceil(timeout / 60.0))


def job_script(spec: JobSpec, step: List[str], options: List[str], partition: Optional[str],
               sbatch_args: Sequence[str], python: str) -> str:
    """The batch script of a job: its one job step ``step`` (every rank under nbmpi's rank entry)
    and, when the step did not succeed or Slurm ends the job (TERM), the cleanup of the shared
    memory the killed ranks left (:mod:`.slurm_allocation` ``clean-shm``)."""
    submitted = shlex.join(["sbatch", *options, *([f"--partition={partition}"] if partition else []),
                            *sbatch_args, "job.sbatch"])
    clean = shlex.join([python, "-m", SLURM_ALLOCATION, "clean-shm", "--status-dir", str(spec.job_dir / "status")])
    return f"""#!/bin/bash
# nbmpi job {spec.id} ({spec.owner}), submitted by the controller's slurm backend as
#   {submitted}
# One job step: every rank runs the program under nbmpi's rank entry (logs, exit codes and trace
# in this directory); --kill-on-bad-exit ends the other ranks when one fails. Ranks ended that
# way, or by scancel or the time limit, cannot free their MPI shared memory: it is removed after.
on_term() {{
    wait "$step"
    {clean}
    exit 143
}}
trap on_term TERM
{shlex.join(step)} &
step=$!
wait "$step"
rc=$?
if [ "$rc" -ne 0 ]; then
    n=${{SLURM_JOB_NUM_NODES:-1}}
    if [ "$n" -gt 1 ]; then
        srun --nodes="$n" --ntasks="$n" --ntasks-per-node=1 --mpi=none {clean}
    else
        {clean}
    fi
fi
exit "$rc"
"""


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class SlurmJob:
    """What Slurm says about one job: ``state`` (e.g. ``PENDING``), ``reason`` (pending reason or None),
    ``partition``."""
    state: str
    reason: Optional[str] = None
    partition: Optional[str] = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


class SlurmQueue:
    """A cached view of this user's Slurm jobs: one ``squeue`` query answers every poll for
    ``interval`` seconds. Thread-safe; :meth:`get` blocks only while a query runs."""

    def __init__(self, run: Callable[[Sequence[str]], subprocess.CompletedProcess], interval: float):
        self._run = run
        self.interval = float(interval)
        self._lock = threading.Lock()
        self._jobs: Dict[str, SlurmJob] = {}
        self._at = -math.inf          # monotonic time of the last successful query
        self._sacct: Optional[bool] = None   # None: not tried; False: accounting storage disabled
        self._sacct_cache: Dict[str, Tuple[float, Optional[SlurmJob]]] = {}

    def refresh(self) -> None:
        """Query ``squeue`` now. Raises :class:`BackendError` when Slurm does not answer."""
        # root submits as each user's account (nbmpi.server.accounts): then every user's jobs are ours
        mine = [] if os.geteuid() == 0 else ["--me"]
        out = self._run(["squeue", *mine, "--noheader", "--states=all", "--format=%i|%T|%r|%P"])
        if out.returncode != 0:
            raise BackendError(f"squeue failed: {(out.stderr or out.stdout).strip()}")
        jobs: Dict[str, SlurmJob] = {}
        for line in out.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 3 and parts[0]:
                state = parts[1].split()[0] if parts[1] else "UNKNOWN"
                reason = parts[2] if parts[2] and parts[2] != "None" else None
                jobs[parts[0]] = SlurmJob(state, reason, parts[3] if len(parts) > 3 else None)
        self._jobs, self._at = jobs, time.monotonic()

    def get(self, job_id: str, max_age: Optional[float] = None) -> Optional[SlurmJob]:
        """Slurm's view of ``job_id`` (None when ``squeue`` does not list it). The cached answer
        is used if it is younger than ``max_age`` seconds (default: the interval), else ``squeue``
        is asked again. Raises :class:`BackendError` when Slurm does not answer."""
        limit = self.interval if max_age is None else max_age
        with self._lock:
            if time.monotonic() - self._at > limit:
                self.refresh()
            return self._jobs.get(str(job_id))

    def accounting(self, job_id: str) -> Optional[SlurmJob]:
        """The job as ``sacct`` records it (None when unknown or accounting storage is disabled).
        Cached per job for the interval."""
        if self._sacct is False or not shutil.which("sacct"):
            return None
        now = time.monotonic()
        hit = self._sacct_cache.get(str(job_id))
        if hit and now - hit[0] < self.interval:
            return hit[1]
        out = self._run(["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
                         "--format=JobID,State,Reason,Partition"])
        text = (out.stdout + out.stderr).lower()
        if "accounting storage is disabled" in text:
            self._sacct = False
            return None
        found = None
        for line in out.stdout.splitlines():
            parts = line.strip().split("|")
            if parts and parts[0] == str(job_id) and len(parts) >= 2:
                found = SlurmJob(parts[1].split()[0], parts[2] if len(parts) > 2 and parts[2] != "None" else None,
                                 parts[3] if len(parts) > 3 else None)
        self._sacct = True if out.returncode == 0 else self._sacct
        self._sacct_cache[str(job_id)] = (now, found)
        return found


class SlurmPool(EnginePool):
    """A pool attached to engines in a Slurm allocation: alive only while Slurm runs its job
    and every engine answers (:meth:`EnginePool.alive`)."""

    _slurm: Optional[Tuple["SlurmBackend", str]] = None

    def alive(self) -> bool:
        """True while Slurm lists the pool's job as running and all engines are registered."""
        if self._slurm is not None:
            backend, job_id = self._slurm
            try:
                job = backend.slurm_job(job_id)
            except BackendError:
                job = SlurmJob("RUNNING")   # Slurm does not answer now: judge by the engines alone
            if job is None or job.state != "RUNNING":
                return False
        return super().alive()


class SlurmBackend(Backend):
    """Jobs as ``sbatch`` submissions and pools as Slurm allocations (see the module docstring).

    Options (``nbmpi serve --slurm-...``): ``partition`` (None: the cluster's
    default), ``sbatch_args`` (extra ``sbatch`` arguments for every job and
    pool, e.g. ``["--account=proj"]``), ``poll_interval`` (seconds one
    ``squeue`` answer is reused), ``mpi`` (``srun --mpi`` plugin, default
    ``pmi2``), ``pool_ip`` (address a pool's ipyparallel controller listens on,
    default ``*``: engines on other nodes and this service connect to it at its node's
    ``NodeAddr``), ``python`` (the
    interpreter the ranks run, default this one; the cluster's nodes must have it
    at the same path). Raises :class:`BackendError` at construction when
    ``sbatch`` is not on PATH, Slurm does not answer, or ``partition`` does not exist.
    """

    name = "slurm"
    enforces_timeout = True
    jobs_outlive_service = True

    def __init__(self, partition: Optional[str] = None, sbatch_args: Sequence[str] = (),
                 poll_interval: float = 1.0, mpi: str = "pmi2", pool_ip: str = "*",
                 python: Optional[str] = None) -> None:
        missing = [c for c in COMMANDS if not shutil.which(c)]
        if missing:
            raise BackendError(f"{', '.join(missing)} not found on PATH: the slurm backend submits jobs with "
                               "Slurm's client commands; install them (Debian: apt-get install slurm-client) or "
                               "load your site's Slurm module before `nbmpi serve --backend slurm`, or use "
                               "--backend local")
        if poll_interval <= 0:
            raise BackendError(f"--slurm-poll-interval must be positive seconds, got {poll_interval}")
        self.partition = partition or None
        self.sbatch_args = [str(a) for a in sbatch_args]
        self.mpi = mpi
        self.pool_ip = pool_ip
        self.python = python or sys.executable
        self.queue = SlurmQueue(self._run, poll_interval)
        self._partition_cpus: Dict[Optional[str], Tuple[Optional[str], Optional[int]]] = {}
        self._check_cluster()

    def capacity(self, max_ranks: Optional[int]) -> Optional[int]:
        """None: Slurm queues, so the controller holds no job back; every admitted job goes to
        ``sbatch`` at once and waits in Slurm's queue (its record shows Slurm's reason).
        ``--max-ranks`` then only bounds the ranks one job or pool may ask for."""
        return None

    # -- Slurm commands ----------------------------------------------------------------------
    @staticmethod
    def _run(cmd: Sequence[str], env: Optional[Dict[str, str]] = None, cwd: Optional[str] = None,
             timeout: float = COMMAND_TIMEOUT_S, identity: Optional[Identity] = None) -> subprocess.CompletedProcess:
        """Run a Slurm command (as ``identity``'s account when given: ``sbatch`` then submits as the user)."""
        try:
            return subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                                  stdin=subprocess.DEVNULL, **popen_options(identity))
        except FileNotFoundError:
            raise BackendError(f"{cmd[0]} not found on PATH; load Slurm's client commands") from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"{cmd[0]} did not answer within {timeout:.0f} s; is slurmctld overloaded "
                               "or down?") from None

    def _check_cluster(self) -> None:
        out = self._run(["sinfo", "--noheader", "--format=%R"])
        if out.returncode != 0:
            raise BackendError(f"Slurm does not answer (sinfo: {(out.stderr or out.stdout).strip()}); check that "
                               "slurmctld runs and this host's Slurm configuration (SLURM_CONF) points at it")
        partitions = sorted({p.strip() for p in out.stdout.split() if p.strip()})
        if self.partition is not None:
            res = self._run(["scontrol", "show", "partition", self.partition])
            if res.returncode != 0:
                raise BackendError(f"Slurm partition {self.partition!r} does not exist "
                                   f"({(res.stderr or res.stdout).strip()}); this cluster has: "
                                   f"{', '.join(partitions) or '(none)'}; give one of them to --slurm-partition "
                                   "or omit it for the cluster's default partition")

    def _cancel_and_wait(self, job_id: str, what: str) -> Optional[SlurmJob]:
        """``scancel`` the job and block until Slurm reports it ended (at most :data:`CANCEL_WAIT_S`)."""
        res = self._run(["scancel", str(job_id)])
        if res.returncode != 0 and "Invalid job id" not in (res.stderr or ""):
            raise BackendError(f"scancel {job_id} ({what}) failed: {(res.stderr or res.stdout).strip()}")
        deadline = time.monotonic() + CANCEL_WAIT_S
        while True:
            job = self.queue.get(job_id, max_age=0.2)
            if job is None:
                job = self.queue.accounting(job_id)
            if job is None or job.final:
                return job
            if time.monotonic() > deadline:
                raise BackendError(f"Slurm did not end job {job_id} ({what}) within {CANCEL_WAIT_S:.0f} s "
                                   f"of scancel; it is {job.state}")
            time.sleep(0.2)

    def _sbatch(self, script: Path, options: List[str], env: Dict[str, str], cwd: Path, tasks: int,
                identity: Optional[Identity] = None) -> str:
        """Submit ``script`` (as ``identity``'s account, which then owns ``cwd``); its job id. Raises
        :class:`BackendError` with sbatch's own error, saying how many tasks the job asked for and,
        when that is the trouble, how many CPUs the partition has."""
        if identity is not None:
            identity.own(cwd)
        cmd = ["sbatch", "--parsable", *options]
        if self.partition:
            cmd.append(f"--partition={self.partition}")
        cmd += [*self.sbatch_args, str(script)]
        res = self._run(cmd, env=env, cwd=str(cwd), identity=identity)
        if res.returncode != 0:
            msg = f"sbatch refused the job ({tasks} tasks): {(res.stderr or res.stdout).strip()}"
            try:
                partition, cpus = self._partition_size(self.partition)
            except BackendError:
                partition, cpus = None, None
            if cpus is not None and tasks > cpus:
                msg += (f"; partition {partition} has {cpus} CPUs in all: ask for at most {cpus} ranks")
            raise BackendError(msg)
        job_id = res.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise BackendError(f"sbatch answered {res.stdout.strip()!r}, not a job id")
        return job_id

    def _partition_size(self, partition: Optional[str]) -> Tuple[Optional[str], Optional[int]]:
        """``(name, total CPUs)`` of ``partition`` (None: the cluster's default one) from ``sinfo``,
        cached; the CPUs are None if Slurm does not say."""
        if partition not in self._partition_cpus:
            out = self._run(["sinfo", "--noheader", "--format=%P %C"])
            sizes: Dict[str, int] = {}
            default = None
            for line in out.stdout.splitlines():
                try:
                    name, cpus = line.split()
                    total = int(cpus.split("/")[3])
                except (ValueError, IndexError):
                    continue
                if name.endswith("*"):
                    name = default = name[:-1]
                sizes[name] = sizes.get(name, 0) + total
            name = partition or default
            self._partition_cpus[partition] = (name, sizes.get(name) if name else None)
        return self._partition_cpus[partition]

    # -- jobs ------------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> Dict[str, Any]:
        status_dir = spec.job_dir / "status"
        status_dir.mkdir(parents=True, exist_ok=True)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        # each rank's guard keeps at most spec.log_limit bytes of output per stream
        env = job_environment(spec, str(status_dir), base_environment(spec.identity))
        step = ["srun", f"--ntasks={spec.ranks}", f"--mpi={self.mpi}", "--kill-on-bad-exit=1",
                self.python, "-m", launcher.RANK_ENTRY, str(spec.script_path), *spec.args]
        options = [f"--job-name=nbmpi-job-{spec.id}", f"--ntasks={spec.ranks}", f"--chdir={spec.job_dir}",
                   f"--output={spec.job_dir / 'slurm.out'}", f"--error={spec.job_dir / 'slurm.err'}",
                   "--export=ALL"]
        time_min = slurm_minutes(spec.timeout) if spec.timeout else None
        if time_min is not None:
            options.append(f"--time={time_min}")
        script = spec.job_dir / "job.sbatch"
        with open_no_link(script, "w") as f:   # the job's account owns the folder: never through a link
            f.write(job_script(spec, step, options, self.partition, self.sbatch_args, self.python))
        job_id = self._sbatch(script, options, env, spec.job_dir, spec.ranks, identity=spec.identity)
        return {"job_id": job_id, "status_dir": str(status_dir), "time_min": time_min}

    def poll(self, spec: JobSpec, state: Dict[str, Any]) -> JobStatus:
        job_id = str(state["job_id"])
        try:
            job = self.slurm_job(job_id)
        except BackendError as exc:   # Slurm does not answer now: keep following, report it as waiting
            return JobStatus("pending" if not self._ranks_started(state) else "running",
                             reason=f"Slurm does not answer ({exc})")
        if job is None:
            return self._end_unknown(spec, state)
        if job.final:
            return self._end(spec, state, job)
        if job.state in PENDING_STATES:
            if job.reason in NEVER_FITS_REASONS:
                _, cpus = self._partition_size(job.partition)
                if cpus is not None and spec.ranks > cpus:
                    self._cancel_and_wait(job_id, "it can never run")
                    return JobStatus("ended", outcome="failed", exit_code=1, codes=[None] * spec.ranks,
                                     message=f"Slurm cannot run this job: it asks for {spec.ranks} tasks but "
                                             f"partition {job.partition} has {cpus} CPUs in all (Slurm's "
                                             f"pending reason: {job.reason}); it was cancelled: ask for at "
                                             f"most {cpus} ranks")
            return JobStatus("pending", reason=job.reason or job.state.capitalize())
        return JobStatus("running")

    def slurm_job(self, job_id: str) -> Optional[SlurmJob]:
        """Slurm's view of ``job_id``: from the cached queue; a job missing there is asked about again
        (it may be newer than the cached answer), then looked up in accounting. None: Slurm forgot it."""
        job = self.queue.get(job_id)
        if job is None:
            job = self.queue.get(job_id, max_age=0.0) or self.queue.accounting(job_id)
        return job

    @staticmethod
    def _ranks_started(state: Dict[str, Any]) -> bool:
        try:
            return any(os.scandir(state["status_dir"]))
        except OSError:
            return False

    def _codes(self, spec: JobSpec, state: Dict[str, Any], wait: bool) -> launcher.RankWatch:
        watch = launcher.RankWatch(state["status_dir"], spec.ranks)
        deadline = time.monotonic() + (STATUS_GRACE_S if wait else 0.0)
        while len(watch.codes()) < spec.ranks and time.monotonic() < deadline:
            time.sleep(0.1)
        return watch

    def _end(self, spec: JobSpec, state: Dict[str, Any], job: SlurmJob) -> JobStatus:
        """The final status of a job Slurm reports in final state ``job.state``."""
        job_id = state["job_id"]
        watch = self._codes(spec, state, wait=job.state == "COMPLETED")
        out = watch.outcome(None)
        if job.state == "TIMEOUT":
            limit = state.get("time_min")
            asked = f"; the job's timeout of {spec.timeout:g} s rounded up to whole minutes" if spec.timeout else ""
            return JobStatus("ended", outcome="timed_out", exit_code=124, codes=out.codes,
                             message=f"Slurm ended job {job_id} at its time limit (--time={limit} min{asked}); "
                                     "all ranks were ended")
        if job.state == "CANCELLED":
            return JobStatus("ended", outcome="cancelled", exit_code=130, codes=out.codes,
                             message=f"Slurm cancelled job {job_id} (scancel outside this service, or an "
                                     "administrator)")
        if out.exit_code == 0 and job.state == "COMPLETED":
            return JobStatus("ended", outcome="succeeded", exit_code=0, codes=out.codes)
        missing = [r for r, c in enumerate(out.codes) if c is None]
        ranks_failed = bool(out.message) and not out.message.startswith("mpiexec exited")
        if ranks_failed:   # "rank 1 exited 7; ranks [0] were terminated", as with the local backend
            msg, code = out.message or "", out.exit_code
        else:
            code = 1
            msg = f"Slurm job {job_id} ended {job.state}" + (f" before ranks {missing} reported" if missing else "")
        if job.state not in ("COMPLETED", "FAILED"):
            msg += f" (Slurm: {job.state}{', ' + job.reason if job.reason else ''})"
        if missing and not ranks_failed:   # nothing of the program says why: show the batch job's output
            tail = _tail(spec.job_dir / "slurm.err") or _tail(spec.job_dir / "slurm.out")
            if tail:
                msg += f": {tail}"
        return JobStatus("ended", outcome="failed", exit_code=code, codes=out.codes, message=msg)

    def _end_unknown(self, spec: JobSpec, state: Dict[str, Any]) -> JobStatus:
        """Slurm no longer knows the job (it ended long ago and accounting is off): judge by the files."""
        watch = self._codes(spec, state, wait=False)
        out = watch.outcome(None)
        if out.exit_code == 0:
            return JobStatus("ended", outcome="succeeded", exit_code=0, codes=out.codes)
        msg = out.message if out.message and not out.message.startswith("mpiexec exited") else (
            f"Slurm no longer knows job {state['job_id']} (it ended while nobody followed it and Slurm keeps no "
            f"accounting) and ranks {[r for r, c in enumerate(out.codes) if c is None]} never reported")
        return JobStatus("ended", outcome="failed", exit_code=out.exit_code or 1, codes=out.codes, message=msg)

    def cancel(self, spec: JobSpec, state: Dict[str, Any]) -> JobStatus:
        job_id = str(state["job_id"])
        before = self.slurm_job(job_id)
        if before is not None and before.final:
            return self._end(spec, state, before)
        job = self._cancel_and_wait(job_id, "cancelled by its owner")
        if job is not None and job.final and job.state != "CANCELLED":
            return self._end(spec, state, job)   # it ended on its own before scancel reached it
        codes = launcher.RankWatch(state["status_dir"], spec.ranks).outcome(None).codes
        return JobStatus("ended", outcome="cancelled", exit_code=130, codes=codes,
                         message=f"cancelled by its owner (scancel {job_id})")

    def recover(self, spec: JobSpec, state: Dict[str, Any]) -> bool:
        job_id = str(state.get("job_id") or "")
        if not job_id:
            return False
        try:
            job = self.slurm_job(job_id)
        except BackendError:
            return True    # Slurm does not answer now: follow the job; polls retry
        if job is not None:
            return True
        # Slurm forgot it (ended long ago, no accounting): follow it if every rank left its exit code
        return len(launcher.read_status(state.get("status_dir", ""), spec.ranks)) == spec.ranks

    # -- pools -------------------------------------------------------------------------------------
    def start_pool(self, spec: PoolSpec,
                   progress: Optional[Callable[[str], None]] = None) -> Tuple[EnginePool, Dict[str, Any]]:
        say = progress or (lambda msg: None)
        work = Path(spec.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        conn_path = work / POOL_CONNECTION_FILE
        if conn_path.exists():
            conn_path.unlink()
        script = work / "pool.sbatch"
        run = [self.python, "-m", SLURM_ALLOCATION, "pool", "--work-dir", str(work),
               "--ranks", str(spec.ranks), "--name", spec.name, "--ip", self.pool_ip, "--mpi", self.mpi,
               "--start-timeout", str(int(spec.timeout))]
        with open_no_link(script, "w") as f:   # the pool's account owns the folder: never through a link
            f.write("#!/bin/bash\n"
                    f"# nbmpi pool {spec.id} ({spec.owner}): the ipyparallel controller on this node and\n"
                    f"# {spec.ranks} engines as an srun step; connection info in {POOL_CONNECTION_FILE}.\n"
                    f"exec {shlex.join(run)}\n")
        options = [f"--job-name=nbmpi-pool-{spec.id}", f"--ntasks={spec.ranks}", f"--chdir={work}",
                   f"--output={work / 'slurm-%j.out'}", "--export=ALL"]
        env = rank_environment(base_environment(spec.identity))
        job_id = self._sbatch(script, options, env, work, spec.ranks, identity=spec.identity)
        state = {"job_id": job_id, "work_dir": str(work)}
        say(f"pool {spec.name!r}: Slurm job {job_id} submitted")
        deadline = time.monotonic() + spec.timeout
        shown = None
        try:
            while True:
                info = self._read_connection(conn_path, job_id)
                if info is not None:
                    break
                job = self.slurm_job(job_id)
                if job is None or job.final:
                    out = _tail(work / f"slurm-{job_id}.out")
                    raise EnginePoolError(f"the pool's Slurm job {job_id} ended "
                                    f"({job.state if job else 'unknown to Slurm'}) before its engines ran"
                                    f"{': ' + out if out else ''}")
                text = f"Slurm job {job_id}: {job.state.lower()}" + (f" ({job.reason})" if job.reason else "")
                if text != shown:
                    shown = text
                    say(f"pool {spec.name!r}: {text}")
                if time.monotonic() > deadline:
                    raise EnginePoolError(f"the pool did not start within {spec.timeout:.0f} s: {text}; its Slurm job "
                                    "was cancelled (the cluster may be busy: try again later or ask for fewer ranks)")
                time.sleep(0.2)
            pool = SlurmPool.attach(info, parent=self._attach_parent())
            pool._slurm = (self, job_id)
        except BaseException:
            try:
                self._cancel_and_wait(job_id, "pool start failed")
            except BackendError:
                pass
            raise
        say(f"pool {spec.name!r}: {spec.ranks} ranks ready (Slurm job {job_id})")
        return pool, state

    @staticmethod
    def _read_connection(path: Path, job_id: str) -> Optional[Dict[str, Any]]:
        try:   # written by the pool's job (its user's account): never through a link it put there
            with open(open_beneath(path.parent, path.name)) as f:
                info = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict):
            return None
        return info if str(info.get("slurm_job_id")) == str(job_id) else None

    def stop_pool(self, pool: Optional[EnginePool], state: Dict[str, Any]) -> None:
        """Disconnect, ask the pool's batch job to end itself (TERM to its batch script only: it ends
        the engines and controller and frees their shared memory), and ``scancel`` it if it has not
        ended within :data:`POOL_STOP_GRACE_S`. Blocks until Slurm reports the job ended."""
        if pool is not None:
            pool.stop()    # attached: disconnects only
        job_id = str((state or {}).get("job_id") or "")
        if not job_id:
            return
        self._run(["scancel", "--batch", "--signal=TERM", job_id])
        deadline = time.monotonic() + POOL_STOP_GRACE_S
        while time.monotonic() < deadline:
            job = self.queue.get(job_id, max_age=0.2)
            if job is None or job.final:
                return
            time.sleep(0.2)
        self._cancel_and_wait(job_id, "pool stopped")

    def recover_pool(self, connection: Dict[str, Any], state: Dict[str, Any]) -> Optional[EnginePool]:
        job_id = str((state or {}).get("job_id") or connection.get("slurm_job_id") or "")
        pool = None
        try:
            job = self.slurm_job(job_id) if job_id else None
            if job is not None and job.state == "RUNNING":
                pool = SlurmPool.attach(connection, parent=self._attach_parent())
                pool._slurm = (self, job_id)
                if pool.alive():
                    return pool
        except Exception:  # noqa: BLE001 - unreachable or gone: ended below
            pass
        try:
            self.stop_pool(pool, {"job_id": job_id} if job_id else {})
        except BackendError:
            pass
        return None
