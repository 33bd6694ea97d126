"""Routes of jobs: submit (JSON or upload), list, get, cancel, logs, trace, summary.

Every route needs a bearer token; a user only sees their own jobs (another
user's id is answered 404 like an id that does not exist).
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import List, Literal, Optional

from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from pydantic import ValidationError

from ..config import MAX_CODE_BYTES
from ..dependencies import current_user, get_scheduler, user_job
from ..errors import DOCUMENTED
from ..records import FINAL_JOB_STATES, Job
from ..scheduler import Scheduler
from nbmpi.workers.tracing.index import CHROME_EVENTS_LIMIT

from ..trace_index import INDEXER
from ..schemas import (ARG_SCHEMA, ENV_NAME, MAX_ID, MAX_RANKS, SCRIPT_NAME, Cancelled, ErrorBody, JobCreate, JobInfo, JobList,
                       JobState)

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], responses=DOCUMENTED)


def job_info(job: Job) -> JobInfo:
    """The API view of a job record."""
    return JobInfo(id=job.id, owner=job.owner, name=job.name, state=job.state, ranks=job.ranks, pool=job.pool_id,
                   script_name=job.script_name, args=list(job.args or []), timeout=job.timeout,
                   created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
                   exit_code=job.exit_code, rank_exit_codes=job.rank_exit_codes, message=job.message,
                   log_dir=job.log_dir, trace_available=bool(job.trace_path))


_CONFLICT = {409: {"model": ErrorBody, "description": "The pool named is not running"}}


@router.post("", response_model=JobInfo, status_code=201, responses=_CONFLICT)
def submit_job(req: JobCreate, user: str = Depends(current_user),
               scheduler: Scheduler = Depends(get_scheduler)) -> JobInfo:
    """Queue a job. Without ``pool`` it runs as its own traced MPI run of ``ranks`` ranks on the
    service's backend; with ``pool`` on that pool's engines. Returns the queued record."""
    return job_info(scheduler.submit(user, req))


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
                            name: str = Form(None, max_length=256, description="Free label"),
                            user: str = Depends(current_user),
                            scheduler: Scheduler = Depends(get_scheduler)) -> JobInfo:
    """Queue a job from an uploaded script file (multipart form); same semantics as ``POST /api/v1/jobs``.

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
    if SCRIPT_NAME.match(base):
        fields["script_name"] = base
    try:
        req = JobCreate(**fields)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from None
    return job_info(scheduler.submit(user, req, source=raw))


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
    path = Path(job.log_dir) / f"rank-{rank}.{stream}"
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(min(offset, size))
            data = f.read(min(LOG_CHUNK_BYTES, max(size - offset, 0)))
    except FileNotFoundError:
        size, data = 0, b""
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
            why = (f"its trace has {ix.meta['events']:,} events, more than a Chrome trace viewer opens; "
                   "the dashboard's trace.npz (nbmpi Trace.load) holds them all")
        else:
            why = "its ranks streamed no trace (tracing off, or they ended before they started)"
        raise HTTPException(404, f"no {which} for job {job.id}: {why}")
    return FileResponse(path, media_type="application/json")


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
