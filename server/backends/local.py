"""The local backend: jobs and pools run as mpiexec process groups on the controller's own host.

With a job's or pool's :class:`~nbmpi.workers.launch.identity.Identity` (a controller run by
root serving several users) mpiexec, every rank and the pool's processes run as that
account, in a directory given to it; the ranks' environment is
:func:`~nbmpi.workers.launch.environment.job_environment` of the account's.

A job is one :func:`nbmpi.workers.launch.launcher.start` (``mpiexec`` in a new
session, every rank under :mod:`nbmpi.workers.launch.rank_entry`, output to
``log_dir``, exit codes to ``JOB_DIR/status``, trace to ``trace_dir``), watched
by the same :class:`~nbmpi.workers.launch.launcher.RankWatch` as ``nbmpi run``: when
a rank fails, the whole group is ended after the others' grace period. Its
stored state is ``{"pgid": ..., "status_dir": ...}``.

A pool is a :class:`~nbmpi.workers.launch.engine_pool.EnginePool` started here and not
bound to the service's life (it is re-attached after a restart); its state
is the pids of its controller, mpiexec and ranks (and its hosts), so a pool that cannot be
re-attached is ended by pid (and its engines' shared memory removed on its hosts).

With ``hosts`` (``nbmpi serve --hosts``) or ``hostfile`` (``--hostfile``) a job's ranks are placed on
those hosts as ``nbmpi run --hosts`` places them (:func:`nbmpi.workers.launch.launcher.placement_args`:
Hydra's ssh launcher, or ``$NBMPI_LAUNCHER_EXEC`` and ``$NBMPI_LAUNCHER_LOCALHOST`` from the service's
environment, e.g. a virtual cluster's :meth:`~nbmpi.workers.launch.virtual_cluster.VirtualCluster.launch_env`);
the data directory must then be on a filesystem every host sees. When such a job did not
succeed, the shared memory its killed ranks left on the other hosts is removed there
(:func:`nbmpi.workers.launch.remote_cleanup.clean_hosts`). A pool's engines are placed on the same hosts
(``EnginePool(hosts=..., hostfile=...)``, :mod:`nbmpi.workers.launch.pool_hosts`): users name no host,
the operator's ``--hosts``/``--hostfile`` decide for every job and pool; the pool's ipyparallel
controller stays on this host, where the engines reach it at ``$NBMPI_LAUNCHER_LOCALHOST`` (or this
host's name), and so do its clients (``%distributed connect``).

Containment (:meth:`LocalBackend.contain`): a controller run by root on a host with a writable cgroup
v2 hierarchy starts every job and pool in a cgroup of its own (:mod:`nbmpi.workers.launch.cgroups`),
entered before anything of it runs and before the drop to the user's account; when the job ends or is
cancelled, or the pool stops, everything in it is killed and the cgroup removed
(:func:`~nbmpi.workers.launch.processes.end_cgroup`), also a daemon whose job killed its own rank
guard and the process manager above it. Its path is in the stored state; cgroups a previous run of
the controller left are ended at start (:meth:`LocalBackend.sweep`). Elsewhere each rank's guard, a
child subreaper, is the only containment.

After a restart a job that was running cannot be followed (its mpiexec was
this process's child): :meth:`LocalBackend.recover` ends what is left of it
and the record becomes ``lost``.
"""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import psutil

from nbmpi.workers.launch import launcher
from nbmpi.workers.launch.cgroups import CGROUP_PHRASE, SUBREAPER_PHRASE, ControllerCgroups
from nbmpi.workers.launch.engine_pool import EnginePool
from nbmpi.workers.launch.environment import LAUNCHER_EXEC_ENV, STATUS_DIR_ENV, job_environment
from nbmpi.workers.launch.identity import base_environment, open_no_link
from nbmpi.workers.launch.processes import end_cgroup, end_group_of, end_processes, noted_segments, remove_shm

from . import Backend, BackendError, JobSpec, JobStatus, PoolSpec


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip() or "(no output)"
    except OSError:
        return "(no output)"


def _is_job_group(pgid: int, status_dir: str) -> bool:
    """Whether ``pgid`` still leads the job's mpiexec (guards against pid reuse after a restart)."""
    try:
        env = psutil.Process(pgid).environ()
    except (psutil.Error, OSError):
        return False
    return env.get(STATUS_DIR_ENV, "") == status_dir


def _is_pool_process(pid: int) -> bool:
    """Whether ``pid`` is still a process of a pool (ipyparallel controller, mpiexec, engine)."""
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return False
    return "ipyparallel" in cmd or "mpiexec" in cmd or "hydra" in cmd


class _Launch:
    """A job started by this service: its mpiexec, the watch of its ranks, its environment."""

    def __init__(self, proc: subprocess.Popen, watch: launcher.RankWatch, env: Dict[str, str],
                 cgroup: Optional[str] = None):
        self.proc = proc
        self.watch = watch
        self.env = env
        self.cgroup = cgroup


class LocalBackend(Backend):
    """Jobs and pools on this host with the bundled (or ``NBMPI_MPIEXEC``) mpiexec; jobs and pools on
    ``hosts`` (``host[:slots]`` entries) or the hosts of ``hostfile`` when given (see the module)."""

    name = "local"

    def __init__(self, hosts: Optional[Sequence[str]] = None, hostfile: Optional[str] = None) -> None:
        if hosts and hostfile:
            raise BackendError("give the hosts either as a list (--hosts) or in a file (--hostfile), not both")
        if hostfile and not os.path.isfile(hostfile):
            raise BackendError(f"--hostfile {hostfile}: no such file; give one host[:slots] a line")
        self.hosts: Optional[List[str]] = list(hosts) if hosts else None
        self.hostfile = hostfile
        self._launches: Dict[int, _Launch] = {}
        self._lock = threading.Lock()
        #: This controller's cgroups (None: no containment beyond the rank guards), see :meth:`contain`.
        self.cgroups: Optional[ControllerCgroups] = None
        self._live_cgroups: set = set()

    # -- containment -------------------------------------------------------------------------
    def contain(self, data_dir: Path) -> str:
        """Use a cgroup per job and pool when this process can (root, writable cgroup v2); the
        phrase saying which containment is in force."""
        self.cgroups = ControllerCgroups.open(str(data_dir))
        return CGROUP_PHRASE if self.cgroups is not None else SUBREAPER_PHRASE

    def sweep(self) -> List[str]:
        """End and remove the cgroups of this controller that nothing of this run uses (what a
        previous run that died left); returns their names. Call after recovery."""
        if self.cgroups is None:
            return []
        with self._lock:
            stale = [n for n in self.cgroups.names() if self.cgroups.path(n) not in self._live_cgroups]
        for name in stale:
            end_cgroup(self.cgroups.path(name))
        return stale

    def close(self) -> None:
        """Remove this controller's cgroup directory when nothing is left in it (pools that outlive
        the service keep theirs, and it, for the next start)."""
        if self.cgroups is not None:
            try:
                os.rmdir(self.cgroups.base)
            except OSError:
                pass

    def _new_cgroup(self, name: str) -> Optional[str]:
        """A fresh cgroup ``name`` for a job or pool (None without containment); a leftover of
        that name is ended first."""
        if self.cgroups is None:
            return None
        path = self.cgroups.path(name)
        with self._lock:
            self._live_cgroups.add(path)
        end_cgroup(path)
        try:
            return self.cgroups.create(name)
        except OSError as exc:
            self._end_cgroup(path)
            raise BackendError(f"could not make the cgroup {path} for {name}: {exc}") from exc

    def _end_cgroup(self, path: Optional[str]) -> None:
        """End everything in ``path`` (a job's or pool's cgroup of this controller) and remove it."""
        if not path or self.cgroups is None or not self.cgroups.owns(path):
            return
        end_cgroup(path)
        with self._lock:
            self._live_cgroups.discard(path)

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> Dict[str, Any]:
        status_dir = str(spec.job_dir / "status")
        env = job_environment(spec, status_dir, base_environment(spec.identity))
        cgroup = self._new_cgroup(f"job-{spec.id}")
        try:
            os.makedirs(status_dir, exist_ok=True)
            if spec.identity is not None:   # its ranks write status, logs and trace there
                spec.identity.own(spec.job_dir)
            # in the job's own directory: never through a link another job of its account put there
            with open_no_link(spec.job_dir / "launcher.out", "wb") as out, \
                    open_no_link(spec.job_dir / "launcher.err", "wb") as err:
                proc = launcher.start(spec.ranks, [str(spec.script_path), *spec.args], status_dir, env=env,
                                      stdout=out, stderr=err, cwd=str(spec.job_dir), full_env=True,
                                      identity=spec.identity, hosts=self.hosts, hostfile=self.hostfile,
                                      cgroup=cgroup)
        except (OSError, ValueError) as exc:  # e.g. no mpiexec
            self._end_cgroup(cgroup)
            raise BackendError(f"could not start mpiexec: {exc}") from exc
        with self._lock:
            self._launches[spec.id] = _Launch(proc, launcher.RankWatch(status_dir, spec.ranks), env, cgroup)
        return {"pgid": proc.pid, "status_dir": status_dir, "cgroup": cgroup}

    def poll(self, spec: JobSpec, state: Dict[str, Any]) -> JobStatus:
        launch = self._launches.get(spec.id)
        if launch is None:
            raise BackendError(f"job {spec.id} was not started by this service")
        if launch.proc.poll() is None and not launch.watch.should_end():
            return JobStatus("running")
        return self._end(spec, launch, cancelled=False)

    def cancel(self, spec: JobSpec, state: Dict[str, Any]) -> JobStatus:
        launch = self._launches.get(spec.id)
        if launch is None:
            return JobStatus("ended", outcome="cancelled", exit_code=130, codes=[None] * spec.ranks,
                             message="cancelled by its owner")
        return self._end(spec, launch, cancelled=launch.proc.poll() is None)

    def _end(self, spec: JobSpec, launch: _Launch, cancelled: bool) -> JobStatus:
        """End the job's whole process group (whatever ended it), then everything left in its
        cgroup, and read its outcome."""
        end_group_of(launch.proc)
        self._end_cgroup(launch.cgroup)
        with self._lock:
            self._launches.pop(spec.id, None)
        out = launch.watch.outcome(launch.proc.returncode)
        launch.watch.clean_up()
        if (self.hosts or self.hostfile) and (cancelled or out.exit_code != 0):
            from nbmpi.workers.launch.remote_cleanup import clean_hosts, hosts_of   # killed ranks' segments there

            clean_hosts(hosts_of(self.hosts, self.hostfile), launch.watch.status_dir,
                        shell=launch.env.get(LAUNCHER_EXEC_ENV) or "ssh", env=launch.env)
        if cancelled:
            return JobStatus("ended", outcome="cancelled", exit_code=130, codes=out.codes,
                             message="cancelled by its owner")
        if out.exit_code == 0:
            return JobStatus("ended", outcome="succeeded", exit_code=0, codes=out.codes)
        msg = out.message or ""
        if msg.startswith("mpiexec exited"):   # no rank said anything: show what mpiexec said
            msg = f"{msg}: {_tail(spec.job_dir / 'launcher.err')}"
        return JobStatus("ended", outcome="failed", exit_code=out.exit_code, codes=out.codes, message=msg)

    def recover(self, spec: JobSpec, state: Dict[str, Any]) -> bool:
        pgid, status_dir = state.get("pgid"), state.get("status_dir", "")
        if pgid:
            end_processes(groups=[pgid], grace=1.0, still_ours=lambda g: _is_job_group(g, status_dir))
        self._end_cgroup(state.get("cgroup"))
        return False

    # -- pools -------------------------------------------------------------------------------
    def start_pool(self, spec: PoolSpec,
                   progress: Optional[Callable[[str], None]] = None) -> Tuple[EnginePool, Dict[str, Any]]:
        os.makedirs(spec.work_dir, exist_ok=True)
        cgroup = self._new_cgroup(f"pool-{spec.id}")
        pool = EnginePool(spec.ranks, name=spec.name, work_dir=str(spec.work_dir), identity=spec.identity,
                          bound_to_owner=False,  # pools outlive a service restart (re-attached)
                          hosts=self.hosts, hostfile=self.hostfile, cgroup=cgroup)
        try:
            pool.start(progress=progress, timeout=spec.timeout)
        except BaseException:
            pool.stop()
            self._end_cgroup(cgroup)
            raise
        return pool, {"pids": pool.status()["pids"], "status_dir": pool.status_dir, "cgroup": cgroup,
                      "hosts": pool.host_names()}

    def stop_pool(self, pool: Optional[EnginePool], state: Dict[str, Any]) -> None:
        if pool is not None:
            pool.stop()
            if not pool.attached:
                self._end_cgroup((state or {}).get("cgroup"))
                return
        pids = (state or {}).get("pids") or {}
        end_processes(groups=[p for p in (pids.get("controller"), pids.get("mpiexec")) if p],
                      pids=[p for p in pids.get("ranks") or [] if p], grace=3.0, still_ours=_is_pool_process)
        self._end_cgroup((state or {}).get("cgroup"))
        if (state or {}).get("status_dir"):   # MPI's shared memory of engines that were killed
            remove_shm(noted_segments(state["status_dir"]))
            if state.get("hosts") and os.path.isdir(state["status_dir"]):   # ... also on the pool's other hosts
                from nbmpi.workers.launch.remote_cleanup import clean_hosts

                clean_hosts(list(state["hosts"]), state["status_dir"],
                            shell=os.environ.get(LAUNCHER_EXEC_ENV) or "ssh")

    def recover_pool(self, connection: Dict[str, Any], state: Dict[str, Any]) -> Optional[EnginePool]:
        pool = None
        try:
            pool = EnginePool.attach(connection, parent=self._attach_parent())
            if pool.alive():
                if self.cgroups is not None and self.cgroups.owns((state or {}).get("cgroup") or ""):
                    with self._lock:   # still in use: not swept
                        self._live_cgroups.add(state["cgroup"])
                return pool
        except Exception:  # noqa: BLE001 - unreachable: ended below
            pass
        self.stop_pool(pool, state)
        return None
