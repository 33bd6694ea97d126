"""What each rank runs under ``nbmpi run``: start the runtime, run the user's
program like ``python`` would (script path, ``-m module`` or ``-c code``),
report this rank's exit code to the launcher's status directory.

Not called by users directly: ``nbmpi run -n N script.py`` does it. Scripts and
``-c`` code run with :mod:`~nbmpi.workers.fused_reductions.rebinding_guard` (a module-level
``x = a`` that would replace shared variable ``x`` by a rank-local value raises).

Two optional services for the controller's batch jobs (environment variables):

* ``NBMPI_LOG_DIR``: this rank's stdout/stderr go to ``rank-R.stdout`` /
  ``rank-R.stderr`` in that directory, written by the rank's guard with at most
  ``NBMPI_LOG_LIMIT`` bytes per stream and a visible truncation marker
  (:mod:`~nbmpi.workers.launch.rank_guard`; without the guard, file descriptors 1 and
  2 are redirected to the files directly). Either way output of C extensions
  and child processes lands there too.
* ``NBMPI_TRACE_OUT``: while the program runs, a daemon thread of each rank streams
  its new trace events and what it is blocked in to ``rank-R.events`` /
  ``rank-R.live.json`` there (:mod:`~nbmpi.workers.tracing.stream`, every
  ``NBMPI_TRACE_STREAM_INTERVAL`` s, default 0.5; no MPI call from that
  thread), so the controller's dashboard shows a running or hung job; the
  stream is completed when the program ends, whatever its outcome. After the
  program, the ranks agree (non-blocking
  allreduce with a timeout, ``NBMPI_TRACE_AGREE_TIMEOUT`` s, default 30) whether
  every rank succeeded; only then they gather the trace and rank 0 writes
  ``trace.json`` (Chrome/Perfetto), ``summary.json`` and the raw ``trace.npz`` there. A failed or
  missing rank never makes the others hang at exit.
"""
from __future__ import annotations

import ast
import os
import runpy
import sys
import traceback

from . import rank_guard
from .environment import (LOG_DIR_ENV, LOG_GUARDED_ENV, STATUS_DIR_ENV, TRACE_AGREE_TIMEOUT_ENV,
                          TRACE_OUT_ENV, TRACE_STREAM_INTERVAL_ENV)
from ..fused_reductions import rebinding_guard


def _report(code: int) -> None:
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if not status_dir:
        return
    from ..core.runtime import world

    rank = world().Get_rank()
    tmp = os.path.join(status_dir, f".rank-{rank}.tmp")
    with open(tmp, "w") as f:
        f.write(str(code))
    os.replace(tmp, os.path.join(status_dir, f"rank-{rank}.exit"))


def _rank_from_env() -> str:
    """This rank's number as the launcher's process manager gives it (before MPI starts)."""
    rank = rank_guard.rank_from_env()
    if rank is None:
        from ..core.runtime import world

        rank = str(world().Get_rank())
    return rank


def _announce() -> None:
    """Write this rank's pid to ``$NBMPI_STATUS_DIR/rank-R.pid`` (the launcher maps a rank that
    dies without reporting, e.g. killed by a signal, back to its rank number)."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if not status_dir:
        return
    rank = _rank_from_env()
    tmp = os.path.join(status_dir, f".rank-{rank}.pid.tmp")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, os.path.join(status_dir, f"rank-{rank}.pid"))


def _note_shared_memory() -> None:
    """Note the ``/dev/shm`` segments this rank maps (after MPI starts and before it exits) in the
    status directory, so the launcher can remove what MPI leaves when a rank ends without
    ``MPI_Finalize`` (a failed rank exits at once, a killed one never finalizes)."""
    status_dir = os.environ.get(STATUS_DIR_ENV)
    if status_dir:
        from .processes import note_segments

        note_segments(status_dir, _rank_from_env())


def _redirect_output() -> None:
    """Send fds 1/2 to per-rank files in ``$NBMPI_LOG_DIR`` (rank from the launcher's PMI env)."""
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir or os.environ.get(LOG_GUARDED_ENV):   # the guard writes the logs (with a cap)
        return
    rank = _rank_from_env()
    os.makedirs(log_dir, exist_ok=True)
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        target = os.open(os.path.join(log_dir, f"rank-{rank}.{stream}"),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)


def _whole_lines() -> None:
    """Write stdout and stderr a whole line at a time (one ``write`` per line), still at once: the
    launcher's output of two ranks then never shares a line (``PYTHONUNBUFFERED`` alone writes
    ``print("a", 1)`` in four pieces that another rank's output can come between)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError):   # replaced by something that is not a text stream
            pass


def _answer_where_requests() -> None:
    """Under the launcher: answer its question where this rank is (asked before it ends a launch on
    purpose, ``--timeout`` or Ctrl-C) from a daemon thread."""
    status_dir = os.environ.get("NBMPI_STATUS_DIR")
    if status_dir:
        from .rank_location import answer_where_requests

        answer_where_requests(status_dir, _rank_from_env())


#: Frames of these files before the first frame of the user's program are the launcher's, not the user's.
_LAUNCH_FILES = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.abspath(rebinding_guard.__file__),
                 os.path.abspath(runpy.__file__), os.path.abspath(ast.__file__), "<frozen runpy>")


def _user_frames(te: traceback.TracebackException) -> None:
    """Drop the launcher's leading frames (this module, runpy, the rebinding guard, ast) from ``te``
    and the exceptions chained to it, in place; the user's frames and what they called stay."""
    seen = set()
    while te is not None and id(te) not in seen:
        seen.add(id(te))
        frames = list(te.stack)
        while frames and (frames[0].filename.startswith(_LAUNCH_FILES[0]) or frames[0].filename in _LAUNCH_FILES):
            frames.pop(0)
        te.stack = traceback.StackSummary.from_list(frames)
        te = te.__cause__ or te.__context__


def _print_failure(exc: BaseException) -> None:
    """Print ``exc``'s traceback to stderr with only the user's frames, in one write. Under
    ``nbmpi run`` (ranks share one terminal) its first line says ``[rank R]``; with per-rank logs
    (``$NBMPI_LOG_DIR``, controller jobs) nothing is prefixed: the reader names the rank."""
    te = traceback.TracebackException.from_exception(exc)
    _user_frames(te)
    text = "".join(te.format())
    if not os.environ.get("NBMPI_LOG_DIR"):
        text = f"[rank {_rank_from_env()}] {text}"
    sys.stderr.write(text)


def _start_stream():
    """If ``$NBMPI_TRACE_OUT`` is set and tracing is on: start this rank's trace streamer."""
    out = os.environ.get(TRACE_OUT_ENV)
    if not out:
        return None
    from ..tracing.stream import start_streaming

    try:
        return start_streaming(out)
    except OSError as exc:
        print(f"[nbmpi] trace streaming off: {exc}", file=sys.stderr)
        return None


def _save_trace(code: int) -> None:
    """If ``$NBMPI_TRACE_OUT`` is set: agree on success, gather the trace, rank 0 writes it."""
    out = os.environ.get(TRACE_OUT_ENV)
    if not out:
        return
    import json

    import numpy as np

    from ..core.errors import CommTimeout
    from ..core.runtime import MPI, world
    from ..tracing.tracer import get_tracer
    from ..core.waiting import wait

    comm = world()
    rank = comm.Get_rank()
    tracer = get_tracer()
    mine = np.array([1 if (code or not tracer.enabled) else 0], dtype=np.int64)
    worst = np.zeros(1, dtype=np.int64)
    try:
        timeout = float(os.environ.get(TRACE_AGREE_TIMEOUT_ENV, "30"))
        wait(comm.Iallreduce(mine, worst, op=MPI().MAX), timeout, rank, None, "trace agreement at exit")
    except CommTimeout as exc:
        print(f"[rank {rank}] trace not saved: {exc}", file=sys.stderr)
        return
    if worst[0]:
        return
    trace = tracer.gather(root=0)
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        for name, data in (("trace.json", trace.to_chrome()), ("summary.json", trace.summary())):
            tmp = os.path.join(out, f".{name}.tmp")
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, os.path.join(out, name))
        trace.save(os.path.join(out, "trace.npz"))   # the raw records (Trace.load), e.g. to check clocks


def main(argv=None) -> int:
    """Run one rank. Returns (and exits with) the program's exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m nbmpi.workers.launch.rank_entry (script.py | -m module | -c code) [args]",
              file=sys.stderr)
        return 2
    rank_guard.guard()   # the parent stays behind and reports a signal that kills this rank
    _announce()
    _redirect_output()
    _whole_lines()
    from ..tracing.startup import init

    init()
    _note_shared_memory()
    _answer_where_requests()
    streamer = _start_stream()
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            import linecache   # tracebacks and the launcher's "where they were" show the lines of -c code

            linecache.cache["<string>"] = (len(argv[1]), None, argv[1].splitlines(True), "<string>")
            exec(rebinding_guard.compile_guarded(argv[1], "<string>"), {"__name__": "__main__"})  # noqa: S102
        else:
            sys.argv = argv
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            if os.path.isfile(argv[0]) and argv[0].endswith(".py"):
                rebinding_guard.run_path(argv[0])   # top-level `x = local` on a shared x raises
            else:   # a directory or zip with __main__.py
                runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        c = exc.code
        code = 0 if c is None else (c if isinstance(c, int) else 1)
        if not isinstance(c, (int, type(None))):
            print(c, file=sys.stderr)
    except BaseException as exc:  # noqa: BLE001 - report every failure as this rank's exit code
        _print_failure(exc)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if streamer is not None:
        try:
            streamer.stop()
        except Exception:  # noqa: BLE001 - a trace failure must not change the program's result
            sys.stderr.write("[nbmpi] completing the streamed trace failed:\n")
            traceback.print_exc()
    _note_shared_memory()
    _report(code)
    try:
        _save_trace(code)
    except Exception:  # noqa: BLE001 - a trace failure must not change the program's result
        sys.stderr.write("[nbmpi] saving the trace failed:\n")
        traceback.print_exc()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    rc = main()
    if rc != 0:
        # A failed rank must not wait in MPI_Finalize for ranks that may be
        # blocked on it; the launcher ends the rest of the job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(0)
