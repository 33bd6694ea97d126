"""The record of the ``%%distributed`` cells a kernel ran on its pools, and their HTML pages.

Every ``%%distributed`` cell is traced on the ranks at no extra cost (the per-cell tracer mark of
:mod:`nbmpi.workers.launch.engine_side`), so the pool's timelines page
(:mod:`nbmpi.kernel_ext.timeline_server`) lists every cell. When a cell ends the magics add its
:class:`CellRecord` with either its trace (``--timeline`` fetched it) or a *pending* request for it
(``apply_async(cell_events)``, sent without waiting: the engines answer it before they run the next
cell, so a cell costs no extra round trip); the pending answer is turned into the
:class:`~nbmpi.workers.Trace` (:func:`cell_trace`) when the cell's page is first opened. Only the
traces of the last :data:`KEEP_TRACES` cells are kept (older cells stay listed, without a timeline).

Pages are built on request, from the web server's threads (:meth:`CellLog.index_html`,
:meth:`CellLog.cell_html`, :meth:`CellLog.chrome_json`); the kernel's thread adds and drops cells.
One lock guards the record, another serialises the (cached) building of the Bokeh pages. Every
link on a page is relative and carries the server's key (``?key=...``), so the pages work under
``jupyter-server-proxy``'s ``/proxy/PORT/`` prefix as on ``http://127.0.0.1:PORT/``; BokehJS comes
from the same server (``bokeh.js``), nothing from outside.
"""
from __future__ import annotations

import html
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

#: The traces of this many most recent cells are kept (older cells are listed without a timeline).
KEEP_TRACES = 50
#: Seconds a page waits for a pending trace (the engines answer it once the cell running now ends).
PENDING_WAIT = 30.0

_STYLE = ("body{font-family:sans-serif;font-size:13px;margin:16px}table{border-collapse:collapse}"
          "td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}"
          "code{font-size:12px}.error,.timed_out,.interrupted,.rank_died{color:#b00}")


@dataclass
class CellRecord:
    """One ``%%distributed`` cell: its notebook number (``In[n]``), pool, ranks, first source line,
    status (``ok``, ``error``, ``timed_out``, ``interrupted``, ``rank_died``), duration and its trace
    and window, or ``pending``: ``(ipyparallel AsyncResult of cell_events, the pool's size)`` until the
    trace is built; neither if it could not be fetched or was dropped (``note`` says why)."""

    number: int
    pool: str
    ranks: List[int]
    first_line: str
    status: str
    duration_s: float
    trace: Any = None
    window: Optional[Tuple[int, int]] = None
    note: str = ""
    pending: Any = None
    started: float = field(default_factory=time.time)

    @property
    def has_trace(self) -> bool:
        return self.trace is not None or self.pending is not None


def cell_trace(parts: List[Dict[str, Any]], nranks: int):
    """The :class:`~nbmpi.workers.Trace` of one cell and its window (ns, rank 0's clock) from the
    answers of :func:`nbmpi.workers.launch.engine_side.cell_events` of some ranks of a pool of
    ``nranks`` ranks. Pure function."""
    import numpy as np

    from nbmpi.workers.tracing.analysis import Trace
    from nbmpi.workers.tracing.tracer import NF

    events = np.concatenate([np.asarray(p["events"], dtype=np.int64).reshape(-1, NF) for p in parts])
    owner = np.concatenate([np.full(len(p["events"]), p["rank"], dtype=np.int64) for p in parts])
    dropped = np.zeros(nranks, np.int64)
    err = np.zeros(nranks, np.int64)
    for p in parts:
        dropped[p["rank"]] = p["dropped"]
        err[p["rank"]] = p["clock_error_ns"]
    kinds = max((p["kinds"] for p in parts), key=len)
    window = (min(p["cell_start_ns"] for p in parts), max(p["cell_end_ns"] for p in parts))
    return Trace(events, owner, nranks, kinds, dropped=dropped, clock_error_ns=err), window


class CellLog:
    """The cells of one kernel, thread-safe: the kernel's thread adds, the web server's threads read."""

    def __init__(self, keep_traces: int = KEEP_TRACES):
        self.keep_traces = keep_traces
        self._cells: List[CellRecord] = []
        self._pages: Dict[int, str] = {}
        self._lock = threading.Lock()
        self._build = threading.Lock()

    def add(self, rec: CellRecord) -> None:
        """Record a finished cell (kernel's thread); drops the trace of cells beyond ``keep_traces``."""
        with self._lock:
            self._cells = [c for c in self._cells if c.number != rec.number] + [rec]
            self._pages.pop(rec.number, None)
            with_trace = [c for c in self._cells if c.has_trace]
            for old in with_trace[:max(0, len(with_trace) - self.keep_traces)]:
                old.trace = old.pending = None
                old.note = f"trace dropped (only the last {self.keep_traces} cells' are kept)"
                self._pages.pop(old.number, None)

    def drop_pool(self, pool: str) -> None:
        """Forget the cells run on ``pool`` (it was stopped)."""
        with self._lock:
            gone = {c.number for c in self._cells if c.pool == pool}
            self._cells = [c for c in self._cells if c.pool != pool]
            for n in gone:
                self._pages.pop(n, None)

    def cells(self) -> List[CellRecord]:
        """A copy of the record, oldest cell first."""
        with self._lock:
            return list(self._cells)

    def _find(self, number: int) -> Optional[CellRecord]:
        with self._lock:
            return self._find_unlocked(number)

    def _traced(self, number: int) -> Optional[CellRecord]:
        """Cell ``number`` with its trace built (waiting up to :data:`PENDING_WAIT` for a pending
        one; web server's threads, under the build lock), or ``None`` if it has none."""
        rec = self._find(number)
        pending = None if rec is None else rec.pending
        if pending is None:
            return rec if rec is not None and rec.trace is not None else None
        ar, nranks = pending
        try:
            rec.trace, rec.window = cell_trace(ar.get(timeout=PENDING_WAIT), nranks)
        except Exception as e:  # noqa: BLE001 - the page says why instead
            rec.note = f"no trace: {type(e).__name__}: {e}"
        rec.pending = None
        return rec if rec.trace is not None else None

    def _find_unlocked(self, number: int) -> Optional[CellRecord]:
        return next((c for c in self._cells if c.number == number), None)

    # -- pages -------------------------------------------------------------------------------------
    def index_html(self, key: str) -> str:
        """The index page: one row per cell (number, pool, ranks, first line, status, duration) with
        relative links to its timeline page and Chrome trace."""
        from .output import format_ranks

        q = f"?key={html.escape(key)}"
        rows = []
        for c in reversed(self.cells()):
            if c.has_trace:
                links = f'<a href="cell/{c.number}{q}">timeline</a> · <a href="cell/{c.number}.json{q}">trace JSON</a>'
            else:
                links = html.escape(c.note or "no trace")
            rows.append(f'<tr id="cell-{c.number}"><td>In [{c.number}]</td><td>{html.escape(c.pool)}</td>'
                        f'<td>{format_ranks(c.ranks)}</td><td><code>{html.escape(c.first_line)}</code></td>'
                        f'<td class="{c.status}">{c.status.replace("_", " ")}</td><td>{c.duration_s:.3f} s</td>'
                        f'<td>{links}</td></tr>')
        body = ("<table><tr><th>cell</th><th>pool</th><th>ranks</th><th>first line</th><th>status</th>"
                "<th>duration</th><th></th></tr>" + "".join(rows) + "</table>") if rows else \
            "<p>No %%distributed cell has run on this kernel's pools yet.</p>"
        return _page("nbmpi: this kernel's %%distributed cells", f"<h2>%%distributed cells</h2>{body}")

    def cell_html(self, number: int, key: str) -> Optional[str]:
        """The timeline page of cell ``number`` (the Bokeh figure of ``%%distributed --timeline``,
        BokehJS from ``../bokeh.js``), or ``None`` if the cell or its trace is unknown."""
        from nbmpi.workers.tracing.timeline import notebook_bundle

        with self._build:
            rec = self._traced(number)
            if rec is None:
                return None
            page = self._pages.get(number)
            if page is None:
                bundle = notebook_bundle(rec.trace, window=rec.window, ranks=rec.ranks,
                                         title=f"In [{number}] on pool {rec.pool}: {rec.first_line}")
                q = f"?key={html.escape(key)}"
                body = (f'<p><a href="../{q}">all cells</a> · <a href="{number}.json{q}">trace JSON</a> '
                        f'(open in Perfetto) · {rec.status.replace("_", " ")}, {rec.duration_s:.3f} s</p>'
                        f'{bundle["text/html"]}')
                page = _page(f"nbmpi: In [{number}] timeline", body, head=f'<script src="../bokeh.js{q}"></script>')
                with self._lock:
                    if self._find_unlocked(number) is rec:
                        self._pages[number] = page
            return page

    def chrome_json(self, number: int) -> Optional[bytes]:
        """Cell ``number``'s trace as Chrome Trace Event JSON (Perfetto opens it), or ``None``."""
        with self._build:
            rec = self._traced(number)
        return None if rec is None else json.dumps(rec.trace.to_chrome()).encode()


def _page(title: str, body: str, head: str = "") -> str:
    """A whole page; ``data:,`` as its icon, so the browser asks this server for nothing else."""
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><link rel="icon" href="data:,">'
            f'<title>{html.escape(title)}</title><style>{_STYLE}</style>{head}</head><body>{body}</body></html>')


def first_line(source: str, limit: int = 80) -> str:
    """The first non-blank line of a cell's source, cut to ``limit`` characters."""
    line = next((ln.strip() for ln in source.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 1] + "…"


def bokehjs() -> bytes:
    """BokehJS from the installed bokeh wheel (core and GL), as one script file."""
    from bokeh.resources import Resources

    return "\n".join(Resources(mode="inline", components=["bokeh", "bokeh-gl"]).js_raw).encode()

