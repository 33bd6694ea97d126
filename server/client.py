"""The one HTTP client of the controller API (httpx): used by the CLI, ``nbmpi demo``,
``%distributed connect`` and the benchmarks.

Every method is one request (blocking) and returns the decoded answer, except
:meth:`Client.wait`, which polls until a job is final. An error answer raises
:class:`ApiError` carrying the status and the server's message; an unreachable
server raises :class:`ApiError` with status 0.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Dict, List, Optional, TextIO

import httpx


class ApiError(Exception):
    """The server refused a request (``status`` >= 400) or could not be reached (``status`` 0)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class Client:
    """Talks to the controller at ``url`` with bearer ``token``."""

    def __init__(self, url: str, token: Optional[str], timeout: float = 60.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _request(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            r = self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"cannot reach the nbmpi server at {self.url} ({exc}); start it with "
                              "`nbmpi serve` or pass --server URL") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise ApiError(r.status_code, detail if isinstance(detail, str) else str(detail))
        return r

    # -- service --------------------------------------------------------------------------
    def health(self) -> Dict[str, Any]:
        """``GET /api/health``."""
        return self._request("GET", "/api/health").json()

    # -- jobs -------------------------------------------------------------------------------
    def submit(self, code: str, ranks: Optional[int] = None, script_name: str = "job.py",
               pool: Optional[int] = None, timeout: Optional[float] = None, args: Optional[List[str]] = None,
               env: Optional[Dict[str, str]] = None, name: Optional[str] = None) -> Dict[str, Any]:
        """Queue a job; returns its record (``id``, ``state`` ...)."""
        body: Dict[str, Any] = dict(code=code, script_name=script_name, args=list(args or []), env=dict(env or {}))
        for k, v in (("ranks", ranks), ("pool", pool), ("timeout", timeout), ("name", name)):
            if v is not None:
                body[k] = v
        return self._request("POST", "/api/v1/jobs", json=body).json()

    def job(self, job_id: int) -> Dict[str, Any]:
        """One job record."""
        return self._request("GET", f"/api/v1/jobs/{job_id}").json()

    def jobs(self, state: Optional[str] = None) -> List[Dict[str, Any]]:
        """The caller's jobs (optionally only those in ``state``)."""
        params = {"state": state} if state else {}
        return self._request("GET", "/api/v1/jobs", params=params).json()["jobs"]

    def log_chunk(self, job_id: int, rank: int = 0, stream: str = "stdout", offset: int = 0) -> tuple:
        """``(bytes, next_offset, size)``: one request's piece of a rank's stream from byte ``offset``
        (at most 16 MiB), where the next piece starts, and the whole log's size now."""
        r = self._request("GET", f"/api/v1/jobs/{job_id}/logs",
                          params=dict(rank=rank, stream=stream, offset=offset))
        data = r.content
        nxt = int(r.headers.get("X-Log-Next-Offset", offset + len(data)))
        return data, nxt, int(r.headers.get("X-Log-Size", nxt))

    def logs(self, job_id: int, rank: int = 0, stream: str = "stdout", offset: int = 0) -> tuple:
        """``(text, new_offset)``: ALL of one rank's stream from byte ``offset`` as it is now, following
        the server's 16 MiB pieces (blocking until read)."""
        parts = []
        while True:
            data, offset, size = self.log_chunk(job_id, rank, stream, offset)
            parts.append(data)
            if not data or offset >= size:
                return b"".join(parts).decode("utf-8", "replace"), offset

    def stream_log(self, job_id: int, rank: int, stream: str, out, offset: int = 0) -> int:
        """Write one rank's whole stream from ``offset`` to the binary file ``out`` piece by piece
        (constant memory, any size); return the offset reached."""
        while True:
            data, offset, size = self.log_chunk(job_id, rank, stream, offset)
            out.write(data)
            if not data or offset >= size:
                out.flush()
                return offset

    def follow_logs(self, job_id: int, ranks: int, offsets: Dict[tuple, int], out: Optional[TextIO] = None,
                    err: Optional[TextIO] = None) -> None:
        """Print what every rank of the job wrote since ``offsets`` (updated in place), each
        line prefixed ``[rank R]`` when the job has several ranks; stdout to ``out``, stderr to ``err``."""
        out = out or sys.stdout
        err = err or sys.stderr
        for r in range(ranks):
            for stream in ("stdout", "stderr"):
                text, offsets[(r, stream)] = self.logs(job_id, r, stream, offsets.get((r, stream), 0))
                if text:
                    dest = out if stream == "stdout" else err
                    prefix = f"[rank {r}] " if ranks > 1 else ""
                    for line in text.splitlines(keepends=True):
                        dest.write(prefix + line)
                    dest.flush()

    def wait(self, job_id: int, print_logs: bool = True, poll: float = 0.2) -> Dict[str, Any]:
        """Poll job ``job_id`` until it is final, printing new output of every rank; return the record."""
        offsets: Dict[tuple, int] = {}
        while True:
            job = self.job(job_id)
            if print_logs and job["state"] != "queued":
                self.follow_logs(job_id, job["ranks"], offsets)
            if job["state"] not in ("queued", "running"):
                if print_logs:
                    self.follow_logs(job_id, job["ranks"], offsets)
                return job
            time.sleep(poll)

    def trace(self, job_id: int) -> Dict[str, Any]:
        """The job's Chrome trace JSON."""
        return self._request("GET", f"/api/v1/jobs/{job_id}/trace").json()

    def job_trace(self, job_id: int):
        """Every event the job's ranks streamed so far, as a :class:`~nbmpi.workers.tracing.analysis.Trace`
        (``nbmpi.workers.tracing.timeline.show(trace)`` draws it in a notebook); works for running and failed
        jobs too."""
        import io

        from nbmpi.workers.tracing.analysis import Trace

        return Trace.load(io.BytesIO(self._request("GET", f"/api/v1/dashboard/jobs/{job_id}/trace.npz").content))

    def summary(self, job_id: int) -> Dict[str, Any]:
        """The job's per-rank compute/comm/wait summary."""
        return self._request("GET", f"/api/v1/jobs/{job_id}/summary").json()

    def cancel(self, job_id: int) -> Dict[str, Any]:
        """Cancel a job; returns ``{"id", "state"}`` after its ranks ended."""
        return self._request("DELETE", f"/api/v1/jobs/{job_id}").json()

    # -- pools ------------------------------------------------------------------------------
    def pools(self) -> List[Dict[str, Any]]:
        """The caller's pools."""
        return self._request("GET", "/api/v1/pools").json()["pools"]

    def create_pool(self, ranks: int, name: Optional[str] = None,
                    idle_timeout: Optional[float] = None) -> Dict[str, Any]:
        """Start a pool (blocks until it runs); returns its record with ``connection``."""
        body: Dict[str, Any] = {"ranks": ranks}
        if name:
            body["name"] = name
        if idle_timeout:
            body["idle_timeout"] = idle_timeout
        return self._request("POST", "/api/v1/pools", json=body, timeout=300).json()

    def pool(self, pool_id: int) -> Dict[str, Any]:
        """One pool record."""
        return self._request("GET", f"/api/v1/pools/{pool_id}").json()

    def delete_pool(self, pool_id: int) -> Dict[str, Any]:
        """Stop a pool."""
        return self._request("DELETE", f"/api/v1/pools/{pool_id}", timeout=120).json()
