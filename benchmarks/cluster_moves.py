"""Data movement across the nodes of a virtual cluster: the aggregation histogram and a Block->Cyclic
redistribution, each side by side with its hand-written MPI counterpart (an MPI part of ``cluster.py``).

The measured code is imported, not copied: the histogram methods (``Bench.histogram``: per-update
messages, bucketed ``Alltoallv`` rounds, the :class:`~nbmpi.workers.Aggregator`) from
``benchmarks/aggregation.py``, and the ``Alltoallw`` with derived datatypes from
``benchmarks/redistribute.py``. Every method's result is checked (the histogram against the serial
``bincount``, the redistribution against NumPy's indexing); rounds are interleaved so all methods see the
same machine load, and a time is the slowest rank's.
"""
from __future__ import annotations

from typing import Dict

import numpy

#: Per rank: 1 M histogram updates (20 k for the per-update baseline) into a 4096-bin share, the
#: aggregator's default-sized buffers; the redistribution of a 16 MiB float64 array.
FULL = dict(updates=1_000_000, naive_updates=20_000, table=4096, round_items=1 << 16, buffer_items=8192,
            redist_mib=16.0, rounds=3)
QUICK = dict(updates=20_000, naive_updates=1_000, table=256, round_items=1 << 12, buffer_items=1024,
             redist_mib=0.25, rounds=1)


def histogram_part(cfg: dict) -> dict:
    """Collective on the world: the three histogram methods of ``benchmarks/aggregation.py``, best of
    ``cfg["rounds"]`` interleaved rounds; per method seconds, updates/s per rank and whether it is exact."""
    from aggregation import Bench

    b = Bench(dict(cfg))
    return b.histogram(cfg["rounds"], [], 0)["methods"]


def redistribution_part(mib: float, rounds: int) -> dict:
    """Collective on the world: Block->Cyclic of a ``mib`` MiB float64 array, nbmpi ``b[...] = a`` against
    one ``MPI_Alltoallw`` with derived datatypes (built once), interleaved rounds; per method the median
    and min seconds, checked against NumPy on every rank."""
    import nbmpi.workers.distarray as dnp
    from mpi_part import slowest_rank
    from nbmpi.workers import world
    from nbmpi.workers.core.runtime import MPI as _MPI
    from redistribute import Alltoallw

    MPI = _MPI()
    comm = world()
    rank, size = comm.Get_rank(), comm.Get_size()
    n = int(mib * 2 ** 20) // 8
    x = numpy.random.default_rng(11).random(n)
    ds, dd = dnp.Distribution("block", n, size), dnp.Distribution("cyclic", n, size)
    want = x[dd.global_rows(rank)]
    a = dnp.from_numpy(x, dist="block")
    b = dnp.zeros(n, dist="cyclic")

    def nbmpi() -> None:
        b[...] = a
        dnp.evaluate()

    src_local = x[ds.global_rows(rank)].copy()
    dst_local = numpy.zeros(len(want))
    a2w = Alltoallw(comm, MPI, ds, dd, src_local, dst_local)
    runs = dict(nbmpi=nbmpi, alltoallw=a2w.run)
    for fn in runs.values():
        fn()   # warm: plan, kernels, datatypes
    times: Dict[str, list] = {m: [] for m in runs}
    for r in range(rounds):
        for m in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            times[m].append(slowest_rank(comm, runs[m])[1])
    ok = bool(comm.allreduce(int(numpy.array_equal(b.local, want) and numpy.array_equal(dst_local, want)),
                             op=MPI.MIN))
    out = {m: dict(median_s=float(numpy.median(t)), min_s=float(min(t)), mb_per_s=n * 8 / 1e6 / float(numpy.median(t)))
           for m, t in times.items()}
    out.update(bytes=n * 8, verified=ok)
    return out


def moves_part(cfg: dict) -> dict:
    """The MPI part: the histogram and the redistribution on every rank of the world (one per node)."""
    from nbmpi.workers import world

    hist = histogram_part(cfg)
    redist = redistribution_part(cfg["redist_mib"], cfg["rounds"])
    return dict(histogram=hist, redistribution=redist,
                hosts=world().allgather(__import__("socket").gethostname()))


def moves_section(cfg: dict, rates, results):
    """The report's histogram and redistribution table: ``(markdown lines, targets)`` (every result verified)."""
    from reporting import md_table, target

    rows, ok = [], True
    for rate in rates:
        mv = results[rate]["moves"]
        h, r = mv["histogram"], mv["redistribution"]
        ok = ok and all(m["verified"] for m in h.values()) and r["verified"]
        rows.append([rate, len(mv["hosts"]), h["naive"]["updates_per_s_per_rank"] / 1e6,
                     h["alltoallv"]["updates_per_s_per_rank"] / 1e6, h["aggregator"]["updates_per_s_per_rank"] / 1e6,
                     h["alltoallv"]["seconds"] / h["aggregator"]["seconds"], r["nbmpi"]["mb_per_s"],
                     r["alltoallw"]["mb_per_s"], r["alltoallw"]["median_s"] / r["nbmpi"]["median_s"]])
    m = cfg["moves"]
    md = ["\n## Aggregation histogram and Block->Cyclic redistribution across nodes\n\n"
          f"One rank per node. Histogram (benchmarks/aggregation.py's methods): {m['updates']} random updates per "
          f"rank into a table spread over the ranks ({m['naive_updates']} for per-update messages), best of "
          f"{m['rounds']} interleaved rounds, M updates/s per rank; Aggregator buffers of {m['buffer_items']} "
          f"items. Redistribution: a {m['redist_mib']:g} MiB float64 array, Block->Cyclic, nbmpi `b[...] = a` "
          "against one MPI_Alltoallw with derived datatypes (benchmarks/redistribute.py's), median of the rounds, "
          "MB/s of the whole array. All results checked.\n",
          md_table(["link", "nodes", "per-update msgs M/s", "Alltoallv rounds M/s", "Aggregator M/s",
                    "Aggregator / Alltoallv", "nbmpi MB/s", "Alltoallw MB/s", "nbmpi / Alltoallw"], rows)]
    return md, [target("histogram and redistribution across nodes equal the serial results", float(ok), 1.0)]
