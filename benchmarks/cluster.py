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
PING_SIZES = [8, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 8 << 20]
QUICK_PING_SIZES = [8, 64 << 10]
#: The stencil's grid (rows, columns) and steps per timed loop: 535 rows of 32768 float64 per rank on 2 nodes, a
#: 256 KiB halo row; why this shape: :func:`shape_arithmetic` (the report writes it out with measured numbers).
STENCIL = dict(shape=(1070, 32768), iters=10, rounds=5)
QUICK_STENCIL = dict(shape=(200, 200), iters=3, rounds=1)
#: The benchmark's parts, in the order they run (``--parts`` picks some).
PARTS = ("pingpong", "stencil", "moves")


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
    res["handwritten"] = handwritten_waits(comm, x, iters, rounds, dnp.stats()["settings"]["chunk_elems"])
    want = jacobi_stencil(numpy, x.copy(), iters + 2) if rank == 0 else delta   # rank 0 reports it
    for m in modes:
        res[m]["wait_pct_median"] = median_per_rank(res[m]["wait_pct"])
        res[m]["transfer_pct_median"] = median_per_rank([s["transfers"] for s in res[m]["split"]])
        res[m]["force_point_pct_median"] = median_per_rank([s["force_point"] for s in res[m]["split"]])
        res[m]["cpu_pct_median"] = median_per_rank(res[m]["cpu_pct"])
        res[m]["queued_pct_median"] = median_per_rank(res[m]["queued_pct"])
        res[m]["per_iter_median_s"] = float(numpy.median(res[m]["per_iter_s"]))
    res["verified"] = bool(numpy.isclose(delta, want, rtol=1e-9))
    res["chunk_elems"] = dnp.stats()["settings"]["chunk_elems"]
    res["hosts"] = comm.allgather(__import__("socket").gethostname())
    return res


def handwritten_waits(comm, x, iters: int, rounds: int, chunk_elems: int) -> dict:
    """The hand-written mpi4py + numba stencil of ``benchmarks/distarray.py`` on the same grid, its interior in
    chunks of ``chunk_elems`` elements (nbmpi's block size) with ``Testall`` between them, so that the halos fly
    while it is computed: each rank's wait % in ``Waitall`` and ``Allreduce`` (median over ``rounds``), the floor
    of the program's wait on these links and this machine's load."""
    import nbmpi.workers.distarray as dnp
    from distarray import _hw_kernels, handwritten_stencil, median_per_rank

    rank, size = comm.Get_rank(), comm.Get_size()
    lo, hi = dnp.Distribution("block", x.shape[0], size).block_range(rank)
    kernel = _hw_kernels()
    chunk_rows = max(1, chunk_elems // x.shape[1])
    waits, per_iter, cpu, queued = [], [], [], []
    for _ in range(rounds):
        u = numpy.zeros((hi - lo + 2, x.shape[1]))
        u[1:-1] = x[lo:hi]
        v = u.copy()
        handwritten_stencil(comm, u, v, lo, x.shape[0], 2, kernel, chunk_rows)   # warm
        res, t, share = timed_share(comm, lambda: handwritten_stencil(comm, u, v, lo, x.shape[0], iters, kernel,
                                                                      chunk_rows))
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
    parts = cfg["parts"]
    with VirtualCluster(max(nodes + [cfg["moves_nodes"], 2]), rate) as vc:
        env = {**vc.launch_env(), "NBMPI_DISTARRAY_CACHE": str(tmp / "kernels"), "NBMPI_TIMEOUT": "300"}
        if "pingpong" in parts:
            print(f"[{rate}] ping-pong between {vc.names[0]} and {vc.names[1]} ...", flush=True)
            args = ["--part-kind", "pingpong", "--sizes", json.dumps(cfg["ping_sizes"]), "--blocks", str(cfg["blocks"])]
            code, out["pingpong"] = run_part(2, script, tmp / f"ping-{rate}.json", args, env, hosts=vc.addresses[:2])
            if code:
                raise RuntimeError(f"the ping-pong at {rate} failed with exit code {code}")
        for p in (nodes if "stencil" in parts else []):
            print(f"[{rate}] stencil on {p} nodes ...", flush=True)
            args = ["--part-kind", "stencil", "--stencil", json.dumps(cfg["stencil"])]
            code, out[f"stencil_{p}"] = run_part(p, script, tmp / f"st-{rate}-{p}.json", args, env,
                                                 hosts=vc.addresses[:p])
            if code:
                raise RuntimeError(f"the stencil on {p} nodes at {rate} failed with exit code {code}")
        p = cfg["moves_nodes"]
        if "moves" not in parts:
            return out
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
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated parts to run (default all: {','.join(PARTS)}); a partial run writes "
                        "cluster_PARTS.json / .md")
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
               stencil=stencil, moves=QUICK_MOVES if a.quick else MOVES, moves_nodes=2 if a.quick else 3,
               parts=[x for x in PARTS if x in a.parts.split(",")])
    unknown = set(a.parts.split(",")) - set(PARTS)
    if unknown or not cfg["parts"]:
        p.error(f"--parts {a.parts!r}: pick from {','.join(PARTS)}")
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
    chunk = results[rates[0]].get("stencil_2", {}).get("chunk_elems") or 1 << 20
    rows_per_block = max(1, chunk // shape[1])
    md = [f"\n## The seed's Jacobi stencil: wait with and without latency hiding\n\n"
          f"Problem size: a {shape[0]} x {shape[1]} float64 grid (block rows; {shape[0] // 2} rows per rank on 2 "
          f"nodes, {shape[0] // 3} on 3), {iters} steps per timed loop, median over {cfg['stencil']['rounds']} "
          "interleaved rounds: the seed's program (its Fig. 10) with its per-rank shape, a strip of few rows and "
          f"wide rows, scaled to this machine (the arithmetic follows the table): {shape[0] * shape[1] * 8 / 2**20:.0f} "
          f"MiB, per rank and step a 5-point update of its rows (~30 ms on a quiet core on 2 nodes) and one "
          f"{shape[1] * 8 // 1024} KiB halo row per neighbour (~21 ms at 100 Mbit/s, ~2.1 ms at 1 Gbit/s, ~0.2 ms "
          "at 10 Gbit/s).\n\n"
          "How the halos fly: MPICH here has no progress thread and the runtime is `funneled`, so over ofi/tcp a "
          "message moves only while a rank is inside MPI (measured once with a 2-rank probe on this cluster, not "
          "part of this benchmark: an exchange of 16 KiB to 1 MiB started before ~50 ms of NumPy with no MPI call "
          "was still unfinished at its end, a median 6-14 ms wait after it at 1 Gbit/s and 12-21 ms at 100 "
          "Mbit/s; with `Testall` between 10 chunks of the same work, 0.01 ms). With latency hiding the flush starts the receives and sends "
          f"first, then computes the interior in blocks of {chunk} elements ({rows_per_block} rows of this grid, "
          f"{-(-(shape[0] // 2) // rows_per_block)} blocks per rank and step on 2 nodes) and calls `Testsome` on "
          "every request in flight after each block, which drives the transfer; the rows that need a halo are "
          "blocks of their own, run when it has arrived. Without latency hiding the exchange is waited for first, "
          "then everything is computed.\n\n"
          "Time per step in ms (slowest rank); wait % per rank (rank 0 / 1 / ...) from the gathered traces, split "
          "into transfers (halo receives and waits) and force points (the per-step `float(sum(...))`: an "
          "allreduce, where a rank waits for the slowest one). Hand-written: the mpi4py + numba version of "
          "benchmarks/distarray.py, its interior in the same blocks with `Testall` between them (so its halos fly "
          "too), its time in Waitall and Allreduce: the floor of the wait on these links under this load. On a "
          "CPU %, preempted %: the share of the timed loop each rank's thread ran on a core, then the share it was "
          "runnable but kept off the cores by other processes (/proc/thread-self/schedstat); a rank kept off the "
          "cores delays its peers, who then wait in transfers and at force points.\n\n"
          "The seed's table (DistNumPy, 16 nodes of 8 cores, one rank per node, Gigabit Ethernet, OpenMPI), "
          "wait % of the run:\n",
          md_table(["program", "wait % blocking", "wait % latency hiding", "without / with"],
                   [["Jacobi stencil", 62, 9, 62 / 9], ["Jacobi", 54, 2, 27.0]]),
          "\nMeasured here:\n",
          md_table(["link", "nodes", "hiding ms/step", "blocking ms/step", "wait % hiding", "of which transfers",
                    "of which force points", "wait % blocking", "of which transfers", "without / with (worst)",
                    "hand-written wait %", "hiding: on a CPU %", "hiding: preempted %",
                    "equals NumPy"], rows)]
    return md, targets


#: Nominal payload rate of each link in bytes/s (the tbf rate less ~5 % of TCP/IP headers), used where the
#: ping-pong did not run in the same invocation.
NOMINAL_BPS = {"100mbit": 100e6 / 8 * 0.95, "1gbit": 1e9 / 8 * 0.95, "10gbit": 10e9 / 8 * 0.95}


def link_bytes_per_s(rate: str, results: dict, nbytes: int) -> tuple:
    """``(bytes/s, how)``: the raw mpi4py ping-pong throughput of this run at the smallest measured size of at least
    ``nbytes`` (a halo), or the nominal rate of :data:`NOMINAL_BPS` if the ping-pong did not run."""
    pp = results[rate].get("pingpong")
    if pp:
        sizes = sorted(int(k) for k in pp["raw"])
        size = next((k for k in sizes if k >= nbytes), sizes[-1])
        return size / pp["raw"][str(size)], f"ping-pong, {size >> 10} KiB"
    return NOMINAL_BPS.get(rate, float("nan")), "nominal"


def shape_arithmetic(cfg, rates, nodes, results):
    """Why the stencil's grid has this shape, computed from this run's measurements: ``(markdown lines, rows as
    dicts)``. Per rate, on 2 nodes: a halo's transfer time T (one row, at the measured link throughput), a step's
    compute C (this rank's rows times the measured time per element on 1 node), T / C, and the transfer wait that
    T / (T + C) predicts for the blocking exchange, beside the measured transfer waits of both modes."""
    from reporting import md_table

    (R, W), base = cfg["stencil"]["shape"], 1 if 1 in nodes else 2
    halo = 8 * W
    rows, data = [], []
    for rate in rates:
        if f"stencil_{base}" not in results[rate] or "stencil_2" not in results[rate]:
            continue
        one = results[rate][f"stencil_{base}"]["hiding"]
        busy = 1 - (max(one["wait_pct_median"] or [0.0]) / 100 if base > 1 else 0.0)
        kappa = one["per_iter_median_s"] * busy / (R * W / base)   # s per element of a step, the flush included
        bps, how = link_bytes_per_s(rate, results, halo)
        t, c = halo / bps, (R / 2) * W * kappa
        st = results[rate]["stencil_2"]
        d = dict(rate=rate, bytes_per_s=bps, throughput_from=how, ns_per_element=kappa * 1e9, halo_ms=t * 1e3,
                 compute_ms=c * 1e3, t_over_c=t / c, predicted_blocking_transfer_pct=100 * t / (t + c),
                 blocking_transfer_pct=_worst(st["blocking"]["transfer_pct_median"]),
                 hiding_transfer_pct=_worst(st["hiding"]["transfer_pct_median"]))
        data.append(d)
        rows.append([rate, f"{bps / 1e6:.1f} ({how})", d["ns_per_element"], d["halo_ms"], d["compute_ms"], d["t_over_c"],
                     d["predicted_blocking_transfer_pct"], d["blocking_transfer_pct"], d["hiding_transfer_pct"]])
    md = ["\n### The problem size: the seed's shape scaled to this machine\n\n"
          "The seed ran its Jacobi stencil on 16 nodes (Gigabit Ethernet, one rank per node): its square grid of N "
          "rows is cut into 16 strips of N/16 rows of N columns, and per step each rank sends a halo row of 8N "
          "bytes to each neighbour while it updates its N/16 x N elements. Per rank with r rows of W columns, a "
          "halo takes T = 8W / B on a link of B bytes/s and a step's compute C = r W k at k s per element, so "
          "T / C = 8 / (B r k): the width cancels and the rows per rank decide the share of the transfer. The seed "
          "does not state N; two of the targets fix r here. (1) Latency hiding can only hide a transfer shorter than "
          "the compute, so hiding's wait <= 10 % at 100 Mbit/s needs T100 <= C, i.e. T / C <= ~0.1 at 1 Gbit/s "
          "(10x the rate). (2) Without / with >= 3 at 1 Gbit/s needs the blocking exchange's wait T / (T + C) at "
          "least 3x hiding's remaining wait, the force points' 1-2 % on a quiet machine: T / C >= ~0.05. With "
          "B = ~125 MB/s at 1 Gbit/s and k = ~1.7 ns per element (nbmpi's fused step on one core here), "
          "r = 8 / (B k T/C) lies between ~380 (T/C = 0.1) and ~750 (0.05): r = 535 rows per rank on 2 nodes "
          f"(the grid has {R} rows). The width sets the step's length: W = {W} columns makes C = 535 x {W} x "
          f"1.7 ns = ~30 ms per step (tens of ms, so that a flush's fixed cost of a fraction of a ms is noise) and "
          f"a halo of {halo >> 10} KiB, a rendezvous-size message (T = ~2.1 ms at 1 Gbit/s, ~21 ms at 100 Mbit/s, "
          f"~0.2 ms at 10 Gbit/s). Grid: {R} x {W} float64 = {R * W * 8 / 2**20:.0f} MiB. The same arithmetic "
          "with this run's measured numbers (k from the stencil on "
          f"{base} node{'s' if base > 1 else ''} of the same cluster, B from the raw ping-pong):\n",
          md_table(["link", "B MB/s (from)", "k ns/element", "halo T ms", "compute C ms", "T / C",
                    "T / (T + C) %", "measured blocking transfer wait % (worst)",
                    "measured hiding transfer wait % (worst)"], rows)]
    return md, data


def three_node_floor(rates, nodes, results):
    """3 busy ranks on this machine's 2 cores: ``(markdown lines, rows as dicts)`` with the floor of the ranks' time
    off a core that this alone forces, the measured off-core share and the measured waits."""
    from reporting import md_table

    if 3 not in nodes:
        return [], []
    ncpu = os.cpu_count() or 2
    floor = max(0.0, 100 * (1 - ncpu / 3))
    rows, data = [], []
    for rate in rates:
        st = results[rate]["stencil_3"]
        d = dict(rate=rate, floor_off_core_pct=floor)
        for m in ("hiding", "blocking"):
            cpu = st[m].get("cpu_pct_median") or [float("nan")]
            d[f"{m}_on_cpu_pct_mean"] = float(numpy.mean(cpu))
            d[f"{m}_off_core_pct_mean"] = 100 - float(numpy.mean(cpu))
            d[f"{m}_wait_pct_mean"] = float(numpy.mean(st[m]["wait_pct_median"] or [float("nan")]))
        data.append(d)
        rows.append([rate, floor, d["hiding_off_core_pct_mean"], d["hiding_wait_pct_mean"],
                     d["blocking_off_core_pct_mean"], d["blocking_wait_pct_mean"]])
    md = [f"\n### 3 nodes on {ncpu} cores: the floor the cores alone force\n\n"
          f"Three ranks that are always runnable (a rank in a wait polls MPI; nbmpi's waits yield the core every 256 "
          f"polls) on {ncpu} cores: at any instant at most {ncpu} of them run, so the ranks' mean share of the loop "
          f"on a core is at most {ncpu}/3 and their mean time off a core at least 100 (1 - {ncpu}/3) = {floor:.1f} %, "
          "whatever the program does (the floor of the average time a rank is not computing). The stencil steps in lockstep (a halo exchange and an allreduce per step), so "
          "a rank kept off a core stalls its peers: its off-core time becomes their wait, except where the kernel "
          "time-slices the three so finely that all of them advance at 2/3 speed together (then it stretches "
          "their compute instead): how much of it shows as wait depends on how the kernel slices the cores. "
          "The measured off-core share is 100 - the mean 'on a CPU %' of the ranks (it includes the other "
          "processes on the machine); the measured wait is the mean over the ranks of the trace's wait %. The 33.3 % bounds the off-core "
          "share, not the wait itself: off-core time inside a rank's compute stretches everyone's step, and only "
          "off-core time that makes a halo or a partial sum late shows as a peer's wait, so the measured wait can "
          "lie below it. What it does say: on this machine a 3-node step is at least 3/2 of a rank's compute on "
          "its own core, and the 3-node figures measure the sharing of the cores as much as the network.\n",
          md_table(["link", "floor: mean off-core % (3 ranks, 2 cores)", "hiding: measured off-core %",
                    "hiding: mean wait %", "blocking: measured off-core %", "blocking: mean wait %"], rows)]
    return md, data


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

    parts = cfg["parts"]
    ping_rows = []
    for rate in (rates if "pingpong" in parts else []):
        pp = results[rate]["pingpong"]
        for nb in cfg["ping_sizes"]:
            raw, chan = pp["raw"][str(nb)], pp["channel"][str(nb)]
            ping_rows.append([rate, nb, raw * 1e6, chan * 1e6, nb / raw / 1e6, nb / chan / 1e6, raw / chan])
    st_md, targets = stencil_section(cfg, rates, nodes, results) if "stencil" in parts else ([], [])
    sc_md, scaling = scaling_section(rates, nodes, results) if "stencil" in parts else ([], [])
    ar_md, arithmetic = shape_arithmetic(cfg, rates, nodes, results) if "stencil" in parts else ([], [])
    fl_md, floor3 = three_node_floor(rates, nodes, results) if "stencil" in parts else ([], [])
    mv_md, mv_targets = moves_section(cfg, rates, results) if "moves" in parts else ([], [])
    md = [f"One rank per node of a virtual cluster (network namespaces on this machine, links capped with tc tbf at "
          f"each rate, MPICH ofi/tcp between nodes). Ping-pong: one-way time, median of {cfg['blocks']} interleaved "
          "blocks; throughput in MB/s; ratio = channel throughput / raw.\n",
          md_table(["link", "bytes", "raw us", "channel us", "raw MB/s", "channel MB/s", "channel / raw"], ping_rows),
          *st_md, *ar_md, *fl_md, *sc_md, *mv_md,
          "\n## Targets\n", targets_table(targets + mv_targets),
          f"\nCommand: `python benchmarks/cluster.py{' --quick' if quick else ''}` (as root); wall time "
          f"{run_info['wall_seconds']:.0f} s; load average {run_info['load_start'][0]:.2f} at the start, "
          f"{run_info['load_end'][0]:.2f} at the end (the machine is shared)."]
    data = dict(benchmark="cluster", quick=quick, config=cfg, rates=rates, nodes=nodes, results=results,
                scaling=scaling, shape_arithmetic=arithmetic, three_node_floor=floor3, targets=targets + mv_targets, run=run_info, machine=mach)
    name = "cluster_quick" if quick else "cluster"
    if tuple(parts) != PARTS:
        name += "_" + "_".join(parts)   # a partial run never overwrites the full report
    path = write_results(name, data, "\n".join(md), Path(out_dir) if out_dir else None)
    print("\n".join(md))
    print(f"written: {path}")


if __name__ == "__main__":
    sys.exit(main())
