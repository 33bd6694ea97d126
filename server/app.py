"""The controller's HTTP API (FastAPI): pools and jobs of authenticated users.

:func:`create_app` builds the application for one data directory. Every
endpoint except ``GET /api/health`` and ``GET /api/version`` needs
``Authorization: Bearer TOKEN``; a missing or unknown token is answered 401.
A user only sees their own jobs and pools: another user's id is answered 404,
exactly like an id that does not exist. Malformed requests are answered 4xx
with the reason (422 for bad fields or JSON, 413 for oversized bodies).
"""
from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Dict, List, Literal, Optional

from fastapi import Depends, FastAPI, File, Form, HTTPException, Path as PathParam, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError

from .auth import Authenticator
from .config import MAX_CODE_BYTES
from .db import Job, make_engine, session_factory
from .jobs import JobError, Scheduler
from .schemas import (Cancelled, ErrorBody, Health, JobCreate, JobInfo, JobList, JobState, PoolCreate,
                      PoolInfo, PoolList, Version)

API_VERSION = "v1"
#: Largest request body accepted (bytes); the code limit plus room for the other fields.
MAX_BODY_BYTES = MAX_CODE_BYTES * 2 + 65536
def _id():
    """A record id path parameter (a fresh instance per route: FastAPI binds it to the name)."""
    return PathParam(ge=1, le=2**62, description="Record id")



_ERRORS = {401: {"model": ErrorBody, "description": "Missing or unknown bearer token"},
           404: {"model": ErrorBody, "description": "No such record of this user"}}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("nbmpi")
    except Exception:  # noqa: BLE001
        return "0+unknown"


def job_info(job: Job) -> JobInfo:
    """The API view of a job record."""
    return JobInfo(id=job.id, owner=job.owner, name=job.name, state=job.state, ranks=job.ranks, pool=job.pool_id,
                   script_name=job.script_name, args=list(job.args or []), timeout=job.timeout,
                   created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at,
                   exit_code=job.exit_code, rank_exit_codes=job.rank_exit_codes, message=job.message,
                   log_dir=job.log_dir, trace_available=bool(job.trace_path))


def create_app(data_dir: Path, max_ranks: int, users_path: Optional[Path] = None,
               db_path: Optional[Path] = None, enable_pools: bool = True) -> FastAPI:
    """The FastAPI application serving ``data_dir`` (already created) with at most ``max_ranks`` ranks in use.

    The scheduler (and the pool manager) start with the application's lifespan
    and stop with it: running jobs are then ended and recorded as ``lost``.
    """
    data_dir = Path(data_dir)
    engine = make_engine(db_path or data_dir / "nbmpi.db")
    sessions = session_factory(engine)
    auth = Authenticator(users_path or data_dir / "users.json")
    pools = None
    pools_error = "pools are disabled on this service"
    if enable_pools:
        try:
            from .pools import PoolManager

            pools = PoolManager(sessions, data_dir, max_ranks)
        except ImportError as exc:
            pools_error = f"pools are unavailable on this service: {exc}"
    scheduler = Scheduler(sessions, data_dir, max_ranks, pools=pools)
    if pools is not None:
        pools.scheduler = scheduler

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if pools is not None:
            pools.start()
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()
            if pools is not None:
                pools.stop()
            engine.dispose()

    app = FastAPI(title="nbmpi controller", version=_version(), lifespan=lifespan,
                  description="Pools and jobs on MPI ranks, per user. Authenticate with "
                              "`Authorization: Bearer TOKEN` (see the users file in the data directory).")
    app.state.scheduler = scheduler
    app.state.pools = pools
    bearer = HTTPBearer(auto_error=False, description="Token from the users file")

    def current_user(creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> str:
        user = auth.user_for(creds.credentials if creds else None)
        if user is None:
            raise HTTPException(401, "missing or unknown token: send 'Authorization: Bearer TOKEN' with a token "
                                     "from the service's users file", headers={"WWW-Authenticate": "Bearer"})
        return user

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None:
            try:
                too_big = int(length) > MAX_BODY_BYTES
            except ValueError:
                return JSONResponse({"detail": f"invalid Content-Length {length!r}"}, status_code=400)
            if too_big:
                return JSONResponse({"detail": f"request body of {length} bytes exceeds the limit of "
                                               f"{MAX_BODY_BYTES} bytes"}, status_code=413)
        return await call_next(request)

    @app.exception_handler(JobError)
    async def job_error(_request: Request, exc: JobError):
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    def _job(user: str, job_id: int) -> Job:
        job = scheduler.get(user, job_id)
        if job is None:
            raise HTTPException(404, f"job {job_id} not found")
        return job

    def _pools():
        if pools is None:
            raise HTTPException(501, pools_error)
        return pools

    # -- open endpoints -------------------------------------------------------------------
    @app.get("/api/health", response_model=Health, tags=["service"])
    def health() -> Health:
        """Liveness; no token needed."""
        return Health(status="ok")

    @app.get("/api/version", response_model=Version, tags=["service"])
    def version() -> Version:
        """Service and API version; no token needed."""
        return Version(version=_version(), api=API_VERSION)

    # -- jobs ---------------------------------------------------------------------------------
    @app.post("/api/v1/jobs", response_model=JobInfo, status_code=201, tags=["jobs"],
              responses={**_ERRORS, 409: {"model": ErrorBody}})
    def submit_job(req: JobCreate, user: str = Depends(current_user)) -> JobInfo:
        """Queue a job. Without ``pool`` it runs as its own traced batch ``mpiexec`` run on
        ``ranks`` ranks; with ``pool`` on that pool's engines. Returns the queued record."""
        return job_info(scheduler.submit(user, req))

    @app.post("/api/v1/jobs/upload", response_model=JobInfo, status_code=201, tags=["jobs"],
              responses={**_ERRORS, 409: {"model": ErrorBody}})
    async def submit_job_upload(script: UploadFile = File(description="The program (.py)"),
                                ranks: Optional[int] = Form(None), pool: Optional[int] = Form(None),
                                timeout: Optional[float] = Form(None), args: List[str] = Form([]),
                                env: Optional[str] = Form(None, description="JSON object of variables"),
                                name: Optional[str] = Form(None),
                                user: str = Depends(current_user)) -> JobInfo:
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

    @app.get("/api/v1/jobs", response_model=JobList, tags=["jobs"], responses=_ERRORS)
    def list_jobs(state: Optional[JobState] = Query(None, description="Only jobs in this state"),
                  user: str = Depends(current_user)) -> JobList:
        """The caller's jobs, oldest first."""
        return JobList(jobs=[job_info(j) for j in scheduler.list(user, state)])

    @app.get("/api/v1/jobs/{job_id}", response_model=JobInfo, tags=["jobs"], responses=_ERRORS)
    def get_job(job_id: int = _id(), user: str = Depends(current_user)) -> JobInfo:
        """One job: state, per-rank exit codes, timestamps."""
        return job_info(_job(user, job_id))

    @app.delete("/api/v1/jobs/{job_id}", response_model=Cancelled, tags=["jobs"], responses=_ERRORS)
    def cancel_job(job_id: int = _id(), user: str = Depends(current_user)) -> Cancelled:
        """Cancel a job. A running job's whole process group is ended before the answer;
        a finished job is left as it is (its state is returned)."""
        job = scheduler.cancel(user, job_id)
        return Cancelled(id=job.id, state=job.state)

    @app.get("/api/v1/jobs/{job_id}/logs", response_class=PlainTextResponse, tags=["jobs"],
             responses={**_ERRORS, 200: {"content": {"text/plain": {}}, "description": "The log text"}})
    def job_logs(job_id: int = _id(), rank: int = Query(0, ge=0, le=1 << 20),
                 stream: Literal["stdout", "stderr"] = Query("stdout"),
                 offset: int = Query(0, ge=0, description="Skip this many bytes (to follow a log)"),
                 user: str = Depends(current_user)) -> PlainTextResponse:
        """Output of one rank (empty until the rank writes). Header ``X-Log-Size`` gives the file size."""
        job = _job(user, job_id)
        if rank >= job.ranks:
            raise HTTPException(422, f"rank {rank} out of range: job {job_id} has ranks 0..{job.ranks - 1}")
        path = Path(job.log_dir) / f"rank-{rank}.{stream}"
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(16 << 20)
        except FileNotFoundError:
            data = b""
        size = offset + len(data)
        return PlainTextResponse(data.decode("utf-8", "replace"), headers={"X-Log-Size": str(size)})

    def _trace_file(user: str, job_id: int, which: str) -> Response:
        job = _job(user, job_id)
        path = job.trace_path if which == "trace" else job.summary_path
        if not path or not Path(path).exists():
            why = ("the job has not finished" if job.state in ("queued", "running") else
                   f"the job ended {job.state}; a trace is written only when every rank succeeds")
            raise HTTPException(404, f"no {which} for job {job_id}: {why}")
        return Response(Path(path).read_bytes(), media_type="application/json")

    @app.get("/api/v1/jobs/{job_id}/trace", tags=["jobs"],
             responses={**_ERRORS, 200: {"content": {"application/json": {}},
                                         "description": "Chrome/Perfetto trace JSON"}})
    def job_trace(job_id: int = _id(), user: str = Depends(current_user)) -> Response:
        """The job's gathered trace as Chrome Trace Event JSON (open in https://ui.perfetto.dev)."""
        return _trace_file(user, job_id, "trace")

    @app.get("/api/v1/jobs/{job_id}/summary", tags=["jobs"],
             responses={**_ERRORS, 200: {"content": {"application/json": {}},
                                         "description": "Per-rank compute/comm/wait and bytes matrix"}})
    def job_summary(job_id: int = _id(), user: str = Depends(current_user)) -> Response:
        """Per-rank compute / communication / wait seconds and the bytes and messages matrices."""
        return _trace_file(user, job_id, "summary")

    # -- pools --------------------------------------------------------------------------------
    @app.post("/api/v1/pools", response_model=PoolInfo, status_code=201, tags=["pools"],
              responses={**_ERRORS, 409: {"model": ErrorBody}, 501: {"model": ErrorBody}})
    def create_pool(req: PoolCreate, user: str = Depends(current_user)) -> PoolInfo:
        """Start an MPI pool of ``ranks`` engines (blocks until it runs or failed); the answer's
        ``connection`` is what ``%distributed connect`` uses."""
        return _pools().create(user, req)

    @app.get("/api/v1/pools", response_model=PoolList, tags=["pools"], responses=_ERRORS)
    def list_pools(user: str = Depends(current_user)) -> PoolList:
        """The caller's pools (real state, reconciled with the engines)."""
        return PoolList(pools=_pools().list(user))

    @app.get("/api/v1/pools/{pool_id}", response_model=PoolInfo, tags=["pools"], responses=_ERRORS)
    def get_pool(pool_id: int = _id(), user: str = Depends(current_user)) -> PoolInfo:
        """One pool with its connection info."""
        info = _pools().info(user, pool_id)
        if info is None:
            raise HTTPException(404, f"pool {pool_id} not found")
        return info

    @app.delete("/api/v1/pools/{pool_id}", response_model=PoolInfo, tags=["pools"], responses=_ERRORS)
    def delete_pool(pool_id: int = _id(), user: str = Depends(current_user)) -> PoolInfo:
        """Stop a pool (its engines end); the record stays, state ``stopped``."""
        info = _pools().delete(user, pool_id)
        if info is None:
            raise HTTPException(404, f"pool {pool_id} not found")
        return info

    return app
