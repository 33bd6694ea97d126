"""``nbmpi cluster``: a virtual cluster on this machine from the command line.

* ``nbmpi cluster run [--nodes 3] [--rate 1gbit|none] -- COMMAND...``: bring a cluster up, run
  COMMAND on this host with the cluster's launch environment (``{hosts}`` in COMMAND becomes
  the nodes' addresses, comma-separated, for ``nbmpi run --hosts``), tear the cluster down when
  COMMAND ends, or on Ctrl-C, SIGTERM or SIGHUP (COMMAND gets SIGINT and 10 s to end, then it is
  killed; exit code 130). Exits with COMMAND's code.
* ``nbmpi cluster up``: bring one up and leave it up (prints its id and the ``export`` lines
  of its launch environment); ``exec ID NODE -- COMMAND``: run COMMAND on a node;
  ``list``; ``down ID`` / ``down --all``.

The cluster itself is :class:`nbmpi.workers.launch.virtual_cluster.VirtualCluster`.
``python -m nbmpi.workers.launch.cluster_cli ...`` works without the controller's dependencies.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from typing import List, Optional

from . import virtual_cluster as vcm


def _rate(text: str) -> Optional[str]:
    if text.strip().lower() in ("none", "off", "0", ""):
        return None
    vcm._burst(text)   # raises ValueError (argparse reports it) for a rate tc would not take
    return text


def _command(args: argparse.Namespace) -> List[str]:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    return cmd


def _cmd_run(args: argparse.Namespace) -> int:
    cmd = _command(args)
    if not cmd:
        print("nbmpi cluster run: give a command, e.g. nbmpi cluster run -- nbmpi run --hosts {hosts} -n 3 "
              "-m nbmpi.server.example_job", file=sys.stderr)
        return 2
    vc = vcm.VirtualCluster(args.nodes, args.rate)
    vc.tear_down_on_exit()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):   # all like Ctrl-C: end COMMAND, then tear down
        signal.signal(s, _interrupt)
    try:
        vc.up()
    except vcm.ClusterUnavailable as exc:
        print(f"nbmpi cluster: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:   # during set-up: up() removed what it had built
        return 130
    proc = None
    try:
        hosts = ",".join(vc.addresses)
        cmd = [c.replace("{hosts}", hosts) for c in cmd]
        rate = vc.rate or "uncapped"
        print(f"nbmpi cluster: {len(vc.nodes)} nodes up ({', '.join(f'{n.name} {n.address}' for n in vc.nodes)}; "
              f"links {rate}); running: {shlex.join(cmd)}", file=sys.stderr, flush=True)
        with _deferred_interrupts():   # a signal while COMMAND starts must not leave it unknown (orphaned)
            proc = subprocess.Popen(cmd, env={**os.environ, **vc.launch_env()})
        return proc.wait()
    except KeyboardInterrupt:   # Ctrl-C, SIGTERM, SIGHUP: whenever it comes
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)   # (again, after a Ctrl-C at the terminal: harmless)
                proc.wait(timeout=10)   # let it end its ranks
            except subprocess.TimeoutExpired:
                from .processes import end_processes

                end_processes(pids=[proc.pid], leaders=[proc])
        return 130
    finally:
        vc.down()
        print(f"nbmpi cluster: {vc.cid} torn down", file=sys.stderr)


_DEFER = {"on": False, "pending": None}


def _interrupt(signum, frame):  # noqa: ARG001
    """SIGINT/SIGTERM/SIGHUP during ``nbmpi cluster run``: KeyboardInterrupt, later when deferred."""
    if _DEFER["on"]:
        _DEFER["pending"] = signum
        return
    raise KeyboardInterrupt(f"signal {signum}")


class _deferred_interrupts:
    """Within this block a signal only is noted; it raises KeyboardInterrupt when the block ends."""

    def __enter__(self):
        _DEFER["on"], _DEFER["pending"] = True, None

    def __exit__(self, *exc):
        _DEFER["on"] = False
        if _DEFER["pending"] is not None and exc[0] is None:
            raise KeyboardInterrupt(f"signal {_DEFER['pending']}")
        return False


def _cmd_up(args: argparse.Namespace) -> int:
    vc = vcm.VirtualCluster(args.nodes, args.rate)
    vc.owner = 0   # stays up until `nbmpi cluster down`
    try:
        vc.up()
    except vcm.ClusterUnavailable as exc:
        print(f"nbmpi cluster: {exc}", file=sys.stderr)
        return 3
    print(f"# virtual cluster {vc.cid}: nodes {' '.join(f'{n.name}={n.address}' for n in vc.nodes)}; "
          f"remove it with: nbmpi cluster down {vc.cid}")
    for k, v in vc.launch_env().items():
        print(f"export {k}={shlex.quote(v)}")
    return 0


def _cmd_exec(args: argparse.Namespace) -> int:
    try:
        vc = vcm.VirtualCluster.attach(args.id)
        cmd = vc.command(args.node, _command(args))
    except KeyError as exc:
        print(f"nbmpi cluster: {exc.args[0]}", file=sys.stderr)
        return 2
    return subprocess.call(cmd, env={**os.environ, **vc.launch_env()})


def _cmd_down(args: argparse.Namespace) -> int:
    ids = vcm.list_clusters() if args.all else [args.id] if args.id else []
    if not ids and not args.all:
        print("nbmpi cluster down: give a cluster id (nbmpi cluster list) or --all", file=sys.stderr)
        return 2
    for cid in ids:
        try:
            vcm.down_cluster(cid)
        except KeyError as exc:
            print(f"nbmpi cluster: {exc.args[0]}", file=sys.stderr)
            return 2
        print(f"nbmpi cluster: {cid} torn down")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:  # noqa: ARG001
    for cid in vcm.list_clusters():
        vc = vcm.VirtualCluster.attach(cid)
        owner = f"owner pid {vc.owner}" if vc.owner else "up until `nbmpi cluster down`"
        print(f"{cid}: {' '.join(f'{n.name}={n.address}' for n in vc.nodes)} links {vc.rate or 'uncapped'} ({owner})")
    return 0


def add_cluster_command(sub) -> argparse.ArgumentParser:
    """Add ``cluster`` (with ``run``, ``up``, ``exec``, ``list``, ``down``) to the argparse subparsers ``sub``."""
    c = sub.add_parser("cluster", help="a virtual cluster on this machine (network namespaces; root)",
                       description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    cs = c.add_subparsers(dest="cluster_command", metavar="ACTION")
    for name, func, helptext in (("run", _cmd_run, "bring a cluster up, run a command, tear it down"),
                                 ("up", _cmd_up, "bring a cluster up and leave it up")):
        p = cs.add_parser(name, help=helptext)
        p.add_argument("--nodes", type=int, default=vcm.DEFAULT_NODES, help="number of nodes (default 3)")
        p.add_argument("--rate", type=_rate, default=vcm.DEFAULT_RATE,
                       help="each link's cap as tc writes it (default 1gbit; e.g. 100mbit, 10gbit) or none")
        if name == "run":
            p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND... ({hosts}: the nodes' addresses)")
        p.set_defaults(func=func)
    p = cs.add_parser("exec", help="run a command on a node of a cluster that is up")
    p.add_argument("id")
    p.add_argument("node", help="node name, address or number (1, node1, ...)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND...")
    p.set_defaults(func=_cmd_exec)
    p = cs.add_parser("down", help="tear down a cluster (or --all)")
    p.add_argument("id", nargs="?")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=_cmd_down)
    cs.add_parser("list", help="the clusters that are up").set_defaults(func=_cmd_list)
    c.set_defaults(func=lambda a: (c.print_help(), 2)[1])
    return c


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of ``python -m nbmpi.workers.launch.cluster_cli [cluster] ACTION ...`` (the actions of
    ``nbmpi cluster``)."""
    from .cli import dispatch

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["cluster"]:
        argv = ["cluster", *argv]
    p = argparse.ArgumentParser(prog="nbmpi", description="nbmpi: a virtual cluster on this machine.")
    add_cluster_command(p.add_subparsers(dest="command", metavar="COMMAND"))
    return dispatch(p, argv)


if __name__ == "__main__":
    sys.exit(main())
