"""NumPy's ``convolve`` and ``correlate`` natively on a distributed 1-D signal with a kernel every rank holds.

The result is block-distributed. The rank owning result elements ``[lo, hi)`` needs the signal's elements
``[lo + off - (m - 1), hi + off)`` (``off``: where the mode's output starts in the full convolution, ``m``:
the kernel's length): its own block of the signal plus a halo of ``m - 1`` elements before it, which may
span several ranks when blocks are short. One ``alltoallv`` (:func:`~.exchange.alltoallv`) brings each
rank exactly its window, in order (the signal is first redistributed to blocks unless it already is a
whole block-distributed array); each rank then convolves its window with NumPy. Nothing is gathered to
one rank; a distributed kernel (the shorter operand) is replicated, since every output element needs all
of it.

``correlate(a, v)`` is ``convolve(a, v[::-1])`` (real operands; NumPy's definition); when the kernel is
longer than the signal NumPy swaps the operands, and so does this: ``correlate(v, a)`` reversed. Complex
operands and operands that are not 1-D go through the NumPy fallback. Collective over the array's communicator and
blocking (a force point); call SPMD with the same arguments.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from . import fallback
from .array import _FUNCTIONS, DistArray
from .distribution import Distribution
from .exchange import alltoallv, from_local_part

__all__ = ["convolve", "correlate"]

_MODES = ("full", "same", "valid")


def _out_range(n: int, m: int, mode: str) -> Tuple[int, int]:
    """(start in the full convolution, length) of ``mode``'s output for lengths ``n >= m``. Local."""
    if mode == "full":
        return 0, n + m - 1
    if mode == "same":
        return (m - 1) // 2, n
    return m - 1, n - m + 1


def _windowed(signal: DistArray, kernel: np.ndarray, mode: str) -> DistArray:
    """``numpy.convolve(signal, kernel, mode)`` for ``len(signal) >= len(kernel) >= 1`` (see the module doc).
    Collective, blocking."""
    ctx = signal.context
    n, m = signal.shape[0], len(kernel)
    if not (signal._view.is_full and signal.dist.kind == "block"):
        signal = signal.redistribute("block")
    sd = signal.dist
    off, length = _out_range(n, m, mode)
    od = Distribution("block", length, ctx.size)

    def need(q: int) -> Tuple[int, int]:
        lo, hi = od.block_range(q)
        if hi <= lo:
            return 0, 0
        return max(0, lo + off - (m - 1)), min(n, hi + off)

    my_lo, my_hi = sd.block_range(ctx.rank)
    local = np.ascontiguousarray(signal.local)
    counts = np.zeros(ctx.size, dtype=np.int64)
    parts = []
    for q in range(ctx.size):
        a, b = need(q)
        a, b = max(a, my_lo), min(b, my_hi)
        if b > a:
            counts[q] = b - a
            parts.append(local[a - my_lo:b - my_lo])
    send = np.concatenate(parts) if parts else np.empty(0, dtype=signal.dtype)
    window = alltoallv(ctx, send, counts, f"{mode} convolution")
    lo, hi = od.block_range(ctx.rank)
    dtype = np.result_type(signal.dtype, kernel.dtype)
    if hi > lo:
        start = need(ctx.rank)[0]
        full = np.convolve(window, kernel, "full")
        out = full[lo + off - start:hi + off - start].astype(dtype, copy=False)
    else:
        out = np.empty(0, dtype=dtype)
    return from_local_part(ctx, (length,), od, out)


def _operands(a: Any, v: Any, mode: str, swap: bool) -> Any:
    """(signal DistArray, kernel ndarray) for the native path, or None. ``swap``: the operands may be swapped
    (convolution commutes)."""
    if mode not in _MODES or np.ndim(a) != 1 or np.ndim(v) != 1:
        return None
    la, lv = len(a), len(v)
    if swap and (la < lv or not isinstance(a, DistArray)) and isinstance(v, DistArray) and lv >= la:
        a, v, la, lv = v, a, lv, la
    if swap and isinstance(a, DistArray) and not isinstance(v, DistArray) and la < lv:
        from .creation import from_numpy          # a NumPy signal every rank holds: each takes its block

        a, v, la, lv = from_numpy(np.asarray(v), dist="block", comm=a.comm), a, lv, la
    if not isinstance(a, DistArray) or la < lv or lv == 0:
        return None
    kernel = v.to_numpy() if isinstance(v, DistArray) else np.asarray(v)
    if a.dtype.kind not in "biuf" or kernel.dtype.kind not in "biuf":
        return None
    return a, kernel


def convolve(a: Any, v: Any, mode: str = "full") -> Any:
    """``numpy.convolve``: the discrete linear convolution of two 1-D arrays, block-distributed. Collective,
    blocking (see the module doc)."""
    ops = _operands(a, v, mode, True)
    if ops is None:
        return fallback.call(np.convolve, (a, v), dict(mode=mode), "convolve")
    fallback.note_native("convolve")
    return _windowed(ops[0], ops[1], mode)


def correlate(a: Any, v: Any, mode: str = "valid") -> Any:
    """``numpy.correlate``: the cross-correlation of two real 1-D arrays (``len(a) >= len(v)``),
    block-distributed. Collective, blocking (see the module doc)."""
    ops = _operands(a, v, mode, False)
    if (ops is None and mode in _MODES and np.ndim(a) == 1 and np.ndim(v) == 1 and 0 < len(a) < len(v)
            and isinstance(a, DistArray) | isinstance(v, DistArray)):
        # NumPy swaps the operands: correlate(a, v) is correlate(v, a) reversed (real operands, bit for bit)
        if not isinstance(v, DistArray):
            from .creation import from_numpy

            v = from_numpy(np.asarray(v), dist="block", comm=a.comm)
        swapped = _operands(v, a, mode, False)
        if swapped is not None:
            fallback.note_native("correlate")
            return _windowed(swapped[0], swapped[1][::-1].copy(), mode)[::-1]
    if ops is None:
        return fallback.call(np.correlate, (a, v), dict(mode=mode), "correlate")
    fallback.note_native("correlate")
    return _windowed(ops[0], ops[1][::-1].copy(), mode)


_FUNCTIONS.update({np.convolve: convolve, np.correlate: correlate})
