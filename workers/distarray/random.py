"""Random distributed arrays equal to NumPy's for the same seed, whatever the number of ranks.

* ``random(shape, seed=s)`` has exactly the values of ``numpy.random.default_rng(s).random(shape)``:
  each rank jumps the PCG64 stream ahead to its first element (``PCG64.advance``; one 64-bit draw
  per float64) and draws only its own rows. So a program gives the same numbers on 1, 2 or 3
  ranks, and the same as NumPy.
* :func:`default_rng` gives a :class:`Generator` with NumPy's ``Generator`` API: ``random`` and
  ``uniform`` draw distributed (each rank its own part of the one stream, as above); every other
  method draws NumPy's values on every rank from the same state and keeps each rank's rows
  (O(size) work per rank, no communication; counted as fallback calls in ``dnp.stats()``).
* NumPy's legacy functions (``seed``, ``rand``, ``randn``, ``normal``, ...) draw from one
  ``RandomState`` that every rank holds in the same state (seeded by ``seed(s)``, else from a seed
  rank 0 draws and broadcasts), their array results distributed: equal to NumPy's after
  ``numpy.random.seed(s)``. The uniform ones (``random``, ``random_sample``, ``rand``, ...) draw
  distributed too: each rank skips the MT19937 outputs before its rows (no values made) and draws
  only its own; the others draw every value on every rank (counted as fallback calls).

Distributed draws fill pooled buffers (:class:`~.pool_memory.BufferCache`: a program run again draws into the
memory of its last run's dead draws), the plain ``random`` ones in place (``Generator.random(out=)``).

Every function here is SPMD: call it on every rank in the same order with the same arguments.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..core import waiting
from .array import DistArray
from .creation import _new, _shape
from .context import context_for
from .errors import DistArrayTimeout, UnsupportedOperation
from .indexing import View, c_contiguous

__all__ = ["random", "uniform", "default_rng", "Generator", "seed"]

_MAX_JUMPS = 4096
#: Doubles per ``random_sample`` call of a distributed legacy draw (2 MiB temporaries).
_LEGACY_CHUNK = 1 << 18


def _seed(ctx, seed: Optional[int]) -> int:
    if seed is not None:
        return int(seed)
    ctx.ensure_comm()
    buf = np.array([np.random.SeedSequence().entropy % (1 << 62)], dtype=np.int64)
    req = ctx.dcomm.Ibcast(buf, root=0)
    waiting.wait(req, ctx.timeout, ctx.rank, 0, "random(): agreeing on a seed", DistArrayTimeout, cancellable=False)
    return int(buf[0])


def _fill_uniform(b, ctx, seed: int, low: float, high: float, use_uniform: bool) -> np.ndarray:
    shape = b.shape
    row = int(np.prod(shape[1:], dtype=np.int64)) if shape else 1
    out = b.ensure()          # a pooled buffer: a program run again draws into warm memory
    flat = out.reshape(-1)
    if b.replicated:
        g = np.random.default_rng(seed)
        flat[:] = g.uniform(low, high, flat.size) if use_uniform else g.random(flat.size)
        return out
    if b.dist.local_run_count(ctx.rank) <= _MAX_JUMPS:
        pos = 0
        for first, count in b.dist.local_runs(ctx.rank):   # closed form: no array of the rank's rows
            bg = np.random.PCG64(seed)
            bg.advance(first * row)
            g = np.random.Generator(bg)
            k = count * row
            if use_uniform:
                flat[pos:pos + k] = g.uniform(low, high, k)
            else:
                g.random(out=flat[pos:pos + k])     # drawn in place: no temporary of the rank's size
            pos += k
        return out
    rows = b.dist.global_rows(ctx.rank)
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


def random(size: Any = None, dist="block", seed: Optional[int] = None, dtype=np.float64, comm=None) -> Any:
    """Uniform floats in [0, 1), equal to ``numpy.random.default_rng(seed).random(size)``.

    Local when ``seed`` is given. With ``seed=None`` this is NumPy's legacy ``numpy.random.random``:
    the values of the shared legacy ``RandomState`` (see the module docstring; its first use is
    collective). Only float64 is supported (NumPy's float32 stream differs).
    """
    if seed is None:
        return _legacy_call("random", (size,), {}, dist, comm)
    return uniform(0.0, 1.0, size, dist, seed, dtype, comm, _plain=True)


def uniform(low: float = 0.0, high: float = 1.0, size: Any = None, dist="block", seed: Optional[int] = None,
            dtype=np.float64, comm=None, _plain: bool = False) -> DistArray:
    """Uniform floats in [low, high), equal to ``numpy.random.default_rng(seed).uniform(low, high, size)``.

    With ``seed=None`` this is NumPy's legacy ``numpy.random.uniform``: the values of the shared legacy
    ``RandomState``, which it advances (see the module docstring; drawn on every rank, a fallback call)."""
    if seed is None and not _plain:
        return _legacy_call("uniform", (low, high, size), {}, dist, comm)
    if np.dtype(dtype) != np.float64:
        raise UnsupportedOperation("random numbers are supported in float64 only (NumPy's float32 stream differs)")
    ctx = context_for(comm)
    shape = _shape(() if size is None else size)
    b, _ = _new(shape, np.float64, dist, comm, "random")
    s = _seed(ctx, seed)
    _fill_uniform(b, ctx, s, low, high, not _plain)
    return DistArray(b, View.full(shape))


def _distributed_draw(values: Any, dist: Any, comm: Any) -> Any:
    """``values`` (the same on every rank) as a DistArray when it is an array of at least one
    dimension and a supported dtype; else as it is. Local."""
    if isinstance(values, np.ndarray) and values.ndim and values.dtype.kind in "biuf":
        from .creation import from_numpy
        return from_numpy(values, dist=dist, comm=comm)
    return values


class Generator:
    """NumPy's ``Generator`` API over distributed arrays (from :func:`default_rng`).

    Every rank holds the same PCG64 state. ``random`` and ``uniform`` with a ``size`` draw
    distributed: each rank jumps to its rows and draws only those, then every rank's state moves
    past the whole draw; the values equal NumPy's for the same seed. Any other method (``normal``,
    ``integers``, ``choice``, ``permutation``, ...) draws NumPy's values on every rank and keeps
    each rank's rows (counted as fallback calls). SPMD: call every method on every rank in the
    same order with the same arguments. ``dist`` (default ``"block"``) lays out the results."""

    def __init__(self, seed: Any = None, dist: Any = "block", comm: Any = None):
        self._eng = context_for(comm)
        self._comm, self._dist = comm, dist
        seed = _as_scalar(seed)
        if isinstance(seed, np.random.Generator):     # NumPy's default_rng(generator): its bit generator
            seed = seed.bit_generator
        if isinstance(seed, np.random.BitGenerator) and not isinstance(seed, np.random.PCG64):
            raise UnsupportedOperation(f"default_rng({type(seed).__name__}(...)): distributed draws use PCG64; "
                                       "pass an integer seed or numpy.random.PCG64(seed)")
        if isinstance(seed, np.random.PCG64):         # its state (every rank must pass the same one)
            self._bg = np.random.PCG64()
            self._bg.state = seed.state
        else:
            self._bg = np.random.PCG64(_seed(self._eng, seed) if seed is None or isinstance(seed, (int, np.integer))
                                       else seed)
        self._np = np.random.Generator(self._bg)

    @property
    def bit_generator(self) -> Any:
        """The PCG64 bit generator (the same state on every rank)."""
        return self._bg

    def _draw_distributed(self, size: Any, low: float, high: float, plain: bool) -> DistArray:
        shape = _shape(size)
        b, _ = _new(shape, np.float64, self._dist, self._comm, "random")
        row = int(np.prod(shape[1:], dtype=np.int64)) if shape else 1
        out = b.ensure()      # a pooled buffer (see _fill_uniform)
        flat = out.reshape(-1)
        runs = b.dist.local_runs(self._eng.rank) if shape else [(0, 1)]
        pos = 0
        for first, count in runs:
            bg = np.random.PCG64()
            bg.state = self._bg.state
            bg.advance(first * row)
            g = np.random.Generator(bg)
            k = count * row
            if plain:
                g.random(out=flat[pos:pos + k])   # drawn in place (see _fill_uniform)
            else:
                flat[pos:pos + k] = g.uniform(low, high, k)
            pos += k
        # move past the whole draw; advance() drops a buffered 32-bit half, which NumPy's random() keeps
        kept = self._bg.state
        self._bg.advance(int(np.prod(shape, dtype=np.int64)))
        st = self._bg.state
        st["has_uint32"], st["uinteger"] = kept["has_uint32"], kept["uinteger"]
        self._bg.state = st
        return DistArray(b, View.full(shape))

    def random(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        """Uniform floats in [0, 1), NumPy's values; distributed when ``size`` is given."""
        if size is None or out is not None or np.dtype(dtype) != np.float64:
            return self._fallback("random", (size,), {"dtype": dtype, "out": out})
        return self._draw_distributed(size, 0.0, 1.0, plain=True)

    def uniform(self, low: Any = 0.0, high: Any = 1.0, size: Any = None) -> Any:
        """Uniform floats in [low, high), NumPy's values; distributed when ``size`` is given and the
        bounds are scalars."""
        if size is None or not (np.ndim(low) == 0 and np.ndim(high) == 0):
            return self._fallback("uniform", (low, high, size), {})
        return self._draw_distributed(size, float(low), float(high), plain=False)

    def _fallback(self, name: str, args: tuple, kwargs: dict) -> Any:
        return _numpy_draw(getattr(self._np, name), f"random.Generator.{name}", args, kwargs, self._dist, self._comm)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not hasattr(np.random.Generator, name):
            raise AttributeError(f"'Generator' object has no attribute {name!r}")
        attr = getattr(self._np, name)
        if not callable(attr):
            return attr

        def method(*args: Any, **kwargs: Any) -> Any:
            return self._fallback(name, args, kwargs)
        method.__name__ = name
        return method


def default_rng(seed: Any = None, dist: Any = "block", comm: Any = None) -> Generator:
    """``numpy.random.default_rng`` over distributed arrays: a :class:`Generator`. With ``seed=None``
    rank 0 draws a seed and broadcasts it (collective), so every rank holds the same stream. A
    :class:`Generator` is returned itself, as NumPy returns one of its own; a NumPy ``Generator`` or ``PCG64``
    seeds one with its bit generator's state."""
    if isinstance(seed, Generator):
        return seed
    return Generator(seed, dist=dist, comm=comm)


_LEGACY: dict = {}


def seed(seed: Any = None) -> None:
    """``numpy.random.seed``: reseed the legacy ``RandomState`` every rank shares (every rank must
    pass the same ``seed``; with None, rank 0 draws one and broadcasts it: collective)."""
    if seed is None:
        seed = _seed(context_for(None), None) % (1 << 32)
    _LEGACY["state"] = np.random.RandomState(seed)


#: Legacy functions drawing uniform [0, 1) doubles (two 32-bit MT19937 outputs each), drawn distributed.
_LEGACY_UNIFORM = ("random", "random_sample", "sample", "ranf", "rand")


def _legacy_uniform_size(name: str, args: tuple, kwargs: dict) -> Optional[tuple]:
    """The shape a legacy uniform call draws when it can be drawn distributed (an array of at least one
    dimension), else None."""
    if name not in _LEGACY_UNIFORM:
        return None
    if name == "rand":
        size: Any = args if not kwargs else None
    elif len(args) + len(kwargs) == 1 and set(kwargs) <= {"size"}:
        size = args[0] if args else kwargs["size"]
    else:
        return None
    if size is None or size == ():
        return None
    shape = _shape(size)
    return shape or None


def _legacy_uniform(shape: tuple, dist: Any, comm: Any) -> DistArray:
    """``RandomState.random_sample(shape)`` of the shared legacy state, drawn distributed: each rank copies
    the MT19937 state, skips (``random_raw(output=False)``, no values made) the 32-bit outputs of the rows
    before each of its runs of rows (two per double) and draws only its own; it then skips the rows after its
    last run, and its shared state takes that copy's state, past the whole draw (each rank walks the stream
    once). Equal to NumPy's values; local (no communication)."""
    b, ctx = _new(shape, np.float64, dist, comm, "random")
    row = int(np.prod(shape[1:], dtype=np.int64))
    out = b.ensure()          # a pooled buffer (see _fill_uniform)
    flat = out.reshape(-1)
    shared = _LEGACY["state"]._bit_generator
    bg = np.random.MT19937()
    draw = np.random.RandomState(bg)
    bg.state = shared.state
    pos = done = 0              # done: the rows whose outputs the copy has drawn or skipped
    for first, count in b.dist.local_runs(ctx.rank):
        bg.random_raw(2 * (first - done) * row, output=False)   # skip the rows between runs, once
        for c in range(0, count * row, _LEGACY_CHUNK):           # chunks: no temporary of the rank's size
            m = min(_LEGACY_CHUNK, count * row - c)
            flat[pos + c:pos + c + m] = draw.random_sample(m)
        pos, done = pos + count * row, first + count
    bg.random_raw(2 * (shape[0] - done) * row, output=False)    # the rest of the draw: the shared state follows
    shared.state = bg.state
    return DistArray(b, View.full(shape))


def _legacy_call(name: str, args: tuple, kwargs: dict, dist: Any = "block", comm: Any = None) -> Any:
    """NumPy's legacy ``numpy.random.<name>(*args, **kwargs)`` from the shared ``RandomState`` (seeded
    on first use if :func:`seed` was not called), array results distributed. Uniform doubles
    (``random``, ``random_sample``, ``sample``, ``ranf``, ``rand``) are drawn distributed
    (:func:`_legacy_uniform`); the other functions draw every value on every rank (fallback calls)."""
    if "state" not in _LEGACY:
        seed(None)
    shape = _legacy_uniform_size(name, args, kwargs)
    if shape is not None:
        return _legacy_uniform(shape, dist, comm)
    method = "random_sample" if name in ("sample", "ranf") else name    # numpy.random's aliases
    return _numpy_draw(getattr(_LEGACY["state"], method), f"random.{name}", args, kwargs, dist, comm)


def _as_scalar(v: Any) -> Any:
    """A 0-d DistArray (a reduction's result, ``a[i]``, which stands for NumPy's scalar) as NumPy's scalar (a force
    point, collective); anything else as it is."""
    return v.to_numpy()[()] if isinstance(v, DistArray) and v.ndim == 0 else v


def _numpy_draw(fn: Any, name: str, args: tuple, kwargs: dict, dist: Any, comm: Any) -> Any:
    """``fn(*args, **kwargs)`` (a method of the state every rank shares), its array result distributed; counted as a
    fallback call. Distributed operands go through :func:`~.fallback.call`: gathered first, and written back when
    NumPy changes them in place (``shuffle(x)``; ``permuted(x, out=y)`` writes ``y``)."""
    from . import fallback
    args = tuple([_as_scalar(v) for v in args])         # permutation(a.argmax()): NumPy takes a scalar there
    kwargs = {k: _as_scalar(v) if k != "out" else v for k, v in kwargs.items()}
    out = kwargs.get("out")
    if isinstance(out, DistArray):     # NumPy fills a buffer of out's shape (its checks, its size), then out
        if not c_contiguous(out._view):
            raise ValueError("Supplied output array must be contiguous, writable, aligned, and in machine "
                             "byte-order.")
        buf = np.empty(out.shape, out.dtype)
        _numpy_draw(fn, name, args, {**kwargs, "out": buf}, dist, comm)
        out[...] = buf
        return out
    if any(isinstance(v, DistArray) for v in args + tuple(kwargs.values())):
        return _distributed_draw(fallback.call(fn, args, kwargs, name), dist, comm)
    fallback.count(name, 0)
    return _distributed_draw(fn(*args, **kwargs), dist, comm)


def __getattr__(name: str) -> Any:
    """NumPy's other ``numpy.random`` names: legacy functions draw from the shared ``RandomState``
    (see :func:`_legacy_call`); classes and other attributes are NumPy's own."""
    target = getattr(np.random, name, None)
    if target is None:
        raise AttributeError(f"module 'nbmpi.workers.distarray.random' has no attribute {name!r}, and neither has "
                             "numpy.random")
    if callable(target) and not isinstance(target, type) and (hasattr(np.random.RandomState, name)
                                                               or name in _LEGACY_UNIFORM):
        def legacy(*args: Any, **kwargs: Any) -> Any:
            return _legacy_call(name, args, kwargs)
        legacy.__name__ = name
        return legacy
    return target
