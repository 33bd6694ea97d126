"""A rank's guard: the parent process that sees how its rank ended, even when a signal killed it.

A rank killed by a signal (``kill -9``, the OOM killer, a segfault) cannot
report anything itself, and the MPI process manager's banner does not say
reliably which rank died first. So every rank that nbmpi launches (programs
under ``nbmpi run`` and controller jobs through :mod:`nbmpi.workers.rank_entry`,
engines of a pool through ``python -m nbmpi.workers.rank_guard -m
ipyparallel.engine ...``) starts as a guard that forks before MPI starts: the
child is the rank; the parent waits for it, and if a signal ended it that the
guard did not pass on itself, writes ``rank-R.signal`` (the signal number) to
``$NBMPI_STATUS_DIR``. The guard then ends the same way as its child (same
exit code, or the same signal), so the process manager sees what it would
have seen without the guard.

The guard passes SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 on to
the rank; a rank ended by a signal the guard passed on (the launcher ending
the job) counts as *terminated*, not *killed*. The rank gets
``PR_SET_PDEATHSIG`` (Linux) so it never outlives a guard that is killed.
``NBMPI_RANK_GUARD=0`` turns the guard off. Local; no MPI.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import List, Optional

STATUS_DIR_ENV = "NBMPI_STATUS_DIR"
GUARD_ENV = "NBMPI_RANK_GUARD"
_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def rank_from_env() -> Optional[str]:
    """This rank's number as the process manager gives it before MPI starts (MPICH/Hydra, Open MPI, Slurm)."""
    return os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID")


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the launcher ends the process group anyway
        pass


def guard() -> None:
    """Fork; return in the child (the rank goes on), never return in the parent (the guard).

    Does nothing (returns at once, no fork) without ``$NBMPI_STATUS_DIR`` or with
    ``NBMPI_RANK_GUARD=0``. Must be called before MPI is initialised.
    """
    status_dir = os.environ.get(STATUS_DIR_ENV)
    rank = rank_from_env()
    if not status_dir or rank is None or os.environ.get(GUARD_ENV, "1").strip().lower() in ("0", "off", "no"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    passed_on = set()
    child = os.fork()
    if child == 0:
        _die_with_parent()
        return

    def pass_on(signum, frame):  # noqa: ARG001
        passed_on.add(signum)
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for s in _PASSED_ON:
        signal.signal(s, pass_on)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in passed_on:
            try:
                tmp = os.path.join(status_dir, f".rank-{rank}.signal.tmp")
                with open(tmp, "w") as f:
                    f.write(str(sig))
                os.replace(tmp, os.path.join(status_dir, f"rank-{rank}.signal"))
            except OSError:
                pass
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)   # a signal that does not end a process by default
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m nbmpi.workers.rank_guard -m MODULE [args]``: guard, then run MODULE as ``__main__``."""
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[0] != "-m":
        print("usage: python -m nbmpi.workers.rank_guard -m module [args]", file=sys.stderr)
        sys.exit(2)
    guard()
    sys.argv = argv[1:]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
