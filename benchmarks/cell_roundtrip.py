"""Round trip of an empty cell: ``%%distributed`` vs ipyparallel's ``%%px`` on the same engines, and pool start time.

One command: ``python benchmarks/cell_roundtrip.py [--quick]``. An in-process
IPython shell loads ``nbmpi.kernel_ext``, starts a 2-rank pool (start time
measured, ``--starts`` times), activates ipyparallel's ``%%px`` on the very
same client/engines, then runs an empty cell (``pass``) through both magics,
interleaved (px, distributed, px, ...) so machine load hits both alike.
Reports the median and the ratio distributed/px; the target "empty-cell round
trip at most 1.2x %%px" is checked here (PASS/FAIL in the JSON and table).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import md_table, targets_table, target, write_results  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few repetitions (smoke test)")
    p.add_argument("--reps", type=int, default=None, help="empty cells per magic (default 300, quick 20)")
    p.add_argument("--starts", type=int, default=None, help="pool starts to time (default 3, quick 1)")
    p.add_argument("--out-dir", default=None, help="where to write the JSON/markdown (default benchmarks/results)")
    a = p.parse_args(argv)
    reps = a.reps or (20 if a.quick else 300)
    starts = a.starts or (1 if a.quick else 3)

    from IPython.testing.globalipapp import start_ipython

    from nbmpi.workers.engine_pool import Pool

    ip = start_ipython()
    ip.run_line_magic("load_ext", "nbmpi.kernel_ext")
    start_s = []
    for _ in range(starts - 1):
        t0 = time.perf_counter()
        Pool(2).start().stop()
        start_s.append(time.perf_counter() - t0)
    from nbmpi.kernel_ext import _magics

    t0 = time.perf_counter()
    r = ip.run_cell("%distributed start -n 2 --name bench", silent=True)
    start_s.append(time.perf_counter() - t0)
    assert r.success, r
    pool = _magics.pools["bench"]
    pool.client()[:].activate()  # registers %%px on this shell, same engines
    cells = {"px": "%%px --block\npass", "distributed": "%%distributed\npass"}
    times = {k: [] for k in cells}
    for k, c in cells.items():  # warm-up
        for _ in range(3):
            assert ip.run_cell(c, silent=True).success
    for _ in range(reps):
        for k, c in cells.items():
            t0 = time.perf_counter()
            ok = ip.run_cell(c, silent=True).success
            times[k].append(time.perf_counter() - t0)
            assert ok, k
    ip.run_cell("%distributed stop", silent=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["distributed"] / med["px"]
    targets = [target("empty-cell round trip %%distributed / %%px (2 ranks)", ratio, 1.2, higher_is_better=False)]
    data = dict(quick=a.quick, reps=reps, ranks=2,
                roundtrip_ms={k: dict(median=med[k] * 1e3, p10=sorted(v)[len(v) // 10] * 1e3,
                                      p90=sorted(v)[9 * len(v) // 10] * 1e3) for k, v in times.items()},
                ratio_distributed_to_px=ratio, pool_start_s=start_s, targets=targets)
    rows = [[k, data["roundtrip_ms"][k]["median"], data["roundtrip_ms"][k]["p10"], data["roundtrip_ms"][k]["p90"]]
            for k in cells]
    md = (md_table(["magic (empty cell, 2 ranks)", "median ms", "p10 ms", "p90 ms"], rows)
          + f"\n\nratio %%distributed / %%px: {ratio:.3f}\n\npool start (2 ranks), s: "
          + ", ".join(f"{s:.2f}" for s in start_s) + "\n\n## Targets\n\n" + targets_table(targets))
    path = write_results("cell_roundtrip" if not a.quick else "cell_roundtrip_quick", data, md, a.out_dir)
    print(md)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
