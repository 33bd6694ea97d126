"""Redistribution benchmark (seed 004, the Chapel aggregation slides): Block->Cyclic and Cyclic->Block side by side.

One command (it launches the MPI ranks itself)::

    python benchmarks/redistribute.py            # 1, 16 and 64 MiB on 2 ranks, 16 MiB permutation
    python benchmarks/redistribute.py --quick    # small sizes (smoke test, used by the test suite)

A 1-D float64 array of the given size moves from a block to a cyclic distribution and back, five ways,
measured in the same run, round by round interleaved (every method sees the same machine load):

* **per-element messaging**, the seed's baseline: one MPI message per remote element (``Isend`` /
  ``Irecv`` of one element into its place, in batches), local elements copied with NumPy. Measured in
  full up to ``--per-element-max`` remote elements per rank (default 65536, i.e. 1 MiB arrays); above,
  a prefix of that many remote elements per peer is measured and the time is extrapolated
  linearly to all of them (the table says so);
* **nbmpi aggregated**: ``b[...] = a`` on distributed arrays (one message per peer, numba pack/unpack,
  cached plan, pre-allocated buffers), and ``c = a.redistribute("cyclic")`` creating the result in the
  loop (buffers from the engine's pool);
* **MPI derived datatypes with ``Alltoallw``**, the mpi4py-fft way: one ``Alltoallw`` whose send and
  receive types are MPI vector types (stride P) or contiguous runs, built once (cold) and reused;
* **the memcpy bound**: ``numpy.copyto`` of the same bytes, two ways: one process copying the whole array,
  and (stricter, the least a redistribution on P ranks must do: read and write every element once) every
  rank copying the bytes it holds at the same time as the other ranks. Both are checked.

Cold = the first call (nbmpi: the plan is built; Alltoallw: the datatypes are built and committed;
per-element: the first and only measured call), warm = later calls (min and median of the rounds).
Numba kernels are compiled (or loaded from numba's on-disk cache) by the first redistribution of the
process, which is timed apart. Every method's result is checked against NumPy.

Also a random permutation ``b[perm] = a`` (16 MiB) through the Aggregator, with the permutation as a
NumPy array and as a distributed array, against a hand-written ``Alltoallv`` version (plan computed once).

Targets (issue 14, computed from the measured numbers, warm): aggregated >= 100x per-element at the
smallest size (1 MiB); >= 0.5x the memcpy bound at the largest (64 MiB), for both readings of the bound;
>= 1.0x Alltoallw at every size, both directions. Results: ``benchmarks/results/redistribute.json`` / ``.md`` (``redistribute_quick``
with ``--quick``). The message count per peer of one redistribution is read from the trace.
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

import numpy  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FULL = dict(sizes_mib=(1.0, 16.0, 64.0), perm_mib=16.0, rounds=5, ranks=2)
QUICK = dict(sizes_mib=(1 / 16, 1 / 4, 1.0), perm_mib=0.25, rounds=2, ranks=2)
DIRECTIONS = (("block", "cyclic"), ("cyclic", "block"))
METHODS = ("per_element", "nbmpi", "nbmpi_new", "alltoallw", "memcpy")
TITLES = dict(per_element="per-element messaging (seed's baseline)", nbmpi="nbmpi aggregated, b[...] = a",
              nbmpi_new="nbmpi aggregated, c = a.redistribute(...) each call",
              alltoallw="MPI derived datatypes + Alltoallw", memcpy="memcpy bound (copyto, every rank its bytes)")


def size_label(mib: float) -> str:
    return f"{mib:g} MiB" if mib >= 1 else f"{mib * 1024:g} KiB"


# =========================================================================== MPI part (runs on every rank)
class _Ranks:
    """What every measurement of the MPI part shares: the communicator, MPI, the distributed-array module,
    the tracer, and the slowest-rank timing and agreement steps."""

    def __init__(self) -> None:
        import nbmpi.workers.distarray as dnp
        from nbmpi.workers import get_tracer, world
        from nbmpi.workers.core.runtime import MPI as _MPI
        from mpi_part import slowest_rank

        self.slowest_rank = slowest_rank
        self.dnp = dnp
        self.MPI = _MPI()
        self.comm = world()
        self.rank, self.P = self.comm.Get_rank(), self.comm.Get_size()
        self.tracer = get_tracer()
        self.first_call = None   # the first redistribution of the process (numba kernels compiled or loaded)

    def timed(self, fn, reps=1) -> float:
        """Collective: seconds per call of ``fn`` on the slowest rank."""
        return self.slowest_rank(self.comm, fn, reps)[1]

    def all_true(self, flag: bool) -> bool:
        """Collective: whether ``flag`` holds on every rank."""
        return bool(self.comm.allreduce(int(bool(flag)), op=self.MPI.MIN))

    def time_first_redistribution(self, d_src: str, d_dst: str) -> None:
        """Collective, once per process: time the first redistribution (a 64-element array), which compiles
        or loads the numba kernels."""
        if self.first_call is not None:
            return
        dnp = self.dnp
        small_a = dnp.arange(64.0, dist=d_src)
        small_b = dnp.zeros(64, dist=d_dst)

        def first():
            small_b[...] = small_a
            dnp.evaluate()
        self.first_call = self.timed(first)


class _Direction:
    """One size and direction of the MPI part: the arrays of every method and the measurements, in the
    order they are taken (:meth:`measure` runs them all)."""

    def __init__(self, ctx: _Ranks, x, d_src: str, d_dst: str, reps: int) -> None:
        dnp, rank, P, n = ctx.dnp, ctx.rank, ctx.P, len(x)
        self.ctx, self.x, self.d_dst, self.reps = ctx, x, d_dst, reps
        self.ds = dnp.Distribution(d_src, n, P)
        self.dd = dnp.Distribution(d_dst, n, P)
        self.my_src_rows, self.my_dst_rows = self.ds.global_rows(rank), self.dd.global_rows(rank)
        self.want = x[self.my_dst_rows]
        self.row = {m: dict(warm=[]) for m in METHODS}
        self.A = dnp.from_numpy(x, dist=d_src)
        self.B = dnp.zeros(n, dist=d_dst)
        self.A.evaluate()
        self.B.evaluate()

    def nb(self) -> None:
        """nbmpi: ``B[...] = A``."""
        self.B[...] = self.A
        self.ctx.dnp.evaluate()

    def nb_new(self) -> None:
        """nbmpi: ``C = A.redistribute(d_dst)``, the result created in the call."""
        C = self.A.redistribute(self.d_dst)
        C.evaluate()

    def mc(self) -> None:
        """The memcpy bound: every rank copies the bytes it holds."""
        numpy.copyto(self.mc_dst, self.src_local)

    def whole(self) -> None:
        """The memcpy bound, one process: rank 0 copies the whole array."""
        if self.ctx.rank == 0:
            numpy.copyto(self.whole_dst, self.whole_src)

    def messages(self) -> dict:
        """Collective: one warm ``nb()`` traced; on rank 0 the messages per peer pair read from the trace
        (None on the other ranks)."""
        from nbmpi.workers import gather_trace

        mark = self.ctx.tracer.mark()
        self.nb()
        tr = gather_trace(since=mark)
        if self.ctx.rank != 0:
            return None
        kinds = tr.col("kind")
        sends = [i for i in range(len(tr)) if tr.kind_name(int(kinds[i])) == "distarray_send"]
        per_pair = {}
        for i in sends:
            key = (int(tr.ranks[i]), int(tr.col("peer")[i]))
            per_pair[key] = per_pair.get(key, 0) + 1
        return dict(max_per_peer=max(per_pair.values()) if per_pair else 0,
                    pairs={f"{r}->{q}": c for (r, q), c in sorted(per_pair.items())})

    def cold_nbmpi(self) -> None:
        """Collective: nbmpi's cold calls (the plan built), checked, and the message count from the trace."""
        ctx, row = self.ctx, self.row
        self.st0 = ctx.dnp.stats()
        row["nbmpi"]["cold"] = ctx.timed(self.nb)
        self.st1 = ctx.dnp.stats()
        self.ok_nb = numpy.array_equal(self.B.local, self.want)
        self.msgs = self.messages()
        row["nbmpi_new"]["cold"] = ctx.timed(self.nb_new)
        self.st1b = ctx.dnp.stats()

    def cold_others(self, per_element_max: int) -> None:
        """Collective: the cold calls of Alltoallw (datatypes built), per-element messaging and memcpy."""
        ctx, row = self.ctx, self.row
        self.src_local = self.x[self.my_src_rows].copy()
        dst_local = numpy.zeros(len(self.my_dst_rows))
        t0 = time.perf_counter()
        self.a2w = Alltoallw(ctx.comm, ctx.MPI, self.ds, self.dd, self.src_local, dst_local)
        build = time.perf_counter() - t0
        row["alltoallw"]["cold"] = ctx.timed(self.a2w.run) + build
        self.ok_a2w = numpy.array_equal(dst_local, self.want)
        pe_dst = numpy.zeros(len(self.my_dst_rows))
        self.pe = PerElement(ctx.comm, ctx.MPI, self.ds, self.dd, self.src_local, pe_dst, per_element_max)
        row["per_element"]["cold"] = ctx.timed(self.pe.run)
        self.ok_pe = numpy.array_equal(pe_dst[self.pe.checked], self.want[self.pe.checked])
        self.mc_dst = numpy.empty_like(self.src_local)
        self.whole_src, self.whole_dst = (self.x, numpy.empty_like(self.x)) if ctx.rank == 0 else (None, None)
        row["memcpy"]["cold"] = ctx.timed(self.mc)

    def warm(self, rounds: int) -> list:
        """Collective: ``rounds`` warm rounds, the methods in a rotated order each round, then the whole-array
        copy; returns the whole-array copy's times."""
        ctx, row, reps = self.ctx, self.row, self.reps
        whole_t = []
        order = ["nbmpi", "nbmpi_new", "alltoallw", "memcpy", "per_element"]
        fns = dict(nbmpi=self.nb, nbmpi_new=self.nb_new, alltoallw=self.a2w.run, memcpy=self.mc,
                   per_element=self.pe.run)
        for r in range(rounds):
            rot = order[r % len(order):] + order[:r % len(order)]
            for m in rot:
                row[m]["warm"].append(ctx.timed(fns[m], 1 if m == "per_element" else reps))
            whole_t.append(ctx.timed(self.whole, reps))
        return whole_t

    def summary(self, whole_t: list, st2: dict) -> dict:
        """Collective (the checks are agreed): the row of this size and direction, from the measurements."""
        ctx, row, pe = self.ctx, self.row, self.pe
        ok_nb = self.ok_nb and numpy.array_equal(self.B.local, self.want)
        for m in METHODS:
            w = row[m]["warm"]
            row[m].update(min=min(w), median=float(numpy.median(w)), max=max(w))
        row["per_element"].update(measured_remote=pe.measured, total_remote=pe.total,
                                  extrapolated=pe.measured < pe.total, factor=pe.factor)
        for key in ("cold", "min", "median", "max"):
            row["per_element"][key + "_total_est"] = row["per_element"][key] * pe.factor
        row["memcpy_whole_array_one_process"] = dict(min=min(whole_t), median=float(numpy.median(whole_t)))
        row["verified"] = dict(nbmpi=ctx.all_true(ok_nb), alltoallw=ctx.all_true(self.ok_a2w),
                               per_element=ctx.all_true(self.ok_pe))
        row["messages"] = self.msgs
        st0, st1, st1b = self.st0, self.st1, self.st1b
        row["nbmpi_stats"] = dict(plans_built_cold=st1["plans_built"] - st0["plans_built"],
                                  plans_built_warm=st2["plans_built"] - st1b["plans_built"],
                                  buffers_allocated_warm=st2["buffers_allocated"] - st1b["buffers_allocated"],
                                  buffers_reused_warm=st2["buffers_reused"] - st1b["buffers_reused"])
        row["reps_per_sample"] = self.reps
        return row

    def measure(self, rounds: int, per_element_max: int) -> dict:
        """Collective: every measurement of this size and direction in order (after the process's first
        redistribution was timed); returns its row."""
        self.cold_nbmpi()
        self.cold_others(per_element_max)
        whole_t = self.warm(rounds)
        return self.summary(whole_t, self.ctx.dnp.stats())


def measure_size(ctx: _Ranks, mib: float, rounds: int, per_element_max: int) -> dict:
    """Collective: both directions at one array size; prints a line per direction on rank 0."""
    n = int(mib * 2 ** 20) // 8
    x = numpy.random.default_rng(11).random(n)
    reps = max(1, int(round(2.0 / max(mib, 1 / 16))))     # ~2 MiB moved per timing sample at least
    per_size = {}
    for d_src, d_dst in DIRECTIONS:
        d = _Direction(ctx, x, d_src, d_dst, reps)
        ctx.time_first_redistribution(d_src, d_dst)
        per_size[f"{d_src}->{d_dst}"] = d.measure(rounds, per_element_max)
        del d
    if ctx.rank == 0:
        for k, r in per_size.items():
            print(f"[{size_label(mib)} {k}] nbmpi {r['nbmpi']['min'] * 1e3:.3f} ms, alltoallw "
                  f"{r['alltoallw']['min'] * 1e3:.3f} ms, memcpy {r['memcpy']['min'] * 1e3:.3f} ms, per-element "
                  f"{r['per_element']['min_total_est'] * 1e3:.1f} ms", flush=True)
    return dict(n=n, bytes=n * 8, directions=per_size)


def mpi_main(a) -> int:
    """The MPI part (every rank calls it): every size and direction, then the permutation; rank 0 writes the
    results to ``a.mpi_part``."""
    ctx = _Ranks()
    cfg = dict(QUICK if a.quick else FULL)
    rounds = a.rounds or cfg["rounds"]
    results = {"sizes": {}, "perm": None}
    for mib in cfg["sizes_mib"]:
        results["sizes"][str(mib)] = measure_size(ctx, mib, rounds, a.per_element_max)
    results["first_redistribution_s"] = ctx.first_call
    results["perm"] = bench_perm(ctx.comm, ctx.MPI, ctx.dnp, cfg["perm_mib"], rounds, ctx.timed, ctx.all_true)
    if ctx.rank == 0:
        Path(a.mpi_part).write_text(json.dumps(results))
    return 0


class Alltoallw:
    """Block <-> cyclic of a 1-D float64 array with one ``MPI_Alltoallw``: per peer, an MPI vector type
    (stride P elements) on the side where the peer's elements are strided and a contiguous type on the
    other, with byte displacements (the mpi4py-fft way of expressing a redistribution with datatypes);
    the rank's own part goes through the same call."""

    def __init__(self, comm, MPI, ds, dd, src_local, dst_local):
        P, r = comm.Get_size(), comm.Get_rank()
        self.comm, self.src, self.dst = comm, src_local, dst_local
        self.types = []
        st, sd, rt, rd = [], [], [], []
        for q in range(P):
            t, off = self._part(MPI, ds, dd, r, q, sending=True)
            st.append(t)
            sd.append(off)
            t, off = self._part(MPI, ds, dd, q, r, sending=False)
            rt.append(t)
            rd.append(off)
        ones = [1] * P
        self.sspec = [src_local, (ones, sd), st]
        self.rspec = [dst_local, (ones, rd), rt]

    def _part(self, MPI, ds, dd, owner, target, sending):
        """The elements ``owner`` (source) sends to ``target``, as a type over the local block of the sender
        (``sending``) or the receiver, and its byte displacement."""
        rows = ds.global_rows(owner)
        rows = rows[dd.owner(rows) == target]
        loc = ds.local_index(rows) if sending else dd.local_index(rows)
        if len(loc) == 0:
            t = MPI.DOUBLE.Create_contiguous(0).Commit()
            self.types.append(t)
            return t, 0
        step = int(loc[1] - loc[0]) if len(loc) > 1 else 1
        assert numpy.all(numpy.diff(loc) == step), "block <-> cyclic parts are arithmetic progressions"
        t = (MPI.DOUBLE.Create_contiguous(len(loc)) if step == 1 else
             MPI.DOUBLE.Create_vector(len(loc), 1, step)).Commit()
        self.types.append(t)
        return t, int(loc[0]) * 8

    def run(self):
        self.comm.Alltoallw(self.sspec, self.rspec)


class PerElement:
    """The seed's baseline: one message per remote element (``Isend`` of one element, ``Irecv`` into its
    place), in batches of ``batch`` requests; elements staying on the rank are copied with NumPy. With more
    than ``limit`` remote elements per rank, only the first ``limit // (P - 1)`` per peer are sent and the
    time is scaled by ``factor`` (total / measured) by the caller."""

    def __init__(self, comm, MPI, ds, dd, src_local, dst_local, limit, batch=2048):
        P, r = comm.Get_size(), comm.Get_rank()
        self.comm, self.MPI, self.src, self.dst, self.batch = comm, MPI, src_local, dst_local, batch
        mine = ds.global_rows(r)
        dest = dd.owner(mine)
        keep = dest == r
        self.local_src = ds.local_index(mine[keep])
        self.local_dst = dd.local_index(mine[keep])
        per_peer = max(1, limit // max(1, P - 1))
        self.sends, self.recvs = [], []
        total = measured = 0
        checked = [self.local_dst]
        for q in range(P):
            if q == r:
                continue
            rows = mine[dest == q]
            total += len(rows)
            rows = rows[:per_peer]
            measured += len(rows)
            self.sends.append((q, ds.local_index(rows)))
            theirs = ds.global_rows(q)
            theirs = theirs[dd.owner(theirs) == r][:per_peer]
            self.recvs.append((q, dd.local_index(theirs)))
            checked.append(dd.local_index(theirs))
        self.total, self.measured = total, measured
        tot = numpy.array([total, measured], dtype=numpy.int64)
        allt = numpy.empty_like(tot)
        comm.Allreduce(tot, allt, op=MPI.SUM)
        self.factor = float(allt[0]) / float(allt[1]) if allt[1] else 1.0
        self.checked = numpy.concatenate(checked)

    def run(self):
        MPI, comm, src, dst, B = self.MPI, self.comm, self.src, self.dst, self.batch
        dst[self.local_dst] = src[self.local_src]
        sends = [(q, int(j)) for q, idx in self.sends for j in idx]
        recvs = [(q, int(j)) for q, idx in self.recvs for j in idx]
        k = 0
        while k < max(len(sends), len(recvs)):
            reqs = [comm.Irecv([dst[j:j + 1], MPI.DOUBLE], source=q, tag=0) for q, j in recvs[k:k + B]]
            reqs += [comm.Isend([src[j:j + 1], MPI.DOUBLE], dest=q, tag=0) for q, j in sends[k:k + B]]
            MPI.Request.Waitall(reqs)
            k += B


def bench_perm(comm, MPI, dnp, mib, rounds, timed, all_true):
    """``b[perm] = a`` with a random permutation: NumPy index, distributed index, hand-written Alltoallv."""
    rank, P = comm.Get_rank(), comm.Get_size()
    n = int(mib * 2 ** 20) // 8
    rng = numpy.random.default_rng(5)
    x = rng.random(n)
    perm = rng.permutation(n)
    expect = numpy.empty(n)
    expect[perm] = x
    d = dnp.Distribution("block", n, P)
    mine = d.global_rows(rank)
    want = expect[mine]
    A = dnp.from_numpy(x)
    Bn = dnp.zeros(n)
    Bd = dnp.zeros(n)
    ix = dnp.from_numpy(perm)
    out = {}
    cold_n = timed(lambda: Bn.__setitem__(perm, A))
    cold_d = timed(lambda: Bd.__setitem__(ix, A))
    ok = numpy.array_equal(Bn.local, want) and numpy.array_equal(Bd.local, want)
    # hand-written: the plan (destinations, order, positions, counts) computed once, then per call:
    # pack with take(), one Alltoallv, scatter into place
    t0 = time.perf_counter()
    xl = x[mine].copy()
    bl = numpy.zeros(len(mine))
    dest = d.owner(perm[mine])
    order = numpy.argsort(dest, kind="stable")
    pos = d.local_index(perm[mine])[order]
    scount = numpy.bincount(dest, minlength=P).astype(numpy.int64)
    rcount = numpy.empty(P, dtype=numpy.int64)
    comm.Alltoall(scount, rcount)
    sdis = numpy.concatenate([[0], numpy.cumsum(scount)[:-1]]).astype(numpy.int64)
    rdis = numpy.concatenate([[0], numpy.cumsum(rcount)[:-1]]).astype(numpy.int64)
    rpos = numpy.empty(int(rcount.sum()), dtype=numpy.int64)
    comm.Alltoallv([pos, (scount, sdis), MPI.INT64_T], [rpos, (rcount, rdis), MPI.INT64_T])
    sbuf = numpy.empty(len(mine))
    rbuf = numpy.empty(int(rcount.sum()))
    plan_s = time.perf_counter() - t0

    def hand():
        numpy.take(xl, order, out=sbuf)
        comm.Alltoallv([sbuf, (scount, sdis), MPI.DOUBLE], [rbuf, (rcount, rdis), MPI.DOUBLE])
        bl[rpos] = rbuf
    cold_h = timed(hand) + plan_s
    ok = ok and numpy.array_equal(bl, want)
    warm = dict(numpy_index=[], dist_index=[], alltoallv=[])
    fns = dict(numpy_index=lambda: Bn.__setitem__(perm, A), dist_index=lambda: Bd.__setitem__(ix, A), alltoallv=hand)
    keys = list(fns)
    for r in range(rounds):
        for k in keys[r % 3:] + keys[:r % 3]:
            warm[k].append(timed(fns[k]))
    ok = ok and numpy.array_equal(Bn.local, want) and numpy.array_equal(Bd.local, want)
    for k, cold in (("numpy_index", cold_n), ("dist_index", cold_d), ("alltoallv", cold_h)):
        w = warm[k]
        out[k] = dict(cold=cold, min=min(w), median=float(numpy.median(w)), max=max(w), warm=w)
    out["verified"] = all_true(ok)
    out["n"], out["bytes"] = n, n * 8
    return out


# =========================================================================== driver and report
def main(argv=None) -> int:
    from mpi_part import add_part_option
    from reporting import benchmark_parser

    p = benchmark_parser(__doc__, "small sizes, two rounds (smoke test)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)")
    p.add_argument("--per-element-max", type=int, default=65536,
                   help="remote elements per rank measured by the per-element baseline (beyond: extrapolated)")
    add_part_option(p)
    a = p.parse_args(argv)
    if a.mpi_part:
        return mpi_main(a)
    from mpi_part import run_part
    from reporting import machine

    cfg = dict(QUICK if a.quick else FULL)
    load0 = os.getloadavg()
    t_all = time.time()
    with tempfile.TemporaryDirectory(prefix="nbmpi-redistribute-bench-") as tmp:
        args = ["--per-element-max", str(a.per_element_max)] + (["--quick"] if a.quick else []) + \
            (["--rounds", str(a.rounds)] if a.rounds else [])
        print(f"nbmpi on {cfg['ranks']} ranks ...", flush=True)
        code, res = run_part(cfg["ranks"], str(Path(__file__).resolve()), Path(tmp) / "part.json", args)
        if code != 0:
            return code
    report(cfg, a, res, dict(load_start=load0, load_end=os.getloadavg(), wall_seconds=time.time() - t_all),
           machine())
    return 0


def method_row(key: str, m: str, r: dict, nb: float) -> list:
    """The table row of method ``m`` in direction ``key`` (``r``: the direction's results, ``nb``: nbmpi's
    warm min)."""
    x = r[m]
    if m == "per_element":
        cold, wmin, wmed = x["cold_total_est"], x["min_total_est"], x["median_total_est"]
        note = (f"extrapolated: {x['measured_remote']} of {x['total_remote']} remote elements per rank "
                f"measured, x{x['factor']:.1f}" if x["extrapolated"] else "measured in full")
    else:
        cold, wmin, wmed = x["cold"], x["min"], x["median"]
        note = ""
    if m == "nbmpi":
        mm = r["messages"] or {}
        note = (f"max {mm.get('max_per_peer')} message per peer (trace: {mm.get('pairs')}); plans built "
                f"warm: {r['nbmpi_stats']['plans_built_warm']}, buffers allocated warm: "
                f"{r['nbmpi_stats']['buffers_allocated_warm']}")
    if m == "memcpy":
        w = r["memcpy_whole_array_one_process"]
        note = f"one process copying the whole array: {w['min'] * 1e3:.3f} ms"
    ratio = wmin / nb if nb > 0 else float("nan")
    return [key, TITLES[m], cold * 1e3, wmin * 1e3, wmed * 1e3, ratio, note]


def size_rows(s: dict) -> list:
    """The table rows of one size, every direction and method; stores each direction's ``ratios`` (to
    nbmpi's warm min) into ``s``."""
    rows = []
    for key, r in s["directions"].items():
        nb = r["nbmpi"]["min"]
        for m in METHODS:
            rows.append(method_row(key, m, r, nb))
        r["ratios"] = dict(per_element=r["per_element"]["min_total_est"] / nb,
                           alltoallw=r["alltoallw"]["min"] / nb, memcpy=r["memcpy"]["min"] / nb,
                           memcpy_whole_array=r["memcpy_whole_array_one_process"]["min"] / nb)
    return rows


def size_targets(mib: float, s: dict) -> list:
    """The targets of one size (after :func:`size_rows`): results verified, Alltoallw ratio, messages per peer."""
    from reporting import target

    verified = [all(r["verified"].values()) for r in s["directions"].values()]
    return [target(f"every method's result equals NumPy's at {size_label(mib)}", float(all(verified)), 1.0),
            target(f"nbmpi aggregated vs Alltoallw at {size_label(mib)}: Alltoallw time / nbmpi time, "
                   "worse direction", min(r["ratios"]["alltoallw"] for r in s["directions"].values()), 1.0),
            target(f"messages per peer of one nbmpi redistribution at {size_label(mib)} (trace), worse "
                   "direction", float(max((r["messages"] or {}).get("max_per_peer", 99)
                                          for r in s["directions"].values())), 1.0,
                   higher_is_better=False)]


def headline_targets(sizes, res: dict) -> list:
    """The issue's targets (after :func:`size_rows`): speedup over per-element messaging at the smallest size,
    the two readings of the memcpy bound at the largest."""
    from reporting import target

    ds, dl = res["sizes"][str(sizes[0])]["directions"], res["sizes"][str(sizes[-1])]["directions"]
    return [target(f"nbmpi aggregated vs per-element messaging at {size_label(sizes[0])}: speedup, worse "
                   "direction", min(r["ratios"]["per_element"] for r in ds.values()), 100.0),
            target(f"nbmpi aggregated vs the memcpy bound at {size_label(sizes[-1])}: numpy.copyto of the "
                   "same bytes (the whole array, one process) / nbmpi time, worse direction",
                   min(r["ratios"]["memcpy_whole_array"] for r in dl.values()), 0.5),
            target(f"nbmpi aggregated vs the memcpy bound at {size_label(sizes[-1])}, stricter: every rank "
                   "copying the bytes it holds at the same time / nbmpi time, worse direction",
                   min(r["ratios"]["memcpy"] for r in dl.values()), 0.5)]


def perm_section(cfg: dict, pm: dict) -> list:
    """The markdown lines of the random permutation."""
    from reporting import md_table

    return [f"## Random permutation b[perm] = a ({size_label(cfg['perm_mib'])}, block -> block)", "",
            md_table(["method", "cold ms", "warm ms (min)", "warm ms (median)", "its time / nbmpi NumPy-index time"],
                     [[t, pm[k]["cold"] * 1e3, pm[k]["min"] * 1e3, pm[k]["median"] * 1e3,
                       pm[k]["min"] / pm["numpy_index"]["min"]]
                      for k, t in (("numpy_index", "nbmpi, perm a NumPy array (Aggregator)"),
                                   ("dist_index", "nbmpi, perm a distributed array (Aggregator, last-write order)"),
                                   ("alltoallv", "hand-written Alltoallv (plan computed once)"))]), "",
            "The irregular path moves each element as an item (destination row + value, plus its position with a "
            "distributed index) through the Aggregator's per-destination buffers and a numba handler; the "
            "hand-written version sends values only, with positions exchanged once. No target is set for it.", ""]


def report(cfg, a, res, run_info, mach) -> None:
    """Tables and targets from the MPI part's results ``res``; writes ``redistribute[_quick].json`` and ``.md``
    and prints the markdown."""
    from reporting import md_table, target, targets_table, write_results

    sizes = cfg["sizes_mib"]
    rounds = a.rounds or cfg["rounds"]
    md = [f"{cfg['ranks']} ranks, 1-D float64 arrays; every method measured in the same run, round by round "
          f"interleaved ({rounds} rounds; a sample is the mean of several calls for small sizes); times are the max "
          "over ranks, in ms; *warm* = min (median) of the rounds, *cold* = the first call. Load average at start "
          f"{tuple(round(x, 2) for x in run_info['load_start'])}, at end "
          f"{tuple(round(x, 2) for x in run_info['load_end'])} (the machine is shared: medians move with the load, "
          "compare methods within one table). The first redistribution of the process (numba kernels compiled or "
          f"loaded from the on-disk cache) took {res['first_redistribution_s'] * 1e3:.1f} ms.", ""]
    targets = []
    for mib in sizes:
        s = res["sizes"][str(mib)]
        md += [f"## {size_label(mib)} ({s['n']} elements)", ""]
        rows = size_rows(s)
        md += [md_table(["direction", "method", "cold ms", "warm ms (min)", "warm ms (median)",
                         "its time / nbmpi's (warm min)", "notes"], rows), ""]
        targets += size_targets(mib, s)
    targets = headline_targets(sizes, res) + targets
    pm = res["perm"]
    md += perm_section(cfg, pm)
    targets.append(target(f"permutation results equal NumPy's ({size_label(cfg['perm_mib'])})",
                          float(pm["verified"]), 1.0))
    md += ["## Targets", "", targets_table(targets)]
    data = dict(benchmark="redistribute", quick=a.quick, config=cfg, rounds=rounds,
                per_element_max=a.per_element_max, run=run_info, results=res, targets=targets, machine=mach)
    name = "redistribute_quick" if a.quick else "redistribute"
    path = write_results(name, data, "\n".join(md), Path(a.out_dir) if a.out_dir else None)
    print("\n".join(md))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    sys.exit(main())
