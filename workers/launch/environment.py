"""The environment contract between whoever launches ranks and the ranks: every ``NBMPI_*``
variable of it, named once, and the function that turns a job into a rank environment.

Launchers (:mod:`~nbmpi.workers.launch.launcher`, the controller's backends ``local`` and
``slurm``, :mod:`~nbmpi.workers.launch.engine_pool`) set these variables; the rank side
(:mod:`~nbmpi.workers.launch.rank_entry`, :mod:`~nbmpi.workers.launch.rank_guard`,
:mod:`~nbmpi.workers.launch.engine_side`) reads them. The controller's and the client's own
variables (data directory, client configuration, server URL, token) are named here too, so a
launch for another account can leave them out. The runtime's tuning variables are read by the
module they tune; :data:`RUNTIME_VARIABLES` says which (``tests/test_isolation.py`` checks that
every ``NBMPI_*`` name in the code is named in this module).

Variables the launcher owns (:data:`LAUNCHER_OWNED`) are never taken from a job's own
``env``: :func:`job_environment` removes them from it and then sets them itself, so a job
cannot, e.g., turn off its rank guard and with it the log cap (``NBMPI_RANK_GUARD=0``).
Pure functions of their arguments; no I/O.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional, Protocol

from ..core.runtime import DEFAULT_THREAD_LEVEL, THREAD_LEVEL_ENV
from ..core.switches import env_switch

#: The mpiexec the launcher uses instead of the bundled one (read by the launching process only).
MPIEXEC_ENV = "NBMPI_MPIEXEC"
#: ``--hosts`` runs: the program Hydra runs instead of ``ssh`` to start its proxy on a host
#: (a virtual cluster's stand-in, :mod:`nbmpi.workers.launch.virtual_cluster`); unset: ssh.
LAUNCHER_EXEC_ENV = "NBMPI_LAUNCHER_EXEC"
#: ``--hosts`` runs: this host's address as the other hosts reach it (Hydra's ``-localhost``).
LAUNCHER_LOCALHOST_ENV = "NBMPI_LAUNCHER_LOCALHOST"
#: The nodes' addresses, comma-separated (what ``nbmpi run --hosts`` takes), in a virtual cluster's
#: environment (:mod:`nbmpi.workers.launch.virtual_cluster`).
CLUSTER_HOSTS_ENV = "NBMPI_CLUSTER_HOSTS"
#: Directory where each rank writes ``rank-R.pid`` at start, ``rank-R.exit`` at its end, and its
#: guard ``rank-R.signal`` when a signal killed it; the launcher watches it.
STATUS_DIR_ENV = "NBMPI_STATUS_DIR"
#: ``0``/``off``/``no`` turns the rank guard off (``nbmpi run`` only; controller jobs always have it).
GUARD_ENV = "NBMPI_RANK_GUARD"
#: Directory receiving ``rank-R.stdout`` / ``rank-R.stderr`` (controller jobs).
LOG_DIR_ENV = "NBMPI_LOG_DIR"
#: Bytes kept per rank and stream in :data:`LOG_DIR_ENV` (unset or 0: all).
LOG_LIMIT_ENV = "NBMPI_LOG_LIMIT"
#: Set by the guard in its rank when the guard already writes the rank's output to the logs.
LOG_GUARDED_ENV = "NBMPI_LOG_GUARDED"
#: Directory where the ranks stream their trace while they run and rank 0 writes ``trace.json``.
TRACE_OUT_ENV = "NBMPI_TRACE_OUT"
#: Seconds between two writes of a rank's streamed trace (default 0.5).
TRACE_STREAM_INTERVAL_ENV = "NBMPI_TRACE_STREAM_INTERVAL"
#: Seconds the ranks wait for each other at exit to agree whether to save the trace (default 30).
TRACE_AGREE_TIMEOUT_ENV = "NBMPI_TRACE_AGREE_TIMEOUT"
#: Address the ipyparallel controller of a pool listens on (default 127.0.0.1).
POOL_IP_ENV = "NBMPI_POOL_IP"
#: Pid of the process owning a pool: its engines end when it dies (notebook pools only).
POOL_OWNER_PID_ENV = "NBMPI_POOL_OWNER_PID"
#: The pool's own work directory, removed by the engines when its owner dies (set with :data:`POOL_OWNER_PID_ENV`
#: for a pool that made its directory).
POOL_WORK_DIR_ENV = "NBMPI_POOL_WORK_DIR"
#: Address an engine binds its probe socket to (default 127.0.0.1, or see :data:`POOL_LOCATION_ENV`).
PROBE_HOST_ENV = "NBMPI_PROBE_HOST"
#: Set for a pool whose engines run on other hosts (``EnginePool(hosts=...)``): the address or name of
#: the pool's controller as those hosts reach it. Each engine's probe then listens on its host's own
#: address on the route there (unless :data:`PROBE_HOST_ENV` says otherwise), so the pool's owner reaches it.
POOL_LOCATION_ENV = "NBMPI_POOL_LOCATION"

#: The controller's data directory (``nbmpi serve`` without ``--data-dir``).
DATA_DIR_ENV = "NBMPI_DATA_DIR"
#: The client configuration file (``{"url": ..., "token": ...}``).
CONFIG_ENV = "NBMPI_CONFIG"
#: The controller URL the client uses.
SERVER_ENV = "NBMPI_SERVER"
#: The bearer token the client sends.
TOKEN_ENV = "NBMPI_TOKEN"
#: Variables of the service and its clients: never passed to a rank of another account.
SERVICE_VARIABLES = frozenset({DATA_DIR_ENV, CONFIG_ENV, SERVER_ENV, TOKEN_ENV})

#: The runtime's tuning variables (name -> the module that reads it and documents it).
RUNTIME_VARIABLES = {
    "NBMPI_TIMEOUT": "nbmpi.workers.core.runtime",
    "NBMPI_TRACE": "nbmpi.workers.core.runtime",
    "NBMPI_PURE_PYTHON": "nbmpi.workers.fused_reductions.implementation, nbmpi.workers.tracing.tracer",
    "NBMPI_DIRECT_MPI": "nbmpi.workers.fused_reductions.implementation",
    "NBMPI_FUSE_THRESHOLD": "nbmpi.workers.fused_reductions.fusion",
    "NBMPI_REBIND_GUARD": "nbmpi.workers.fused_reductions.rebinding_guard",
    "NBMPI_SHM_MIN_BYTES": "nbmpi.workers.channels.channel",
    "NBMPI_SHM_CHUNK": "nbmpi.workers.channels.channel",
    "NBMPI_LATENCY_HIDING": "nbmpi.workers.distarray.context",
    "NBMPI_DISTARRAY_THRESHOLD": "nbmpi.workers.distarray.context",
    "NBMPI_DISTARRAY_CHUNK": "nbmpi.workers.distarray.context",
    "NBMPI_DISTARRAY_CACHE": "nbmpi.workers.distarray.fused_kernels",
    "NBMPI_DISTARRAY_NUMPY_MATH": "nbmpi.workers.distarray.context (numpy_math)",
    "NBMPI_DISTARRAY_GC_FREEZE": "nbmpi.workers.distarray.context",
    "NBMPI_DISTARRAY_HUGEPAGE": "nbmpi.workers.distarray.pool_memory",
    "NBMPI_DISTARRAY_POOL_BYTES": "nbmpi.workers.distarray.pool_memory",
    "NBMPI_DISTARRAY_GC_PAUSE": "nbmpi.workers.distarray.context",
    "NBMPI_JIT_WARMUP": "nbmpi.workers.core.jit_warmup",
    "NBMPI_REPORT_COVERAGE": "nbmpi.workers.distarray.fallback",
}

#: Variables only the launcher sets: removed from a job's own ``env`` by :func:`job_environment`.
LAUNCHER_OWNED = frozenset({MPIEXEC_ENV, STATUS_DIR_ENV, GUARD_ENV, LOG_DIR_ENV, LOG_LIMIT_ENV, LOG_GUARDED_ENV,
                            TRACE_OUT_ENV, POOL_OWNER_PID_ENV, POOL_WORK_DIR_ENV})


#: The thread-count variables of the BLAS and OpenMP libraries NumPy may be linked with (OpenBLAS, MKL,
#: BLIS, OpenMP): :func:`blas_threads` sets them for ranks launched on this host unless any is set.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def blas_threads(env: Mapping[str, str], ranks_here: int, cpus: int) -> Dict[str, str]:
    """The BLAS thread variables for ``ranks_here`` ranks sharing ``cpus`` CPUs: each of
    :data:`BLAS_THREAD_VARIABLES` = ``max(1, cpus // ranks_here)``; empty when ``env`` sets any of
    them already (the user's choice stands). Without this every rank's BLAS starts a thread per CPU:
    2 ranks on 2 CPUs run 4 spinning BLAS threads, and a matrix-vector product of a distributed array
    takes 10-20x longer than with one thread per rank. Pure."""
    if any(env.get(v) for v in BLAS_THREAD_VARIABLES):
        return {}
    n = str(max(1, int(cpus) // max(1, int(ranks_here))))
    return {v: n for v in BLAS_THREAD_VARIABLES}


class JobLike(Protocol):
    """What :func:`job_environment` reads of a job (the controller's ``JobSpec`` has it)."""
    env: Mapping[str, str]
    log_dir: object
    trace_dir: object
    log_limit: Optional[int]


def rank_environment(base: Mapping[str, str], extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``base`` plus what every rank needs (funneled MPI threads unless set, unbuffered output),
    then ``extra``. The caller passes its own ``os.environ`` (or an account's, see
    :mod:`~nbmpi.workers.launch.identity`) as ``base``."""
    env = dict(base)
    env.setdefault(THREAD_LEVEL_ENV, DEFAULT_THREAD_LEVEL)
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


def job_environment(job: JobLike, status_dir: str, base: Mapping[str, str]) -> Dict[str, str]:
    """The environment of every rank of ``job``: :func:`rank_environment` of ``base``, then the
    job's own ``env`` without the :data:`LAUNCHER_OWNED` variables, then those set by the launcher
    (status, log and trace directories, the log cap, the guard on). Called by the backends."""
    own = {k: v for k, v in job.env.items() if k not in LAUNCHER_OWNED}
    inherited = {k: v for k, v in base.items() if k not in LAUNCHER_OWNED or k == MPIEXEC_ENV}
    env = rank_environment(inherited, own)
    env.update({STATUS_DIR_ENV: str(status_dir), LOG_DIR_ENV: str(job.log_dir), TRACE_OUT_ENV: str(job.trace_dir),
                GUARD_ENV: "1"})
    if job.log_limit:
        env[LOG_LIMIT_ENV] = str(int(job.log_limit))
    return env


def guard_enabled(env: Mapping[str, str]) -> bool:
    """Whether :data:`GUARD_ENV` in ``env`` leaves the rank guard on (the default)."""
    return env_switch(GUARD_ENV, env=env)
