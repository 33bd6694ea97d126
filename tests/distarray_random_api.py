"""NumPy's random API on distributed arrays against NumPy, run SPMD by tests/test_distarray_numpy.py."""
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world
def same(a, b, w):
    g = a.to_numpy() if isinstance(a, dnp.DistArray) else np.asarray(a)
    assert g.dtype == np.asarray(b).dtype and np.array_equal(g, b), (w, g, b)
g, h = dnp.random.default_rng(3), np.random.default_rng(3)
for dist in ("block", "cyclic"):
    same(g.random((7, 3)), h.random((7, 3)), "random")
    same(g.uniform(-1, 2, 10), h.uniform(-1, 2, 10), "uniform")
    same(g.normal(0, 1, (5, 2)), h.normal(0, 1, (5, 2)), "normal")
    same(g.integers(0, 10, 9), h.integers(0, 10, 9), "integers")
    same(g.random(), h.random(), "scalar")
    same(g.random(4), h.random(4), "after")
dnp.random.seed(5); np.random.seed(5)
same(dnp.random.rand(6, 2), np.random.rand(6, 2), "legacy rand")
same(dnp.random.randn(4), np.random.randn(4), "legacy randn")
same(dnp.random.random(5), np.random.random(5), "legacy random")
same(dnp.random.normal(1, 2, size=3), np.random.normal(1, 2, size=3), "legacy normal")
for dist in ("block", "cyclic", ("block-cyclic", 2)):     # uniform legacy draws: distributed, then the state moves on
    same(dnp.random.random((11, 3), dist=dist), np.random.random((11, 3)), f"legacy random 2-D {dist}")
    same(dnp.random.random(1), np.random.random(1), "legacy random, one element")
same(dnp.random.random_sample(size=9), np.random.random_sample(size=9), "legacy random_sample")
same(dnp.random.sample((2, 5)), np.random.sample((2, 5)), "legacy sample")
same(dnp.random.rand(13), np.random.rand(13), "legacy rand 1-D")
same(dnp.random.random(), np.random.random(), "legacy scalar after distributed draws")
same(dnp.random.randn(3), np.random.randn(3), "legacy randn after distributed draws")
assert isinstance(dnp.random.random((4, 2)), dnp.DistArray) and np.random.random((4, 2)) is not None
before = dnp.stats()["fallback"]["functions"].get("random.random", {}).get("calls", 0)
same(dnp.random.random(10), np.random.random(10), "legacy random not a fallback")
assert dnp.stats()["fallback"]["functions"].get("random.random", {}).get("calls", 0) == before
u = dnp.random.default_rng()
x = u.random(8).to_numpy()
allx = world().allgather(x)
assert all(np.array_equal(allx[0], y) for y in allx)
# draws go into pooled buffers: drawn again at the same size, they take the dead draw's memory (no fresh buffer)
big = 3 * 8192 * world().Get_size()            # 192 KiB per rank: above the pool's 64 KiB minimum
for name, draw in [("Generator.random", lambda: dnp.random.default_rng(5).random(big)),
                   ("Generator.uniform", lambda: dnp.random.default_rng(5).uniform(2, 3, big)),
                   ("random(seed=)", lambda: dnp.random.random(big, seed=5)),
                   ("legacy random", lambda: dnp.random.random(big))]:
    first = draw()
    first.evaluate()
    memory = first._base.local
    del first
    fresh = dnp.stats()["buffers_allocated"]
    again = draw()
    assert dnp.stats()["buffers_allocated"] == fresh and np.shares_memory(memory, again._base.local), \
        f"{name}: drawn into fresh memory while the pool held the dead draw's buffer"
    del again, memory
np.random.seed(11)
dnp.random.seed(11)
same(dnp.random.default_rng(5).random(big), np.random.default_rng(5).random(big), "pooled Generator.random")
same(dnp.random.random(big), np.random.random(big), "pooled legacy random")
# legacy draws larger than one random_sample chunk (2**18 doubles), in one run and in several runs per rank
np.random.seed(5)
dnp.random.seed(5)
for dist in ("block", ("block-cyclic", 100_000)):
    same(dnp.random.random(300_001 * world().Get_size(), dist=dist), np.random.random(300_001 * world().Get_size()),
         f"legacy random in chunks {dist}")
same(dnp.random.random(7), np.random.random(7), "legacy state after large draws")
# legacy uniform draws from (and advances) the seeded RandomState; Generator methods fill out= of any size
np.random.seed(3)
dnp.random.seed(3)
same(dnp.random.uniform(size=5), np.random.uniform(size=5), "legacy uniform after seed")
same(dnp.random.rand(2), np.random.rand(2), "legacy state after uniform")
same(dnp.random.uniform(2, 5, (7, 2)), np.random.uniform(2, 5, (7, 2)), "legacy uniform(low, high, size)")
g, h = dnp.random.default_rng(5), np.random.default_rng(5)
for name, draw in [("random", lambda r, o: r.random(out=o)), ("standard_normal", lambda r, o: r.standard_normal(out=o)),
                   ("random(size, out=)", lambda r, o: r.random(o.shape, out=o))]:
    o, p = dnp.zeros((7, 2)), np.zeros((7, 2))
    assert draw(g, o) is o, name
    draw(h, p)
    same(o, p, f"Generator.{name} into out=")
    same(g.random(3), h.random(3), f"Generator state after {name}(out=)")
o32, p32 = dnp.zeros(9, dtype=np.float32), np.zeros(9, dtype=np.float32)
g.random(out=o32, dtype=np.float32)
h.random(out=p32, dtype=np.float32)
same(o32, p32, "Generator.random float32 into out=")
try:
    g.random(4, out=dnp.zeros(3))
except ValueError as e:
    assert "size must match out.shape" in str(e), e
else:
    raise AssertionError("random(4, out=<3 elements>) did not raise")
print(f"rank {world().Get_rank()}: random OK", flush=True)
