"""A pool's shared-memory sentinel: removes what the pool's ranks left in ``/dev/shm`` even when the
pool's owner dies before it could.

A notebook pool is ended by its owner, the kernel (:meth:`nbmpi.workers.launch.engine_pool.EnginePool.stop`):
:func:`nbmpi.workers.launch.processes.end_processes` SIGTERMs the pool, SIGKILLs whatever is left after a
grace period (the ranks' guards too, before they removed anything) and only then unlinks the
segments. jupyter_client SIGTERMs a kernel that has not exited 2.5 s after a shutdown request and
SIGKILLs it 2.5 s later; a kernel ended between its SIGKILL of the pool and that last step leaves
MPICH's ``mpich_shm_*`` segment behind, and so does a kernel killed while its ranks are frozen or
stuck. The sentinel closes that gap.

:func:`start` (called by :meth:`EnginePool.start` for pools bound to their owner, on this host) runs
``python -m nbmpi.workers.launch.shm_sentinel STATUS_DIR`` in a session of its own (a signal to the
owner's process group does not reach it), its stdin the read end of a pipe whose only write end the
owner holds. While the pool lives, the sentinel reads about every :data:`POLL_S` seconds the segments
the ranks noted in ``STATUS_DIR`` (:func:`~nbmpi.workers.launch.processes.noted_segments`) and keeps
them, also across a restart that replaces the directory's files. When the pipe closes -- the owner
called :func:`end` after its own clean-up, or the owner died, however -- the sentinel unlinks the kept
segments once no live process maps them (:func:`~nbmpi.workers.launch.processes.remove_shm`),
retrying for up to :data:`LINGER_S` seconds while the pool's last processes end, and exits.

Local; no MPI. A segment some unrelated live process still maps is never removed.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Iterable, List, Optional, Set

from .processes import noted_segments, remove_shm

#: Seconds between two reads of the status directory while the pool lives.
POLL_S = 1.0
#: Seconds the sentinel keeps trying, after its owner is gone, while the pool's processes still map a segment.
LINGER_S = 30.0


class Sentinel:
    """A started sentinel: the process and the write end of its pipe (see the module). Owner only."""

    def __init__(self, proc: subprocess.Popen, fd: int):
        self.proc = proc
        self.fd = fd


def start(status_dir: str) -> Optional[Sentinel]:
    """Start the sentinel of the pool whose ranks note their segments in ``status_dir``.

    Called by the pool's owner when it starts the pool; not blocking. None if the process cannot be
    started (the pool then works as before, without this safety net)."""
    r, w = os.pipe()   # (not inheritable: the pool's processes never hold the write end)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "nbmpi.workers.launch.shm_sentinel", status_dir],
                                stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    except OSError:
        os.close(w)
        return None
    finally:
        os.close(r)
    return Sentinel(proc, w)


def end(sentinel: Optional[Sentinel], wait: float = 2.0) -> None:
    """Tell the sentinel the pool has ended (its owner already removed the segments it could) and reap
    it, waiting up to ``wait`` s; a sentinel still waiting for a segment in use ends by itself within
    :data:`LINGER_S` s. Called by the owner after ending the pool; idempotent for a given sentinel."""
    if sentinel is None:
        return
    if sentinel.fd >= 0:
        os.close(sentinel.fd)
        sentinel.fd = -1
    try:
        sentinel.proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:   # still lingering: subprocess reaps it later
        pass


def sweep(paths: Iterable[str], linger: float = LINGER_S, period: float = 0.5) -> List[str]:
    """Unlink the ``/dev/shm`` segments among ``paths`` as soon as no live process maps them, trying
    until none is left or ``linger`` s have passed. Blocking. Returns those removed."""
    left: Set[str] = set(paths)
    removed: List[str] = []
    deadline = time.monotonic() + linger
    while True:
        removed += remove_shm(left)
        left = {p for p in left if os.path.lexists(p)}
        if not left or time.monotonic() >= deadline:
            return removed
        time.sleep(period)


def watch(status_dir: str, fd: int = 0, period: float = POLL_S, linger: float = LINGER_S) -> List[str]:
    """Keep the segments noted in ``status_dir`` until ``fd`` reaches end of file, then :func:`sweep`
    them. Blocking (the sentinel's main loop). Returns the segments removed."""
    kept: Set[str] = set()
    while True:
        kept |= noted_segments(status_dir)
        try:
            ready, _, _ = select.select([fd], [], [], period)
        except InterruptedError:
            continue
        if ready:
            try:
                if not os.read(fd, 4096):
                    break
            except OSError:
                break
    kept |= noted_segments(status_dir)
    return sweep(kept, linger)


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m nbmpi.workers.launch.shm_sentinel STATUS_DIR`` (stdin: the owner's pipe)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m nbmpi.workers.launch.shm_sentinel STATUS_DIR  (stdin: the owner's pipe)",
              file=sys.stderr)
        sys.exit(2)
    for s in (signal.SIGINT, signal.SIGHUP):   # a terminal's signals do not end it: the pipe's end does
        signal.signal(s, signal.SIG_IGN)
    watch(argv[0])


if __name__ == "__main__":
    main()
