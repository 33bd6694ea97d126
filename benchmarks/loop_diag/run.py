"""The trace_index benchmark's :func:`measure` with the controller's event loop instrumented
(:mod:`sitecustomize` of this directory), and a report of the loop's lateness per phase.

Run: ``python benchmarks/loop_diag/run.py OUT_DIR [--events N] [--runs R]`` (one controller per run;
raw probe samples in ``OUT_DIR/res.json``, the loop's lines in ``OUT_DIR/loop-PID.txt``); then
``python benchmarks/loop_diag/run.py OUT_DIR --report`` prints, for the index build (job end to index
ready) and the figure/window requests: health answers above 100 ms, the loop's lateness (10 ms timer)
and the loop thread's runqueue wait and run time per second.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _q(xs: list, p: float) -> float:
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def measure_runs(out: Path, events: int, runs: int) -> None:
    """``runs`` times: a controller (with the loop diagnostics) and the benchmark's measure; raw data to ``out``."""
    sys.path.insert(0, str(HERE.parent))
    import trace_index as bench

    res = []
    for _ in range(runs):
        tmp = Path(tempfile.mkdtemp(prefix="nbmpi-loopdiag-"))
        srv = bench.Server(tmp / "data", max_ranks=2).start()
        try:
            m = bench.measure(srv, events, 10.0)
        finally:
            srv.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        d = bench.summarize(events, m)
        d.pop("targets")
        d.update(probe=list(zip(m["probe"].times, [s for _, s in m["probe"].samples])), ready_t=m["ready"],
                 pid=srv.proc.pid)
        res.append(d)
    (out / "res.json").write_text(json.dumps(res))


def _beats(path: Path) -> list:
    """(due, lateness, run s, runqueue-wait s) per heartbeat, the times since the previous one."""
    raw = []
    for line in open(path):
        if line.startswith("B "):
            a, b, run, wait, _mf = line[2:].split()
            raw.append((float(a), float(b), int(run), int(wait)))
    return [(b[0], b[1], (b[2] - p[2]) / 1e9, (b[3] - p[3]) / 1e9) for p, b in zip(raw, raw[1:])]


def report(out: Path) -> None:
    """One line per run and phase (see the module docstring)."""
    for r in json.loads((out / "res.json").read_text()):
        beats = _beats(out / f"loop-{r['pid']}.txt")
        ready, build = r["ready_t"], r["index_ready_after_job_end_s"]
        for name, lo, hi in (("build", ready - build, ready), ("requests", ready, float("inf"))):
            hs = sorted(s for t, s in r["probe"] if lo < t <= hi)
            bs = [b for b in beats if lo < b[0] <= hi]
            lat = sorted(b[1] for b in bs)
            span = (bs[-1][0] - bs[0][0]) if len(bs) > 1 else 1.0
            over = sum(x > 0.1 for x in hs)
            print(f"{name:8s} {span:6.1f} s  health n={len(hs)} >100 ms {over} ({100 * over / max(1, len(hs)):.2f} %) "
                  f"p99 {_q(hs, .99) * 1e3:.1f} max {(hs[-1] if hs else 0) * 1e3:.1f} ms | loop lateness p99 "
                  f"{_q(lat, .99) * 1e3:.1f} max {(lat[-1] if lat else 0) * 1e3:.1f} ms, >50 ms "
                  f"{sum(x > 0.05 for x in lat)} | loop thread runqueue wait {sum(b[3] for b in bs) / span * 1e3:.0f}"
                  f" ms/s, run {sum(b[2] for b in bs) / span * 1e3:.0f} ms/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--events", type=int, default=4_000_000)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--report", action="store_true", help="only print the report of OUT")
    args = p.parse_args()
    if args.report:
        return report(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    if os.environ.get("NBMPI_LOOPDIAG") != str(args.out.resolve()):   # again, with the diagnostics on
        env = dict(os.environ, NBMPI_LOOPDIAG=str(args.out.resolve()),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
        sys.exit(subprocess.call([sys.executable, __file__, *sys.argv[1:]], env=env))
    measure_runs(args.out, args.events, args.runs)
    report(args.out)


if __name__ == "__main__":
    main()
