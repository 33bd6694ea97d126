"""Error answers of the controller: one documented shape for every error, and the handlers that make it so.

Every error answer is :class:`~nbmpi.server.schemas.ErrorBody` as JSON:
``{"detail": "<what was wrong and what to do>"}``, plus ``"errors": [{"loc",
"msg", "type"}, ...]`` for invalid fields (422). :func:`install` registers the
handlers that turn FastAPI's and Starlette's own errors (validation, unparsable
bodies, wrong methods) into that shape; a 405 carries an ``Allow`` header
naming every method the path supports. :data:`DOCUMENTED` is what each route
declares in the OpenAPI schema, so the schema and the answers agree.
"""
from __future__ import annotations

from typing import Any, Dict, List, Set

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from .schemas import ErrorBody
from .text import printable

#: Error answers every authenticated route may give (all with the ErrorBody shape).
DOCUMENTED: Dict[int, Dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "The request body cannot be parsed (e.g. not UTF-8 JSON)"},
    401: {"model": ErrorBody, "description": "Missing or unknown bearer token"},
    404: {"model": ErrorBody, "description": "No such record of this user (another user's id is answered the same)"},
    413: {"model": ErrorBody, "description": "The request body is larger than the service accepts"},
    422: {"model": ErrorBody, "description": "Invalid fields (each one in `errors`) or a value this service "
                                             "cannot honour (e.g. more ranks than --max-ranks)"},
    503: {"model": ErrorBody, "description": "The service cannot write its records or files now (its data "
                                             "directory is read-only or full); nothing was recorded: retry later"},
}


def storage_detail(exc: BaseException, data_dir) -> str:
    """What to tell a client when the records or files could not be written."""
    return (f"the service cannot write its records or files now ({type(exc).__name__}: {exc}); nothing was "
            f"recorded. Its data directory {data_dir} must be writable and have free space; retry when it is")


class RequestError(Exception):
    """A request the service cannot honour; answered ``status`` with ``message`` as the detail
    (raised by the scheduler and the pool manager, turned into an answer by :func:`install`)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def error(status: int, detail: str, headers: Dict[str, str] = None, errors: List[dict] = None) -> JSONResponse:
    """An error answer of the one documented shape."""
    body = ErrorBody(detail=printable(detail), errors=errors).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, headers=headers)


def _field(err: dict) -> dict:
    return {"loc": [x if isinstance(x, int) else printable(str(x)) for x in err.get("loc", ())],
            "msg": printable(str(err.get("msg", ""))), "type": str(err.get("type", ""))}


#: Methods a 405 answer may name in ``Allow``.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed(app: FastAPI, request: Request) -> Set[str]:
    """The methods some route of ``app`` answers on the request's path (tried one by one, since routes
    of included routers do not list their methods); static file mounts answer GET and HEAD."""
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles

    methods: Set[str] = set()
    # a fresh scope: the one of the request was rewritten by the routes it went through
    scope = {"type": "http", "path": request.url.path, "root_path": "", "method": request.method,
             "headers": [], "query_string": b""}
    for route in app.router.routes:
        if isinstance(route, Mount) and isinstance(route.app, StaticFiles):
            if route.matches(scope)[0] == Match.FULL:
                methods |= {"GET", "HEAD"}
            continue
        for method in _METHODS:
            if method not in methods and route.matches(dict(scope, method=method))[0] == Match.FULL:
                methods.add(method)
    if "GET" in methods:
        methods.add("HEAD")
    return methods


def install(app: FastAPI, data_dir=None) -> None:
    """Answer every error of ``app`` with :class:`ErrorBody` (storage failures as 503)."""
    from sqlalchemy.exc import DBAPIError, OperationalError

    @app.exception_handler(OperationalError)
    @app.exception_handler(DBAPIError)
    @app.exception_handler(OSError)
    async def storage(_request: Request, exc: Exception):
        return error(503, storage_detail(exc, data_dir), headers={"Retry-After": "10"})

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError):
        fields = [_field(e) for e in exc.errors()]
        where = "; ".join(f"{'.'.join(str(x) for x in f['loc'])}: {f['msg']}" for f in fields[:5])
        more = f" (and {len(fields) - 5} more)" if len(fields) > 5 else ""
        return error(422, f"invalid request: {where}{more}", errors=fields)

    @app.exception_handler(RequestError)
    async def refused(_request: Request, exc: RequestError):
        return error(exc.status, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        headers = dict(exc.headers or {})
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 405:
            allow = sorted(_allowed(app, request))
            headers["Allow"] = ", ".join(allow)
            detail = (f"method {request.method} is not allowed on {printable(request.url.path)}; use "
                      f"{' or '.join(allow) if allow else 'another path'}")
        return error(exc.status_code, detail, headers=headers or None)
