"""The programs section of ``benchmarks/distarray.py``: the plain NumPy programs of ``tests/numpy_programs/`` run
unchanged but for their import, three ways, at sizes where NumPy takes at least a second.

* **NumPy** in one process (the program as written);
* **nbmpi** on 2 ranks (``import numpy as np`` becomes ``import nbmpi.workers.distarray as np``, as
  ``tests/numpy_program_runner.py`` does): *cold* is the first run in a process whose kernel cache directory
  is new (numba compilation included), *cold start, cache reused* the first run in a new process that finds
  the kernels an earlier process compiled, *warm* the median of the later runs in the first process;
* **dask.array** on a 2-worker LocalCluster (the import becomes a namespace of ``dask.array``'s functions
  with NumPy's constants and types, the way nbmpi's namespace has them): each program in its own process
  (stopped after a time limit); a program that uses what dask.array lacks is reported "n/a" with the error.

Sizes: each program has one line marked ``# size`` (``n, steps, alpha = 48, 60, 0.2  # size``); the benchmark
replaces the values it names (:data:`FULL_SIZES`) and leaves the rest of the source as it is. A program's time
includes gathering its ``result`` (``numpy.asarray``), like the runner's. Every result is checked against
NumPy's (``assert_allclose``, rtol 1e-8: sums over several ranks add in another order).

Used by ``distarray.py`` (its default run and ``--programs-only``); ``distarray.py --dask-program`` runs one
program on dask (a child process of the driver).
"""
from __future__ import annotations

import ast
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy

REPO = Path(__file__).resolve().parent.parent
PROGRAM_DIR = REPO / "tests" / "numpy_programs"
IMPORT = "import numpy as np\n"          # the line tests/numpy_program_runner.py swaps
SIZE_MARK = "# size"

#: The values of each program's ``# size`` line in the full run: NumPy takes >= 1 s at these on this machine
#: (checked by the benchmark, which reports any program under a second). Scaled from the NumPy times of the
#: quiet-machine run (benchmarks/results/distarray.md, load 0.4-2) by each program's work factor, aiming at
#: about 1.3 s or more: 10 programs took 0.14-0.82 s at the earlier sizes. gauss_elimination and
#: lu_decomposition are sized by their own cost (n^3): on a quiet machine NumPy took 0.65 s at gauss n=1000 and
#: 0.37 s at LU n=1800 (earlier runs: 2.1 s and 0.81 s at LU n=1500, BLAS threads vary), so gauss n=1400
#: (~1.8 s) and LU n=2700 (~1.25 s); under load 8 the NumPy CPU time grew 3.5x (gauss 1000 -> 1400) and 2.9x
#: (LU 1800 -> 2600), as n^3 predicts.
FULL_SIZES: Dict[str, Dict[str, Any]] = {
    "black_scholes": dict(n=6_000_000),
    "convolution_1d": dict(m=32_000_000),   # NumPy 0.60 s at m=15e6 (quiet machine): under 1.2 s
    "game_of_life": dict(n=1500, gens=36),     # NumPy 1.01-1.20 s at gens=30
    "gauss_elimination": dict(n=1400),
    "heat": dict(n=1500, steps=80),           # NumPy 0.92-1.02 s at steps=60 (2026-11-26 runs)
    "lattice_boltzmann": dict(Nx=640, Ny=320, Nt=30),
    "lu_decomposition": dict(n=2700),
    "monte_carlo_pi": dict(n=70_000_000, m=20_000_000),
    "nbody": dict(N=2200, steps=20),
    "quasicrystal": dict(size=3500, waves=7),  # NumPy 1.08-1.12 s at size=3200
    "rosenbrock": dict(n=1_500_000, steps=300),
    "shallow_water": dict(nx=2000, ny=1500, steps=40),
    "wave_equation": dict(n=1_500_000, steps=300),
    "xray": dict(n=6000),
}
#: ``--quick``: two programs at their own (test) sizes, one of which dask.array cannot run.
QUICK_SIZES: Dict[str, Dict[str, Any]] = {"heat": {}, "xray": {}}


# =========================================================================== sources
def size_line(source: str, program: str) -> int:
    """Index of the program's one line marked ``# size``; SystemExit naming the program if there is not one."""
    lines = source.splitlines()
    marked = [i for i, ln in enumerate(lines) if ln.rstrip().endswith(SIZE_MARK)]
    if len(marked) != 1:
        raise SystemExit(f"{program}: expected exactly one line ending with {SIZE_MARK!r} (the size knob), "
                         f"found {len(marked)}")
    return marked[0]


def with_sizes(source: str, program: str, sizes: Dict[str, Any]) -> str:
    """``source`` with the values of its ``# size`` line replaced by ``sizes`` (by name); other names keep theirs."""
    if not sizes:
        return source
    lines = source.splitlines(keepends=True)
    i = size_line(source, program)
    node = ast.parse(lines[i].split("#")[0].strip()).body[0]
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        raise SystemExit(f"{program}: the {SIZE_MARK!r} line must be one assignment, like 'n, steps = 10, 5'")
    target = node.targets[0]
    names = [t.id for t in target.elts] if isinstance(target, ast.Tuple) else [target.id]
    values = ast.literal_eval(node.value)
    values = list(values) if isinstance(target, ast.Tuple) else [values]
    unknown = set(sizes) - set(names)
    if unknown:
        raise SystemExit(f"{program}: its size line sets {names}, not {sorted(unknown)}")
    values = [sizes.get(n, v) for n, v in zip(names, values)]
    lines[i] = f"{', '.join(names)} = {', '.join(repr(v) for v in values)}  {SIZE_MARK}\n"
    return "".join(lines)


def program_source(program: str, module: str, sizes: Dict[str, Any]) -> str:
    """Program ``program`` (a stem under tests/numpy_programs) at ``sizes``, importing ``module`` as ``np``."""
    path = PROGRAM_DIR / f"{program}.py"
    source = path.read_text(encoding="utf-8")
    if source.count(IMPORT) != 1:
        raise SystemExit(f"{path}: expected exactly one line {IMPORT.strip()!r}")
    return with_sizes(source, program, sizes).replace(IMPORT, f"import {module} as np\n")


def run_source(source: str, program: str) -> numpy.ndarray:
    """Execute a program's source and return its ``result`` as a NumPy array (a DistArray is gathered)."""
    namespace = {"__name__": "__main__", "__file__": str(PROGRAM_DIR / f"{program}.py")}
    exec(compile(source, str(PROGRAM_DIR / f"{program}.py"), "exec"), namespace)  # noqa: S102 - the point
    return numpy.asarray(namespace["result"])


def programs_config(quick: bool) -> Dict[str, Dict[str, Any]]:
    """The programs to run and their sizes."""
    if quick:
        return dict(QUICK_SIZES)
    missing = sorted(p.stem for p in PROGRAM_DIR.glob("*.py")) if PROGRAM_DIR.exists() else []
    missing = [m for m in missing if m not in FULL_SIZES]
    if missing:
        raise SystemExit(f"no benchmark size for {missing}: add them to FULL_SIZES in {__file__}")
    return dict(FULL_SIZES)


# =========================================================================== NumPy in one process
def bench_numpy(cfg: Dict[str, Dict[str, Any]], rounds: int, outdir: Path) -> Dict[str, Any]:
    """Every program in this process, ``rounds`` times; the first result saved to ``outdir/NAME.npy``."""
    out = {}
    for name, sizes in cfg.items():
        src = program_source(name, "numpy", sizes)
        times = []
        for r in range(rounds):
            t0 = time.perf_counter()
            res = run_source(src, name)
            times.append(time.perf_counter() - t0)
            if r == 0:
                numpy.save(outdir / f"{name}.npy", res)
        out[name] = dict(sizes=sizes, rounds_s=times, median_s=statistics.median(times), best_s=min(times))
        print(f"numpy {name}: median {out[name]['median_s']:.3f} s", flush=True)
    return out


# =========================================================================== nbmpi (every rank runs this)
def time_limit(numpy_s: float) -> float:
    """Seconds a program may spend in one way's later runs (and beyond which its first run is "over the
    limit"): 10x NumPy's time, at least 30 s, so a program that is far slower than NumPy does not stall the
    benchmark."""
    return max(30.0, 10.0 * numpy_s)


def mpi_programs(cfg: Dict[str, Dict[str, Any]], rounds: int, outdir: Path, first_only: bool,
                 numpy_s: Dict[str, float]) -> Dict[str, Any]:
    """Collective (every rank, SPMD): each program once (its first run in this process: cold), then, unless
    ``first_only``, up to ``rounds`` more times (warm; at least once, no new round once the rounds took
    :func:`time_limit` of ``numpy_s[name]``; none if the first run alone took 3x longer: ``over_limit_s``). Times
    are the slowest rank's; rank 0 saves the first result to ``outdir/NAME.npy``; ``stats_rank0``: what all
    of the program's runs added to rank 0's counters. A program that raises is
    recorded as failed (on every rank, as they run alike)."""
    import nbmpi.workers.distarray as dnp
    from nbmpi.workers import world
    from mpi_part import slowest_rank

    comm = world()
    rank = comm.Get_rank()
    out: Dict[str, Any] = {}
    for name, sizes in cfg.items():
        src = program_source(name, "nbmpi.workers.distarray", sizes)
        before = dnp.stats()
        row: Dict[str, Any] = dict(sizes=sizes)
        try:
            res, first = slowest_rank(comm, lambda: run_source(src, name))
            if rank == 0:
                numpy.save(outdir / f"{name}.npy", res)
            row["first_s"] = first
            limit = time_limit(numpy_s.get(name, 0.0))
            times: List[float] = []
            if first > 3 * limit and not first_only:     # 3x: the first run's compilation is not the program's
                row["over_limit_s"] = 3 * limit
            while not first_only and first <= 3 * limit and len(times) < rounds and (not times or sum(times) < limit):
                times.append(slowest_rank(comm, lambda: run_source(src, name))[1])
        except Exception as e:  # noqa: BLE001 - reported in the table, the next program runs
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            out[name] = row
            continue
        after = dnp.stats()
        if times:
            row.update(rounds_s=times, median_s=statistics.median(times), best_s=min(times))
        row["stats_rank0"] = _stats_delta(before, after)
        out[name] = row
        if rank == 0:
            print(f"nbmpi {name}: first {first:.3f} s" + (f", warm median {row['median_s']:.3f} s" if times else ""),
                  flush=True)
    return out


def _stats_delta(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, Any]:
    """What one program added to this rank's counters (force points, plans, messages, kernels, fallback)."""
    d = {k: after[k] - before[k] for k in ("flushes", "recorded", "split", "inlined", "plans_built", "plan_hits",
                                          "messages_sent", "bytes_sent") if k in after}
    d["kernels_compiled"] = after["kernels"].get("compiled", 0) - before["kernels"].get("compiled", 0)
    d["kernels_loaded"] = after["kernels"].get("loaded", 0) - before["kernels"].get("loaded", 0)
    fb0 = before.get("fallback", {}).get("functions", {})
    fb1 = after.get("fallback", {}).get("functions", {})
    d["fallback_calls"] = {k: v["calls"] - fb0.get(k, {}).get("calls", 0) for k, v in fb1.items()
                           if v["calls"] - fb0.get(k, {}).get("calls", 0)}
    return d


# =========================================================================== dask.array (2 local workers)
def dask_namespace() -> types.ModuleType:
    """``np`` for a program on dask: dask.array's functions, NumPy's number constants and types (``np.pi``,
    ``np.int64``, ``np.newaxis``), the way nbmpi's namespace offers them; a function or index helper
    (``np.mgrid``) dask.array lacks stays missing (the program is reported n/a)."""
    import dask.array as da

    ns = types.ModuleType("dask_numpy_namespace")

    def __getattr__(name: str) -> Any:
        if hasattr(da, name):
            return getattr(da, name)
        target = getattr(numpy, name, None)
        if isinstance(target, (int, float, type)) or (target is None and name == "newaxis"):
            return target
        raise AttributeError(f"dask.array has no {name!r}")

    ns.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return ns


def dask_child(program: str, sizes_json: str, scheduler: str, out: str, rounds: int, budget: float) -> int:
    """``distarray.py --dask-program``: run one program on the cluster at ``scheduler`` up to ``1 + rounds``
    times (no new run once ``budget`` seconds are spent); print one JSON line (``first_s``, ``rounds_s``: every
    run, the first included, as dask compiles nothing; or ``error``) and save the first result to ``out``."""
    from dask.distributed import Client

    sys.modules["dask_numpy_namespace"] = dask_namespace()
    src = program_source(program, "dask_numpy_namespace", json.loads(sizes_json))
    row: Dict[str, Any] = {}
    with Client(scheduler):
        try:
            t0 = time.perf_counter()
            res = run_source(src, program)
            row["first_s"] = time.perf_counter() - t0
            numpy.save(out, res)
            times = [row["first_s"]]
            for _ in range(rounds):
                if sum(times) > budget:
                    break
                t0 = time.perf_counter()
                run_source(src, program)
                times.append(time.perf_counter() - t0)
            row["rounds_s"] = times
        except Exception as e:  # noqa: BLE001 - the program cannot run on dask: n/a with the reason
            row["error"] = f"{type(e).__name__}: {e}"[:300]
    print("DASKROW " + json.dumps(row), flush=True)
    return 0


def bench_dask(cfg: Dict[str, Dict[str, Any]], np_res: Dict[str, Any], outdir: Path, rounds: int,
               script: str, min_limit: float) -> Dict[str, Any]:
    """Every program on a 2-worker LocalCluster, each in its own child process, stopped after
    ``max(min_limit, 5 x NumPy's median)`` seconds plus 15 s for its start (reported as such). A program's
    time is the median of its runs (the first included: dask compiles nothing)."""
    from dask.distributed import Client, LocalCluster

    out: Dict[str, Any] = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for name, sizes in cfg.items():
            limit = max(min_limit, 5 * np_res[name]["median_s"])
            cmd = [sys.executable, script, "--dask-program", name, "--sizes-json", json.dumps(sizes),
                   "--scheduler", cluster.scheduler_address, "--npy", str(outdir / f"{name}.npy"),
                   "--rounds", str(rounds), "--budget", str(limit / 2)]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 15)
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("DASKROW ")]
                row = json.loads(lines[-1][8:]) if lines else dict(error=f"exit {p.returncode}: {p.stderr[-300:]}")
            except subprocess.TimeoutExpired:
                row = dict(error=f"stopped after {limit + 15:.0f} s", timeout_s=limit + 15)
                client.restart()
            if "rounds_s" in row and row["rounds_s"]:
                row.update(median_s=statistics.median(row["rounds_s"]), best_s=min(row["rounds_s"]))
            out[name] = row
            print(f"dask {name}: " + (row.get("error") or f"first {row['first_s']:.3f} s"), flush=True)
    return out


# =========================================================================== checks, targets, table
def compare(ref: Path, got: Path) -> Dict[str, Any]:
    """Whether the result at ``got`` equals NumPy's at ``ref`` (``numpy.allclose``: ``|got - ref| <= ATOL +
    RTOL * |ref|`` everywhere, and the same dtype). Also: ``max_abs_diff``; ``max_rel_diff`` over the elements
    with ``|ref| > ATOL`` (near zero, a relative difference means nothing: ``L @ U - A`` is roundoff there);
    ``worst_over_tolerance``: the largest ``|got - ref| / (ATOL + RTOL * |ref|)`` (equal means at most 1)."""
    if not got.exists():
        return dict(equal=False, why="no result")
    want, have = numpy.load(ref), numpy.load(got)
    if want.shape != have.shape:
        return dict(equal=False, why=f"shape {have.shape} != {want.shape}")
    w, h = want.astype(numpy.float64), have.astype(numpy.float64)
    diff, mag = numpy.abs(h - w), numpy.abs(w)
    big = mag > ATOL
    rel = float(numpy.max(diff[big] / mag[big])) if big.any() else 0.0
    over = float(numpy.max(diff / (ATOL + RTOL * mag))) if diff.size else 0.0
    ok = bool(numpy.allclose(have, want, rtol=RTOL, atol=ATOL)) and have.dtype == want.dtype
    return dict(equal=ok, max_abs_diff=float(diff.max()) if diff.size else 0.0, max_rel_diff=rel,
                worst_over_tolerance=over, dtype_equal=have.dtype == want.dtype)


#: The tolerances of :func:`compare` (``numpy.allclose``'s rtol and atol).
RTOL, ATOL = 1e-8, 1e-10


def evaluate(np_res, cold, reused, dask_res, checks) -> List[Dict[str, Any]]:
    """The issue's targets, computed from the measured numbers (target rows of reporting.target). The issue keeps
    the first call's compilation apart from the steady state ("kernels compiled once per machine and reused"):
    its target is the cold start reusing the cache; the compile cost is reported by :func:`compile_ratio`."""
    from reporting import target

    ratios = {n: cold[n]["median_s"] / np_res[n]["median_s"] for n in np_res if "median_s" in cold.get(n, {})}
    # over the limit: no warm run, the first run's time stands for it (slower than 10x NumPy either way)
    slow = {n: cold[n]["first_s"] / np_res[n]["median_s"] for n in np_res if "over_limit_s" in cold.get(n, {})}
    failed = [n for n in np_res if n not in ratios and n not in slow]
    every = list(ratios.values()) + list(slow.values())
    worst = max(every) if every and not failed else float("inf")
    med = statistics.median(every + [float("inf")] * len(failed)) if np_res else float("nan")
    reuse_ratio = max((reused[n]["first_s"] / cold[n]["median_s"] for n in ratios
                       if "first_s" in reused.get(n, {})), default=float("inf"))
    under = [n for n in np_res if np_res[n]["median_s"] < 1.0]
    return [
        target("programs: every nbmpi (2 ranks, warm median; the first run where that was over the time limit) "
               "time / NumPy's, worst program", worst, 1.0, higher_is_better=False),
        target("programs: median over the programs of nbmpi (2 ranks, warm) / NumPy time", med, 0.6,
               higher_is_better=False),
        target("programs: cold start in a new process reusing the kernel cache / warm, worst program",
               reuse_ratio, 2.0, higher_is_better=False),
        target("programs: every nbmpi result equals NumPy's",
               float(not failed and all(c["equal"] for c in checks.values())), 1.0),
        target("programs: programs where NumPy took under 1 s (the sizes must make it >= 1 s)", float(len(under)),
               0.0, higher_is_better=False),
    ]


def _equal_cell(check: Dict[str, Any], error: Optional[str]) -> str:
    if error:
        return f"failed: {error}"
    if check.get("equal"):
        return "yes"
    return f"NO ({check.get('why') or 'max relative difference %.3g' % check.get('max_rel_diff', float('nan'))})"


def compile_ratio(cold: Dict[str, Any]) -> Dict[str, Any]:
    """Reported, not a target: the worst program's first run with a new kernel cache (numba compiling its
    kernels) over its warm time, and that program (``None`` if no program has both)."""
    pairs = [(c["first_s"] / c["median_s"], n) for n, c in cold.items() if "first_s" in c and "median_s" in c]
    worst = max(pairs, default=(float("nan"), None))
    return dict(ratio=worst[0], program=worst[1])


def markdown(np_res, cold, reused, dask_res, checks, dask_checks, targets_rows) -> List[str]:
    """The section of the markdown report."""
    from reporting import md_table, targets_table

    def t(row, key):
        return f"{row[key]:.3f}" if key in row else "-"

    rows = []
    for n, r in np_res.items():
        c, u, d = cold.get(n, {}), reused.get(n, {}), dask_res.get(n, {})
        local = " (no distributed array was made: NumPy ran on every rank)" \
            if c.get("stats_rank0", {}).get("recorded", 1) == 0 else ""
        ratio = (f"{c['median_s'] / r['median_s']:.2f}{local}" if "median_s" in c else
                 f">= {c['first_s'] / r['median_s']:.1f} (first run over the {c['over_limit_s']:.0f} s limit: "
                 "no warm run)" if "over_limit_s" in c else "failed")
        dk = (f"{d['median_s']:.3f}" if "median_s" in d else f"n/a: {d.get('error', 'not run')}")
        dk_ratio = f"{d['median_s'] / r['median_s']:.2f}" if "median_s" in d else "-"
        sizes = ", ".join(f"{k}={v}" for k, v in r["sizes"].items()) or "as written"
        fb = ", ".join(f"{k} x{v}" for k, v in c.get("stats_rank0", {}).get("fallback_calls", {}).items()) or "-"
        rows.append([n, sizes, f"{r['median_s']:.3f}", t(c, "first_s"), t(u, "first_s"), t(c, "median_s"), ratio,
                     dk, dk_ratio, _equal_cell(checks.get(n, {}), c.get("error")),
                     _equal_cell(dask_checks.get(n, {}), d.get("error")) if "first_s" in d else "-", fb])
    comp = compile_ratio(cold)
    head = ["program", "size", "NumPy s (median)", "nbmpi cold s (fresh cache)", "nbmpi cold start s (cache reused)",
            "nbmpi warm s (median)", "nbmpi / NumPy", "dask.array s (median)", "dask / NumPy", "nbmpi equals NumPy",
            "dask equals NumPy", "NumPy-fallback calls (rank 0, all runs)"]
    return ["## NumPy programs (tests/numpy_programs), 2 ranks", "",
            "Each program as written, only its import swapped, at a size where NumPy takes >= 1 s (the values of "
            "its `# size` line in the size column). Times are whole programs (the gather of `result` included), "
            "nbmpi's the slowest rank's. Cold: the first run in a process with a new kernel cache directory "
            "(numba compilation included); cold start: the first run in a new process that reuses that cache; "
            "warm: the median of the later runs. dask.array: 2 worker processes x 1 thread, the import swapped for "
            "dask.array's functions with NumPy's constants; n/a names what dask lacks. The machine is shared "
            "with other jobs, so ratios are noisy.", "",
            md_table(head, rows), "", targets_table(targets_rows), "",
            "Reported, not a target (the issue keeps compilation apart: kernels are compiled once per machine): "
            "cold with a new kernel cache / warm, worst program: "
            f"{comp['ratio']:.1f} ({comp['program']}).", ""]
