"""The API documentation page (``GET /docs``): Swagger UI 5 served from the files of the installed
``fastapi-offline`` wheel, so the page loads nothing from outside this origin (no CDN).

:func:`mount_docs` adds ``/docs`` (the page), ``/docs/static/`` (Swagger UI's
files from the wheel: ``swagger-ui-bundle.js``, ``swagger-ui.css``, ``favicon.png``) and
``/docs/swagger-init.js`` (this package's start
script: a file, so the page's Content-Security-Policy, :data:`CSP`, needs no
inline script). The schema itself stays at ``/openapi.json``.
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

#: The docs page may load and connect to its own origin only.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
       "form-action 'self'")
INIT_JS = Path(__file__).resolve().parent / "docs_assets" / "swagger-init.js"

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title} - API</title>
<link rel="stylesheet" href="/docs/static/swagger-ui.css">
<link rel="icon" type="image/png" href="/docs/static/favicon.png">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script>
<script src="/docs/swagger-init.js"></script>
</body>
</html>
"""


def mount_docs(app: FastAPI) -> None:
    """Serve the docs page and Swagger UI's files on ``app`` (built with ``docs_url=None``)."""
    from importlib.resources import files

    app.mount("/docs/static", StaticFiles(directory=str(files("fastapi_offline") / "static")), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(_PAGE.format(title=app.title), headers={"Content-Security-Policy": CSP,
                                                                     "Cache-Control": "no-store"})

    @app.get("/docs/swagger-init.js", include_in_schema=False)
    def docs_init() -> FileResponse:
        return FileResponse(INIT_JS, media_type="text/javascript")
