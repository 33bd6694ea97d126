"""FastAPI dependencies of the controller's routes: the authenticated user and the service's parts.

* :func:`current_user`: the user owning the request's bearer token; 401 otherwise.
* :func:`get_scheduler` / :func:`get_pools`: the service's scheduler and pool
  manager (the pool manager answers 501 when pools are disabled).
* :func:`user_job` / :func:`user_pool`: the caller's record for a path id; another
  user's record is answered 404 exactly like a record that does not exist.

All of them read the :class:`Service` the application was built with
(``request.app.state.service``), so routers hold no state of their own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from fastapi import Depends, HTTPException, Path as PathParam, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .accounts import Accounts
from .auth import UNAUTHORIZED, Authenticator
from .pool_manager import PoolManager
from .records import Job, PoolRow
from .scheduler import Scheduler
from .schemas import MAX_ID


@dataclass
class Service:
    """The parts of one running controller, shared by every route."""
    auth: Authenticator
    scheduler: Scheduler
    pools: Optional[PoolManager]
    pools_error: str = "pools are disabled on this service"
    #: Which UNIX account runs each user's jobs (its mode shows on /api/health and the dashboard).
    accounts: Optional[Accounts] = None
    #: Which containment ends what a job or pool starts (:meth:`~nbmpi.server.backends.Backend.contain`).
    containment: Optional[str] = None


bearer = HTTPBearer(auto_error=False, description="Token from the service's users file")


def service(request: Request) -> Service:
    """The :class:`Service` of the application serving ``request``."""
    return request.app.state.service


def current_user(creds: Optional[HTTPAuthorizationCredentials] = Depends(bearer),
                 svc: Service = Depends(service)) -> str:
    """The user of the request's bearer token; 401 with ``WWW-Authenticate: Bearer`` otherwise."""
    user = svc.auth.user_for(creds.credentials if creds else None)
    if user is None:
        raise HTTPException(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    return user


def get_scheduler(svc: Service = Depends(service)) -> Scheduler:
    """The service's job scheduler."""
    return svc.scheduler


def get_pools(svc: Service = Depends(service)) -> PoolManager:
    """The service's pool manager; 501 when this service runs no pools."""
    if svc.pools is None:
        raise HTTPException(501, svc.pools_error)
    return svc.pools


def record_id(description: str = "Record id"):
    """A record id path parameter (a fresh instance per use: FastAPI binds it to the parameter's name)."""
    return PathParam(ge=1, le=MAX_ID, description=description)


def user_job(job_id: int = record_id("Job id"), user: str = Depends(current_user),
             scheduler: Scheduler = Depends(get_scheduler)) -> Job:
    """The caller's job ``job_id``; 404 if it does not exist or belongs to another user."""
    job = scheduler.get(user, job_id)
    if job is None:
        raise HTTPException(404, f"job {job_id} not found")
    return job


def user_pool(pool_id: int = record_id("Pool id"), user: str = Depends(current_user),
              pools: PoolManager = Depends(get_pools)) -> PoolRow:
    """The caller's pool ``pool_id``; 404 if it does not exist or belongs to another user."""
    row = pools.get(user, pool_id)
    if row is None:
        raise HTTPException(404, f"pool {pool_id} not found")
    return row
