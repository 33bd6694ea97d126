"""The controller's FastAPI application: its parts wired together, the routers included.

:func:`create_app` builds the application for one data directory: the SQLite
records, the rank ledger, the backend (``local`` unless told otherwise), the
scheduler and the pool manager; they start and stop with the application's
lifespan. The routes live in :mod:`nbmpi.server.routers` (one router per
resource) and get the user and the service's parts through
:mod:`nbmpi.server.dependencies`.

Every endpoint except ``GET /api/health``, ``GET /api/version`` and the
dashboard's page shell and assets (:mod:`nbmpi.server.routers.dashboard`: they
hold no data) needs ``Authorization: Bearer TOKEN``; a missing or unknown token
is answered 401.
A user only sees their own jobs and pools: another user's id is answered 404,
exactly like an id that does not exist. Malformed requests are answered 4xx
with the reason (422 for bad fields or JSON, 413 for oversized bodies).
The token and the body's size are checked before the body is read
(:mod:`nbmpi.server.middleware`); every answer carries the security headers.
``/docs`` is Swagger UI served from this service itself (:mod:`nbmpi.server.docs_page`).
"""
from __future__ import annotations

import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Optional

from fastapi import FastAPI

from . import docs_page, errors
from .accounts import Accounts
from .auth import Authenticator
from .backends import make_backend
from .config import MAX_CODE_BYTES
from .dependencies import Service
from .ledger import RankLedger
from .middleware import RequestGuard, SecurityHeaders
from .pool_manager import PoolManager
from .records import make_engine, session_factory
from .routers import dashboard, jobs, pools, service
from .scheduler import Scheduler
from .trace_index import INDEXER
from .schemas import RANKS_OR_POOL

#: Seconds a thread runs Python before it hands the GIL to another one waiting (Python's default is
#: 5 ms): the event loop waiting behind a trace thread drawing a figure gets it back within this, so
#: ``/api/health`` (a dozen GIL handovers) answers in milliseconds while the dashboard's work runs.
SWITCH_INTERVAL_S = 0.0005
#: Largest request body accepted (bytes); the code limit plus room for the other fields.
MAX_BODY_BYTES = MAX_CODE_BYTES * 2 + 65536


def create_app(data_dir: Path, max_ranks: Optional[int], users_path: Optional[Path] = None,
               db_path: Optional[Path] = None, enable_pools: bool = True, backend: str = "local",
               backend_options: Optional[dict] = None, max_log_bytes: Optional[int] = None,
               accounts: Optional[Accounts] = None) -> FastAPI:
    """The application serving ``data_dir`` (already created) with at most ``max_ranks`` ranks in use.

    ``backend`` names where jobs and pools run (:mod:`nbmpi.server.backends`);
    ``max_ranks`` may be None when the backend queues work itself;
    ``max_log_bytes`` caps the output kept per rank and stream of a job;
    ``accounts`` says which UNIX account runs each user's jobs and pools
    (:meth:`nbmpi.server.accounts.Accounts.load`; default: loaded from the users
    file, refusing several users in one account). The
    scheduler and the pool manager start with the application's lifespan and
    stop with it: jobs still followed are then ended and recorded ``lost``.
    """
    data_dir = Path(data_dir)
    users_path = Path(users_path or data_dir / "users.json")
    accounts = accounts or Accounts.load(users_path)
    engine = make_engine(db_path or data_dir / "nbmpi.db")
    sessions = session_factory(engine)
    runner = make_backend(backend, **(backend_options or {}))
    containment = runner.contain(data_dir)
    ledger = RankLedger(runner.capacity(max_ranks))
    pool_manager = PoolManager(sessions, data_dir, runner, ledger, max_ranks, accounts=accounts) \
        if enable_pools else None
    scheduler = Scheduler(sessions, data_dir, runner, ledger, max_ranks, pools=pool_manager,
                          max_log_bytes=max_log_bytes, accounts=accounts)
    svc = Service(auth=Authenticator(users_path), scheduler=scheduler, pools=pool_manager, accounts=accounts,
                  containment=containment)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        switch = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        if pool_manager is not None:
            pool_manager.start()
        INDEXER.accept_builds()   # (after an earlier service of this process ended them)
        scheduler.start()
        runner.sweep()   # what a previous run left that no recovered pool or job uses
        dashboard.start_warm_up()   # Bokeh's imports now, not in a user's first figure
        _prepare_routes(app.router.routes)   # before the first request: it would pay it on the event loop
        try:
            yield
        finally:
            scheduler.stop()
            INDEXER.end_builds()   # none may outlive the service, and none starts from now on
            if pool_manager is not None:
                pool_manager.stop()
            runner.close()
            engine.dispose()
            sys.setswitchinterval(switch)

    app = FastAPI(title="nbmpi controller", version=service.package_version(), lifespan=lifespan,
                  docs_url=None, redoc_url=None,
                  description="Pools and jobs on MPI ranks, per user. Authenticate with "
                              "`Authorization: Bearer TOKEN` (your token, shown once when it was made: "
                              "`nbmpi serve` on first start or `nbmpi users add NAME`).")
    app.state.service = svc
    # the last added is the outermost: headers on every answer, the guard before any body is read
    app.add_middleware(RequestGuard, auth=svc.auth, max_body=MAX_BODY_BYTES)
    app.add_middleware(SecurityHeaders, policies={"/dashboard": dashboard.CSP, "/docs": docs_page.CSP})

    errors.install(app, data_dir)

    app.include_router(service.router)
    app.include_router(jobs.router)
    app.include_router(pools.router)
    app.include_router(dashboard.router)
    app.include_router(dashboard.pages)
    dashboard.mount_assets(app)
    docs_page.mount_docs(app)
    _document_limits(app, max_ranks)
    return app


def _prepare_routes(routes) -> int:
    """Build now what FastAPI builds for each included router on its first request (each route's
    parameter and response adapters: some 0.2 s of pydantic for this application, which would run on the
    event loop in the middle of serving). FastAPI versions without this lazy step have no
    ``effective_candidates`` and nothing is done. Returns how many included routers were prepared."""
    n = 0
    for route in routes:
        for name in ("effective_candidates", "effective_low_priority_routes"):
            build = getattr(route, name, None)
            if callable(build):
                n += _prepare_routes(build()) + (name == "effective_candidates")
    return n


def _document_limits(app: FastAPI, max_ranks: Optional[int]) -> None:
    """Put this service's own limits into its OpenAPI schema (``ranks`` at most ``--max-ranks``),
    so a request valid by the schema is one the service accepts."""
    from fastapi.openapi.utils import get_openapi

    def openapi():
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schemas = spec.get("components", {}).get("schemas", {})
            upload = schemas.get("Body_submit_job_upload_api_v1_jobs_upload_post")
            if upload is not None:   # as JobCreate: ranks, pool or both
                upload["anyOf"] = RANKS_OR_POOL
            if max_ranks is not None:
                for model in ("JobCreate", "PoolCreate", "Body_submit_job_upload_api_v1_jobs_upload_post"):
                    field = schemas.get(model, {}).get("properties", {}).get("ranks")
                    for branch in [field, *((field or {}).get("anyOf") or [])] if field else []:
                        if branch.get("type") == "integer":
                            branch["maximum"] = max_ranks
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi
