"""Distributed-arrays benchmark (seed 002, DistNumPy): the seed's NumPy programs run unchanged three ways.

One command (it launches the MPI ranks itself)::

    python benchmarks/distarray.py              # full sizes, 2 and 3 ranks
    python benchmarks/distarray.py --quick      # tiny sizes (smoke test, used by the test suite)

Each program is a plain function of a NumPy-like namespace ``np`` (``numpy`` or
``nbmpi.workers.distarray``) and its input arrays; the source is the same for both:

* **Jacobi stencil** (the seed's Fig. 10, as written in the issue: five views of ``full``,
  ``work = 0.2 * (...)``, ``delta = float(sum(abs(center - work)))`` each step, ``center[:] = work``);
* **Jacobi** (matrix-vector): ``x = (b - R @ x) / d`` with a 2-D block-distributed ``R``;
* **Black-Scholes** (the seed's Fig. 9, with its cumulative normal distribution);
* **Lattice Boltzmann D2Q9** (channel with a cylinder, bounce-back, streaming with ``roll``);
* **N-body** and **kNN** (all pairs, broadcasting against a replicated operand ``x[None, :]``);
* **PRK Stencil** (star, radius 2, reported in GFlop/s) and **PRK Transpose** (``B += A.T; A += 1``,
  in GB/s), written like the Parallel Research Kernels' Python versions.

Ways: **NumPy** in one process (this driver, BLAS limited to one thread like every rank);
**nbmpi** on P ranks with latency hiding; **nbmpi** without it (``evaluate(latency_hiding=False)``:
blocking exchange first, then compute). For each: the first call (kernel compilation and plan
building, with a fresh kernel cache unless ``NBMPI_DISTARRAY_CACHE`` is set) apart from the
steady state (best of interleaved rounds), the speedup over NumPy and each rank's wait % (from
the gathered trace of each measured round; the median over the rounds, split into transfers and
force points). Every distributed result of the first call is checked against NumPy's. Beside the
stencil: a hand-written mpi4py + numba halo-exchange version of the same program (ghost rows,
Isend/Irecv, interior while the halos fly; its waits in ``Waitall`` and ``Allreduce`` timed, the
floor of the program's wait on the machine) and ``dask.array`` on a 2-worker LocalCluster (the
same program, with the persist/setitem that dask's immutable arrays need).

Targets (issue 13, on 2 ranks, computed from the measured numbers, waits as the median over the
rounds): stencil wait % with hiding <= 10 % and at least 3x lower than without (in total, and in
transfers alone); stencil within 1.25x of the hand-written version;
at least 10x faster than dask.array. Results: ``benchmarks/results/distarray.json`` / ``.md``
(``distarray_quick`` with ``--quick``).
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FULL = dict(stencil=(4000, 10), jacobi=(4000, 10), blackscholes=(4_000_000, 3), lbm=((1000, 600), 5),
            nbody=(2000, 2), knn=(2000, 3), prk_stencil=(4000, 10), prk_transpose=(4000, 10),
            rounds=5, dask_iters=3, ranks=(2, 3))
QUICK = dict(stencil=(96, 2), jacobi=(64, 2), blackscholes=(5000, 2), lbm=((40, 24), 2), nbody=(48, 2),
             knn=(48, 2), prk_stencil=(64, 2), prk_transpose=(64, 2), rounds=1, dask_iters=2, ranks=(2,))
PROGRAMS = ("stencil", "jacobi", "blackscholes", "lbm", "nbody", "knn", "prk_stencil", "prk_transpose")
TITLES = dict(stencil="Jacobi stencil (Fig. 10)", jacobi="Jacobi, matrix-vector", blackscholes="Black-Scholes (Fig. 9)",
              lbm="Lattice Boltzmann D2Q9", nbody="N-body", knn="kNN", prk_stencil="PRK Stencil (star r=2)",
              prk_transpose="PRK Transpose")


# =========================================================================== the programs (unchanged NumPy source)
#: Trace kinds of the waits latency hiding can remove (point-to-point transfers of remote blocks) and
#: of the collectives at a force point (a reduction's allgather, the check that ranks agree), whose
#: waits are the ranks' imbalance: hiding cannot remove those.
TRANSFER_KINDS = ("distarray_send", "distarray_recv", "distarray_wait")
FORCE_POINT_KINDS = ("distarray_allgather", "distarray_check")


def ratio_of(without: float, with_: float) -> float:
    """``without / with_``; infinite when only ``with_`` is 0 (hiding removed every wait), NaN when both are."""
    if with_ > 0:
        return without / with_
    return float("inf") if without > 0 else float("nan")


def median_per_rank(rounds) -> list:
    """Rank by rank, the median over rounds (``rounds``: one list per round, one value per rank); robust
    to a round that another process on the machine slowed down."""
    return numpy.median(numpy.array(rounds), axis=0).tolist() if rounds else []


def wait_split(trace) -> dict:
    """Per rank, the wait % in transfers and in force-point collectives (of the trace's window)."""
    from nbmpi.workers.tracing.timeline import analysis

    an = analysis(trace)
    total = an["window_s"] or 1.0
    return {name: [100 * sum(r["wait_by_kind"].get(k, 0.0) for k in kinds) / total for r in an["ranks"]]
            for name, kinds in (("transfers", TRANSFER_KINDS), ("force_point", FORCE_POINT_KINDS))}


def jacobi_stencil(np, full, iters):
    delta = 0.0
    for it in range(iters):
        center = full[1:-1, 1:-1]
        north = full[0:-2, 1:-1]
        south = full[2:, 1:-1]
        west = full[1:-1, 0:-2]
        east = full[1:-1, 2:]
        work = 0.2 * (center + north + south + east + west)
        delta = float(np.sum(np.abs(center - work)))
        center[:] = work
    return delta


def jacobi(np, R, b, d, iters):
    x = np.zeros_like(b)
    delta = 0.0
    for it in range(iters):
        x_new = (b - R @ x) / d
        delta = float(np.max(np.abs(x_new - x)))
        x = x_new
    return delta


def cnd(np, x):
    a1, a2, a3, a4, a5 = 0.31938153, -0.356563782, 1.781477937, -1.821255978, 1.330274429
    L = np.abs(x)
    K = 1.0 / (1.0 + 0.2316419 * L)
    w = 1.0 - 1.0 / np.sqrt(2 * np.pi) * np.exp(-L * L / 2.) * (a1 * K + a2 * K * K + a3 * K ** 3 + a4 * K ** 4 +
                                                                  a5 * K ** 5)
    return np.where(x < 0, 1.0 - w, w)


def black_scholes(np, S, X, T, r, v, iters):
    total = 0.0
    for it in range(iters):
        d1 = (np.log(S / X) + (r + v * v / 2.) * T) / (v * np.sqrt(T))
        d2 = d1 - v * np.sqrt(T)
        call = S * cnd(np, d1) - X * np.exp(-r * T) * cnd(np, d2)
        put = X * np.exp(-r * T) * cnd(np, -d2) - S * cnd(np, -d1)
        total = float(np.sum(call) + np.sum(put))
    return total


LBM_C = ((0, 0), (1, 0), (0, 1), (-1, 0), (0, -1), (1, 1), (-1, 1), (-1, -1), (1, -1))
LBM_W = (4 / 9, 1 / 9, 1 / 9, 1 / 9, 1 / 9, 1 / 36, 1 / 36, 1 / 36, 1 / 36)
LBM_OPP = (0, 3, 4, 1, 2, 7, 8, 5, 6)


def lattice_boltzmann(np, fin, obstacle, omega, iters):
    mass = 0.0
    for it in range(iters):
        rho = fin[0] + fin[1] + fin[2] + fin[3] + fin[4] + fin[5] + fin[6] + fin[7] + fin[8]
        ux = (fin[1] + fin[5] + fin[8] - fin[3] - fin[6] - fin[7]) / rho
        uy = (fin[2] + fin[5] + fin[6] - fin[4] - fin[7] - fin[8]) / rho
        usqr = 1.5 * (ux * ux + uy * uy)
        fout = []
        for i in range(9):
            cx, cy = LBM_C[i]
            cu = 3.0 * (cx * ux + cy * uy)
            feq = rho * LBM_W[i] * (1.0 + cu + 0.5 * cu * cu - usqr)
            fout.append(np.where(obstacle, fin[LBM_OPP[i]], fin[i] - omega * (fin[i] - feq)))
        for i in range(9):
            cx, cy = LBM_C[i]
            fin[i] = np.roll(np.roll(fout[i], cx, axis=0), cy, axis=1)
        mass = float(np.sum(rho))
    return mass


def nbody(np, x, y, z, vx, vy, vz, m, dt, iters):
    for it in range(iters):
        dx = x[None, :] - x[:, None]
        dy = y[None, :] - y[:, None]
        dz = z[None, :] - z[:, None]
        r2 = dx * dx + dy * dy + dz * dz + 0.01
        inv = m[None, :] / (r2 * np.sqrt(r2))
        vx += dt * np.sum(dx * inv, axis=1)
        vy += dt * np.sum(dy * inv, axis=1)
        vz += dt * np.sum(dz * inv, axis=1)
        x += dt * vx
        y += dt * vy
        z += dt * vz
    return float(np.sum(x * x + y * y + z * z))


def knn(np, x, y, k, iters):
    total = 0.0
    for it in range(iters):
        d = (x[:, None] - x[None, :]) ** 2 + (y[:, None] - y[None, :]) ** 2
        d = np.where(d == 0.0, np.inf, d)
        for j in range(k):
            m = np.min(d, axis=1)
            d = np.where(d == m[:, None], np.inf, d)
        total = float(np.sum(np.sqrt(m)))
    return total


def prk_stencil(np, A, B, W, r, iters):
    n = A.shape[0]
    b = n - r
    for it in range(iters):
        B[r:b, r:b] += W[r, r] * A[r:b, r:b]
        for s in range(1, r + 1):
            B[r:b, r:b] += W[r, r - s] * A[r:b, r - s:b - s] + W[r, r + s] * A[r:b, r + s:b + s] \
                + W[r - s, r] * A[r - s:b - s, r:b] + W[r + s, r] * A[r + s:b + s, r:b]
        A += 1.0
    return float(np.sum(np.abs(B)))


def prk_transpose(np, A, B, iters):
    for it in range(iters):
        B += A.T
        A += 1.0
    return float(np.sum(B))


# =========================================================================== inputs (same values for every way)
def make_inputs(name: str, size, seed: int = 2024) -> dict:
    """NumPy inputs of program ``name`` (every rank and the driver build the same ones)."""
    rng = numpy.random.default_rng(seed)
    if name == "stencil":
        return dict(full=rng.random((size, size)))
    if name == "jacobi":
        n = size
        R = rng.random((n, n)) / n
        return dict(R=R, b=rng.random(n), d=2.0 + rng.random(n))
    if name == "blackscholes":
        n = size
        return dict(S=rng.uniform(10, 50, n), X=rng.uniform(10, 50, n), T=rng.uniform(0.1, 2.0, n), r=0.02, v=0.3)
    if name == "lbm":
        nx, ny = size
        u0 = 0.04
        fin = []
        for i in range(9):
            cx, cy = LBM_C[i]
            cu = 3.0 * cx * u0
            fin.append(LBM_W[i] * (1.0 + cu + 0.5 * cu * cu - 1.5 * u0 * u0) * (1.0 + 0.01 * rng.random((nx, ny))))
        xx, yy = numpy.meshgrid(numpy.arange(nx), numpy.arange(ny), indexing="ij")
        obstacle = (xx - nx / 4) ** 2 + (yy - ny / 2) ** 2 < (ny / 9) ** 2
        return dict(fin=fin, obstacle=obstacle, omega=1.0 / (3 * 0.02 + 0.5))
    if name == "nbody":
        n = size
        return dict(x=rng.random(n), y=rng.random(n), z=rng.random(n), vx=numpy.zeros(n), vy=numpy.zeros(n),
                    vz=numpy.zeros(n), m=rng.uniform(0.5, 1.0, n) / n, dt=1e-4)
    if name == "knn":
        n = size
        return dict(x=rng.random(n), y=rng.random(n), k=4)
    if name == "prk_stencil":
        n, r = size, 2
        W = numpy.zeros((2 * r + 1, 2 * r + 1))
        for s in range(1, r + 1):
            W[r, r + s] = W[r + s, r] = 1.0 / (2 * s * r)
            W[r, r - s] = W[r - s, r] = -1.0 / (2 * s * r)
        ii, jj = numpy.meshgrid(numpy.arange(n), numpy.arange(n), indexing="ij")
        return dict(A=(ii + jj).astype(numpy.float64), B=numpy.zeros((n, n)), W=W, r=r)
    if name == "prk_transpose":
        n = size
        return dict(A=numpy.arange(n * n, dtype=numpy.float64).reshape(n, n), B=numpy.zeros((n, n)))
    raise ValueError(name)


def run_program(name: str, np, arrays: dict, iters: int):
    """Run program ``name`` on namespace ``np`` with ``arrays`` (already converted)."""
    a = arrays
    if name == "stencil":
        return jacobi_stencil(np, a["full"], iters)
    if name == "jacobi":
        return jacobi(np, a["R"], a["b"], a["d"], iters)
    if name == "blackscholes":
        return black_scholes(np, a["S"], a["X"], a["T"], a["r"], a["v"], iters)
    if name == "lbm":
        return lattice_boltzmann(np, a["fin"], a["obstacle"], a["omega"], iters)
    if name == "nbody":
        return nbody(np, a["x"], a["y"], a["z"], a["vx"], a["vy"], a["vz"], a["m"], a["dt"], iters)
    if name == "knn":
        return knn(np, a["x"], a["y"], a["k"], iters)
    if name == "prk_stencil":
        return prk_stencil(np, a["A"], a["B"], a["W"], a["r"], iters)
    return prk_transpose(np, a["A"], a["B"], iters)


def work_units(name: str, size, iters: int) -> float:
    """Flops (PRK Stencil) or bytes (PRK Transpose) of ``iters`` iterations, as the PRK count them."""
    if name == "prk_stencil":
        n, r = size, 2
        return (2 * (4 * r + 1) + 1) * (n - 2 * r) ** 2 * iters
    if name == "prk_transpose":
        return 2.0 * 8 * size * size * iters
    return 0.0


def copy_inputs(inp: dict) -> dict:
    return {k: ([x.copy() for x in v] if isinstance(v, list) else v.copy() if isinstance(v, numpy.ndarray) else v)
            for k, v in inp.items()}


# =========================================================================== NumPy in one process
def bench_numpy(cfg: dict, rounds: int) -> dict:
    out = {}
    for name in PROGRAMS:
        size, iters = cfg[name]
        inp = make_inputs(name, size)
        arrays = copy_inputs(inp)
        t0 = time.perf_counter()
        check = run_program(name, numpy, arrays, 1)
        first = time.perf_counter() - t0
        best = float("inf")
        for _ in range(rounds):
            arrays = copy_inputs(inp)
            t0 = time.perf_counter()
            run_program(name, numpy, arrays, iters)
            best = min(best, (time.perf_counter() - t0) / iters)
        out[name] = dict(first_s=first, per_iter_s=best, check=check, iters=iters, size=size)
    return out


# =========================================================================== dask.array (2 local workers)
def dask_stencil(da, full, iters):
    """The stencil on dask arrays: dask arrays are immutable graphs, so the views are re-sliced each step,
    ``center[:] = work`` becomes an assignment into ``full``, and results are persisted (without that,
    every step would recompute the whole history)."""
    delta = 0.0
    for it in range(iters):
        center = full[1:-1, 1:-1]
        north = full[0:-2, 1:-1]
        south = full[2:, 1:-1]
        west = full[1:-1, 0:-2]
        east = full[1:-1, 2:]
        work = (0.2 * (center + north + south + east + west)).persist()
        delta = float(da.sum(da.abs(center - work)))
        full[1:-1, 1:-1] = work
        full = full.persist()
    return delta, full


def _stencil_rows(size: int, lo: int, hi: int, seed: int = 2024):
    """Rows [lo, hi) of ``make_inputs('stencil', size)['full']``, generated where they are needed (the
    PCG64 stream jumped ahead), so dask workers build their chunks without shipping the array."""
    bg = numpy.random.PCG64(seed)
    bg.advance(lo * size)
    return numpy.random.Generator(bg).random((hi - lo, size))


def bench_dask(cfg: dict, rounds: int) -> dict:
    import dask
    import dask.array as da
    from dask.distributed import Client, LocalCluster, wait

    size, _ = cfg["stencil"]
    iters = cfg["dask_iters"]
    half = -(-size // 2)

    def dask_input():
        blocks = [da.from_delayed(dask.delayed(_stencil_rows)(size, lo, min(size, lo + half)),
                                  shape=(min(size, lo + half) - lo, size), dtype=numpy.float64)
                  for lo in range(0, size, half)]
        return da.concatenate(blocks, axis=0).persist()

    t_start = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        startup = time.perf_counter() - t_start
        client.wait_for_workers(2)
        full = dask_input()
        t0 = time.perf_counter()
        check, full = dask_stencil(da, full, 1)
        first = time.perf_counter() - t0
        best = float("inf")
        for _ in range(rounds):
            full = dask_input()
            wait(full)
            t0 = time.perf_counter()
            dask_stencil(da, full, iters)
            best = min(best, (time.perf_counter() - t0) / iters)
    return dict(first_s=first, per_iter_s=best, check=check, iters=iters, workers=2, cluster_start_s=startup)


# =========================================================================== MPI part (runs on every rank)
def _hw_kernels():
    import numba

    @numba.njit(nogil=True, cache=True)
    def rows(u, v, lo, hi):  # pragma: no cover - compiled
        d = 0.0
        m = u.shape[1]
        for i in range(lo, hi):
            for j in range(1, m - 1):
                w = 0.2 * (u[i, j] + u[i - 1, j] + u[i + 1, j] + u[i, j + 1] + u[i, j - 1])
                v[i, j] = w
                d += abs(u[i, j] - w)
        return d

    return rows


def handwritten_stencil(comm, u, v, first_row: int, n: int, iters: int, kernel, chunk_rows: int = 0):
    """The same Jacobi stencil written by hand with mpi4py + numba on a block distribution: ``u`` and ``v``
    hold this rank's rows plus one ghost row above and below (double buffering). Each step posts the halo
    receives and sends, updates the rows that need no ghost while they fly, waits, updates the two edge
    rows, sums the deltas with one Allreduce and swaps the buffers (no copy back).

    ``chunk_rows`` > 0: the interior is updated in chunks of that many rows with ``MPI_Testall`` on the halo
    requests between them. MPICH has no progress thread here, so over a network netmod (ofi/tcp) a halo
    moves only while some call is inside MPI: without the polls it would not fly during the interior at all.

    Returns ``(delta, u, wait_s)``: ``wait_s`` is this rank's time inside ``Waitall`` and ``Allreduce``,
    the hand-written program's waits (measured with ``perf_counter``, the program's only instrumentation)."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    nloc = u.shape[0] - 2
    # buffer row b holds global row first_row + b - 1; the updated rows are global 1 .. n-2
    r_lo = max(1, 2 - first_row)
    r_hi = min(nloc, n - 1 - first_row)
    in_lo, in_hi = max(r_lo, 2), min(r_hi, nloc - 1) + 1  # rows that need no ghost
    edges = [b for b in sorted({1, nloc}) if r_lo <= b <= r_hi and not in_lo <= b < in_hi]
    sbuf, rbuf = numpy.zeros(1), numpy.zeros(1)
    delta = 0.0
    wait_s = 0.0
    clock = time.perf_counter
    for it in range(iters):
        reqs = []
        if rank > 0:
            reqs += [comm.Irecv(u[0], source=rank - 1, tag=7), comm.Isend(u[1], dest=rank - 1, tag=8)]
        if rank < size - 1:
            reqs += [comm.Irecv(u[nloc + 1], source=rank + 1, tag=8), comm.Isend(u[nloc], dest=rank + 1, tag=7)]
        d = 0.0
        step = chunk_rows if chunk_rows > 0 else max(1, in_hi - in_lo)
        for c_lo in range(in_lo, in_hi, step):
            d += kernel(u, v, c_lo, min(in_hi, c_lo + step))
            if chunk_rows > 0:
                MPI.Request.Testall(reqs)   # drives the halos' progress (see the docstring)
        t0 = clock()
        MPI.Request.Waitall(reqs)
        wait_s += clock() - t0
        for b in edges:
            d += kernel(u, v, b, b + 1)
        sbuf[0] = d
        t0 = clock()
        comm.Allreduce(sbuf, rbuf)
        wait_s += clock() - t0
        delta = float(rbuf[0])
        u, v = v, u
    return delta, u, wait_s


#: The two ways each program is measured on the ranks: name -> ``latency_hiding``.
MODES = {"hiding": True, "blocking": False}
#: The counters of ``distarray.stats()`` kept in the results (with ``kernels``).
STATS_KEYS = ("flushes", "recorded", "inlined", "swapped", "plans_built", "plan_hits", "messages_sent",
              "bytes_sent", "buffers_allocated", "buffers_reused")


class RankBench:
    """The MPI part's measurements on one rank. Every rank builds one from the parsed arguments ``a`` and
    calls the same methods in the same order: each method is collective over the world communicator
    (blocking; the timed calls go through :func:`mpi_part.slowest_rank`). Results that need the gathered
    traces (waits) are filled on rank 0 only; the other ranks get empty lists and dicts there."""

    def __init__(self, a) -> None:
        import nbmpi.workers.distarray as dnp
        from nbmpi.workers import gather_trace, get_tracer, world

        self.dnp = dnp
        self.gather_trace = gather_trace
        self.comm = world()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.cfg = dict(QUICK if a.quick else FULL)
        self.rounds = a.rounds or self.cfg["rounds"]
        self.quick = a.quick
        self.tracer = get_tracer()

    def timed(self, fn):
        """``(fn()'s result, seconds on the slowest rank)`` (collective, see :func:`mpi_part.slowest_rank`)."""
        from mpi_part import slowest_rank

        return slowest_rank(self.comm, fn)

    def dist_inputs(self, inp: dict) -> dict:
        """Distributed copies of the NumPy inputs ``inp`` (lists element by element; ``W`` and scalars as
        they are); collective."""
        dnp = self.dnp
        out = {}
        for k, v in inp.items():
            if isinstance(v, list):
                out[k] = [dnp.from_numpy(x) for x in v]
            elif isinstance(v, numpy.ndarray) and k != "W":
                out[k] = dnp.from_numpy(v)
            else:
                out[k] = v
        return out

    def rank_waits(self, mark):
        """Gather the trace since ``mark`` (collective); returns it and, on rank 0, each rank's wait %
        (``None`` on the other ranks)."""
        tr = self.gather_trace(since=mark)
        waits = [rr["wait_frac"] * 100 for rr in tr.summary()["ranks"]] if self.rank == 0 else None
        return tr, waits

    def handwritten_vs_nbmpi(self) -> dict:
        """The hand-written mpi4py + numba stencil, interleaved round by round with nbmpi's."""
        comm, dnp, rank, timed = self.comm, self.dnp, self.rank, self.timed
        size_, iters = self.cfg["stencil"]
        x = make_inputs("stencil", size_)["full"]
        d = dnp.Distribution("block", size_, self.size)
        lo, hi = d.block_range(rank)
        kernel = _hw_kernels()

        def hw_arrays():
            u = numpy.zeros((hi - lo + 2, size_))
            u[1:-1] = x[lo:hi]
            return u, u.copy()

        u, v = hw_arrays()
        (hw_check, _, _), hw_first = timed(lambda: handwritten_stencil(comm, u, v, lo, size_, 1, kernel))
        hw_best = dn_best = float("inf")
        hw_waits, dn_waits = [], []
        for r in range(self.rounds if self.quick else max(self.rounds, 6)):  # the 1.25x target: more rounds
            u, v = hw_arrays()
            handwritten_stencil(comm, u, v, lo, size_, 2, kernel)  # warm, like nbmpi's
            res, t = timed(lambda: handwritten_stencil(comm, u, v, lo, size_, iters, kernel))
            hw_waits.append(comm.allgather(100 * res[2] / t))  # each rank's waits, % of the loop's time
            hw_best = min(hw_best, t / iters)
            full = dnp.from_numpy(x)
            jacobi_stencil(dnp, full, 2)
            mark = self.tracer.mark()
            _, t = timed(lambda: jacobi_stencil(dnp, full, iters))
            _, waits = self.rank_waits(mark)
            self.tracer.clear()
            if rank == 0:
                dn_waits.append(waits)
            dn_best = min(dn_best, t / iters)
        return dict(first_s=hw_first, per_iter_s=hw_best, check=hw_check, nbmpi_per_iter_s=dn_best, size=size_,
                    iters=iters, wait_pct_rounds=hw_waits, nbmpi_wait_pct_rounds=dn_waits)

    def timed_round(self, name: str, inp: dict, iters: int, mode: str, acc: dict) -> None:
        """One measured round of program ``name`` in ``mode`` (fresh distributed inputs, two warm steps,
        then ``iters`` traced steps); appends its time, and on rank 0 its waits, to ``acc`` in place."""
        dnp = self.dnp
        dnp.configure(latency_hiding=MODES[mode])
        arrays = self.dist_inputs(inp)
        run_program(name, dnp, arrays, 2)  # warm: a second step has the copy-back and reuses buffers
        mark = self.tracer.mark()
        _, t = self.timed(lambda: run_program(name, dnp, arrays, iters))
        tr, waits = self.rank_waits(mark)
        if self.rank == 0:
            acc["waits"].append(waits)
            acc["splits"].append(wait_split(tr))
        self.tracer.clear()
        acc["best"] = min(acc["best"], t / iters)
        acc["times"].append(t / iters)

    def mode_summary(self, acc: dict) -> dict:
        """The JSON record of one mode from its rounds ``acc``: best time, the waits of the fastest round,
        their median over the rounds, every round's waits and times (wait fields empty off rank 0)."""
        waits, splits, times = acc["waits"], acc["splits"], acc["times"]
        if self.rank == 0 and waits:
            k = int(numpy.argmin(times))
            w, wmed, split = waits[k], median_per_rank(waits), splits[k]
            split_med = {part: median_per_rank([sp[part] for sp in splits]) for part in split}
        else:
            w, wmed, split, split_med = [], [], {}, {}
        return dict(per_iter_s=acc["best"], wait_pct=w, wait_pct_median=wmed, wait_pct_rounds=waits,
                    wait_pct_split=split, wait_pct_split_median=split_med, rounds_s=times)

    def program_row(self, name: str) -> dict:
        """Measure program ``name``: the first call (kernels compiled with a fresh cache, plans built; its
        result is checked against NumPy's later), then interleaved rounds, hiding and blocking alternating
        which goes first. Leaves latency hiding on."""
        size_, iters = self.cfg[name]
        inp = make_inputs(name, size_)
        arrays = self.dist_inputs(inp)
        check, first = self.timed(lambda: run_program(name, self.dnp, arrays, 1))
        row = dict(size=size_, iters=iters, first_s=first, check=check)
        acc = {m: dict(best=float("inf"), waits=[], splits=[], times=[]) for m in MODES}
        for r in range(self.rounds):
            for m in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
                self.timed_round(name, inp, iters, m, acc[m])
        self.dnp.configure(latency_hiding=True)
        for m in MODES:
            row[m] = self.mode_summary(acc[m])
        return row

    def stats(self) -> dict:
        """This rank's distarray counters (:data:`STATS_KEYS` and the kernels)."""
        st = self.dnp.stats()
        out = {k: st[k] for k in STATS_KEYS}
        out["kernels"] = st["kernels"]
        return out


def mpi_main(a) -> int:
    """The MPI part (every rank, collective): every program, the hand-written stencil right after the
    stencil's own rows (under the same machine load), the counters; rank 0 writes ``a.mpi_part``."""
    bench = RankBench(a)
    results = {}
    for name in PROGRAMS:
        row = results[name] = bench.program_row(name)
        if name == "stencil":  # measured right after the stencil's own rows, under the same machine load
            results["handwritten_stencil"] = bench.handwritten_vs_nbmpi()
        if bench.rank == 0:
            print(f"[{bench.size} ranks] {name}: first {row['first_s']:.3f} s, "
                  f"hiding {row['hiding']['per_iter_s'] * 1e3:.2f} ms/it, "
                  f"blocking {row['blocking']['per_iter_s'] * 1e3:.2f} ms/it", flush=True)
    results["stats_rank0"] = bench.stats()
    if bench.rank == 0:
        Path(a.mpi_part).write_text(json.dumps(results))
    return 0


# =========================================================================== driver and report
def main(argv=None) -> int:
    from mpi_part import add_part_option
    from reporting import benchmark_parser

    p = benchmark_parser(__doc__, "tiny sizes, one round (smoke test)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 1)")
    p.add_argument("--ranks", default=None, help="comma-separated rank counts (default 2,3; quick 2)")
    p.add_argument("--programs-only", action="store_true",
                   help="only the tests/numpy_programs section (results distarray_programs[_quick].json/.md)")
    p.add_argument("--no-programs", action="store_true", help="skip the tests/numpy_programs section")
    add_part_option(p)
    for opt in ("--programs-part", "--dask-program", "--sizes-json", "--scheduler", "--npy", "--budget", "--numpy-times"):
        p.add_argument(opt, default=None, help=argparse.SUPPRESS)
    p.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.dask_program:
        from distarray_programs import dask_child
        return dask_child(a.dask_program, a.sizes_json, a.scheduler, a.npy, a.rounds or 1, float(a.budget or 60))
    if a.mpi_part and a.programs_part:
        return programs_mpi_main(a)
    if a.mpi_part:
        return mpi_main(a)
    if a.programs_only:
        return programs_main(a)
    from mpi_part import run_part
    from reporting import machine

    cfg = dict(QUICK if a.quick else FULL)
    rounds = a.rounds or cfg["rounds"]
    ranks = [int(r) for r in a.ranks.split(",")] if a.ranks else list(cfg["ranks"])
    load0 = os.getloadavg()
    t_all = time.time()
    print("NumPy, one process ...", flush=True)
    np_res = bench_numpy(cfg, rounds)
    print("dask.array, 2 local workers ...", flush=True)
    dask_res = bench_dask(cfg, rounds)
    mpi = {}
    fresh_cache = "NBMPI_DISTARRAY_CACHE" not in os.environ
    with tempfile.TemporaryDirectory(prefix="nbmpi-distarray-bench-") as tmp:
        for n in ranks:
            env = {}
            if fresh_cache:
                env["NBMPI_DISTARRAY_CACHE"] = str(Path(tmp) / f"kernels{n}")  # cold: first calls compile
            args = (["--quick"] if a.quick else []) + (["--rounds", str(a.rounds)] if a.rounds else [])
            print(f"nbmpi on {n} ranks ...", flush=True)
            code, mpi[str(n)] = run_part(n, str(Path(__file__).resolve()), Path(tmp) / f"part{n}.json", args, env)
            if code != 0:
                return code
    programs = None if a.no_programs else programs_section(a)
    report(cfg, rounds, ranks, np_res, dask_res, mpi, a.quick, a.out_dir, fresh_cache,
           dict(load_start=load0, load_end=os.getloadavg(), wall_seconds=time.time() - t_all), machine(), programs)
    return 0


# =========================================================================== the tests/numpy_programs section
def programs_mpi_main(a) -> int:
    """The programs' MPI part (every rank): see :func:`distarray_programs.mpi_programs`."""
    from distarray_programs import mpi_programs, programs_config
    from nbmpi.workers import world

    numpy_s = json.loads(a.numpy_times or "{}")
    cfg = {k: v for k, v in programs_config(a.quick).items() if k in numpy_s}
    res = mpi_programs(cfg, a.rounds or (1 if a.quick else 3), Path(a.programs_part), a.first_only, numpy_s)
    if world().Get_rank() == 0:
        Path(a.mpi_part).write_text(json.dumps(res))
    return 0


def programs_section(a) -> dict:
    """Run the programs section (NumPy here, nbmpi in two launches on 2 ranks sharing one new kernel cache
    directory, dask.array in child processes); returns ``dict(data=..., targets=..., md=[...])``."""
    from distarray_programs import (bench_dask, bench_numpy, compare, compile_ratio, evaluate, markdown,
                                    programs_config)
    from mpi_part import run_part

    cfg = programs_config(a.quick)
    rounds = a.rounds or (1 if a.quick else 3)
    script = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory(prefix="nbmpi-programs-bench-") as tmp:
        t = Path(tmp)
        dirs = {k: t / k for k in ("numpy", "nbmpi", "reused", "dask")}
        for d in dirs.values():
            d.mkdir()
        print("programs: NumPy, one process ...", flush=True)
        np_res = bench_numpy(cfg, rounds, dirs["numpy"])
        env = {"NBMPI_DISTARRAY_CACHE": str(t / "kernels")}  # a new kernel cache: the first launch compiles
        base = (["--quick"] if a.quick else []) + ["--rounds", str(rounds)]
        print("programs: nbmpi on 2 ranks, fresh kernel cache ...", flush=True)
        times = {n: r["median_s"] for n, r in np_res.items()}
        code, cold = run_part(2, script, t / "cold.json", base + ["--programs-part", str(dirs["nbmpi"]),
                                                                  "--numpy-times", json.dumps(times)], env)
        cold = cold or {}
        # the second launch: the programs that ran within their limit (the others add nothing but time)
        times = {n: v for n, v in times.items() if "over_limit_s" not in cold.get(n, {})}
        print("programs: nbmpi on 2 ranks, new processes reusing the kernel cache ...", flush=True)
        code2, reused = run_part(2, script, t / "reused.json",
                                 base + ["--programs-part", str(dirs["reused"]), "--first-only",
                                         "--numpy-times", json.dumps(times)], env)
        reused = reused or {}
        print("programs: dask.array, 2 local workers ...", flush=True)
        dask_res = bench_dask(cfg, np_res, dirs["dask"], 1, script, 20.0)
        checks = {n: compare(dirs["numpy"] / f"{n}.npy", dirs["nbmpi"] / f"{n}.npy") for n in cfg}
        dask_checks = {n: compare(dirs["numpy"] / f"{n}.npy", dirs["dask"] / f"{n}.npy") for n in cfg}
    targets = evaluate(np_res, cold, reused, dask_res, checks)
    md = markdown(np_res, cold, reused, dask_res, checks, dask_checks, targets)
    data = dict(sizes=cfg, rounds=rounds, numpy=np_res, nbmpi=cold, nbmpi_reused_cache=reused, dask=dask_res,
                checks=checks, dask_checks=dask_checks, launch_exit_codes=[code, code2],
                compile_ratio=compile_ratio(cold))
    return dict(data=data, targets=targets, md=md)


def programs_main(a) -> int:
    """``--programs-only``: the programs section alone, written to ``distarray_programs[_quick]``."""
    from parallel_capacity import measure, summary
    from reporting import machine, write_results

    load0 = os.getloadavg()
    t0 = time.time()
    cap0 = measure(0.2 if a.quick else 1.0)
    sec = programs_section(a)
    cap1 = measure(0.2 if a.quick else 1.0)
    run_info = dict(load_start=load0, load_end=os.getloadavg(), wall_seconds=time.time() - t0,
                    parallel_capacity_start=cap0, parallel_capacity_end=cap1)
    data = dict(benchmark="distarray_programs", quick=a.quick, run=run_info, programs=sec["data"],
                targets=sec["targets"], machine=machine())
    md = [f"Load average at start {tuple(round(x, 2) for x in load0)}, at end "
          f"{tuple(round(x, 2) for x in run_info['load_end'])}.", "",
          "The machine's parallel capacity (`benchmarks/parallel_capacity.py`; nbmpi's 2 ranks against NumPy's one "
          "process can gain at most this much). Before the programs: " + summary(cap0) + " After them: "
          + summary(cap1), ""] + sec["md"]
    name = "distarray_programs_quick" if a.quick else "distarray_programs"
    path = write_results(name, data, "\n".join(md), Path(a.out_dir) if a.out_dir else None)
    print("\n".join(md))
    print(f"\nwrote {path}")
    return 0


#: Columns of the per-rank-count tables of :func:`report`.
RANKS_HEADER = ["program", "size", "NumPy ms", "nbmpi hiding ms", "nbmpi blocking ms",
                "median of rounds ms (hiding / blocking)", "speedup hiding",
                "speedup blocking", "wait % hiding (per rank)", "wait % blocking (per rank)", "first call s",
                "equals NumPy"]


def _pct(v) -> str:
    """Per-rank percentages as ``a / b`` (2 decimals), ``-`` when there are none."""
    return " / ".join(f"{x:.2f}" for x in v) if v else "-"


def table_row(name: str, r: dict, npr: dict) -> list:
    """The table row of program ``name`` from its nbmpi result ``r`` and NumPy result ``npr``; adds
    ``verified``, each mode's ``speedup_vs_numpy`` and (PRK kernels) ``rate`` to ``r`` in place."""
    ok = bool(numpy.isclose(r["check"], npr["check"], rtol=1e-8, atol=1e-12))
    r["verified"] = ok
    for m in ("hiding", "blocking"):
        r[m]["speedup_vs_numpy"] = npr["per_iter_s"] / r[m]["per_iter_s"]
    wu = work_units(name, npr["size"], 1)
    if wu:
        unit = 1e9
        r["rate"] = dict(numpy=wu / npr["per_iter_s"] / unit, hiding=wu / r["hiding"]["per_iter_s"] / unit,
                         blocking=wu / r["blocking"]["per_iter_s"] / unit,
                         unit="GFlop/s" if name == "prk_stencil" else "GB/s")
    return [TITLES[name], str(npr["size"]), npr["per_iter_s"] * 1e3, r["hiding"]["per_iter_s"] * 1e3,
            r["blocking"]["per_iter_s"] * 1e3,
            " / ".join(f"{numpy.median(r[m]['rounds_s']) * 1e3:.1f}" for m in ("hiding", "blocking")),
            r["hiding"]["speedup_vs_numpy"],
            r["blocking"]["speedup_vs_numpy"],
            " / ".join(f"{w:.1f}" for w in r["hiding"]["wait_pct_median"]),
            " / ".join(f"{w:.1f}" for w in r["blocking"]["wait_pct_median"]), r["first_s"], ok]


def stencil_targets(two: dict, mpi: dict, np_res: dict, dask_res: dict) -> list:
    """The issue-13 targets from the 2-rank results ``two`` (after :func:`table_row` verified every
    result in ``mpi``), the NumPy and the dask.array results."""
    from reporting import target

    st = two["stencil"]
    nan = [float("nan")]
    # waits: the median over the interleaved rounds (one round's wait is mostly the machine's noise)
    wh, wb = (max(st[m]["wait_pct_median"] or nan) for m in ("hiding", "blocking"))
    th, tb = (max(st[m]["wait_pct_split_median"].get("transfers") or nan) for m in ("hiding", "blocking"))
    hw = two["handwritten_stencil"]
    n_rounds = len(st["hiding"]["rounds_s"])
    rounds_txt = f"median of {n_rounds} round{'' if n_rounds == 1 else 's'}"
    return [
        target(f"stencil wait % with latency hiding, worst rank ({rounds_txt}), 2 ranks", wh, 10.0,
               higher_is_better=False),
        target(f"stencil wait % without / with latency hiding (worst ranks, {rounds_txt}), 2 ranks",
               ratio_of(wb, wh), 3.0),
        target("stencil transfer wait % (the seed's 'communication latency not hidden behind computation') "
               f"without / with latency hiding (worst ranks, {rounds_txt}), 2 ranks", ratio_of(tb, th), 3.0),
        target("stencil time nbmpi / hand-written mpi4py+numba (same run, interleaved), 2 ranks",
               hw["nbmpi_per_iter_s"] / hw["per_iter_s"], 1.25, higher_is_better=False),
        target("stencil speedup of nbmpi (2 ranks) over dask.array (2 workers)",
               dask_res["per_iter_s"] / st["hiding"]["per_iter_s"], 10.0),
        target("every nbmpi result (first call) equals NumPy's",
               float(all(r[k]["verified"] for r in mpi.values() for k in PROGRAMS)), 1.0),
        target("hand-written stencil's first delta equals NumPy's",
               float(numpy.isclose(hw["check"], np_res["stencil"]["check"], rtol=1e-10)), 1.0),
    ]


def intro_md(rounds: int, fresh_cache: bool, run_info: dict, mach: dict) -> list:
    """The report's opening paragraphs (how it was measured, the load, the machine's cores)."""
    return [f"Best of {rounds} interleaved rounds (hiding / blocking alternate; the median of the rounds beside it, "
            f"each round one loop of steps as a user writes it); time per iteration in ms "
            f"(max over ranks); speedup over NumPy in one process; wait % per rank from the gathered traces, the "
            f"median over the rounds (the JSON also has each round's). First call: the first iteration on fresh "
            f"arrays, including numba "
            f"compilation ({'fresh kernel cache' if fresh_cache else 'kernel cache from NBMPI_DISTARRAY_CACHE'}) and "
            f"plan building. BLAS limited to 1 thread everywhere. Programs run one after the other on a machine "
            f"shared with other work, so rows measured minutes apart saw different loads; comparisons that matter "
            f"are interleaved within one row (hiding / blocking) or one table (the stencil's peers). Load average at "
            f"start "
            f"{tuple(round(x, 2) for x in run_info['load_start'])}, at end "
            f"{tuple(round(x, 2) for x in run_info['load_end'])}.", "",
            f"**This machine has {mach['cpus']} cores**: 2 ranks is the most real parallelism it has, so a speedup "
            "over NumPy above 2x comes from fusion (one pass over memory instead of one per operation, no "
            "temporaries), not from more cores; 3 ranks oversubscribe the cores (each rank gets 2/3 of a core and "
            "waits for the others' time slices), and transfers are shared-memory copies (microseconds), so "
            "network latency, the thing the seed hides, is nearly absent here.", ""]


def ranks_md(rows_by_ranks: dict, mpi: dict) -> list:
    """One section per rank count: the programs' table and the PRK kernels' rates."""
    from reporting import md_table

    md = []
    for n, rows in rows_by_ranks.items():
        md += [f"## {n} ranks", "", md_table(RANKS_HEADER, rows), ""]
        prk = [(TITLES[k], mpi[n][k]["rate"]) for k in ("prk_stencil", "prk_transpose")]
        md += [md_table(["PRK kernel", "unit", "NumPy", "nbmpi hiding", "nbmpi blocking"],
                        [[t, r["unit"], r["numpy"], r["hiding"], r["blocking"]] for t, r in prk]), ""]
    return md


def wait_split_md(two: dict) -> list:
    """The 'where the wait goes' section of the 2-rank results ``two``."""
    from reporting import md_table

    split_rows = [[TITLES[k]] + [_pct(two[k][m]["wait_pct_split_median"].get(part))
                                 for part in ("transfers", "force_point") for m in ("hiding", "blocking")]
                  for k in PROGRAMS]
    return ["## Where the wait goes (2 ranks, median over the rounds, % of the time per rank)", "",
            "Transfers: waits for remote blocks (`distarray_send/recv/wait`), what latency hiding removes. "
            "Force points: the collectives where a value is read (a reduction's allgather, the check that "
            "the ranks agree); a rank waits there for the other to arrive, i.e. for load imbalance and "
            "noise, which hiding cannot remove, and which is the same in both modes.", "",
            md_table(["program", "transfers, hiding", "transfers, blocking", "force points, hiding",
                      "force points, blocking"], split_rows), ""]


def peers_md(two: dict, np_res: dict, dask_res: dict) -> list:
    """The stencil against NumPy, the hand-written version and dask.array (2 ranks), with its notes."""
    from reporting import md_table

    hw = two["handwritten_stencil"]
    hw_w, dn_w = median_per_rank(hw.get("wait_pct_rounds")), median_per_rank(hw.get("nbmpi_wait_pct_rounds"))
    return ["## Jacobi stencil against its peers (2 ranks)", "",
            md_table(["implementation", "ms per iteration", "first call s", "wait % per rank (median of rounds)"],
                     [["NumPy, one process", np_res["stencil"]["per_iter_s"] * 1e3, np_res["stencil"]["first_s"],
                       "-"],
                      ["nbmpi distarray with hiding, 2 ranks (interleaved with the next row)",
                       hw["nbmpi_per_iter_s"] * 1e3, two["stencil"]["first_s"], _pct(dn_w)],
                      ["hand-written mpi4py + numba halo exchange, 2 ranks", hw["per_iter_s"] * 1e3,
                       hw["first_s"], _pct(hw_w)],
                      [f"dask.array, LocalCluster 2 workers x 1 thread ({dask_res['iters']} iterations)",
                       dask_res["per_iter_s"] * 1e3, dask_res["first_s"], "-"]]), "",
            "dask arrays are immutable graphs: the dask version re-slices the views each step, assigns `work` "
            "into `full` and persists both (otherwise each step recomputes the whole history); its cluster "
            f"took {dask_res['cluster_start_s']:.1f} s to start (not counted).", "",
            "The hand-written program's wait is its time in `Waitall` (the halo) and `Allreduce` (delta), "
            "measured with `perf_counter`; nbmpi's is the traced wait of the same rounds. Both programs "
            "synchronise the ranks once per step (the sum of delta), so each waits there for the other "
            "rank's noise: on this machine that wait is the floor of any implementation of the program, "
            "and it is what the stencil's total-wait ratio (without / with hiding) is made of once the "
            "transfers are hidden.", ""]


def counters_md(two: dict) -> list:
    """The line of nbmpi's counters on rank 0 of the 2-rank run."""
    s0 = two["stats_rank0"]
    return [f"nbmpi counters on rank 0 (2 ranks, whole run): {s0['flushes']} force points, {s0['recorded']} "
            f"recorded operations of which {s0['inlined']} fused away, {s0['swapped']} copy-backs done as buffer "
            f"swaps, {s0['plans_built']} plans built and {s0['plan_hits']} reused, {s0['messages_sent']} messages "
            f"({s0['bytes_sent'] / 2**20:.1f} MiB), kernels: {s0['kernels']}.", ""]


def report(cfg, rounds, ranks, np_res, dask_res, mpi, quick, out_dir, fresh_cache, run_info, mach,
           programs=None) -> None:
    """Driver only, after the measurements: check every nbmpi result against NumPy's (adding ``verified``,
    speedups and rates to ``mpi`` in place), evaluate the targets, write ``distarray[_quick].json`` and
    ``.md`` (to ``out_dir`` or ``benchmarks/results``) and print the markdown."""
    from reporting import targets_table, write_results

    two = mpi.get("2")
    rows_by_ranks = {n: [table_row(name, res[name], np_res[name]) for name in PROGRAMS] for n, res in mpi.items()}
    targets = stencil_targets(two, mpi, np_res, dask_res) if two is not None else []
    if programs is not None:
        targets = targets + programs["targets"]
    data = dict(benchmark="distarray", quick=quick, config={k: v for k, v in cfg.items()}, rounds=rounds,
                ranks=ranks, run=run_info, numpy=np_res, dask=dask_res, mpi=mpi, targets=targets,
                fresh_kernel_cache=fresh_cache, machine=mach,
                programs=programs["data"] if programs is not None else None)
    md = intro_md(rounds, fresh_cache, run_info, mach) + ranks_md(rows_by_ranks, mpi)
    if two is not None:
        md += wait_split_md(two) + peers_md(two, np_res, dask_res) + counters_md(two)
    if programs is not None:
        md += programs["md"]
    md += ["## Targets", "", targets_table(targets) if targets else "(no 2-rank run)"]
    name = "distarray_quick" if quick else "distarray"
    path = write_results(name, data, "\n".join(md), Path(out_dir) if out_dir else None)
    print("\n".join(md))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
