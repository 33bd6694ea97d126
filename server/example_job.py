"""Example job of ``nbmpi demo``: a 1-D heat equation on N ranks with ArrayChannel halos.

Each rank owns a block of the rod. Every step, neighbouring ranks swap their
edge cells in place through one ArrayChannel per rank pair (rendezvous
put/take, even ranks send first so no pair deadlocks), relax their block
(Jacobi), and every ``--check`` steps all ranks agree on the residual with an
in-place ``allreduce``. Rank 0 prints the progress. Run it directly with
``nbmpi run -n 2 server/example_job.py`` or through the service with
``nbmpi submit server/example_job.py -n 2 --wait``; the service saves its trace.
"""
import argparse

import numpy as np

from nbmpi.workers import ArrayChannel, world

ap = argparse.ArgumentParser()
ap.add_argument("--cells", type=int, default=200_000, help="cells per rank")
ap.add_argument("--steps", type=int, default=200)
ap.add_argument("--check", type=int, default=20, help="steps between residual checks")
opt = ap.parse_args()

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()
u = np.zeros(opt.cells + 2)  # one ghost cell on each side
if rank == 0:
    u[0] = 100.0  # hot left end of the rod
# one channel per neighbour pair, created by its two members (left pair first: no cycle)
left = ArrayChannel((1,), np.float64, participants=(rank - 1, rank), name="halo") if rank > 0 else None
right = ArrayChannel((1,), np.float64, participants=(rank, rank + 1), name="halo") if rank + 1 < size else None
resid = ArrayChannel((1,), np.float64, name="residual")


def swap(ch, partner, mine, me_first):
    """Exchange one edge value with ``partner`` through ``ch`` (in place); return the partner's."""
    if me_first:
        ch[0] = mine
        ch.put(partner)
        ch.take(partner)
        return float(ch[0])
    ch.take(partner)
    got = float(ch[0])
    ch[0] = mine
    ch.put(partner)
    return got


for step in range(1, opt.steps + 1):
    # even ranks swap with their right neighbour first, odd ranks with their left: pairs never wait in a cycle
    for side in ((right, left) if rank % 2 == 0 else (left, right)):
        if side is right and right is not None:
            u[-1] = swap(right, rank + 1, u[-2], rank % 2 == 0)
        elif side is left and left is not None:
            u[0] = swap(left, rank - 1, u[1], rank % 2 == 0)
    new = 0.5 * (u[:-2] + u[2:])
    change = float(np.abs(new - u[1:-1]).max())
    u[1:-1] = new
    if step % opt.check == 0:
        resid[0] = change
        resid.allreduce("max")
        if rank == 0:
            print(f"step {step:4d}: max change {resid[0]:.3e}", flush=True)
heat = np.array([u[1:-1].sum()])
total = np.empty(1)
comm.Allreduce(heat, total)
if rank == 0:
    print(f"done: {size} ranks x {opt.cells} cells, {opt.steps} steps, heat in the rod {total[0]:.3f}")
