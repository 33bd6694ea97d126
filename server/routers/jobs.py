"""Routes of jobs: submit (JSON or upload), list, get, cancel, logs, trace, summary.

Every route needs a bearer token; a user only sees their own jobs (another
user's id is answered 404 like an id that does not exist).
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import List, Literal, Optional

from fastapi import APIRouter, Depends, File, Form, Header, HTTPException, Query, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from ..accounts import open_in_job
from ..config import MAX_CODE_BYTES
from ..dependencies import current_user, get_scheduler, user_job
from ..errors import DOCUMENTED
from nbmpi.workers.tracing.index import CHROME_EVENTS_LIMIT

from ..records import FINAL_JOB_STATES, JOB_STATES, Job
from ..scheduler import Scheduler
from ..schemas import (ARG_SCHEMA, ENV_NAME, MAX_ID, MAX_RANKS, NO_NUL, SCRIPT_NAME, Cancelled, ErrorBody, JobCreate,
                       JobInfo, JobList, JobState)
from ..text import printable
from ..trace_index import INDEXER

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], responses=DOCUMENTED)


def _text(value) -> Optional[str]:
    return None if value is None else printable(str(value))


def _number(value, kind=int):
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def job_info(job: Job) -> JobInfo:
    """The API view of a job record. Whatever a stored row holds (a string that is not valid Unicode,
    JSON of the wrong shape, an unknown state, as an old database may), the view can be answered:
    strings are :func:`~nbmpi.server.text.printable` and an unknown state is shown ``lost``."""
    state, message = job.state, _text(job.message)
    if state not in JOB_STATES:
        state, message = "lost", (f"the record holds an unknown state {_text(state)!r}"
                                  + (f": {message}" if message else ""))
    args = [_text(a) for a in job.args] if isinstance(job.args, list) else []
    codes = job.rank_exit_codes
    codes = [_number(c) for c in codes] if isinstance(codes, list) else None
    real = (int, float)
    return JobInfo(id=job.id, owner=_text(job.owner) or "", name=_text(job.name), state=state,
                   ranks=_number(job.ranks) or 0, pool=_number(job.pool_id), script_name=_text(job.script_name) or "",
                   args=args, timeout=_number(job.timeout, real), created_at=_number(job.created_at, real) or 0.0,
                   started_at=_number(job.started_at, real), finished_at=_number(job.finished_at, real),
                   exit_code=_number(job.exit_code), rank_exit_codes=codes, message=message,
                   log_dir=_text(job.log_dir) or "", trace_available=bool(job.trace_path))


_CONFLICT = {409: {"model": ErrorBody, "description": "The pool named is not running, or the Idempotency-Key "
                                                     "was already used for another request"},
             200: {"model": JobInfo, "description": "The job first submitted with this Idempotency-Key (nothing "
                                                    "new was queued)"}}


def idempotency_key(key: Optional[str] = Header(
        None, alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[!-~]+$",
        description="Any unique string of printable ASCII (e.g. a UUID). A repeat of the request with the same "
                    "key returns the job it created (200) instead of queueing another; the same key with a "
                    "different request is answered 409. Keys are kept per user with the job.")) -> Optional[str]:
    """The request's ``Idempotency-Key`` header (None without one)."""
    return key


def _submitted(response: Response, job_created) -> JobInfo:
    job, created = job_created
    if not created:
        response.status_code = 200
    return job_info(job)


@router.post("", response_model=JobInfo, status_code=201, responses=_CONFLICT)
def submit_job(req: JobCreate, response: Response, key: Optional[str] = Depends(idempotency_key),
               user: str = Depends(current_user), scheduler: Scheduler = Depends(get_scheduler)) -> JobInfo:
    """Queue a job. Without ``pool`` it runs as its own traced MPI run of ``ranks`` ranks on the
    service's backend; with ``pool`` on that pool's engines. Returns the queued record (201), or with
    an ``Idempotency-Key`` used before for the same request, the job it created (200)."""
    return _submitted(response, scheduler.submit_once(user, req, key))


@router.post("/upload", response_model=JobInfo, status_code=201, responses=_CONFLICT)
async def submit_job_upload(script: UploadFile = File(description="The program (.py)"),
                            ranks: int = Form(None, ge=1, le=MAX_RANKS, description="Number of ranks (or give pool)"),
                            pool: int = Form(None, ge=1, le=MAX_ID, description="Run on this pool's ranks"),
                            timeout: float = Form(None, gt=0, le=7 * 86400, description="Seconds"),
                            args: List[str] = Form([], description="sys.argv[1:] of the program",
                                                   json_schema_extra={"items": ARG_SCHEMA}),
                            env: List[str] = Form([], description="NAME=VALUE environment variables",
                                                  json_schema_extra={"items": {
                                                      "type": "string", "maxLength": 4096,
                                                      "pattern": ENV_NAME.pattern[:-1] + "=[^\\x00]*$"}}),
                            name: str = Form(None, max_length=256, description="Free label",
                                             json_schema_extra={"pattern": NO_NUL}),
                            response: Response = None, key: Optional[str] = Depends(idempotency_key),
                            user: str = Depends(current_user),
                            scheduler: Scheduler = Depends(get_scheduler)) -> JobInfo:
    """Queue a job from an uploaded script file (multipart form); same semantics as ``POST /api/v1/jobs``
    (``Idempotency-Key`` included).

    The file is stored as it is and run as the program (Python reads it as it would any script:
    UTF-8 unless the file declares another encoding; an unreadable script makes the job fail
    with Python's message). Its name is kept when it is a plain ``*.py`` name, else ``job.py``."""
    raw = await script.read(MAX_CODE_BYTES + 1)
    if len(raw) > MAX_CODE_BYTES:
        raise HTTPException(413, f"script is larger than {MAX_CODE_BYTES} bytes")
    env_obj = {}
    for item in env:
        key, eq, value = item.partition("=")
        if not eq:
            raise HTTPException(422, f"env entry {item[:60]!r} is not NAME=VALUE")
        env_obj[key] = value
    # the model checks every other field; the script itself is stored as the bytes uploaded
    fields = dict(code="-", ranks=ranks, pool=pool, timeout=timeout, args=args, env=env_obj, name=name)
    base = os.path.basename(script.filename or "")
    if SCRIPT_NAME.fullmatch(base):
        fields["script_name"] = base
    try:
        req = JobCreate(**fields)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from None
    return _submitted(response, scheduler.submit_once(user, req, key, source=raw))


@router.get("", response_model=JobList)
def list_jobs(state: Optional[JobState] = Query(None, description="Only jobs in this state"),
              user: str = Depends(current_user), scheduler: Scheduler = Depends(get_scheduler)) -> JobList:
    """The caller's jobs, oldest first."""
    return JobList(jobs=[job_info(j) for j in scheduler.list(user, state)])


@router.get("/{job_id:int}", response_model=JobInfo)
def get_job(job: Job = Depends(user_job)) -> JobInfo:
    """One job: state, per-rank exit codes, timestamps."""
    return job_info(job)


@router.delete("/{job_id:int}", response_model=Cancelled,
               responses={200: {"description": "The job's state after the cancel. The record is kept: "
                                               "GET keeps answering it (state cancelled, or the final state "
                                               "it had reached), and a repeated DELETE changes nothing"}})
def cancel_job(job: Job = Depends(user_job), scheduler: Scheduler = Depends(get_scheduler)) -> Cancelled:
    """Cancel a job. A running job has every rank ended before the answer; a finished job is
    left as it is (its state is returned). The record stays (it is not removed)."""
    job = scheduler.cancel(job.owner, job.id)
    return Cancelled(id=job.id, state=job.state)


#: Largest piece of a log one request returns; follow ``X-Log-Next-Offset`` for the rest.
LOG_CHUNK_BYTES = 16 << 20


@router.get("/{job_id:int}/logs", response_class=Response,
            responses={200: {"content": {"text/plain": {}},
                             "description": "Bytes of the log from `offset`, at most 16 MiB",
                             "headers": {"X-Log-Size": {"description": "Size of the whole log file now (bytes)",
                                                        "schema": {"type": "integer"}},
                                         "X-Log-Next-Offset": {"description": "Offset of the first byte not "
                                                               "returned: request again from it while it is "
                                                               "below X-Log-Size", "schema": {"type": "integer"}}}}})
def job_logs(job: Job = Depends(user_job), rank: int = Query(0, ge=0, le=1 << 20),
             stream: Literal["stdout", "stderr"] = Query("stdout"),
             offset: int = Query(0, ge=0, le=1 << 62, description="Skip this many bytes (to follow a log)")) -> Response:
    """Output of one rank from byte ``offset`` (empty until the rank writes), at most 16 MiB per request.

    ``X-Log-Size`` is the whole file's size now and ``X-Log-Next-Offset`` where the next request
    continues; a client has everything when they are equal (and the job is final). A log cut by the
    service's ``--max-log-bytes`` ends with a visible ``[nbmpi: output truncated ...]`` line."""
    if rank >= job.ranks:
        raise HTTPException(404, f"job {job.id} has no rank {rank}: its ranks are 0..{job.ranks - 1}")
    log_dir = Path(job.log_dir)
    try:   # the job owns its directory: never follow a link it put there (nbmpi.server.accounts)
        with open(open_in_job(log_dir.parent, log_dir.name, f"rank-{rank}.{stream}"), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(min(offset, size))
            data = f.read(min(LOG_CHUNK_BYTES, max(size - offset, 0)))
    except FileNotFoundError:
        size, data = 0, b""
    except OSError as exc:   # ELOOP: the job replaced its log or log folder by a link
        raise HTTPException(404, f"job {job.id}: the log of rank {rank} is not a plain file "
                                 f"({exc.strerror}); nothing is served from it") from None
    return Response(data, media_type="text/plain; charset=utf-8",
                    headers={"X-Log-Size": str(size), "X-Log-Next-Offset": str(min(offset, size) + len(data))})


async def _trace_file(job: Job, which: str) -> Response:
    """The job's ``trace.json`` / ``summary.json``: written by the ranks when every rank succeeded,
    else from what they streamed up to the end (by the trace index build, awaited here)."""
    trace_dir = Path(job.job_dir) / "trace"
    recorded = job.trace_path if which == "trace" else job.summary_path
    path = Path(recorded) if recorded else trace_dir / f"{which}.json"
    final = job.state in FINAL_JOB_STATES
    if final and not path.exists():
        fut = INDEXER.ensure(trace_dir, job.ranks)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), 60)
        except asyncio.TimeoutError:
            raise HTTPException(404, f"no {which} for job {job.id} yet: its trace is still being written; "
                                     "try again in a minute") from None
    if not path.exists():
        ix = INDEXER.open(trace_dir) if final else None
        if job.state in ("queued", "running"):
            why = "the job has not finished (the dashboard shows its live timeline)"
        elif ix is not None and not ix.readable:
            why = f"trace unreadable: {ix.reason}"
        elif ix is not None and ix.meta.get("events", 0) > CHROME_EVENTS_LIMIT:
            why = (f"its trace has {ix.meta['events']:,} events, more than the controller turns into a "
                   f"Chrome trace ({CHROME_EVENTS_LIMIT:,}); the dashboard's trace.npz (nbmpi Trace.load) "
                   "holds them all")
        else:
            why = "its ranks streamed no trace (tracing off, or they ended before they started)"
        raise HTTPException(404, f"no {which} for job {job.id}: {why}")
    rel = Path(path).relative_to(job.job_dir) if Path(path).is_relative_to(job.job_dir) else None
    try:   # inside the job's own directory: never through a link the job put there
        with open(open_in_job(Path(job.job_dir), *rel.parts), "rb") if rel else open(path, "rb") as f:
            return Response(f.read(), media_type="application/json")
    except OSError as exc:
        raise HTTPException(404, f"no {which} for job {job.id}: {exc.strerror or exc}") from None


@router.get("/{job_id:int}/trace",
            responses={200: {"content": {"application/json": {}}, "description": "Chrome/Perfetto trace JSON"}})
async def job_trace(job: Job = Depends(user_job)) -> Response:
    """The job's trace as Chrome Trace Event JSON (open in https://ui.perfetto.dev), whatever its
    outcome: a failed, cancelled or timed-out job's holds what its ranks recorded up to the end
    (waits still open then as ``wait`` slices up to the end)."""
    return await _trace_file(job, "trace")


@router.get("/{job_id:int}/summary",
            responses={200: {"content": {"application/json": {}},
                             "description": "Per-rank compute/comm/wait and bytes matrix"}})
async def job_summary(job: Job = Depends(user_job)) -> Response:
    """Per-rank compute / communication / wait seconds and the bytes and messages matrices (of what
    was recorded up to the end when a rank did not succeed, with the waits open then)."""
    return await _trace_file(job, "summary")
