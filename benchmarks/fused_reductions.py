"""Fused reductions benchmark: lazy shared variables against explicit MPI, side by side in one run.

One command (launches 2 ranks itself when started without MPI; also runs
directly under ``nbmpi run -n P``)::

    python benchmarks/fused_reductions.py [--quick]
    nbmpi run -n 2 benchmarks/fused_reductions.py [--quick]

Parts (every method interleaved each round, a fresh order per round, best round):

* variance (seed Table 1 shape, N x M data, N = M, each rank sums its M/P
  columns): ``original`` (two ``Allreduce`` per row), ``hand`` (one packed
  ``Allreduce`` of 2 values), ``lazy`` (``shared`` variables, force at
  ``var[i] = (s2 - s1*s1/N)/(N-1)``). Results are checked equal.
* 64 scalar reductions: 64 separate ``Allreduce`` vs one packed ``Allreduce``
  vs 64 lazy shared variables read back, and the interpreter's floor for that
  lazy loop (the same calls on objects whose methods do nothing).
* synthetic plankton step: four modules make 27 reductions (sums, min, max,
  product, array sums and a bounded nutrient consume) between 3 reads;
  ``original`` does one collective per reduction, ``lazy`` uses shared
  variables; collectives per step are counted from the trace.

Writes ``benchmarks/results/fused_reductions[_quick].json`` and ``.md`` with
PASS/FAIL of the issue's targets computed from the measured numbers.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _timeit(comm, fn, iters: int) -> float:
    from mpi4py import MPI

    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    return comm.allreduce(dt, op=MPI.MAX)


def _interleaved(comm, methods: dict, iters: dict, rounds: int, seed: int) -> dict:
    from nbmpi.workers import get_tracer

    best = {m: float("inf") for m in methods}
    for m, f in methods.items():  # warm-up
        f()
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        for m in rng.permutation(list(methods)):
            best[m] = min(best[m], _timeit(comm, methods[m], iters[m]))
            get_tracer().clear()
    return best


# --------------------------------------------------------------------------- variance
def variance(comm, n: int, rounds: int) -> dict:
    from mpi4py import MPI

    from nbmpi.workers import shared

    rank, P = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(42)
    a = rng.random((n, n))
    lo, hi = rank * n // P, (rank + 1) * n // P
    loc = np.ascontiguousarray(a[:, lo:hi])
    out = {k: np.empty(n) for k in ("original", "hand", "lazy")}
    one, s1b, s2b = np.empty(1), np.empty(1), np.empty(1)
    two, tworec = np.empty(2), np.empty(2)
    S1, S2 = shared(0.0), shared(0.0)

    def original():
        var = out["original"]
        for i in range(n):
            row = loc[i]
            one[0] = row.sum()
            comm.Allreduce(one, s1b, op=MPI.SUM)
            one[0] = row @ row
            comm.Allreduce(one, s2b, op=MPI.SUM)
            s1, s2 = s1b[0], s2b[0]
            var[i] = (s2 - s1 * s1 / n) / (n - 1)

    def hand():
        var = out["hand"]
        for i in range(n):
            row = loc[i]
            two[0] = row.sum()
            two[1] = row @ row
            comm.Allreduce(two, tworec, op=MPI.SUM)
            s1, s2 = tworec[0], tworec[1]
            var[i] = (s2 - s1 * s1 / n) / (n - 1)

    def lazy():
        var = out["lazy"]
        s1, s2 = S1, S2
        for i in range(n):
            row = loc[i]
            s1.reset()
            s2.reset()
            s1 += row.sum()
            s2 += row @ row
            var[i] = (s2 - s1 * s1 / n) / (n - 1)

    best = _interleaved(comm, dict(original=original, hand=hand, lazy=lazy), dict(original=1, hand=1, lazy=1),
                        rounds, n)
    ref = a.var(axis=1, ddof=1)
    for k, v in out.items():
        if not np.allclose(v, ref, rtol=1e-9, atol=1e-12):
            raise SystemExit(f"variance: method {k} computed wrong values")
    return best


# --------------------------------------------------------------------------- 64 scalars
def scalars64(comm, rounds: int, iters: int) -> dict:
    from mpi4py import MPI

    from nbmpi.workers import shared

    rank = comm.Get_rank()
    vals = np.arange(64.0) + rank
    vlist = vals.tolist()
    o_sep, o_pack, o_lazy = np.empty(64), np.empty(64), np.empty(64)
    vs = [shared(0.0) for _ in range(64)]

    def separate():
        for k in range(64):
            comm.Allreduce(vals[k:k + 1], o_sep[k:k + 1], op=MPI.SUM)

    def packed():
        comm.Allreduce(vals, o_pack, op=MPI.SUM)

    def lazy():
        for v, x in zip(vs, vlist):
            v.reset()
            v += x
        for k, v in enumerate(vs):
            o_lazy[k] = float(v)

    class _NoOp:
        """The interpreter's floor for the lazy loop: the same calls, methods that do nothing."""
        __slots__ = ("v",)

        def __init__(self):
            self.v = 0.0

        def reset(self):
            pass

        def __iadd__(self, x):
            return self

        def __float__(self):
            return self.v

    noops = [_NoOp() for _ in range(64)]
    o_floor = np.empty(64)

    def python_floor():
        for v, x in zip(noops, vlist):
            v.reset()
            v += x
        for k, v in enumerate(noops):
            o_floor[k] = float(v)

    best = _interleaved(comm, dict(separate=separate, packed=packed, lazy=lazy, python_floor=python_floor),
                        dict(separate=iters, packed=iters, lazy=iters, python_floor=iters), rounds, 64)
    if not (np.array_equal(o_sep, o_pack) and np.array_equal(o_sep, o_lazy)):
        raise SystemExit("64 scalars: methods disagree")
    return best


# --------------------------------------------------------------------------- synthetic plankton step
LAYERS = 64


def plankton(comm, rounds: int, steps: int) -> dict:
    from mpi4py import MPI

    from nbmpi.workers import get_tracer, pool, shared
    from nbmpi.workers.fused_reductions import K_FUSED

    rank, P = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(7 + rank)
    npart = 2000
    depth = rng.random(npart) * LAYERS
    mass = rng.random(npart)
    layer = np.minimum(depth.astype(np.int64), LAYERS - 1)
    results = {}

    # 27 local quantities per step, computed identically by both methods
    def quantities(step):
        d = (depth + 0.01 * step) % LAYERS
        lay = np.minimum(d.astype(np.int64), LAYERS - 1)
        counts = np.bincount(lay, minlength=LAYERS).astype(np.float64)
        q = dict(
            # Move (7): counts per layer, biomass, sum depth, sum depth^2, min depth, max depth, moved
            counts=counts, biomass=float(mass.sum()), sdepth=float(d.sum()), sdepth2=float(d @ d),
            mindepth=float(d.min()), maxdepth=float(d.max()), moved=float(npart),
            # Energy (6): light absorbed per layer, total light, max light, photosynthesis, respiration, survival
            light=np.bincount(lay, weights=mass, minlength=LAYERS), tlight=float(mass.sum() * 0.5),
            maxlight=float(mass.max()), photo=float(mass.sum() * 0.1), resp=float(mass.sum() * 0.05),
            survival=1.0 - 1e-6 * (rank + 1),
            # Nutrients (8): uptake request (bounded), uptake per layer, 6 scalars
            request=float(mass.sum() * 0.01), uptake=np.bincount(lay, weights=mass * 0.01, minlength=LAYERS),
            n1=1.0, n2=2.0, n3=float(rank), n4=float(d.mean()), n5=float(mass.min()), n6=float(mass.max()),
            # Evolve (6): births, deaths, max age, min age, mean size, population
            births=float(rank + 1), deaths=float(rank), maxage=float(step + rank), minage=float(step),
            msize=float(mass.mean()), pop=float(npart),
        )
        return q

    SUMS_MOVE = ("biomass", "sdepth", "sdepth2", "moved")
    SUMS_ENERGY = ("tlight", "photo", "resp")
    SUMS_NUT = ("n1", "n2", "n3", "n4")
    SUMS_EVOLVE = ("births", "deaths", "msize", "pop")
    nsteps = steps

    def original():
        outs = []
        one, res = np.empty(1), np.empty(1)
        arr_res = np.empty(LAYERS)
        nutrient = 1000.0
        for step in range(nsteps):
            q = quantities(step)
            g = {}

            def red(x, op=MPI.SUM):
                one[0] = x
                comm.Allreduce(one, res, op=op)
                return float(res[0])

            def red_arr(x):
                comm.Allreduce(x, arr_res, op=MPI.SUM)
                return arr_res.copy()

            # Move
            g["counts"] = red_arr(q["counts"])
            for k in SUMS_MOVE:
                g[k] = red(q[k])
            g["mindepth"] = red(q["mindepth"], MPI.MIN)
            g["maxdepth"] = red(q["maxdepth"], MPI.MAX)
            # Energy
            g["light"] = red_arr(q["light"])
            for k in SUMS_ENERGY:
                g[k] = red(q[k])
            g["maxlight"] = red(q["maxlight"], MPI.MAX)
            g["survival"] = red(q["survival"], MPI.PROD)
            r1 = g["tlight"] * g["survival"]  # read 1
            # Nutrients
            total = red(q["request"])
            avail = max(nutrient - 0.0, 0.0)
            scale = 1.0 if total <= avail else avail / total
            grant = q["request"] * scale
            nutrient = nutrient - total if total <= avail else 0.0
            g["uptake"] = red_arr(q["uptake"])
            for k in SUMS_NUT:
                g[k] = red(q[k])
            g["n5"] = red(q["n5"], MPI.MIN)
            g["n6"] = red(q["n6"], MPI.MAX)
            r2 = nutrient + grant + g["n4"]  # read 2
            # Evolve
            for k in SUMS_EVOLVE:
                g[k] = red(q[k])
            g["maxage"] = red(q["maxage"], MPI.MAX)
            g["minage"] = red(q["minage"], MPI.MIN)
            r3 = g["births"] - g["deaths"] + g["maxage"] + float(g["counts"].sum())  # read 3
            outs.append((r1, r2, r3))
        results["original"] = outs

    def lazy():
        outs = []
        nutrient = pool(1000.0)
        for step in range(nsteps):
            q = quantities(step)
            g = {k: shared(0.0) for k in SUMS_MOVE + SUMS_ENERGY + SUMS_NUT + SUMS_EVOLVE}
            counts, light, uptake = shared(np.zeros(LAYERS)), shared(np.zeros(LAYERS)), shared(np.zeros(LAYERS))
            mind, maxd, maxl = shared(np.inf), shared(-np.inf), shared(-np.inf)
            surv, n5, n6 = shared(1.0), shared(np.inf), shared(-np.inf)
            maxage, minage = shared(-np.inf), shared(np.inf)
            # Move
            counts += q["counts"]
            for k in SUMS_MOVE:
                g[k] += q[k]
            mind.min_with(q["mindepth"])
            maxd.max_with(q["maxdepth"])
            # Energy
            light += q["light"]
            for k in SUMS_ENERGY:
                g[k] += q[k]
            maxl.max_with(q["maxlight"])
            surv *= q["survival"]
            r1 = float(g["tlight"] * surv)  # read 1
            # Nutrients
            grant = nutrient.consume(q["request"], floor=0.0)
            uptake += q["uptake"]
            for k in SUMS_NUT:
                g[k] += q[k]
            n5.min_with(q["n5"])
            n6.max_with(q["n6"])
            r2 = float(nutrient) + float(grant) + float(g["n4"])  # read 2
            # Evolve
            for k in SUMS_EVOLVE:
                g[k] += q[k]
            maxage.max_with(q["maxage"])
            minage.min_with(q["minage"])
            r3 = float(g["births"] - g["deaths"] + maxage) + float(np.asarray(counts).sum())  # read 3
            outs.append((r1, r2, r3))
        results["lazy"] = outs

    best = _interleaved(comm, dict(original=original, lazy=lazy), dict(original=1, lazy=1), rounds, 27)
    if not np.allclose(np.array(results["original"]), np.array(results["lazy"]), rtol=1e-12):
        raise SystemExit("plankton: lazy results differ from the original")
    tr = get_tracer()
    tr.clear()
    comm.Barrier()
    lazy()
    ev = tr.events()
    ncoll = int(np.sum(ev[:, 0] == K_FUSED))
    return dict(original_s_per_step=best["original"] / nsteps, lazy_s_per_step=best["lazy"] / nsteps,
                original_collectives_per_step=27.0, lazy_collectives_per_step=ncoll / nsteps,
                reductions_per_step=27)


# --------------------------------------------------------------------------- driver
def mpi_main(quick: bool, out_dir) -> int:
    from nbmpi.workers import world

    comm = world()
    rank, P = comm.Get_rank(), comm.Get_size()
    sizes = [100, 200] if quick else [500, 1000, 1500, 3000]
    rounds = 2 if quick else 5
    var = {}
    for n in sizes:
        var[n] = variance(comm, n, rounds)
        if rank == 0:
            print(f"  variance N=M={n} done", file=sys.stderr, flush=True)
    s64 = scalars64(comm, rounds, 20 if quick else 300)
    pk = plankton(comm, rounds, 3 if quick else 30)
    if rank != 0:
        return 0
    from reporting import md_table, target, targets_table, write_results

    vrows, vtable = [], []
    for n in sizes:
        b = var[n]
        row = dict(N=n, M=n, P=P, original_s=b["original"], hand_s=b["hand"], lazy_s=b["lazy"],
                   hand_improvement_pct=100 * (1 - b["hand"] / b["original"]),
                   lazy_improvement_pct=100 * (1 - b["lazy"] / b["original"]),
                   lazy_over_hand=b["lazy"] / b["hand"])
        vrows.append(row)
        vtable.append([n, P, b["original"], f"{b['hand']:.4f} ({row['hand_improvement_pct']:.1f}%)",
                       f"{b['lazy']:.4f} ({row['lazy_improvement_pct']:.1f}%)", row["lazy_over_hand"]])
    s64row = dict(separate_us=s64["separate"] * 1e6, packed_us=s64["packed"] * 1e6, lazy_us=s64["lazy"] * 1e6,
                  python_floor_us=s64["python_floor"] * 1e6,
                  separate_over_lazy=s64["separate"] / s64["lazy"], lazy_over_packed=s64["lazy"] / s64["packed"],
                  separate_over_python_floor=s64["separate"] / s64["python_floor"])
    big = vrows[-1]
    checks = [
        target("64 scalars: separate Allreduce time / lazy time", s64row["separate_over_lazy"], 5.0),
        target(f"variance N=M={big['N']}: lazy time / hand-fused time", big["lazy_over_hand"], 1.3,
               higher_is_better=False),
        target("synthetic step: lazy collectives per step", pk["lazy_collectives_per_step"], 3.0,
               higher_is_better=False),
    ]
    from nbmpi.workers.fused_reductions import IMPLEMENTATION, engine

    direct = engine().direct_mpi
    md = (f"P = {P} ranks. Times are the best of {rounds} interleaved rounds (slowest rank). "
          f"Shared-variable hot path: {IMPLEMENTATION} (`NBMPI_PURE_PYTHON=1` selects the pure-Python "
          f"reference); force point calls MPI_Start/MPI_Test {'directly' if direct else 'through mpi4py'}."
          "\n\n"
          "## Variance (seed Table 1 shape), seconds for the whole N x M program (improvement over original)\n\n"
          + md_table(["N=M", "P", "original", "hand-fused", "lazy shared", "lazy / hand"], vtable)
          + "\n\n## 64 scalar reductions (per round of 64)\n\n"
          + md_table(["64 x Allreduce (us)", "1 packed Allreduce (us)", "lazy (us)", "separate / lazy",
                      "lazy / packed", "Python floor (us)", "separate / floor"],
                     [[s64row["separate_us"], s64row["packed_us"], s64row["lazy_us"],
                       s64row["separate_over_lazy"], s64row["lazy_over_packed"], s64row["python_floor_us"],
                       s64row["separate_over_python_floor"]]])
          + "\n\nPython floor: the lazy loop's calls (`reset()`, `+=`, `float()` on 64 objects) with "
            "methods that do nothing and no communication; `separate / floor` bounds what any "
            "per-variable Python implementation of this loop can reach."
          + "\n\n## Synthetic plankton step (4 modules, 27 reductions, 3 reads)\n\n"
          + md_table(["method", "collectives / step", "time / step (ms)"],
                     [["original", pk["original_collectives_per_step"], pk["original_s_per_step"] * 1e3],
                      ["lazy", pk["lazy_collectives_per_step"], pk["lazy_s_per_step"] * 1e3]])
          + "\n\n## Targets\n\n" + targets_table(checks))
    data = dict(benchmark="fused_reductions", quick=quick, nranks=P, implementation=IMPLEMENTATION,
                direct_mpi=direct, variance=vrows, scalars64=s64row, plankton=pk, targets=checks)
    path = write_results("fused_reductions_quick" if quick else "fused_reductions", data, md, out_dir)
    print(md)
    print(f"\nwrote {path} and {path.with_suffix('.md')}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds (smoke test)")
    p.add_argument("--out-dir", default=None, help="where to write JSON/markdown (default benchmarks/results)")
    p.add_argument("-n", "--nranks", type=int, default=2, help="ranks to launch when started without MPI")
    a = p.parse_args(argv)
    if os.environ.get("NBMPI_STATUS_DIR") or os.environ.get("PMI_RANK") is not None:
        return mpi_main(a.quick, a.out_dir)
    from nbmpi.workers.launcher import run

    args = [__file__] + (["--quick"] if a.quick else []) + (["--out-dir", a.out_dir] if a.out_dir else [])
    return run(a.nranks, args)


if __name__ == "__main__":
    sys.exit(main())
