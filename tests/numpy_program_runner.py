"""Run plain NumPy programs of ``tests/numpy_programs/`` unchanged but for their import, and save each ``result``.

``python numpy_program_runner.py numpy|dnp OUTDIR PROGRAM.py [PROGRAM.py ...]``: with ``dnp`` each program's line
``import numpy as np`` becomes ``import nbmpi.workers.distarray as np`` (run it under ``nbmpi run``: every rank
runs each program SPMD); with ``numpy`` they run as written, in one process. Each program leaves its answer in
``result``; rank 0 saves it (gathered) to ``OUTDIR/NAME.npy`` and prints ``MODE NAME: SECONDS s`` (the program's
time, the gather of the result included). A program that raises prints ``MODE NAME: FAILED`` and its traceback;
the next one runs."""
import os
import sys
import time
import traceback

import numpy

IMPORT = "import numpy as np\n"


def run_one(mode: str, program: str, outdir: str, rank: int) -> None:
    name = os.path.splitext(os.path.basename(program))[0]
    source = open(program, encoding="utf-8").read()
    if source.count(IMPORT) != 1:
        raise SystemExit(f"{program}: expected exactly one line {IMPORT.strip()!r}")
    if mode == "dnp":
        source = source.replace(IMPORT, "import nbmpi.workers.distarray as np\n")
    namespace = {"__name__": "__main__", "__file__": program}
    t0 = time.perf_counter()
    try:
        exec(compile(source, program, "exec"), namespace)       # noqa: S102 - running the program is the point
        result = numpy.asarray(namespace["result"])               # a DistArray is gathered here (every rank)
    except Exception:                                             # noqa: BLE001 - reported, and the next runs
        print(f"{mode} {name}: FAILED on rank {rank}\n{traceback.format_exc()}", flush=True)
        return
    elapsed = time.perf_counter() - t0
    if rank == 0:
        numpy.save(os.path.join(outdir, name + ".npy"), result)
        print(f"{mode} {name}: {elapsed:.3f} s", flush=True)


def main() -> None:
    mode, outdir, programs = sys.argv[1], sys.argv[2], sys.argv[3:]
    rank = 0
    if mode == "dnp":
        from nbmpi.workers import world
        rank = world().Get_rank()
    for program in programs:
        run_one(mode, program, outdir, rank)


if __name__ == "__main__":
    main()
