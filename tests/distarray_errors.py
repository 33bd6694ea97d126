"""Error cases of the distributed arrays, run SPMD by tests/test_distarray.py (2 and 3 ranks, NBMPI_TIMEOUT=2).
Every case must raise the expected error on every rank (each rank prints `rank R raised CASE: ...`), and
after each one the arrays stay usable. The last case (a rank late beyond the timeout) must end with a
DistArrayTimeout on every rank instead of a hang."""
import time

import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers import world
from spmd_checks import expect

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()


a = dnp.zeros((13, 7))
b = dnp.zeros((13, 5), dist="cyclic")
expect("shapes", dnp.ShapeError, lambda: a + b, ["add", "(13, 7)", "(13, 5)", "broadcast"])
expect("assignment shape", dnp.ShapeError, lambda: a.__setitem__(slice(0, 2), a[0:3]),
       ["could not broadcast", "(3, 7)", "(2, 7)"])
other = dnp.zeros((13, 7), comm=comm.Dup())
expect("distributions on different communicators", dnp.DistributionError, lambda: a + other,
       ["add", "different communicators"])
expect("unknown distribution", dnp.DistributionError, lambda: dnp.zeros(5, dist="diagonal"),
       ["unknown distribution 'diagonal'", "block-cyclic"])
expect("block size", dnp.DistributionError, lambda: dnp.zeros(5, dist=("block-cyclic", 0)), ["block size"])
expect("matmul shapes", dnp.ShapeError, lambda: a @ dnp.zeros(5), ["matmul", "size 5 is different from 7"])
assert float(dnp.sum(a + 1)) == 91.0  # still usable

c = dnp.ones(20)


def diverge_ops():
    d = c + 1 if rank == 0 else c * 2
    return float(dnp.sum(d))


expect("divergence (different operations)", dnp.DistArrayDivergence, diverge_ops,
       ["rank 0 recorded", "rank 1 recorded", "add(", "multiply(", "float()"])


def diverge_count():
    d = c + 1
    if rank == size - 1:
        d = d + 1
    return float(dnp.sum(d))


expect("divergence (an extra operation on one rank)", dnp.DistArrayDivergence, diverge_count,
       ["operation 2 since the previous force point", "sum(", f"rank {size - 1} recorded array#10 = add("])


def diverge_shape():
    e = dnp.from_numpy(np.zeros(10 + rank))
    return float(dnp.sum(e))


expect("divergence (shapes differ)", dnp.DistArrayDivergence, diverge_shape, ["operation 1"])
assert float(dnp.sum(c * 3)) == 60.0  # usable again after a divergence

g = dnp.ones((12, 4), dist=("block-cyclic", 2))
for k in range(3):   # every rank hashes the views of offsets 0..2: their signatures are cached alike
    assert float(dnp.sum(g[k:k + 8] * 2)) == 64.0


def diverge_view():
    k = rank % 2     # the same operations, at views whose offsets differ between ranks (cached ones)
    return float(dnp.sum(g[k:k + 8] * 2))


expect("divergence (views differ)", dnp.DistArrayDivergence, diverge_view,
       ["operation 1 since the previous force point", "rank 0 recorded", "rank 1 recorded"])

p = dnp.arange(3)
q = dnp.arange(6.0).reshape(2, 3)


def diverge_gather():
    if rank == 0:
        str(p)           # print(p) on rank 0 alone: its gather met the others' gather of q
    return np.asarray(q)


expect("divergence (gathers of different arrays)", dnp.DistArrayDivergence, diverge_gather,
       ["rank 0 recorded to_numpy(): gather of array#", "(3,) int64", "rank 1 recorded to_numpy(): gather of array#",
        "(2, 3) float64", "x = a.to_numpy() on every rank"])
assert np.asarray(q).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and str(p) == "[0 1 2]"   # usable again


def late_rank():
    if rank == size - 1:
        time.sleep(4.5)  # longer than NBMPI_TIMEOUT=2: the others give up; then this rank finds them gone
    return float(dnp.sum(c))


t0 = time.monotonic()
expect("a rank late beyond NBMPI_TIMEOUT", dnp.DistArrayTimeout, late_rank, ["timed out", "force point"])
print(f"rank {rank} done after {time.monotonic() - t0:.1f} s", flush=True)
