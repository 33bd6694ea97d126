"""Routes of the service itself: liveness and version (the only routes without a token)."""
from __future__ import annotations

from fastapi import APIRouter, Depends

from ..dependencies import Service, service
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


@router.get("/health", response_model=Health)
def health(svc: Service = Depends(service)) -> Health:
    """Liveness and how users are isolated (an unsafe shared account says so); no token needed."""
    accounts = svc.accounts
    if accounts is None:
        return Health(status="ok")
    mode, warning = accounts.state()
    return Health(status="ok", isolation=mode, warning=warning)


@router.get("/version", response_model=Version)
def version() -> Version:
    """Service and API version; no token needed."""
    return Version(version=package_version(), api=API_VERSION)
