"""A rank's guard: the parent process that sees how its rank ended, even when a signal killed it.

A rank killed by a signal (``kill -9``, the OOM killer, a segfault) cannot
report anything itself, and the MPI process manager's banner does not say
reliably which rank died first. So every rank that nbmpi launches (programs
under ``nbmpi run`` and controller jobs through :mod:`nbmpi.workers.launch.rank_entry`,
engines of a pool through ``python -m nbmpi.workers.launch.rank_guard -m
ipyparallel.engine ...``) starts as a guard that forks before MPI starts: the
child is the rank; the parent waits for it, and if a signal ended it that the
guard did not pass on itself, writes ``rank-R.signal`` (the signal number) to
``$NBMPI_STATUS_DIR``. The guard then ends the same way as its child (same
exit code, or the same signal), so the process manager sees what it would
have seen without the guard.

With ``$NBMPI_LOG_DIR`` (controller jobs) the guard also owns the rank's
output: the rank's stdout and stderr are pipes, and the guard appends what
arrives to ``rank-R.stdout`` / ``rank-R.stderr`` in that directory, at most
``$NBMPI_LOG_LIMIT`` bytes per stream (unset: no limit). Past the limit it
writes one visible marker line and discards the rest, counting it, so one
job cannot fill the disk and a reader always sees that output is missing.
Output is never lost when the rank dies: the guard drains the pipes first.

The guard passes SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to
the rank; a rank ended by a signal the guard received too (the launcher
ending the job signals the whole process group; the guard waits 0.2 s for its
own copy) counts as *terminated*, not *killed*; when the launcher ended the launch on purpose
(:func:`mark_ending`: ``--timeout``, Ctrl-C) the guard then exits with status 0, so the
process manager prints no "BAD TERMINATION" banner. The rank gets
``PR_SET_PDEATHSIG`` (Linux) so it never outlives a guard that is killed.

Nothing a rank starts outlives it: the guard is a child subreaper
(``PR_SET_CHILD_SUBREAPER``), so a process the rank started that daemonised
itself (double fork, ``setsid``, closed fds) is re-parented to the guard, not
to init; when the rank has ended, the guard ends every process still below it
(:func:`end_leftovers`) before it ends itself, and a launcher ending the job
finds them below the guard too. A job can still kill its own guard first; a controller run by
root therefore also starts each job in a cgroup of its own (:mod:`nbmpi.workers.launch.cgroups`).

``NBMPI_RANK_GUARD=0`` turns the guard off under ``nbmpi run``; the controller
always sets it on for its jobs, whatever a job's own ``env`` says
(:func:`nbmpi.workers.launch.environment.job_environment`). Local; no MPI.

When the rank ends without success (a signal, a non-zero exit: no ``MPI_Finalize``), the guard
unlinks the ``/dev/shm`` segments the rank noted that no live process maps any more, on the
rank's own node, which a launcher on another node cannot reach.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import List, Optional

from .environment import LOG_DIR_ENV, LOG_GUARDED_ENV, LOG_LIMIT_ENV, STATUS_DIR_ENV, guard_enabled


def truncation_marker(limit: int) -> bytes:
    """The line written once where a stream's output stops being kept."""
    return (f"\n[nbmpi: output truncated here: this stream reached its limit of {limit} bytes "
            "(nbmpi serve --max-log-bytes); the rest is discarded]\n").encode()


class CappedLog:
    """Appends to one log file, keeping at most ``limit`` bytes of output (None: all).

    Past the limit, :meth:`write` writes :func:`truncation_marker` once and counts what it
    discards; :meth:`close` adds a last line with that count. Also used by the controller
    for the output of jobs that run on a pool. Not thread-safe (one writer)."""

    def __init__(self, path: str, limit: Optional[int], dir_fd: Optional[int] = None):
        # never through a symbolic link: a job may have replaced its log by one, and the controller
        # (root with several users) also writes the logs of jobs on pools (``dir_fd``: their folder,
        # opened without links by the caller, ``path`` a name in it)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        self.limit = limit
        self.kept = 0
        self.discarded = 0

    def write(self, data: bytes) -> None:
        """Append ``data`` (within the limit).

        The marker is written with the first byte that does not fit, so output that ends
        exactly at the limit gets none, and output past it always gets one."""
        if self.limit is not None:
            room = self.limit - self.kept
            if len(data) > room:
                if room > 0:
                    self._write(data[:room])
                    self.kept += room
                if not self.discarded:
                    self._write(truncation_marker(self.limit))
                self.discarded += len(data) - max(room, 0)
                return
        self._write(data)
        self.kept += len(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def close(self) -> None:
        """Note how much was discarded (if anything) and close the file."""
        if self.discarded:
            self._write(f"[nbmpi: {self.discarded} more bytes of output were discarded]\n".encode())
        os.close(self.fd)


def _log_limit() -> Optional[int]:
    raw = os.environ.get(LOG_LIMIT_ENV, "").strip()
    try:
        value = int(raw) if raw else 0
    except ValueError:
        return None
    return value if value > 0 else None
#: ``prctl`` option making a process the reaper of its orphaned descendants (Linux >= 3.4).
PR_SET_CHILD_SUBREAPER = 36
#: Seconds the processes a rank left running get between SIGTERM and SIGKILL.
LEFTOVER_GRACE_S = 1.0

_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


#: File in the status directory that says the launcher ends the launch on purpose (timeout, Ctrl-C).
ENDING_FILE = "ending"


def mark_ending(status_dir: str) -> None:
    """Say that the launcher ends this launch on purpose: the guards of ranks ended by its signal
    then exit with status 0, so the MPI process manager prints no failure banner (the launcher
    reports the end itself). Called by the launcher just before it signals the ranks."""
    with open(os.path.join(status_dir, ENDING_FILE), "w"):
        pass


def rank_from_env() -> Optional[str]:
    """This rank's number as the process manager gives it before MPI starts (MPICH/Hydra, Open MPI, Slurm)."""
    return os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID")


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the launcher ends the process group anyway
        pass


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``): every orphaned
    descendant (a daemon that double-forked and called ``setsid``) is re-parented to it instead of
    to init, so it stays findable as a descendant and is ended with the rank. True if it worked."""
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:  # noqa: BLE001 - not Linux: the launcher still ends the process group
        return False


def end_leftovers(grace: float = LEFTOVER_GRACE_S) -> List[int]:
    """End every process still descending from this one (SIGTERM, SIGKILL after ``grace`` s) with
    :func:`nbmpi.workers.launch.processes.end_processes`, then reap them. Called by the guard once
    its rank has ended: nothing the rank started outlives it. Returns the pids that were ended."""
    import psutil

    from .processes import end_processes

    try:
        left = [c.pid for c in psutil.Process().children(recursive=True)]
    except psutil.Error:
        left = []
    if left:
        end_processes(pids=left, grace=grace, clean_shm=False)
    while True:   # they were re-parented to this subreaper: reap them
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return left


def guard() -> None:
    """Fork; return in the child (the rank goes on), never return in the parent (the guard).

    Does nothing (returns at once, no fork) without ``$NBMPI_STATUS_DIR`` or with
    ``NBMPI_RANK_GUARD=0``. Must be called before MPI is initialised.
    """
    status_dir = os.environ.get(STATUS_DIR_ENV)
    rank = rank_from_env()
    if not status_dir or rank is None or not guard_enabled(os.environ):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    passed_on = set()
    log_dir = os.environ.get(LOG_DIR_ENV)
    pipes = [os.pipe(), os.pipe()] if log_dir else []
    become_subreaper()
    child = os.fork()
    if child == 0:
        _die_with_parent()
        for fd, (r, w) in zip((1, 2), pipes):
            os.dup2(w, fd)
            os.close(r)
            os.close(w)
        if pipes:
            os.environ[LOG_GUARDED_ENV] = "1"
        return

    def pass_on(signum, frame):  # noqa: ARG001
        passed_on.add(signum)
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for s in _PASSED_ON:
        signal.signal(s, pass_on)
    status = _wait_rank(child, pipes, log_dir, rank,
                        on_end=lambda st: _report_signal(st, passed_on, status_dir, rank))
    _end_as_child(status, passed_on, status_dir, rank)


def _wait_rank(child: int, pipes, log_dir: Optional[str], rank: str, on_end=None) -> int:
    """Copy the rank's output (if ``pipes``) until the rank has ended and both pipes are closed;
    as soon as it has ended, call ``on_end(status)`` (the report) and end whatever the rank left
    running. Returns the rank's wait status."""
    logs, open_fds = {}, []
    if pipes:
        os.makedirs(log_dir, exist_ok=True)
        limit = _log_limit()
        for (r, w), stream in zip(pipes, ("stdout", "stderr")):
            os.close(w)
            logs[r] = CappedLog(os.path.join(log_dir, f"rank-{rank}.{stream}"), limit)
        open_fds = list(logs)
    status: Optional[int] = None
    while status is None or open_fds:
        if status is None:
            status = _reaped(child, block=not open_fds)
            if status is not None:
                if on_end is not None:
                    on_end(status)    # first: whoever watches the status directory waits for it
                end_leftovers()   # their copies of the pipes close with them
        if not open_fds:
            continue
        try:
            ready, _, _ = select.select(open_fds, [], [], 0.2 if status is None else None)
        except InterruptedError:
            continue
        for fd in ready:
            try:
                data = os.read(fd, 1 << 16)
            except InterruptedError:
                continue
            if data:
                logs[fd].write(data)
            else:
                open_fds.remove(fd)
                os.close(fd)
    for log in logs.values():
        log.close()
    return status


def _reaped(child: int, block: bool) -> Optional[int]:
    """The wait status of ``child`` once it has ended, else None (never None when ``block``)."""
    while True:
        try:
            pid, status = os.waitpid(child, 0 if block else os.WNOHANG)
        except InterruptedError:
            continue
        return status if pid == child else None


def _report_signal(status: int, passed_on: set, status_dir: str, rank: str) -> None:
    """Write ``rank-R.signal`` when a signal the guard did not pass on killed the rank."""
    if not os.WIFSIGNALED(status):
        return
    sig = os.WTERMSIG(status)
    if sig in _PASSED_ON:
        # a launcher ending the job signals the guard's whole process group: the rank may die of it
        # a moment before the guard's own copy arrives. Give it that moment before calling it a kill.
        end = time.monotonic() + 0.2
        while sig not in passed_on and time.monotonic() < end:
            time.sleep(0.01)
    if sig not in passed_on:
        try:
            tmp = os.path.join(status_dir, f".rank-{rank}.signal.tmp")
            with open(tmp, "w") as f:
                f.write(str(sig))
            os.replace(tmp, os.path.join(status_dir, f"rank-{rank}.signal"))
        except OSError:
            pass


def _end_as_child(status: int, passed_on: set, status_dir: str, rank: str) -> None:
    """End like the rank (it was reported by :func:`_report_signal`), after removing the shared
    memory a failed rank left on this node."""
    failed = not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        _remove_node_shm(status_dir, rank)
        if sig in passed_on and os.path.exists(os.path.join(status_dir, ENDING_FILE)):
            os._exit(0)   # the launcher ended the job on purpose and says so itself: no MPICH banner
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):   # SIGKILL and SIGSTOP keep their default anyway
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)   # a signal that does not end a process by default
    if failed:
        _remove_node_shm(status_dir, rank)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _remove_node_shm(status_dir: str, rank: str) -> None:
    """After the rank ended without finalizing MPI: unlink the ``/dev/shm`` segments it noted that no
    live process maps any more. Done here, on the rank's node (a launcher on another node cannot)."""
    try:
        from .processes import noted_segments, remove_shm

        remove_shm(noted_segments(status_dir, rank))
    except Exception:  # noqa: BLE001 - cleanup is best effort; the guard must still report the rank's end
        pass


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m nbmpi.workers.launch.rank_guard -m MODULE [args]``: guard, then run MODULE as ``__main__``."""
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "-m":
        print("usage: python -m nbmpi.workers.launch.rank_guard -m module [args]", file=sys.stderr)
        sys.exit(2)
    guard()
    sys.argv = argv[1:]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
