"""Random distributed arrays equal to NumPy's for the same seed, whatever the number of ranks.

``random(shape, seed=s)`` has exactly the values of
``numpy.random.default_rng(s).random(shape)``: each rank jumps the PCG64 stream ahead to its
first element (``PCG64.advance``; one 64-bit draw per float64) and draws only its own rows.
So a program gives the same numbers on 1, 2 or 3 ranks, and the same as NumPy.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..core import waiting
from .array import DistArray
from .creation import _new, _shape
from .engine import engine_for
from .errors import DistArrayTimeout, UnsupportedOperation
from .indexing import View

__all__ = ["random", "uniform"]

_MAX_JUMPS = 4096


def _seed(eng, seed: Optional[int]) -> int:
    if seed is not None:
        return int(seed)
    eng.ensure_comm()
    buf = np.array([np.random.SeedSequence().entropy % (1 << 62)], dtype=np.int64)
    req = eng.dcomm.Ibcast(buf, root=0)
    waiting.wait(req, eng.timeout, eng.rank, 0, "random(): agreeing on a seed", DistArrayTimeout, cancellable=False)
    return int(buf[0])


def _fill_uniform(b, eng, seed: int, low: float, high: float, use_uniform: bool) -> np.ndarray:
    shape = b.shape
    row = int(np.prod(shape[1:], dtype=np.int64)) if shape else 1
    out = np.empty(b.local_shape(), dtype=np.float64)
    flat = out.reshape(-1)
    if b.replicated:
        g = np.random.default_rng(seed)
        flat[:] = g.uniform(low, high, flat.size) if use_uniform else g.random(flat.size)
        return out
    rows = b.dist.global_rows(eng.rank)
    if len(rows) == 0:
        return out
    starts = np.flatnonzero(np.diff(rows, prepend=rows[0] - 2) != 1)
    if len(starts) <= _MAX_JUMPS:
        ends = np.append(starts[1:], len(rows))
        for s, e in zip(starts, ends):
            bg = np.random.PCG64(seed)
            bg.advance(int(rows[s]) * row)
            g = np.random.Generator(bg)
            k = int(e - s) * row
            pos = int(s) * row
            flat[pos:pos + k] = g.uniform(low, high, k) if use_uniform else g.random(k)
        return out
    g = np.random.default_rng(seed)
    chunk = 1 << 20
    total = b.shape[0]
    mask_rows = rows
    done = 0
    for c0 in range(0, total, max(1, chunk // row)):
        c1 = min(total, c0 + max(1, chunk // row))
        vals = (g.uniform(low, high, (c1 - c0) * row) if use_uniform else g.random((c1 - c0) * row))
        sel = mask_rows[(mask_rows >= c0) & (mask_rows < c1)]
        if len(sel):
            block = vals.reshape(c1 - c0, row)[sel - c0]
            flat[done * row:(done + len(sel)) * row] = block.reshape(-1)
            done += len(sel)
    return out


def random(size: Any = None, dist="block", seed: Optional[int] = None, dtype=np.float64, comm=None) -> DistArray:
    """Uniform floats in [0, 1), equal to ``numpy.random.default_rng(seed).random(size)``.

    Local when ``seed`` is given; with ``seed=None`` rank 0 draws one and broadcasts it
    (collective). Only float64 is supported (NumPy's float32 stream differs).
    """
    return uniform(0.0, 1.0, size, dist, seed, dtype, comm, _plain=True)


def uniform(low: float = 0.0, high: float = 1.0, size: Any = None, dist="block", seed: Optional[int] = None,
            dtype=np.float64, comm=None, _plain: bool = False) -> DistArray:
    """Uniform floats in [low, high), equal to ``numpy.random.default_rng(seed).uniform(low, high, size)``."""
    if np.dtype(dtype) != np.float64:
        raise UnsupportedOperation("random numbers are supported in float64 only (NumPy's float32 stream differs)")
    eng = engine_for(comm)
    shape = _shape(() if size is None else size)
    b, _ = _new(shape, np.float64, dist, comm, "random")
    s = _seed(eng, seed)
    b.set_local(_fill_uniform(b, eng, s, low, high, not _plain))
    return DistArray(b, View.full(shape))
