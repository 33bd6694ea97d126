"""Grid constructors of the distributed arrays against NumPy, run SPMD by tests/test_distarray_numpy.py."""
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world
r = world().Get_rank()
def same(a, b, w):
    g = a.to_numpy() if isinstance(a, dnp.DistArray) else a
    assert g.dtype == b.dtype and np.array_equal(g, b), (w, g, b)
def kw(m):
    return {"dist": dist} if m is dnp else {}


for dist in ("block", "cyclic", ("block-cyclic", 2)):
    same(dnp.linspace(0, 1, 11, dist=dist), np.linspace(0, 1, 11), "linspace")
    same(dnp.linspace(0, 1, 11, endpoint=False, dtype=np.float32, dist=dist), np.linspace(0, 1, 11, endpoint=False, dtype=np.float32), "linspace f32")
    same(dnp.logspace(0, 3, 7, dist=dist), np.logspace(0, 3, 7), "logspace")
    x, y = np.linspace(-1, 1, 5), np.linspace(0, 2, 7)
    for ind in ("xy", "ij"):
        for g, w in zip(dnp.meshgrid(x, y, indexing=ind, dist=dist), np.meshgrid(x, y, indexing=ind)): same(g, w, "meshgrid " + ind)
        for g, w in zip(dnp.meshgrid(x, y, x, indexing=ind, dist=dist), np.meshgrid(x, y, x, indexing=ind)): same(g, w, "meshgrid3 " + ind)
    for g, w in zip(np.meshgrid(dnp.from_numpy(x), y), np.meshgrid(x, y)): same(g, w, "np.meshgrid(dist)")
    xi, yf = np.arange(4), np.linspace(0, 1, 3, dtype=np.float32)   # each grid keeps its own vector's dtype
    for ind in ("xy", "ij"):
        for g, w in zip(dnp.meshgrid(xi, yf, indexing=ind, dist=dist), np.meshgrid(xi, yf, indexing=ind)):
            same(g, w, "meshgrid int, float32 " + ind)
            same(g * 3, w * 3, "meshgrid int, float32, times 3 " + ind)
    same(dnp.eye(5, 7, k=2, dist=dist), np.eye(5, 7, k=2), "eye")
    same(dnp.eye(6, k=-1, dtype=int, dist=dist), np.eye(6, k=-1, dtype=int), "eye int")
    same(dnp.identity(4, dist=dist), np.identity(4), "identity")
    same(dnp.indices((3, 4), dist=dist), np.indices((3, 4)), "indices")
    f = lambda i, j: i * 10 + j
    same(dnp.fromfunction(f, (5, 3), dist=dist), np.fromfunction(f, (5, 3)), "fromfunction")
    same(dnp.fromfunction(lambda i: i * i, (7,), dtype=int, dist=dist), np.fromfunction(lambda i: i * i, (7,), dtype=int), "fromfunction int")
    # a function that is not elementwise sees the whole grids, called once, as NumPy calls it (before: each rank's rows,
    # so reversing, cumsum, max and mean gave values that depended on the ranks, silently)
    for name, g in [("i[::-1]", lambda m: m.fromfunction(lambda i: i[::-1], (7,), **kw(m))),
                    ("cumsum", lambda m: m.fromfunction(lambda i: m.cumsum(i), (5,), **kw(m))),
                    ("i / i.max()", lambda m: m.fromfunction(lambda i, j: i / i.max() + 0 * j, (4, 2), **kw(m))),
                    ("i - i.mean()", lambda m: m.fromfunction(lambda i, j: i - i.mean() + 0 * j, (4, 2), **kw(m))),
                    ("i.sum()", lambda m: m.fromfunction(lambda i: i.sum(), (6,), **kw(m))),
                    ("i @ j.T", lambda m: m.fromfunction(lambda i, j: i @ j.T, (3, 3), **kw(m))),
                    ("a constant", lambda m: m.asarray(m.fromfunction(lambda i: 5.0, (3,), **kw(m)))),
                    ("3-D, int", lambda m: m.fromfunction(lambda i, j, k: i * 100 + j * 10 + k, (3, 4, 2), dtype=int,
                                                         **kw(m)))]:
        same(g(dnp), g(np), "fromfunction " + name)
    calls = []
    dnp.fromfunction(lambda i, j: calls.append(i.shape) or i + j, (5, 3), dist=dist)
    assert calls == [(5, 3)], calls
    shape_of = dnp.fromfunction(lambda i, j: i.shape, (2, 3), dist=dist)
    assert shape_of == (2, 3), shape_of
    a = dnp.from_numpy(np.arange(6.0), dist=dist)
    same(dnp.asarray(a, dtype=np.int32), np.arange(6).astype(np.int32), "asarray dtype")
    same(dnp.copy(a), np.arange(6.0), "copy")
print(f"rank {r}: grids OK", flush=True)
