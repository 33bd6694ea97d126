"""NumPy math of the distributed arrays (transcendental ufuncs identical to NumPy's), run SPMD by
tests/test_distarray_numpy.py: NumPy math is on by default; with the compiled kernels (numpy_math off) float32 exp
may differ from NumPy's in the last bit; with numpy_math on, exp/log/sin/... on block, cyclic and block-cyclic
arrays and views equal NumPy's bit for bit, and a ** 2, a ** 0.5 stay fused (square, sqrt: NumPy's values too)."""
import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers import world

rank = world().Get_rank()
x32 = np.random.default_rng(1).standard_normal(200_000).astype(np.float32) * 10
x64 = np.random.default_rng(2).standard_normal((300, 40)) * 3
assert dnp.configure()["numpy_math"] is True, "NumPy math must be on by default"
dnp.configure(numpy_math=False)
compiled = dnp.exp(dnp.from_numpy(x32)).to_numpy()
ulps = int(np.count_nonzero(compiled != np.exp(x32)))
if rank == 0:
    print(f"compiled float32 exp differs from NumPy's on {ulps} of {x32.size} values", flush=True)
# floating power (but ** 2, ** 0.5) runs NumPy's pow on each block even with numpy_math off (faster than the
# kernels' libm pow, which differs from NumPy's SIMD pow in the last bit on ~5 % of values on AVX-512 machines)
y64 = np.abs(x64) + 0.1
p64 = dnp.from_numpy(y64)
assert np.array_equal((p64 ** -1.5).to_numpy(), y64 ** -1.5)
assert np.array_equal(((p64 * 2 + 1) ** 1.3).to_numpy(), (y64 * 2 + 1) ** 1.3)
assert np.array_equal(np.power(p64, p64[::-1]).to_numpy(), np.power(y64, y64[::-1]))
assert np.array_equal((2.0 ** p64[::2]).to_numpy(), 2.0 ** y64[::2])
assert np.array_equal((p64 ** -1).to_numpy(), y64 ** -1) and np.array_equal((p64 ** 9).to_numpy(), y64 ** 9)
# a ** 3 .. a ** 8 are products in the fused kernel: within a few ulp of NumPy's pow (numpy_math: identical)
assert np.allclose((p64 ** 5).to_numpy(), y64 ** 5, rtol=5e-16 * 5, atol=0)
assert np.array_equal((p64 ** 2).to_numpy(), y64 ** 2) and np.array_equal((p64 ** 0.5).to_numpy(), y64 ** 0.5)
settings = dnp.configure(numpy_math=True)
assert settings["numpy_math"] is True, settings
for dist in ("block", "cyclic", ("block-cyclic", 3)):
    a32 = dnp.from_numpy(x32, dist=dist)
    a64 = dnp.from_numpy(x64, dist=dist)
    for name in ("exp", "log", "sin", "cos", "tanh"):
        f = getattr(np, name)
        got = f(dnp.abs(a32) + 1).to_numpy()
        assert np.array_equal(got, f(np.abs(x32) + 1)), (name, dist, "float32")
        got = getattr(dnp, name)(dnp.abs(a64[3:-2:2]) * 0.5 + 2).to_numpy()
        assert np.array_equal(got, f(np.abs(x64[3:-2:2]) * 0.5 + 2)), (name, dist, "float64 view")
    assert np.array_equal(np.arctan2(a64, a64 + 1).to_numpy(), np.arctan2(x64, x64 + 1)), dist
    assert np.array_equal((dnp.abs(a64) ** 1.7).to_numpy(), np.abs(x64) ** 1.7), dist
    assert np.array_equal((dnp.abs(a64) ** 3).to_numpy(), np.abs(x64) ** 3), dist
    assert np.array_equal(dnp.exp(a64[:, 0]).to_numpy(), np.exp(x64[:, 0])), dist
    for e in (2, 0.5, 2.0, 3, -1.5):
        assert np.array_equal((dnp.abs(a64) ** e).to_numpy(), np.abs(x64) ** e), (dist, e)
        assert np.array_equal((dnp.abs(a32) ** e).to_numpy(), np.abs(x32) ** e), (dist, e, "float32")
print(f"rank {rank}: numpy math OK", flush=True)
