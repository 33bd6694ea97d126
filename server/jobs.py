"""The job queue, its scheduler and the job runners of the controller.

Semantics:

* A submitted job is recorded ``queued`` (SQLite, committed) before anything
  runs; its code is saved as ``DATA_DIR/jobs/ID/<script_name>``.
* Admission: batch jobs are admitted strictly in submission order while the
  ranks in use (running batch jobs + live pools) plus the job's ranks stay
  within ``max_ranks``; a job that does not fit blocks the ones behind it (no
  overtaking, no starvation). A job on a pool waits until that pool has no
  other job running.
* A batch job is one ``mpiexec`` run through :func:`nbmpi.workers.launcher.start`:
  every rank runs under the nbmpi runtime (traced), writes its stdout/stderr to
  ``logs/rank-R.stdout|stderr`` and its exit code to ``status/rank-R.exit``; when
  all ranks succeed, rank 0 writes ``trace/trace.json`` (Chrome) and
  ``trace/summary.json``. One monitor thread per running job ends the whole
  process group when a rank fails (as ``nbmpi run`` does), at the timeout
  (``timed_out``, exit code 124) or on cancel (``cancelled``, 130), and records
  the per-rank exit codes.
* Restart: :meth:`Scheduler.recover` marks jobs left ``running`` by a previous
  service as ``lost`` and kills their process group if it still exists;
  ``queued`` jobs simply stay queued and are admitted again.
* Stop: :meth:`Scheduler.stop` ends every running job's process group and marks
  the jobs ``lost`` (the service that watched them is going away).
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from ..workers import launcher
from .db import FINAL_JOB_STATES, Job
from .schemas import JobCreate

#: Exit codes given to jobs ended by the service (same as ``nbmpi run``).
TIMEOUT_EXIT, CANCEL_EXIT = 124, 130
_POLL_S = 0.05


class JobError(Exception):
    """A request about a job cannot be honoured (the route answers 4xx with this message)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Running:
    job_id: int
    ranks: int
    pool_id: Optional[int]
    proc: Optional[subprocess.Popen] = None
    deadline: Optional[float] = None
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


def _is_our_group(pgid: int, job_dir: str) -> bool:
    """Whether group ``pgid`` is still the job's mpiexec (guards against pid reuse after a restart)."""
    try:
        import psutil

        env = psutil.Process(pgid).environ()
    except Exception:  # noqa: BLE001 - gone, or not ours to inspect
        return False
    return env.get(launcher.STATUS_DIR_ENV, "").startswith(str(job_dir))


class Scheduler:
    """Queue, admission and runners of all jobs of one service. Thread-safe."""

    def __init__(self, sessions: sessionmaker, data_dir: Path, max_ranks: int, pools=None):
        self.sessions = sessions
        self.data_dir = Path(data_dir)
        self.max_ranks = int(max_ranks)
        self.pools = pools
        self._lock = threading.RLock()
        self._running: Dict[int, _Running] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- life cycle ------------------------------------------------------------------
    def recover(self) -> List[int]:
        """Mark jobs a previous service left ``running`` as ``lost`` (killing their leftover
        process group). Returns their ids. Queued jobs stay queued."""
        lost: List[int] = []
        with self.sessions.begin() as s:
            for job in s.scalars(select(Job).where(Job.state == "running")):
                if job.pgid and _is_our_group(job.pgid, job.job_dir):
                    launcher.kill_group(job.pgid, grace=1.0)
                job.state = "lost"
                job.finished_at = time.time()
                job.message = "the service stopped while the job was running; its ranks were ended"
                job.rank_exit_codes = self._rank_codes(job.job_dir, job.ranks)
                lost.append(job.id)
        return lost

    def start(self) -> None:
        """Recover, then start admitting queued jobs in a background thread."""
        self.recover()
        self._thread = threading.Thread(target=self._loop, name="nbmpi-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop admitting; end every running job's process group and mark the job ``lost``."""
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            running = list(self._running.values())
        for rj in running:
            rj.cancel.set()
        for rj in running:
            rj.done.wait(timeout=15)

    # -- requests ----------------------------------------------------------------------
    def submit(self, owner: str, req: JobCreate) -> Job:
        """Record a new queued job for ``owner`` and save its code. Raises :class:`JobError`."""
        ranks = req.ranks
        if req.pool is not None:
            if self.pools is None:
                raise JobError(422, "this service has no pools; submit without 'pool'")
            pool = self.pools.get(owner, req.pool)
            if pool is None:
                raise JobError(404, f"pool {req.pool} not found")
            if pool.state != "running":
                raise JobError(409, f"pool {req.pool} is {pool.state}, not running; start a new pool")
            if ranks is not None and ranks != pool.ranks:
                raise JobError(422, f"ranks={ranks} but pool {req.pool} has {pool.ranks} ranks; "
                                    "omit ranks or give the pool's")
            ranks = pool.ranks
        elif ranks is None:
            raise JobError(422, "ranks is required for a batch job (no pool given), e.g. \"ranks\": 2")
        elif ranks > self.max_ranks:
            raise JobError(422, f"ranks={ranks} exceeds this service's --max-ranks {self.max_ranks}; "
                                f"ask for at most {self.max_ranks}")
        with self.sessions.begin() as s:
            job = Job(owner=owner, name=req.name, state="queued", ranks=ranks, pool_id=req.pool,
                      script_name=req.script_name, args=list(req.args), env=dict(req.env),
                      timeout=req.timeout, created_at=time.time())
            s.add(job)
            s.flush()
            job_dir = self.data_dir / "jobs" / str(job.id)
            job.job_dir = str(job_dir)
            job.script_path = str(job_dir / req.script_name)
            job.log_dir = str(job_dir / "logs")
            (job_dir / "logs").mkdir(parents=True, exist_ok=True)
            Path(job.script_path).write_text(req.code)
        self._wake.set()
        return job

    def get(self, owner: str, job_id: int) -> Optional[Job]:
        """The job ``job_id`` if it belongs to ``owner``, else None."""
        with self.sessions() as s:
            job = s.get(Job, job_id)
            return job if job is not None and job.owner == owner else None

    def list(self, owner: str, state: Optional[str] = None) -> List[Job]:
        """``owner``'s jobs (optionally in ``state``), oldest first."""
        with self.sessions() as s:
            q = select(Job).where(Job.owner == owner)
            if state:
                q = q.where(Job.state == state)
            return list(s.scalars(q.order_by(Job.id)))

    def cancel(self, owner: str, job_id: int, wait: float = 20.0) -> Job:
        """Cancel ``owner``'s job: a queued job never starts; a running one has its whole
        process group ended before this returns (at most ``wait`` s). A finished job is
        returned unchanged."""
        with self._lock:
            job = self.get(owner, job_id)
            if job is None:
                raise JobError(404, f"job {job_id} not found")
            if job.state == "queued":
                return self._set_final(job_id, "cancelled", exit_code=None, message="cancelled before it started")
            rj = self._running.get(job_id)
        if rj is not None:
            rj.cancel.set()
            rj.done.wait(timeout=wait)
        return self.get(owner, job_id)

    def ranks_in_use(self) -> int:
        """Ranks of running batch jobs plus ranks of live pools."""
        with self._lock:
            used = sum(rj.ranks for rj in self._running.values() if rj.pool_id is None)
        if self.pools is not None:
            used += self.pools.ranks_in_use()
        return used

    # -- admission ---------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self._admit()
            except Exception as exc:  # noqa: BLE001 - the scheduler must survive anything
                print(f"nbmpi serve: scheduler error: {exc!r}", flush=True)

    def _admit(self) -> None:
        with self._lock:
            with self.sessions() as s:
                queued = list(s.scalars(select(Job).where(Job.state == "queued").order_by(Job.id)))
            free = self.max_ranks - self.ranks_in_use()
            busy_pools = {rj.pool_id for rj in self._running.values() if rj.pool_id is not None}
            batch_blocked = False
            for job in queued:
                if self._stop.is_set():
                    return
                if job.pool_id is not None:
                    if job.pool_id in busy_pools:
                        continue
                    busy_pools.add(job.pool_id)
                    self._start_pool_job(job)
                    continue
                if batch_blocked or job.ranks > free:
                    batch_blocked = True
                    continue
                free -= job.ranks
                self._start_batch(job)

    def _start_batch(self, job: Job) -> None:
        job_dir = Path(job.job_dir)
        status_dir = job_dir / "status"
        trace_dir = job_dir / "trace"
        env = dict(job.env or {})
        env.update({"NBMPI_LOG_DIR": job.log_dir, "NBMPI_TRACE_OUT": str(trace_dir)})
        rj = _Running(job.id, job.ranks, None)
        try:
            with open(job_dir / "launcher.out", "wb") as out, open(job_dir / "launcher.err", "wb") as err:
                rj.proc = launcher.start(job.ranks, [job.script_path, *job.args], str(status_dir), env=env,
                                         stdout=out, stderr=err, cwd=str(job_dir))
        except Exception as exc:  # noqa: BLE001 - e.g. no mpiexec: the job fails with the reason
            self._set_final(job.id, "failed", exit_code=1, message=f"could not start mpiexec: {exc}")
            return
        self._go_running(rj, job, self._monitor_batch, pgid=rj.proc.pid)

    def _start_pool_job(self, job: Job) -> None:
        self._go_running(_Running(job.id, job.ranks, job.pool_id), job, self._monitor_pool_job)

    def _go_running(self, rj: _Running, job: Job, monitor, pgid: Optional[int] = None) -> None:
        """Record ``job`` as running (with its deadline and process group) and start its monitor thread."""
        if job.timeout:
            rj.deadline = time.monotonic() + job.timeout
        with self.sessions.begin() as s:
            row = s.get(Job, job.id)
            row.state = "running"
            row.started_at = time.time()
            if pgid is not None:
                row.pgid = pgid
        self._running[job.id] = rj
        threading.Thread(target=monitor, args=(rj, job), name=f"nbmpi-job-{job.id}", daemon=True).start()

    # -- runners -------------------------------------------------------------------------
    def _monitor_batch(self, rj: _Running, job: Job) -> None:
        proc = rj.proc
        status_dir = os.path.join(job.job_dir, "status")
        outcome: Optional[str] = None
        failed_at: Optional[float] = None
        try:
            while proc.poll() is None:
                if rj.cancel.is_set():
                    outcome = "lost" if self._stop.is_set() else "cancelled"
                    break
                if rj.deadline is not None and time.monotonic() > rj.deadline:
                    outcome = "timed_out"
                    break
                codes = launcher.read_status(status_dir, job.ranks)
                if any(c != 0 for c in codes.values()):
                    if failed_at is None:
                        failed_at = time.monotonic()
                    elif time.monotonic() - failed_at > 0.5 or len(codes) == job.ranks:
                        break
                time.sleep(_POLL_S)
            launcher.kill_group(proc.pid, proc=proc)  # no rank of this job survives, whatever ended it
            proc.wait()
            codes = self._rank_codes(job.job_dir, job.ranks)
            trace_dir = Path(job.job_dir) / "trace"
            if outcome == "cancelled":
                self._set_final(job.id, "cancelled", CANCEL_EXIT, codes, "cancelled by its owner")
            elif outcome == "timed_out":
                self._set_final(job.id, "timed_out", TIMEOUT_EXIT, codes,
                                f"timed out after {job.timeout} s; all ranks were ended")
            elif outcome == "lost":
                self._set_final(job.id, "lost", None, codes, "the service stopped while the job was running")
            elif all(c == 0 for c in codes) and len(codes) == job.ranks:
                trace = trace_dir / "trace.json"
                summary = trace_dir / "summary.json"
                self._set_final(job.id, "succeeded", 0, codes, None,
                                trace_path=str(trace) if trace.exists() else None,
                                summary_path=str(summary) if summary.exists() else None)
            else:
                bad = [c for c in codes if c not in (None, 0)]
                if bad:
                    rc = max(bad)
                    msg = ", ".join(f"rank {r} exited {c}" for r, c in enumerate(codes) if c not in (None, 0))
                    missing = [r for r, c in enumerate(codes) if c is None]
                    if missing:
                        msg += f"; ranks {missing} were terminated"
                else:
                    r = proc.returncode
                    rc = r if r and r > 0 else (128 - r if r and r < 0 else 1)
                    msg = f"mpiexec exited {proc.returncode} before all ranks reported: " + \
                        self._tail(Path(job.job_dir) / "launcher.err")
                self._set_final(job.id, "failed", rc, codes, msg)
        except Exception as exc:  # noqa: BLE001 - never leave a job running in the records
            if proc.poll() is None:
                launcher.kill_group(proc.pid, proc=proc)
            self._set_final(job.id, "failed", 1, None, f"the service failed watching the job: {exc!r}")
        finally:
            with self._lock:
                self._running.pop(rj.job_id, None)
            rj.done.set()
            self._wake.set()

    def _monitor_pool_job(self, rj: _Running, job: Job) -> None:
        try:
            code = Path(job.script_path).read_text()
            result = self.pools.run_job(job.pool_id, code, job.args, job.env, Path(job.log_dir),
                                        rj.cancel, rj.deadline)
            if result.outcome == "cancelled":
                self._set_final(job.id, "lost" if self._stop.is_set() else "cancelled", CANCEL_EXIT,
                                result.codes, "cancelled by its owner; the engines were interrupted")
            elif result.outcome == "timed_out":
                self._set_final(job.id, "timed_out", TIMEOUT_EXIT, result.codes,
                                f"timed out after {job.timeout} s; the engines were interrupted")
            elif all(c == 0 for c in result.codes):
                self._set_final(job.id, "succeeded", 0, result.codes, None)
            else:
                self._set_final(job.id, "failed", max(c or 1 for c in result.codes), result.codes,
                                result.message)
        except Exception as exc:  # noqa: BLE001
            self._set_final(job.id, "failed", 1, None, f"running on pool {job.pool_id} failed: {exc}")
        finally:
            with self._lock:
                self._running.pop(rj.job_id, None)
            rj.done.set()
            self._wake.set()

    # -- records ------------------------------------------------------------------------
    @staticmethod
    def _rank_codes(job_dir: str, ranks: int) -> List[Optional[int]]:
        codes = launcher.read_status(os.path.join(job_dir, "status"), ranks)
        return [codes.get(r) for r in range(ranks)]

    @staticmethod
    def _tail(path: Path, limit: int = 2000) -> str:
        try:
            return path.read_text(errors="replace")[-limit:].strip() or "(no output)"
        except OSError:
            return "(no output)"

    def _set_final(self, job_id: int, state: str, exit_code: Optional[int],
                   codes: Optional[List[Optional[int]]] = None, message: Optional[str] = None,
                   trace_path: Optional[str] = None, summary_path: Optional[str] = None) -> Job:
        assert state in FINAL_JOB_STATES
        with self.sessions.begin() as s:
            row = s.get(Job, job_id)
            if row.state in FINAL_JOB_STATES:
                return row
            row.state = state
            row.exit_code = exit_code
            row.finished_at = time.time()
            if codes is not None:
                row.rank_exit_codes = codes
            row.message = message
            row.trace_path = trace_path
            row.summary_path = summary_path
            return row
