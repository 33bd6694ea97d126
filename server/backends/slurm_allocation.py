"""What the Slurm backend runs inside its allocations: a pool, and the cleanup after killed ranks.

Two commands, ``python -m nbmpi.server.backends.slurm_allocation COMMAND``:

``pool --work-dir DIR --ranks N``: the batch script of a pool of the Slurm
backend (:mod:`nbmpi.server.backends.slurm`). On the allocation's first node
it starts a :class:`nbmpi.workers.launch.engine_pool.EnginePool` whose launcher is ``srun``
(``NBMPI_MPIEXEC=srun``, ``SLURM_MPI_TYPE`` from ``--mpi``): the ipyparallel
controller here, listening on ``--ip``, and the N engines as one job step of
the allocation, engine id == MPI rank, with
:func:`nbmpi.workers.launch.engine_side.setup` run on every rank. The engines on the other
nodes and the service reach the controller at this node's ``NodeAddr`` as Slurm knows it
(:func:`node_address`; the hostname when Slurm does not say). Once every engine
runs it writes ``DIR/connection.json`` (owner-only: it holds the controller's
key): ``{"slurm_job_id": ..., **EnginePool.connection_info()}``, which the
controller attaches to. It then waits. SIGTERM (``scancel --batch
--signal=TERM``, ``scancel``, the time limit) or the death of the engines or
the controller ends the pool (:meth:`EnginePool.stop`, which also frees the shared
memory of killed engines on this node; ``clean-shm`` on the other nodes) and
this program, which ends the allocation. Exit status 0 when
ended by a signal, 1 when the pool could not start or died.

``clean-shm --status-dir DIR``: on this node, remove the MPI shared-memory
segments the ranks noted in their status directory
(:func:`nbmpi.workers.launch.processes.note_segments`, as under ``nbmpi run``) that no
live process maps any more. MPICH removes its segment in ``MPI_Finalize``;
ranks that Slurm ends (``--kill-on-bad-exit`` after another rank failed,
``scancel``, the time limit) never get there. The job batch scripts of the
backend run it after their job step when it did not succeed, and when Slurm
ends the job (on the batch node; new job steps cannot start then).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import psutil

from nbmpi.workers.launch.engine_pool import EnginePool, EnginePoolError
from nbmpi.workers.launch.environment import MPIEXEC_ENV
from nbmpi.workers.launch.processes import noted_segments, remove_shm, shm_segments_of

from ..config import write_private

CONNECTION_FILE = "connection.json"
#: This module, as ``python -m`` runs it.
MODULE = "nbmpi.server.backends.slurm_allocation"
#: Seconds :func:`clean_shm` keeps trying segments still mapped by ranks that are being ended.
CLEAN_WAIT_S = 5.0


def clean_shm(status_dir: str, job_id: Optional[str] = None, wait: float = CLEAN_WAIT_S) -> List[str]:
    """Remove, on this node, the ``/dev/shm`` segments the ranks noted in ``status_dir``
    (:func:`nbmpi.workers.launch.processes.note_segments`) that no live process maps; return the paths
    removed. Segments still mapped by a process of Slurm job ``job_id`` (default
    ``$SLURM_JOB_ID``: ranks Slurm is ending may outlive their ``srun`` briefly) are tried again
    for up to ``wait`` seconds; segments other processes map are left alone. Never raises."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    found = {p for p in noted_segments(status_dir) if os.path.exists(p)}
    removed: List[str] = []
    deadline = time.monotonic() + wait
    while True:
        removed += remove_shm(found - set(removed))
        left = {p for p in found - set(removed) if os.path.exists(p)}
        if not left or not job_id or time.monotonic() > deadline or not left & _mapped_by_job(job_id):
            return removed
        time.sleep(0.2)


def _mapped_by_job(job_id: str) -> set:
    """``/dev/shm`` paths mapped by live processes of Slurm job ``job_id`` on this node."""
    pids = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get("SLURM_JOB_ID") == job_id:
                pids.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return shm_segments_of(pids)


def clean_shm_everywhere(status_dir: str, python: str = sys.executable) -> None:
    """:func:`clean_shm` on every node of the current allocation: here, and with one ``srun`` task
    per node when the allocation has several (not possible once Slurm is ending the job)."""
    clean_shm(status_dir)
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1") or 1)
    if nodes > 1:
        subprocess.run(["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--mpi=none",
                        python, "-m", MODULE, "clean-shm", "--status-dir", status_dir],
                       stdin=subprocess.DEVNULL, timeout=120, check=False)


def node_address() -> Optional[str]:
    """This node's ``NodeAddr`` in Slurm's configuration (``scontrol show node $SLURMD_NODENAME``):
    where the other nodes of the allocation and the service reach it. None when Slurm does not
    say (then ipyparallel uses the hostname). Blocking (one scontrol call, at most 30 s)."""
    name = os.environ.get("SLURMD_NODENAME")
    if not name:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "node", "--oneliner", name], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for word in out.split():
        if word.startswith("NodeAddr="):
            return word.split("=", 1)[1] or None
    return None


class _Stop(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT: end the pool."""


def _on_signal(signum, frame) -> None:  # noqa: ARG001
    raise _Stop(signal.Signals(signum).name)


def run_pool(args: argparse.Namespace) -> int:
    """The ``pool`` command (see the module docstring)."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        print("slurm_allocation pool: not inside a Slurm allocation (no SLURM_JOB_ID); run it from a batch script",
              file=sys.stderr)
        return 2
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    conn = work / CONNECTION_FILE
    os.environ[MPIEXEC_ENV] = "srun"
    os.environ["SLURM_MPI_TYPE"] = args.mpi
    os.environ["SLURM_KILL_BAD_EXIT"] = "1"   # one engine dying ends the step: the pool is seen dead at once
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, _on_signal)
    pool = EnginePool(args.ranks, name=args.name, work_dir=str(work), bound_to_owner=False, ip=args.ip,
                      location=node_address() if args.ip in ("*", "0.0.0.0") else None)
    code = 0
    try:
        pool.start(progress=lambda msg: print(msg, flush=True), timeout=args.start_timeout)
        info = pool.connection_info()
        info["slurm_job_id"] = job_id
        write_private(conn, json.dumps(info))
        print(f"slurm_allocation: {args.ranks} engines ready; connection info in {conn}", flush=True)
        while pool.alive():
            time.sleep(1.0)
        print("slurm_allocation: the pool's engines or controller died; ending it", flush=True)
        code = 1
    except _Stop as stop:
        print(f"slurm_allocation: {stop.args[0]} received; ending the pool", flush=True)
    except EnginePoolError as exc:
        print(f"slurm_allocation: {exc}", file=sys.stderr, flush=True)
        code = 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # finish the cleanup even if signalled again
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            conn.unlink()
        except OSError:
            pass
        pool.stop()   # here: engines, controller, and the shared memory the engines noted
        if int(os.environ.get("SLURM_JOB_NUM_NODES", "1") or 1) > 1:
            clean_shm_everywhere(pool.status_dir)
        print("slurm_allocation: pool ended", flush=True)
    return code


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: ``pool`` or ``clean-shm`` (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m nbmpi.server.backends.slurm_allocation",
                                description="Programs the nbmpi slurm backend runs inside its allocations.")
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("pool", help="start a pool of N engines with srun in this allocation; wait; end it")
    pp.add_argument("--work-dir", required=True, help="directory of the pool (profile, logs, connection.json)")
    pp.add_argument("--ranks", type=int, required=True, help="number of engines (MPI ranks)")
    pp.add_argument("--name", default=None)
    pp.add_argument("--ip", default="*", help="address the ipyparallel controller listens on (default: all)")
    pp.add_argument("--mpi", default="pmi2", help="srun --mpi plugin (default pmi2: the bundled MPICH speaks it)")
    pp.add_argument("--start-timeout", type=float, default=120.0)
    cp = sub.add_parser("clean-shm", help="remove on this node the MPI shared memory that ended ranks left")
    cp.add_argument("--status-dir", required=True, help="the ranks' status directory (where they noted it)")
    args = p.parse_args(argv)
    if args.command == "pool":
        return run_pool(args)
    removed = clean_shm(args.status_dir)
    if removed:
        print(f"slurm_allocation: removed {len(removed)} shared-memory segment(s) of ended ranks: "
              f"{' '.join(removed)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
