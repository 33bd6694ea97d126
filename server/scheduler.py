"""The job state machine of the controller: queue, admission, following, records.

Semantics (the same whichever backend runs the jobs):

* A submitted job is recorded ``queued`` (SQLite, committed) before anything
  runs; its code is saved as ``DATA_DIR/jobs/ID/<script_name>``.
* Admission: batch jobs are admitted strictly in submission order while their
  ranks fit in the :class:`~nbmpi.server.ledger.RankLedger` (running batch jobs
  and live pools hold ranks there); a job that does not fit blocks the ones
  behind it (no overtaking, no starvation). A job on a pool waits until that
  pool has no other job running.
* An admitted batch job is handed to the backend (:meth:`Backend.submit`); its
  opaque state is stored in the record. While the backend reports it
  ``pending`` the record stays ``queued`` with ``message`` ``"waiting: REASON"``;
  then ``running``; at the end one of the final states with per-rank exit codes.
  One follower thread per job polls the backend, ends the job at its timeout
  (``timed_out``, exit code 124) or on cancel (``cancelled``, 130). When every
  rank succeeded and the ranks wrote a trace, its paths are recorded. Then, whatever the
  outcome, the streamed trace is indexed once (:mod:`~nbmpi.server.trace_index`) and the
  Chrome trace and summary of what was recorded up to the end are recorded too.
* A job on a pool runs the code on the pool's engines
  (:meth:`~nbmpi.server.pool_manager.PoolManager.run_job`); its ranks stream their trace to the
  job's ``trace`` directory like a batch job's, indexed the same way when it ends.
* Restart (:meth:`Scheduler.recover`): for each job a previous service left
  submitted, the backend says whether it still knows it; then it is followed
  again. Else, if every rank had written its exit code to the job's status
  directory before the restart, the job finished while no service watched it
  and is recorded with those codes (succeeded or failed); otherwise it is
  recorded ``lost``. Queued jobs stay queued and are admitted again.
* Idempotent submits (:meth:`Scheduler.submit_once`): a job submitted with an
  ``Idempotency-Key`` is stored with it (unique per owner); the same key again
  returns that job and runs nothing, the same key with another request is 409.
* Stop (:meth:`Scheduler.stop`): every followed job is ended and recorded
  ``lost`` (the service that watched it is going away), unless the backend's
  jobs outlive the service (``Backend.jobs_outlive_service``, a cluster
  queue): then they keep running, their records stay as they are, and the
  next start re-attaches to them.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import sessionmaker

from nbmpi.workers.launch.identity import Identity
from nbmpi.workers.launch.launcher import read_status
from nbmpi.workers.launch.processes import noted_segments, remove_shm

from .accounts import AccountError, Accounts
from .backends import Backend, BackendError, JobSpec, JobStatus
from .errors import RequestError
from .ledger import RankLedger
from .records import FINAL_JOB_STATES, Job
from .schemas import JobCreate
from .trace_index import INDEXER

#: Exit codes given to jobs ended by the service (same as ``nbmpi run``).
TIMEOUT_EXIT, CANCEL_EXIT = 124, 130
#: Seconds between two polls of a followed job.
POLL_S = 0.05
#: Seconds past its timeout after which a job whose backend enforces timeouts is ended anyway.
TIMEOUT_SLACK_S = 120.0


@dataclass
class _Followed:
    job_id: int
    ranks: int
    pool_id: Optional[int]
    deadline: Optional[float] = None
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


def request_digest(req: JobCreate, source: Optional[bytes] = None) -> str:
    """SHA-256 (hex) of a submit request: its fields and the uploaded script's bytes, if any."""
    h = hashlib.sha256(json.dumps(req.model_dump(mode="json"), sort_keys=True).encode())
    if source is not None:
        h.update(b"\0upload\0" + hashlib.sha256(source).digest())
    return h.hexdigest()


def _status_dir(job: Job) -> str:
    """Where the ranks of a batch job write their pids and exit codes."""
    given = (job.backend_state or {}).get("status_dir") if isinstance(job.backend_state, dict) else None
    return given if isinstance(given, str) and given else str(Path(job.job_dir) / "status")


def job_spec(job: Job, log_limit: Optional[int] = None, identity: Optional[Identity] = None) -> JobSpec:
    """The backend's view of a job record (``identity``: the account its ranks run as)."""
    job_dir = Path(job.job_dir)
    return JobSpec(id=job.id, owner=job.owner, ranks=job.ranks, job_dir=job_dir, script_path=Path(job.script_path),
                   log_dir=Path(job.log_dir), trace_dir=job_dir / "trace", args=list(job.args or []),
                   env=dict(job.env or {}), timeout=job.timeout, name=job.name, log_limit=log_limit,
                   identity=identity)


class Scheduler:
    """Queue, admission and followers of all jobs of one service. Thread-safe."""

    def __init__(self, sessions: sessionmaker, data_dir: Path, backend: Backend, ledger: RankLedger,
                 max_ranks: Optional[int], pools=None, max_log_bytes: Optional[int] = None,
                 accounts: Optional[Accounts] = None):
        self.max_log_bytes = max_log_bytes
        #: Which UNIX account runs each user's jobs (None: all as this service, as with one user).
        self.accounts = accounts
        self.sessions = sessions
        self.data_dir = Path(data_dir)
        self.backend = backend
        self.ledger = ledger
        self.max_ranks = max_ranks
        self.pools = pools
        self._lock = threading.RLock()
        self._followed: Dict[int, _Followed] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- life cycle ------------------------------------------------------------------
    def recover(self) -> List[int]:
        """Follow again the jobs a previous service left submitted that the backend still knows;
        record the others ``lost``. Returns the ids recorded lost. Queued jobs stay queued."""
        lost: List[int] = []
        with self.sessions() as s:
            left = list(s.scalars(select(Job).where((Job.state == "running") | (
                (Job.state == "queued") & Job.backend_state.is_not(None))).order_by(Job.id)))
        for job in left:
            known = False
            finished = None
            if job.pool_id is None and isinstance(job.backend_state, dict):   # jobs on a pool end with the service
                finished = self._exit_codes(job)   # read before the backend ends what is left
                try:
                    known = job.backend == self.backend.name and self.backend.recover(self._spec(job, strict=False),
                                                                                      job.backend_state)
                except Exception:  # noqa: BLE001 - cannot tell: the job is lost
                    known = False
            if known:
                self.ledger.hold(("job", job.id), job.ranks)
                self._follow(job, message="re-attached after a restart of the service")
                continue
            if finished is not None:   # MPI shared memory its ranks noted and no live process maps
                remove_shm(noted_segments(_status_dir(job)))
            if finished is not None and all(c is not None for c in finished):
                self._record_finished_while_down(job, finished)
            else:
                self._set_final(job.id, "lost", None, finished,
                                "the service stopped while the job was running; its ranks were ended")
                lost.append(job.id)
        return lost

    def _exit_codes(self, job: Job) -> Optional[List[Optional[int]]]:
        """The exit code each rank of ``job`` wrote to its status directory (None for a rank that has
        not), or None when there is no status directory."""
        status_dir = _status_dir(job)
        if not Path(status_dir).is_dir():
            return None
        codes = read_status(status_dir, job.ranks)
        return [codes.get(r) for r in range(job.ranks)]

    def _record_finished_while_down(self, job: Job, codes: List[int]) -> None:
        """Record a job every rank of which ended on its own while no service watched it, from the
        exit codes the ranks wrote (instead of ``lost``)."""
        note = "finished while the service was down; exit codes read from the ranks' status files"
        if all(c == 0 for c in codes):
            trace = Path(job.job_dir) / "trace" / "trace.json"
            summary = Path(job.job_dir) / "trace" / "summary.json"
            self._set_final(job.id, "succeeded", 0, codes, note, trace_path=str(trace) if trace.exists() else None,
                            summary_path=str(summary) if summary.exists() else None)
        else:
            failed = ", ".join(f"rank {r} exited {c}" for r, c in enumerate(codes) if c != 0)
            self._set_final(job.id, "failed", max(codes), codes, f"{failed}; {note}")

    def start(self) -> None:
        """Recover, then start admitting queued jobs in a background thread."""
        self.recover()
        self._thread = threading.Thread(target=self._loop, name="nbmpi-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop admitting; end every followed job and record it ``lost`` (batch jobs of a backend
        whose jobs outlive the service are only no longer followed)."""
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            followed = list(self._followed.values())
        for f in followed:
            f.cancel.set()
        for f in followed:
            f.done.wait(timeout=15)

    def _spec(self, job: Job, strict: bool = True) -> JobSpec:
        """:func:`job_spec` with the account of the job's owner. When the owner cannot be run
        isolated: BackendError (the job fails with why) if ``strict``, else no account."""
        identity = None
        if self.accounts is not None:
            try:
                identity = self.accounts.identity(job.owner)
            except AccountError as exc:
                if strict:
                    raise BackendError(str(exc)) from None
        return job_spec(job, self.max_log_bytes, identity)

    # -- requests ----------------------------------------------------------------------
    def submit_once(self, owner: str, req: JobCreate, key: Optional[str],
                    source: Optional[bytes] = None) -> Tuple[Job, bool]:
        """:meth:`submit` unless ``owner`` already submitted with the ``Idempotency-Key`` ``key``:
        then that job is returned and nothing runs again. Returns ``(job, created)``. The same key
        with a different request raises :class:`RequestError` 409. Without a key: :meth:`submit`."""
        if not key:
            return self.submit(owner, req, source), True
        digest = request_digest(req, source)
        for _ in range(2):
            first = self._keyed(owner, key)
            if first is not None:
                if first.request_digest != digest:
                    raise RequestError(409, f"Idempotency-Key {key!r} was already used for another request "
                                            f"(job {first.id}); use a new key for a new job")
                return first, False
            try:
                return self.submit(owner, req, source, idempotency=(key, digest)), True
            except IntegrityError:   # a concurrent request with the same key was recorded first
                continue
        raise RequestError(409, f"Idempotency-Key {key!r} is being used by a concurrent request; retry")

    def _keyed(self, owner: str, key: str) -> Optional[Job]:
        with self.sessions() as s:
            return s.scalars(select(Job).where(Job.owner == owner, Job.idempotency_key == key)).first()

    def submit(self, owner: str, req: JobCreate, source: Optional[bytes] = None,
               idempotency: Optional[Tuple[str, str]] = None) -> Job:
        """Record a new queued job for ``owner`` and save its code (``source``, the bytes of an
        uploaded file, instead of ``req.code`` when given); ``idempotency``: its ``(key, request
        digest)``. Raises :class:`RequestError` (IntegrityError when the key is taken)."""
        ranks = req.ranks
        if req.pool is not None:
            if self.pools is None:
                raise RequestError(422, "this service has no pools; submit without 'pool'")
            pool = self.pools.get(owner, req.pool)
            if pool is None:
                raise RequestError(404, f"pool {req.pool} not found")
            if pool.state != "running":
                raise RequestError(409, f"pool {req.pool} is {pool.state}, not running; start a new pool")
            if ranks is not None and ranks != pool.ranks:
                raise RequestError(422, f"ranks={ranks} but pool {req.pool} has {pool.ranks} ranks; "
                                    "omit ranks or give the pool's")
            ranks = pool.ranks
        elif ranks is None:
            raise RequestError(422, "ranks is required for a batch job (no pool given), e.g. \"ranks\": 2")
        elif self.max_ranks is not None and ranks > self.max_ranks:
            raise RequestError(422, f"ranks={ranks} exceeds this service's --max-ranks {self.max_ranks}; "
                                f"ask for at most {self.max_ranks}")
        with self.sessions.begin() as s:
            job = Job(owner=owner, name=req.name, state="queued", ranks=ranks, pool_id=req.pool,
                      script_name=req.script_name, args=list(req.args), env=dict(req.env),
                      timeout=req.timeout, created_at=time.time(),
                      idempotency_key=idempotency[0] if idempotency else None,
                      request_digest=idempotency[1] if idempotency else None)
            s.add(job)
            s.flush()
            job_dir = self.data_dir / "jobs" / str(job.id)
            job.job_dir = str(job_dir)
            job.script_path = str(job_dir / req.script_name)
            job.log_dir = str(job_dir / "logs")
            try:
                (job_dir / "logs").mkdir(parents=True, exist_ok=True)
                if source is not None:
                    Path(job.script_path).write_bytes(source)
                else:
                    Path(job.script_path).write_text(req.code)
                if self.accounts is not None:   # the owner's account alone may read it (0700)
                    self.accounts.hand_over(job_dir, owner)
            except AccountError as exc:
                shutil.rmtree(job_dir, ignore_errors=True)
                raise RequestError(409, str(exc)) from None
            except OSError:   # the record is rolled back with this transaction: leave no files either
                shutil.rmtree(job_dir, ignore_errors=True)
                raise
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
        """Cancel ``owner``'s job: a job not yet handed to the backend never starts; a handed-over
        one has every rank ended before this returns (at most ``wait`` s). A finished job is
        returned unchanged."""
        with self._lock:
            job = self.get(owner, job_id)
            if job is None:
                raise RequestError(404, f"job {job_id} not found")
            followed = self._followed.get(job_id)
            if followed is None and job.state == "queued":
                return self._set_final(job_id, "cancelled", exit_code=None, message="cancelled before it started")
        if followed is not None:
            followed.cancel.set()
            followed.done.wait(timeout=wait)
        return self.get(owner, job_id)

    def followed(self) -> int:
        """Number of jobs followed now (handed to the backend or running on a pool)."""
        with self._lock:
            return len(self._followed)

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
                queued = list(s.scalars(select(Job).where(Job.state == "queued", Job.backend_state.is_(None))
                                        .order_by(Job.id)))
            busy_pools = {f.pool_id: f.job_id for f in self._followed.values() if f.pool_id is not None}
            blocked_by: Optional[int] = None   # the first batch job that waits for ranks
            for job in queued:
                if self._stop.is_set():
                    return
                if job.id in self._followed:
                    continue
                if job.pool_id is not None:
                    if job.pool_id in busy_pools:
                        self._say_waiting(job, f"pool {job.pool_id} is running job {busy_pools[job.pool_id]}; "
                                               "a pool runs one job at a time")
                        continue
                    busy_pools[job.pool_id] = job.id
                    self._follow(job)
                    continue
                if blocked_by is not None:
                    self._say_waiting(job, f"job {blocked_by} is ahead of it in the queue (jobs start in "
                                           "submission order)")
                    continue
                if not self.ledger.try_hold(("job", job.id), job.ranks):
                    blocked_by = job.id
                    self._say_waiting(job, self._no_ranks_reason(job.ranks))
                    continue
                try:
                    state = self.backend.submit(self._spec(job))
                except BackendError as exc:
                    self.ledger.release(("job", job.id))
                    self._set_final(job.id, "failed", 1, None, str(exc))
                    continue
                except Exception as exc:  # noqa: BLE001 - a backend bug fails the job, not the service
                    self.ledger.release(("job", job.id))
                    self._set_final(job.id, "failed", 1, None, f"the {self.backend.name} backend failed: {exc!r}")
                    continue
                def write(job=job, state=state):
                    with self.sessions.begin() as s:
                        row = s.get(Job, job.id)
                        row.backend, row.backend_state = self.backend.name, state
                job.backend, job.backend_state = self.backend.name, state
                self._durably(f"job {job.id} handed to the backend", write)
                self._follow(job)

    def _no_ranks_reason(self, ranks: int) -> str:
        """Why ``ranks`` ranks are not free now: what holds them (pools first)."""
        held = self.ledger.holders()
        parts = [f"{kind} {key} ({n} rank{'s' if n != 1 else ''})"
                 for (kind, key), n in sorted(held.items(), key=lambda kv: (kv[0][0] != "pool", kv[0][1]))]
        free = self.ledger.free()
        text = f"needs {ranks} ranks, {free} of {self.ledger.capacity} free"
        if parts:
            text += "; held by " + ", ".join(parts)
        if any(kind == "pool" for kind, _ in held):
            text += " (a pool holds its ranks until it is stopped: `nbmpi pool stop ID`)"
        return text

    def _say_waiting(self, job: Job, reason: str) -> None:
        """Record why queued ``job`` does not start (``message`` ``"waiting: REASON"``), when it changed."""
        text = f"waiting: {reason}"
        if job.message == text or (job.message and not job.message.startswith("waiting: ")):
            return
        job.message = text
        self._update(job.id, message=text)

    def _follow(self, job: Job, message: Optional[str] = None) -> None:
        """Start the follower thread of ``job`` (handed to the backend, or to run on its pool)."""
        f = _Followed(job.id, job.ranks, job.pool_id)
        with self._lock:
            self._followed[job.id] = f
        target = self._run_on_pool if job.pool_id is not None else self._follow_batch
        threading.Thread(target=target, args=(f, job, message), name=f"nbmpi-job-{job.id}", daemon=True).start()

    # -- followers -------------------------------------------------------------------------
    def _follow_batch(self, f: _Followed, job: Job, message: Optional[str]) -> None:
        spec, state = self._spec(job, strict=False), dict(job.backend_state or {})
        status: Optional[JobStatus] = None
        shown: Optional[str] = None
        try:
            if message:
                self._update(job.id, message=message)
            while True:
                if f.cancel.is_set() and self._stop.is_set() and self.backend.jobs_outlive_service:
                    return   # the job runs on without this service; the next start re-attaches
                if f.cancel.is_set():
                    status = self.backend.cancel(spec, state)
                    if self._stop.is_set() and status.outcome == "cancelled":
                        status.outcome, status.message = "lost", "the service stopped while the job was running"
                    break
                status = self.backend.poll(spec, state)
                if status.phase == "ended":
                    break
                if status.phase == "pending":
                    text = f"waiting: {status.reason or 'in the queue'}"
                    if text != shown:
                        shown = text
                        self._update(job.id, message=text)
                elif f.deadline is None:   # first seen running
                    self._went_running(f, job)
                if f.deadline is not None and time.monotonic() > f.deadline:
                    status = self.backend.cancel(spec, state)
                    if status.outcome == "cancelled":
                        status.outcome = "timed_out"
                    break
                f.cancel.wait(POLL_S)
            if f.deadline is None and status.codes and any(c is not None for c in status.codes):
                self._went_running(f, job)   # it ran, and ended before a poll saw it running
            self._record_end(job, status)
        except Exception as exc:  # noqa: BLE001 - never leave a job running in the records
            try:
                self.backend.cancel(spec, state)
            except Exception:  # noqa: BLE001
                pass
            self._set_final(job.id, "failed", 1, None, f"the service failed following the job: {exc!r}")
        finally:
            self.ledger.release(("job", job.id))
            self._unfollow(f)
        self._index_trace(job)

    def _index_trace(self, job: Job) -> None:
        """Index the ended job's streamed trace once (whatever its outcome; in a child process, see
        :mod:`~nbmpi.server.trace_index`) and record the Chrome trace and summary the ranks or the
        build wrote. Called by the job's follower thread after the job's end is recorded (while the
        service stops no build starts: the first request for the trace builds its index then)."""
        trace_dir = Path(job.job_dir) / "trace"
        try:
            INDEXER.build_blocking(trace_dir, job.ranks)
        except Exception as exc:  # noqa: BLE001 - the job's record is final; the dashboard says what is missing
            print(f"nbmpi serve: indexing the trace of job {job.id} failed: {exc!r}", flush=True)
            return
        trace, summary = trace_dir / "trace.json", trace_dir / "summary.json"
        if not trace.exists():
            return
        def write():
            with self.sessions.begin() as s:
                row = s.get(Job, job.id)
                row.trace_path = str(trace)
                row.summary_path = str(summary) if summary.exists() else None
        self._durably(f"the trace of job {job.id}", write)

    def _went_running(self, f: _Followed, job: Job) -> None:
        limit = job.timeout
        if limit:
            f.deadline = time.monotonic() + limit + (TIMEOUT_SLACK_S if self.backend.enforces_timeout else 0.0)
        else:
            f.deadline = float("inf")
        def write():
            with self.sessions.begin() as s:
                row = s.get(Job, job.id)
                if row.state == "queued":
                    row.state = "running"
                    row.started_at = time.time()
                    if row.message and row.message.startswith("waiting: "):
                        row.message = None
        self._durably(f"job {job.id} running", write)

    def _record_end(self, job: Job, status: JobStatus) -> None:
        outcome = status.outcome or "failed"
        if outcome == "succeeded":
            trace = Path(job.job_dir) / "trace" / "trace.json"
            summary = Path(job.job_dir) / "trace" / "summary.json"
            self._set_final(job.id, "succeeded", 0, status.codes, None,
                            trace_path=str(trace) if trace.exists() else None,
                            summary_path=str(summary) if summary.exists() else None)
        elif outcome == "timed_out":
            self._set_final(job.id, "timed_out", TIMEOUT_EXIT, status.codes,
                            status.message if status.message and "time" in status.message else
                            f"timed out after {job.timeout} s; all ranks were ended")
        elif outcome == "cancelled":
            self._set_final(job.id, "cancelled", CANCEL_EXIT, status.codes, status.message or "cancelled by its owner")
        elif outcome == "lost":
            self._set_final(job.id, "lost", None, status.codes, status.message)
        else:
            self._set_final(job.id, "failed", status.exit_code or 1, status.codes, status.message)

    def _run_on_pool(self, f: _Followed, job: Job, message: Optional[str]) -> None:  # noqa: ARG002
        try:
            self._update(job.id, state="running", started_at=time.time())
            if job.timeout:
                f.deadline = time.monotonic() + job.timeout
            code = Path(job.script_path).read_text()
            result = self.pools.run_job(job.pool_id, code, job.args, job.env, Path(job.log_dir), f.cancel, f.deadline,
                                        log_limit=self.max_log_bytes, trace_dir=Path(job.job_dir) / "trace")
            said = f". {result.message}" if result.message else ""
            if result.outcome == "cancelled":
                self._set_final(job.id, "lost" if self._stop.is_set() else "cancelled", CANCEL_EXIT,
                                result.codes, f"cancelled by its owner; the engines were interrupted{said}")
            elif result.outcome == "timed_out":
                self._set_final(job.id, "timed_out", TIMEOUT_EXIT, result.codes,
                                f"timed out after {job.timeout} s; the engines were interrupted{said}")
            elif all(c == 0 for c in result.codes):
                self._set_final(job.id, "succeeded", 0, result.codes, None)
            else:
                self._set_final(job.id, "failed", max(c or 1 for c in result.codes), result.codes, result.message)
        except Exception as exc:  # noqa: BLE001
            self._set_final(job.id, "failed", 1, None, f"running on pool {job.pool_id} failed: {exc}")
        finally:
            self._unfollow(f)
        self._index_trace(job)

    def _unfollow(self, f: _Followed) -> None:
        with self._lock:
            self._followed.pop(f.job_id, None)
        f.done.set()
        self._wake.set()

    # -- records ------------------------------------------------------------------------
    def _durably(self, what: str, write):
        """Run the record write ``write()`` until it succeeds: a read-only or full data directory
        must not lose a job's outcome. Retries with growing pauses (at most 5 s) until the service
        stops; says once per failure streak what is wrong."""
        pause, warned = 0.2, False
        while True:
            try:
                return write()
            except (OperationalError, DBAPIError, OSError) as exc:
                if self._stop.is_set():
                    raise
                if not warned:
                    warned = True
                    print(f"nbmpi serve: cannot record {what} ({exc}); retrying until the data directory "
                          f"{self.data_dir} is writable again", flush=True)
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def _update(self, job_id: int, **fields) -> None:
        def write():
            with self.sessions.begin() as s:
                row = s.get(Job, job_id)
                if row.state in FINAL_JOB_STATES:
                    return
                for k, v in fields.items():
                    setattr(row, k, v)
        self._durably(f"job {job_id}", write)

    def _set_final(self, job_id: int, state: str, exit_code: Optional[int],
                   codes: Optional[List[Optional[int]]] = None, message: Optional[str] = None,
                   trace_path: Optional[str] = None, summary_path: Optional[str] = None) -> Job:
        assert state in FINAL_JOB_STATES
        return self._durably(f"the end of job {job_id}",
                             lambda: self._write_final(job_id, state, exit_code, codes, message, trace_path,
                                                       summary_path))

    def _write_final(self, job_id: int, state: str, exit_code: Optional[int], codes, message, trace_path,
                     summary_path) -> Job:
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
