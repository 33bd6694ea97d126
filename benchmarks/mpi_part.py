"""The MPI part of a side-by-side benchmark: the main process runs the benchmark script again on N ranks
(``--mpi-part FILE``) with the project's launcher and reads back the JSON that rank 0 wrote; inside the part,
a step's time is the slowest rank's."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple


#: The hidden option that tells a benchmark script it runs as the MPI part and where rank 0 writes its JSON.
PART_OPTION = "--mpi-part"


def add_part_option(parser: argparse.ArgumentParser) -> None:
    """Add the hidden ``--mpi-part FILE`` option that :func:`run_part` passes (``args.mpi_part``: None
    when the script runs as the main process)."""
    parser.add_argument(PART_OPTION, default=None, metavar="FILE", help=argparse.SUPPRESS)


def run_part(nranks: int, script: str, part: Path, args: Sequence[str] = (),
             env: Optional[Dict[str, str]] = None,
             hosts: Optional[Sequence[str]] = None) -> Tuple[int, Optional[Dict[str, Any]]]:
    """Run ``script --mpi-part PART *args`` on ``nranks`` ranks (``nbmpi.workers.launch.launcher.run``; ``env`` entries
    are added to the ranks' environment; ``hosts``: placed on those hosts, as ``nbmpi run --hosts``). Blocks until
    every rank has ended. Returns ``(0, the JSON in PART)``, or ``(exit code, None)`` after a line on stderr if the
    part failed or wrote nothing. Called by the main process only."""
    from nbmpi.workers.launch.launcher import run

    code = run(nranks, [str(script), PART_OPTION, str(part), *args], env=env, hosts=hosts)
    if code != 0:
        print(f"the {nranks}-rank MPI part failed with exit code {code}", file=sys.stderr)
        return code, None
    if not Path(part).exists():
        print(f"the {nranks}-rank MPI part ended with exit code 0 but rank 0 wrote no results to {part}",
              file=sys.stderr)
        return 1, None
    return 0, json.loads(Path(part).read_text())


def slowest_rank(comm, fn: Callable[[], Any], reps: int = 1) -> Tuple[Any, float]:
    """Collective over ``comm``: a barrier, then ``fn()`` ``reps`` times on every rank; returns ``(the last
    call's result, seconds per call on the slowest rank)`` (an Allreduce MAX of every rank's mean time)."""
    import numpy
    from nbmpi.workers.core.runtime import MPI

    comm.Barrier()
    t0 = time.perf_counter()
    res = None
    for _ in range(reps):
        res = fn()
    dt = numpy.array([(time.perf_counter() - t0) / reps])
    out = numpy.empty(1)
    comm.Allreduce(dt, out, op=MPI().MAX)
    return res, float(out[0])
