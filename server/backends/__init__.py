"""The controller's backend interface: where jobs and pools actually run.

A backend turns the controller's records into running ranks and reports back;
everything else (the job state machine, admission, records, the HTTP API)
is shared and never asks which backend runs. As in Dask Gateway, a backend
is a class with a small set of methods, chosen by name at start
(``nbmpi serve --backend local|slurm``; :mod:`.local`, :mod:`.slurm`):

Jobs (``spec`` is a :class:`JobSpec`; ``state`` the JSON object the backend
returned from :meth:`Backend.submit`, stored opaquely in the job's record):

* :meth:`~Backend.submit` starts the job (or hands it to a queue) and returns
  its state; raises :class:`BackendError` (the job fails with that message);
* :meth:`~Backend.poll` says where the job is (:class:`JobStatus`: pending with
  the queue's reason, running, or ended with per-rank exit codes); it never
  blocks for long and may be called often;
* :meth:`~Backend.cancel` ends every rank of the job and returns the final
  status (blocking until the ranks are gone or the queue confirmed);
* :meth:`~Backend.recover`, after a controller restart, says whether a job
  recorded as submitted is still known (the controller then follows it again)
  or not (the backend has ended whatever was left; the record becomes ``lost``).

Pools (ipyparallel engines on MPI ranks, :class:`nbmpi.workers.launch.engine_pool.EnginePool`):
:meth:`~Backend.start_pool`, :meth:`~Backend.stop_pool`,
:meth:`~Backend.recover_pool`.
"""
from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Literal, Optional, Tuple

from nbmpi.workers.launch.identity import Identity

if TYPE_CHECKING:  # pragma: no cover
    from nbmpi.workers.launch.engine_pool import EnginePool

#: Job outcomes a backend reports when a job has ended.
Outcome = Literal["succeeded", "failed", "timed_out", "cancelled"]


class BackendError(Exception):
    """The backend cannot do what was asked; the message says why and what to do."""


@dataclass(frozen=True)
class JobSpec:
    """What a backend needs to run one job (built by the scheduler from the job's record).

    ``job_dir`` holds the script and is the ranks' working directory;
    ``log_dir`` receives ``rank-R.stdout``/``rank-R.stderr``; ``trace_dir`` the
    gathered ``trace.json``/``summary.json`` when every rank succeeds.
    """
    id: int
    owner: str
    ranks: int
    job_dir: Path
    script_path: Path
    log_dir: Path
    trace_dir: Path
    args: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    timeout: Optional[float] = None
    name: Optional[str] = None
    #: Bytes kept per rank and stream of output (``nbmpi serve --max-log-bytes``); None: all.
    log_limit: Optional[int] = None
    #: The UNIX account every process of the job runs as (None: the service's own account).
    identity: Optional[Identity] = None


@dataclass
class JobStatus:
    """Where a job is, as a backend sees it.

    ``phase``: ``pending`` (accepted, waiting for resources; ``reason`` says
    why, e.g. Slurm's ``Resources``), ``running``, or ``ended``. When ended:
    ``outcome``, ``exit_code`` (worst code of the ranks that failed on their
    own; 124 timed out, 130 cancelled), ``codes`` (per rank, None for a rank
    that never reported) and ``message`` (None on success).
    """
    phase: Literal["pending", "running", "ended"]
    reason: Optional[str] = None
    outcome: Optional[Outcome] = None
    exit_code: Optional[int] = None
    codes: Optional[List[Optional[int]]] = None
    message: Optional[str] = None


@dataclass(frozen=True)
class PoolSpec:
    """What a backend needs to start one pool: ``ranks`` engines, files under ``work_dir``."""
    id: int
    owner: str
    ranks: int
    name: str
    work_dir: Path
    timeout: float = 120.0
    #: The UNIX account every process of the pool runs as (None: the service's own account).
    identity: Optional[Identity] = None


class Backend(abc.ABC):
    """Where the controller's jobs and pools run. Subclasses are thread-safe."""

    #: The name ``nbmpi serve --backend NAME`` selects.
    name: ClassVar[str]
    #: True when the backend ends a job at its timeout itself (the scheduler then only
    #: follows; it still ends the job if the backend has not after a grace period).
    enforces_timeout: ClassVar[bool] = False
    #: True when jobs run independently of the service (a cluster queue): stopping the service
    #: then leaves them running and recorded as they are, for the next start to re-attach
    #: (:meth:`recover`); False ends them with the service (they are recorded ``lost``).
    jobs_outlive_service: ClassVar[bool] = False
    #: Where the service's connections to its pools keep their folders (``EnginePool.attach``'s
    #: ``parent``): a directory of the service's data folder, emptied at each start of the service
    #: (:class:`~nbmpi.server.pool_manager.PoolManager`), so a service that was killed leaves nothing
    #: behind elsewhere. None: the system's temporary folder.
    attach_dir: Optional[Path] = None

    def contain(self, data_dir: Path) -> str:
        """Set up how nothing a job or pool starts outlives it, for the service serving ``data_dir``
        (called once before anything starts); one phrase saying which containment is in force
        (``/api/health``)."""
        return "the backend's own: its scheduler ends every process of a job's allocation"

    def sweep(self) -> List[str]:
        """After recovery at start: end what a previous run of the service left that no record
        follows any more; the names of what was ended."""
        return []

    def _attach_parent(self) -> Optional[str]:
        """:attr:`attach_dir` as ``EnginePool.attach``'s ``parent`` (made if missing)."""
        if self.attach_dir is None:
            return None
        os.makedirs(self.attach_dir, mode=0o700, exist_ok=True)
        return str(self.attach_dir)

    def capacity(self, max_ranks: Optional[int]) -> Optional[int]:
        """Ranks the controller may hold at once given ``--max-ranks`` (None: the backend queues)."""
        return max_ranks

    # -- jobs ----------------------------------------------------------------------------
    @abc.abstractmethod
    def submit(self, spec: JobSpec) -> Dict[str, Any]:
        """Start ``spec`` (or queue it); return the state to store. Raises :class:`BackendError`."""

    @abc.abstractmethod
    def poll(self, spec: JobSpec, state: Dict[str, Any]) -> JobStatus:
        """Where the job is now. Cheap and non-blocking (may use a cached view of a queue)."""

    @abc.abstractmethod
    def cancel(self, spec: JobSpec, state: Dict[str, Any]) -> JobStatus:
        """End every rank of the job; return its final status (outcome ``cancelled`` unless it had ended)."""

    @abc.abstractmethod
    def recover(self, spec: JobSpec, state: Dict[str, Any]) -> bool:
        """After a controller restart: True if the job is still known and can be followed again;
        False if not (the backend has ended whatever was left of it)."""

    # -- pools -----------------------------------------------------------------------------
    @abc.abstractmethod
    def start_pool(self, spec: PoolSpec,
                   progress: Optional[Callable[[str], None]] = None) -> Tuple["EnginePool", Dict[str, Any]]:
        """Start a pool; block until every engine runs. Returns the pool (owned or attached) and
        the state to store. Raises :class:`BackendError` or :class:`~nbmpi.workers.launch.engine_pool.EnginePoolError`."""

    @abc.abstractmethod
    def stop_pool(self, pool: Optional["EnginePool"], state: Dict[str, Any]) -> None:
        """End a pool and every process of it (``pool`` may be None when only the record is left)."""

    @abc.abstractmethod
    def recover_pool(self, connection: Dict[str, Any], state: Dict[str, Any]) -> Optional["EnginePool"]:
        """After a restart: the pool re-attached if all its engines answer, else None (its leftovers ended)."""

    def close(self) -> None:
        """Release what the backend holds (called when the service stops)."""


#: Backend name -> module (inside this package) and class.
BACKENDS: Dict[str, Tuple[str, str]] = {"local": ("local", "LocalBackend"), "slurm": ("slurm", "SlurmBackend")}


def make_backend(name: str, **options: Any) -> Backend:
    """The backend called ``name`` (see :data:`BACKENDS`), constructed with ``options``."""
    import importlib

    try:
        module, cls = BACKENDS[name]
    except KeyError:
        raise BackendError(f"unknown backend {name!r}; expected one of {', '.join(sorted(BACKENDS))}") from None
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(**options)
