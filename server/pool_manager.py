"""Pools of the controller: records, reconciliation, idle stop, and jobs on a pool.

A pool is a :class:`nbmpi.workers.launch.engine_pool.EnginePool` (ipyparallel engines on the
ranks of one MPI job, the same pools the ``%distributed`` magics use) started
and ended by the service's backend (:meth:`Backend.start_pool` ...). Its ranks
are held in the :class:`~nbmpi.server.ledger.RankLedger` while it starts or
runs. Each record keeps the owner's *target* (``running`` or ``stopped``) and
the *real* state (``starting``, ``running``, ``stopping``, ``stopped``,
``failed``). A reconcile thread (every :data:`RECONCILE_S` s) compares them:

* a pool that should run but whose engines or controller died is recorded
  ``failed`` (never reported ``running``) and whatever is left of it is ended;
* a pool with ``idle_timeout`` that ran no job for that long is stopped
  (``stopped``, message says why).

Restart: pools a previous service left ``running`` are re-attached by the
backend (:meth:`Backend.recover_pool`) if all their engines still answer,
else recorded ``failed`` (the backend ends their leftovers).

Jobs on a pool run the job's program on all engines
(:func:`nbmpi.workers.launch.engine_side.run_job`: a namespace of its own, as a script) through
:class:`nbmpi.workers.launch.pool_runner.PoolRun`, the runner of notebook cells too; each
engine's stdout/stderr is appended to ``logs/rank-R.*`` as it arrives and its trace events are
streamed to the job's ``trace`` directory as a batch job's are (so the dashboard and the trace
endpoints serve pool jobs alike); a rank whose execution raised gets exit code 1. Cancel or
timeout probes the engines (what each was doing, named in the job's message) and interrupts them
(SIGINT); if they do not stop within :data:`INTERRUPT_GRACE_S`, or a rank dies, the pool is ended
and recorded ``failed``.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from nbmpi.workers.launch.engine_pool import EnginePool, EnginePoolError
from nbmpi.workers.launch.pool_runner import ERROR_GRACE, PoolRun, RunEnd
from nbmpi.workers.launch.rank_guard import CappedLog

from .accounts import AccountError, Accounts, open_in_job
from .backends import Backend, PoolSpec
from .errors import RequestError
from .ledger import RankLedger
from .records import POOL_STATES, PoolRow
from .schemas import PoolCreate, PoolInfo
from .text import printable, printable_json

RECONCILE_S = 2.0
INTERRUPT_GRACE_S = 10.0
OUTPUT_WAIT_S = 10.0   # at most this long for a finished job's last output messages
START_TIMEOUT_S = 120.0
_LIVE = ("starting", "running", "stopping")


@dataclass
class PoolJobResult:
    """Outcome of a job on a pool: ``completed`` / ``cancelled`` / ``timed_out``, per-rank codes."""
    outcome: str
    codes: List[Optional[int]]
    message: Optional[str] = None


def pool_info(row: PoolRow) -> PoolInfo:
    """The API view of a pool record; whatever a stored row holds can be answered (strings made
    :func:`~nbmpi.server.text.printable`, an unknown state shown ``failed``, see ``job_info``)."""
    def text(v):
        return None if v is None else printable(str(v))

    def num(v, kind=(int, float)):
        return v if isinstance(v, kind) and not isinstance(v, bool) else None

    state, message = row.state, text(row.message)
    if state not in POOL_STATES:
        state, message = "failed", f"the record holds an unknown state {text(state)!r}"
    connection = printable_json(row.connection) if state == "running" and isinstance(row.connection, dict) else None
    return PoolInfo(id=row.id, owner=text(row.owner) or "", name=text(row.name), ranks=num(row.ranks, int) or 0,
                    target=row.target if row.target in ("running", "stopped") else "stopped", state=state,
                    idle_timeout=num(row.idle_timeout), created_at=num(row.created_at) or 0.0,
                    started_at=num(row.started_at), stopped_at=num(row.stopped_at),
                    last_used_at=num(row.last_used_at), message=message, connection=connection)


class PoolManager:
    """All pools of one service. Thread-safe; each pool is driven under its own lock."""

    def __init__(self, sessions: sessionmaker, data_dir: Path, backend: Backend, ledger: RankLedger,
                 max_ranks: Optional[int], accounts: Optional[Accounts] = None):
        self.sessions = sessions
        #: Which UNIX account runs each user's pools (None: all as this service).
        self.accounts = accounts
        self.data_dir = Path(data_dir)
        self.backend = backend
        self.ledger = ledger
        self.max_ranks = max_ranks
        self._lock = threading.RLock()
        self._live: Dict[int, EnginePool] = {}
        self._locks: Dict[int, threading.RLock] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Re-attach or fail the pools a previous service left live; start reconciling. The folders of
        a previous service's connections to its pools (``data_dir/attach``) are removed first."""
        attach_dir = self.data_dir / "attach"
        shutil.rmtree(attach_dir, ignore_errors=True)
        self.backend.attach_dir = attach_dir
        with self.sessions.begin() as s:
            for row in s.scalars(select(PoolRow).where(PoolRow.state.in_(_LIVE))):
                pool = None
                if row.state == "running" and row.target == "running" and row.connection:
                    pool = self.backend.recover_pool(row.connection, row.backend_state or {})
                else:
                    self.backend.stop_pool(None, row.backend_state or {})
                if pool is not None:
                    self._live[row.id] = pool
                    self._locks[row.id] = threading.RLock()
                    self.ledger.hold(("pool", row.id), row.ranks)
                    row.message = "re-attached after a restart of the service"
                    row.last_used_at = time.time()
                else:
                    row.state = "failed"
                    row.stopped_at = time.time()
                    row.message = "the service restarted and the pool's engines no longer answered; it was ended"
        self._thread = threading.Thread(target=self._loop, name="nbmpi-pools", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop reconciling and end every pool (records say ``stopped``)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        for pid in list(self._live):
            self._end(pid, "stopped", "the service stopped")

    # -- queries ---------------------------------------------------------------------------------
    def get(self, owner: str, pool_id: int) -> Optional[PoolRow]:
        """The record of ``owner``'s pool ``pool_id``, or None."""
        with self.sessions() as s:
            row = s.get(PoolRow, pool_id)
            return row if row is not None and row.owner == owner else None

    def info(self, owner: str, pool_id: int) -> Optional[PoolInfo]:
        """The API view of ``owner``'s pool, reconciled first."""
        row = self.get(owner, pool_id)
        if row is None:
            return None
        self._reconcile_one(row.id)
        return pool_info(self.get(owner, pool_id))

    def list(self, owner: str) -> List[PoolInfo]:
        """``owner``'s pools, oldest first, reconciled."""
        with self.sessions() as s:
            ids = list(s.scalars(select(PoolRow.id).where(PoolRow.owner == owner).order_by(PoolRow.id)))
        for i in ids:
            self._reconcile_one(i)
        with self.sessions() as s:
            return [pool_info(r) for r in s.scalars(select(PoolRow).where(PoolRow.owner == owner)
                                                    .order_by(PoolRow.id))]

    # -- requests ----------------------------------------------------------------------------------
    def create(self, owner: str, req: PoolCreate) -> PoolInfo:
        """Start a pool for ``owner`` (blocks until it runs or failed). Raises
        :class:`RequestError` (422 more ranks than the service has, 409 ranks not free)."""
        if self.max_ranks is not None and req.ranks > self.max_ranks:
            raise RequestError(422, f"ranks={req.ranks} exceeds this service's --max-ranks {self.max_ranks}")
        try:
            identity = self.accounts.identity(owner) if self.accounts is not None else None
        except AccountError as exc:
            raise RequestError(409, str(exc)) from None
        with self.sessions.begin() as s:
            row = PoolRow(owner=owner, name=req.name, ranks=req.ranks, target="running", state="starting",
                          idle_timeout=req.idle_timeout, created_at=time.time(), backend=self.backend.name)
            s.add(row)
            s.flush()
            row.work_dir = str(self.data_dir / "pools" / str(row.id))
            pool_id, work_dir = row.id, row.work_dir
        if not self.ledger.try_hold(("pool", pool_id), req.ranks):
            with self.sessions.begin() as s:
                s.delete(s.get(PoolRow, pool_id))
            raise RequestError(409, f"{req.ranks} ranks are not free: {self.ledger.in_use()} of "
                                        f"{self.max_ranks} are in use by running jobs and pools; stop a pool "
                                        "or wait for jobs to finish")
        with self._lock:
            self._locks[pool_id] = threading.RLock()
        spec = PoolSpec(id=pool_id, owner=owner, ranks=req.ranks, name=req.name or f"pool-{pool_id}",
                        work_dir=Path(work_dir), timeout=START_TIMEOUT_S, identity=identity)
        try:
            pool, state = self.backend.start_pool(spec)
            conn = pool.connection_info()
        except Exception as exc:  # noqa: BLE001 - EnginePoolError, BackendError or anything else: the record says why
            self.ledger.release(("pool", pool_id))
            self._update(pool_id, state="failed", stopped_at=time.time(), message=f"start failed: {exc}")
            return pool_info(self.get(owner, pool_id))
        with self._lock:
            self._live[pool_id] = pool
        now = time.time()
        self._update(pool_id, state="running", started_at=now, last_used_at=now, connection=conn,
                     backend_state=state)
        if self._stop.is_set():  # the service is stopping: do not leave the new pool behind
            self._end(pool_id, "stopped", "the service stopped")
        return pool_info(self.get(owner, pool_id))

    def delete(self, owner: str, pool_id: int) -> Optional[PoolInfo]:
        """Stop ``owner``'s pool (target ``stopped``); its engines end before this returns."""
        row = self.get(owner, pool_id)
        if row is None:
            return None
        self._update(pool_id, target="stopped")
        if row.state in _LIVE:
            self._end(pool_id, "stopped", "stopped by its owner")
        return pool_info(self.get(owner, pool_id))

    # -- jobs ----------------------------------------------------------------------------------------
    def run_job(self, pool_id: int, code: str, args: List[str], env: Dict[str, str], log_dir: Path,
                cancel: threading.Event, deadline: Optional[float],
                log_limit: Optional[int] = None, trace_dir: Optional[Path] = None) -> PoolJobResult:
        """Execute ``code`` on every engine of the pool; block until done, cancelled or past
        ``deadline`` (monotonic). Each rank's output goes to ``log_dir`` (at most ``log_limit``
        bytes per stream, then a truncation marker); with ``trace_dir`` each rank streams its
        trace there as a batch job's ranks do. Called by the scheduler's job thread.

        Runs through :class:`~nbmpi.workers.launch.pool_runner.PoolRun`, as notebook cells do: at the
        deadline or on cancel the ranks are probed and interrupted, and the message says what each
        was doing; ranks still running :data:`ERROR_GRACE` s after another failed are interrupted
        too. A pool whose ranks ignore SIGINT or died is ended and recorded ``failed``."""
        pool = self._live.get(pool_id)
        if pool is None:
            raise EnginePoolError(f"pool {pool_id} is not running")
        lock = self._locks[pool_id]
        self._update(pool_id, last_used_at=time.time())
        log_dir.mkdir(parents=True, exist_ok=True)
        from nbmpi.workers.launch.engine_side import run_job
        with lock:
            ranks = list(pool.ranks)
            written = {(r, s): 0 for r in ranks for s in ("stdout", "stderr")}
            # the job's account owns log_dir: its folder is opened without following links
            folder = open_in_job(log_dir.parent, log_dir.name)
            try:
                logs = {key: CappedLog(f"rank-{key[0]}.{key[1]}", log_limit, dir_fd=folder) for key in written}
            finally:
                os.close(folder)
            try:
                run = PoolRun(pool, ranks, lambda view: view.apply_async(
                    run_job, code, list(args), dict(env), "job.py", str(trace_dir) if trace_dir else None))
                end = run.wait(deadline, cancel, tick=lambda r: self._append_output(r, logs, written),
                               error_grace=ERROR_GRACE, interrupt_grace=INTERRUPT_GRACE_S)
                broken = end.wedged or end.dead
                # the result can arrive before the last output messages (another channel): wait for
                # the engines' output to be complete so no printed line is lost from the logs
                run.drain(1.0 if broken else OUTPUT_WAIT_S)
                self._append_output(run, logs, written)
            finally:
                for log in logs.values():
                    log.close()
            if broken:   # under the pool's lock: the reconciler does not end it first with another reason
                self._end(pool_id, "failed", f"{broken}; the pool was ended")
        if not broken:
            self._update(pool_id, last_used_at=time.time())
        return self._result(pool_id, run, end)

    @staticmethod
    def _result(pool_id: int, run: PoolRun, end: RunEnd) -> PoolJobResult:
        """The job's outcome, per-rank codes (None: the rank never answered) and one message."""
        outcome = {"interrupted": "cancelled", "timed_out": "timed_out"}.get(end.reason, "completed")
        codes: List[Optional[int]] = []
        errors: List[str] = []
        for r in run.ranks:
            md = run.metadata(r)
            if r in run.pending():
                codes.append(None)
            elif md.get("status") == "ok":
                codes.append(0)
            else:
                codes.append(1)
                if r not in end.stopped:
                    err = md.get("error")
                    errors.append(f"rank {r}: {getattr(err, 'ename', 'error')}: {getattr(err, 'evalue', '')}")
        parts = list(errors)
        if end.reason in ("timed_out", "interrupted"):
            parts = [f"what each rank was doing then: {end.explain()}"]
        elif end.reason == "error" and end.stopped:
            parts += [f"rank {r} was in {end.described[r]} when another rank failed; interrupted"
                      for r in end.stopped]
        if end.reason == "dead":
            parts.append(f"{end.dead} during the job; pool {pool_id} was ended")
        elif end.wedged:
            parts.append(f"{end.wedged}; pool {pool_id} was ended")
        return PoolJobResult(outcome, codes, "; ".join(parts) or None)

    @staticmethod
    def _append_output(run: PoolRun, logs: Dict, written: Dict) -> None:
        for r in run.ranks:
            md = run.metadata(r)
            for stream in ("stdout", "stderr"):
                text = md.get(stream)
                done = written[(r, stream)]
                if text and len(text) > done:
                    logs[(r, stream)].write(text[done:].encode())
                    written[(r, stream)] = len(text)

    # -- reconciliation ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(RECONCILE_S):
            for pid in list(self._live):
                try:
                    self._reconcile_one(pid)
                except Exception as exc:  # noqa: BLE001 - keep reconciling the others
                    print(f"nbmpi serve: reconciling pool {pid} failed: {exc!r}", flush=True)

    def _reconcile_one(self, pool_id: int) -> None:
        pool = self._live.get(pool_id)
        lock = self._locks.get(pool_id)
        if pool is None or lock is None or not lock.acquire(blocking=False):
            return  # not live here, or a job is using it (the job checks liveness itself)
        try:
            row = self.get_any(pool_id)
            if row is None or row.state != "running":
                return
            if row.target == "stopped":
                self._end(pool_id, "stopped", "stopped by its owner")
            elif not pool.alive():
                self._end(pool_id, "failed", "the pool's engines or controller died; it was ended")
            elif row.idle_timeout and time.time() - (row.last_used_at or row.started_at or 0) > row.idle_timeout:
                self._end(pool_id, "stopped", f"stopped after {row.idle_timeout:g} s without a job")
        finally:
            lock.release()

    def get_any(self, pool_id: int) -> Optional[PoolRow]:
        """The record of pool ``pool_id`` whoever owns it."""
        with self.sessions() as s:
            return s.get(PoolRow, pool_id)

    def _end(self, pool_id: int, state: str, message: str) -> None:
        with self._lock:
            pool = self._live.pop(pool_id, None)
        row = self.get_any(pool_id)
        if row is not None and row.state in _LIVE:
            self._update(pool_id, state="stopping")
            try:
                self.backend.stop_pool(pool, row.backend_state or {})
            except Exception as exc:  # noqa: BLE001 - the record says the pool ended; the message why not cleanly
                message = f"{message} (ending it reported: {exc})"
        self.ledger.release(("pool", pool_id))
        if row is not None and row.state in _LIVE:
            self._update(pool_id, state=state, stopped_at=time.time(), message=message)

    def _update(self, pool_id: int, **fields) -> None:
        with self.sessions.begin() as s:
            row = s.get(PoolRow, pool_id)
            for k, v in fields.items():
                setattr(row, k, v)
