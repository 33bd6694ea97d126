"""Where a distributed-array program's time goes, rank by rank: a diagnosis of one program, not a comparison.

``python benchmarks/distarray_phases.py PROGRAM [--size NAME=VALUE ...] [--ranks N] [--rounds R]`` runs one program
of ``tests/numpy_programs/`` (its import swapped, as ``distarray.py`` does; ``--size`` sets values of its ``# size``
line, default the size ``distarray.py`` uses) ``1 + R`` times on ``N`` ranks in one process, and NumPy's run of it
``R`` times in this process for scale. The first nbmpi run (compilation, plan building, first touch of memory) is
reported apart; the warm runs' phases are each the median over the ``R`` warm runs, per rank:

* **recording**: the program's time outside force points (Python, recording the operations, the cyclic garbage
  collector's work there);
* **force points** (``run_flush``), split into the agreement hash, fusion (``optimize``), lowering (building the
  units, the plan cache included), dependency ordering (latency hiding), execution (the units, computing and
  sending; **waiting**: blocked on other ranks, part of execution) and disposal; *other* is the rest of the force
  points (the agreement's wait, barriers);
* **gc**: the cyclic collector's time inside force points, outside them (part of recording), and in the
  collections that follow a force point which made new kernels or plans (``freeze_new_kernels``, also part of
  recording).

The phases are measured by wrapping the engine's functions (:data:`HOOKS`); a hook whose function is gone makes the
tool stop with its name. Timing wrappers add a few microseconds per call: compare runs of this tool with each other,
not with ``distarray.py``'s times. Results: ``distarray_phases_PROGRAM.json`` and ``.md`` (``--out-dir``).
"""
from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from distarray_programs import FULL_SIZES, PROGRAM_DIR, program_source, run_source  # noqa: E402
from mpi_part import add_part_option, run_part  # noqa: E402
from reporting import benchmark_parser, md_table, write_results  # noqa: E402

#: ``(module under nbmpi.workers.distarray, attribute path, phase)``: each function is wrapped to add its time to
#: its phase. ``order_units`` is called inside ``build`` (lowering is ``build`` minus it); ``_wait_one`` inside
#: ``execute``.
HOOKS = (
    ("scheduler", "run_flush", "force_points"),
    ("scheduler", "_hash_tasks", "agreement_hash"),
    ("scheduler", "optimize", "fusion"),
    ("scheduler", "_Flush.build", "build"),
    ("scheduler", "order_units", "dependencies"),
    ("scheduler", "_Flush.execute", "execution"),
    ("scheduler", "_Flush._wait_one", "waiting"),
    ("scheduler", "_Flush.dispose", "disposal"),
    ("context", "freeze_new_kernels", "freeze"),
)
#: The phases of a warm run, in the order of the tables.
PHASES = ("program", "recording", "force_points", "agreement_hash", "fusion", "lowering", "dependencies",
          "execution", "waiting", "disposal", "other", "gc_recording", "gc_force_points", "gc_freeze")


class PhaseClock:
    """Times of the engine's phases (:data:`HOOKS`) and of the cyclic collector, in nanoseconds, for one rank.
    Installed on one process by :meth:`install`; :meth:`take` returns and clears what was measured."""

    def __init__(self) -> None:
        self.ns: Counter = Counter()
        self.where: List[str] = []      # the hooked phases now running (innermost last)
        self._gc_t0 = 0
        self._gc_where = ""

    def install(self) -> None:
        """Wrap every hook's function and register a garbage-collector callback. SystemExit naming a hook
        whose function the engine no longer has."""
        import importlib
        for mod_name, path, phase in HOOKS:
            owner: Any = importlib.import_module(f"nbmpi.workers.distarray.{mod_name}")
            *outer, name = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            fn = getattr(owner, name, None)
            if fn is None:
                raise SystemExit(f"distarray_phases: nbmpi.workers.distarray.{mod_name}.{path} is gone; "
                                 "update HOOKS in benchmarks/distarray_phases.py")
            setattr(owner, name, self._wrap(fn, phase))
        gc.callbacks.append(self._on_gc)

    def _wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        ns, where, now = self.ns, self.where, time.perf_counter_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            where.append(phase)
            t0 = now()
            try:
                return fn(*args, **kwargs)
            finally:
                ns[phase] += now() - t0
                where.pop()
        return timed

    def _on_gc(self, stage: str, info: Dict[str, Any]) -> None:
        if stage == "start":
            self._gc_where = ("gc_freeze" if "freeze" in self.where else
                              "gc_force_points" if "force_points" in self.where else "gc_recording")
            self._gc_t0 = time.perf_counter_ns()
        else:
            self.ns[self._gc_where] += time.perf_counter_ns() - self._gc_t0

    def take(self, program_s: float) -> Dict[str, float]:
        """Seconds per phase of the run that took ``program_s`` (derived: recording, lowering, other); clears."""
        s = {k: v / 1e9 for k, v in self.ns.items()}
        self.ns.clear()
        out = {p: s.get(p, 0.0) for p in PHASES}
        fp = out["force_points"]
        out.update(program=program_s, recording=program_s - fp,
                   lowering=s.get("build", 0.0) - out["dependencies"],
                   other=fp - sum(s.get(p, 0.0) for p in ("agreement_hash", "fusion", "build", "execution",
                                                          "disposal")))
        return out


def mpi_part(args) -> None:
    """Every rank (SPMD): the program once, then ``args.rounds`` times, each phase timed; rank 0 writes every
    rank's phases of every run to ``args.mpi_part``."""
    from nbmpi.workers import world

    comm = world()
    clock = PhaseClock()
    clock.install()
    src = program_source(args.program, "nbmpi.workers.distarray", parse_sizes(args))
    runs = []
    for _ in range(1 + args.rounds):
        comm.Barrier()
        t0 = time.perf_counter()
        run_source(src, args.program)
        runs.append(clock.take(time.perf_counter() - t0))
    every = comm.gather(runs, root=0)
    if comm.Get_rank() == 0:
        Path(args.mpi_part).write_text(json.dumps(every))


def parse_sizes(args) -> Dict[str, Any]:
    """The program's sizes: ``distarray.py``'s for it, with ``--size NAME=VALUE`` (a Python literal) on top."""
    import ast
    sizes = dict(FULL_SIZES.get(args.program, {}))
    for item in args.size:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--size {item!r}: write NAME=VALUE, like --size n=1800")
        try:
            sizes[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise SystemExit(f"--size {item!r}: the value must be a Python number or literal") from None
    return sizes


def report(program: str, sizes: Dict[str, Any], numpy_s: List[float], every: List[List[Dict[str, float]]]):
    """The JSON data and markdown of the phases of ``every`` rank's runs (run 0 apart, the rest as medians)."""
    warm = [{p: statistics.median(r[p] for r in runs[1:]) for p in PHASES} for runs in every]
    first = [runs[0] for runs in every]
    data = dict(program=program, sizes=sizes, ranks=len(every), numpy_rounds_s=numpy_s,
                numpy_median_s=statistics.median(numpy_s), first_run=first, warm_median=warm, runs=every)
    rows = [[p] + [w[p] for w in warm] + [f[p] for f in first] for p in PHASES]
    heads = ["phase (s)"] + [f"rank {r} warm" for r in range(len(every))] + \
        [f"rank {r} first run" for r in range(len(every))]
    md = (f"Program `{program}` at {sizes or 'its test size'}, nbmpi on {len(every)} ranks: each warm value is the "
          f"median of {len(every[0]) - 1} warm runs, phase by phase (so the warm parts need not add up to the warm "
          f"program time). NumPy in one process: median {data['numpy_median_s']:.3f} s "
          f"of {len(numpy_s)} runs.\n\n" + md_table(heads, rows) + "\n\n"
          "waiting is part of execution, gc_force_points of the force points; gc_recording and gc_freeze (the "
          "collections after a force point that made new kernels or plans) are part of recording.")
    return data, md


def main() -> None:
    p = benchmark_parser(__doc__, "one warm round (a smoke test of the tool)")
    p.add_argument("program", help="a program of tests/numpy_programs, by name (lu_decomposition)")
    p.add_argument("--size", action="append", default=[], metavar="NAME=VALUE",
                   help="a value of the program's '# size' line (repeatable); default distarray.py's size")
    p.add_argument("--ranks", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="warm runs after the first (default 3, quick 1)")
    add_part_option(p)
    args = p.parse_args()
    if not (PROGRAM_DIR / f"{args.program}.py").exists():
        names = ", ".join(sorted(q.stem for q in PROGRAM_DIR.glob("*.py")))
        raise SystemExit(f"no program {args.program!r} in {PROGRAM_DIR}; the programs are: {names}")
    if args.quick:
        args.rounds = 1
    if args.rounds < 1 or args.ranks < 1:
        raise SystemExit("--rounds and --ranks must be at least 1")
    if args.mpi_part:
        mpi_part(args)
        return
    sizes = parse_sizes(args)
    src = program_source(args.program, "numpy", sizes)
    numpy_s = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        run_source(src, args.program)
        numpy_s.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory(prefix="nbmpi-phases-") as tmp:
        extra = [args.program, "--rounds", str(args.rounds)] + [f"--size={s}" for s in args.size]
        code, every = run_part(args.ranks, __file__, Path(tmp) / "part.json", extra)
    if code != 0:
        raise SystemExit(code)
    data, md = report(args.program, sizes, numpy_s, every)
    path = write_results(f"distarray_phases_{args.program}", data, md, args.out_dir)
    print(md + f"\n\n{path}")


if __name__ == "__main__":
    main()
