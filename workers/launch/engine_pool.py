"""Pools of engines: an ipyparallel cluster whose engines are the ranks of one MPI job.

Used by both the notebook magics (``%distributed start``) and the controller's
local backend, so it lives in the runtime package and imports neither.

:class:`EnginePool` starts, on this host, an ipyparallel controller and
``mpiexec -n N python -m ipyparallel.engine --mpi`` through the project's one
launch mechanism (:func:`nbmpi.workers.launch.launcher.mpiexec_command`, the ranks'
environment of :func:`nbmpi.workers.launch.environment.rank_environment`, thread level
``funneled``). With ``--mpi`` every engine requests its ``COMM_WORLD`` rank as
its engine id, so **engine id == MPI rank** (checked at start). Once all
engines registered, every rank runs :func:`nbmpi.workers.launch.engine_side.setup`
(collective): ``nbmpi.workers.init()`` and ``comm``, ``rank``, ``size``,
``nbmpi`` in the user namespace.

Processes and their end: the controller and mpiexec each run in their own
session (process group). :meth:`EnginePool.stop` SIGTERMs both groups, then SIGKILLs
whatever is left after a grace period, including every descendant recorded at
start (ipyparallel's per-engine "nanny" processes run in sessions of their
own). When the pool is started from the main thread, the controller and
mpiexec also get ``PR_SET_PDEATHSIG`` (Linux), so a kernel that is killed
without running its exit handlers does not leave them behind either. A pool bound to its owner on this host also
has a shared-memory sentinel (:mod:`nbmpi.workers.launch.shm_sentinel`, a child of the
owner in a session of its own, kept across a restart): an owner killed while it ends
the pool, after its ranks and their guards were killed and before it unlinked their
``/dev/shm`` segments, leaves none behind.

Engines on other hosts: with ``hosts`` (``host[:slots]`` entries) or a ``hostfile`` the ranks are
placed as ``nbmpi run --hosts`` places them (:func:`nbmpi.workers.launch.launcher.placement_args`: Hydra's
ssh launcher, or ``$NBMPI_LAUNCHER_EXEC`` and ``$NBMPI_LAUNCHER_LOCALHOST``, e.g. a virtual cluster's
:meth:`~nbmpi.workers.launch.virtual_cluster.VirtualCluster.launch_env`). Every host is first checked to
answer through that shell (:func:`nbmpi.workers.launch.remote_cleanup.unreachable`), so a wrong name
fails at once and says which. The controller then listens where the engines reach it
(``location``: ``$NBMPI_LAUNCHER_LOCALHOST``, else this host's name), each engine's probe on its own
host's address (``$NBMPI_POOL_LOCATION``, :func:`nbmpi.workers.launch.engine_side.probe_address`), the
work directory must be on a filesystem every host sees (``/tmp`` is, on a virtual cluster), and after
the pool ended the shared memory of killed engines is removed on every host
(:func:`nbmpi.workers.launch.remote_cleanup.clean_hosts`). The engines' owner watchdog is left out then
(the owner's pid means nothing on another host): mpiexec's ``PR_SET_PDEATHSIG`` ends Hydra, whose proxies
end the engines.

Its liveness checks and status record (``alive``, ``dead_ranks``, ``describe_dead``, ``status``) are
a mixin in :mod:`nbmpi.workers.launch.pool_health`.

This module does not import IPython (the engines do); the FastAPI controller uses it as well.
"""
from __future__ import annotations

import atexit
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import psutil

from .environment import (POOL_LOCATION_ENV, POOL_OWNER_PID_ENV, POOL_WORK_DIR_ENV, STATUS_DIR_ENV,
                          rank_environment)
from .identity import Identity, base_environment, open_beneath, open_no_link, start_options
from .launcher import mpiexec_command
from .pool_health import _PoolHealth
from .pool_hosts import _PoolHosts, checked_placement, controller_address
from .processes import end_processes, noted_segments, remove_shm
from . import shm_sentinel

__all__ = ["EnginePool", "EnginePoolError"]

GRACE_SECONDS = 1.0
#: Heartbeat period of the pool's controller (ms). An engine counts as registered at its first
#: heartbeat, so ipyparallel's default of 3000 ms adds up to 3 s to every start.
HEARTBEAT_MS = 500
#: Missed heartbeats before the controller drops an engine: 60 x 0.5 s keeps ipyparallel's 30 s tolerance.
HEARTBEAT_MISSES = 60
_live_pools: "List[EnginePool]" = []


class EnginePoolError(RuntimeError):
    """A pool could not be started, reached or used; the message says why and what to do."""


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: rely on stop()/atexit
        pass


def _read_json(path: str, owned: Optional[str] = None) -> Optional[dict]:
    """The JSON file ``path`` (None while missing or incomplete). Below ``owned`` (a work directory
    given to another account) it is read without following any link in it."""
    try:
        if owned is not None and os.path.commonpath([path, owned]) == owned:
            fd = open_beneath(owned, *os.path.relpath(path, owned).split(os.sep))
        else:
            fd = os.open(path, os.O_RDONLY)
        with open(fd) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _stop_all() -> None:
    for p in list(_live_pools):
        try:
            p.stop()
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


atexit.register(_stop_all)


class EnginePool(_PoolHealth, _PoolHosts):
    """N MPI ranks serving as ipyparallel engines (engine id == rank).

    Create, then :meth:`start` (blocking). Not thread-safe: one owner drives
    it. ``bound_to_owner`` (default True): the pool ends when the process that
    started it dies. ``work_dir`` holds the ipyparallel profile (connection files, logs);
    default a fresh temporary directory, removed by :meth:`stop`. ``env`` is
    added to the ranks' environment. ``ip`` is the address the ipyparallel
    controller listens on: ``127.0.0.1`` (the default, ``$NBMPI_POOL_IP`` if
    set) when every engine runs on this host, ``*`` or an interface address
    when the launcher (e.g. ``NBMPI_MPIEXEC=srun`` in a Slurm allocation) puts
    engines on other nodes; they then connect to ``location``: this host's address or name as
    the engines and clients reach it (default: its hostname, which must then resolve on every
    node and client, as ipyparallel's ``--location``). ``identity``: the UNIX
    account the pool's controller and engines run as (None: this process's own); the
    pool's ``work_dir`` is then given to that account. ``cgroup``: the cgroup every process
    of the pool is started in (see :mod:`nbmpi.workers.launch.cgroups`; the starter is root and
    ends it with :func:`~nbmpi.workers.launch.processes.end_cgroup` after :meth:`stop`).

    ``hosts`` (``host[:slots]`` entries, as ``mpiexec -hosts``) or ``hostfile`` (one ``host[:slots]`` a
    line): run the engines on those hosts (see the module); ``location`` then defaults to
    ``$NBMPI_LAUNCHER_LOCALHOST`` (in ``env`` or this process's environment), else this host's name,
    and ``ip`` to ``location`` when it is an address, else ``*``.
    """

    def __init__(self, n: int, name: Optional[str] = None, work_dir: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None, bound_to_owner: bool = True, ip: Optional[str] = None,
                 identity: Optional[Identity] = None, location: Optional[str] = None,
                 hosts: Optional[Sequence[str]] = None, hostfile: Optional[str] = None,
                 cgroup: Optional[str] = None):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"a pool needs a whole number of ranks >= 1, got n={n!r}")
        try:
            self.placement, self.hostfile = checked_placement(hosts, hostfile)
        except ValueError as exc:
            raise EnginePoolError(str(exc)) from None
        self.n = n
        self.name = name or f"pool-{uuid.uuid4().hex[:6]}"
        self._own_dir = work_dir is None
        self.work_dir = work_dir or tempfile.mkdtemp(prefix=f"nbmpi-{self.name}-")
        self.env = dict(env or {})
        self.identity = identity
        #: The cgroup its controller and mpiexec enter before they start anything (a controller run by
        #: root: :mod:`nbmpi.workers.launch.cgroups`); its owner ends it after :meth:`stop`.
        self.cgroup = cgroup
        #: True (notebook): the ranks and controller end when the starting process dies.
        #: False (controller service): the pool outlives its starter, which re-attaches
        #: to it or ends it after a restart.
        self.bound_to_owner = bool(bound_to_owner)
        self.ip, self.location = controller_address(self.spans_hosts, ip, location, {**os.environ, **self.env})
        self.ranks = list(range(n))
        self.hosts: List[str] = []
        self.rank_info: List[Dict[str, Any]] = []
        self._state = "stopped"
        self._started_at: Optional[float] = None
        self._controller: Optional[subprocess.Popen] = None
        self._mpiexec: Optional[subprocess.Popen] = None
        self._descendants: List[int] = []
        self._client = None
        self._info: Optional[Dict[str, Any]] = None
        self._attached = False
        self._logs: List[Any] = []
        #: the Dask cluster on this pool, if one was started (set by :func:`nbmpi.workers.launch.dask_on_pool.start`;
        #: closed by stop and restart)
        self._dask = None
        self._sentinel: Optional[shm_sentinel.Sentinel] = None

    def renewed(self) -> "EnginePool":
        """A new, unstarted pool like this one (size, name, environment, owner binding, account, hosts),
        for a start after this one ended. Owned pools only."""
        return EnginePool(self.n, name=self.name, env=self.env, bound_to_owner=self.bound_to_owner,
                          identity=self.identity, ip=self.ip, location=self.location,
                          hosts=self.placement or None, hostfile=self.hostfile, cgroup=self.cgroup)

    # -- paths -------------------------------------------------------------------------------
    @property
    def profile_dir(self) -> str:
        """The ipyparallel profile directory of this pool."""
        return os.path.join(self.work_dir, "profile")

    @property
    def status_dir(self) -> str:
        """Where the engines' guards report a rank killed by a signal."""
        return os.path.join(self.work_dir, "status")

    def _security(self, what: str) -> str:
        return os.path.join(self.profile_dir, "security", f"ipcontroller-{what}.json")

    def _log_tail(self, which: str, nbytes: int = 2000) -> str:
        path = os.path.join(self.work_dir, f"{which}.log")
        try:
            with open_no_link(path, "rb") as f:   # the pool's account may own its work directory
                f.seek(0, 2)
                f.seek(max(f.tell() - nbytes, 0))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, progress: Optional[Callable[[str], None]] = None, timeout: float = 120.0,
              replacing: Optional["EnginePool"] = None) -> "EnginePool":
        """Start the controller and the N engine ranks; block until all are ready.

        ``progress(message)`` is called at each step. ``replacing``: a pool this one
        replaces (a restart); it is stopped while the new processes boot, so a restart
        takes about as long as a start. Raises :class:`EnginePoolError` (after stopping
        everything it started) if the pool is not ready within ``timeout`` seconds or a
        process died. Returns ``self``.
        """
        if self._attached:
            raise EnginePoolError(f"pool {self.name!r} is attached, not owned; it can only be started by its owner")
        if self._state in ("starting", "running"):
            raise EnginePoolError(f"pool {self.name!r} is already {self._state}; stop it first")
        say = progress or (lambda msg: None)
        self._state = "starting"
        self._started_at = time.time()
        deadline = time.monotonic() + timeout
        _live_pools.append(self)
        if self.bound_to_owner and not self.spans_hosts and self._sentinel is None:
            # removes the ranks' /dev/shm segments even if this process dies while it ends the pool
            self._sentinel = shm_sentinel.start(self.status_dir)
        try:
            self._start(say, deadline, timeout, replacing)
        except BaseException:
            self._state = "failed"
            self._terminate()
            raise
        self._state = "running"
        say(f"pool {self.name!r}: {self.n} ranks ready")
        return self

    def _popen(self, cmd: List[str], env: Dict[str, str], log: str) -> subprocess.Popen:
        out = open_no_link(os.path.join(self.work_dir, f"{log}.log"), "ab")
        self._logs.append(out)
        main = threading.current_thread() is threading.main_thread()
        if self.identity is not None:   # the account writes its profile, status and connection files
            self.identity.own(self.work_dir)
        cmd, options = start_options(cmd, self.identity, self.cgroup)
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=self.work_dir, start_new_session=True, **options,
                                preexec_fn=(_pdeathsig if self.bound_to_owner and main and sys.platform.startswith("linux")
                                            else None))

    def _start(self, say: Callable[[str], None], deadline: float, timeout: float,
               replacing: Optional["EnginePool"] = None) -> None:
        os.makedirs(self.profile_dir, exist_ok=True)
        engine_file = self._engine_file
        for path in (self._security("client"), self._security("engine"), engine_file):
            if os.path.exists(path):
                os.remove(path)
        env = self._environment()
        if self.spans_hosts:
            say(f"pool {self.name!r}: checking that {', '.join(self.host_names())} can be reached")
            wrong = self._unreachable_message(env, timeout=min(30.0, max(5.0, timeout / 4)))
            if wrong:
                raise EnginePoolError(wrong)
        # The controller and the ranks start at the same time: the engines spend their first seconds
        # importing and then wait (up to the start timeout) for the controller's connection file.
        say(f"pool {self.name!r}: starting the controller and {self.n} ranks")
        self._controller = self._popen(
            [sys.executable, "-m", "ipyparallel.controller", f"--profile-dir={self.profile_dir}",
             f"--ip={self.ip}", *([f"--location={self.location}"] if self.location else []), "--log-level=WARN",
             f"--HeartMonitor.period={HEARTBEAT_MS}",
             f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"], env, "controller")
        cmd = self._spawn_ranks(env, timeout)
        ending = None
        if replacing is not None:   # a restart: the old pool ends (at once, SIGKILL) while the new one boots
            say(f"pool {self.name!r}: ending the previous ranks")
            replacing._disconnect()   # (ipyparallel clients stay in this thread)
            if not replacing._attached:
                ending = threading.Thread(target=replacing._terminate, kwargs=dict(grace=0.0),
                                          name="nbmpi-pool-ending", daemon=True)
                ending.start()
            replacing._stopped()
        try:
            self._boot(say, deadline, timeout, engine_file, cmd)
        finally:
            if ending is not None:   # no process of the previous pool outlives the restart
                ending.join()

    def _environment(self) -> Dict[str, str]:
        """The environment of the pool's controller and ranks (of its account, when it has one)."""
        env = rank_environment(base_environment(self.identity), self.env)
        if self.spans_hosts:
            env[POOL_LOCATION_ENV] = str(self.location)
        return env


    @property
    def _owned(self) -> Optional[str]:
        """The work directory when another account owns it (its files are read without links)."""
        return self.work_dir if self.identity is not None else None

    @property
    def _engine_file(self) -> str:
        return os.path.join(self.work_dir, "engine-connection.json")

    def _spawn_ranks(self, env: Dict[str, str], timeout: float) -> List[str]:
        """Start mpiexec with N engine ranks (each under its guard); returns the command."""
        shutil.rmtree(self.status_dir, ignore_errors=True)
        os.makedirs(self.status_dir)
        env = dict(env)
        env["PYTHONUNBUFFERED"] = "1"
        if self.bound_to_owner and not self.spans_hosts:
            env[POOL_OWNER_PID_ENV] = str(os.getpid())  # see engine_side: ranks end if the owner dies
            if self._own_dir:
                env[POOL_WORK_DIR_ENV] = self.work_dir  # ... and remove the directory this pool made
        else:
            env.pop(POOL_OWNER_PID_ENV, None)
        env[STATUS_DIR_ENV] = self.status_dir   # each engine's guard reports a signal that kills it
        cmd = mpiexec_command(self.n, ["-m", "ipyparallel.engine", "--mpi", f"--profile-dir={self.profile_dir}",
                                       f"--file={self._engine_file}", "--log-level=WARN",
                                       f"--IPEngine.wait_for_url_file={max(timeout, 1.0):g}"],
                              module="nbmpi.workers.launch.rank_guard", hosts=self.placement or None,
                              hostfile=self.hostfile, env=env)
        self._mpiexec = self._popen(cmd, env, "engines")
        return cmd

    def _boot(self, say: Callable[[str], None], deadline: float, timeout: float, engine_file: str,
              cmd: List[str]) -> None:
        """Second half of a start: connection files, registration of every rank, runtime set-up."""
        import ipyparallel as ipp   # (in this process, while the new processes import)

        # the engines read their file as soon as it exists, so they get a complete copy, renamed into place
        self._wait_for(lambda: _read_json(self._security("engine"), self._owned) is not None, deadline,
                       "the controller to write its engine connection file", timeout)
        tmp = engine_file + ".tmp"
        with open_no_link(tmp, "w") as f:
            json.dump(_read_json(self._security("engine"), self._owned), f)
        if self.identity is not None:   # the engines run as the pool's account
            self.identity.own(tmp, mode=0o600)
        os.replace(tmp, engine_file)
        self._wait_for(lambda: _read_json(self._security("client"), self._owned) is not None, deadline,
                       "the controller to write its client connection file", timeout)
        info = _read_json(self._security("client"), self._owned)
        say(f"pool {self.name!r}: controller ready; waiting for {self.n} ranks ({os.path.basename(cmd[0])} -n "
            f"{self.n})")
        self._client = ipp.Client(info, profile_dir=self.profile_dir)
        self._join_ranks(say, deadline, timeout, info)

    def _join_ranks(self, say: Callable[[str], None], deadline: float, timeout: float, info: dict) -> None:
        """Wait until every rank registered with the controller (engine id == rank), then set up the
        nbmpi runtime on each (collective) and record what the pool is made of."""
        client = self._client
        last = -1
        while True:
            ids = sorted(client.ids)
            if len(ids) != last:
                last = len(ids)
                say(f"pool {self.name!r}: {len(ids)}/{self.n} ranks registered")
            if len(ids) >= self.n:
                break
            self._check_processes()
            if time.monotonic() > deadline:
                raise EnginePoolError(f"pool {self.name!r}: only {len(ids)} of {self.n} ranks registered within "
                                f"{timeout:.0f} s{self._reach_hint()}; engine log:\n{self._log_tail('engines')}")
            time.sleep(0.05)
        if ids != self.ranks:
            raise EnginePoolError(f"pool {self.name!r}: engine ids {ids} are not the MPI ranks {self.ranks}; "
                            "another engine registered with this controller")
        say(f"pool {self.name!r}: starting the nbmpi runtime on every rank")
        from .engine_side import setup

        view = client[self.ranks]
        ar = view.apply_async(setup)
        while not ar.ready():
            self._check_processes()
            if time.monotonic() > deadline:
                raise EnginePoolError(f"pool {self.name!r}: the runtime did not start on every rank within "
                                f"{timeout:.0f} s; engine log:\n{self._log_tail('engines')}")
            ar.wait(0.1)
        infos = ar.get()
        bad = [(eid, i["rank"]) for eid, i in zip(self.ranks, infos) if i["rank"] != eid]
        if bad:
            raise EnginePoolError(f"pool {self.name!r}: engine id != MPI rank for (engine, rank) {bad}")
        self.rank_info = list(infos)
        self.hosts = [i["host"] for i in infos]
        self._descendants = self._collect_descendants(infos)
        self._info = dict(name=self.name, ranks=list(self.ranks), client=info,
                          profile_dir=self.profile_dir,
                          probes=[[i["probe_host"], i["probe_port"]] for i in infos],
                          hosts=list(self.hosts), pids=[i["pid"] for i in infos],
                          started_at=self._started_at)

    def restart(self, progress: Optional[Callable[[str], None]] = None, timeout: float = 120.0) -> "EnginePool":
        """Fresh ranks (empty namespaces, a new MPI job) for this pool's name and size; block until
        they are ready. Owned pools only. Raises :class:`EnginePoolError`. Returns the pool to keep using.

        While the controller runs, only the ranks are replaced, as ipyparallel restarts engines:
        the old MPI job is killed at once (SIGKILL: its ranks may be stuck, no clean shutdown is
        waited for), its engines are unregistered from the controller, and a new MPI job joins
        the same controller, so a restart costs less than a start (no controller to boot, no
        client to connect); that pool is ``self``. Work that was running on the old ranks fails with
        ipyparallel's ``EngineError``. If the controller has died, or does not confirm that the
        old engines are gone within a few seconds, a new pool (new controller) is started while
        this one is ended, and that new pool is returned.
        """
        if self._attached:
            raise EnginePoolError(f"pool {self.name!r} is attached, not owned; only its owner can restart it")
        if (self._state == "running" and self._client is not None and self._controller is not None
                and self._controller.poll() is None and self._mpiexec is not None):
            if self._restart_ranks(progress or (lambda msg: None), timeout):
                return self
        return self.renewed().start(progress=progress, timeout=timeout, replacing=self)

    #: How long a restart waits for the controller to drop the old engines before it starts a new pool.
    UNREGISTER_WAIT_S = 5.0

    def _restart_ranks(self, say: Callable[[str], None], timeout: float) -> bool:
        """Replace the MPI job, keep the controller and the client (see :meth:`restart`). False
        (nothing new started, the old ranks ended) if the controller did not drop the old engines."""
        self._end_dask()   # the workers end with the old ranks; `%distributed dask` starts new ones
        self._state = "starting"
        self._started_at = time.time()
        deadline = time.monotonic() + timeout
        say(f"pool {self.name!r}: ending the previous ranks (the controller stays)")
        old = self._mpiexec
        pids = set(self._descendants) - self._controller_side()
        segments = noted_segments(self.status_dir)   # read before the new job's guards reuse the directory
        previous = self._set_aside(self.status_dir)   # (engines on other hosts: cleaned up there once ended)

        def end_old_job() -> None:
            end_processes(groups=[old.pid], pids=sorted(pids), grace=0.0, leaders=[old])
            remove_shm(segments)
            self._clean_set_aside(previous, self._environment())

        ending = threading.Thread(target=end_old_job, name="nbmpi-pool-ending", daemon=True)
        ending.start()
        client = self._client
        try:
            # what an engine sends when it leaves; a killed engine cannot, so the pool says it for it
            # (otherwise the controller keeps their ids for HEARTBEAT_MISSES heartbeats)
            for eid in sorted(client.ids):
                client.session.send(client._query_socket, "unregistration_request", content=dict(id=int(eid)))
            gone_by = time.monotonic() + self.UNREGISTER_WAIT_S
            while client.ids and time.monotonic() < gone_by:
                time.sleep(0.005)
            self._mpiexec = None
            if client.ids:   # the controller did not answer: the caller starts a whole new pool
                self._state = "running"
                return False
            self.rank_info, self.hosts, self._descendants = [], [], []
            cmd = self._spawn_ranks(self._environment(), timeout)
            say(f"pool {self.name!r}: waiting for {self.n} new ranks ({os.path.basename(cmd[0])} -n {self.n})")
            self._join_ranks(say, deadline, timeout, self._info["client"])
        except BaseException:
            self._state = "failed"
            self._terminate()
            raise
        finally:
            ending.join()   # no process of the previous MPI job outlives the restart (or its failure)
        self._state = "running"
        say(f"pool {self.name!r}: {self.n} new ranks ready")
        return True

    def _check_processes(self) -> None:
        for what, p in (("controller", self._controller), ("mpiexec", self._mpiexec)):
            if p is not None and p.poll() is not None:
                log = self._log_tail("engines" if what == "mpiexec" else "controller")
                hint = self._reach_hint() if what == "mpiexec" else ""
                raise EnginePoolError(f"pool {self.name!r}: the {what} exited with code {p.returncode} during start"
                                      f"{hint}; its log ends with:\n{log}")

    def _wait_for(self, cond: Callable[[], bool], deadline: float, what: str, timeout: float) -> None:
        while not cond():
            self._check_processes()
            if time.monotonic() > deadline:
                raise EnginePoolError(f"pool {self.name!r}: timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.05)

    def stop(self, grace: float = GRACE_SECONDS) -> None:
        """End the pool: disconnect the client, end the controller and every rank. Idempotent.

        On an attached pool, only disconnects (and removes the directory :meth:`attach` made). Blocks until no
        process of the pool is left (SIGTERM, then SIGKILL after ``grace`` seconds; 0: SIGKILL at once).
        """
        self._disconnect()
        if not self._attached:
            self._terminate(grace)
        elif self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        self._stopped()

    def _end_dask(self) -> None:
        """Close this pool's Dask client; the scheduler and workers end with the controller and ranks."""
        d, self._dask = self._dask, None
        if d is not None:
            d.close()

    def _disconnect(self) -> None:
        self._end_dask()
        if self._client is not None:
            try:
                self._client.close(linger=0)
            except Exception:  # noqa: BLE001 - closing a half-broken client
                pass
            self._client = None

    def _stopped(self) -> None:
        self._state = "stopped"
        if self in _live_pools:
            _live_pools.remove(self)

    def _terminate(self, grace: float = GRACE_SECONDS) -> None:
        procs = [p for p in (self._mpiexec, self._controller) if p is not None]
        pids = set(self._descendants)
        for p in procs:
            try:
                pids.update(c.pid for c in psutil.Process(p.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        # controller and mpiexec lead their own sessions; the nannies run in sessions of their own
        end_processes(groups=[p.pid for p in procs], pids=sorted(pids), grace=grace, leaders=procs)
        if not self._attached:   # MPI's shared memory of ranks that were killed (noted at setup)
            remove_shm(noted_segments(self.status_dir))
            self._clean_other_hosts(self.status_dir, self._environment())   # ... and on the other hosts
        shm_sentinel.end(self._sentinel)   # (after this process's own clean-up)
        self._sentinel = None
        self._mpiexec = self._controller = None
        self._descendants = []
        for f in self._logs:
            f.close()
        self._logs = []
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    # -- state --------------------------------------------------------------------------------
    def connection_info(self) -> Dict[str, Any]:
        """JSON-serialisable connection data for :meth:`attach` or ``ipyparallel.Client(**info["client"])``.

        Keys: ``name``, ``ranks``, ``client`` (the controller's client
        connection file contents), ``profile_dir``, ``probes`` ([host, port] of
        each rank's state probe), ``pids``, ``started_at``.
        """
        if self._info is None:
            raise EnginePoolError(f"pool {self.name!r} is {self._state}; connection info exists once it has started")
        return json.loads(json.dumps(self._info))

    @classmethod
    def attach(cls, info: Dict[str, Any], parent: Optional[str] = None) -> "EnginePool":
        """Connect to a running pool described by ``info`` (:meth:`connection_info`). Blocking.

        :meth:`stop` on the result only disconnects; the owner ends the pool. The attached pool's own
        folder (``work_dir``, removed by :meth:`stop` or at exit) is made inside ``parent``, an existing
        directory (default: the system's temporary folder).
        """
        import ipyparallel as ipp

        try:
            name, ranks, cinfo = info["name"], list(info["ranks"]), dict(info["client"])
        except (KeyError, TypeError) as e:
            raise EnginePoolError(f"connection info lacks {e}; expected the dict of EnginePool.connection_info()") from None
        pool = cls(len(ranks), name=name, work_dir=tempfile.mkdtemp(prefix=f"nbmpi-attach-{name}-",
                                                                      dir=parent))
        pool._attached = True
        pool._own_dir = True
        try:
            pool._client = ipp.Client(cinfo, timeout=10)
            pool._client.wait_for_engines(len(ranks), timeout=30)
        except Exception as e:  # noqa: BLE001
            pool.stop()         # disconnects, removes the directory made above
            raise EnginePoolError(f"cannot connect to pool {name!r}: {e}") from e
        _live_pools.append(pool)    # disconnected (its directory removed) at exit if nobody stops it
        pool.ranks = ranks
        pool._info = json.loads(json.dumps(info))
        pool._started_at = info.get("started_at") or time.time()
        pids = info.get("pids") or []
        probes = info.get("probes") or []
        hosts = info.get("hosts") or []
        pool.rank_info = [dict(rank=r, host=(hosts[k] if k < len(hosts) else ""),
                               probe_host=(probes[k][0] if k < len(probes) else None),
                               pid=(pids[k] if k < len(pids) else -1),
                               probe_port=(probes[k][1] if k < len(probes) else None))
                          for k, r in enumerate(ranks)]
        pool.hosts = [i["host"] for i in pool.rank_info]
        pool._state = "running"
        return pool

    @property
    def attached(self) -> bool:
        """True for a pool obtained by :meth:`attach` (not owned here)."""
        return self._attached

    def probes(self) -> Dict[int, tuple]:
        """rank -> (host, port) of the rank's state probe (see :mod:`nbmpi.workers.launch.engine_side`)."""
        return {i["rank"]: (i.get("probe_host") or "127.0.0.1", i["probe_port"])
                for i in self.rank_info if i.get("probe_port")}

    def client(self):
        """The ``ipyparallel.Client`` connected to this pool (raises if stopped)."""
        if self._client is None:
            raise EnginePoolError(f"pool {self.name!r} is {self._state}; start it (or attach) first")
        return self._client

    def __repr__(self) -> str:
        return f"EnginePool(name={self.name!r}, n={self.n}, state={self._state!r})"
