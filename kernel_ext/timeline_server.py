"""The kernel's web page of its ``%%distributed`` cells and their timelines, reachable where Jupyter is.

While a pool started from the notebook (``%distributed start``) runs, the kernel serves the cells of
:class:`~nbmpi.kernel_ext.cell_log.CellLog` over HTTP on ``127.0.0.1`` at a random free port: an
index page (``/``) listing every cell, each cell's timeline page (``/cell/N``: the Bokeh figure of
``%%distributed --timeline``), its trace as Chrome Trace Event JSON (``/cell/N.json``, Perfetto
opens it) and BokehJS (``/bokeh.js``, from the installed bokeh wheel: no page loads anything from
outside). Every request must carry the server's secret key (``?key=...``, in every link the pages
make), so another user of the host cannot read the pages; a request without it gets 403.

Users on a cluster reach it through the Jupyter server (``jupyter-server-proxy``, behind Jupyter's
own login): :meth:`TimelineServer.links` gives the path under Jupyter's address
(:func:`nbmpi.workers.launch.jupyter_proxy.proxied_path`, honouring ``JUPYTERHUB_SERVICE_PREFIX``)
and the direct ``http://127.0.0.1:PORT/`` link. The pages' links are relative, so both work.

Stdlib ``http.server`` in daemon threads (the kernel's thread is never blocked by a browser);
:meth:`TimelineServer.stop` ends it (``%distributed stop`` of the last pool, unloading the
extension); at kernel exit the port closes with the process (nothing at exit waits for it, so the
pools' own exit handlers run without delay).
"""
from __future__ import annotations

import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional, Tuple
from urllib.parse import parse_qs, urlsplit

from nbmpi.workers.launch.jupyter_proxy import proxied_path

from .cell_log import CellLog, bokehjs

#: Content-Security-Policy of every page: scripts, styles and data from this server only
#: (BokehJS compiles the figure's CustomJS callbacks, hence ``unsafe-eval``).
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; connect-src 'self'; worker-src 'self' blob:")
_CELL = re.compile(r"^/cell/(\d+)(\.json)?$")


class _Handler(BaseHTTPRequestHandler):
    """One request: checks the key, then serves the index, a cell's page or trace, or BokehJS."""

    server: "_Server"

    def log_message(self, format, *args) -> None:  # noqa: A002 - no request log in the notebook's output
        return

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlsplit(self.path)
        given = parse_qs(url.query).get("key", [""])[0]
        if not secrets.compare_digest(given.encode(), self.server.key.encode()):
            self._send(403, "text/plain; charset=utf-8",
                       b"nbmpi timelines: missing or wrong ?key=; open the link that `%distributed start` or "
                       b"`%distributed status` printed in the notebook")
            return
        log, key = self.server.log, self.server.key
        path = url.path.rstrip("/") or "/"
        if path == "/":
            self._send(200, "text/html; charset=utf-8", log.index_html(key).encode())
            return
        if path == "/bokeh.js":
            self._send(200, "text/javascript; charset=utf-8", self.server.bokehjs(), cache=True)
            return
        m = _CELL.match(path)
        if m:
            n = int(m.group(1))
            if m.group(2):
                body = log.chrome_json(n)
                if body is not None:
                    self._send(200, "application/json", body,
                               extra={"Content-Disposition": f'attachment; filename="nbmpi-cell-{n}-trace.json"'})
                    return
            else:
                page = log.cell_html(n, key)
                if page is not None:
                    self._send(200, "text/html; charset=utf-8", page.encode())
                    return
        self._send(404, "text/plain; charset=utf-8",
                   f"nbmpi timelines: no page {url.path!r}; the index (../ or /) lists the cells that have a "
                   "timeline".encode())

    def _send(self, code: int, ctype: str, body: bytes, cache: bool = False, extra: Optional[dict] = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "private, max-age=3600" if cache else "no-store")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("Referrer-Policy", "no-referrer")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, log: CellLog, key: str):
        super().__init__(addr, _Handler)
        self.log = log
        self.key = key
        self._js: Optional[bytes] = None
        self._js_lock = threading.Lock()

    def bokehjs(self) -> bytes:
        with self._js_lock:
            if self._js is None:
                self._js = bokehjs()
            return self._js


class TimelineServer:
    """The HTTP server of one kernel's :class:`CellLog`. The kernel's thread calls :meth:`start`
    (non-blocking: binds ``host`` at a free port and serves from a daemon thread) and :meth:`stop`
    (blocks until the serving thread has ended and the port is closed)."""

    def __init__(self, log: CellLog, host: str = "127.0.0.1"):
        self.log = log
        self.host = host
        self.key = secrets.token_urlsafe(24)
        self._srv: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        """The TCP port served (only while running)."""
        if self._srv is None:
            raise RuntimeError("the timelines server is not running; start() it first")
        return self._srv.server_address[1]

    @property
    def running(self) -> bool:
        return self._srv is not None

    def start(self) -> "TimelineServer":
        """Serve (idempotent); returns ``self``."""
        if self._srv is None:
            self._srv = _Server((self.host, 0), self.log, self.key)
            self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.2},
                                            name="nbmpi-timelines", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port (idempotent)."""
        srv, self._srv = self._srv, None
        if srv is None:
            return
        srv.shutdown()
        srv.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def links(self) -> Tuple[str, str]:
        """``(path under Jupyter's address through jupyter-server-proxy, direct URL on this host)``
        of the index page, both with the key."""
        q = f"?key={self.key}"
        return proxied_path(self.port, q), f"http://{self.host}:{self.port}/{q}"

    def describe(self) -> str:
        """The line the notebook prints: where this kernel's cell timelines are."""
        proxied, direct = self.links()
        return (f"cell timelines: {proxied} under Jupyter's address (jupyter-server-proxy), "
                f"or {direct} on this host")
