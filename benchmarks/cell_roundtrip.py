"""Pool start and restart against ipyparallel's own MPI cluster, and an empty cell's round trip against ``%%px``.

One command: ``python benchmarks/cell_roundtrip.py [--quick]``. Everything runs in one in-process
IPython shell with ``nbmpi.kernel_ext`` loaded, as a notebook kernel would, on 2 ranks:

* start: ``ipyparallel.Cluster(engines="mpi", n=2)`` started until both engines answer, then
  ``%distributed start -n 2``, then ``%distributed restart``, interleaved over ``--rounds`` rounds
  (every path pays the same machine load; the imports were warmed once before timing). Targets:
  our start at most ipyparallel's (median), our restart at most our start (median);
* cell: an empty cell (``pass``) through ``%%px`` (activated on the very same engines) and through
  ``%%distributed``, interleaved. Target: ``%%distributed`` at most 1.2x ``%%px`` (median).

Writes ``benchmarks/results/cell_roundtrip[_quick].json`` and ``.md``; targets are checked from
the measured numbers.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import benchmark_parser, md_table, target, targets_table, write_results  # noqa: E402


def time_ipyparallel_start() -> float:
    """Seconds until an ipyparallel MPI cluster of 2 engines answers (then it is stopped, untimed)."""
    import ipyparallel as ipp

    t0 = time.perf_counter()
    cluster = ipp.Cluster(engines="mpi", n=2, log_level=40)
    cluster.start_cluster_sync()
    client = cluster.connect_client_sync()
    client.wait_for_engines(2, timeout=120)
    client[:].apply_sync(os.getpid)
    took = time.perf_counter() - t0
    client.close()
    cluster.stop_cluster_sync()
    return took


def main(argv=None) -> int:
    p = benchmark_parser(__doc__, "1 round and 20 cells (the test suite)")
    p.add_argument("--reps", type=int, default=None, help="empty cells per magic (default 300, quick 20)")
    p.add_argument("--rounds", type=int, default=None, help="start/restart rounds (default 5, quick 1)")
    a = p.parse_args(argv)
    reps = a.reps or (20 if a.quick else 300)
    rounds = a.rounds or (1 if a.quick else 5)
    # ipyparallel's MPI launcher calls `mpiexec` from PATH: the one of this environment
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")

    from IPython.testing.globalipapp import start_ipython

    import ipyparallel  # noqa: F401 - warm the imports every path uses

    ip = start_ipython()
    ip.run_line_magic("load_ext", "nbmpi.kernel_ext")
    from nbmpi.kernel_ext import _magics

    def magic(line: str) -> float:
        t0 = time.perf_counter()
        r = ip.run_cell(line, silent=True)
        took = time.perf_counter() - t0
        assert r.success, (line, r.error_in_exec)
        return took

    times = {"ipyparallel": [], "start": [], "restart": []}
    for k in range(rounds):
        times["ipyparallel"].append(time_ipyparallel_start())
        times["start"].append(magic("%distributed start -n 2 --name bench"))
        times["restart"].append(magic("%distributed restart bench"))
        if k < rounds - 1:
            magic("%distributed stop bench")
        print(f"round {k + 1}/{rounds}: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in times.items()), flush=True)

    pool = _magics.pools["bench"]
    pool.client()[:].activate()  # registers %%px on this shell, same engines
    cells = {"px": "%%px --block\npass", "distributed": "%%distributed\npass"}
    cell_times = {k: [] for k in cells}
    for k, c in cells.items():  # warm-up
        for _ in range(3):
            assert ip.run_cell(c, silent=True).success
    for _ in range(reps):
        for k, c in cells.items():
            t0 = time.perf_counter()
            ok = ip.run_cell(c, silent=True).success
            cell_times[k].append(time.perf_counter() - t0)
            assert ok, k
    ip.run_cell("%distributed stop bench", silent=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    cmed = {k: statistics.median(v) for k, v in cell_times.items()}
    targets = [
        target("pool start: %distributed start / ipyparallel Cluster(engines='mpi') (median)",
               med["start"] / med["ipyparallel"], 1.0, higher_is_better=False),
        target("pool restart: %distributed restart / %distributed start (median)", med["restart"] / med["start"], 1.0,
               higher_is_better=False),
        target("empty-cell round trip %%distributed / %%px (2 ranks)", cmed["distributed"] / cmed["px"], 1.2,
               higher_is_better=False),
    ]
    data = dict(quick=a.quick, rounds=rounds, reps=reps, ranks=2,
                start_s={k: dict(median=med[k], min=min(v), max=max(v), all=v) for k, v in times.items()},
                roundtrip_ms={k: dict(median=cmed[k] * 1e3, p10=sorted(v)[len(v) // 10] * 1e3,
                                      p90=sorted(v)[9 * len(v) // 10] * 1e3) for k, v in cell_times.items()},
                targets=targets)
    md = f"## Pool start and restart, 2 ranks ({rounds} interleaved rounds)\n\n" + md_table(
        ["path", "median s", "min s", "max s"],
        [["ipyparallel Cluster(engines='mpi', n=2) until engines answer", *_stats(times["ipyparallel"])],
         ["%distributed start -n 2", *_stats(times["start"])],
         ["%distributed restart", *_stats(times["restart"])]])
    md += "\n\n## Empty cell, 2 ranks\n\n" + md_table(
        ["magic", "median ms", "p10 ms", "p90 ms"],
        [[k, data["roundtrip_ms"][k]["median"], data["roundtrip_ms"][k]["p10"], data["roundtrip_ms"][k]["p90"]]
         for k in cells])
    md += "\n\n## Targets\n\n" + targets_table(targets)
    path = write_results("cell_roundtrip" if not a.quick else "cell_roundtrip_quick", data, md,
                         Path(a.out_dir) if a.out_dir else None)
    print(md)
    print(f"wrote {path}")
    return 0


def _stats(v):
    return [statistics.median(v), min(v), max(v)]


if __name__ == "__main__":
    sys.exit(main())
