"""Redistribution and irregular copies against NumPy (run SPMD by tests/test_redistribute.py under `nbmpi run -n 2`
and `-n 3`). Prints one `ok <section>` line per section on rank 0, `rank R raised <case>: ...` on every rank for
every error case, and `ALL OK` at the end; any difference raises AssertionError naming the case."""
import tracemalloc

import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers import gather_trace, get_tracer, world
from spmd_checks import expect, section

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()
DISTS = ["block", "cyclic", ("block-cyclic", 2), ("block-cyclic", 3)]
rng = np.random.default_rng(14)
count = [0]


def check(name, got, want):
    g = got.to_numpy() if isinstance(got, dnp.DistArray) else np.asarray(got)
    w = np.asarray(want)
    assert g.shape == w.shape, f"{name}: shape {g.shape} != NumPy's {w.shape}"
    assert g.dtype == w.dtype, f"{name}: dtype {g.dtype} != NumPy's {w.dtype}"
    assert np.array_equal(g, w), f"{name} (rank {rank}/{size}): differs from NumPy\n got {g}\nwant {w}"
    count[0] += 1


def sends_per_peer(fn):
    """Run ``fn`` (one force point) and return, from the gathered trace, the largest number of
    distarray_send events of one rank to one peer (on rank 0; None elsewhere)."""
    mark = get_tracer().mark()
    fn()
    tr = gather_trace(since=mark)
    if rank != 0:
        return None
    kinds = tr.col("kind")
    peers = tr.col("peer")
    per = {}
    for i in range(len(tr)):
        if tr.kind_name(int(kinds[i])) == "distarray_send":
            key = (int(tr.ranks[i]), int(peers[i]))
            per[key] = per.get(key, 0) + 1
    return max(per.values()) if per else 0


# ------------------------------------------------------------------ every pair of distributions, contiguous
n1, shape2 = 29, (17, 5)
x1 = rng.random(n1)
x2 = rng.random(shape2)
for d1 in DISTS:
    for d2 in DISTS:
        a = dnp.from_numpy(x1, dist=d1)
        b = dnp.zeros(n1, dist=d2)
        b[...] = a
        check(f"b[...] = a 1-D {d1}->{d2}", b, x1)
        r = a.redistribute(d2)
        check(f"redistribute 1-D {d1}->{d2}", r, x1)
        assert r.dist == dnp.Distribution(d2 if isinstance(d2, str) else d2[0], n1, size, 1 if isinstance(d2, str)
                                          else d2[1]), (d1, d2, r.dist)
        A = dnp.from_numpy(x2, dist=d1)
        B = dnp.zeros(shape2, dist=d2, dtype=np.float32)
        B[...] = A                                    # with a cast, as NumPy's setitem
        check(f"b[...] = a 2-D cast {d1}->{d2}", B, x2.astype(np.float32))
        check(f"redistribute 2-D {d1}->{d2}", dnp.redistribute(A, d2), x2)
# dependent redistributions in one force point, with and without latency hiding (in-place messages and
# the units around them are ordered by the rows they touch)
for hiding in (True, False):
    dnp.configure(latency_hiding=hiding)
    for d1, d2 in (("block", "cyclic"), ("cyclic", ("block-cyclic", 2)), (("block-cyclic", 3), "block")):
        a = dnp.from_numpy(x2, dist=d1)
        b = dnp.zeros(shape2, dist=d2)
        y, z = x2.copy(), np.zeros(shape2)
        b[...] = a
        z[...] = y
        a[...] = b * 2 + 1
        y[...] = z * 2 + 1
        b[::-1] = a
        z[::-1] = y
        c = b.redistribute(d1)
        a[1:] = c[:-1]
        y[1:] = z[:-1]
        check(f"dependent chain hiding={hiding} {d1}->{d2} (a)", a, y)
        check(f"dependent chain hiding={hiding} {d1}->{d2} (c)", c, z)
dnp.configure(latency_hiding=True)
# copy semantics: the result is independent of the source
a = dnp.from_numpy(x1, dist="block")
r = a.redistribute("block")
a[...] = 0.0
check("redistribute is a copy (same distribution)", r, x1)
section("every pair of distributions, 1-D and 2-D, b[...] = a and redistribute()")

# ------------------------------------------------------------------ strided views, negative steps
for d1 in DISTS:
    for d2 in DISTS:
        a = dnp.from_numpy(x1, dist=d1)
        b = dnp.from_numpy(-x1, dist=d2)
        y = -x1.copy()
        b[::2] = a[:15]
        y[::2] = x1[:15]
        b[::3] = a[1::3]
        y[::3] = x1[1::3]
        b[::-4] = a[2:10]
        y[::-4] = x1[2:10]
        b[20:5:-3] = a[-1:-16:-3]
        y[20:5:-3] = x1[-1:-16:-3]
        check(f"strided 1-D {d1}->{d2}", b, y)
        A = dnp.from_numpy(x2, dist=d1)
        B = dnp.from_numpy(-x2, dist=d2)
        Y = -x2.copy()
        B[1::2, ::-1] = A[:8, ::1]
        Y[1::2, ::-1] = x2[:8, ::1]
        B[::-3, 1:4] = A[2:8, ::2]
        Y[::-3, 1:4] = x2[2:8, ::2]
        B[:, 2] = A[::-1, 0]
        Y[:, 2] = x2[::-1, 0]
        check(f"strided 2-D {d1}->{d2}", B, Y)
        check(f"redistribute of a view {d1}->{d2}", A[::-2, 1::2].redistribute(d2), x2[::-2, 1::2])
section("strided and reversed views, 1-D and 2-D")

# ------------------------------------------------------------------ aggregation: at most one message per peer
big = 4096
xb = rng.random((big, 3))
worst = 0
for d1 in DISTS:
    for d2 in DISTS:
        if d1 == d2:
            continue
        a = dnp.from_numpy(xb, dist=d1)
        b = dnp.zeros((big, 3), dist=d2)
        a.evaluate()
        b.evaluate()

        def one():
            b[...] = a
            dnp.evaluate()
        m = sends_per_peer(one)
        assert dnp.stats()["last"]["kinds"] == ["redistribute"], dnp.stats()["last"]
        m2 = sends_per_peer(lambda: b.__setitem__(slice(None, None, -3), a[::3]) or dnp.evaluate())
        if rank == 0:
            worst = max(worst, m, m2)
            assert m <= 1 and m2 <= 1, f"{d1}->{d2}: {m}, {m2} messages to one peer in one redistribution"
        check(f"after the counted redistributions {d1}->{d2}", b[::-3], xb[::3])
if rank == 0:
    print(f"max messages per peer per redistribution: {worst}", flush=True)
section("one message per peer per redistribution (trace)")

# ------------------------------------------------------------------ reuse in a time loop: nothing built, nothing allocated
n = 1 << 21                                          # 16 MiB of float64
a = dnp.random.random(n, dist="block", seed=3)
b = dnp.zeros(n, dist="cyclic")
for it in range(2):                                  # the first builds the plan and its buffers
    b[...] = a
    a[...] = b
    c = b.redistribute("block")
    c.evaluate()
del c
s0 = dnp.stats()
ninst = sum(len(p.instances) for p in dnp.context_for().plans.values())
tracemalloc.start()
base, _ = tracemalloc.get_traced_memory()
for it in range(6):                                  # a time loop: block -> cyclic -> block, and a new array each step
    b[...] = a
    a[...] = b
    c = b.redistribute("block")
    c.evaluate()
    del c
cur, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
s1 = dnp.stats()
assert s1["plans_built"] == s0["plans_built"], ("a repeated redistribution built a plan", s0["plans_built"],
                                                s1["plans_built"])
assert s1["buffers_allocated"] == s0["buffers_allocated"], "a repeated redistribution allocated a buffer"
assert s1["buffers_reused"] > s0["buffers_reused"], "the new arrays of redistribute() take their buffers from the pool"
assert sum(len(p.instances) for p in dnp.context_for().plans.values()) == ninst, "a repeated redistribution added buffers"
assert peak - base < (1 << 20), f"the time loop allocated {peak - base} bytes at its peak (the arrays hold 16 MiB)"
assert s1["redistributed"] - s0["redistributed"] == 18
check("values after the loop", b[::4097], a.to_numpy()[::4097])
if rank == 0:
    print(f"time loop: peak of traced allocations {peak - base} bytes, plans built 0, buffers allocated 0", flush=True)
section("plan and buffers reused, nothing allocated in a time loop")

# ------------------------------------------------------------------ irregular: b[idx] = a and a[idx] through the Aggregator
n = 53
x = rng.random(n)
X = rng.random((n, 4))
for d1 in DISTS[:3]:
    for d2 in DISTS[:3]:
        a = dnp.from_numpy(x, dist=d1)
        A = dnp.from_numpy(X, dist=d1)
        perm = rng.permutation(n)
        b = dnp.zeros(n, dist=d2)
        b[perm] = a
        y = np.zeros(n)
        y[perm] = x
        check(f"b[perm] = a {d1}->{d2}", b, y)
        idx = rng.integers(-n, n, 40)
        check(f"a[idx] random with negatives {d1}->{d2}", a[idx], x[idx])
        dup = rng.integers(0, 9, n)
        b = dnp.zeros(n, dist=d2)
        b[dup] = a                                   # duplicates: the last occurrence wins, as NumPy's loop
        y = np.zeros(n)
        y[dup] = x
        check(f"b[idx] = a with duplicates {d1}->{d2}", b, y)
        ix = dnp.from_numpy(dup, dist=d2)            # distributed index on another distribution
        b = dnp.zeros(n, dist=d1)
        b[ix] = a
        check(f"b[dist idx] = a with duplicates {d1}->{d2}", b, y)
        gi = dnp.from_numpy(idx, dist=d2)
        check(f"a[dist idx] {d1}->{d2}", a[gi], x[idx])
        B = dnp.from_numpy(-X, dist=d2)
        Y = -X.copy()
        B[perm[:20]] = A[5:25, ::-1]
        Y[perm[:20]] = X[5:25, ::-1]
        B[::2][perm[:10] // 2] = A[:10]
        Y[::2][perm[:10] // 2] = X[:10]
        B[dnp.from_numpy(perm[:7], dist=d1)] = 3.5
        Y[perm[:7]] = 3.5
        check(f"2-D rows, views, scalars {d1}->{d2}", B, Y)
        check(f"A[idx] 2-D {d1}->{d2}", A[idx], X[idx])
        m = x > 0.4
        check(f"a[mask] {d1}->{d2}", a[m], x[m])
        b = dnp.zeros(n, dist=d2)
        b[m] = x[m] * 2                              # a NumPy value
        y = np.zeros(n)
        y[m] = x[m] * 2
        check(f"b[mask] = numpy {d1}->{d2}", b, y)
# through the Aggregator: per-destination buffers, not one message per element
n = 40000
x = rng.random(n)
perm = rng.permutation(n)
a = dnp.from_numpy(x)
b = dnp.zeros(n, dist="cyclic")
a.evaluate()
b.evaluate()
writer = [agg for key, agg in dnp.context_for().aggregators.items() if key[0] == "write"][0]
st0 = writer.stats()
b[perm] = a
st1 = writer.stats()
y = np.zeros(n)
y[perm] = x
check("b[perm] = a, 40000 elements", b, y)
items = st1["items_pushed"] - st0["items_pushed"]
msgs = st1["messages_sent"] - st0["messages_sent"]
assert items == len(dnp.Distribution("block", n, size).global_rows(rank)), (items, "every local element pushed once")
assert msgs <= 4 * (size - 1), f"{items} items went in {msgs} messages: the Aggregator must send whole buffers"
if rank == 0:
    print(f"permutation of 40000: {items} items pushed by rank 0, {msgs} messages", flush=True)
section("irregular b[idx] = a and a[idx] through the Aggregator")

# ------------------------------------------------------------------ errors on every rank, never a hang


a = dnp.from_numpy(np.arange(20.0), dist="block")
b = dnp.zeros(21, dist="cyclic")
expect("shape mismatch", dnp.ShapeError, lambda: b.__setitem__(Ellipsis, a), ["could not broadcast", "(20,)", "(21,)"])
expect("unknown distribution", dnp.DistributionError, lambda: a.redistribute("diagonal"), ["unknown distribution"])
expect("block size", dnp.DistributionError, lambda: a.redistribute(("block-cyclic", 0)), ["block size"])
bad = np.arange(20)
expect("index out of range (NumPy index)", dnp.IndexOutOfBounds, lambda: a[np.array([3, 20, 1])],
       ["index 20 is out of bounds for axis 0 with size 20", "position 1"])
held = np.arange(20)
held[19] = 57                                        # only the rank holding position 19 has the bad index
ix = dnp.from_numpy(held, dist="cyclic")
owner = dnp.Distribution("cyclic", 20, size).owner_of(19)
expect("index out of range on one rank (distributed index)", dnp.IndexOutOfBounds, lambda: b.__setitem__(ix, a),
       ["index 57 is out of bounds", "position 19", f"found by rank {owner}"])
expect("index out of range on one rank (gather)", dnp.IndexOutOfBounds, lambda: a[ix], ["index 57"])
check("nothing was written by the failed b[idx] = a", b, np.zeros(21))
expect("value shape", dnp.ShapeError, lambda: b.__setitem__(np.arange(5), a), ["expected (5,)"])
# what the distributed copies lack runs through the NumPy fallback, with NumPy's results
check("2-D index array (NumPy fallback)", a[np.array([[1, 2], [19, 0]])], np.arange(20.0)[np.array([[1, 2], [19, 0]])])
check("distributed mask (NumPy fallback)", a[a > 3], np.arange(20.0)[np.arange(20.0) > 3])
expect("float index", IndexError, lambda: a[np.array([1.0, 2.0])], ["integer"])
check("still usable after the errors", a[np.array([4, 2])] * 2, np.array([8.0, 4.0]))
comm.Barrier()
print(f"rank {rank} done", flush=True)
section("errors on every rank")
if rank == 0:
    print(f"ALL OK ({count[0]} checks on {size} ranks)", flush=True)
