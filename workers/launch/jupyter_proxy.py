"""Links to a local web server through the Jupyter server the user already reaches.

On a cluster, users reach Jupyter through JupyterHub or one SSH tunnel, not the ports of the
services a notebook starts. ``jupyter-server-proxy`` (a Jupyter server extension, installed with
nbmpi) forwards ``<base_url>proxy/<port>/<path>`` to ``http://localhost:<port>/<path>`` on the host of
the Jupyter server, HTTP and websockets, behind Jupyter's own login. This is how Dask's dashboard is
reached (``/proxy/8787/status``); the nbmpi controller's dashboard (``nbmpi serve``) and a pool's Dask
dashboard are reached the same way (the controller's pages use relative links, so they work under the
proxy's prefix).

The Jupyter server's base URL is not known inside a kernel in general; JupyterHub passes it to the
single-user server and its kernels as ``JUPYTERHUB_SERVICE_PREFIX`` (e.g. ``/user/alice/``), which
:func:`proxied_path` uses; otherwise the path is relative to the server's root (``/``), which is the
default base URL of ``jupyter lab`` / ``jupyter server``. Pure functions, no I/O.
"""
from __future__ import annotations

import os
from typing import Optional

#: Environment variable with the Jupyter server's base URL under JupyterHub (set for the kernels too).
HUB_PREFIX_ENV = "JUPYTERHUB_SERVICE_PREFIX"


def base_url(explicit: Optional[str] = None) -> str:
    """The Jupyter server's base URL, with a leading and a trailing ``/``: ``explicit`` if given, else
    ``$JUPYTERHUB_SERVICE_PREFIX``, else ``/``."""
    url = explicit if explicit is not None else os.environ.get(HUB_PREFIX_ENV) or "/"
    return "/" + url.strip("/") + "/" if url.strip("/") else "/"


def proxied_path(port: int, path: str = "", base: Optional[str] = None) -> str:
    """The path (on the Jupyter server) that ``jupyter-server-proxy`` forwards to
    ``http://localhost:PORT/PATH``, e.g. ``proxied_path(8787, "status") == "/proxy/8787/status"``."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"a TCP port is a whole number in 1..65535, got {port!r}")
    return f"{base_url(base)}proxy/{port}/{path.lstrip('/')}"
