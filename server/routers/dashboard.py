"""Routes of the dashboard: its page and assets, and the data of a job's timeline figure.

* ``GET /`` redirects to ``/dashboard``; ``GET /dashboard`` (pools and jobs) and
  ``GET /dashboard/jobs/{id}`` (one job) answer the same page shell: it holds no data and needs no
  token; its script asks for the token (login form, kept for the tab in ``sessionStorage``, or a
  ``#token=...`` link that it moves there) and sends it as ``Authorization: Bearer`` to the REST
  API and to the data endpoints below.
* Assets come from the installed package, never from the network: ``/dashboard/static/`` (this
  package's ``dashboard_assets``) and ``/dashboard/bokeh/static/`` (BokehJS from the bokeh wheel),
  see :func:`mount_assets`. The page is served with a Content-Security-Policy allowing only this
  origin.
* Every URL of the page (assets, REST calls, links) is relative: the page names the controller's
  root relative to its own address (``<meta name="nbmpi-root" content="../../">`` for
  ``/dashboard/jobs/7``), so the controller also works under a proxy's prefix, e.g. through the
  Jupyter server with ``jupyter-server-proxy`` at ``<base_url>proxy/PORT/dashboard``
  (:mod:`nbmpi.workers.launch.jupyter_proxy`), and the ``/`` redirect is relative too.
* ``GET /api/v1/dashboard/me``: the token's user (the page's login check);
  ``GET /api/v1/dashboard/jobs/{id}/figure``: the job's Bokeh figure (JSON item) and its data;
  ``GET /api/v1/dashboard/jobs/{id}/timeline``: the data of one time window at one pixel width
  (level of detail) and ``since``: the last version the page has, answered ``unchanged`` when
  nothing new was streamed; ``GET /api/v1/dashboard/jobs/{id}/trace.npz``: the streamed trace
  itself (:meth:`Trace.load` reads it).

The data of a running job come from the ranks' streamed trace files (:mod:`nbmpi.workers.tracing.stream`)
joined on demand and kept per job until they change (up to :data:`LIVE_EVENTS_LIMIT` events); a finished
job's from its trace index (:mod:`nbmpi.workers.tracing.index`, built once when it ended, each window's
rows read in bounded pieces, never memory-mapped, so the controller holds what a window shows, not the
index); both drawn by :mod:`nbmpi.workers.tracing.timeline` (the figure module the notebook uses too;
the last few figures' Bokeh items are kept, :data:`ITEMS`). The work runs on the trace threads of
:data:`~nbmpi.server.trace_index.INDEXER`, never on the event loop or the pool other routes use. Trace files that are not what the ranks write are answered
``available: false`` with a reason starting ``trace unreadable:``. Every data endpoint needs the bearer
token; another user's job is 404.
"""
from __future__ import annotations

import gc
import html
import io
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Optional, Tuple

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
import numpy as np

from nbmpi.workers.tracing import timeline
from nbmpi.workers.tracing.analysis import Trace
from nbmpi.workers.tracing.records import kind_names
from nbmpi.workers.tracing.tracer import FIELDS
from nbmpi.workers.tracing import stream as trace_stream

from ..dependencies import current_user, user_job
from ..errors import DOCUMENTED
from ..records import FINAL_JOB_STATES, Job
from ..schemas import JobFigure, Me, TimelineWindow
from ..trace_index import INDEXER

ASSETS = Path(__file__).resolve().parent.parent / "dashboard_assets"
#: Where BokehJS is served from (the page's script tags point there).
BOKEH_ROOT = "/dashboard/bokeh/"
#: The page may load and connect to its own origin only (plus data:/blob: images, Bokeh's styles).
CSP = ("default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
       "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")

pages = APIRouter(include_in_schema=False)
router = APIRouter(prefix="/api/v1/dashboard", tags=["dashboard"], responses=DOCUMENTED)


def bokeh_scripts(root: str = "/") -> list:
    """URLs of the BokehJS files the page loads (core and WebGL), under :data:`BOKEH_ROOT`; ``root``:
    the controller's root as the page reaches it (``"/"``, or relative, e.g. ``"../"``)."""
    from bokeh.resources import Resources

    return Resources(mode="server", root_url=root + BOKEH_ROOT.lstrip("/"), components=["bokeh", "bokeh-gl"]).js_files


def mount_assets(app: FastAPI) -> None:
    """Serve the dashboard's own files and BokehJS (from the installed wheel) on ``app``."""
    from bokeh.util.paths import bokehjs_path

    app.mount("/dashboard/static", StaticFiles(directory=ASSETS), name="dashboard-static")
    app.mount(BOKEH_ROOT + "static", StaticFiles(directory=bokehjs_path()), name="bokehjs")


_PAGES: dict = {}


def relative_root(request: Request) -> str:
    """The controller's root relative to the requested page: ``"./"`` for ``/dashboard``, ``"../"``
    for ``/dashboard/``, ``"../../"`` for ``/dashboard/jobs/7`` (a mount's ``root_path`` excluded)."""
    path, root_path = request.url.path, request.scope.get("root_path", "")
    if root_path and path.startswith(root_path):
        path = path[len(root_path):]
    depth = path.count("/") - 1
    return "../" * depth if depth > 0 else "./"


def _page(request: Request) -> HTMLResponse:
    """The page shell (its URLs relative to the requested page, so it also works under a proxy's
    prefix), with the service's isolation warning (an unsafe shared account) on top."""
    root = relative_root(request)
    page = _PAGES.get(root)
    if page is None:
        tags = "\n".join(f'<script src="{u}"></script>' for u in bokeh_scripts(root))
        page = _PAGES[root] = ((ASSETS / "index.html").read_text().replace("<!-- BOKEH -->", tags)
                               .replace("{{ROOT}}", root))
    accounts = getattr(request.app.state.service, "accounts", None)
    warning = accounts.warning() if accounts is not None else None
    if warning:
        page = page.replace(
            "<main>", f'<main>\n  <p id="isolation-warning" class="error" role="alert">{html.escape(warning)}</p>', 1)
    return HTMLResponse(page, headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store",
                                        "Referrer-Policy": "no-referrer", "X-Content-Type-Options": "nosniff"})


@pages.get("/")
def root() -> RedirectResponse:
    """The dashboard (a relative redirect, so it also works under a proxy's prefix)."""
    return RedirectResponse("dashboard")


@pages.get("/dashboard")
@pages.get("/dashboard/")
def dashboard(request: Request) -> HTMLResponse:
    """The page shell (pools and jobs); data need the token."""
    return _page(request)


@pages.get("/dashboard/jobs/{job_id}")
def dashboard_job(job_id: int, request: Request) -> HTMLResponse:  # noqa: ARG001 - the page reads the id from its URL
    """The page shell of one job; data need the token."""
    return _page(request)


@router.get("/me", response_model=Me)
def me(user: str = Depends(current_user)) -> Me:
    """The user of the token (the page's login check)."""
    return Me(user=user)


# -- the joined trace of a running job, kept until its files change ------------------------------
#: A running job whose stream files hold more events than this is not joined in the controller
#: (its timeline is drawn from the index built when it ends); where its ranks wait is still said.
LIVE_EVENTS_LIMIT = 1_000_000


@dataclass
class _Entry:
    sig: tuple
    jt: trace_stream.JobTrace
    cols: timeline.TimelineColumns
    an: dict


class TraceCache:
    """The last joined trace, columns and analysis of a few running jobs (thread-safe, least
    recently used out)."""

    def __init__(self, size: int = 4):
        self.size = size
        self._lock = threading.Lock()
        self._entries: "OrderedDict[str, _Entry]" = OrderedDict()

    def get(self, job: Job) -> Optional[_Entry]:
        """The entry of ``job`` (rebuilt if a rank wrote since); None when nothing was streamed.
        Raises :class:`~nbmpi.workers.tracing.stream.TraceUnreadable` for files the ranks did not write."""
        trace_dir = Path(job.job_dir) / "trace"
        key = str(trace_dir)
        sig = trace_stream.signature(trace_dir, job.ranks)
        with self._lock:
            e = self._entries.get(key)
            if e is not None and e.sig == sig:
                self._entries.move_to_end(key)
                return e
        jt = trace_stream.read_job_trace(trace_dir, job.ranks)
        if jt is None:
            return None
        window = (jt.start_ns, jt.now_ns)
        waits = jt.waits()
        cols = timeline.timeline_columns(jt.trace, window=window, blocked=waits)
        e = _Entry(sig, jt, cols, timeline.analysis(jt.trace, window=window, open_waits=waits))
        with self._lock:
            self._entries[key] = e
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return e


CACHE = TraceCache()


@dataclass
class _Source:
    """What a window is drawn from: a running job's joined trace or a finished job's index."""
    version: int
    view: Callable[..., dict]
    waits: list
    an: dict


def _no_trace(job: Job) -> str:
    if job.state == "queued":
        return "the job has not started yet"
    if job.state == "running":
        return "no rank has streamed its trace yet"
    return "no trace was streamed for this job (tracing off, or the ranks ended before they started)"


def _unreadable(reason: str) -> str:
    return f"trace unreadable: {reason}"


def _live_rows(trace_dir: Path, nranks: int) -> int:
    rows = 0
    for r in range(nranks):
        try:
            rows += trace_stream.events_path(trace_dir, r).stat().st_size // (8 * trace_stream.NF)
        except FileNotFoundError:
            pass
    return rows


def _live_source(job: Job) -> Tuple[Optional[_Source], Optional[str]]:
    """A running job's source (on the trace threads), or None and why there is none."""
    trace_dir = Path(job.job_dir) / "trace"
    rows = _live_rows(trace_dir, job.ranks)
    if rows > LIVE_EVENTS_LIMIT:
        return None, (f"the job has streamed {rows:,} events: too many to draw while it runs; its timeline "
                      "is drawn from an index when it ends")
    try:
        e = CACHE.get(job)
    except trace_stream.TraceUnreadable as exc:
        return None, _unreadable(str(exc))
    if e is None:
        return None, _no_trace(job)
    return _Source(e.jt.version, e.cols.view, e.jt.waits(), e.an), None


async def _source(job: Job, wait_s: float = 20.0) -> Tuple[Optional[_Source], Optional[str]]:
    """Where ``job``'s windows come from, or None and the reason. The work runs on the trace threads."""
    if job.state == "queued":
        return None, _no_trace(job)
    if job.state not in FINAL_JOB_STATES:
        return await INDEXER.call(_live_source, job)
    trace_dir = Path(job.job_dir) / "trace"
    ix = await INDEXER.index(trace_dir, job.ranks, wait_s)
    if ix is None:
        if INDEXER.building(trace_dir):
            return None, "the trace is being indexed; the page asks again in a moment"
        return None, _no_trace(job)
    if not ix.readable:
        return None, _unreadable(ix.reason or "unknown reason")
    return _Source(ix.version, ix.view, ix.waits, ix.analysis), None


def _window(job: Job, src: Optional[_Source], why: Optional[str], start: Optional[float], end: Optional[float],
            width: int, since: Optional[int]) -> Tuple[dict, Optional[dict]]:
    """The answer about one window of ``job`` (and the view it was made of, None if none was made)."""
    live = job.state not in FINAL_JOB_STATES
    base: dict = dict(job=job.id, state=job.state, live=live)
    if src is None:
        return dict(base, available=False, reason=why), None
    base.update(available=True, version=src.version)
    if since is not None and since == src.version:
        return dict(base, unchanged=True), None
    view = src.view(start, end, width=width)
    waits = src.waits
    blocked = timeline.blocked_sentences(waits, job.ranks)
    if not live and blocked:
        blocked = [f"when the job ended, {s}" for s in blocked]
    an = {k: v for k, v in src.an.items() if k != "straggler"}
    return dict(base, meta=view["meta"], sources=timeline.figure_sources(view, src.an),
                sentence=src.an["straggler"]["sentence"], straggler=src.an["straggler"], blocked=blocked, waits=waits,
                analysis=an), view


Width = Query(1200, ge=0, le=20000, description="Plot width in pixels (level of detail); 0 merges nothing")


class _Items:
    """The last few figures' Bokeh items (as JSON), by job, trace version and backend (making one
    costs Bokeh most of a second; a finished job's never changes). Thread-safe, least recently used out."""

    def __init__(self, size: int = 4):
        self.size = size
        self._lock = threading.Lock()
        self._items: "OrderedDict[tuple, dict]" = OrderedDict()

    def get(self, key: tuple, make: Callable[[], str]) -> str:
        """The item of ``key``, made with ``make()`` (outside the lock) when it is not kept."""
        with self._lock:
            item = self._items.get(key)
            if item is not None:
                self._items.move_to_end(key)
                return item
        item = make()
        with self._lock:
            self._items[key] = item
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return item


ITEMS = _Items()


#: Longest list encoded by one call of the C JSON encoder in :func:`_dumps` (about a millisecond of floats).
JSON_PIECE = 2000
_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                           default=lambda v: v.item() if hasattr(v, "item") else str(v)).encode


def _dumps(value) -> str:
    """Compact JSON as Starlette's JSONResponse writes it (NumPy scalars as their Python values), encoded
    in pieces: dicts with string keys part by part, lists :data:`JSON_PIECE` items at a time. One call of
    the C encoder holds the GIL to its end (100 ms and more for a window's columns of floats), which would
    delay the event loop and ``/api/health``; between the pieces the GIL can pass to them."""
    out: list = []
    _encode_into(value, out)
    return "".join(out)


def _encode_into(value, out: list) -> None:
    if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
        out.append("{")
        for i, (k, v) in enumerate(value.items()):
            out.append(("," if i else "") + _ENCODE(k) + ":")
            _encode_into(v, out)
        out.append("}")
    elif isinstance(value, (list, tuple)) and len(value) > JSON_PIECE:
        out.append("[")
        for i in range(0, len(value), JSON_PIECE):
            piece = value[i:i + JSON_PIECE]
            if any(isinstance(x, (dict, list, tuple)) for x in piece):
                for j, x in enumerate(piece):
                    out.append("," if i or j else "")
                    _encode_into(x, out)
            else:
                out.append(("," if i else "") + _ENCODE(list(piece))[1:-1])
        out.append("]")
    else:
        out.append(_ENCODE(value))


def _json(model, out: dict, item_json: Optional[str] = None) -> Response:
    """``out`` as the JSON FastAPI makes of it with ``model`` (its fields in order, defaults filled, no
    others), serialised here, on the calling (trace) thread, not on the event loop; ``item_json``:
    the last field, ``item``, already serialised. The dicts are the routes' own: not validated again."""
    body = {name: out[name] if name in out else f.get_default(call_default_factory=True)
            for name, f in model.model_fields.items() if name != "item" or item_json is None}
    text = _dumps(body)
    if item_json is not None:
        text = text[:-1] + ',"item":' + item_json + "}"
    return Response(text.encode(), media_type="application/json")


#: The figure's sources sent in ``sources`` only, not also inside its Bokeh item (the page sets them).
_BULK_SOURCES = ("segments", "arrows", "heads")


def _figure(job: Job, src: Optional[_Source], why: Optional[str], width: int, backend: str) -> Response:
    out, view = _window(job, src, why, None, None, width, None)
    item = None
    if view is not None:
        # the item is the layout (lanes, ranges, tools, the small matrix and fractions); its timeline
        # sources are empty and the page fills them from `sources`, so it is one per trace version and
        # backend whatever the width (it stretches to the page)
        bare = dict(view, **{k: {c: [] for c in view[k]} for k in _BULK_SOURCES})
        key = (job.id, job.state, src.version, backend)
        item = ITEMS.get(key, lambda: _dumps(timeline.bokeh_item(
            bare, src.an, width=max(width, 600), backend=backend, x_label="seconds since the job's ranks started")))
    return _json(JobFigure, out, item)


def warm_up() -> None:
    """Import Bokeh and make one (empty) figure item through :func:`_figure`'s own code path, so that
    Bokeh's imports and first-use set-up (seconds of Python, much of it under the GIL in long calls that
    delay every other thread, the event loop's too) happen when the controller starts, not during a
    user's first figure; then moves every object made so far out of the cyclic collector's reach
    (``gc.freeze``). Blocking; :func:`start_warm_up` runs it on a thread."""
    trace = Trace(np.zeros((0, len(FIELDS)), np.int64), np.zeros(0, np.int64), 2, kind_names())
    cols = timeline.timeline_columns(trace)
    _dumps(timeline.bokeh_item(cols.view(width=600), timeline.analysis(trace), width=600, backend="canvas",
                               x_label="seconds since the job's ranks started"))
    # The objects made so far (the application, SQLAlchemy's and Bokeh's models: hundreds of thousands)
    # live as long as the process. Out of the collector's reach, a full collection, which a thread
    # allocating for a window may start and which holds the GIL to its end, walks only what came later
    # (it walked them all in 100-300 ms, the event loop waiting).
    gc.collect()
    gc.freeze()


def start_warm_up() -> threading.Thread:
    """Start :func:`warm_up` on a daemon thread (named ``nbmpi-dashboard-warm-up``); returns it. Non-blocking."""
    th = threading.Thread(target=warm_up, name="nbmpi-dashboard-warm-up", daemon=True)
    th.start()
    return th


@router.get("/jobs/{job_id}/figure", response_model=JobFigure)
async def job_figure(job: Job = Depends(user_job), width: int = Width,
                     backend: Literal["webgl", "canvas"] = Query("canvas", description="How the timeline is drawn")
                     ) -> Response:
    """The job's timeline figure (Bokeh JSON item: ``Bokeh.embed.embed_item``) over the whole run,
    with the data of :func:`job_timeline`: the item's timeline sources (``nbmpi_segments``,
    ``nbmpi_arrows``, ``nbmpi_heads``) are empty, set them from ``sources`` once it is embedded (the
    dashboard does); its width is where it starts, it stretches to the page. ``available`` false
    with the ``reason`` when there is no trace (``trace unreadable: ...`` when its files are not what
    the ranks write). A finished job's figure comes from its trace index (built once when it ended)."""
    src, why = await _source(job)
    return await INDEXER.call(_figure, job, src, why, width, backend)


@router.get("/jobs/{job_id}/timeline", response_model=TimelineWindow)
async def job_timeline(job: Job = Depends(user_job),
                       start: Optional[float] = Query(None, ge=0, le=1e9, allow_inf_nan=False,
                                                      description="Window start, seconds from the job's start"),
                       end: Optional[float] = Query(None, ge=0, le=1e9, allow_inf_nan=False,
                                                    description="Window end, seconds from the job's start"),
                       width: int = Width,
                       since: Optional[int] = Query(None, ge=0, le=2**32, description="The version the page has: "
                                                    "answered unchanged while it is current")) -> Response:
    """One window ``[start, end]`` of the job's timeline (default the whole run) at ``width`` pixels:
    the columns of the figure's sources, the analysis (waits still open counted up to now, or up to
    the job's end), and where the ranks wait now."""
    src, why = await _source(job)
    return await INDEXER.call(_window_json, job, src, why, start, end, width, since)


def _window_json(job: Job, *args) -> Response:
    return _json(TimelineWindow, _window(job, *args)[0])


def _npz(job: Job) -> Tuple[object, int, int]:
    """The trace file (a path, or bytes for a running job) and its window (ns)."""
    trace_dir = Path(job.job_dir) / "trace"
    if job.state in FINAL_JOB_STATES:
        ix = INDEXER.open(trace_dir)
        if ix is None or not ix.readable:
            raise HTTPException(404, f"no trace for job {job.id}: " + (
                _unreadable(ix.reason or "") if ix is not None else _no_trace(job)))
        path = ix.path / "trace.npz"
        if not path.exists():
            tmp = ix.path / f".trace.{threading.get_ident()}.npz"
            ix.save_npz(tmp)
            tmp.replace(path)
        origin = int(ix.meta["origin_ns"])
        return path, origin, origin + int(round(float(ix.meta["duration_s"]) * 1e9))
    src, why = _live_source(job)
    if src is None:
        raise HTTPException(404, f"no trace for job {job.id}: {why}")
    e = CACHE.get(job)
    buf = io.BytesIO()
    e.jt.trace.save(buf)
    return buf.getvalue(), e.jt.start_ns, e.jt.now_ns


@router.get("/jobs/{job_id}/trace.npz",
            responses={200: {"content": {"application/octet-stream": {}},
                             "description": "The streamed trace (numpy .npz; nbmpi Trace.load reads it)"}})
async def job_trace_npz(job: Job = Depends(user_job)) -> Response:
    """Every event the job's ranks streamed so far, as a :class:`~nbmpi.workers.tracing.analysis.Trace` file."""
    if job.state in FINAL_JOB_STATES:
        await INDEXER.index(Path(job.job_dir) / "trace", job.ranks, 60.0)
    data, t0, t1 = await INDEXER.call(_npz, job)
    headers = {"Content-Disposition": f'attachment; filename="nbmpi-job-{job.id}.npz"',
               "X-Window-Start-Ns": str(t0), "X-Window-End-Ns": str(t1)}
    if isinstance(data, Path):
        return FileResponse(data, media_type="application/octet-stream", headers=headers)
    return Response(data, media_type="application/octet-stream", headers=headers)
