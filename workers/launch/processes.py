"""Ending the processes nbmpi starts: process groups, pid lists, and the shared memory they leave.

One helper for every launch (``nbmpi run``, controller jobs, notebook and
controller pools): :func:`end_processes` sends SIGTERM to process groups and
single processes, waits up to a grace period, sends SIGKILL to whatever is
left, and waits until everything is gone. Before it signals anything it reads
which files in ``/dev/shm`` the victims have mapped (MPICH's ``mpich_shm_*``
segments, nbmpi's own ``nbmpi-*`` channel segments) and afterwards unlinks
those that no live process maps any more, so ranks that are killed leave no
shared memory behind.

:func:`end_cgroup` ends everything in a job's or pool's cgroup (:mod:`nbmpi.workers.launch.cgroups`),
also what escaped every process tree (a daemon whose guard the job killed), and removes it.

Everything here is local to this host and never raises for a process that is
already gone; a pid that no longer belongs to what the caller recorded (pid
reuse after a restart) is filtered by the caller's ``still_ours`` predicate.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Callable, Iterable, List, Optional, Sequence, Set

import psutil

from . import cgroups

#: Seconds between SIGTERM and SIGKILL unless the caller says otherwise.
GRACE_SECONDS = 3.0
#: Seconds to wait for killed processes to disappear.
KILL_WAIT_SECONDS = 5.0
SHM_DIR = "/dev/shm"


def group_members(pgid: int) -> List[int]:
    """Pids of the live processes whose process group is ``pgid``."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError, OSError):
            pass
    return out


def group_alive(pgid: int) -> bool:
    """True if process group ``pgid`` still has a member (zombies count until reaped)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def shm_segments_of(pids: Iterable[int]) -> Set[str]:
    """Paths under ``/dev/shm`` that the processes ``pids`` have mapped or open (best effort)."""
    found: Set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    i = line.find(SHM_DIR + "/")
                    if i >= 0:
                        found.add(line[i:].strip().removesuffix(" (deleted)"))
        except OSError:
            pass
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(SHM_DIR + "/") and not target.endswith(" (deleted)"):
                    found.add(target)
        except OSError:
            pass
    return found


def segments_in_use(paths: Set[str]) -> Set[str]:
    """The paths among ``paths`` that some live process still maps or holds open."""
    still: Set[str] = set()
    for p in psutil.process_iter(["pid"]):
        if not paths - still:
            break
        still |= shm_segments_of([p.pid]) & paths
    return still


def remove_shm(paths: Iterable[str]) -> List[str]:
    """Unlink the ``/dev/shm`` files among ``paths`` that no live process uses; returns those removed.

    Only names directly in ``/dev/shm`` count (``/dev/shm/../x`` does not): the paths may come from
    files a job wrote (:func:`noted_segments`), and the remover may be root."""
    paths = {p for p in paths if os.path.dirname(os.path.normpath(p)) == SHM_DIR and os.path.lexists(p)}
    if not paths:
        return []
    removed = []
    for path in sorted(paths - segments_in_use(paths)):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def note_segments(status_dir: str, rank: str) -> None:
    """Append the ``/dev/shm`` segments this process maps now to ``STATUS_DIR/rank-RANK.shm``.

    Called by each rank (after MPI starts and before it exits) so whoever launched it can remove
    what a rank killed before ``MPI_Finalize`` leaves (:func:`noted_segments`, :func:`remove_shm`)."""
    segments = sorted(shm_segments_of([os.getpid()]))
    if not segments:
        return
    try:
        with open(os.path.join(status_dir, f"rank-{rank}.shm"), "a") as f:
            f.write("\n".join(segments) + "\n")
    except OSError:  # the launcher is gone: nobody to clean up for
        pass


def noted_segments(status_dir: str, rank: Optional[str] = None) -> Set[str]:
    """Every segment the ranks (only rank ``rank`` when given) noted in ``status_dir`` with
    :func:`note_segments`."""
    found: Set[str] = set()
    try:
        names = [n for n in os.listdir(status_dir) if n.endswith(".shm") and (rank is None or n == f"rank-{rank}.shm")]
    except OSError:
        return found
    for n in names:
        try:
            with open(os.path.join(status_dir, n)) as f:
                found.update(line.strip() for line in f if line.strip())
        except OSError:
            pass
    return found


def end_processes(groups: Sequence[int] = (), pids: Sequence[int] = (), grace: float = GRACE_SECONDS,
                  leaders: Sequence[subprocess.Popen] = (),
                  still_ours: Optional[Callable[[int], bool]] = None, clean_shm: bool = True) -> bool:
    """End process groups ``groups`` and processes ``pids``; block until they are gone.

    Every descendant of those processes is a victim too (MPI process managers
    run their proxies and ranks in sessions of their own). SIGTERM to the
    targets first, SIGKILL to every victim left after ``grace`` seconds, then
    wait up to :data:`KILL_WAIT_SECONDS`. ``leaders``: ``Popen`` objects among
    them that are this process's children; they are reaped while waiting (an
    unreaped zombie leader would keep its group alive). ``still_ours(pid)``:
    when given, a group or pid for which it returns False is not signalled
    (protects against pid reuse). With ``clean_shm`` the ``/dev/shm``
    segments the victims had mapped are unlinked once nobody maps them.
    Returns True when no targeted process is left. Local; never raises for
    processes that are already gone.
    """
    ok = still_ours or (lambda pid: True)
    groups = [g for g in dict.fromkeys(groups) if g and g > 0 and ok(g)]
    pids = [p for p in dict.fromkeys(pids) if p and p > 0 and p != os.getpid() and ok(p)]
    # MPI process managers put their proxies and ranks in sessions of their own: every descendant
    # of a targeted process is a victim too (found now, before anything is signalled)
    victims = set(pids)
    for g in groups:
        victims.update(group_members(g))
    for v in list(victims):
        try:
            victims.update(c.pid for c in psutil.Process(v).children(recursive=True))
        except psutil.Error:
            pass
    victims.discard(os.getpid())
    shm = shm_segments_of(victims) if clean_shm else set()

    def reap() -> None:
        for proc in leaders:
            proc.poll()

    def left() -> List[int]:
        reap()
        alive = [g for g in groups if group_alive(g)]
        alive += [p for p in victims if psutil.pid_exists(p) and _not_zombie(p)]
        return alive

    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_SECONDS)):
        for g in groups:
            try:
                os.killpg(g, sig)
            except (ProcessLookupError, PermissionError):
                pass
        # SIGTERM the targets and let them end their children; SIGKILL every victim
        for p in (pids if sig == signal.SIGTERM else victims):
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while left() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not left():
            break
    gone = not left()
    deadline = time.monotonic() + 1.0   # killed orphans are reaped by init: let it happen before we return
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in victims):
        reap()
        time.sleep(0.01)
    if shm:
        remove_shm(shm)
    return gone


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end_group_of(proc: subprocess.Popen, grace: float = GRACE_SECONDS) -> bool:
    """End the process group led by ``proc`` (started with ``start_new_session=True``) and reap it."""
    ok = end_processes(groups=[proc.pid], leaders=[proc], grace=grace)
    proc.poll()
    return ok


def end_cgroup(path: str, clean_shm: bool = True) -> bool:
    """SIGKILL every process in the cgroup ``path`` (a job's or pool's, made by
    :meth:`nbmpi.workers.launch.cgroups.ControllerCgroups.create`), block until it is empty (up to
    :data:`KILL_WAIT_SECONDS`), then remove it. Run as root, after the caller ended what it follows
    (:func:`end_processes`: those get their SIGTERM first). With ``clean_shm`` the ``/dev/shm``
    segments the victims had mapped are unlinked once nobody maps them. Returns True when the
    cgroup is gone (or never existed); never raises for processes or a cgroup already gone."""
    if not os.path.isdir(path):
        return True
    victims = cgroups.members(path)
    shm = shm_segments_of(victims) if clean_shm and victims else set()
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    cgroups.kill_all(path)
    while cgroups.populated(path) and time.monotonic() < deadline:
        time.sleep(0.02)
        if cgroups.members(path):   # (the freeze fallback misses a process forked while it read the list)
            cgroups.kill_all(path)
    gone = cgroups.remove(path, timeout=max(deadline - time.monotonic(), 0.5))
    if shm:
        remove_shm(shm)
    return gone
