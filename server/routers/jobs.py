"""Routes of jobs: submit (JSON or upload), list, get, cancel, logs, trace, summary.

Every route needs a bearer token; a user only sees their own jobs (another
user's id is answered 404 like an id that does not exist).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Literal, Optional

from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, Response
from pydantic import ValidationError

from ..config import MAX_CODE_BYTES
from ..dependencies import current_user, get_scheduler, user_job
from ..records import Job
from ..scheduler import Scheduler
from ..schemas import Cancelled, ErrorBody, JobCreate, JobInfo, JobList, JobState

ERRORS = {401: {"model": ErrorBody, "description": "Missing or unknown bearer token"},
          404: {"model": ErrorBody, "description": "No such record of this user"}}

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], responses=ERRORS)


def job_info(job: Job) -> JobInfo:
    """The API view of a job record."""
    return JobInfo(id=job.id, owner=job.owner, name=job.name, state=job.state, ranks=job.ranks, pool=job.pool_id,
                   script_name=job.script_name, args=list(job.args or []), timeout=job.timeout,
                   created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
                   exit_code=job.exit_code, rank_exit_codes=job.rank_exit_codes, message=job.message,
                   log_dir=job.log_dir, trace_available=bool(job.trace_path))


@router.post("", response_model=JobInfo, status_code=201, responses={409: {"model": ErrorBody}})
def submit_job(req: JobCreate, user: str = Depends(current_user),
               scheduler: Scheduler = Depends(get_scheduler)) -> JobInfo:
    """Queue a job. Without ``pool`` it runs as its own traced MPI run of ``ranks`` ranks on the
    service's backend; with ``pool`` on that pool's engines. Returns the queued record."""
    return job_info(scheduler.submit(user, req))


@router.post("/upload", response_model=JobInfo, status_code=201, responses={409: {"model": ErrorBody}})
async def submit_job_upload(script: UploadFile = File(description="The program (.py)"),
                            ranks: Optional[int] = Form(None), pool: Optional[int] = Form(None),
                            timeout: Optional[float] = Form(None), args: List[str] = Form([]),
                            env: Optional[str] = Form(None, description="JSON object of variables"),
                            name: Optional[str] = Form(None),
                            user: str = Depends(current_user),
                            scheduler: Scheduler = Depends(get_scheduler)) -> JobInfo:
    """Queue a job from an uploaded script file (multipart form); same semantics as ``POST /api/v1/jobs``."""
    raw = await script.read(MAX_CODE_BYTES + 1)
    if len(raw) > MAX_CODE_BYTES:
        raise HTTPException(413, f"script is larger than {MAX_CODE_BYTES} bytes")
    try:
        code = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(422, "script is not UTF-8 text") from None
    try:
        env_obj = json.loads(env) if env else {}
    except ValueError as exc:
        raise HTTPException(422, f"env must be a JSON object of strings: {exc}") from None
    fields = dict(code=code, ranks=ranks, pool=pool, timeout=timeout, args=args, env=env_obj, name=name)
    if script.filename:
        fields["script_name"] = os.path.basename(script.filename)
    try:
        req = JobCreate(**fields)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_context=False)) from None
    return job_info(scheduler.submit(user, req))


@router.get("", response_model=JobList)
def list_jobs(state: Optional[JobState] = Query(None, description="Only jobs in this state"),
              user: str = Depends(current_user), scheduler: Scheduler = Depends(get_scheduler)) -> JobList:
    """The caller's jobs, oldest first."""
    return JobList(jobs=[job_info(j) for j in scheduler.list(user, state)])


@router.get("/{job_id}", response_model=JobInfo)
def get_job(job: Job = Depends(user_job)) -> JobInfo:
    """One job: state, per-rank exit codes, timestamps."""
    return job_info(job)


@router.delete("/{job_id}", response_model=Cancelled)
def cancel_job(job: Job = Depends(user_job), scheduler: Scheduler = Depends(get_scheduler)) -> Cancelled:
    """Cancel a job. A running job has every rank ended before the answer; a finished job is
    left as it is (its state is returned)."""
    job = scheduler.cancel(job.owner, job.id)
    return Cancelled(id=job.id, state=job.state)


#: Largest piece of a log one request returns; follow ``X-Log-Next-Offset`` for the rest.
LOG_CHUNK_BYTES = 16 << 20


@router.get("/{job_id}/logs", response_class=PlainTextResponse,
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
        raise HTTPException(422, f"rank {rank} out of range: job {job.id} has ranks 0..{job.ranks - 1}")
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


def _trace_file(job: Job, which: str) -> Response:
    path = job.trace_path if which == "trace" else job.summary_path
    if not path or not Path(path).exists():
        why = ("the job has not finished" if job.state in ("queued", "running") else
               f"the job ended {job.state}; a trace is written only when every rank succeeds")
        raise HTTPException(404, f"no {which} for job {job.id}: {why}")
    return Response(Path(path).read_bytes(), media_type="application/json")


@router.get("/{job_id}/trace",
            responses={200: {"content": {"application/json": {}}, "description": "Chrome/Perfetto trace JSON"}})
def job_trace(job: Job = Depends(user_job)) -> Response:
    """The job's gathered trace as Chrome Trace Event JSON (open in https://ui.perfetto.dev)."""
    return _trace_file(job, "trace")


@router.get("/{job_id}/summary",
            responses={200: {"content": {"application/json": {}},
                             "description": "Per-rank compute/comm/wait and bytes matrix"}})
def job_summary(job: Job = Depends(user_job)) -> Response:
    """Per-rank compute / communication / wait seconds and the bytes and messages matrices."""
    return _trace_file(job, "summary")
