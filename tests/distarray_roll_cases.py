"""``roll`` of the distributed arrays against NumPy, run SPMD by tests/test_distarray_roll.py on 1, 2 and 3 ranks:
any axis (the distributed one included), positive and negative shifts, shifts larger than a rank's block and
larger than the axis, 1-D to 3-D, views, block / cyclic / block-cyclic layouts; then rolls consumed by
elementwise expressions (the stencils of the game of life and shallow water), which the fusion pass reads in
place (``dnp.stats()['split']`` counts the tasks it split per piece). Results must equal NumPy's bit for bit
(a roll moves data) without the NumPy fallback."""
import sys

import numpy as np

import nbmpi.workers.distarray as dnp
from nbmpi.workers.distarray import piece_inlining
from nbmpi.workers import world

r = world().Get_rank()
DISTS = ("block", "cyclic", ("block-cyclic", 2))
checked = [0]


def same(got, want, what):
    g = got.to_numpy() if isinstance(got, dnp.DistArray) else np.asarray(got)
    assert g.shape == want.shape and g.dtype == want.dtype, (what, g.shape, g.dtype, want.shape, want.dtype)
    assert np.array_equal(g, want), (what, g, want)
    checked[0] += 1


def arrays(dist):
    rng = np.random.default_rng(11)
    f1 = rng.standard_normal(13)
    f2 = rng.standard_normal((9, 7))
    i3 = rng.integers(-9, 9, size=(5, 4, 3))
    A1, A2, I3 = (dnp.from_numpy(x, dist=dist) for x in (f1, f2, i3))
    return [("f1", A1, f1), ("f2", A2, f2), ("i3", I3, i3), ("f1 view", A1[1:12:2], f1[1:12:2]),
            ("f2 view", A2[1:, ::2], f2[1:, ::2]), ("f2 rows", A2[::-2], f2[::-2]),
            ("rep", dnp.from_numpy(f2, dist="replicated"), f2)]


def check_rolls(dist):
    fb = dnp.stats()["fallback"]["calls"]
    for name, X, x in arrays(dist):
        for axis in range(x.ndim):
            n = x.shape[axis]
            for s in (1, -1, 2, -3, n - 1, n, n + 2, -(2 * n + 1), 5 * n + 3):
                same(dnp.roll(X, s, axis=axis), np.roll(x, s, axis=axis), f"roll({name}, {s}, axis={axis})")
            same(dnp.roll(X, 1, axis=axis - x.ndim), np.roll(x, 1, axis=axis - x.ndim), f"roll({name}, axis<0)")
        same(dnp.roll(X, 4), np.roll(x, 4), f"roll({name}, 4) of the flattened array")
        if x.ndim >= 2:
            same(np.roll(X, (2, -1), axis=(0, 1)), np.roll(x, (2, -1), axis=(0, 1)), f"np.roll({name}, tuple)")
            same(dnp.roll(dnp.roll(X, -4, axis=0), 3, axis=1) * 2.0 + X,
                 np.roll(np.roll(x, -4, axis=0), 3, axis=1) * 2.0 + x, f"roll of roll in an expression ({name})")
    assert dnp.stats()["fallback"]["calls"] == fb, "roll went through the NumPy fallback"


def check_stencils(dist):
    rng = np.random.default_rng(5)
    b = (rng.random((11, 8)) < 0.4).astype(np.int64)
    B = dnp.from_numpy(b, dist=dist)
    split0 = dnp.stats()["split"]
    nb = sum(np.roll(np.roll(b, dy, axis=0), dx, axis=1) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0))
    NB = sum(dnp.roll(dnp.roll(B, dy, axis=0), dx, axis=1) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0))
    want = ((nb == 3) | ((b == 1) & (nb == 2))).astype(np.int64)
    same(((NB == 3) | ((B == 1) & (NB == 2))).astype(np.int64), want, f"game of life step ({dist})")
    assert dnp.stats()["split"] > split0, "the rolls of the stencil were not read in place"
    for trailing in (True, False):      # split along every axis; only along the rows (the rest stored)
        piece_inlining.SPLIT_TRAILING_AXES = trailing
        h = rng.standard_normal((10, 6))
        u = np.zeros_like(h)
        H, U = dnp.from_numpy(h, dist=dist), dnp.from_numpy(u, dist=dist)
        for _ in range(3):
            u = u - 0.3 * (np.roll(h, -1, axis=1) - np.roll(h, 1, axis=1))
            h = h - 0.2 * (np.roll(u, -1, axis=0) - np.roll(u, 1, axis=0))
            U = U - 0.3 * (dnp.roll(H, -1, axis=1) - dnp.roll(H, 1, axis=1))
            H = H - 0.2 * (dnp.roll(U, -1, axis=0) - dnp.roll(U, 1, axis=0))
        same(H, h, f"shallow-water steps ({dist}, split along trailing axes: {trailing})")
    piece_inlining.SPLIT_TRAILING_AXES = True
    # the source written after the roll: the roll keeps the old values
    c = rng.standard_normal(12)
    C = dnp.from_numpy(c, dist=dist)
    R = dnp.roll(C, 5)
    C[...] = 0.0
    same(R + 1.0, np.roll(c, 5) + 1.0, f"roll, then its source overwritten ({dist})")
    # rolled back into its own source
    C2 = dnp.from_numpy(c, dist=dist)
    C2[...] = dnp.roll(C2, -3) + C2
    same(C2, np.roll(c, -3) + c, f"x[...] = roll(x) + x ({dist})")


for d in DISTS:
    check_rolls(d)
    check_stencils(d)
    print(f"rank {r}: ok {d}", flush=True)
print(f"rank {r}: ALL OK ({checked[0]} checks)", flush=True)
