"""Launch an SPMD Python program on N MPI ranks with the mpiexec that ships
with the install (the ``mpich`` wheel), and never leave a rank behind.

``nbmpi run -n N script.py [args]`` is :func:`run`. Each rank runs the script
through :mod:`nbmpi.workers.rank_entry`, which starts the runtime (tracer,
clock alignment) and writes the rank's exit code to a status directory. The
launcher:

* passes the environment (``MPI4PY_RC_THREAD_LEVEL=funneled`` unless set,
  unbuffered output, the status directory);
* watches the ranks: as soon as one rank fails, the whole process group of
  mpiexec is terminated (SIGTERM, then SIGKILL after a grace period), so no
  rank is left blocked forever waiting for the dead one;
* on Ctrl-C / SIGTERM terminates the whole process group likewise;
* returns the worst exit code: the highest code of the ranks that failed on
  their own (ranks killed because another failed do not count), 0 if all
  succeeded, mpiexec's own code if no rank reported.

To use a site MPI instead of the bundled MPICH, set ``NBMPI_MPIEXEC`` to the
site's launcher (and build mpi4py against that MPI, see README).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from .runtime import DEFAULT_THREAD_LEVEL, THREAD_LEVEL_ENV

MPIEXEC_ENV = "NBMPI_MPIEXEC"
STATUS_DIR_ENV = "NBMPI_STATUS_DIR"
GRACE_SECONDS = 3.0


def find_mpiexec() -> str:
    """Path of the mpiexec to use: ``$NBMPI_MPIEXEC``, else the one next to this
    Python (installed by the ``mpich`` wheel), else the first on PATH."""
    explicit = os.environ.get(MPIEXEC_ENV)
    if explicit:
        path = shutil.which(explicit)
        if not path:
            raise FileNotFoundError(f"{MPIEXEC_ENV}={explicit!r} is not an executable; "
                                    "point it at your site's mpiexec or unset it")
        return path
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    path = shutil.which("mpiexec")
    if not path:
        raise FileNotFoundError("no mpiexec found: install nbmpi with pip (it brings the mpich wheel) "
                                f"or set {MPIEXEC_ENV} to your MPI's launcher")
    return path


def rank_environment(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment every rank gets: this one plus funneled threads and unbuffered output."""
    env = dict(os.environ)
    env.setdefault(THREAD_LEVEL_ENV, DEFAULT_THREAD_LEVEL)
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def mpiexec_command(nranks: int, argv: Sequence[str], python: Optional[str] = None) -> List[str]:
    """The mpiexec command line running ``python -m nbmpi.workers.rank_entry argv`` on ``nranks`` ranks."""
    return [find_mpiexec(), "-n", str(nranks), python or sys.executable, "-m", "nbmpi.workers.rank_entry",
            *argv]


def terminate_group(proc: subprocess.Popen, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session``), SIGKILL after ``grace`` s."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        proc.poll()
        return
    kill_group(pgid, grace, proc)


def kill_group(pgid: int, grace: float = GRACE_SECONDS, proc: Optional[subprocess.Popen] = None) -> bool:
    """SIGTERM process group ``pgid``, SIGKILL after ``grace`` s; True if the group is gone.

    ``proc``: the group leader if it is our child; it is reaped while waiting
    (an unreaped zombie leader would keep the group alive)."""
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            if proc is not None:
                proc.poll()
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc is not None:
                proc.poll()
            if not group_alive(pgid):
                return True
            time.sleep(0.02)
    if proc is not None:
        proc.poll()
    return not group_alive(pgid)


def group_alive(pgid: int) -> bool:
    """True if process group ``pgid`` still has a member."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def read_status(status_dir: str, nranks: int) -> Dict[int, int]:
    """Exit codes the ranks reported so far (rank -> code)."""
    codes: Dict[int, int] = {}
    for r in range(nranks):
        path = os.path.join(status_dir, f"rank-{r}.exit")
        try:
            with open(path) as f:
                codes[r] = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            pass
    return codes


def run(nranks: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
        stdout=None, stderr=None, timeout: Optional[float] = None, quiet: bool = False) -> int:
    """Run ``argv`` (a script path and its arguments, or ``-m module ...`` / ``-c code``) on
    ``nranks`` ranks. Blocks until every rank has ended; returns the worst exit code.

    ``timeout`` (s): terminate all ranks after it and return 124.
    """
    if nranks < 1:
        raise ValueError(f"-n must be at least 1, got {nranks}")
    status_dir = tempfile.mkdtemp(prefix="nbmpi-status-")
    renv = rank_environment(env)
    renv[STATUS_DIR_ENV] = status_dir
    cmd = mpiexec_command(nranks, argv)
    failed_at: Optional[float] = None
    interrupted = timed_out = False
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum, frame):  # noqa: ARG001
        nonlocal interrupted
        interrupted = True

    # Handlers first, then mpiexec: a Ctrl-C arriving right after the start must
    # still end the (new-session) process group instead of orphaning it.
    try:
        for s in old:
            signal.signal(s, on_signal)
    except ValueError:  # not the main thread: signals stay with the caller
        old = {}
    proc = None
    try:
        proc = subprocess.Popen(cmd, env=renv, stdout=stdout, stderr=stderr, start_new_session=True)
        t_start = time.monotonic()
        while proc.poll() is None:
            time.sleep(0.05)
            if interrupted:
                terminate_group(proc)
                break
            if timeout is not None and time.monotonic() - t_start > timeout:
                timed_out = True
                terminate_group(proc)
                break
            codes = read_status(status_dir, nranks)
            if any(c != 0 for c in codes.values()):
                if failed_at is None:
                    failed_at = time.monotonic()
                elif time.monotonic() - failed_at > 0.5 or len(codes) == nranks:
                    terminate_group(proc)
                    break
        proc.wait()
        terminate_group(proc, grace=0.5)  # stragglers in the group (none expected)
    finally:
        if proc is not None and proc.poll() is None:  # an exception in the watch loop
            terminate_group(proc)
        for s, h in old.items():
            signal.signal(s, h)
    codes = read_status(status_dir, nranks)
    shutil.rmtree(status_dir, ignore_errors=True)
    if interrupted:
        if not quiet:
            print("nbmpi run: interrupted; all ranks terminated", file=sys.stderr)
        return 130
    if timed_out:
        if not quiet:
            print(f"nbmpi run: timed out after {timeout} s; all ranks terminated", file=sys.stderr)
        return 124
    bad = {r: c for r, c in codes.items() if c != 0}
    if bad:
        worst = max(bad.values())
        if not quiet:
            missing = sorted(set(range(nranks)) - set(codes))
            msg = ", ".join(f"rank {r} exited {c}" for r, c in sorted(bad.items()))
            if missing:
                msg += f"; ranks {missing} were terminated"
            print(f"nbmpi run: {msg}", file=sys.stderr)
        return worst
    if len(codes) == nranks:
        return 0
    rc = proc.returncode
    return rc if rc and rc > 0 else (128 - rc if rc and rc < 0 else 1)


def start(nranks: int, argv: Sequence[str], status_dir: str, env: Optional[Dict[str, str]] = None,
          stdout=None, stderr=None, cwd: Optional[str] = None) -> subprocess.Popen:
    """Start ``argv`` on ``nranks`` ranks and return at once (for the controller's batch jobs).

    Non-blocking counterpart of :func:`run`: mpiexec is started in a new session
    (its pid is the process group id to pass to :func:`terminate_group`), ranks
    report their exit codes to ``status_dir`` (read them with :func:`read_status`).
    The caller watches the process and must end the group itself.
    """
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, got {nranks}")
    os.makedirs(status_dir, exist_ok=True)
    renv = rank_environment(env)
    renv[STATUS_DIR_ENV] = status_dir
    return subprocess.Popen(mpiexec_command(nranks, argv), env=renv, stdout=stdout, stderr=stderr,
                            cwd=cwd, start_new_session=True)
