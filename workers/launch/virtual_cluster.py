"""A cluster on one machine: N nodes as Linux network namespaces joined by a bridge, links capped by ``tbf``.

:class:`VirtualCluster` is the one implementation that tests, benchmarks and users share
(``nbmpi cluster ...``, :mod:`nbmpi.workers.launch.cluster_cli`). Each node is

* a network namespace ``nbID-nodeI`` (``ip netns add``) with its own loopback and an
  ``eth0`` at ``10.213.K.(I+1)``; the other end of its veth pair is on the bridge ``nbID-br``
  in the host's namespace, which has ``10.213.K.1`` (:data:`RANGE` is the one private range
  used, only inside namespaces created here; ``K`` is a free /24 within it, so several clusters
  can be up at once);
* a persistent UTS namespace with the node's name as hostname;
* a persistent mount namespace in which ``/dev/shm`` is the node's own tmpfs, as on a real
  cluster: what a rank leaves there is on its node only (:meth:`VirtualCluster.shm_files` lists it);
* both directions of its link capped by ``tc qdisc ... root tbf`` (default 1 Gbit/s; ``rate=None``:
  uncapped).

Apart from ``/dev/shm``, nodes share the host's filesystem (a status directory in ``/tmp`` is seen
by every node, like a shared filesystem on a real cluster) and its pid namespace (the launcher on the
host sees and ends the processes of every node). Shared memory a killed rank leaves on its node is
removed on that node, by the rank's guard (:mod:`nbmpi.workers.launch.rank_guard`).

Processes run on a node through ``nsenter --net=... --uts=... --mount=...`` (:meth:`VirtualCluster.command`).
MPI reaches the nodes through Hydra's ssh launcher with a stand-in for ssh
(:meth:`VirtualCluster.launch_env`: ``nbmpi run --hosts`` then places ranks on nodes as
``mpiexec -hosts`` does), with MPICH's ``ofi`` netmod over TCP between nodes; ranks of one
node still share memory.

:meth:`VirtualCluster.down` removes everything: every process in the nodes' namespaces, the
namespaces, the bridge and the state directory. It runs at ``with`` exit, at interpreter exit
and on SIGTERM/SIGHUP (:meth:`VirtualCluster.tear_down_on_exit`); ``up`` first removes
clusters whose owner process is gone (a test run killed by SIGKILL). Needs root and ``ip``,
``tc``, ``nsenter``, ``unshare``: :func:`why_not_available` says in one line what is missing.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from .environment import CLUSTER_HOSTS_ENV, LAUNCHER_EXEC_ENV, LAUNCHER_LOCALHOST_ENV
from .processes import end_processes

#: The one private range virtual clusters use; each cluster takes one free /24 of it.
RANGE = "10.213.0.0/16"
_PREFIX = "10.213"
#: Where clusters keep their state (a directory per cluster) and the lock that serialises set-up.
STATE_ROOT = "/run/nbmpi-cluster"
NETNS_DIR = "/var/run/netns"
DEFAULT_NODES = 3
DEFAULT_RATE = "1gbit"
#: Environment the virtual cluster's MPI jobs need: MPICH's ofi netmod over TCP between nodes (UCX's tcp
#: transport fails between namespaces), on the node's eth0.
NETWORK_ENV = {"MPICH_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth0"}
HOSTS_ENV = CLUSTER_HOSTS_ENV
_TOOLS = ("ip", "tc", "nsenter", "unshare")

_SSH_STANDIN = """#!/bin/sh
# ssh stand-in of virtual cluster {cid}: `ssh [-x ...] HOST COMMAND...` runs COMMAND on node HOST
# (a name or an address of this cluster) through its network and UTS namespaces.
while [ $# -gt 0 ]; do case "$1" in -[1246AaCfGgKkMNnqsTtVvXxYy]) shift ;; -?*) shift 2 ;; *) break ;; esac; done
host="$1"; shift
case "$host" in
{cases}
  *) echo "ssh stand-in of virtual cluster {cid}: no node '$host' (nodes: {names})" >&2; exit 255 ;;
esac
exec nsenter --net="{netns}/$node" --uts="{state}/$node.uts" --mount="{state}/$node.mnt" --wd="$PWD" sh -c "$*"
"""


class ClusterUnavailable(RuntimeError):
    """A virtual cluster cannot run on this machine; the message says why in one line."""


def why_not_available() -> Optional[str]:
    """One line saying why no virtual cluster can run here (not root, a tool missing), or None."""
    if os.name != "posix" or not os.path.isdir("/proc/self/ns"):
        return "a virtual cluster needs Linux namespaces (/proc/self/ns); this system has none"
    if os.geteuid() != 0:
        return "a virtual cluster needs root (it creates network namespaces, a bridge and veth links); run as root"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        return f"a virtual cluster needs {', '.join(missing)}, not found on PATH: install iproute2 and util-linux"
    return None


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run one set-up command; raise ClusterUnavailable with its stderr when it fails and ``check``."""
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ClusterUnavailable(f"virtual cluster: `{' '.join(argv)}` failed: "
                                 f"{(proc.stderr or proc.stdout).strip()}")
    return proc


@dataclass
class Node:
    """One node: ``name`` (also its hostname and namespace), ``address`` (its eth0), ``host_link``
    (its veth's end on the bridge)."""
    name: str
    address: str
    host_link: str


class VirtualCluster:
    """N nodes on this machine (see the module). ``with VirtualCluster(3) as vc:`` brings it up and
    tears it down; :meth:`up`/:meth:`down` do it by hand.

    ``rate``: the cap of each node's link in ``tc`` units (``"1gbit"``, ``"100mbit"``) or None
    (uncapped). Blocking; set-up takes about a second. Not thread-safe.
    """

    def __init__(self, nodes: int = DEFAULT_NODES, rate: Optional[str] = DEFAULT_RATE, cid: Optional[str] = None):
        if nodes < 1 or nodes > 200:
            raise ValueError(f"nodes must be between 1 and 200, got {nodes}")
        self.cid = cid or secrets.token_hex(2)
        self.rate = rate
        self.bridge = f"nb{self.cid}-br"
        self.state_dir = os.path.join(STATE_ROOT, self.cid)
        self.subnet: Optional[int] = None
        self.nodes: List[Node] = []
        self._count = int(nodes)
        self._is_up = False
        #: The process whose end makes this cluster stale (0: none, it stays up until torn down by hand).
        self.owner = os.getpid()

    # -- bring up --------------------------------------------------------------------------------
    def up(self) -> "VirtualCluster":
        """Create the bridge, the nodes, their links and caps. Raises :class:`ClusterUnavailable`
        (one line) where that cannot be done; a half-built cluster is removed again."""
        why = why_not_available()
        if why:
            raise ClusterUnavailable(why)
        os.makedirs(STATE_ROOT, exist_ok=True)
        remove_stale()
        with open(os.path.join(STATE_ROOT, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)   # two clusters must not take the same /24
            self.subnet = _free_subnet()
            os.makedirs(self.state_dir)
            self._is_up = True
            try:
                # the nodes' namespace files are bind mounts in here: a private mount (needed for mount namespaces)
                _sh("mount", "--bind", self.state_dir, self.state_dir)
                _sh("mount", "--make-private", self.state_dir)
                _sh("ip", "link", "add", self.bridge, "type", "bridge")
                # where br_netfilter is loaded (Docker hosts), bridged frames would meet the host's iptables
                _sh("ip", "link", "set", self.bridge, "type", "bridge", "nf_call_iptables", "0", check=False)
                _sh("ip", "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
                _sh("ip", "link", "set", self.bridge, "up")
                self._save()
            except BaseException:
                self.down()
                raise
        try:
            for i in range(1, self._count + 1):
                self._add_node(i)
                self._save()
            self._write_standin()
        except BaseException:
            self.down()
            raise
        return self

    def _add_node(self, i: int) -> None:
        name = f"nb{self.cid}-node{i}"
        node = Node(name, f"{_PREFIX}.{self.subnet}.{i + 1}", f"nb{self.cid}-h{i}")
        inner = f"nb{self.cid}-n{i}"
        self.nodes.append(node)
        _sh("ip", "netns", "add", name)
        _sh("ip", "link", "add", node.host_link, "type", "veth", "peer", "name", inner)
        _sh("ip", "link", "set", inner, "netns", name)
        _sh("ip", "link", "set", node.host_link, "master", self.bridge)
        _sh("ip", "link", "set", node.host_link, "up")
        ns = ("ip", "netns", "exec", name)
        _sh(*ns, "ip", "link", "set", inner, "name", "eth0")
        _sh(*ns, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0")
        _sh(*ns, "ip", "link", "set", "eth0", "up")
        _sh(*ns, "ip", "link", "set", "lo", "up")
        if self.rate:
            tbf = ("root", "tbf", "rate", self.rate, "burst", _burst(self.rate), "latency", "50ms")
            _sh("tc", "qdisc", "add", "dev", node.host_link, *tbf)
            _sh(*ns, "tc", "qdisc", "add", "dev", "eth0", *tbf)
        uts, mnt = (os.path.join(self.state_dir, f"{name}.{k}") for k in ("uts", "mnt"))
        open(uts, "w").close()
        _sh("unshare", f"--uts={uts}", "hostname", name)
        open(mnt, "w").close()
        _sh("unshare", f"--mount={mnt}", "--propagation", "private",
            "mount", "-t", "tmpfs", "-o", "mode=1777", f"nbmpi-shm-{name}", "/dev/shm")

    def _write_standin(self) -> None:
        cases = "\n".join(f"  {n.name}|{n.address}) node={n.name} ;;" for n in self.nodes)
        text = _SSH_STANDIN.format(cid=self.cid, cases=cases, names=" ".join(self.names), netns=NETNS_DIR,
                                   state=self.state_dir)
        path = self.ssh_standin
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)

    def _save(self) -> None:
        data = dict(cid=self.cid, owner=self.owner, rate=self.rate, subnet=self.subnet, bridge=self.bridge,
                    nodes=[n.__dict__ for n in self.nodes])
        tmp = os.path.join(self.state_dir, ".cluster.json.tmp")
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, os.path.join(self.state_dir, "cluster.json"))

    @classmethod
    def attach(cls, cid: str) -> "VirtualCluster":
        """The cluster ``cid`` that is up (brought up by another process, e.g. ``nbmpi cluster up``).
        Raises KeyError naming the clusters that are up when there is none of that id."""
        try:
            with open(os.path.join(STATE_ROOT, cid, "cluster.json")) as f:
                data = json.load(f)
        except (OSError, ValueError):
            raise KeyError(f"no virtual cluster {cid!r} is up (up: {', '.join(list_clusters()) or 'none'})") from None
        vc = cls(max(len(data["nodes"]), 1), data["rate"], cid=data["cid"])
        vc.subnet = data["subnet"]
        vc.nodes = [Node(**n) for n in data["nodes"]]
        vc.owner = int(data.get("owner", 0))
        vc._is_up = True
        return vc

    # -- use -------------------------------------------------------------------------------------
    @property
    def bridge_address(self) -> str:
        """The host's address on the cluster's bridge (where the nodes reach ``mpiexec``)."""
        return f"{_PREFIX}.{self.subnet}.1"

    @property
    def names(self) -> List[str]:
        """The nodes' names (= hostnames), node 1 first."""
        return [n.name for n in self.nodes]

    @property
    def addresses(self) -> List[str]:
        """The nodes' addresses, node 1 first."""
        return [n.address for n in self.nodes]

    @property
    def ssh_standin(self) -> str:
        """Path of the ssh stand-in script: ``STANDIN HOST COMMAND...`` runs COMMAND on node HOST."""
        return os.path.join(self.state_dir, "ssh")

    def node(self, which) -> Node:
        """Node by index (an int, 0-based), name, address, or number as a string (``"2"``, ``"node2"``: 1-based)."""
        if isinstance(which, int):
            return self.nodes[which]
        for n in self.nodes:
            if which in (n.name, n.address):
                return n
        number = str(which).removeprefix("node")
        if number.isdigit() and 1 <= int(number) <= len(self.nodes):
            return self.nodes[int(number) - 1]
        raise KeyError(f"no node {which!r} in virtual cluster {self.cid} (nodes: {', '.join(self.names)})")

    def command(self, which, argv: Sequence[str], cwd: Optional[str] = None) -> List[str]:
        """The command line running ``argv`` on node ``which`` (its network, hostname and ``/dev/shm``)
        in directory ``cwd`` (default: this process's)."""
        n = self.node(which)
        base = os.path.join(self.state_dir, n.name)
        return ["nsenter", f"--net={NETNS_DIR}/{n.name}", f"--uts={base}.uts", f"--mount={base}.mnt",
                f"--wd={os.path.abspath(cwd or os.getcwd())}", *argv]

    def run(self, which, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on node ``which`` and wait (``kwargs`` go to :func:`subprocess.run`)."""
        return subprocess.run(self.command(which, argv, kwargs.get("cwd")), **kwargs)

    def popen(self, which, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on node ``which`` and return at once; :meth:`down` ends it if still running."""
        return subprocess.Popen(self.command(which, argv, kwargs.get("cwd")), **kwargs)

    def shm_files(self, which) -> List[str]:
        """The names of the files in node ``which``'s own ``/dev/shm`` now."""
        out = self.run(which, ["ls", "-A", "/dev/shm"], capture_output=True, text=True, check=True).stdout
        return out.split()

    def launch_env(self) -> Dict[str, str]:
        """Environment for ``nbmpi run --hosts`` (and anything else that runs ``mpiexec``) on this
        cluster: Hydra's ssh launcher replaced by the stand-in, the bridge address for the
        proxies to call back, the network netmod, and :data:`HOSTS_ENV`."""
        return {**NETWORK_ENV, LAUNCHER_EXEC_ENV: self.ssh_standin, LAUNCHER_LOCALHOST_ENV: self.bridge_address,
                HOSTS_ENV: ",".join(self.addresses)}

    def pids(self, which) -> List[int]:
        """Pids of the processes running in node ``which``'s network namespace now."""
        out = _sh("ip", "netns", "pids", self.node(which).name, check=False).stdout
        return [int(p) for p in out.split()]

    # -- tear down -------------------------------------------------------------------------------
    def down(self) -> None:
        """End every process in the nodes, remove namespaces, links, bridge and state. Blocking,
        idempotent, never raises for parts already gone."""
        if not self._is_up:
            return
        _tear_down(self.cid, self.bridge, self.names or _names_in(self.cid))
        self._is_up = False

    def tear_down_on_exit(self) -> "VirtualCluster":
        """Call :meth:`down` at interpreter exit and on SIGTERM/SIGHUP (then exit 128+N); Ctrl-C
        raises KeyboardInterrupt as usual, which reaches ``with`` exits and atexit. Main thread only."""
        atexit.register(self.down)

        def on_signal(signum, frame):  # noqa: ARG001
            self.down()
            os._exit(128 + signum)

        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, on_signal)
        return self

    def __enter__(self) -> "VirtualCluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def _burst(rate: str) -> str:
    """A tbf bucket of 1 ms at ``rate`` (at least 16 KiB: one full-size segment and then some)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bit": 1.0}
    r = rate.strip().lower()
    for u, f in units.items():
        if r.endswith(u):
            try:
                bps = float(r[: -len(u)]) * f
            except ValueError:
                break
            return str(max(int(bps / 8 / 1000), 16384))
    raise ValueError(f"link rate {rate!r}: give it as tc does, e.g. 100mbit, 1gbit, 10gbit (or none)")


def _free_subnet() -> int:
    """A K in 1..254 such that no interface of the host has an address in 10.213.K.0/24."""
    out = _sh("ip", "-o", "-4", "addr", "show").stdout
    used = {int(w.split(".")[2]) for w in out.split() if w.startswith(_PREFIX + ".")}
    for k in range(1, 255):
        if k not in used:
            return k
    raise ClusterUnavailable(f"virtual cluster: every /24 of {RANGE} is taken; remove stale clusters "
                             "with `nbmpi cluster down --all`")


def _names_in(cid: str) -> List[str]:
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(f"nb{cid}-node"))
    except OSError:
        return []


def _tear_down(cid: str, bridge: str, names: Sequence[str]) -> None:
    """End the processes of nodes ``names``, then delete them, ``bridge`` and cluster ``cid``'s state."""
    pids: List[int] = []
    for name in names:
        out = _sh("ip", "netns", "pids", name, check=False).stdout
        pids += [int(p) for p in out.split()]
    if pids:
        end_processes(pids=pids, grace=1.0)
    state = os.path.join(STATE_ROOT, cid)
    # the links first, explicitly: a namespace's own veth ends go only when the kernel frees it, later
    links = _sh("ip", "-o", "link", "show", check=False).stdout
    for word in links.split():
        if word.startswith(f"nb{cid}-h"):
            _sh("ip", "link", "del", word.split("@", 1)[0].rstrip(":"), check=False)
    for name in names:   # mount namespaces first: they hold copies of the other namespaces' bind mounts
        mnt = os.path.join(state, f"{name}.mnt")
        if os.path.exists(mnt):
            _sh("umount", mnt, check=False)
    for name in names:
        _sh("ip", "netns", "del", name, check=False)
        uts = os.path.join(state, f"{name}.uts")
        if os.path.exists(uts):
            _sh("umount", uts, check=False)
    _sh("ip", "link", "del", bridge, check=False)
    if os.path.isdir(state):   # the private bind mount of up() (os.path.ismount misses a same-device bind)
        _sh("umount", state, check=False)
    shutil.rmtree(state, ignore_errors=True)


def list_clusters() -> List[str]:
    """Ids of the clusters that are up on this machine (by any process)."""
    try:
        return sorted(d for d in os.listdir(STATE_ROOT) if os.path.isfile(os.path.join(STATE_ROOT, d, "cluster.json")))
    except OSError:
        return []


def down_cluster(cid: str) -> None:
    """Tear down cluster ``cid`` (whoever brought it up). Raises KeyError if none has that id."""
    VirtualCluster.attach(cid).down()


def remove_stale() -> List[str]:
    """Tear down clusters whose owner process is gone; returns their ids."""
    gone = []
    for cid in list_clusters():
        try:
            with open(os.path.join(STATE_ROOT, cid, "cluster.json")) as f:
                owner = int(json.load(f).get("owner", 0))
        except (OSError, ValueError):
            continue
        if owner and not os.path.exists(f"/proc/{owner}"):
            down_cluster(cid)
            gone.append(cid)
    return gone
