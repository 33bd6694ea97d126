"""The controller's trace work, kept away from its event loop and from the thread pool other requests use.

* Each finished batch job's streamed trace is indexed once (:mod:`nbmpi.workers.tracing.index`) in its
  own process (:func:`build_command`: the joined trace lives in that process, never in the
  controller's; in a session of its own at the lowest CPU and I/O priority, so it never delays the
  controller's answers), started from one build thread; the job's follower
  asks for it when the job ends (:meth:`TraceIndexer.build_blocking`), a request for an older job
  that has none starts it (:meth:`TraceIndexer.ensure`). A build that fails or is killed leaves an
  ``unreadable`` index saying why.
* The dashboard's data requests run on :attr:`TraceIndexer.serve` (two threads of their own), so a
  heavy window never delays ``/api/health`` or the REST routes.

:data:`INDEXER` is the one instance of the process.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, Optional, Set, TypeVar

from nbmpi.workers.launch.processes import end_group_of
from nbmpi.workers.tracing import index as trace_index
from nbmpi.workers.tracing import stream as trace_stream

T = TypeVar("T")
#: Seconds one index build may take before it is ended (and the trace recorded unreadable).
BUILD_TIMEOUT_S = 1800.0


def build_command(trace_dir: Path, nranks: int) -> list:
    """The command line of one index build: at the lowest CPU priority (``--nice``:
    :func:`~nbmpi.workers.tracing.index.lowest_priority`; the caller starts it in a session of its
    own, so that with autogroups its CPU is not charged to the controller's session) and, where
    ``ionice`` exists, in the idle I/O class (it reads and writes gigabytes for a 4 M-event trace; the
    class counts only with an I/O scheduler that has classes, e.g. BFQ)."""
    cmd = [sys.executable, "-m", "nbmpi.workers.tracing.index", str(trace_dir), str(nranks), "--chrome", "--nice"]
    ionice = shutil.which("ionice")
    return [ionice, "-c3", *cmd] if ionice else cmd


class TraceIndexer:
    """Index builds (one at a time, each in a child process) and the dashboard's trace threads. Thread-safe."""

    def __init__(self, serve_threads: int = 2, build_timeout: float = BUILD_TIMEOUT_S):
        self.build_timeout = build_timeout
        self.serve = ThreadPoolExecutor(serve_threads, thread_name_prefix="nbmpi-trace-serve")
        self._builds = ThreadPoolExecutor(1, thread_name_prefix="nbmpi-trace-build")
        self._lock = threading.Lock()
        self._pending: Dict[str, Future] = {}
        self._open: "OrderedDict[str, tuple]" = OrderedDict()
        self._running: Set[subprocess.Popen] = set()   # builds in progress
        self._ended: Set[subprocess.Popen] = set()     # builds :meth:`end_builds` ended
        self._accepting = True

    def accept_builds(self) -> None:
        """Start builds again after :meth:`end_builds` (a service starting in this process calls it)."""
        with self._lock:
            self._accepting = True

    def end_builds(self, grace: float = 2.0) -> int:
        """Start no build from now on (until :meth:`accept_builds`) and end every build in progress (its whole
        session: SIGTERM, SIGKILL after ``grace`` s); returns how many were ended. The service calls it when it
        stops, so that no build outlives it and writes into a data directory that is being removed. An ended
        or refused build records nothing: the trace is indexed anew on its next request. Blocking (at most
        about ``grace`` s per build)."""
        with self._lock:
            self._accepting = False
            procs = list(self._running)
            self._ended.update(procs)
        for proc in procs:
            end_group_of(proc, grace=grace)
        return len(procs)

    # -- builds ---------------------------------------------------------------------------------------
    def ensure(self, trace_dir: Path, nranks: int) -> Future:
        """A future of the build of ``trace_dir``'s index (done at once when there is one or
        nothing was streamed); one build per directory at a time. Non-blocking."""
        key = str(trace_dir)
        with self._lock:
            fut = self._pending.get(key)
            if fut is not None:
                return fut
            fut = Future()
            if trace_index.TraceIndex.open(trace_dir) is not None or not trace_stream.has_stream(trace_dir, nranks):
                fut.set_result(None)
                return fut
            self._pending[key] = fut = self._builds.submit(self._build, Path(trace_dir), nranks)
        fut.add_done_callback(lambda _f: self._forget(key))
        return fut

    def _forget(self, key: str) -> None:
        with self._lock:
            self._pending.pop(key, None)

    def build_blocking(self, trace_dir: Path, nranks: int) -> Optional[trace_index.TraceIndex]:
        """Build the index of a job that just ended (blocking, up to the build timeout); the
        scheduler's follower thread calls it. Returns the index (None: nothing was streamed)."""
        self.ensure(trace_dir, nranks).result(timeout=self.build_timeout + 30)
        return self.open(trace_dir)

    def _build(self, trace_dir: Path, nranks: int) -> None:
        with self._lock:   # started under the lock: end_builds() sees every build, or none starts
            if not self._accepting:
                return
            proc = subprocess.Popen(build_command(trace_dir, nranks), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            self._running.add(proc)
        try:
            _, err = proc.communicate(timeout=self.build_timeout)
            why = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            if proc.returncode < 0:
                why = f"ended by signal {-proc.returncode} (out of memory?)"
        except subprocess.TimeoutExpired:
            end_group_of(proc)
            why = f"it took more than {self.build_timeout:.0f} s"
        finally:
            with self._lock:
                self._running.discard(proc)
                ended = proc in self._ended
                self._ended.discard(proc)
        if ended or proc.returncode in (0, trace_index.UNREADABLE_EXIT):
            return
        if trace_index.TraceIndex.open(trace_dir) is None:
            self._record_failed(trace_dir, nranks, f"indexing the trace failed: {why}")

    @staticmethod
    def _record_failed(trace_dir: Path, nranks: int, reason: str) -> None:
        out = trace_index.index_dir(trace_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / ".meta.json.tmp"
        tmp.write_text(json.dumps(dict(format=trace_index.FORMAT, state="unreadable", reason=reason, nranks=nranks,
                                       built_at=time.time())))
        tmp.replace(out / "meta.json")

    # -- reads --------------------------------------------------------------------------------------------
    def open(self, trace_dir: Path) -> Optional[trace_index.TraceIndex]:
        """The index of ``trace_dir`` (kept open for the next request while its meta is unchanged)."""
        key = str(trace_dir)
        try:
            stamp = (trace_index.index_dir(trace_dir) / "meta.json").stat().st_mtime_ns
        except FileNotFoundError:
            return None
        with self._lock:
            hit = self._open.get(key)
            if hit is not None and hit[0] == stamp:
                self._open.move_to_end(key)
                return hit[1]
        ix = trace_index.TraceIndex.open(trace_dir)
        if ix is not None:
            with self._lock:
                self._open[key] = (stamp, ix)
                while len(self._open) > 8:
                    self._open.popitem(last=False)
        return ix

    async def index(self, trace_dir: Path, nranks: int, wait_s: float) -> Optional[trace_index.TraceIndex]:
        """The index of a finished job's trace, its build started if needed and awaited up to
        ``wait_s`` (the event loop stays free). None: nothing was streamed, or still building."""
        deadline = time.monotonic() + wait_s
        fut = self.ensure(trace_dir, nranks)
        while True:
            ix = await self.call(self.open, trace_dir)
            if ix is not None or fut.done() or time.monotonic() > deadline:
                return ix
            await asyncio.sleep(0.1)

    async def call(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` on the trace threads, awaited."""
        return await asyncio.get_running_loop().run_in_executor(self.serve, fn, *args)

    def building(self, trace_dir: Path) -> bool:
        """Whether the index of ``trace_dir`` is being built now."""
        with self._lock:
            return str(trace_dir) in self._pending


#: The indexer of this process (the scheduler and the routes share it).
INDEXER = TraceIndexer()
