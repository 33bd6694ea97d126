"""Control groups (cgroup v2) that hold every process of one controller job or pool.

A job runs in the same UNIX account as its rank guards, so it can kill its guard (and the MPI
process manager above it) and leave a daemon (double fork, ``setsid``, closed fds) re-parented
above every subreaper nbmpi has. A cgroup cannot be left that way: a process not root cannot
move itself out (``cgroup.procs`` belongs to root), and its children are born inside. So a
controller run by root on a host with a writable cgroup v2 hierarchy gives each job and pool a
cgroup of its own, ``<cgroup2 mount>/nbmpi/<controller key>/job-<id>`` (``pool-<id>``), made by
:meth:`ControllerCgroups.create`; the process it starts enters it *before* it can fork and
before it drops to the user's account: :func:`enter_command` wraps the command in this very
file, run as a script (``python -I -S cgroups.py DIR UID GID -- CMD...``) that writes its own
pid to ``DIR/cgroup.procs``, drops to ``UID``/``GID`` (supplementary groups cleared) and
``exec``s ``CMD`` (subprocess's own ``user=``/``group=`` drop privileges before ``preexec_fn``
runs, too early for the move). :func:`nbmpi.workers.launch.processes.end_cgroup` ends
everything in one (``cgroup.kill``, or freeze, SIGKILL each, thaw on kernels before 5.14) and
removes it.

:func:`ControllerCgroups.open` returns None where this is not possible (not root, no cgroup v2,
read-only): rank guards, child subreapers, are then the only containment (:data:`SUBREAPER_PHRASE`).

This file imports nothing outside the standard library: the wrapper runs it by path, isolated
(``-I -S``), before any account switch. Linux only.
"""
from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from typing import List, Optional, Sequence

#: Directory under the cgroup v2 mount that holds every nbmpi controller's groups.
TOP = "nbmpi"
#: What a controller says about containment with cgroups (``/api/health``).
CGROUP_PHRASE = "cgroup: every job and pool runs in a cgroup of its own, and everything in it ends with it"
#: What it says without them.
SUBREAPER_PHRASE = ("subreaper only: each rank's guard ends what its rank leaves behind, but a job that kills its "
                    "own guard can leave a process running; run nbmpi serve as root on a host with a writable "
                    "cgroup v2 hierarchy for full containment")


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> Optional[str]:
    """Mount point of the cgroup v2 hierarchy (``/sys/fs/cgroup`` on unified hosts,
    ``/sys/fs/cgroup/unified`` on hybrid ones), or None when there is none."""
    try:
        with open(mounts) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 3 and fields[2] == "cgroup2":
                    return fields[1].replace("\\040", " ")
    except OSError:
        pass
    return None


def members(path: str) -> List[int]:
    """Pids of the processes in cgroup ``path`` and its descendants ([] when it is gone)."""
    pids: List[int] = []
    for root, _dirs, _files in os.walk(path):
        try:
            with open(os.path.join(root, "cgroup.procs")) as f:
                pids.extend(int(line) for line in f if line.strip())
        except (OSError, ValueError):
            pass
    return pids


def populated(path: str) -> bool:
    """True while some process is in ``path`` or below (False when the cgroup is gone)."""
    try:
        with open(os.path.join(path, "cgroup.events")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "populated":
                    return value.strip() == "1"
    except OSError:
        return False
    return bool(members(path))


def kill_all(path: str) -> None:
    """SIGKILL every process in cgroup ``path`` and below, also those forking meanwhile: one write
    to ``cgroup.kill`` (Linux 5.14+), else freeze, SIGKILL each member, thaw. Never raises for a
    cgroup already gone; does not wait (see :func:`populated`)."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
        return
    except FileNotFoundError:
        if not os.path.isdir(path):
            return
    freeze = os.path.join(path, "cgroup.freeze")
    try:
        with open(freeze, "w") as f:
            f.write("1")
    except OSError:
        freeze = ""
    for pid in members(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if freeze:   # the killed processes die once thawed
        try:
            with open(freeze, "w") as f:
                f.write("0")
        except OSError:
            pass


def remove(path: str, timeout: float = 5.0) -> bool:
    """Remove the empty cgroup ``path`` and its empty descendants; True when it is gone.
    Retries while the kernel still counts exiting processes (EBUSY) up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            for root, dirs, _files in os.walk(path, topdown=False):
                for d in dirs:
                    os.rmdir(os.path.join(root, d))
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return not os.path.isdir(path)
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


class ControllerCgroups:
    """The cgroups of one controller: ``<mount>/nbmpi/<key>/``, one child per job or pool.

    Made with :meth:`open` when the controller starts. ``key`` identifies the controller across
    its restarts (a hash of its data directory), so the next start finds what a dead one left
    (:meth:`names`). Thread-safe (each call is one directory operation)."""

    def __init__(self, base: str):
        #: The controller's directory in the cgroup v2 hierarchy.
        self.base = base

    @staticmethod
    def key_of(data_dir: str) -> str:
        """The controller key of the service serving ``data_dir``."""
        return "c-" + hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:16]

    @classmethod
    def open(cls, data_dir: str) -> Optional["ControllerCgroups"]:
        """The cgroups of the controller serving ``data_dir``, its directory made now; None when this
        process is not root, the host has no cgroup v2 hierarchy, or it is not writable."""
        mount = cgroup2_mount()
        if os.geteuid() != 0 or mount is None or not sys.platform.startswith("linux"):
            return None
        base = os.path.join(mount, TOP, cls.key_of(data_dir))
        try:
            os.makedirs(base, exist_ok=True)
            probe = os.path.join(base, f"probe-{os.getpid()}")
            os.mkdir(probe)
            ok = os.path.exists(os.path.join(probe, "cgroup.procs"))
            os.rmdir(probe)
        except OSError:
            return None
        return cls(base) if ok else None

    def path(self, name: str) -> str:
        """The path of child ``name`` (e.g. ``job-7``)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a cgroup name: {name!r}")
        return os.path.join(self.base, name)

    def create(self, name: str) -> str:
        """Make the (empty) child ``name`` and return its path. A leftover of that name (a previous
        run of this controller) must have been ended first (FileExistsError otherwise)."""
        path = self.path(name)
        os.mkdir(path)
        return path

    def names(self) -> List[str]:
        """The children there now (jobs and pools of this controller, and of its previous runs)."""
        try:
            return sorted(e.name for e in os.scandir(self.base) if e.is_dir(follow_symlinks=False))
        except OSError:
            return []

    def owns(self, path: str) -> bool:
        """True when ``path`` (e.g. from a stored record) is a child of this controller's directory."""
        return os.path.dirname(os.path.normpath(str(path))) == self.base


def enter_command(cgroup: str, cmd: Sequence[str], uid: Optional[int] = None,
                  gid: Optional[int] = None) -> List[str]:
    """``cmd`` prefixed by the wrapper that puts it in ``cgroup`` and then runs it as ``uid``/``gid``
    (None: stays the starting account). Start it as root (the wrapper moves itself, then drops)."""
    ids = [str(uid) if uid is not None else "-", str(gid) if gid is not None else "-"]
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), cgroup, *ids, "--", *cmd]


def _main(argv: Sequence[str]) -> int:
    """The wrapper (see the module): ``DIR UID GID -- CMD...``; exits 127 naming what failed."""
    if len(argv) < 5 or argv[3] != "--":
        print("usage: cgroups.py CGROUP_DIR UID|- GID|- -- COMMAND...", file=sys.stderr)
        return 2
    path, uid, gid, cmd = argv[0], argv[1], argv[2], list(argv[4:])
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError as exc:
        print(f"nbmpi: cannot enter the job's cgroup {path}: {exc}; nothing was started", file=sys.stderr)
        return 127
    try:
        if gid != "-" or uid != "-":
            os.setgroups([])
        if gid != "-":
            os.setgid(int(gid))
        if uid != "-":
            os.setuid(int(uid))
    except (OSError, ValueError) as exc:
        print(f"nbmpi: cannot switch to uid {uid} gid {gid}: {exc}; nothing was started", file=sys.stderr)
        return 127
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"nbmpi: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
