"""The ``%distributed`` / ``%%distributed`` magics: interactive MPI pools in a notebook.

Execution plane: ipyparallel. A cell is ONE ``execute`` request to the chosen
engines (engine id == MPI rank, see :mod:`nbmpi.workers.launch.engine_pool`), exactly
like ``%%px``; everything else rides on it:

* the per-cell tracer mark is taken by an IPython ``pre_run_cell`` hook on
  each engine (:mod:`nbmpi.workers.launch.engine_side`), not by an extra request;
* output streams while the cell runs into one live display (each line
  labelled ``[rank r]``); when the cell ends the live display is emptied and
  the final, deduplicated view is written once: identical output of several
  ranks under ``[ranks 0-3]``, differing output per rank, in rank order
  (:mod:`nbmpi.kernel_ext.output`); same for the last expression's value;
* errors: each failing rank's remote traceback, deduplicated, plus one line
  per other rank. When a rank fails while others are still running (e.g.
  blocked receiving from the failed rank), the others get
  :data:`ERROR_GRACE` seconds to finish, then are probed (what they are in)
  and interrupted, so a failure never leaves the cell hanging;
* kernel interrupt: the KeyboardInterrupt raised in the notebook kernel is
  turned into SIGINT on every engine still running the cell (ipyparallel's
  ``Client.send_signal``, delivered by each engine's nanny); the cell's
  results are drained so the next cell starts clean;
* ``--timeout``: at the deadline every running rank's probe is read (which
  communication call it is blocked in, with which peer, since when, and the
  user-code line it is on with the MPI call there, also for raw mpi4py calls),
  the ranks are interrupted as above and the cell fails with that explanation;
* the polling, deadline, interrupts and liveness checks are
  :class:`nbmpi.workers.launch.pool_runner.PoolRun`, the same runner the
  controller's jobs on a pool use;
* every cell is listed, with its timeline and Chrome trace, on the page the kernel serves while a
  pool started here runs (:mod:`nbmpi.kernel_ext.timeline_server`, :mod:`nbmpi.kernel_ext.cell_log`);
  the cell's trace is requested without waiting and built when its page is opened;
* wedged or dead ranks: a rank that does not stop within :data:`INTERRUPT_GRACE`
  seconds of SIGINT, or whose process died between cells, makes the pool
  *broken*: it is ended at once (no later cell can queue behind a stuck rank),
  ``%distributed status`` says why, and the next cell on it starts a fresh pool
  (saying so; the ranks' variables are lost).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from typing import Any, Dict, List, Optional

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from nbmpi.workers.launch.engine_pool import EnginePool, EnginePoolError
from nbmpi.workers.launch.pool_runner import ERROR_GRACE, INTERRUPT_GRACE, PoolRun, RunEnd, probe  # noqa: F401

from . import output as _out
from .cell_log import CellLog, CellRecord, cell_trace, first_line
from .timeline_server import TimelineServer

# ERROR_GRACE: seconds the other ranks get to finish after one rank failed, before they are
# interrupted. INTERRUPT_GRACE: seconds interrupted ranks get to stop after SIGINT. A rank still
# running then is blocked in C code (a raw ``comm.Recv`` never returns to Python, so it never sees
# SIGINT): the pool is ended and the next cell starts it again. So a cell with ``--timeout T``
# returns within about ``T + INTERRUPT_GRACE + 2`` seconds (the last part is ending the pool's
# processes). Both belong to :mod:`nbmpi.workers.launch.pool_runner`, which runs every cell.
#: A cell shorter than this never shows the live output display.
LIVE_AFTER = 0.3
#: Seconds a finished cell waits at most for the ranks' last output messages (they come on another channel than the
#: reply, later on a loaded machine; the wait ends as soon as they are in).
OUTPUT_WAIT_S = 30.0
LIVE_EVERY = 0.25


class _Parser(argparse.ArgumentParser):
    """argparse that raises a one-line UsageError instead of exiting."""

    def error(self, message):  # noqa: D102
        usage = " ".join(self.format_usage().split()[1:])
        raise UsageError(f"{self.prog}: {message}. Usage: {usage}")

    def exit(self, status=0, message=None):  # noqa: D102, A003
        if message:
            raise UsageError(message.strip())
        raise UsageError(self.format_help())


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0 seconds")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return v


def _cell_parser() -> _Parser:
    p = _Parser(prog="%%distributed", add_help=False)
    p.add_argument("--ranks", default=None, help="ranks to run on: 2, 0:4, 0,2,3 (default: all)")
    p.add_argument("--timeout", type=_positive_float, default=None, help="seconds before the cell is interrupted")
    p.add_argument("--timeline", action="store_true", help="show the cell's per-rank timeline")
    p.add_argument("--quiet", action="store_true", help="show no output or values, only errors")
    return p


def _line_parser() -> _Parser:
    p = _Parser(prog="%distributed", add_help=False)
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)
    s = sub.add_parser("start", add_help=False, prog="%distributed start")
    s.add_argument("-n", type=_positive_int, required=True, help="number of MPI ranks")
    s.add_argument("--name", default=None)
    s.add_argument("--timeout", type=_positive_float, default=120.0)
    s.add_argument("--hosts", default=None, metavar="H1,H2[:N],...",
                   help="run the engines on these hosts, filled in order as mpiexec -hosts does")
    s.add_argument("--hostfile", default=None, metavar="FILE", help="as --hosts, one host[:N] a line")
    for cmd in ("stop", "restart"):
        c = sub.add_parser(cmd, add_help=False, prog=f"%distributed {cmd}")
        c.add_argument("name", nargs="?", default=None)
    sub.add_parser("status", add_help=False, prog="%distributed status")
    u = sub.add_parser("use", add_help=False, prog="%distributed use")
    u.add_argument("name")
    pl = sub.add_parser("pull", add_help=False, prog="%distributed pull")
    pl.add_argument("var")
    pl.add_argument("--rank", type=int, default=None)
    pu = sub.add_parser("push", add_help=False, prog="%distributed push")
    pu.add_argument("var")
    pu.add_argument("--ranks", default=None)
    t = sub.add_parser("trace", add_help=False, prog="%distributed trace")
    t.add_argument("action", choices=["save"])
    t.add_argument("file")
    c = sub.add_parser("connect", add_help=False, prog="%distributed connect")
    c.add_argument("url")
    c.add_argument("--token", required=True)
    c.add_argument("--pool", default=None)
    c.add_argument("--name", default=None)
    dk = sub.add_parser("dask", add_help=False, prog="%distributed dask")
    dk.add_argument("--timeout", type=_positive_float, default=60.0)
    return p


def parse_ranks(spec: Optional[str], available: List[int]) -> List[int]:
    """Ranks named by ``spec`` (``"2"``, ``"0:4"`` (Python slice), ``"0,2,3"``), checked against ``available``."""
    if spec is None or spec.strip() in ("", "all", ":"):
        return list(available)
    spec = spec.strip()
    try:
        if ":" in spec:
            parts = [int(x) if x.strip() else None for x in spec.split(":")]
            if len(parts) > 3 or any(x is not None and x < 0 for x in parts) or (len(parts) == 3 and parts[2] == 0):
                raise ValueError
            start = parts[0] or 0
            stop = parts[1] if parts[1] is not None else max(available) + 1
            ranks = list(range(start, stop, parts[2] if len(parts) == 3 and parts[2] else 1))
        else:
            ranks = sorted({int(x) for x in spec.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"%%distributed: --ranks {spec!r} is not a rank list; use e.g. 2, 0:4 or 0,2,3") from None
    bad = [r for r in ranks if r not in available]
    if bad or not ranks:
        raise UsageError(f"%%distributed: --ranks {spec!r} names {'ranks ' + str(bad) if bad else 'no rank'}; "
                         f"the pool has ranks {_out.format_ranks(available)}")
    return ranks


def _engine_hosts(ranks: List[int], hosts: List[str]) -> str:
    """Each engine's host: ``"node1"`` when all share one, else ``"node1 (ranks 0,3), node2 (rank 1)"``."""
    by_host: Dict[str, List[int]] = {}
    for r, h in zip(ranks, hosts):
        by_host.setdefault(h or "?", []).append(r)
    if len(by_host) <= 1:
        return next(iter(by_host), "?")
    return ", ".join(f"{h} ({_out.rank_label(rs).strip('[]')})" for h, rs in by_host.items())


def fetch_cell_trace(pool: EnginePool, ranks: List[int]):
    """The last cell's :class:`~nbmpi.workers.Trace` from ``ranks`` and its window (ns, rank 0 clock).

    One apply request to the ranks (no MPI collective, so it works after
    errors and interrupts and on a subset of ranks).
    """
    from nbmpi.workers.launch.engine_side import cell_events

    return cell_trace(pool.client()[ranks].apply_sync(cell_events), pool.n)


class _Live:
    """The live output display of a running cell (created only if the cell lasts > LIVE_AFTER)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.handle = None
        self.t0 = time.monotonic()
        self.last = 0.0
        self.text = ""

    def update(self, per_rank: Dict[int, str], force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and (now - self.t0 < LIVE_AFTER or now - self.last < LIVE_EVERY):
            return
        text = _out.render_live(per_rank)
        self.last = now
        if text == self.text:
            return
        self.text = text
        if self.handle is None:
            self.handle = display({"text/plain": text}, raw=True, display_id=True)
        else:
            self.handle.update({"text/plain": text}, raw=True)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)


@magics_class
class DistributedMagics(Magics):
    """``%distributed`` (pool management) and ``%%distributed`` (run a cell on the ranks)."""

    def __init__(self, shell=None):
        super().__init__(shell)
        self.pools: Dict[str, EnginePool] = {}
        self.current: Optional[str] = None
        self.last_cell: Optional[tuple] = None
        #: pool name -> why it was ended (a wedged or dead rank); the next cell starts it again
        self.broken: Dict[str, str] = {}
        #: the cells run while a notebook-started pool lives, served with their timelines by ``web``
        self.cells = CellLog()
        self.web: Optional[TimelineServer] = None
        self._trace: Optional[tuple] = None   # (trace, window) of the running cell, fetched once

    # -- entry -------------------------------------------------------------------------------------
    @line_cell_magic
    def distributed(self, line: str, cell: Optional[str] = None):
        """Interactive MPI pools: ipyparallel engines that are the ranks of one MPI job.

        Pools (line magic)::

          %distributed start -n N [--name NAME] [--timeout S] [--hosts H1,H2[:N],... | --hostfile FILE]
                start N ranks (bundled mpiexec, MPI thread level funneled); every rank
                gets `comm` (COMM_WORLD), `rank`, `size`, `nbmpi` and a started nbmpi
                runtime (tracer, aligned clocks). The new pool becomes the current one.
                --hosts / --hostfile: the engines run on those hosts (names or addresses,
                `host:N` for N slots; a file has one host[:N] a line), filled in order as
                `mpiexec -hosts` / `-f` do, as `nbmpi run --hosts` places ranks: started
                over ssh (which must reach each host without a password; the work directory
                in $TMPDIR must be on a filesystem every host sees), or through
                $NBMPI_LAUNCHER_EXEC on a virtual cluster (`nbmpi cluster up` prints its
                environment, to set before Jupyter starts). A host that cannot be reached
                fails the start at once, naming it. The notebook stays on this host.
                Prints where this kernel's cells are listed with their timelines (a page the
                kernel serves on 127.0.0.1 with a secret key): /proxy/PORT/?key=... under
                Jupyter's address (jupyter-server-proxy) and the direct link
          %distributed stop [NAME]      end the pool (current by default): no process is left;
                with the last pool started here the cell timelines page ends too
          %distributed restart [NAME]   fresh ranks (new MPI job, empty namespaces), same size and name;
                the old ranks are killed at once, even if stuck; the pool's controller is kept
          %distributed status           every pool: ranks, state, uptime, each engine's host; the
                timelines links
          %distributed use NAME         make NAME the current pool
          %distributed pull VAR [--rank R]
                VAR from every rank into the notebook as a list in rank order
                (or only rank R's value with --rank R)
          %distributed push VAR [--ranks SPEC]   send the notebook's VAR to the ranks
          %distributed trace save FILE.json
                the last cell's Chrome trace (open it in https://ui.perfetto.dev)
          %distributed connect URL --token TOKEN [--pool ID] [--name NAME]
                use a pool run by the nbmpi controller at URL (default: the newest
                running pool); stopping it here only disconnects
          %distributed dask [--timeout S]
                make the current pool a Dask cluster (one worker per rank, in the ranks'
                processes): `dask_client` (a distributed.Client) in the notebook; see
                nbmpi.workers.launch.dask_on_pool (to_dask / from_dask for DistArrays);
                stopping or restarting the pool ends it

        Cells::

          %%distributed [--ranks SPEC] [--timeout SECONDS] [--timeline] [--quiet]
          <code run SPMD on the ranks; the namespace persists between cells>

          --ranks SPEC   run on these ranks only: 2, 0:4 (a Python slice), 0,2,3
          --timeout S    interrupt the cell after S seconds and explain the hang from the
                         trace: e.g. "rank 1: take(src=0) waiting 12.0 s"
          --timeline     show the cell's per-rank timeline (compute / communication /
                         wait, message arrows, wait percentage per rank)
          --quiet        hide output and values (errors are always shown)

        Output streams while the cell runs, labelled per rank; at the end it is
        shown once per group of ranks with identical output ("[ranks 0-3]"),
        differing output per rank, in rank order. The last expression's value is
        grouped the same way. If a rank raises, the cell fails with each distinct
        remote traceback and one line per other rank. The kernel's interrupt
        button interrupts the cell on every rank; the pool stays usable.
        """
        if cell is not None:
            return self._run_cell(line, cell)
        try:
            argv = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%distributed: cannot parse {line!r}: {e}") from None
        if not argv:
            raise UsageError("%distributed: missing subcommand; one of start, stop, restart, status, use, "
                             "pull, push, trace, connect, dask (see %distributed?)")
        known = ("start", "stop", "restart", "status", "use", "pull", "push", "trace", "connect", "dask")
        if argv[0] not in known:
            raise UsageError(f"%distributed: unknown subcommand {argv[0]!r}; expected one of {', '.join(known)} "
                             "(see %distributed?)")
        args = _line_parser().parse_args(argv)
        return getattr(self, f"_cmd_{args.cmd}")(args)

    # -- pools -------------------------------------------------------------------------------------
    def _pool(self, name: Optional[str] = None) -> EnginePool:
        name = name or self.current
        if name is None:
            raise UsageError("%distributed: no pool; start one with `%distributed start -n 2`")
        if name not in self.pools:
            raise UsageError(f"%distributed: no pool named {name!r}; pools: {sorted(self.pools) or 'none'}")
        return self.pools[name]

    def _cmd_start(self, args) -> None:
        name = args.name or self._free_name()
        if name in self.pools and self.pools[name].status()["state"] in ("running", "starting"):
            raise UsageError(f"%distributed start: pool {name!r} is already running; stop it first or pick "
                             "another --name")
        hosts = [h for h in args.hosts.split(",") if h.strip()] if args.hosts else None
        try:
            pool = EnginePool(args.n, name=name, hosts=hosts, hostfile=args.hostfile)
        except EnginePoolError as e:
            raise UsageError(f"%distributed start: {e}") from None
        self._start(pool, args.timeout)
        if self.web is None:
            self.web = TimelineServer(self.cells).start()
        print(self.web.describe())

    def _free_name(self) -> str:
        k = 0
        while f"pool{k}" in self.pools:
            k += 1
        return f"pool{k}"

    def _start(self, pool: EnginePool, timeout: float) -> None:
        self._bring_up(pool, "starting", "start", lambda progress: pool.start(progress=progress, timeout=timeout))

    def _bring_up(self, pool: EnginePool, doing: str, verb: str, fn) -> EnginePool:
        """Run ``fn(progress)`` (a pool start or restart) with one live progress line; the pool it
        returns becomes the current one. An EnginePoolError becomes a one-line UsageError."""
        handle = display({"text/plain": f"{doing} pool {pool.name!r} ({pool.n} ranks)..."}, raw=True,
                         display_id=True)
        t0 = time.monotonic()

        def progress(msg: str) -> None:
            handle.update({"text/plain": f"{msg} [{time.monotonic() - t0:.1f} s]"}, raw=True)

        try:
            ready = fn(progress)
        except EnginePoolError as e:
            self.pools.pop(pool.name, None)
            handle.update({"text/plain": f"pool {pool.name!r} failed to {verb}"}, raw=True)
            raise UsageError(str(e)) from None
        self.pools[ready.name] = ready
        self.current = ready.name
        hosts = ", ".join(sorted(set(ready.status()["hosts"])))
        handle.update({"text/plain": f"pool {ready.name!r}: {ready.n} ranks on {hosts} ready in "
                                     f"{time.monotonic() - t0:.1f} s"}, raw=True)
        return ready

    def _cmd_stop(self, args) -> None:
        pool = self._pool(args.name)
        self.broken.pop(pool.name, None)
        pool.stop()
        del self.pools[pool.name]
        if self.current == pool.name:
            self.current = next(iter(self.pools), None)
        if self.last_cell and self.last_cell[0] is pool:
            self.last_cell = None
        self.cells.drop_pool(pool.name)
        print(f"pool {pool.name!r} {'disconnected' if pool.attached else 'stopped'}")
        if self.web is not None and all(p.attached for p in self.pools.values()):
            self._stop_web()
            print("cell timelines server stopped (no pool started here runs)")

    def _stop_web(self) -> None:
        web, self.web = self.web, None
        if web is not None:
            web.stop()

    def _cmd_restart(self, args) -> None:
        pool = self._pool(args.name)
        if pool.attached:
            raise UsageError(f"%distributed restart: pool {pool.name!r} is run by the controller; restart it there")
        if self.last_cell and self.last_cell[0] is pool:
            self.last_cell = None
        if self.broken.pop(pool.name, None) is not None:   # already ended: start it anew
            del self.pools[pool.name]
            self._start(pool.renewed(), 120.0)
            return
        self._bring_up(pool, "restarting", "restart", lambda progress: pool.restart(progress=progress))

    def _cmd_status(self, args) -> None:  # noqa: ARG002
        if not self.pools:
            print("no pool; start one with `%distributed start -n 2`")
            return
        for name, pool in self.pools.items():
            mark = "*" if name == self.current else " "
            if name in self.broken:
                print(f"{mark} {name}: {pool.n} ranks, broken: {self.broken[name]}; the next cell starts it again")
                continue
            st = pool.status()
            dead = pool.dead_ranks()
            state = st["state"] if not dead else "broken: " + pool.describe_dead(dead)
            print(f"{mark} {name}: {len(st['ranks'])} ranks ({_out.format_ranks(st['ranks'])}) on "
                  f"{_engine_hosts(st['ranks'], st['hosts'])}, {state}, up {st['uptime_s']:.0f} s"
                  + (" (attached)" if pool.attached else ""))
        if self.web is not None:
            print(self.web.describe())

    def _cmd_use(self, args) -> None:
        self._pool(args.name)
        self.current = args.name

    def _cmd_pull(self, args):
        pool = self._pool()
        if args.rank is not None:
            ranks = parse_ranks(str(args.rank), pool.ranks)
        else:
            ranks = pool.ranks
        views = pool.client()[ranks]
        try:
            values = views.pull(args.var, block=True)
        except Exception as e:  # noqa: BLE001 - remote NameError etc.
            raise UsageError(f"%distributed pull: {args.var!r} could not be pulled from ranks "
                             f"{_out.format_ranks(ranks)}: {_out.strip_ansi(str(e)).splitlines()[0]}") from None
        value = values[0] if args.rank is not None else list(values)
        self.shell.user_ns[args.var] = value
        return None

    def _cmd_push(self, args) -> None:
        pool = self._pool()
        if args.var not in self.shell.user_ns:
            raise UsageError(f"%distributed push: {args.var!r} is not defined in the notebook")
        ranks = parse_ranks(args.ranks, pool.ranks)
        pool.client()[ranks].push({args.var: self.shell.user_ns[args.var]}, block=True)

    def _cmd_trace(self, args) -> None:
        if self.last_cell is None:
            raise UsageError("%distributed trace save: no %%distributed cell has run on a live pool yet")
        pool, ranks = self.last_cell
        trace, _ = fetch_cell_trace(pool, ranks)
        trace.save_chrome(args.file)
        print(f"wrote {args.file}: {len(trace)} events of ranks {_out.format_ranks(ranks)} (open in ui.perfetto.dev)")

    def _cmd_connect(self, args) -> None:
        from nbmpi.server.client import ApiError, Client

        url = args.url.rstrip("/")
        try:
            with Client(url, args.token, timeout=30) as api:
                if args.pool is None:
                    running = [p for p in api.pools() if p.get("state") == "running"]
                    if not running:
                        raise UsageError(f"%distributed connect: the controller at {url} runs no pool in state "
                                         "'running'; create one there or pass --pool ID")
                    newest = max(running, key=lambda p: (p.get("started_at") or p.get("created_at") or 0,
                                                         p.get("id", 0)))
                    pinfo = newest if newest.get("connection") else api.pool(newest["id"])
                else:
                    pinfo = api.pool(args.pool)
        except ApiError as e:
            raise UsageError(f"%distributed connect: {e}") from None
        conn = pinfo.get("connection")
        if not conn:
            raise UsageError(f"%distributed connect: pool {pinfo.get('id')} is {pinfo.get('state')!r} and has no "
                             "connection info yet; wait until it is running")
        try:
            pool = EnginePool.attach(conn)
        except EnginePoolError as e:
            raise UsageError(str(e)) from None
        name = args.name or pool.name
        pool.name = name
        self.pools[name] = pool
        self.current = name
        print(f"connected to pool {name!r} ({len(pool.ranks)} ranks) at {url}")

    def _cmd_dask(self, args) -> None:
        from nbmpi.workers.launch import dask_on_pool

        try:
            self.shell.user_ns["dask_client"] = dask_on_pool.start(self._pool(), timeout=args.timeout)
        except EnginePoolError as e:
            raise UsageError(f"%distributed dask: {e}") from None
        print(dask_on_pool.running(self._pool()).describe())

    def stop_all(self) -> None:
        """Stop (or disconnect) every pool of this kernel."""
        for pool in list(self.pools.values()):
            try:
                pool.stop()
            except Exception:  # noqa: BLE001 - best effort at unload
                pass
        self.pools.clear()
        self.current = None
        self._stop_web()

    # -- cells -------------------------------------------------------------------------------------
    def _ready(self, pool: EnginePool) -> EnginePool:
        """The pool a cell may run on: a broken pool is started again first (saying so); a pool
        with a dead rank is ended and the cell refused (naming the rank)."""
        name = pool.name
        if name in self.broken:
            why = self.broken.pop(name)
            if pool.attached:
                raise UsageError(f"%%distributed: pool {name!r} is broken ({why}) and is run by the controller; "
                                 "stop it there, create a new one and `%distributed connect` again")
            print(f"pool {name!r} was ended ({why}); starting it again with {pool.n} ranks "
                  "(the ranks' variables are lost)", file=sys.stderr, flush=True)
            fresh = pool.renewed()
            del self.pools[name]
            self._start(fresh, 120.0)
            return fresh
        dead = pool.dead_ranks()
        if dead:
            why = pool.describe_dead(dead)
            self._break(pool, why)
            raise UsageError(f"%%distributed: {why} since the last cell; pool {name!r} was ended. Run the cell "
                             "again to start a fresh pool (the ranks' variables are lost), or `%distributed restart`")
        return pool

    def _break(self, pool: EnginePool, why: str) -> None:
        """End ``pool`` at once (owned) or drop it (attached) and remember why; the next cell restarts it."""
        self.broken[pool.name] = why
        if not pool.attached:
            try:
                pool.stop()
            except Exception:  # noqa: BLE001 - it is being ended because it is broken
                pass

    def _run_cell(self, line: str, cell: str):
        try:
            argv = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%%distributed: cannot parse {line!r}: {e}") from None
        args = _cell_parser().parse_args(argv)
        pool = self._ready(self._pool())
        ranks = parse_ranks(args.ranks, pool.ranks)
        self._trace = None
        t0 = time.monotonic()
        status = "error"
        try:
            self._run_on(pool, ranks, args, cell)
            status = "ok"
        except _out.DistributedTimeout:
            status = "timed_out"
            raise
        except _out.DistributedInterrupt:
            status = "interrupted"
            raise
        except UsageError:
            status = "rank_died" if pool.name in self.broken else "error"
            raise
        finally:
            if self.web is not None:
                self._record(pool, ranks, cell, status, time.monotonic() - t0)
            self._trace = None

    def _record(self, pool: EnginePool, ranks: List[int], cell: str, status: str, duration: float) -> None:
        """Add the cell that just ended to :attr:`cells` with its trace: the one ``--timeline`` fetched,
        else a non-blocking request for it (the engines answer it before the next cell; the web server
        waits for it only when the cell's page is opened), so a cell costs no extra round trip. No
        trace if the pool was ended. Kernel's thread, at the end of every cell while ``web`` runs."""
        # IPython counts the cell before running it (ipykernel replies ``execution_count - 1`` too)
        number = int(self.shell.execution_count) - 1
        rec = CellRecord(number, pool.name, list(ranks), first_line(cell), status, duration)
        if pool.name in self.broken:
            rec.note = "no trace: the pool was ended"
        else:
            try:
                if self._trace is not None:
                    rec.trace, rec.window = self._trace
                else:
                    from nbmpi.workers.launch.engine_side import cell_events

                    rec.pending = (pool.client()[ranks].apply_async(cell_events), pool.n)
            except Exception as e:  # noqa: BLE001 - never hide the cell's own outcome
                rec.note = f"no trace: {e}"
        self.cells.add(rec)

    def _cell_trace(self, pool: EnginePool, ranks: List[int]):
        """The running cell's (trace, window), fetched from the ranks once per cell."""
        if self._trace is None:
            self._trace = fetch_cell_trace(pool, ranks)
        return self._trace

    def _run_on(self, pool: EnginePool, ranks: List[int], args, cell: str) -> None:
        """Run ``cell`` on ``ranks`` of ``pool`` to its end, showing its output; raises as the cell ends."""
        run = PoolRun(pool, ranks, lambda view: view.execute(cell, silent=False, block=False))
        self.last_cell = (pool, ranks)
        live = _Live(not args.quiet)
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        end = run.wait(deadline, tick=lambda r: live.update(self._live_text(r)))
        note = self._wedged(pool, end) if end.stuck else ""
        if end.reason == "dead":
            self._break(pool, end.dead)
            live.close()
            raise UsageError(f"%%distributed: {end.dead} while the cell ran; pool {pool.name!r} was ended. "
                             "The next cell starts a fresh pool (the ranks' variables are lost)")
        if end.reason == "timed_out":
            self._finish(pool, run, args, live, raise_errors=False, quick=bool(note))
            raise _out.DistributedTimeout(args.timeout, end.described, note)
        if end.reason == "interrupted":
            self._finish(pool, run, args, live, raise_errors=False, quick=bool(note))
            raise _out.DistributedInterrupt(end.described, note) from None
        others: Dict[int, str] = {}
        for r in end.stopped:   # reason "error": the ranks still running when another rank failed
            others[r] = f"was in {end.described[r]} when another rank failed; interrupted"
            if r in end.stuck:
                others[r] += f"; {note}"
        self._finish(pool, run, args, live, others, quick=pool.name in self.broken)

    def _wedged(self, pool: EnginePool, end: RunEnd) -> str:
        """End a pool whose ranks ``end.stuck`` ignored SIGINT; the note says so and what happens next."""
        why = end.wedged
        self._break(pool, why)
        if pool.attached:
            return (f"{why}; the pool is run by the controller, so it was left as it is: stop it there and "
                    "connect to a new one")
        return (f"{why}; the pool was ended so no later cell runs on stuck ranks. The next %%distributed cell "
                "starts it again (the ranks' variables are lost)")

    @staticmethod
    def _live_text(run: PoolRun) -> Dict[int, str]:
        out = {}
        for r in run.ranks:
            md = run.metadata(r)
            out[r] = (md.get("stdout") or "") + (md.get("stderr") or "")
        return out

    def _finish(self, pool: EnginePool, run: PoolRun, args, live: _Live,
                others: Optional[Dict[int, str]] = None, raise_errors: bool = True, quick: bool = False) -> None:
        run.drain(0.5 if quick else OUTPUT_WAIT_S)   # quick: the pool was ended, no more output comes
        live.close()
        mds = {r: run.metadata(r) for r in run.ranks}
        if not args.quiet:
            text = _out.render_groups({r: md.get("stdout") for r, md in mds.items()})
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()
            text = _out.render_groups({r: md.get("stderr") for r, md in mds.items()})
            if text:
                sys.stderr.write(text)
                sys.stderr.flush()
            self._show_displays(mds)
            self._show_results(mds)
        if args.timeline:
            self._show_timeline(pool, list(run.ranks))
        errors = {}
        for r, md in mds.items():
            err = md.get("error")
            if md.get("status") == "error" and err is not None and r not in (others or {}):
                errors[r] = (getattr(err, "ename", "Error"), getattr(err, "evalue", str(err)),
                             getattr(err, "traceback", None) or str(err))
        if errors and raise_errors:
            rest = dict(others or {})
            for r in run.ranks:
                if r not in errors and r not in rest:
                    rest[r] = "completed the cell"
            raise _out.DistributedCellError(errors, rest)

    def _show_displays(self, mds) -> None:
        per_rank = {}
        bundles = {}
        for r, md in mds.items():
            outs = [o for o in (md.get("outputs") or []) if isinstance(o, dict) and "data" in o]
            if outs:
                key = json.dumps([o["data"] for o in outs], sort_keys=True, default=str)
                per_rank[r] = key
                bundles[key] = outs
        for ranks, key in _out.group_identical(per_rank):
            display({"text/plain": _out.rank_label(ranks)}, raw=True)
            for o in bundles[key]:
                display(o["data"], metadata=o.get("metadata") or {}, raw=True)

    def _show_results(self, mds) -> None:
        plain = {}
        rich = {}
        for r, md in mds.items():
            res = md.get("execute_result")
            if res and res.get("data"):
                data = res["data"]
                plain[r] = data.get("text/plain", "")
                rich[r] = data
        groups = _out.group_identical(plain)
        if not groups:
            return
        text_only = all(set(rich[rs[0]]) <= {"text/plain"} for rs, _ in groups)
        if text_only:
            display({"text/plain": "".join(_out.render_block(rs, t, ": ") for rs, t in groups).rstrip("\n")},
                    raw=True)
            return
        for rs, _ in groups:
            display({"text/plain": _out.rank_label(rs)}, raw=True)
            display(rich[rs[0]], raw=True)

    def _show_timeline(self, pool: EnginePool, ranks: List[int]) -> None:
        from nbmpi.workers.tracing.timeline import show

        try:
            trace, window = self._cell_trace(pool, ranks)
        except Exception as e:  # noqa: BLE001 - do not hide the cell's own outcome
            print(f"%%distributed --timeline: could not fetch the trace: {e}", file=sys.stderr)
            return
        show(trace, window=window, ranks=ranks)
