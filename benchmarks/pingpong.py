"""Ping-pong benchmark: ArrayChannel put/take against raw mpi4py, over many runs, cold and warm.

One command (it launches the 2 MPI ranks itself with ``nbmpi run``, once per run)::

    python benchmarks/pingpong.py            # 10 runs, 8 B .. 64 MiB (a few minutes)
    python benchmarks/pingpong.py --quick    # 2 runs, small sizes (smoke test)

Every run is a separate ``mpiexec`` launch (fresh processes, fresh memory), so a
result that holds only in one process state does not pass. The harness is the
way users write a ping-pong (each rank has ONE send and ONE receive buffer,
created once and reused every round trip), measured side by side in each run:

* ``raw``: mpi4py ``Send(sbuf)`` / ``Recv(rbuf)``, separate send and receive
  buffers (the baseline of every ratio);
* ``raw_inplace``: the same with one buffer for both (the channel's own model);
* ``channel``: ArrayChannel ``put``/``take``, tracing on (the default). The two
  ranks' buffers are in shared memory: flags in that memory are the rendezvous
  and one copy, shared by both ranks, moves the data;
* ``channel_notrace``: the same with tracing off; the tracing cost itself is
  measured paired (round trips alternate traced / untraced in one batch; the
  ratio of the two medians), which load between batches cannot skew;
* ``channel_mpi``: the channel on MPI messages only (``NBMPI_SHM_MIN_BYTES=off``,
  persistent synchronous requests, as between nodes);
* ``raw_used`` / ``channel_used``: the same as ``raw`` / ``channel`` with the data
  used, as applications do: before each send the sender computes its buffer
  (``np.add(b, 1.0, out=b)``), after each receive the receiver reads it
  (``b.sum()``). Where a copy leaves the data (which core's cache) then counts,
  and a harness that never touches the data cannot show it;
* once per benchmark: ``pickle`` (mpi4py ``send``/``recv`` of the array, a new
  buffer per message), ``dask`` (a transfer between two Dask workers) and
  ``memcpy`` (``numpy.copyto`` in one process, the physical bound).

Contended: ``--contended-runs`` more runs (default 3) with one busy process per
core beside the two ranks (what an independent harness found the old channel
sensitive to: with the ranks descheduled now and then, a protocol that needs
both ranks on a CPU at the same moments stalls for whole time slices). Sizes
from 64 KiB; reported apart, and held to the same target.

Cold: in each run and size, the buffers and the channel are created, then ONE
round trip is timed (first touch, first use), before any warm-up; creation
times are reported apart. Warm: many short blocks (~1 ms of round trips, up
to 50 per method and size, at least ``--rounds``), the methods interleaved in
a new random order for each block, so that all methods see the same machine
load; a run's figure for a method is the MEDIAN of its blocks, and the tables
give the minimum, median and maximum over runs of the channel/raw throughput
ratio, so one lucky block proves nothing. The targets are checked from the minimum over runs (every
run) except the tracing cost (median over runs). Results:
``benchmarks/results/pingpong.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FULL_SIZES = [8, 64, 512, 4 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [8, 4 << 10, 64 << 10, 1 << 20]
WARM_METHODS = ("raw", "raw_inplace", "channel", "channel_notrace", "channel_mpi", "raw_used", "channel_used")
TARGET_FROM, TARGET_TO = 64 << 10, 64 << 20     # the channel >= raw in every run over this range
BLOCK_S = 0.001      # one timed block of round trips lasts about this long
METHOD_S = 0.05      # ... and each method gets about this much time per size and run


def round_trip_estimate(nbytes: int) -> float:
    """A raw MPI round trip on this kind of machine (s), to size the blocks."""
    return 2 * (nbytes / 6e9 + 1.5e-6)


def iterations(nbytes: int) -> int:
    """Round trips per timed block: about ``BLOCK_S``, at least one."""
    return int(min(500, max(1, BLOCK_S / round_trip_estimate(nbytes))))


def blocks(nbytes: int, minimum: int) -> int:
    """Timed blocks per method: about ``METHOD_S`` in all, from ``minimum`` to 50."""
    return int(min(50, max(minimum, METHOD_S / (iterations(nbytes) * round_trip_estimate(nbytes)))))


# --------------------------------------------------------------------------- MPI part (2 ranks)
class _Pair:
    """The two ranks of the MPI part: rank, peer, tracer and the timing steps both ranks run together."""

    def __init__(self, comm, tracer) -> None:
        from mpi4py import MPI

        self.max_op = MPI.MAX
        self.comm = comm
        self.rank = comm.Get_rank()
        self.peer = 1 - self.rank
        self.tracer = tracer

    def slowest(self, dt: float) -> float:
        """Collective: both ranks agree on the slower rank's time ``dt``."""
        return self.comm.allreduce(dt, op=self.max_op)

    def ping(self, send, recv) -> None:
        """One round trip: rank 0 sends then receives, rank 1 receives then sends."""
        if self.rank == 0:
            send()
            recv()
        else:
            recv()
            send()

    def batch(self, send, recv, k: int):
        """A function running ``k`` round trips of ``send``/``recv`` (rank 0 sends first)."""
        def run():
            if self.rank == 0:
                for _ in range(k):
                    send()
                    recv()
            else:
                for _ in range(k):
                    recv()
                    send()
        return run


def measure_cold(pair: _Pair, nbytes: int, n: int, seed: int):
    """Create the raw buffers and the channel and time ONE round trip each (order alternates by run).
    Returns ``(cold figures, sbuf, rbuf, channel)``."""
    from nbmpi.workers import ArrayChannel

    comm, peer, now = pair.comm, pair.peer, time.perf_counter
    cold = {}
    steps = ["raw", "channel"] if seed % 2 == 0 else ["channel", "raw"]
    for what in steps:
        comm.Barrier()
        if what == "raw":
            t0 = now()
            sbuf, rbuf = np.ones(n), np.empty(n)
            cold["create_raw_s"] = pair.slowest(now() - t0)
            comm.Barrier()
            t0 = now()
            pair.ping(lambda: comm.Send(sbuf, peer, 1), lambda: comm.Recv(rbuf, peer, 1))
            cold["first_raw_s"] = pair.slowest(now() - t0)
        else:
            t0 = now()
            ch = ArrayChannel(n, np.float64, name=f"pingpong-{nbytes}")
            cold["create_channel_s"] = pair.slowest(now() - t0)
            comm.Barrier()
            t0 = now()
            pair.ping(lambda: ch.put(peer), lambda: ch.take(peer))
            cold["first_channel_s"] = pair.slowest(now() - t0)
    return cold, sbuf, rbuf, ch


def mpi_only_channel(n: int, nbytes: int):
    """Collective: an ArrayChannel on MPI messages only (``NBMPI_SHM_MIN_BYTES=off`` while it is created,
    the environment restored after), filled with ones."""
    from nbmpi.workers import ArrayChannel

    saved = os.environ.get("NBMPI_SHM_MIN_BYTES")
    os.environ["NBMPI_SHM_MIN_BYTES"] = "off"  # same on both ranks: a channel on MPI messages only
    ch_mpi = ArrayChannel(n, np.float64, name=f"pingpong-mpi-{nbytes}")
    if saved is None:
        del os.environ["NBMPI_SHM_MIN_BYTES"]
    else:
        os.environ["NBMPI_SHM_MIN_BYTES"] = saved
    ch_mpi.fill(1.0)
    return ch_mpi


def _produce(b) -> None:
    """The sender computes the data it sends: reads and writes the whole buffer."""
    np.add(b, 1.0, out=b)


def _consume(b) -> None:
    """The receiver reads what it received."""
    b.sum()


def warm_runs(pair: _Pair, sbuf, rbuf, ch, ch_mpi, iters: int) -> dict:
    """Per warm method: a function running ``iters`` round trips of that method."""
    comm, peer, buf = pair.comm, pair.peer, ch.buffer
    batch = pair.batch
    return dict(
        raw=batch(lambda: comm.Send(sbuf, peer, 1), lambda: comm.Recv(rbuf, peer, 1), iters),
        raw_used=batch(lambda: (_produce(sbuf), comm.Send(sbuf, peer, 4)),
                       lambda: (comm.Recv(rbuf, peer, 4), _consume(rbuf)), iters),
        channel_used=batch(lambda: (_produce(buf), ch.put(peer)), lambda: (ch.take(peer), _consume(buf)), iters),
        raw_inplace=batch(lambda: comm.Send(sbuf, peer, 2), lambda: comm.Recv(sbuf, peer, 2), iters),
        channel=batch(lambda: ch.put(peer), lambda: ch.take(peer), iters),
        channel_notrace=batch(lambda: ch.put(peer), lambda: ch.take(peer), iters),
        channel_mpi=batch(lambda: ch_mpi.put(peer), lambda: ch_mpi.take(peer), iters),
    )


def measure_warm(pair: _Pair, runs: dict, nbytes: int, iters: int, rounds: int, seed: int) -> Dict[str, list]:
    """Warm up every method, then time interleaved blocks in a random order per block (the same on both
    ranks). Returns per method the one-way time of each block."""
    tracer, comm, now = pair.tracer, pair.comm, time.perf_counter
    for m in WARM_METHODS:  # warm-up: persistent requests, first touch, caches
        tracer.enabled = m != "channel_notrace"
        runs[m]()
    times = {m: [] for m in WARM_METHODS}
    order_rng = np.random.default_rng([seed, nbytes])  # same permutations on both ranks
    for _ in range(blocks(nbytes, rounds)):
        for m in order_rng.permutation(WARM_METHODS):
            tracer.enabled = m != "channel_notrace"
            comm.Barrier()
            t0 = now()
            runs[m]()
            times[m].append(pair.slowest(now() - t0) / iters / 2)  # one-way time
        tracer.clear()
    tracer.enabled = True
    return times


def measure_paired_tracing(pair: _Pair, ch, nbytes: int, iters: int) -> List[float]:
    """Tracing cost, paired: round trips alternate traced / untraced within one batch (both ranks switch
    together), each timed on its own; returns the medians ``[traced, untraced]``, which compare like with
    like whatever the load does between batches."""
    tracer, peer, now = pair.tracer, pair.peer, time.perf_counter
    k2 = min(4000, 2 * max(iters, int(0.1 / round_trip_estimate(nbytes))))  # ~0.2 s of round trips
    rts = np.zeros(k2)
    pair.comm.Barrier()
    for i in range(k2):
        tracer.enabled = i % 2 == 0
        t0 = now()
        pair.ping(lambda: ch.put(peer), lambda: ch.take(peer))
        rts[i] = now() - t0
    tracer.enabled = True
    tracer.clear()
    return [float(np.median(rts[0::2])), float(np.median(rts[1::2]))]


def measure_pickle(pair: _Pair, sbuf, iters: int, rounds: int) -> List[float]:
    """Pickle, the eager model (a new buffer per message): one-way times of ``max(2, rounds // 2)`` blocks
    of mpi4py ``send``/``recv`` round trips of the array."""
    comm, peer, rank, now = pair.comm, pair.peer, pair.rank, time.perf_counter
    k = max(1, iters // 8)
    obj = sbuf

    def pk():
        nonlocal obj
        if rank == 0:
            comm.send(obj, peer, 3)
            obj = comm.recv(source=peer, tag=3)
        else:
            obj = comm.recv(source=peer, tag=3)
            comm.send(obj, peer, 3)

    pk()
    pt = []
    for _ in range(max(2, rounds // 2)):
        comm.Barrier()
        t0 = now()
        for _ in range(k):
            pk()
        pt.append(pair.slowest(now() - t0) / k / 2)
    return pt


def measure_size(pair: _Pair, result: dict, nbytes: int, rounds: int, seed: int, extras: bool) -> None:
    """Every measurement of one message size, in order (cold, warm, paired tracing, pickle if ``extras``),
    stored into ``result``; the channels are closed after."""
    n = max(1, nbytes // 8)
    cold, sbuf, rbuf, ch = measure_cold(pair, nbytes, n, seed)
    result["cold"][nbytes] = cold
    result["how"][nbytes] = ch.same_node_how
    ch_mpi = mpi_only_channel(n, nbytes)
    iters = iterations(nbytes)
    runs = warm_runs(pair, sbuf, rbuf, ch, ch_mpi, iters)
    times = measure_warm(pair, runs, nbytes, iters, rounds, seed)
    for m in WARM_METHODS:
        result["warm"][m][nbytes] = times[m]
    result["paired"][nbytes] = measure_paired_tracing(pair, ch, nbytes, iters)
    if extras:  # once per benchmark
        result["pickle"][nbytes] = measure_pickle(pair, sbuf, iters, rounds)
    ch.close()
    ch_mpi.close()


def mpi_part(sizes: List[int], rounds: int, out: str, seed: int, extras: bool) -> None:
    """The MPI part, on exactly 2 ranks (both call it): every size measured in turn; rank 0 writes the
    JSON of the run to ``out``."""
    from nbmpi.workers import get_tracer, world

    comm = world()
    if comm.Get_size() != 2:
        raise SystemExit("the ping-pong MPI part needs exactly 2 ranks")
    pair = _Pair(comm, get_tracer())
    result: Dict[str, dict] = dict(cold={}, warm={m: {} for m in WARM_METHODS}, pickle={}, how={}, paired={},
                                   load_start=os.getloadavg())
    for nbytes in sizes:
        measure_size(pair, result, nbytes, rounds, seed, extras)
        if pair.rank == 0:
            print(f"  run {seed}: {nbytes} B", file=sys.stderr, flush=True)
    result["load_end"] = os.getloadavg()
    if pair.rank == 0:
        Path(out).write_text(json.dumps(result))


# --------------------------------------------------------------------------- Dask part
def _identity(x):
    return x


def dask_part(sizes, rounds: int) -> dict:
    """One-way transfer time of an array between two Dask workers (median of ``rounds``)."""
    import logging

    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    out = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        a, b = sorted(client.scheduler_info()["workers"])
        for nbytes in sizes:
            arr = np.ones(max(1, nbytes // 8), dtype=np.float64)
            fut = client.scatter(arr, workers=[a], direct=True)
            ts = []
            for _ in range(max(rounds, 2) + 1):
                t0 = time.perf_counter()
                there = client.submit(_identity, fut, workers=[b], pure=False, allow_other_workers=False)
                back = client.submit(_identity, there, workers=[a], pure=False, allow_other_workers=False)
                back.result()
                ts.append((time.perf_counter() - t0) / 2)
                del there, back
            out[nbytes] = float(np.median(ts[1:]))
            del fut
    return out


# --------------------------------------------------------------------------- memcpy bound
def memcpy_part(sizes, rounds: int) -> dict:
    out = {}
    for nbytes in sizes:
        n = max(1, nbytes // 8)
        src, dst = np.ones(n), np.empty(n)
        iters = iterations(nbytes) * 2
        np.copyto(dst, src)
        ts = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(iters):
                np.copyto(dst, src)
            ts.append((time.perf_counter() - t0) / iters)
        out[nbytes] = float(np.median(ts))
    return out


# --------------------------------------------------------------------------- report
def human(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def spread(values) -> Dict[str, float]:
    v = np.asarray(list(values), dtype=float)
    return dict(min=float(v.min()), median=float(np.median(v)), max=float(v.max()))


def fmt_spread(d: Dict[str, float], digits: int = 2) -> str:
    return f"{d['min']:.{digits}f} / {d['median']:.{digits}f} / {d['max']:.{digits}f}"


def compact_run(r: dict) -> dict:
    """A run as stored in the JSON: every list of block times becomes its median, min, max and count."""
    def block_stats(v):
        a = np.asarray(v, dtype=float)
        return dict(median=float(np.median(a)), min=float(a.min()), max=float(a.max()), blocks=int(a.size))

    out = dict(r)
    out["warm"] = {m: {k: block_stats(v) for k, v in d.items()} for m, d in r["warm"].items()}
    out["pickle"] = {k: block_stats(v) for k, v in r["pickle"].items()}
    return out


def contended_part(sizes: List[int], runs: List[dict]) -> dict:
    """Per size: the channel/raw ratios of the contended runs (sizes they measured)."""
    out = {}
    for s in sizes:
        k = str(s)
        if not runs or k not in runs[0]["warm"]["raw"]:
            continue
        per_run = [float(np.median(r["warm"]["raw"][k])) / float(np.median(r["warm"]["channel"][k])) for r in runs]
        out[s] = dict(ratio=spread(per_run), per_run=per_run,
                      raw_one_way_s=spread(float(np.median(r["warm"]["raw"][k])) for r in runs),
                      channel_one_way_s=spread(float(np.median(r["warm"]["channel"][k])) for r in runs))
    return out


def analyse(sizes: List[int], runs: List[dict], extras: dict) -> dict:
    """Per size: per-run medians of every warm method, run-level ratios, cold figures (all from the data)."""
    out = dict(warm={}, cold={}, extras={})
    for s in sizes:
        k = str(s)
        per_run = {m: [float(np.median(r["warm"][m][k])) for r in runs] for m in WARM_METHODS}
        ratio = {m: [raw / t for raw, t in zip(per_run["raw"], per_run[m])] for m in WARM_METHODS}
        ratio_inplace = [a / b for a, b in zip(per_run["raw_inplace"], per_run["channel"])]
        ratio_used = [a / b for a, b in zip(per_run["raw_used"], per_run["channel_used"])]
        trace_cost = [r["paired"][k][0] / r["paired"][k][1] - 1.0 for r in runs]
        out["warm"][s] = dict(
            one_way_s={m: spread(per_run[m]) for m in WARM_METHODS},
            ratio_to_raw={m: spread(ratio[m]) for m in WARM_METHODS},
            channel_ratio_to_raw_per_run=ratio["channel"],
            channel_ratio_to_raw_inplace=spread(ratio_inplace),
            channel_ratio_to_raw_inplace_per_run=ratio_inplace,
            channel_used_ratio_to_raw_used=spread(ratio_used),
            channel_used_ratio_to_raw_used_per_run=ratio_used,
            tracing_cost=spread(trace_cost),
            tracing_cost_batches=spread(a / b - 1.0 for a, b in zip(per_run["channel"], per_run["channel_notrace"])),
        )
        cold = [r["cold"][k] for r in runs]
        out["cold"][s] = dict(
            first_raw_s=spread(c["first_raw_s"] for c in cold),
            first_channel_s=spread(c["first_channel_s"] for c in cold),
            first_ratio=spread(c["first_raw_s"] / c["first_channel_s"] for c in cold),
            create_raw_s=spread(c["create_raw_s"] for c in cold),
            create_channel_s=spread(c["create_channel_s"] for c in cold),
            how=sorted({r["how"][k] for r in runs}),
        )
        out["extras"][s] = {m: extras[m].get(s) for m in ("pickle", "dask", "memcpy")}
    return out


def table_rows(sizes, a: dict):
    """The rows of the warm, cold and peers tables, one per size, from the analysis ``a``."""
    warm_rows, cold_rows, other_rows = [], [], []
    for s in sizes:
        w, c, x = a["warm"][s], a["cold"][s], a["extras"][s]
        raw_med = w["one_way_s"]["raw"]["median"]
        warm_rows.append([human(s), f"{raw_med * 1e6:.2f}", f"{w['one_way_s']['channel']['median'] * 1e6:.2f}",
                          fmt_spread(w["ratio_to_raw"]["channel"]), fmt_spread(w["channel_ratio_to_raw_inplace"]),
                          fmt_spread(w["channel_used_ratio_to_raw_used"]), fmt_spread(w["ratio_to_raw"]["channel_mpi"]),
                          f"{w['tracing_cost']['median'] * 100:+.1f}%"])
        cold_rows.append([human(s), f"{c['first_raw_s']['median'] * 1e6:.1f}",
                          f"{c['first_channel_s']['median'] * 1e6:.1f}", fmt_spread(c["first_ratio"]),
                          f"{c['create_raw_s']['median'] * 1e6:.1f}", f"{c['create_channel_s']['median'] * 1e6:.1f}",
                          ", ".join(c["how"])])
        cells = [human(s), f"{s / raw_med / 1e6:.0f}", f"{s / w['one_way_s']['channel']['median'] / 1e6:.0f}"]
        for m in ("pickle", "dask", "memcpy"):
            t = x[m]
            cells.append(f"{t * 1e6:.1f} us ({raw_med / t:.2f}x)" if t else "-")
        other_rows.append(cells)
    return warm_rows, cold_rows, other_rows


def evaluate_targets(sizes, a: dict, busy: dict, nruns: int, nbusy: int) -> list:
    """The targets, each computed from the analysis ``a`` and the contended analysis ``busy``."""
    from reporting import target

    checks = []
    for s in sizes:
        if TARGET_FROM <= s <= TARGET_TO:
            w = a["warm"][s]
            checks.append(target(f"channel/raw throughput at {human(s)}, worst of {nruns} runs",
                                 w["ratio_to_raw"]["channel"]["min"], 1.0))
            checks.append(target(f"channel/raw (one buffer) throughput at {human(s)}, worst of {nruns} runs",
                                 w["channel_ratio_to_raw_inplace"]["min"], 1.0))
            checks.append(target(f"channel/raw throughput with the data used at {human(s)}, worst of {nruns} runs",
                                 w["channel_used_ratio_to_raw_used"]["min"], 1.0))
    for s, b in busy.items():
        if TARGET_FROM <= s <= TARGET_TO:
            checks.append(target(f"channel/raw throughput at {human(s)}, contended, worst of {nbusy} runs",
                                 b["ratio"]["min"], 1.0))
    small = sizes[0]
    checks.append(target(f"channel/raw {human(small)} latency (median of runs)",
                         1.0 / a["warm"][small]["ratio_to_raw"]["channel"]["median"], 1.5, higher_is_better=False))
    for s in sizes:
        if s >= 1 << 20 and a["extras"][s]["pickle"]:
            checks.append(target(f"channel/pickle throughput at {human(s)}",
                                 a["extras"][s]["pickle"] / a["warm"][s]["one_way_s"]["channel"]["median"], 5.0))
    mib = 1 << 20
    if mib in sizes:
        checks.append(target("tracing cost at 1 MiB (traced / untraced round trip - 1, paired, median of runs)",
                             a["warm"][mib]["tracing_cost"]["median"], 0.03, higher_is_better=False))
    return checks


def markdown(sizes, a: dict, busy: dict, runs, checks: list, nruns: int, rounds: int) -> str:
    """The markdown report: how it was measured, the warm, contended, cold and peers tables, the targets."""
    from reporting import md_table, targets_table

    warm_rows, cold_rows, other_rows = table_rows(sizes, a)
    loads = [r["load_start"][0] for r in runs] + [r["load_end"][0] for r in runs]
    return (f"{nruns} runs (separate `mpiexec` launches), 2 ranks, each rank ONE send and ONE receive buffer reused "
            f"(the user's harness); per run and size, interleaved blocks of ~{BLOCK_S * 1e3:.0f} ms per method (up to "
            f"50, at least {rounds}), a run's figure = median of its blocks. "
            f"Ratios = raw time / channel time (> 1: the channel is faster; 'data used': raw_used / channel_used, "
            f"the sender computes its buffer before each send and the receiver reads it after each receive), "
            f"given as **min / median / max over the runs**. 1-min load average during the runs: "
            f"{min(loads):.2f} .. {max(loads):.2f}.\n\n"
            "## Warm (buffers reused)\n\n"
            + md_table(["size", "raw one-way us (median)", "channel one-way us (median)", "channel/raw",
                        "channel/raw one buffer", "channel/raw, data used", "channel over MPI/raw", "tracing cost"],
                       warm_rows)
            + (("\n\n## Contended (one busy process per core beside the ranks)\n\n"
                + md_table(["size", "raw one-way us (median)", "channel one-way us (median)", "channel/raw"],
                           [[human(s), f"{b['raw_one_way_s']['median'] * 1e6:.2f}",
                             f"{b['channel_one_way_s']['median'] * 1e6:.2f}", fmt_spread(b["ratio"])]
                            for s, b in busy.items()])) if busy else "")
            + "\n\n## Cold (created, then the first round trip)\n\n"
            + md_table(["size", "raw first round trip us", "channel first round trip us", "channel/raw first trip",
                        "raw buffers created us", "channel created us", "channel path"], cold_rows)
            + "\n\n## Peers measured once (median one-way time, ratio to raw)\n\n"
            + md_table(["size", "raw MB/s", "channel MB/s", "pickle", "dask", "memcpy"], other_rows)
            + "\n\n## Targets\n\n" + targets_table(checks))


def report(sizes, runs, extras, quick: bool, nruns: int, rounds: int, out_dir=None, busy_runs=()) -> dict:
    """Analyse the runs, evaluate the targets, write ``pingpong[_quick].json`` and ``.md`` and print the
    markdown. Returns the JSON data."""
    from reporting import write_results

    a = analyse(sizes, runs, extras)
    busy = contended_part(sizes, list(busy_runs))
    checks = evaluate_targets(sizes, a, busy, nruns, len(busy_runs))
    md = markdown(sizes, a, busy, runs, checks, nruns, rounds)
    data = dict(benchmark="pingpong", quick=quick, sizes=sizes, runs=nruns, rounds=rounds,
                methods=list(WARM_METHODS) + ["pickle", "dask", "memcpy"], analysis=a,
                raw_runs=[compact_run(r) for r in runs],
                contended=dict(runs=len(busy_runs), busy_processes=os.cpu_count(),
                               analysis={str(k): v for k, v in busy.items()},
                               raw_runs=[compact_run(r) for r in busy_runs]),
                extras={m: {str(k): v for k, v in d.items()} for m, d in extras.items()}, targets=checks)
    path = write_results("pingpong" if not quick else "pingpong_quick", data, md, out_dir)
    print(md)
    print(f"\nwrote {path} and {path.with_suffix('.md')}")
    return data


def main(argv=None) -> int:
    from mpi_part import add_part_option, run_part
    from reporting import benchmark_parser

    p = benchmark_parser(__doc__, "2 runs, few sizes and rounds (smoke test)")
    p.add_argument("--runs", type=int, default=None, help="separate MPI launches (default 10, quick 2)")
    p.add_argument("--rounds", type=int, default=None,
                   help="least number of interleaved blocks per method, size and run (default 5, quick 2)")
    p.add_argument("--no-dask", action="store_true", help="skip the Dask column")
    p.add_argument("--sizes", default=None, help="comma-separated message sizes in bytes")
    p.add_argument("--contended-runs", type=int, default=None,
                   help="extra runs with one busy process per core (default 3, quick 0)")
    add_part_option(p)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--extras", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else (QUICK_SIZES if a.quick else FULL_SIZES)
    rounds = a.rounds or (2 if a.quick else 5)
    nruns = a.runs or (2 if a.quick else 10)
    if a.mpi_part:
        mpi_part(sizes, rounds, a.mpi_part, a.seed, a.extras)
        return 0
    runs, busy_runs = [], []
    nbusy = a.contended_runs if a.contended_runs is not None else (0 if a.quick else 3)
    busy_sizes = [s for s in sizes if s >= TARGET_FROM]
    t_start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        plan = [(i, False, sizes) for i in range(nruns)] + [(nruns + i, True, busy_sizes) for i in range(nbusy)]
        for i, contended, run_sizes in plan:
            if not run_sizes:
                continue
            out = os.path.join(tmp, f"run{i}.json")
            what = "contended run" if contended else "run"
            print(f"{what} {i + 1}/{len(plan)}: ping-pong on 2 ranks, {human(run_sizes[0])}..{human(run_sizes[-1])}",
                  flush=True)
            args_i = ["--rounds", str(rounds), "--seed", str(i),
                      "--sizes", ",".join(map(str, run_sizes))] + (["--extras"] if i == 0 else [])
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] \
                if contended else []
            try:
                rc, part = run_part(2, __file__, Path(out), args_i)
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
            if part is None:
                print(f"MPI part of {what} {i + 1} failed", file=sys.stderr)
                return rc or 1
            (busy_runs if contended else runs).append(part)
    extras = {"pickle": {s: float(np.median(v)) for s, v in ((int(k), v) for k, v in runs[0]["pickle"].items())}}
    print("memcpy bound ...", flush=True)
    extras["memcpy"] = memcpy_part(sizes, rounds)
    if not a.no_dask:
        print("dask transfers ...", flush=True)
        extras["dask"] = dask_part(sizes, 2 if a.quick else 3)
    else:
        extras["dask"] = {}
    report(sizes, runs, extras, a.quick, nruns, rounds, a.out_dir, busy_runs)
    print(f"total {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
