"""Control groups (cgroup v2, or v1's freezer) that hold every process of one controller job or pool.

A job runs in the same UNIX account as its rank guards, so it can kill its guard (and the MPI
process manager above it) and leave a daemon (double fork, ``setsid``, closed fds) re-parented
above every subreaper nbmpi has. A cgroup cannot be left that way: a process not root cannot
move itself out (``cgroup.procs`` belongs to root), and its children are born inside. So a
controller run by root on a host with a writable cgroup v2 hierarchy (else the v1 ``freezer``
one) gives each job and pool a cgroup of its own, ``<mount>/nbmpi/<controller key>/job-<id>``
(``pool-<id>``), made by
:meth:`ControllerCgroups.create`; the process it starts enters it *before* it can fork and
before it drops to the user's account: :func:`enter_command` wraps the command in this very
file, run as a script (``python -I -S cgroups.py DIR UID GID -- CMD...``) that writes its own
pid to ``DIR/cgroup.procs``, drops to ``UID``/``GID`` (supplementary groups cleared) and
``exec``s ``CMD`` (subprocess's own ``user=``/``group=`` drop privileges before ``preexec_fn``
runs, too early for the move). :func:`nbmpi.workers.launch.processes.end_cgroup` ends
everything in one (``cgroup.kill``, or freeze, SIGKILL each, thaw on kernels before 5.14 and on
v1) and removes it.

:func:`ControllerCgroups.open` returns None where this is not possible (not root, neither a cgroup
v2 nor a v1 freezer hierarchy, or not writable): rank guards, child subreapers, are then the only
containment (:data:`SUBREAPER_PHRASE`).

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

#: Directory under the hierarchy's mount that holds every nbmpi controller's groups.
TOP = "nbmpi"
#: What a controller says about containment with cgroups (``/api/health``).
CGROUP_PHRASE = "cgroup: every job and pool runs in a cgroup of its own, and everything in it ends with it"
#: What it says without them.
SUBREAPER_PHRASE = ("subreaper only: each rank's guard ends what its rank leaves behind, but a job that kills its "
                    "own guard can leave a process running; run nbmpi serve as root on a host with a writable "
                    "cgroup hierarchy (v2, or v1's freezer) for full containment")


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> Optional[str]:
    """Mount point of the cgroup v2 hierarchy (``/sys/fs/cgroup`` on unified hosts,
    ``/sys/fs/cgroup/unified`` on hybrid ones), or None when there is none."""
    return _mount_of(mounts, lambda fstype, options: fstype == "cgroup2")


def freezer_mount(mounts: str = "/proc/self/mounts") -> Optional[str]:
    """Mount point of the cgroup v1 ``freezer`` hierarchy (hosts without cgroup v2), or None."""
    return _mount_of(mounts, lambda fstype, options: fstype == "cgroup" and "freezer" in options)


def _mount_of(mounts: str, wanted) -> Optional[str]:
    try:
        with open(mounts) as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 4 and wanted(fields[2], fields[3].split(",")):
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
    except OSError:   # cgroup v1 has no cgroup.events
        pass
    return bool(members(path))


def kill_all(path: str) -> None:
    """SIGKILL every process in cgroup ``path`` and below, also those forking meanwhile: one write
    to ``cgroup.kill`` (cgroup v2, Linux 5.14+), else freeze (``cgroup.freeze``, or v1's
    ``freezer.state``), SIGKILL each member, thaw. Never raises for a cgroup already gone; does not
    wait for the processes to go (see :func:`populated`)."""
    if not os.path.isdir(path):
        return
    if os.path.exists(os.path.join(path, "cgroup.kill")):
        try:
            with open(os.path.join(path, "cgroup.kill"), "w") as f:
                f.write("1")
            return
        except OSError:   # removed meanwhile, or refused: kill each below
            pass
    thaw = _freeze(path)
    for pid in members(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if thaw is not None:   # the killed processes die once thawed
        try:
            with open(thaw[0], "w") as f:
                f.write(thaw[1])
        except OSError:
            pass


def _freeze(path: str, timeout: float = 2.0):
    """Freeze cgroup ``path`` (no member can fork meanwhile) and wait up to ``timeout`` seconds until
    it is; the (file, value) that thaws it, or None when it cannot be frozen."""
    for name, frozen, thawed, done in (("cgroup.freeze", "1", "0", "frozen 1"),
                                       ("freezer.state", "FROZEN", "THAWED", "FROZEN")):
        control = os.path.join(path, name)
        if not os.path.exists(control):   # (writing a missing file in a cgroup fs: EACCES)
            continue
        try:
            with open(control, "w") as f:
                f.write(frozen)
        except OSError:
            continue
        state = os.path.join(path, "cgroup.events" if name == "cgroup.freeze" else name)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(state) as f:
                    if done in f.read():
                        break
            except OSError:
                break
            time.sleep(0.005)
        return control, thawed
    return None


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
        #: The controller's directory in its cgroup hierarchy (v2, or v1's freezer).
        self.base = base

    @staticmethod
    def key_of(data_dir: str) -> str:
        """The controller key of the service serving ``data_dir``."""
        return "c-" + hashlib.sha256(os.path.realpath(data_dir).encode()).hexdigest()[:16]

    @classmethod
    def open(cls, data_dir: str, mount: Optional[str] = None) -> Optional["ControllerCgroups"]:
        """The cgroups of the controller serving ``data_dir``, its directory made now, in the cgroup
        hierarchy mounted at ``mount`` (default: the cgroup v2 one, else v1's ``freezer``); None when
        this process is not root, the host has no such hierarchy, or it is not writable."""
        if os.geteuid() != 0 or not sys.platform.startswith("linux"):
            return None
        for candidate in ([mount] if mount else [cgroup2_mount(), freezer_mount()]):
            if candidate is not None and cls._writable(os.path.join(candidate, TOP, cls.key_of(data_dir))):
                return cls(os.path.join(candidate, TOP, cls.key_of(data_dir)))
        return None

    @staticmethod
    def _writable(base: str) -> bool:
        """Make ``base`` and check a cgroup can be made in it."""
        try:
            os.makedirs(base, exist_ok=True)
            probe = os.path.join(base, f"probe-{os.getpid()}")
            os.mkdir(probe)
            ok = os.path.exists(os.path.join(probe, "cgroup.procs"))
            os.rmdir(probe)
            return ok
        except OSError:
            return False

    def path(self, name: str) -> str:
        """The path of child ``name`` (e.g. ``job-7``)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a cgroup name: {name!r}")
        return os.path.join(self.base, name)

    def create(self, name: str) -> str:
        """Make the (empty) child ``name`` and return its path. A leftover of that name (a previous
        run of this controller) must have been ended first (FileExistsError otherwise). The
        controller's directory is made again if it is gone: a previous run of the same controller
        that was still stopping removes it when empty (its ``close``), also after this run opened it."""
        path = self.path(name)
        for _ in range(3):
            try:
                os.mkdir(path)
                return path
            except FileNotFoundError:
                os.makedirs(self.base, exist_ok=True)
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
