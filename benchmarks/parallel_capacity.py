"""How much of two cores two processes get on this machine right now, measured next to a benchmark.

A benchmark that compares nbmpi on 2 ranks with NumPy in one process assumes the machine gives two processes at
once twice the work of one. A shared machine does not always: on the machine of this project two processes have
each run 25-100 % slower than one alone on some days. This module measures it, so a report can say what the
machine gave during its run:

* one process runs a fixed piece of work alone, then two copies run at once (new processes each, BLAS on one
  thread); each reports its own time;
* the work is of two kinds, measured apart: a Python loop (what the runtime's own bookkeeping is) and NumPy
  matrix-vector products over a matrix larger than the caches (memory-bound, what LU's steps are);
* the **capacity** of a kind is ``2 * alone / mean(at once)``: 2.0 when two processes run as fast as one alone, 1.0
  when together they do only one process's work.

One command: ``python benchmarks/parallel_capacity.py`` prints the measurement as JSON.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

#: The work each process does: a Python loop and NumPy matrix-vector products, each timed by the process itself.
WORK = """
import json, sys, time
import numpy as np
SCALE = float(sys.argv[1])
a = np.random.default_rng(0).normal(size=(1500, 1500)); v = np.ones(1500)
a @ v
t = time.perf_counter()
for _ in range(int(400 * SCALE)):
    a @ v
mem = time.perf_counter() - t
t = time.perf_counter(); s = 0
for i in range(int(2_500_000 * SCALE)):
    s += i
print(json.dumps(dict(python_s=time.perf_counter() - t, memory_s=mem)))
"""

KINDS = ("python", "memory")


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[v] = "1"
    return env


def _run(copies: int, scale: float) -> List[Dict[str, float]]:
    """Start ``copies`` processes of :data:`WORK` (its loops ``scale`` times as long) at once; each one's times
    (blocking until all have ended)."""
    procs = [subprocess.Popen([sys.executable, "-c", WORK, str(scale)], stdout=subprocess.PIPE, env=_env(), text=True)
             for _ in range(copies)]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"the capacity probe's process exited with {p.returncode}")
        out.append(json.loads(stdout))
    return out


def measure(scale: float = 1.0) -> Dict[str, Any]:
    """One process alone, then two at once (about 2-6 s in all at ``scale`` 1; the loops ``scale`` times as long);
    per kind of work the times and the capacity (``2 * alone / mean of the two``). Blocking; starts and waits for
    its own processes only."""
    alone = _run(1, scale)[0]
    both = _run(2, scale)
    res: Dict[str, Any] = dict(alone=alone, at_once=both)
    for kind in KINDS:
        key = f"{kind}_s"
        mean = sum(b[key] for b in both) / len(both)
        res[f"{kind}_capacity"] = 2 * alone[key] / mean if mean > 0 else float("nan")
    return res


def summary(res: Dict[str, Any]) -> str:
    """One sentence for a report: the capacity per kind, with the times it comes from."""
    parts = []
    for kind, what in (("python", "a Python loop"), ("memory", "NumPy matrix-vector products")):
        key = f"{kind}_s"
        parts.append(f"{res[kind + '_capacity']:.2f} for {what} ({res['alone'][key]:.2f} s alone, "
                     + " and ".join(f"{b[key]:.2f}" for b in res["at_once"]) + " s at once)")
    return ("Two processes at once did the work of this many processes alone (2.00: two full cores; 1.00: "
            "together no more than one process alone): " + "; ".join(parts) + ".")


if __name__ == "__main__":
    r = measure()
    print(json.dumps(r, indent=1))
    print(summary(r))
