"""Launch an SPMD Python program on N MPI ranks with the mpiexec that ships
with the install (the ``mpich`` wheel), and never leave a rank behind.

``nbmpi run -n N script.py [args]`` is :func:`run`. Each rank runs the script
through :mod:`nbmpi.workers.launch.rank_entry`, which starts the runtime (tracer,
clock alignment) and writes the rank's exit code to a status directory. The
launcher:

* passes the environment (``MPI4PY_RC_THREAD_LEVEL=funneled`` unless set,
  unbuffered output, the status directory);
* watches the ranks: as soon as one rank fails, the whole process group of
  mpiexec is terminated (SIGTERM, then SIGKILL after a grace period), so no
  rank is left blocked forever waiting for the dead one;
* on Ctrl-C / SIGTERM or at ``timeout`` first asks every rank where it is
  (:func:`~nbmpi.workers.launch.rank_location.request_locations`: operation, peer, user line)
  and prints one line per rank, then terminates the whole process group likewise; the
  ranks' guards know it was on purpose (:func:`~nbmpi.workers.launch.rank_guard.mark_ending`)
  and exit quietly, so MPICH prints no "BAD TERMINATION" banner;
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
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from . import environment
from .environment import LAUNCHER_EXEC_ENV, LAUNCHER_LOCALHOST_ENV, MPIEXEC_ENV, STATUS_DIR_ENV
from .identity import Identity, start_options
from .processes import end_group_of, noted_segments, remove_shm, shm_segments_of
from .rank_guard import mark_ending
from .rank_location import describe_snapshot, request_locations

GRACE_SECONDS = 3.0
#: Seconds the other ranks get after one rank failed before the whole launch is ended.
FAILURE_GRACE_S = 0.5


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
    """The environment every rank of ``nbmpi run`` gets: this process's own plus funneled threads and
    unbuffered output, then ``extra`` (:func:`nbmpi.workers.launch.environment.rank_environment`)."""
    return environment.rank_environment(os.environ, extra)


RANK_ENTRY = "nbmpi.workers.launch.rank_entry"




def placement_args(hosts: Optional[Sequence[str]] = None, hostfile: Optional[str] = None,
                   env: Optional[Dict[str, str]] = None) -> List[str]:
    """mpiexec (Hydra) options placing the ranks on ``hosts`` (names or addresses; ``host:N`` gives
    it N slots) or on the hosts of ``hostfile`` (one ``host[:N]`` a line), filled in order as
    ``mpiexec -hosts`` / ``-f`` do. Hydra starts its proxies over ssh, or with
    ``$NBMPI_LAUNCHER_EXEC`` instead of ssh, and they call back to ``$NBMPI_LAUNCHER_LOCALHOST``
    when set (read from ``env``, default this process's environment). Empty when neither is given
    (every rank on this host)."""
    if hosts and hostfile:
        raise ValueError("give the hosts either as a list (--hosts) or in a file (--hostfile), not both")
    if not hosts and not hostfile:
        return []
    out = ["-launcher", "ssh"]
    env = os.environ if env is None else env
    standin = env.get(LAUNCHER_EXEC_ENV)
    if standin:
        out += ["-launcher-exec", standin]
    here = env.get(LAUNCHER_LOCALHOST_ENV)
    if here:
        out += ["-localhost", here]
    return out + (["-hosts", ",".join(hosts)] if hosts else ["-f", str(hostfile)])


def mpiexec_command(nranks: int, argv: Sequence[str], python: Optional[str] = None,
                    module: str = RANK_ENTRY, hosts: Optional[Sequence[str]] = None,
                    hostfile: Optional[str] = None, env: Optional[Dict[str, str]] = None) -> List[str]:
    """The mpiexec command line running ``python -m MODULE argv`` on ``nranks`` ranks
    (placed on ``hosts`` / ``hostfile`` when given: :func:`placement_args`).

    ``module`` is :mod:`nbmpi.workers.launch.rank_entry` for programs (``nbmpi run``,
    controller jobs) and ``ipyparallel.engine`` for the engines of a pool. When every rank runs on this
    host under the bundled mpiexec (no ``$NBMPI_MPIEXEC``: e.g. ``srun`` in a Slurm allocation places
    ranks on several nodes and has no ``-genv``), the ranks' BLAS libraries get ``cpus // nranks`` threads
    each (``-genv``, unless ``env``, default this process's environment, sets a BLAS thread count:
    :func:`~.environment.blas_threads`).
    """
    genv: List[str] = []
    if not hosts and not hostfile and not os.environ.get(MPIEXEC_ENV):   # Hydra's -genv: not srun's, nor another MPI's
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        for name, value in environment.blas_threads(os.environ if env is None else env, nranks, cpus).items():
            genv += ["-genv", name, value]
    return [find_mpiexec(), *placement_args(hosts, hostfile, env), *genv, "-n", str(nranks),
            python or sys.executable, "-m", module, *argv]


def read_status(status_dir: str, nranks: int) -> Dict[int, int]:
    """Exit codes the ranks reported so far in ``status_dir`` (rank -> code)."""
    codes: Dict[int, int] = {}
    for r in range(nranks):
        path = os.path.join(status_dir, f"rank-{r}.exit")
        try:
            with open(path) as f:
                codes[r] = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            pass
    return codes


def read_signals(status_dir: str, nranks: int) -> Dict[int, str]:
    """Signals that killed ranks, as their guards reported them in ``status_dir`` (rank -> name)."""
    out: Dict[int, str] = {}
    for r in range(nranks):
        try:
            with open(os.path.join(status_dir, f"rank-{r}.signal")) as f:
                out[r] = _signal_name(int(f.read().strip()))
        except (FileNotFoundError, ValueError):
            pass
    return out


@dataclass
class RankOutcome:
    """How a launch ended: ``exit_code`` (the worst code of the ranks that failed on their own,
    128 + N for a rank killed by signal N, 0 if all succeeded, else mpiexec's), ``codes`` (per rank;
    None for a rank that never reported because it was terminated or killed) and ``message``
    (None on success), e.g. ``"rank 1 was killed by SIGKILL; ranks [0] were terminated"``."""
    exit_code: int
    codes: List[Optional[int]]
    message: Optional[str]


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class RankWatch:
    """Watches the ranks of one launch through its status directory (the one rank-watch loop step).

    Ranks report their pid at start and their exit code at the end there
    (:mod:`nbmpi.workers.launch.rank_entry`); a rank's guard reports the signal that
    killed it (:mod:`nbmpi.workers.launch.rank_guard`). Call :meth:`should_end`
    periodically while mpiexec runs: it becomes True :data:`FAILURE_GRACE_S`
    seconds after the first rank failed or was killed (or at once when every
    rank has reported), which is when the caller ends the whole process group
    so no rank stays blocked on the failed one. :meth:`outcome` turns the
    reports into the launch's result. Local; no communication; cheap (reads
    at most ``3 * nranks`` small files).
    """

    def __init__(self, status_dir: str, nranks: int):
        self.status_dir = str(status_dir)
        self.nranks = int(nranks)
        self._failed_at: Optional[float] = None
        self._seen_shm: set = set()
        self._observed_at = 0.0

    def codes(self) -> Dict[int, int]:
        """Exit codes reported so far (rank -> code)."""
        return read_status(self.status_dir, self.nranks)

    def pids(self) -> Dict[int, int]:
        """Pids the ranks reported at start (rank -> pid)."""
        out: Dict[int, int] = {}
        for r in range(self.nranks):
            try:
                with open(os.path.join(self.status_dir, f"rank-{r}.pid")) as f:
                    out[r] = int(f.read().strip())
            except (FileNotFoundError, ValueError):
                pass
        return out

    def observe(self, every: float = 1.0) -> None:
        """Note the ``/dev/shm`` segments the live ranks have mapped (at most once per ``every`` s),
        so :meth:`clean_up` also finds segments of ranks that are later killed."""
        now = time.monotonic()
        if now - self._observed_at >= every:
            self._observed_at = now
            self._seen_shm |= shm_segments_of(self.pids().values())

    def shm_segments(self) -> List[str]:
        """The ``/dev/shm`` segments of this launch: noted by the ranks at start and exit, and seen
        mapped by them while they ran (:meth:`observe`)."""
        return sorted(self._seen_shm | noted_segments(self.status_dir))

    def clean_up(self) -> List[str]:
        """After the launch: remove the shared memory its ranks left (killed ranks never free it).
        Only segments no live process maps are removed. Returns those removed."""
        return remove_shm(self.shm_segments())

    def should_end(self) -> bool:
        """True once a rank failed and the others had their grace period (or all reported)."""
        self.observe()
        codes = self.codes()
        if not any(c != 0 for c in codes.values()) and not self.killed():
            return False
        now = time.monotonic()
        if self._failed_at is None:
            self._failed_at = now
        return now - self._failed_at > FAILURE_GRACE_S or len(codes) == self.nranks

    def killed(self) -> Dict[int, str]:
        """Ranks a signal killed (rank -> signal name, e.g. ``"SIGKILL"``), as their guards reported
        (:mod:`nbmpi.workers.launch.rank_guard`); ranks the launch ended itself are not among them."""
        return read_signals(self.status_dir, self.nranks)

    def outcome(self, returncode: Optional[int]) -> RankOutcome:
        """The result once mpiexec has ended with ``returncode`` (negative: killed by that signal)."""
        got = self.codes()
        codes = [got.get(r) for r in range(self.nranks)]
        bad = {r: c for r, c in got.items() if c != 0}
        killed = {r: s for r, s in self.killed().items() if r not in got}
        missing = [r for r, c in enumerate(codes) if c is None and r not in killed]
        parts = [f"rank {r} exited {c}" for r, c in sorted(bad.items())]
        parts += [f"rank {r} was killed by {s}" for r, s in sorted(killed.items())]
        if not parts and not missing:
            return RankOutcome(0, codes, None)
        worst = [c for c in bad.values()] + [128 + signal.Signals[s].value for s in killed.values()
                                             if s in signal.Signals.__members__]
        if parts:
            msg = ", ".join(parts)
            if missing:
                msg += f"; ranks {missing} were terminated"
            return RankOutcome(max(worst) if worst else 1, codes, msg)
        rc = returncode
        code = rc if rc and rc > 0 else (128 - rc if rc and rc < 0 else 1)
        return RankOutcome(code, codes, f"mpiexec exited {rc} before ranks {missing} reported")


def run(nranks: int, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
        stdout=None, stderr=None, timeout: Optional[float] = None, quiet: bool = False,
        hosts: Optional[Sequence[str]] = None, hostfile: Optional[str] = None) -> int:
    """Run ``argv`` (a script path and its arguments, or ``-m module ...`` / ``-c code``) on
    ``nranks`` ranks (on ``hosts`` / ``hostfile`` when given, see :func:`placement_args`; the
    status directory must then be on a filesystem every host sees). Blocks until every rank has
    ended; returns the worst exit code.

    ``timeout`` (s): terminate all ranks after it and return 124. Ctrl-C or
    SIGTERM terminates all ranks and returns 130. Unless ``quiet``, a final
    line on stderr says how the run ended when it did not succeed; after a
    timeout or Ctrl-C one more line per rank says where it was (operation,
    peer, user line; the ranks get up to 1.5 s to answer).
    """
    if nranks < 1:
        raise ValueError(f"-n must be at least 1, got {nranks}")
    status_dir = tempfile.mkdtemp(prefix="nbmpi-status-")
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
    watch = RankWatch(status_dir, nranks)
    try:
        proc = start(nranks, argv, status_dir, env=env, stdout=stdout, stderr=stderr, hosts=hosts,
                     hostfile=hostfile)
        t_start = time.monotonic()
        while proc.poll() is None:
            time.sleep(0.05)
            if interrupted:
                break
            if timeout is not None and time.monotonic() - t_start > timeout:
                timed_out = True
                break
            if watch.should_end():
                break
        where = None
        if (interrupted or timed_out) and proc.poll() is None:
            where = request_locations(status_dir, sorted(watch.pids()))
            mark_ending(status_dir)   # the guards of the ranks we end now exit quietly (no MPICH banner)
        end_group_of(proc)  # whatever ended the run, no rank of it survives
    finally:
        if proc is not None and proc.poll() is None:  # an exception in the watch loop
            end_group_of(proc)
        for s, h in old.items():
            signal.signal(s, h)
    outcome = watch.outcome(proc.returncode)
    watch.clean_up()
    if (hosts or hostfile) and (interrupted or timed_out or outcome.exit_code != 0):
        from .remote_cleanup import clean_hosts, hosts_of   # ranks that never finalized, on the other hosts

        renv = rank_environment(env)
        clean_hosts(hosts_of(hosts, hostfile), status_dir, shell=renv.get(LAUNCHER_EXEC_ENV) or "ssh", env=renv)
    shutil.rmtree(status_dir, ignore_errors=True)
    if interrupted or timed_out:
        if not quiet:
            what = "interrupted" if interrupted else f"timed out after {timeout} s"
            print(f"nbmpi run: {what}; all ranks terminated" + ("; where they were:" if where else ""),
                  file=sys.stderr)
            for r, snap in sorted((where or {}).items()):
                print(f"nbmpi run:   rank {r}: {describe_snapshot(snap)}", file=sys.stderr)
        return 130 if interrupted else 124
    if outcome.message and not quiet:
        print(f"nbmpi run: {outcome.message}", file=sys.stderr)
    return outcome.exit_code


def start(nranks: int, argv: Sequence[str], status_dir: str, env: Optional[Dict[str, str]] = None,
          stdout=None, stderr=None, cwd: Optional[str] = None, full_env: bool = False,
          identity: Optional[Identity] = None, hosts: Optional[Sequence[str]] = None,
          hostfile: Optional[str] = None, cgroup: Optional[str] = None) -> subprocess.Popen:
    """Start ``argv`` on ``nranks`` ranks (on ``hosts`` / ``hostfile``: :func:`placement_args`) and
    return at once (non-blocking half of :func:`run`).

    mpiexec is started in a new session (its pid is the process group id to
    end with :func:`nbmpi.workers.launch.processes.end_processes`); ranks report their
    exit codes to ``status_dir`` (watch them with :class:`RankWatch`). The
    caller watches the process and must end the group itself. ``env`` is added
    to :func:`rank_environment`, or with ``full_env`` is the whole environment
    (the controller's :func:`~nbmpi.workers.launch.environment.job_environment`).
    ``identity``: the UNIX account mpiexec and every rank run as (None: this
    process's own); ``status_dir`` must then be writable by it. ``cgroup``: a cgroup
    (:mod:`nbmpi.workers.launch.cgroups`, the caller is root) mpiexec enters before it starts
    anything, so every process of the launch stays in it.
    """
    if nranks < 1:
        raise ValueError(f"nranks must be at least 1, got {nranks}")
    os.makedirs(status_dir, exist_ok=True)
    renv = dict(env or {}) if full_env else rank_environment(env)
    renv[STATUS_DIR_ENV] = status_dir
    cmd = mpiexec_command(nranks, argv, hosts=hosts, hostfile=hostfile, env=renv)
    cmd, options = start_options(cmd, identity, cgroup)
    return subprocess.Popen(cmd, env=renv, stdout=stdout, stderr=stderr,
                            cwd=cwd, start_new_session=True, **options)
