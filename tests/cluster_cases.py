"""Every rank-to-rank capability with ranks on different nodes of a virtual cluster, checked against NumPy.

Run by tests/test_cluster.py under ``nbmpi run --hosts`` (one rank per node, or more ranks than
nodes: placement as ``mpiexec -hosts`` fills the hosts in order, so ranks r and r + nodes share a node).
Each section ends with ``ok NAME`` from rank 0 (:func:`spmd_checks.section`); ``ALL OK`` at the end.
Argument: the number of nodes.
"""
import socket
import sys

import numba
import numpy as np

from nbmpi.workers import Aggregator, ArrayChannel, shared
from spmd_checks import comm, rank, section, size

NODES = int(sys.argv[1])


def say(line: str) -> None:
    """One write per line: output of ranks on other nodes reaches mpiexec at any moment."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


host = socket.gethostname()
hosts = comm.allgather(host)
node_of = [r % NODES for r in range(size)]            # mpiexec -hosts placement, one slot per host
for a in range(size):
    for b in range(size):
        assert (hosts[a] == hosts[b]) == (node_of[a] == node_of[b]), (a, b, hosts)
assert len(set(hosts)) == min(NODES, size), hosts
say(f"rank {rank} on {host}")
section("placement: one rank per host in order, each node its own hostname")

# -- channels between nodes (and, with more ranks than nodes, within one) -----------------------------
N = 100_003
for peer in range(size):
    if peer == rank:
        continue
    lo, hi = min(rank, peer), max(rank, peer)
    ch = ArrayChannel((N,), np.float64, participants=(lo, hi), name=f"pair{lo}-{hi}")
    same = hosts[lo] == hosts[hi]
    assert ch.same_node_peers == ([peer] if same else []), (rank, peer, ch.same_node_peers, ch.same_node_how)
    if not same:
        assert ch.same_node_how.startswith("no node peers"), ch.same_node_how
    ch.buffer[:] = np.arange(N) * (rank + 1)
    if rank == lo:
        ch.put(hi)
        ch.take(hi)
        assert np.array_equal(ch.buffer, np.arange(N) * (lo + 1) + hi), (rank, peer)
    else:
        want = np.arange(N) * (lo + 1)
        ch.take(lo)
        assert np.array_equal(ch.buffer, want), (rank, peer)
        ch.buffer[:] += hi
        ch.put(lo)
    say(f"rank {rank} <-> {peer}: put/take {'shared memory' if same else 'MPI (other node)'}: {ch.same_node_how}")
    ch.close()
section("put/take between every pair; the same-node path only within a node")

ch = ArrayChannel((N,), np.float64, name="all")
x = np.arange(N, dtype=np.float64)
ch.buffer[:] = x * (rank + 1)
ch.reduce("sum", root=size - 1)
if rank == size - 1:
    assert np.array_equal(ch.buffer, x * sum(r + 1 for r in range(size)))
else:
    assert np.array_equal(ch.buffer, x * (rank + 1)), "reduce changed a non-root buffer"
ch.buffer[:] = x + rank
ch.allreduce("max")
assert np.array_equal(ch.buffer, x + size - 1)
ch.buffer[:] = x * 7 if rank == 1 else 0
ch.bcast(root=1)
assert np.array_equal(ch.buffer, x * 7)
edges = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(N), size)])
ch.buffer[:] = x * 3 if rank == 0 else -1
mine = ch.scatter(root=0)
assert np.array_equal(mine, (x * 3)[edges[rank]:edges[rank + 1]])
ch.buffer[:] = -1
ch.buffer[edges[rank]:edges[rank + 1]] = x[edges[rank]:edges[rank + 1]] + 1000 * rank
ch.gather(root=size - 1)
if rank == size - 1:
    want = np.concatenate([x[edges[r]:edges[r + 1]] + 1000 * r for r in range(size)])
    assert np.array_equal(ch.buffer, want)
ch.close()
section("reduce, allreduce, bcast, scatter, gather across nodes")

# -- fused reductions ---------------------------------------------------------------------------------
rng = np.random.default_rng(7 + rank)
data = rng.random(10_000)
everything = np.concatenate([np.random.default_rng(7 + r).random(10_000) for r in range(size)])
s1, s2, top = shared(0.0), shared(0.0), shared(-np.inf)
s1 += data.sum()
s2 += (data * data).sum()
top.max_with(data.max())
n_all = everything.size
var = (s2 - s1 * s1 / n_all) / (n_all - 1)
assert abs(float(var) - everything.var(ddof=1)) < 1e-9, (float(var), everything.var(ddof=1))
assert float(top) == everything.max()
hist = shared(np.zeros(10))
hist += np.bincount((data * 10).astype(np.int64), minlength=10).astype(np.float64)
assert np.array_equal(np.asarray(hist.value), np.bincount((everything * 10).astype(np.int64), minlength=10))
section("fused reductions (variance, max, array sum) equal NumPy")

# -- aggregation: a histogram, exact --------------------------------------------------------------------
BINS = 1000
ITEM = np.dtype([("bin", np.int64)])


@numba.njit
def count(items, table):
    for i in range(items.shape[0]):
        table[items[i]["bin"]] += 1


table = np.zeros(len(range(rank, BINS, size)), np.int64)
agg = Aggregator(ITEM, count, state=table, buffer_items=4096)
samples = np.random.default_rng(100 + rank).integers(0, BINS, 100_000)
items = np.empty(samples.size, ITEM)
items["bin"] = samples // size
agg.push_many(samples % size, items)
agg.flush()
allsamples = np.concatenate([np.random.default_rng(100 + r).integers(0, BINS, 100_000) for r in range(size)])
assert np.array_equal(table, np.bincount(allsamples, minlength=BINS)[rank::size])
sent = agg.stats()["messages_sent"]
agg.close()
say(f"rank {rank}: histogram exact, {sent} messages")
section("Aggregator histogram equals np.bincount exactly")

# -- distributed arrays and redistribution ------------------------------------------------------------
import nbmpi.workers.distarray as dnp  # noqa: E402

full_np = np.random.default_rng(3).random((300, 40))
for dist in ("block", "cyclic", ("block-cyclic", 7)):
    a = dnp.from_numpy(full_np, dist=dist)
    center, north, south = a[1:-1, 1:-1], a[0:-2, 1:-1], a[2:, 1:-1]
    west, east = a[1:-1, 0:-2], a[1:-1, 2:]
    work = 0.2 * (center + north + south + east + west)
    delta = float(dnp.sum(dnp.abs(center - work)))
    ref = full_np.copy()
    rw = 0.2 * (ref[1:-1, 1:-1] + ref[0:-2, 1:-1] + ref[2:, 1:-1] + ref[1:-1, 2:] + ref[1:-1, 0:-2])
    assert abs(delta - np.abs(ref[1:-1, 1:-1] - rw).sum()) < 1e-9 * max(1.0, delta), (dist, delta)
    center[:] = work
    ref[1:-1, 1:-1] = rw
    assert np.allclose(a.to_numpy(), ref, rtol=1e-13, atol=0), dist
    for other in ("block", "cyclic", ("block-cyclic", 5)):
        b = a.redistribute(other)
        assert np.array_equal(b.to_numpy(), a.to_numpy()), (dist, other)
section("distributed arrays (stencil step, sum) and redistribution equal NumPy")

if rank == 0:
    say(f"ALL OK on {size} ranks, {NODES} nodes: {sorted(set(hosts))}")
