"""A real multi-node Slurm on a virtual cluster, for tests (and by hand: see :func:`main`).

:class:`MultiNodeSlurm` is the single-node :class:`test_slurm.SlurmCluster` (munged with a generated
key, slurmctld and slurmd as root in the foreground, files under one directory) spread over the
nodes of a :class:`~nbmpi.workers.launch.virtual_cluster.VirtualCluster`:

* munged and slurmctld run in the host's namespaces; ``SlurmctldHost=HOST(BRIDGE)``, the host's
  address on the cluster's bridge, is where the nodes reach the controller (and where the client
  commands run on the host reach it);
* one ``slurmd -N NODE`` per node, started inside the node's network, UTS and mount namespaces
  (:meth:`VirtualCluster.popen`, i.e. ``nsenter``: not ``ip netns exec``, which remounts ``/sys`` so
  that slurmd finds no cgroup filesystem); ``NodeName`` is the node's hostname and ``NodeAddr`` its
  address; ``%n`` in the spool, pid and log paths keeps the slurmds apart;
  ``SlurmdParameters=config_overrides`` lets each node declare the CPUs given here;
* munge's socket is a file every node sees (nodes share the host's filesystem), so every
  slurmd and every job step authenticates with the one munged;
* every Slurm command run through :meth:`MultiNodeSlurm.run` (and every controller started with
  :attr:`env`) has the virtual cluster's MPI network settings
  (:data:`~nbmpi.workers.launch.virtual_cluster.NETWORK_ENV`: MPICH's ``ofi`` netmod over TCP on
  ``eth0``), which ``sbatch`` passes on to the job (``--export=ALL``), so ``srun --mpi=pmi2``
  ranks on different nodes reach each other.

Needs root, ``ip``/``nsenter`` and Debian's Slurm and munge packages; :func:`why_not_available`
says in one line what is missing.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from nbmpi.workers.launch.virtual_cluster import NETWORK_ENV, VirtualCluster
from nbmpi.workers.launch.virtual_cluster import why_not_available as cluster_unavailable

from test_slurm import PARTITION, SlurmCluster, _ensure_packages, _find

#: Keys of the single-node slurm.conf whose values differ on a multi-node cluster (``%n``: the node's name).
_NODE_PATHS = {"SlurmdSpoolDir": "{r}/spool/%n", "SlurmdPidFile": "{r}/slurmd-%n.pid",
               "SlurmdLogFile": "{r}/log/slurmd-%n.log"}


def why_not_available() -> Optional[str]:
    """One line saying why no multi-node Slurm can run here (no virtual cluster, no Slurm), or None."""
    return cluster_unavailable() or _ensure_packages()


class MultiNodeSlurm(SlurmCluster):
    """Slurm with one slurmd on each node of ``vc`` (which must be up), files under ``root``.
    Each node declares ``cpus_per_node`` CPUs (default: this machine's, at least 2). Blocking
    :meth:`start` / :meth:`stop`, as for :class:`SlurmCluster`; :meth:`stop` ends the slurmds too."""

    def __init__(self, root: Path, vc: VirtualCluster, cpus_per_node: Optional[int] = None):
        super().__init__(root)
        self.vc = vc
        self.cpus_per_node = cpus_per_node or max(self.cpus, 2)
        self.cpus = self.cpus_per_node * len(vc.nodes)   # what the partition has in all
        self.env.update(NETWORK_ENV)

    @property
    def node_names(self):
        """The Slurm node names (= the virtual cluster's node hostnames), node 1 first."""
        return self.vc.names

    def write_conf(self) -> None:
        """The single-node slurm.conf with the controller on the bridge, ``%n`` paths and one
        ``NodeName`` line per node."""
        super().write_conf()
        r = self.root
        values = {"SlurmctldHost": f"{self.host}({self.vc.bridge_address})",
                  "SlurmdParameters": "config_overrides",
                  **{k: v.format(r=r) for k, v in _NODE_PATHS.items()}}
        lines = []
        for line in self.conf.read_text().splitlines():
            key = line.split("=", 1)[0]
            if key in ("NodeName", "PartitionName", "SlurmdParameters") or not line.strip():
                continue
            lines.append(f"{key}={values[key]}" if key in values else line)
        lines.append(f"SlurmdParameters={values['SlurmdParameters']}")
        for node in self.vc.nodes:
            lines.append(f"NodeName={node.name} NodeAddr={node.address} CPUs={self.cpus_per_node} State=UNKNOWN")
        lines.append(f"PartitionName={PARTITION} Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE "
                     "State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def start_nodes(self) -> None:
        """A slurmd on every node (in its namespaces, its own spool); returns once every node is idle
        (munged and slurmctld run on the host: :meth:`SlurmCluster.start_controller`)."""
        r = self.root
        for i, name in enumerate(self.node_names):
            (r / "spool" / name).mkdir()
            self._spawn(f"slurmd-{name}", self.vc.command(i, [_find("slurmd"), "-D", "-N", name, "-f",
                                                               str(self.conf)], cwd=str(r)))
        self._wait(self._all_idle, f"the {len(self.node_names)} nodes to be idle", "slurmctld")

    def _all_idle(self) -> bool:
        out = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"]).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return all(states.get(n) == "idle" for n in self.node_names)

    def node_of(self, pid: int) -> Optional[str]:
        """The name of the node whose network namespace runs ``pid`` (None: none of them)."""
        for name in self.node_names:
            if pid in self.vc.pids(name):
                return name
        return None


def main() -> int:
    """``python tests/multinode_slurm.py [NODES]``: bring up a virtual cluster with Slurm on it, print
    how to use it (SLURM_CONF), and keep it up until Ctrl-C; then tear everything down."""
    import sys
    import tempfile

    why = why_not_available()
    if why:
        print(why, file=sys.stderr)
        return 2
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    root = Path(tempfile.mkdtemp(prefix="nbmpi-slurm-nodes-", dir="/tmp"))
    root.chmod(0o755)
    with VirtualCluster(nodes) as vc:
        slurm = MultiNodeSlurm(root, vc)
        try:
            slurm.start()
            env = " ".join(f"{k}={v}" for k, v in sorted(NETWORK_ENV.items()))
            print(f"Slurm on {nodes} nodes ({', '.join(vc.names)}) is up; in another shell:\n"
                  f"  export SLURM_CONF={slurm.conf} {env}\n  sinfo; sbatch -N {nodes} ...\n"
                  "Ctrl-C ends it.", flush=True)
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            slurm.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
