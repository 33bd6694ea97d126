"""Fused reductions benchmark: lazy shared variables against explicit MPI, compiled and pure Python side by side.

One command::

    python benchmarks/fused_reductions.py [--quick] [-n 2]

It runs the same parts twice, each in its own MPI job of ``n`` ranks: with the
compiled core (what ``pip install`` builds) and with the pure-Python reference
(``NBMPI_PURE_PYTHON=1``), so the compiled part shows what it earns. Inside a
job every method of a part is interleaved each round, in a fresh order per
round; times are the best round (slowest rank), and the first call of each
method (cold: the fuser's first force point connects it) is reported apart.

Parts:

* variance (seed Table 1 shape, N x M data, N = M, each rank sums its M/P
  columns): ``original`` (two ``Allreduce`` per row), ``hand`` (one packed
  ``Allreduce`` of 2 values), ``lazy`` (shared variables, force at
  ``var[i] = (s2 - s1*s1/N)/(N-1)``). Results are checked equal.
* 64 scalar reductions: 64 separate ``Allreduce`` vs one packed ``Allreduce``
  vs 64 lazy shared variables read back, reused with ``reset()`` and created
  inside the loop (``xs = [shared(0.0) for _ in range(64)]``), and the
  interpreter's floor for the reused loop (the same calls on objects whose
  methods do nothing).
* synthetic plankton step: four modules make 27 reductions (sums, min, max,
  product, array sums and a bounded nutrient consume) between 3 reads;
  ``original`` does one collective per reduction, ``lazy`` uses shared
  variables created in the step. Collectives per step are counted from the
  trace for both. Besides the measured times it reports a *model* of a real
  network: each collective costs a stated latency ``D`` more (measured time
  plus collectives x D), and the latency from which lazy wins.

``nbmpi run -n P benchmarks/fused_reductions.py`` runs one part set in the
current environment and prints its numbers (the launcher runs it twice, compiled
and pure Python, with the hidden ``--mpi-part FILE``).

Writes ``benchmarks/results/fused_reductions[_quick].json`` and ``.md`` with
PASS/FAIL of the issues' targets computed from the measured numbers; every
result records the commit and the load average it was measured at.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: per-collective network latencies (seconds) of the modelled network: stated, not measured here
#: (small-message allreduce: about 1-5 us on InfiniBand/Slingshot at small node counts, tens of us
#: over TCP/Ethernet or across many nodes)
MODEL_LATENCIES = (1e-6, 5e-6, 20e-6, 100e-6)


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _timeit(comm, fn, iters: int) -> float:
    from mpi4py import MPI

    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    return comm.allreduce(dt, op=MPI.MAX)


def _interleaved(comm, methods: dict, iters: dict, rounds: int, seed: int):
    """(best time per call, first call's time) of each method, slowest rank."""
    from nbmpi.workers import get_tracer

    best = {m: float("inf") for m in methods}
    first = {m: _timeit(comm, f, 1) for m, f in methods.items()}   # cold: the first call
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        for m in rng.permutation(list(methods)):
            best[m] = min(best[m], _timeit(comm, methods[m], iters[m]))
            get_tracer().clear()
    return best, first


# --------------------------------------------------------------------------- variance
def variance(comm, n: int, rounds: int):
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

    best, first = _interleaved(comm, dict(original=original, hand=hand, lazy=lazy),
                               dict(original=1, hand=1, lazy=1), rounds, n)
    ref = a.var(axis=1, ddof=1)
    for k, v in out.items():
        if not np.allclose(v, ref, rtol=1e-9, atol=1e-12):
            raise SystemExit(f"variance: method {k} computed wrong values")
    return best, first


# --------------------------------------------------------------------------- 64 scalars
def scalars64(comm, rounds: int, iters: int):
    from mpi4py import MPI

    from nbmpi.workers import shared

    rank = comm.Get_rank()
    vals = np.arange(64.0) + rank
    vlist = vals.tolist()
    o_sep, o_pack, o_lazy, o_create = np.empty(64), np.empty(64), np.empty(64), np.empty(64)
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

    def create():
        xs = [shared(0.0) for _ in range(64)]
        for v, x in zip(xs, vlist):
            v += x
        for k, v in enumerate(xs):
            o_create[k] = float(v)

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

    def python_floor_create():
        xs = [_NoOp() for _ in range(64)]
        for v, x in zip(xs, vlist):
            v += x
        for k, v in enumerate(xs):
            o_floor[k] = float(v)

    methods = dict(separate=separate, packed=packed, lazy=lazy, create=create, python_floor=python_floor,
                   python_floor_create=python_floor_create)
    best, first = _interleaved(comm, methods, {m: iters for m in methods}, rounds, 64)
    if not all(np.array_equal(o_sep, o) for o in (o_pack, o_lazy, o_create)):
        raise SystemExit("64 scalars: methods disagree")
    return best, first


# --------------------------------------------------------------------------- synthetic plankton step
LAYERS = 64


PLANKTON_SUMS_MOVE = ("biomass", "sdepth", "sdepth2", "moved")
PLANKTON_SUMS_ENERGY = ("tlight", "photo", "resp")
PLANKTON_SUMS_NUT = ("n1", "n2", "n3", "n4")
PLANKTON_SUMS_EVOLVE = ("births", "deaths", "msize", "pop")


class _Reducer:
    """The original method's reductions: one ``Allreduce`` each, recorded in the trace when ``traced``
    (so that its collectives are counted like the lazy method's)."""

    def __init__(self, comm, traced: bool, kind: int) -> None:
        from mpi4py import MPI

        from nbmpi.workers import get_tracer
        from nbmpi.workers.tracing.tracer import DIR_NONE

        self.SUM, self.MIN, self.MAX, self.PROD = MPI.SUM, MPI.MIN, MPI.MAX, MPI.PROD
        self.dir_none = DIR_NONE
        self.comm, self.traced, self.kind, self.tr = comm, traced, kind, get_tracer()
        self.one, self.res = np.empty(1), np.empty(1)
        self.arr_res = np.empty(LAYERS)

    def allreduce(self, x, out, op) -> None:
        """Collective: ``Allreduce(x, out, op)``, traced if asked."""
        if not self.traced:
            self.comm.Allreduce(x, out, op=op)
            return
        t0 = time.perf_counter_ns()
        self.comm.Allreduce(x, out, op=op)
        self.tr.record(self.kind, self.dir_none, -1, 0, out.nbytes, t0, time.perf_counter_ns(), -1, 0, 0, 1)

    def red(self, x: float, op=None) -> float:
        """Collective: the reduction (``op``, default sum) of one float."""
        self.one[0] = x
        self.allreduce(self.one, self.res, self.SUM if op is None else op)
        return float(self.res[0])

    def red_arr(self, x):
        """Collective: the sum over ranks of a per-layer array (a copy)."""
        self.allreduce(x, self.arr_res, self.SUM)
        return self.arr_res.copy()


class _Plankton:
    """The synthetic plankton step on one rank: its particles and both methods (``original``: one collective
    per reduction; ``lazy``: shared variables), each storing its reads per step in ``results``."""

    def __init__(self, comm, steps: int) -> None:
        from nbmpi.workers import pool, shared
        from nbmpi.workers.tracing.tracer import register_kind

        self.pool, self.shared = pool, shared
        self.k_allreduce = register_kind("allreduce")
        self.comm = comm
        self.rank = comm.Get_rank()
        rng = np.random.default_rng(7 + self.rank)
        self.npart = 2000
        self.depth = rng.random(self.npart) * LAYERS
        self.mass = rng.random(self.npart)
        self.nsteps = steps
        self.results = {}

    def quantities(self, step: int) -> dict:
        """The 27 local quantities of ``step``, computed identically by both methods."""
        rank, mass, npart = self.rank, self.mass, self.npart
        d = (self.depth + 0.01 * step) % LAYERS
        lay = np.minimum(d.astype(np.int64), LAYERS - 1)
        counts = np.bincount(lay, minlength=LAYERS).astype(np.float64)
        return dict(
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

    def original(self, traced: bool = False) -> None:
        """Collective: every step with one ``Allreduce`` per reduction (traced if asked)."""
        reducer = _Reducer(self.comm, traced, self.k_allreduce)
        outs = []
        nutrient = 1000.0
        for step in range(self.nsteps):
            reads, nutrient = self._original_step(self.quantities(step), reducer, nutrient)
            outs.append(reads)
        self.results["original"] = outs

    @staticmethod
    def _original_step(q: dict, r: _Reducer, nutrient: float):
        """Collective: one step of the original method; returns ``((read 1, read 2, read 3), nutrient left)``."""
        g = {}
        # Move
        g["counts"] = r.red_arr(q["counts"])
        for k in PLANKTON_SUMS_MOVE:
            g[k] = r.red(q[k])
        g["mindepth"] = r.red(q["mindepth"], r.MIN)
        g["maxdepth"] = r.red(q["maxdepth"], r.MAX)
        # Energy
        g["light"] = r.red_arr(q["light"])
        for k in PLANKTON_SUMS_ENERGY:
            g[k] = r.red(q[k])
        g["maxlight"] = r.red(q["maxlight"], r.MAX)
        g["survival"] = r.red(q["survival"], r.PROD)
        r1 = g["tlight"] * g["survival"]  # read 1
        # Nutrients
        total = r.red(q["request"])
        avail = max(nutrient - 0.0, 0.0)
        scale = 1.0 if total <= avail else avail / total
        grant = q["request"] * scale
        nutrient = nutrient - total if total <= avail else 0.0
        g["uptake"] = r.red_arr(q["uptake"])
        for k in PLANKTON_SUMS_NUT:
            g[k] = r.red(q[k])
        g["n5"] = r.red(q["n5"], r.MIN)
        g["n6"] = r.red(q["n6"], r.MAX)
        r2 = nutrient + grant + g["n4"]  # read 2
        # Evolve
        for k in PLANKTON_SUMS_EVOLVE:
            g[k] = r.red(q[k])
        g["maxage"] = r.red(q["maxage"], r.MAX)
        g["minage"] = r.red(q["minage"], r.MIN)
        r3 = g["births"] - g["deaths"] + g["maxage"] + float(g["counts"].sum())  # read 3
        return (r1, r2, r3), nutrient

    def lazy(self) -> None:
        """Collective: every step with shared variables created in the step (a nutrient pool across steps)."""
        outs = []
        nutrient = self.pool(1000.0)
        for step in range(self.nsteps):
            outs.append(self._lazy_step(self.quantities(step), nutrient))
        self.results["lazy"] = outs

    def _lazy_step(self, q: dict, nutrient):
        """Collective: one step of the lazy method; returns ``(read 1, read 2, read 3)``."""
        shared = self.shared
        g = {k: shared(0.0) for k in PLANKTON_SUMS_MOVE + PLANKTON_SUMS_ENERGY + PLANKTON_SUMS_NUT
             + PLANKTON_SUMS_EVOLVE}
        counts, light, uptake = shared(np.zeros(LAYERS)), shared(np.zeros(LAYERS)), shared(np.zeros(LAYERS))
        mind, maxd, maxl = shared(np.inf), shared(-np.inf), shared(-np.inf)
        surv, n5, n6 = shared(1.0), shared(np.inf), shared(-np.inf)
        maxage, minage = shared(-np.inf), shared(np.inf)
        # Move
        counts += q["counts"]
        for k in PLANKTON_SUMS_MOVE:
            g[k] += q[k]
        mind.min_with(q["mindepth"])
        maxd.max_with(q["maxdepth"])
        # Energy
        light += q["light"]
        for k in PLANKTON_SUMS_ENERGY:
            g[k] += q[k]
        maxl.max_with(q["maxlight"])
        surv *= q["survival"]
        r1 = float(g["tlight"] * surv)  # read 1
        # Nutrients
        grant = nutrient.consume(q["request"], floor=0.0)
        uptake += q["uptake"]
        for k in PLANKTON_SUMS_NUT:
            g[k] += q[k]
        n5.min_with(q["n5"])
        n6.max_with(q["n6"])
        r2 = float(nutrient) + float(grant) + float(g["n4"])  # read 2
        # Evolve
        for k in PLANKTON_SUMS_EVOLVE:
            g[k] += q[k]
        maxage.max_with(q["maxage"])
        minage.min_with(q["minage"])
        return r1, r2, float(g["births"] - g["deaths"] + maxage) + float(np.asarray(counts).sum())  # read 3

    def count_collectives(self) -> dict:
        """Collective: collectives per step of each method, counted from the trace (an extra untimed run each)."""
        from nbmpi.workers import get_tracer
        from nbmpi.workers.fused_reductions import K_FUSED

        tr = get_tracer()
        counted = {}
        for name, run, kind in (("original", lambda: self.original(traced=True), self.k_allreduce),
                                ("lazy", self.lazy, K_FUSED)):
            tr.clear()
            self.comm.Barrier()
            run()
            counted[name] = int(np.sum(tr.events()[:, 0] == kind)) / self.nsteps
        tr.clear()
        return counted


def plankton(comm, rounds: int, steps: int) -> dict:
    """Collective: the synthetic plankton step, original and lazy interleaved over ``rounds`` (``steps`` steps
    a call), results checked equal, collectives per step counted from the trace. Returns the figures."""
    pk = _Plankton(comm, steps)
    best, first = _interleaved(comm, dict(original=pk.original, lazy=pk.lazy), dict(original=1, lazy=1), rounds, 27)
    if not np.allclose(np.array(pk.results["original"]), np.array(pk.results["lazy"]), rtol=1e-12):
        raise SystemExit("plankton: lazy results differ from the original")
    counted = pk.count_collectives()
    nsteps = steps
    return dict(original_s_per_step=best["original"] / nsteps, lazy_s_per_step=best["lazy"] / nsteps,
                original_first_s_per_step=first["original"] / nsteps, lazy_first_s_per_step=first["lazy"] / nsteps,
                original_collectives_per_step=counted["original"], lazy_collectives_per_step=counted["lazy"],
                reductions_per_step=27)


# --------------------------------------------------------------------------- one implementation (MPI job)
def mpi_part(quick: bool) -> dict:
    """Every part with the implementation this process runs; the dict on rank 0, None elsewhere."""
    from nbmpi.workers import world
    from nbmpi.workers.fused_reductions import IMPLEMENTATION, fuser

    comm = world()
    rank, P = comm.Get_rank(), comm.Get_size()
    load_start = _loadavg()
    sizes = [100, 200] if quick else [500, 1000, 1500, 3000]
    rounds = 2 if quick else 5
    var = {}
    for n in sizes:
        var[n] = variance(comm, n, rounds)
        if rank == 0:
            print(f"  [{IMPLEMENTATION}] variance N=M={n} done", file=sys.stderr, flush=True)
    s64, s64_first = scalars64(comm, rounds, 20 if quick else 300)
    pk = plankton(comm, rounds, 3 if quick else 30)
    if rank != 0:
        return None
    vrows = []
    for n in sizes:
        b, f = var[n]
        vrows.append(dict(N=n, M=n, P=P, original_s=b["original"], hand_s=b["hand"], lazy_s=b["lazy"],
                          lazy_first_s=f["lazy"], hand_improvement_pct=100 * (1 - b["hand"] / b["original"]),
                          lazy_improvement_pct=100 * (1 - b["lazy"] / b["original"]),
                          lazy_over_hand=b["lazy"] / b["hand"]))
    us = {k: v * 1e6 for k, v in s64.items()}
    s64row = dict(separate_us=us["separate"], packed_us=us["packed"], lazy_us=us["lazy"], create_us=us["create"],
                  python_floor_us=us["python_floor"], python_floor_create_us=us["python_floor_create"],
                  separate_over_python_floor_create=s64["separate"] / s64["python_floor_create"],
                  lazy_first_us=s64_first["lazy"] * 1e6,
                  create_first_us=s64_first["create"] * 1e6,
                  separate_over_lazy=s64["separate"] / s64["lazy"],
                  separate_over_create=s64["separate"] / s64["create"],
                  create_over_lazy=s64["create"] / s64["lazy"], lazy_over_packed=s64["lazy"] / s64["packed"],
                  separate_over_python_floor=s64["separate"] / s64["python_floor"])
    e = fuser()
    return dict(implementation=IMPLEMENTATION, direct_mpi=e.direct_mpi, compiled_op=e.compiled_op, nranks=P,
                variance=vrows, scalars64=s64row, plankton=pk, loadavg_start=load_start, loadavg_end=_loadavg())


# --------------------------------------------------------------------------- report
def _model(pk: dict) -> list:
    """The plankton step on a modelled network: measured time + collectives x D per stated latency D."""
    rows = []
    for d in MODEL_LATENCIES:
        o = pk["original_s_per_step"] + pk["original_collectives_per_step"] * d
        lz = pk["lazy_s_per_step"] + pk["lazy_collectives_per_step"] * d
        rows.append(dict(latency_us=d * 1e6, original_ms=o * 1e3, lazy_ms=lz * 1e3, lazy_over_original=lz / o))
    return rows


def _break_even_us(pk: dict) -> float:
    """The per-collective latency from which the lazy step is faster (0: already on this machine)."""
    gap = pk["lazy_s_per_step"] - pk["original_s_per_step"]
    fewer = pk["original_collectives_per_step"] - pk["lazy_collectives_per_step"]
    if gap <= 0:
        return 0.0
    return gap / fewer * 1e6 if fewer > 0 else float("inf")


def evaluate_targets(c: dict, p: dict, speedup: float) -> list:
    """The issues' targets, computed from the compiled run ``c`` (and ``speedup``: pure Python / compiled)."""
    from reporting import target

    big_c, sc, pkc = c["variance"][-1], c["scalars64"], c["plankton"]
    built = c["implementation"] == "compiled"
    return [
        target("64 scalars, reused (reset): separate Allreduce time / lazy time", sc["separate_over_lazy"], 5.0),
        target("64 scalars, created in the loop: separate Allreduce time / lazy time", sc["separate_over_create"],
               5.0),
        target("64 scalars: created in the loop time / reused time", sc["create_over_lazy"], 2.0,
               higher_is_better=False),
        target("64 scalars, reused: pure-Python time / compiled time" + ("" if built else
               " (the compiled part was not built: both runs were pure Python)"), speedup if built else 0.0, 1.5),
        target(f"variance N=M={big_c['N']}: lazy time / hand-fused time", big_c["lazy_over_hand"], 1.3,
               higher_is_better=False),
        target("synthetic step: lazy collectives per step", pkc["lazy_collectives_per_step"], 3.0,
               higher_is_better=False),
        target("synthetic step: lazy time / original time (this machine)",
               pkc["lazy_s_per_step"] / pkc["original_s_per_step"], 1.0, higher_is_better=False),
    ]


def same_ratio_rows(c: dict, p: dict) -> list:
    """The targets' ratios with both implementations (information, not targets), one row each."""
    big_c, big_p = c["variance"][-1], p["variance"][-1]
    sc, sp = c["scalars64"], p["scalars64"]
    pkc, pkp = c["plankton"], p["plankton"]
    return [
        ["64 scalars reused: separate / lazy", sc["separate_over_lazy"], sp["separate_over_lazy"]],
        ["64 scalars created in the loop: separate / lazy", sc["separate_over_create"], sp["separate_over_create"]],
        ["64 scalars: created in the loop / reused", sc["create_over_lazy"], sp["create_over_lazy"]],
        [f"variance N=M={big_c['N']}: lazy / hand-fused", big_c["lazy_over_hand"], big_p["lazy_over_hand"]],
        ["synthetic step: lazy / original", pkc["lazy_s_per_step"] / pkc["original_s_per_step"],
         pkp["lazy_s_per_step"] / pkp["original_s_per_step"]],
    ]


def variance_rows(c: dict, p: dict) -> list:
    """The variance table: one row per N = M, both implementations."""
    vtable = []
    for rc, rp in zip(c["variance"], p["variance"]):
        vtable.append([rc["N"], rc["original_s"], rc["hand_s"], rc["lazy_s"], rc["lazy_over_hand"], rp["lazy_s"],
                       rp["lazy_over_hand"], rp["lazy_s"] / rc["lazy_s"]])
    return vtable


def scalars_rows(sc: dict, sp: dict) -> list:
    """The 64-scalars table: one row per method, compiled, pure Python and their ratio."""
    s64t = [[name, s[f"{k}_us"] if f"{k}_us" in s else None, t[f"{k}_us"] if f"{k}_us" in t else None]
            for name, k, s, t in (("64 x Allreduce", "separate", sc, sp), ("1 packed Allreduce", "packed", sc, sp),
                                  ("lazy, reused (reset)", "lazy", sc, sp),
                                  ("lazy, created in the loop", "create", sc, sp),
                                  ("Python floor of the reused loop", "python_floor", sc, sp),
                                  ("Python floor of the created loop", "python_floor_create", sc, sp),
                                  ("lazy, reused: first call", "lazy_first", sc, sp),
                                  ("lazy, created: first call", "create_first", sc, sp))]
    for row in s64t:
        row.append(row[2] / row[1] if row[1] else None)
    return s64t


def plankton_rows(pkc: dict, pkp: dict) -> list:
    """The plankton table: original and lazy, collectives and times per step."""
    return [["original (1 collective per reduction)", pkc["original_collectives_per_step"],
             pkc["original_s_per_step"] * 1e3, pkp["original_s_per_step"] * 1e3,
             pkc["original_first_s_per_step"] * 1e3],
            ["lazy (shared variables)", pkc["lazy_collectives_per_step"], pkc["lazy_s_per_step"] * 1e3,
             pkp["lazy_s_per_step"] * 1e3, pkc["lazy_first_s_per_step"] * 1e3]]


def markdown(c: dict, p: dict, checks: list, model_c: list, quick: bool) -> str:
    """The markdown report: how it ran, the targets, the ratio, 64-scalars, variance, plankton and model tables."""
    from reporting import md_table, targets_table

    sc, pkc = c["scalars64"], c["plankton"]
    cols = ["method", "collectives / step (trace)", "compiled: time / step (ms)", "pure Python: time / step (ms)",
            "compiled: first step (ms)"]
    impl_line = (f"compiled run: implementation `{c['implementation']}`, force point calls MPI_Start/MPI_Test "
                 f"{'directly' if c['direct_mpi'] else 'through mpi4py'}, general fusions combine "
                 f"{'in C (numba cfunc MPI operation)' if c['compiled_op'] else 'through a Python callback'}; "
                 f"pure-Python run: implementation `{p['implementation']}`.")
    return (f"P = {c['nranks']} ranks. Each implementation ran in its own MPI job; inside a job the methods of a "
            f"part are interleaved, times are the best of {'2' if quick else '5'} rounds (slowest rank), first calls "
            f"apart. " + impl_line + f" Load average at the start / end of each run: compiled {c['loadavg_start']} / "
            f"{c['loadavg_end']}, pure Python {p['loadavg_start']} / {p['loadavg_end']}."
            "\n\n## Targets\n\n" + targets_table(checks)
            + "\n\nThe same ratios with the pure-Python implementation (information, not targets):\n\n"
            + md_table(["ratio", "compiled", "pure Python"], same_ratio_rows(c, p))
            + "\n\n## 64 scalar reductions (us per round of 64)\n\n"
            + md_table(["method", "compiled", "pure Python", "pure Python / compiled"],
                       scalars_rows(sc, p["scalars64"]))
            + "\n\nPython floor: the same loop's calls (`reset()`, `+=`, `float()` on 64 objects; created: "
              "making the 64 objects too) on Python objects whose methods do nothing, no communication. "
              f"64 x Allreduce / floor: reused {sc['separate_over_python_floor']:.2f}x, created "
              f"{sc['separate_over_python_floor_create']:.2f}x (compiled run), the ratio the loop would reach if "
              "each shared variable cost what an empty Python object costs. Created in the loop: "
              "`xs = [shared(0.0) for _ in range(64)]; xs[k] += v; float(x)` each round."
            + "\n\n## Variance (seed Table 1 shape), seconds for the whole N x M program\n\n"
            + md_table(["N=M", "original", "hand-fused", "lazy (compiled)", "lazy / hand (compiled)",
                        "lazy (pure Python)", "lazy / hand (pure Python)", "pure Python / compiled"],
                       variance_rows(c, p))
            + "\n\n## Synthetic plankton step (4 modules, 27 reductions, 3 reads)\n\n"
            + md_table(cols, plankton_rows(pkc, p["plankton"]))
            + "\n\n### Modelled network (a model, not a measurement)\n\nEach collective costs a stated latency D "
              "more than on this machine (shared memory): time per step = measured time + collectives per step "
              "x D, compiled run. D is stated, not measured: about 1-5 us for a small allreduce on "
              "InfiniBand/Slingshot at small node counts, tens of us over TCP/Ethernet or across many nodes.\n\n"
            + md_table(["D (us, stated)", "original (ms)", "lazy (ms)", "lazy / original"],
                       [[r["latency_us"], r["original_ms"], r["lazy_ms"], r["lazy_over_original"]] for r in model_c])
            + f"\n\nLazy is faster from D = {_break_even_us(pkc):.2f} us per collective on (0: already on this "
              "machine).")


def report(parts: dict, quick: bool, out_dir) -> Path:
    """Evaluate the targets of both runs, write ``fused_reductions[_quick].json`` and ``.md`` and print the
    markdown. Returns the JSON file's path."""
    from reporting import write_results

    c, p = parts["compiled"], parts["python"]
    speedup = p["scalars64"]["lazy_us"] / c["scalars64"]["lazy_us"]
    checks = evaluate_targets(c, p, speedup)
    model_c = _model(c["plankton"])
    md = markdown(c, p, checks, model_c, quick)
    data = dict(benchmark="fused_reductions", quick=quick, nranks=c["nranks"], compiled=c, python=p,
                pure_python_over_compiled_64=speedup, plankton_model=model_c,
                plankton_break_even_us=_break_even_us(c["plankton"]), targets=checks)
    path = write_results("fused_reductions_quick" if quick else "fused_reductions", data, md, out_dir)
    print(md)
    print(f"\nwrote {path} and {path.with_suffix('.md')}")
    return path


def main(argv=None) -> int:
    from mpi_part import add_part_option, run_part
    from reporting import benchmark_parser

    p = benchmark_parser(__doc__, "tiny sizes, 2 rounds (smoke test)")
    p.add_argument("-n", "--nranks", type=int, default=2, help="ranks of each MPI job")
    add_part_option(p)
    a = p.parse_args(argv)
    if os.environ.get("NBMPI_STATUS_DIR") or os.environ.get("PMI_RANK") is not None:
        part = mpi_part(a.quick)
        if part is not None:   # rank 0
            if a.mpi_part:
                Path(a.mpi_part).write_text(json.dumps(part))
            else:   # run by hand under nbmpi run: print this implementation's numbers
                print(json.dumps(part, indent=2))
        return 0

    parts = {}
    with tempfile.TemporaryDirectory(prefix="nbmpi-bench-") as tmp:
        for impl, pure in (("compiled", "0"), ("python", "1")):
            rc, parts[impl] = run_part(a.nranks, __file__, Path(tmp) / f"{impl}.json",
                                       ["--quick"] if a.quick else [], env={"NBMPI_PURE_PYTHON": pure})
            if parts[impl] is None:
                print(f"the {impl} run failed", file=sys.stderr)
                return rc or 1
    report(parts, a.quick, a.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
