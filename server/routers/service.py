"""Routes of the service itself: liveness and version (the only routes without a token)."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Request

from ..schemas import Health, Version

API_VERSION = "v1"

router = APIRouter(prefix="/api", tags=["service"])


def package_version() -> str:
    """The installed nbmpi version ("0+unknown" when not installed as a distribution)."""
    try:
        from importlib.metadata import version

        return version("nbmpi")
    except Exception:  # noqa: BLE001
        return "0+unknown"


#: The one thread that re-reads the users file for /api/health when it changed: never the pool other
#: routes (or the dashboard's trace work) keep busy.
_HEALTH_THREAD = ThreadPoolExecutor(1, thread_name_prefix="nbmpi-health")


@router.get("/health", response_model=Health)
async def health(request: Request) -> Health:
    """Liveness, how users are isolated (an unsafe shared account says so) and which containment ends
    what a job starts (one phrase); no token needed.

    On the event loop, with no thread in between while the users file is unchanged (one ``stat``):
    a hop to a thread and back costs two more wakeups, each of which waits for a CPU on a loaded
    machine. Only a changed users file is re-read, on a thread of its own."""
    svc = request.app.state.service
    if svc.accounts is None:
        return Health(status="ok", containment=svc.containment)
    state = svc.accounts.state_if_current()
    if state is None:
        state = await asyncio.get_running_loop().run_in_executor(_HEALTH_THREAD, svc.accounts.state)
    mode, warning = state
    return Health(status="ok", isolation=mode, warning=warning, containment=svc.containment)


@router.get("/version", response_model=Version)
def version() -> Version:
    """Service and API version; no token needed."""
    return Version(version=package_version(), api=API_VERSION)
