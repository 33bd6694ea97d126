"""Where the engines of a pool run when they are not all on its owner's host: placement on hosts.

:class:`_PoolHosts` is a mixin of :class:`~nbmpi.workers.launch.engine_pool.EnginePool`; it reads the
pool's ``placement`` (``host[:slots]`` entries, as ``mpiexec -hosts`` takes them), ``hostfile`` and
``name``. The engines are placed through the one launch mechanism
(:func:`nbmpi.workers.launch.launcher.placement_args`: Hydra's ssh launcher, or
``$NBMPI_LAUNCHER_EXEC``/``$NBMPI_LAUNCHER_LOCALHOST``, e.g. a virtual cluster's launch environment);
this module adds what a pool needs around it: where its controller listens (:func:`controller_address`),
a check that every host answers before anything starts (:meth:`_PoolHosts._unreachable_message`, so a
wrong name fails at once and says which), and the removal of shared memory that killed engines left on
the other hosts (:meth:`_PoolHosts._clean_other_hosts`). Blocking where it runs a remote shell; no MPI.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .environment import LAUNCHER_EXEC_ENV, LAUNCHER_LOCALHOST_ENV, POOL_IP_ENV

__all__: list = []


def checked_placement(hosts: Optional[Sequence[str]], hostfile: Optional[str]) -> Tuple[List[str], Optional[str]]:
    """``(hosts, hostfile)`` cleaned (blank entries dropped, the file's absolute path). Raises ValueError
    saying what to do when both are given or the file does not exist."""
    if hosts and hostfile:
        raise ValueError("give the hosts either as a list (--hosts) or in a file (--hostfile), not both")
    if hostfile and not os.path.isfile(hostfile):
        raise ValueError(f"hostfile {hostfile!r}: no such file; give a file with one host[:slots] a line")
    return [h.strip() for h in hosts or [] if h.strip()], (os.path.abspath(hostfile) if hostfile else None)


def _is_address(text: Optional[str]) -> bool:
    try:
        ipaddress.ip_address(str(text))
        return True
    except ValueError:
        return False


def controller_address(spans_hosts: bool, ip: Optional[str], location: Optional[str],
                       env: Mapping[str, str]) -> Tuple[str, Optional[str]]:
    """``(ip, location)`` of a pool's ipyparallel controller: what was given, else for engines on this
    host only ``$NBMPI_POOL_IP`` or 127.0.0.1; for engines on other hosts ``location`` is
    ``$NBMPI_LAUNCHER_LOCALHOST`` (this host's address as they reach it) or this host's name, and ``ip``
    is ``$NBMPI_POOL_IP``, else ``location`` when it is an address, else ``*`` (every interface)."""
    if not spans_hosts:
        return ip or env.get(POOL_IP_ENV) or "127.0.0.1", location
    location = location or env.get(LAUNCHER_LOCALHOST_ENV) or socket.gethostname()
    return ip or env.get(POOL_IP_ENV) or (location if _is_address(location) else "*"), location


class _PoolHosts:
    """Mixin of ``EnginePool``: its hosts, their reachability and the clean-up there."""

    placement: List[str]
    hostfile: Optional[str]
    name: str
    ip: str
    location: Optional[str]

    @property
    def spans_hosts(self) -> bool:
        """True when the engines are placed on hosts (``hosts`` or ``hostfile`` given)."""
        return bool(self.placement or self.hostfile)

    def host_names(self) -> List[str]:
        """The distinct hosts the engines are placed on (from ``hosts`` or ``hostfile``; empty: this host)."""
        from .remote_cleanup import hosts_of

        return hosts_of(self.placement, self.hostfile) if self.spans_hosts else []

    def _reach_hint(self) -> str:
        """For engines on other hosts that did not register: where they had to connect and what to set
        when they cannot (``""`` for a pool on this host only)."""
        if not self.spans_hosts:
            return ""
        return (f" (the engines on {', '.join(self.host_names())} connect to this host's controller at "
                f"{self.location}, listening on {self.ip}: every host must reach that address; else set "
                "$NBMPI_LAUNCHER_LOCALHOST, or $NBMPI_POOL_IP, to an address of this host they reach)")

    def _unreachable_message(self, env: Dict[str, str], timeout: float) -> Optional[str]:
        """None when every host answers ``SHELL -x HOST true`` (the launcher's shell, as in ``env``) within
        ``timeout`` s; else what is wrong, naming the hosts, and what to do. Blocking (hosts tried at once)."""
        from .remote_cleanup import unreachable

        hosts = self.host_names()
        if not hosts:
            return f"pool {self.name!r}: the hostfile {self.hostfile} names no host; give one host[:slots] a line"
        shell = env.get(LAUNCHER_EXEC_ENV) or "ssh"
        bad = unreachable(hosts, shell, env, timeout=timeout)
        if not bad:
            return None
        what = "; ".join(f"{h}: {why}" for h, why in bad.items())
        return (f"pool {self.name!r}: cannot start engines on {', '.join(bad)} ({what}). Give hosts that "
                f"`{shell} -x HOST true` reaches from this host without a password (names or addresses, "
                "host:N for N slots); on a virtual cluster, its nodes' names or addresses, with its launch "
                "environment set (`nbmpi cluster up` prints it)")

    def _clean_other_hosts(self, status_dir: str, env: Dict[str, str]) -> None:
        """Remove on every host the shared memory that engines noted in ``status_dir`` and no live process
        there maps any more (engines killed with their guards). Blocking; never raises for a host."""
        if self.spans_hosts and os.path.isdir(status_dir):
            from .remote_cleanup import clean_hosts

            clean_hosts(self.host_names(), status_dir, shell=env.get(LAUNCHER_EXEC_ENV) or "ssh", env=env)

    def _set_aside(self, status_dir: str) -> Optional[str]:
        """Engines on other hosts: move ``status_dir`` (what the ending job's engines noted) aside and
        return where, so a new job can use the name while the old job's shared memory is removed on its
        hosts (:meth:`_clean_set_aside`, once it ended). None (nothing moved) otherwise."""
        if not self.spans_hosts or not os.path.isdir(status_dir):
            return None
        aside = f"{status_dir}.ending"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(status_dir, aside)
        return aside

    def _clean_set_aside(self, aside: Optional[str], env: Dict[str, str]) -> None:
        """After the old job ended: its engines' shared memory removed on every host, then ``aside`` removed."""
        if aside:
            self._clean_other_hosts(aside, env)
            shutil.rmtree(aside, ignore_errors=True)
