"""The NumPy fallback of the distributed arrays, run SPMD by tests/test_distarray_fallback.py (1, 2 and 3 ranks):
NumPy functions, ufuncs, operators and array methods without a distributed implementation give NumPy's results
on every distribution, as DistArrays laid out like their first operand; each call site warns once (rank 0); the
calls are counted in dnp.stats(); no name NumPy has is missing; Python bool operands follow NumPy's promotion."""
import warnings

import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers import world
from spmd_checks import section

comm = world()
rank, size = comm.Get_rank(), comm.Get_size()
rng = np.random.default_rng(7)
checks = 0


def same(got, want, what):
    global checks
    got_np = got.to_numpy() if isinstance(got, dnp.DistArray) else np.asarray(got)
    assert got_np.dtype == np.asarray(want).dtype, (what, got_np.dtype, np.asarray(want).dtype)
    assert np.array_equal(got_np, want, equal_nan=True), (what, got_np, want)
    checks += 1


for dist in ("block", "cyclic", ("block-cyclic", 2)):
    x = rng.standard_normal((11, 4))
    a = dnp.from_numpy(x, dist=dist)
    r = np.sort(a, axis=0)
    assert isinstance(r, dnp.DistArray) and r.dist.kind == a.dist.kind, (dist, r)
    same(r, np.sort(x, axis=0), f"sort {dist}")
    same(a // 0.5, x // 0.5, "floor_divide")
    same(3.0 % a, 3.0 % x, "remainder (reflected)")
    same(np.fmod(a, 0.7), np.fmod(x, 0.7), "fmod ufunc")
    same(a.reshape(4, 11), x.reshape(4, 11), "reshape method")
    same(a.cumsum(axis=0), x.cumsum(axis=0), "cumsum method")
    same(dnp.cumprod(a, axis=1), np.cumprod(x, axis=1), "cumprod function")
    same(dnp.diagonal(a), np.diagonal(x), "diagonal")
    same(dnp.argsort(a[:, 0]), np.argsort(x[:, 0]), "argsort of a view")
    same(np.add.accumulate(a, axis=0), np.add.accumulate(x, axis=0), "ufunc method accumulate")
    same(a.real, x.real, "property real")
    out = dnp.zeros((11, 4), dist=dist)
    np.fmod(a, 0.3, out=out)
    same(out, np.fmod(x, 0.3), "out= a DistArray")
    same(dnp.median(a), np.median(x), "scalar result")
    same(dnp.cross(a[:3, :3], a[3:6, :3]), np.cross(x[:3, :3], x[3:6, :3]), "cross")
section("functions, ufuncs, operators and methods fall back to NumPy on every distribution")

v = dnp.from_numpy(np.array([1.0, np.inf, -2.0, np.nan]))
same(dnp.isinf(v) == True, np.isinf(np.array([1.0, np.inf, -2.0, np.nan])) == True, "isinf == True")  # noqa: E712
same(v + True, np.array([1.0, np.inf, -2.0, np.nan]) + True, "float + True")
same(dnp.ones(3, dtype=np.float32) + True, np.ones(3, dtype=np.float32) + True, "float32 + True stays float32")
same(dnp.ones(3, dtype=np.int8) * False, np.ones(3, dtype=np.int8) * False, "int8 * False stays int8")
same((dnp.arange(4) > 1) & True, (np.arange(4) > 1) & True, "bool & True")
section("Python bool operands follow NumPy's promotion")

missing = [n for n in dir(np) if not n.startswith("_") and not hasattr(dnp, n)]
assert not missing, missing
assert dnp.linspace(0, 1, 5).tolist() == np.linspace(0, 1, 5).tolist()
checks += 1
section("every name NumPy has exists")

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")
    b = dnp.from_numpy(np.arange(12.0))
    for _ in range(3):
        np.diff(b)                                    # one call site, three calls
    np.diff(b)                                        # another call site
fb = [w for w in caught if issubclass(w.category, dnp.NumPyFallbackWarning)]
if rank == 0:
    assert len(fb) == 2, [str(w.message) for w in fb]
    assert "numpy.diff" in str(fb[0].message) and "96 bytes" in str(fb[0].message), str(fb[0].message)
else:
    assert not fb, [str(w.message) for w in fb]
st = dnp.stats()["fallback"]
assert st["functions"]["diff"]["calls"] >= 4, st
assert st["calls"] == sum(f["calls"] for f in st["functions"].values()), st
section("one warning per call site on rank 0, every call counted")
print(f"rank {rank}: ALL OK ({checks} checks on {size} ranks)", flush=True)
