"""Health of an engine pool (:class:`~nbmpi.workers.launch.engine_pool.EnginePool`):
whether its processes and engines are alive, which ranks died and how, and its
status record.

:class:`_PoolHealth` is a mixin of ``EnginePool``; its methods read the pool's own
attributes (``_client``, ``_state``, ``_controller``, ``_mpiexec``,
``rank_info``, ``status_dir``). Local and non-blocking, except :meth:`alive`,
which asks the controller for its engine ids. A rank's death is seen by pid on
this host; on other hosts (a pool with ``hosts``) by the report of its guard
(:mod:`nbmpi.workers.launch.rank_guard`: the signal that killed it, in the status
directory every host sees), and in any case when the controller drops the engine.
"""
from __future__ import annotations

import socket
import time
from typing import Any, Dict, List

import psutil

__all__: list = []


class _PoolHealth:
    """Mixin of ``EnginePool``: liveness of the controller, the MPI job and each rank; the status record."""

    def alive(self) -> bool:
        """True if the controller answers and all N engines are registered and their processes run."""
        if self._client is None or self._state != "running":
            return False
        if not self._attached:
            for p in (self._controller, self._mpiexec):
                if p is None or p.poll() is not None:
                    return False
        for i in self.rank_info:
            if i.get("host") == socket.gethostname() and not psutil.pid_exists(i["pid"]):
                return False
        try:
            return sorted(self._client.ids) == self.ranks
        except Exception:  # noqa: BLE001 - controller gone
            return False

    def dead_ranks(self) -> List[tuple]:
        """``[(rank, pid), ...]`` of ranks on this host whose process is gone (or a zombie), and of ranks on
        other hosts whose guard reported the signal that killed them (in the status directory, which every
        host sees). Local, cheap (no request to the engines)."""
        from .launcher import read_signals

        here = socket.gethostname()
        killed = read_signals(self.status_dir, self.n) if not self._attached and self.rank_info else {}
        dead = []
        for i in self.rank_info:
            if i.get("host") != here and i["rank"] in killed:
                dead.append((i["rank"], i.get("pid", -1)))
            if i.get("host") != here or i.get("pid", -1) <= 0:
                continue
            try:
                gone = psutil.Process(i["pid"]).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            except psutil.Error:
                gone = False
            if gone:
                dead.append((i["rank"], i["pid"]))
        return dead

    def describe_dead(self, dead: List[tuple]) -> str:
        """A sentence naming the ranks a signal killed, as their guards reported it
        (:mod:`nbmpi.workers.launch.rank_guard`), e.g. ``"rank 1 (pid 4242) was killed by SIGKILL; MPI then
        ended ranks [0]"``; else which ranks are gone."""
        from .launcher import read_signals

        killed = read_signals(self.status_dir, self.n) if not self._attached else {}
        pids = dict(dead)
        if killed:
            first = ", ".join(f"rank {r} (pid {pids.get(r, '?')}) was killed by {sig}" for r, sig in killed.items())
            rest = [r for r, _ in dead if r not in killed]
            return first + (f"; MPI then ended ranks {rest}" if rest else "")
        return ", ".join(f"rank {r} (pid {pid}) died" for r, pid in dead)

    def status(self) -> Dict[str, Any]:
        """``{"name", "ranks", "hosts", "state", "uptime_s", "pids"}`` (a failed pool says "failed")."""
        state = self._state
        if state == "running" and not self.alive():
            state = "failed"
        uptime = time.time() - self._started_at if self._started_at and state in ("starting", "running") else 0.0
        pids = dict(controller=self._controller.pid if self._controller else None,
                    mpiexec=self._mpiexec.pid if self._mpiexec else None,
                    ranks=[i["pid"] for i in self.rank_info])
        return dict(name=self.name, ranks=list(self.ranks), hosts=list(self.hosts), state=state,
                    uptime_s=round(uptime, 3), pids=pids)

    def _controller_side(self) -> set:
        """Pids of the controller and its descendants (ipyparallel's schedulers)."""
        pids = set()
        if self._controller is not None:
            pids.add(self._controller.pid)
            try:
                pids.update(c.pid for c in psutil.Process(self._controller.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return pids

    def _collect_descendants(self, infos) -> List[int]:
        pids = set()
        roots = [p for p in (self._controller, self._mpiexec) if p is not None]
        for root in roots:
            try:
                pids.update(c.pid for c in psutil.Process(root.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        for i in infos:
            pids.add(i["pid"])
            pids.update(i.get("nanny_pids", []))
        return sorted(pids)

