"""Benchmarks across nodes of a virtual cluster on this machine, at each link rate (run as root).

One command (it brings up a 3-node virtual cluster per link rate, launches the MPI ranks on its
nodes itself with ``nbmpi run --hosts`` and tears the cluster down)::

    python benchmarks/cluster.py              # 100 Mbit/s, 1 Gbit/s, 10 Gbit/s; 1, 2 and 3 nodes
    python benchmarks/cluster.py --quick      # 1 Gbit/s, small sizes, 1 and 2 nodes (smoke test)

Per link rate, with one rank per node and MPICH's ofi netmod over TCP between the nodes
(:mod:`nbmpi.workers.launch.virtual_cluster`):

* **ping-pong** between two nodes: ArrayChannel ``put``/``take`` (tracing on) against raw mpi4py
  ``Send``/``Recv`` on separate buffers, interleaved in blocks (a new random order per block, the
  same machine load for both), one-way time as the median of the blocks (the harness of
  ``benchmarks/pingpong.py``, which measures the same on one node);
* **the seed's Jacobi stencil** (``benchmarks/distarray.py``'s ``jacobi_stencil``, unchanged NumPy
  source) on 2 and 3 nodes, with latency hiding and without (``dnp.configure(latency_hiding=False)``:
  blocking exchange first, then compute), interleaved rounds; each rank's wait % from the gathered
  trace (the median over the rounds), split into transfers and force-point collectives as in
  ``benchmarks/distarray.py``, and each rank's share of the loop on a CPU and preempted (kept off
  the cores by other processes). The seed (Gigabit Ethernet, 16 cores): the stencil's wait fell
  from 62 % to 9 %, the Jacobi solver's from 54 % to 2 %. The problem: the seed's square grid,
  :data:`STENCIL` rows and columns on this 2-core machine (the report states the sizes per step);
* **strong scaling** of the stencil from 1 to 3 nodes (speed-up, efficiency), nbmpi with latency
  hiding beside the hand-written mpi4py + numba version, each against itself on 1 node;
* **data movement across 3 nodes** (:mod:`cluster_moves`): the aggregation histogram (per-update
  messages, ``Alltoallv`` rounds, the Aggregator) and a Block->Cyclic redistribution (nbmpi against
  ``Alltoallw`` with derived datatypes), with the code of ``aggregation.py`` and ``redistribute.py``.

Targets (computed from the measured numbers): at 1 Gbit/s on 2 nodes, stencil wait % without /
with latency hiding >= 3 (worst ranks); with hiding, the wait <= 10 % at every rate (worst rank,
2 nodes). Results: ``benchmarks/results/cluster.json`` / ``.md`` (``cluster_quick`` with ``--quick``).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Dict, List  # noqa: E402

import numpy  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RATES = ("100mbit", "1gbit", "10gbit")
PING_SIZES = [8, 4 << 10, 64 << 10, 1 << 20, 8 << 20]
QUICK_PING_SIZES = [8, 64 << 10]
#: The stencil's grid (rows, columns) and steps per timed loop.
STENCIL = dict(shape=(2000, 2000), iters=10, rounds=5)
QUICK_STENCIL = dict(shape=(200, 200), iters=3, rounds=1)


# =========================================================================== MPI parts
def pingpong_part(sizes: List[int], blocks: int, seed: int) -> Dict[str, dict]:
    """2 ranks: one-way seconds per message (median of ``blocks`` blocks) of raw Send/Recv and channel put/take."""
    from nbmpi.workers import ArrayChannel, world
    from nbmpi.workers.core.runtime import MPI

    comm = world()
    rank = comm.Get_rank()
    peer = 1 - rank
    out: Dict[str, dict] = {"raw": {}, "channel": {}, "how": {}}
    for nbytes in sizes:
        n = max(1, nbytes // 8)
        sbuf, rbuf = numpy.ones(n), numpy.empty(n)
        ch = ArrayChannel(n, numpy.float64, name=f"pingpong-{nbytes}")
        ch.fill(1.0)
        out["how"][nbytes] = ch.same_node_how
        k = int(min(200, max(3, 0.02 / (2 * (nbytes / 1e8 + 1e-4)))))   # ~20 ms per block at 100 Mbit/s

        def batch(send, recv):
            for _ in range(k):
                if rank == 0:
                    send()
                    recv()
                else:
                    recv()
                    send()

        runs = dict(raw=lambda: batch(lambda: comm.Send(sbuf, peer, 1), lambda: comm.Recv(rbuf, peer, 1)),
                    channel=lambda: batch(lambda: ch.put(peer), lambda: ch.take(peer)))
        for m in runs:
            runs[m]()   # warm-up
        times = {m: [] for m in runs}
        rng = numpy.random.default_rng([seed, nbytes])
        for _ in range(blocks):
            for m in rng.permutation(list(runs)):
                comm.Barrier()
                t0 = time.perf_counter()
                runs[m]()
                times[m].append(comm.allreduce(time.perf_counter() - t0, op=MPI().MAX) / k / 2)
        for m in runs:
            out[m][nbytes] = float(numpy.median(times[m]))
        ch.close()
    return out


def cpu_clock() -> tuple:
    """This thread's ``(ns on a CPU, ns runnable but waiting for a CPU)`` so far: the first from the thread's CPU
    clock (``time.thread_time_ns``, exact), the second from ``/proc/thread-self/schedstat`` (0 where the kernel
    has none; it is brought up to date only at scheduler events, so over a few ms it can be off by a tick).
    The second is the time other processes held the cores."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            waiting_for_cpu = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        waiting_for_cpu = 0
    return time.thread_time_ns(), waiting_for_cpu


def timed_share(comm, fn) -> tuple:
    """``slowest_rank(comm, fn)`` plus, gathered to every rank, each rank's % of the wall time its thread ran
    on a CPU and % it was runnable but kept off the cores (preempted): ``(result, seconds, [(cpu %, queued %)])``."""
    from mpi_part import slowest_rank

    c0, q0, w0 = *cpu_clock(), time.perf_counter_ns()
    res, t = slowest_rank(comm, fn)
    c1, q1, w1 = *cpu_clock(), time.perf_counter_ns()
    wall = max(w1 - w0, 1)
    return res, t, comm.allgather((100 * (c1 - c0) / wall, 100 * (q1 - q0) / wall))


def stencil_part(shape, iters: int, rounds: int) -> dict:
    """P ranks: the seed's stencil with and without latency hiding, interleaved rounds; per-rank wait %."""
    import nbmpi.workers.distarray as dnp
    from distarray import jacobi_stencil, median_per_rank, wait_split
    from nbmpi.workers import gather_trace, get_tracer, world

    comm = world()
    rank = comm.Get_rank()
    tracer = get_tracer()
    x = numpy.random.default_rng(2024).random(shape)
    modes = {"hiding": True, "blocking": False}
    res = {m: dict(per_iter_s=[], wait_pct=[], split=[], cpu_pct=[], queued_pct=[]) for m in modes}
    for r in range(rounds):
        for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            dnp.configure(latency_hiding=modes[m])
            full = dnp.from_numpy(x)
            jacobi_stencil(dnp, full, 2)   # warm: kernels, plans, buffers
            mark = tracer.mark()
            delta, t, share = timed_share(comm, lambda: jacobi_stencil(dnp, full, iters))
            tr = gather_trace(since=mark)
            tracer.clear()
            res[m]["per_iter_s"].append(t / iters)
            res[m]["cpu_pct"].append([c for c, _ in share])
            res[m]["queued_pct"].append([q for _, q in share])
            if rank == 0:
                res[m]["wait_pct"].append([rr["wait_frac"] * 100 for rr in tr.summary()["ranks"]])
                res[m]["split"].append(wait_split(tr))
    dnp.configure(latency_hiding=True)
    res["handwritten"] = handwritten_waits(comm, x, iters, rounds)
    want = jacobi_stencil(numpy, x.copy(), iters + 2)
    for m in modes:
        res[m]["wait_pct_median"] = median_per_rank(res[m]["wait_pct"])
        res[m]["transfer_pct_median"] = median_per_rank([s["transfers"] for s in res[m]["split"]])
        res[m]["force_point_pct_median"] = median_per_rank([s["force_point"] for s in res[m]["split"]])
        res[m]["cpu_pct_median"] = median_per_rank(res[m]["cpu_pct"])
        res[m]["queued_pct_median"] = median_per_rank(res[m]["queued_pct"])
        res[m]["per_iter_median_s"] = float(numpy.median(res[m]["per_iter_s"]))
    res["verified"] = bool(numpy.isclose(delta, want, rtol=1e-9))
    res["hosts"] = comm.allgather(__import__("socket").gethostname())
    return res


def handwritten_waits(comm, x, iters: int, rounds: int) -> dict:
    """The hand-written mpi4py + numba stencil of ``benchmarks/distarray.py`` (halos fly while the interior is
    computed) on the same grid: each rank's wait % in ``Waitall`` and ``Allreduce`` (median over ``rounds``),
    the floor of the program's wait on these links and this machine's load."""
    import nbmpi.workers.distarray as dnp
    from distarray import _hw_kernels, handwritten_stencil, median_per_rank

    rank, size = comm.Get_rank(), comm.Get_size()
    lo, hi = dnp.Distribution("block", x.shape[0], size).block_range(rank)
    kernel = _hw_kernels()
    waits, per_iter, cpu, queued = [], [], [], []
    for _ in range(rounds):
        u = numpy.zeros((hi - lo + 2, x.shape[1]))
        u[1:-1] = x[lo:hi]
        v = u.copy()
        handwritten_stencil(comm, u, v, lo, x.shape[0], 2, kernel)   # warm
        res, t, share = timed_share(comm, lambda: handwritten_stencil(comm, u, v, lo, x.shape[0], iters, kernel))
        waits.append(comm.allgather(100 * res[2] / t))
        per_iter.append(t / iters)
        cpu.append([c for c, _ in share])
        queued.append([q for _, q in share])
    return dict(wait_pct_median=median_per_rank(waits), per_iter_median_s=float(numpy.median(per_iter)),
                cpu_pct_median=median_per_rank(cpu), queued_pct_median=median_per_rank(queued))


def mpi_main(a) -> int:
    from nbmpi.workers import world

    if a.part_kind == "pingpong":
        out = pingpong_part(json.loads(a.sizes), a.blocks, a.seed)
    elif a.part_kind == "moves":
        from cluster_moves import moves_part

        out = moves_part(json.loads(a.stencil))
    else:
        cfg = json.loads(a.stencil)
        out = stencil_part(tuple(cfg["shape"]), cfg["iters"], cfg["rounds"])
    if world().Get_rank() == 0:
        Path(a.mpi_part).write_text(json.dumps(out))
    return 0


# =========================================================================== driver and report
def measure_rate(rate: str, a, cfg: dict, nodes: List[int], tmp: Path, script: str) -> dict:
    """Bring up a 3-node cluster with links at ``rate``, run the ping-pong (2 nodes) and the stencil (each
    count of ``nodes``), tear the cluster down. Raises RuntimeError if a part fails."""
    from mpi_part import run_part
    from nbmpi.workers.launch.virtual_cluster import VirtualCluster

    out: dict = {}
    with VirtualCluster(max(nodes + [cfg["moves_nodes"], 2]), rate) as vc:
        env = {**vc.launch_env(), "NBMPI_DISTARRAY_CACHE": str(tmp / "kernels"), "NBMPI_TIMEOUT": "300"}
        print(f"[{rate}] ping-pong between {vc.names[0]} and {vc.names[1]} ...", flush=True)
        args = ["--part-kind", "pingpong", "--sizes", json.dumps(cfg["ping_sizes"]), "--blocks", str(cfg["blocks"])]
        code, out["pingpong"] = run_part(2, script, tmp / f"ping-{rate}.json", args, env, hosts=vc.addresses[:2])
        if code:
            raise RuntimeError(f"the ping-pong at {rate} failed with exit code {code}")
        for p in nodes:
            print(f"[{rate}] stencil on {p} nodes ...", flush=True)
            args = ["--part-kind", "stencil", "--stencil", json.dumps(cfg["stencil"])]
            code, out[f"stencil_{p}"] = run_part(p, script, tmp / f"st-{rate}-{p}.json", args, env,
                                                 hosts=vc.addresses[:p])
            if code:
                raise RuntimeError(f"the stencil on {p} nodes at {rate} failed with exit code {code}")
        p = cfg["moves_nodes"]
        print(f"[{rate}] aggregation histogram and Block->Cyclic redistribution on {p} nodes ...", flush=True)
        args = ["--part-kind", "moves", "--stencil", json.dumps(cfg["moves"])]
        code, out["moves"] = run_part(p, script, tmp / f"moves-{rate}.json", args, env, hosts=vc.addresses[:p])
        if code:
            raise RuntimeError(f"the histogram / redistribution on {p} nodes at {rate} failed with exit code {code}")
    return out


def main(argv=None) -> int:
    from mpi_part import add_part_option
    from reporting import benchmark_parser, machine
    from nbmpi.workers.launch.virtual_cluster import why_not_available

    p = benchmark_parser(__doc__, "1 Gbit/s only, small sizes, one round (smoke test)")
    p.add_argument("--rates", default=None, help="comma-separated tc rates (default 100mbit,1gbit,10gbit)")
    p.add_argument("--nodes", default=None, help="comma-separated node counts of the stencil (default 1,2,3)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved stencil rounds (default 5)")
    p.add_argument("--shape", default=None, metavar="ROWSxCOLS", help="the stencil's grid (default 2000x2000)")
    p.add_argument("--iters", type=int, default=None, help="stencil steps per timed loop (default 10)")
    p.add_argument("--part-kind", default=None, help="(MPI part) pingpong or stencil")
    p.add_argument("--sizes", default="[]", help="(MPI part) ping-pong sizes, JSON")
    p.add_argument("--blocks", type=int, default=7, help="ping-pong blocks per method and size (default 7)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--stencil", default="{}", help="(MPI part) stencil config, JSON")
    add_part_option(p)
    a = p.parse_args(argv)
    if a.mpi_part:
        return mpi_main(a)
    why = why_not_available()
    if why:
        print(f"benchmarks/cluster.py: {why}", file=sys.stderr)
        return 3
    stencil = dict(QUICK_STENCIL if a.quick else STENCIL)
    if a.rounds:
        stencil["rounds"] = a.rounds
    if a.shape:
        stencil["shape"] = tuple(int(v) for v in a.shape.lower().split("x"))
    if a.iters:
        stencil["iters"] = a.iters
    from cluster_moves import FULL as MOVES, QUICK as QUICK_MOVES

    cfg = dict(ping_sizes=QUICK_PING_SIZES if a.quick else PING_SIZES, blocks=2 if a.quick else a.blocks,
               stencil=stencil, moves=QUICK_MOVES if a.quick else MOVES, moves_nodes=2 if a.quick else 3)
    rates = a.rates.split(",") if a.rates else (["1gbit"] if a.quick else list(RATES))
    nodes = [int(n) for n in a.nodes.split(",")] if a.nodes else ([1, 2] if a.quick else [1, 2, 3])
    load0, t_all = os.getloadavg(), time.time()
    results = {}
    with tempfile.TemporaryDirectory(prefix="nbmpi-cluster-bench-") as tmp:
        for rate in rates:
            results[rate] = measure_rate(rate, a, cfg, nodes, Path(tmp), str(Path(__file__).resolve()))
    run_info = dict(load_start=load0, load_end=os.getloadavg(), wall_seconds=time.time() - t_all)
    report(cfg, rates, nodes, results, a.quick, a.out_dir, run_info, machine())
    return 0


def _worst(values) -> float:
    return max(values) if values else float("nan")


def _per_rank(values) -> str:
    return " / ".join(f"{w:.1f}" for w in values)


def stencil_section(cfg, rates, nodes, results):
    """The stencil's wait table (2 and more nodes) and its targets: ``(markdown lines, targets)``."""
    from distarray import ratio_of
    from reporting import md_table, target

    rows, targets = [], []
    for rate in rates:
        for p in [n for n in nodes if n > 1]:
            st = results[rate][f"stencil_{p}"]
            h, b = st["hiding"], st["blocking"]
            wh, wb = _worst(h["wait_pct_median"]), _worst(b["wait_pct_median"])
            rows.append([rate, p, h["per_iter_median_s"] * 1e3, b["per_iter_median_s"] * 1e3,
                         _per_rank(h["wait_pct_median"]), _per_rank(h["transfer_pct_median"]),
                         _per_rank(h.get("force_point_pct_median", [])), _per_rank(b["wait_pct_median"]),
                         _per_rank(b["transfer_pct_median"]), ratio_of(wb, wh),
                         _per_rank(st["handwritten"]["wait_pct_median"]),
                         _per_rank(h.get("cpu_pct_median", [])), _per_rank(h.get("queued_pct_median", [])),
                         st["verified"]])
            if p == 2:
                targets.append(target(f"stencil wait % with latency hiding, worst rank, 2 nodes, {rate}", wh, 10.0,
                                      higher_is_better=False))
                if rate == "1gbit":
                    targets.append(target("stencil wait % without / with latency hiding (worst ranks), 2 nodes, "
                                          "1 Gbit/s", ratio_of(wb, wh), 3.0))
    targets.append(target("every stencil result equals NumPy's",
                          float(all(results[r][f"stencil_{p}"]["verified"] for r in rates for p in nodes)), 1.0))
    shape, iters = cfg["stencil"]["shape"], cfg["stencil"]["iters"]
    md = [f"\n## The seed's Jacobi stencil: wait with and without latency hiding\n\n"
          f"Problem size: a {shape[0]} x {shape[1]} float64 grid (block rows), {iters} steps per timed loop, "
          f"median over {cfg['stencil']['rounds']} interleaved rounds: the seed's program (its Fig. 10, a square "
          "2-D grid; the paper does not state its size) scaled to this 2-core machine with one rank per node: "
          f"{shape[0] * shape[1] * 8 / 2**20:.0f} MiB, per rank and step a 5-point update of 1/p of the rows "
          f"(tens of ms of NumPy here) and one {shape[1] * 8 // 1024} KiB halo row per neighbour (about 0.13 ms "
          "at 1 Gbit/s). Time per step in ms (slowest rank); wait % per rank (rank 0 / 1 / ...) from the "
          "gathered traces, split into transfers (halo receives and waits) and force points (the per-step "
          "`float(sum(...))`: an allreduce, where a rank waits for the slowest one). The seed's table (16 "
          "cores, Gigabit Ethernet): Jacobi stencil 62 % without, 9 % with latency hiding; Jacobi 54 % -> 2 %. "
          "Hand-written: the mpi4py + numba version of benchmarks/distarray.py (halos fly while the interior "
          "is computed), its time in Waitall and Allreduce: the floor of the wait on these links under this "
          "load. On a CPU %, preempted %: the share of the timed loop each rank's thread ran on a core, then "
          "the share it was runnable but kept off the cores by other processes (/proc/thread-self/schedstat); "
          "a rank kept off the cores delays its peers, who then wait in transfers and at force points.\n",
          md_table(["link", "nodes", "hiding ms/step", "blocking ms/step", "wait % hiding", "of which transfers",
                    "of which force points", "wait % blocking", "of which transfers", "without / with (worst)",
                    "hand-written wait %", "hiding: on a CPU %", "hiding: preempted %",
                    "equals NumPy"], rows)]
    return md, targets


def scaling_section(rates, nodes, results):
    """Strong scaling of the stencil, nbmpi (latency hiding) beside the hand-written mpi4py + numba version:
    ``(markdown lines, rows as dicts)``; speed-up against the same program on 1 node of the same cluster."""
    from reporting import md_table

    if 1 not in nodes:
        return [], []
    rows, data = [], []
    for rate in rates:
        t1 = results[rate]["stencil_1"]
        base = dict(nbmpi=t1["hiding"]["per_iter_median_s"], handwritten=t1["handwritten"]["per_iter_median_s"])
        for p in nodes:
            st = results[rate][f"stencil_{p}"]
            t = dict(nbmpi=st["hiding"]["per_iter_median_s"], handwritten=st["handwritten"]["per_iter_median_s"])
            d = dict(rate=rate, nodes=p, **{f"{k}_ms": v * 1e3 for k, v in t.items()},
                     **{f"{k}_speedup": base[k] / t[k] for k in t}, **{f"{k}_efficiency": base[k] / t[k] / p for k in t})
            data.append(d)
            rows.append([rate, p, d["nbmpi_ms"], d["nbmpi_speedup"], d["nbmpi_efficiency"], d["handwritten_ms"],
                         d["handwritten_speedup"], d["handwritten_efficiency"], t["nbmpi"] / t["handwritten"]])
    md = ["\n## Strong scaling of the stencil, 1 to 3 nodes\n\nThe same grid on 1, 2 and 3 nodes (one rank "
          "each), ms per step (median of the rounds, slowest rank); speed-up = time on 1 node / time on p nodes "
          "of the same program, efficiency = speed-up / p. nbmpi with latency hiding; hand-written = mpi4py + "
          "numba (one fused loop per step, no temporaries, so faster per step on 1 node).\n",
          md_table(["link", "nodes", "nbmpi ms/step", "nbmpi speed-up", "nbmpi efficiency", "hand-written ms/step",
                    "hand-written speed-up", "hand-written efficiency", "nbmpi / hand-written time"], rows)]
    return md, data


def report(cfg, rates, nodes, results, quick, out_dir, run_info, mach) -> None:
    from cluster_moves import moves_section
    from reporting import md_table, targets_table, write_results

    ping_rows = []
    for rate in rates:
        pp = results[rate]["pingpong"]
        for nb in cfg["ping_sizes"]:
            raw, chan = pp["raw"][str(nb)], pp["channel"][str(nb)]
            ping_rows.append([rate, nb, raw * 1e6, chan * 1e6, nb / raw / 1e6, nb / chan / 1e6, raw / chan])
    st_md, targets = stencil_section(cfg, rates, nodes, results)
    sc_md, scaling = scaling_section(rates, nodes, results)
    mv_md, mv_targets = moves_section(cfg, rates, results)
    md = [f"One rank per node of a virtual cluster (network namespaces on this machine, links capped with tc tbf at "
          f"each rate, MPICH ofi/tcp between nodes). Ping-pong: one-way time, median of {cfg['blocks']} interleaved "
          "blocks; throughput in MB/s; ratio = channel throughput / raw.\n",
          md_table(["link", "bytes", "raw us", "channel us", "raw MB/s", "channel MB/s", "channel / raw"], ping_rows),
          *st_md, *sc_md, *mv_md,
          "\n## Targets\n", targets_table(targets + mv_targets),
          f"\nCommand: `python benchmarks/cluster.py{' --quick' if quick else ''}` (as root); wall time "
          f"{run_info['wall_seconds']:.0f} s; load average {run_info['load_start'][0]:.2f} at the start, "
          f"{run_info['load_end'][0]:.2f} at the end (the machine is shared)."]
    data = dict(benchmark="cluster", quick=quick, config=cfg, rates=rates, nodes=nodes, results=results,
                scaling=scaling, targets=targets + mv_targets, run=run_info, machine=mach)
    path = write_results("cluster_quick" if quick else "cluster", data, "\n".join(md), Path(out_dir) if out_dir else None)
    print("\n".join(md))
    print(f"written: {path}")


if __name__ == "__main__":
    sys.exit(main())
