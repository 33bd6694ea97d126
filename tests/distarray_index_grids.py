"""mgrid and ogrid of the distributed arrays against NumPy's, run SPMD by tests/test_distarray_index_grids.py."""
import numpy as np
import nbmpi.workers.distarray as dnp
from nbmpi.workers import world
r = world().Get_rank()
def same(a, b, w):
    g = a.to_numpy() if isinstance(a, dnp.DistArray) else np.asarray(a)
    assert g.dtype == b.dtype and g.shape == b.shape and np.array_equal(g, b), (w, g, b)
KEYS = [np.s_[-1:1:7j, -1:1:5j], np.s_[0:5, 0:3], np.s_[0:1:0.25, 0:2:3j, 1:4], np.s_[2:-3:-1, 0:4:1j],
        np.s_[-1:1:9j], np.s_[0:7], np.s_[1:2:0.125], np.s_[0:1:1j, 0:3]]
for key in KEYS:
    ref, got = np.mgrid[key], dnp.mgrid[key]
    assert isinstance(got, dnp.DistArray), (key, type(got))
    same(got, ref, f"mgrid {key}")
    if ref.ndim > 1:
        parts = list(got)
        assert len(parts) == len(ref) and all(type(p) is dnp.DistArray for p in parts)
        for k, (p, w) in enumerate(zip(parts, ref)):
            same(p, w, f"mgrid row {k} {key}")
            assert p.shape[0] < 2 or p.dist.nrows == w.shape[0], "a row is distributed over its own axis 0"
        same(got[-1], ref[-1], "negative row")
        same(got[0, 1:], ref[0, 1:], "row and slice")
        same(got ** 2, ref ** 2, "the grid as a whole")
        same(got.sum(axis=0), ref.sum(axis=0), "reduced over the stacked axis")
        for a, w in zip(dnp.ogrid[key], np.ogrid[key]):
            same(a, w, f"ogrid {key}")
    else:
        same(dnp.ogrid[key], np.ogrid[key], f"ogrid 1-D {key}")
y, x = dnp.mgrid[-1:1:6j, -1:1:4j]
ny, nx = np.mgrid[-1:1:6j, -1:1:4j]
same(np.where(x ** 2 + y ** 2 < 0.8, 0.2, 0.0), np.where(nx ** 2 + ny ** 2 < 0.8, 0.2, 0.0), "unpacked and used")
g, ref = dnp.mgrid[0:4, 0:3], np.mgrid[0:4, 0:3]
g[0] += 1
ref[0] += 1
same(g, ref, "assigned through a row")
same(g[0], ref[0], "row after an assignment")
g[:, 1] = -5
ref[:, 1] = -5
same(g[1], ref[1], "row after an assignment to the stacked array")
try:
    dnp.mgrid[0:3, 0:2][2]
    raise AssertionError("no IndexError")
except IndexError:
    pass
assert dnp.stats()["fallback"]["calls"] == 0, dnp.stats()["fallback"]
print(f"rank {r}: index grids OK", flush=True)
