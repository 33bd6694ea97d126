"""What runs inside every engine (MPI rank) of a pool.

:func:`setup` (called once per rank by :meth:`EnginePool.start`, collectively)
starts the nbmpi runtime, fills the user namespace (``comm``, ``rank``,
``size``, ``nbmpi``), registers the per-cell hooks and the shared-variable
rebinding guard (:mod:`nbmpi.workers.fused_reductions.rebinding_guard`) and starts this rank's
**state probe**.

Per-cell hooks (IPython ``pre_run_cell`` / ``post_run_cell`` on the engine,
so they cost no extra round trip): before each cell the tracer's mark and the
start time are recorded; after it, the tracer's end index. :func:`cell_events`
returns the events recorded during the last cell, shifted onto rank 0's
clock, so the notebook can build the cell's :class:`~nbmpi.workers.Trace`
from any subset of ranks, even after an error or an interrupt (no collective
call is needed, unlike ``gather_trace``).

State probe: a daemon thread serving a TCP socket. Each connection gets one
JSON line: whether a cell runs, since when, and
:data:`nbmpi.workers.core.waiting.current` (the communication call the rank is
blocked in, its peer, since when). The thread makes no MPI call (thread level
``funneled`` holds) and reads only Python state, so it answers while the main
thread is busy in user code or polling a request — that is how a hang is
explained without interrupting the rank first.

Owner watchdog: if ``NBMPI_POOL_OWNER_PID`` is set (by :meth:`EnginePool.start`),
a daemon thread ends this rank (``os._exit``) within a second of that process
disappearing, so a notebook kernel or controller that is killed outright
(no exit handlers) leaves no rank behind, and removes the pool's own work directory
(``NBMPI_POOL_WORK_DIR``, set by a pool that made it). A pool whose engines run on other hosts
does not set it (that pid means nothing there): its mpiexec's parent-death signal
ends Hydra, whose proxies end the engines.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np

from .environment import POOL_LOCATION_ENV, POOL_OWNER_PID_ENV, POOL_WORK_DIR_ENV, PROBE_HOST_ENV, STATUS_DIR_ENV



class _CellState:
    kind = "cell"      # what runs: a notebook "cell", or a controller "job" (run_job)
    running = False
    cell = 0
    t_start_ns = 0
    t_end_ns = 0
    mark = 0
    end = 0
    tracer = None


state = _CellState()
_probe_sock: Optional[socket.socket] = None


def _pre_run_cell(info=None) -> None:  # noqa: ARG001 - IPython passes ExecutionInfo
    from ..tracing import tracer as tracing

    tr = tracing.get_tracer()
    state.tracer = tr
    state.mark = tr.mark()
    state.end = state.mark
    state.cell += 1
    state.t_start_ns = time.perf_counter_ns()
    state.running = True


def _post_run_cell(result=None) -> None:  # noqa: ARG001
    tr = state.tracer
    if tr is not None:
        end = tr.mark()
        if end < state.mark:  # the tracer was cleared during the cell
            state.mark = 0
        state.end = end
    state.t_end_ns = time.perf_counter_ns()
    state.running = False


def snapshot() -> Dict[str, Any]:
    """This rank's state now (thread-safe read): a cell (or a controller job, ``kind``) running?, since
    when, the nbmpi call it waits in (``op``, ``peer``, ``waiting_s`` from
    :data:`nbmpi.workers.core.waiting.current`) and, while a cell or job runs, ``where``: the main
    thread's user-code line and the MPI call on it
    (:func:`nbmpi.workers.launch.rank_location.main_thread_location`), also for raw mpi4py calls."""
    from ..core import waiting
    from .rank_location import main_thread_location

    now = time.perf_counter_ns()
    cur = waiting.current
    out: Dict[str, Any] = dict(rank=_rank, pid=os.getpid(), running=state.running, kind=state.kind, cell=state.cell,
                               running_s=(now - state.t_start_ns) / 1e9 if state.running else 0.0,
                               op=None, peer=None, waiting_s=0.0, where=None)
    if cur is not None:
        op, peer, t0 = cur
        out.update(op=str(op), peer=None if peer is None else int(peer), waiting_s=(now - int(t0)) / 1e9)
    if state.running:
        try:
            out["where"] = main_thread_location()
        except Exception as exc:  # noqa: BLE001 - a probe answers whatever happens
            out["where"] = {"stack": [], "mpi": None, "error": repr(exc)}
    return out


def _serve(sock: socket.socket) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        try:
            conn.sendall((json.dumps(snapshot()) + "\n").encode())
        except OSError:
            pass
        finally:
            conn.close()


def probe_address() -> str:
    """The address this engine's probe listens on: ``$NBMPI_PROBE_HOST``; else, in a pool whose engines
    run on other hosts (``$NBMPI_POOL_LOCATION`` set), this host's own address on the route to the pool's
    controller (so its owner reaches the probe; no packet is sent); else 127.0.0.1. Local, cheap."""
    explicit = os.environ.get(PROBE_HOST_ENV)
    if explicit:
        return explicit
    location = os.environ.get(POOL_LOCATION_ENV)
    if not location:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((location, 9))   # UDP: only picks the route and its source address
        return s.getsockname()[0]


def _start_probe() -> int:
    global _probe_sock
    if _probe_sock is not None:
        return _probe_sock.getsockname()[1]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((probe_address(), 0))
    sock.listen(16)
    _probe_sock = sock
    threading.Thread(target=_serve, args=(sock,), name="nbmpi-probe", daemon=True).start()
    return sock.getsockname()[1]


_rank = -1
#: Environment variable with the pid of the process that owns the pool (set by EnginePool.start).
OWNER_ENV = POOL_OWNER_PID_ENV


def _watch_owner(pid: int, period: float = 1.0) -> None:
    """Exit this rank when the pool's owner process is gone (it was killed without stopping the pool)."""
    import psutil

    while True:
        time.sleep(period)
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            # this rank's own children (ipyparallel's nanny) hold mpiexec's output pipes open: end them too
            for child in psutil.Process().children(recursive=True):
                try:
                    child.kill()
                except psutil.Error:
                    pass
            # nobody is left to clean up after the pool: unlink MPI's shared memory (the mappings stay valid
            # for the other ranks, which are ending the same way)
            from .processes import shm_segments_of

            for path in shm_segments_of([os.getpid()]):
                try:
                    os.unlink(path)
                except OSError:
                    pass
            work = os.environ.get(POOL_WORK_DIR_ENV, "")     # ... and the pool's own directory (logs, profile)
            if work:
                shutil.rmtree(work, ignore_errors=True)
            os._exit(3)


def _start_watchdog() -> None:
    raw = os.environ.get(OWNER_ENV, "")
    if raw.isdigit() and not any(t.name == "nbmpi-owner-watch" for t in threading.enumerate()):
        threading.Thread(target=_watch_owner, args=(int(raw),), name="nbmpi-owner-watch", daemon=True).start()


def setup() -> Dict[str, Any]:
    """Start the runtime on this rank and describe it. Collective: every rank of the pool calls it.

    Puts ``comm`` (COMM_WORLD), ``rank``, ``size`` and ``nbmpi`` into the
    engine's user namespace and returns ``{"rank", "size", "host",
    "probe_host", "probe_port", "pid", "nanny_pids", "thread_level"}``.
    """
    global _rank
    import psutil
    from IPython import get_ipython

    import nbmpi
    import nbmpi.workers

    from ..fused_reductions import rebinding_guard
    from ..core import runtime

    nbmpi.workers.init()
    comm = runtime.world()
    _rank = comm.Get_rank()
    ip = get_ipython()
    ip.user_ns.update(comm=comm, rank=_rank, size=comm.Get_size(), nbmpi=nbmpi)
    rebinding_guard.install_ipython(ip)   # a top-level `x = local` on a shared x raises
    for event, fn in (("pre_run_cell", _pre_run_cell), ("post_run_cell", _post_run_cell)):
        try:
            ip.events.unregister(event, fn)
        except ValueError:
            pass
        ip.events.register(event, fn)
    port = _start_probe()
    _start_watchdog()
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir:   # so the pool can remove MPI's shared memory if this rank is killed
        from .processes import note_segments

        note_segments(status_dir, str(_rank))
    m = runtime.MPI()
    levels = {m.THREAD_SINGLE: "single", m.THREAD_FUNNELED: "funneled", m.THREAD_SERIALIZED: "serialized",
              m.THREAD_MULTIPLE: "multiple"}
    nannies = [c.pid for c in psutil.Process().children() if "nanny" in " ".join(c.cmdline())]
    return dict(rank=_rank, size=comm.Get_size(), host=socket.gethostname(),
                probe_host=_probe_sock.getsockname()[0], probe_port=port, pid=os.getpid(),
                nanny_pids=nannies, thread_level=levels.get(m.Query_thread(), str(m.Query_thread())))


def cell_events() -> Dict[str, Any]:
    """The trace events this rank recorded during the last (or current) cell.

    Returns ``{"rank", "events" (n, NF) int64 on rank 0's clock, "dropped",
    "clock_error_ns", "kinds", "cell_start_ns", "cell_end_ns"}`` (cell times on
    rank 0's clock too). Local; no communication.
    """
    from ..tracing import tracer as tracing

    tr = state.tracer or tracing.get_tracer()
    n = tr.mark()
    end = n if state.running else min(state.end, n)
    ev = np.array(tr.events()[state.mark:end], dtype=np.int64, copy=True)
    ts, te = tracing.FIELDS.index("t_start"), tracing.FIELDS.index("t_end")
    ev[:, ts] += tr.offset_ns
    ev[:, te] += tr.offset_ns
    t_end = time.perf_counter_ns() if state.running else state.t_end_ns
    return dict(rank=_rank, events=ev, dropped=int(tr.dropped), clock_error_ns=int(tr.offset_err_ns),
                kinds=tracing.kind_names(), cell_start_ns=state.t_start_ns + tr.offset_ns,
                cell_end_ns=t_end + tr.offset_ns)


class _InterruptedWait:
    """While installed (on the main thread), SIGINT first notes the nbmpi wait the rank is in
    (:data:`nbmpi.workers.core.waiting.current`, still set then: the wait's own clean-up runs
    after the KeyboardInterrupt) in :attr:`wait`, then does what the previous handler did."""

    def __init__(self) -> None:
        import signal

        self.wait: Optional[tuple] = None
        self._prev = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame) -> None:
        import signal

        from ..core import waiting

        if self.wait is None:
            self.wait = waiting.current
        if callable(self._prev):
            self._prev(signum, frame)
        if self._prev is not signal.SIG_IGN:
            raise KeyboardInterrupt

    def restore(self) -> None:
        """Put the previous SIGINT handler back."""
        import signal

        signal.signal(signal.SIGINT, self._prev)


def run_job(code: str, argv: List[str], env: Dict[str, str], name: str = "job.py",
            trace_dir: Optional[str] = None) -> None:
    """Run a controller job's program on this engine, as ``nbmpi run`` runs a script on a rank.

    Called on every engine of a pool by the controller (one ``apply`` per job, through
    :class:`~nbmpi.workers.launch.pool_runner.PoolRun`). The program runs
    as ``__main__`` in a namespace of its own (not the notebook's: it neither sees nor changes the
    variables of cells or of earlier jobs), with ``comm``, ``rank``, ``size`` and ``nbmpi``
    predefined, ``sys.argv = [name, *argv]``, ``env`` added to ``os.environ`` and the
    shared-variable rebinding guard. A failure prints its traceback to the rank's stderr (the
    job's log) and is raised again; ``sys.exit(0)`` is success, another code an error.

    While it runs the rank's state probe reports it as running (with its line in ``name``), as
    for a cell, so a deadline or an interrupt names what each rank was doing. With
    ``trace_dir``, the events the rank records during the job are streamed there
    (:mod:`~nbmpi.workers.tracing.stream`, as a batch job's ranks do) and completed at the end,
    whatever the outcome.
    """
    import linecache
    import sys
    import traceback

    import nbmpi

    from ..fused_reductions import rebinding_guard
    from ..core import runtime

    os.environ.update(env)
    sys.argv = [name, *argv]
    comm = runtime.world()
    ns: Dict[str, Any] = {"__name__": "__main__", "__file__": name, "comm": comm, "rank": comm.Get_rank(),
                          "size": comm.Get_size(), "nbmpi": nbmpi}
    # the probe and tracebacks show the job's lines (the code is not a file on this host)
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    streamer = None
    if trace_dir:
        from ..tracing.stream import start_streaming

        try:
            streamer = start_streaming(trace_dir, from_now=True)
        except OSError as exc:
            print(f"[nbmpi] trace streaming off: {exc}", file=sys.stderr)
    open_wait = None   # the wait an interrupt (deadline, cancel) ended: it stays open in the trace
    interrupted = _InterruptedWait()   # on the engine's main thread, as apply requests run
    _pre_run_cell()
    state.kind = "job"
    try:
        exec(rebinding_guard.compile_guarded(code, name), ns)  # noqa: S102 - running the job is the point
    except SystemExit as exc:
        if exc.code not in (None, 0):
            print(f"{name} exited with {exc.code!r}", file=sys.stderr, flush=True)
            raise RuntimeError(f"{name} exited with {exc.code!r}") from None
    except BaseException:
        open_wait = interrupted.wait   # as a killed batch rank's wait stays open
        traceback.print_exc()
        sys.stderr.flush()
        raise
    finally:
        _post_run_cell()
        state.kind = "cell"
        interrupted.restore()
        sys.stdout.flush()
        if streamer is not None:
            try:
                streamer.stop(open_wait)
            except Exception:  # noqa: BLE001 - a trace failure must not change the job's result
                print("[nbmpi] completing the streamed trace failed:", file=sys.stderr)
                traceback.print_exc()
