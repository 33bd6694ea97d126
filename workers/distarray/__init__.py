"""Distributed arrays with automatic latency hiding (the DistNumPy model): a NumPy-like namespace.

``import nbmpi.workers.distarray as dnp``, then write NumPy code on ``dnp`` arrays; run it SPMD
on every rank (``nbmpi run``, ``%%distributed`` cells, controller jobs)::

    a = dnp.zeros((4000, 4000), dist="block")        # or "cyclic", ("block-cyclic", 64)
    full = a
    center = full[1:-1, 1:-1]; north = full[0:-2, 1:-1]; south = full[2:, 1:-1]   # views, no copies
    west = full[1:-1, 0:-2]; east = full[1:-1, 2:]
    work = 0.2 * (center + north + south + east + west)     # recorded, not computed
    delta = float(dnp.sum(dnp.abs(center - work)))          # force point: everything runs now
    center[:] = work

Operations are recorded lazily and evaluated at force points (``float()``, ``print``,
``to_numpy()``, ``.local``, ``argmax``/``argmin`` over all elements, :func:`evaluate`, or a threshold of
recorded operations). At a force point every transfer starts first, blocks whose operands are local are computed while
they fly, and a rank waits only when nothing else is ready (:mod:`.scheduler`); chains of
elementwise operations run as one numba kernel each (:mod:`.fusion`,
:mod:`.fused_kernels`). ``NBMPI_LATENCY_HIDING=0`` (or ``evaluate(latency_hiding=False)``,
:func:`configure`) exchanges first and computes afterwards, for comparison.

Copies between layouts (``b[...] = a``, ``a.redistribute(dist)``) are one aggregated transfer with
at most one message per peer (:mod:`.operations.redistribution`, kernels in :mod:`.packing`);
``b[idx] = a`` and ``a[idx]`` with index arrays go through the Aggregator (:mod:`.irregular`).

Modules: recording: :mod:`.distribution` (block, cyclic, block-cyclic, replicated), :mod:`.indexing`
(views), :mod:`.array` (DistArray), :mod:`.graph` (recorded tasks), :mod:`.elementwise`,
:mod:`.reductions`, :mod:`.matmul_recording`, :mod:`.numpy_reductions`,
:mod:`.numpy_cumulative`, :mod:`.numpy_shapes`, :mod:`.numpy_joining`, :mod:`.linalg` (NumPy's API on top),
:mod:`.creation` and :mod:`.random` (constructors), :mod:`.lazy_grids` and :mod:`.lazy_joins` (grids and
joins kept unstored until something needs their memory); collective steps sending elements by global position
(run at once, not recorded): :mod:`.exchange`, :mod:`.arg_extreme`, :mod:`.numpy_sorting`, :mod:`.numpy_reshaping`, :mod:`.numpy_signal`,
:mod:`.masking` (boolean masks, trailing index arrays), :mod:`.numpy_indexing`; every ufunc: :mod:`.ufuncs`;
evaluation: :mod:`.fusion` (groups), :mod:`.operations` (one module per kind of operation: its
plan, cache key and lowering into units), :mod:`.plans` (what plans share), :mod:`.units`,
:mod:`.scheduler` (orders and executes units), :mod:`.fp_errors` (NumPy's floating-point error handling), :mod:`.packing` (copy kernels), :mod:`.irregular`
(index arrays), :mod:`.fused_kernels` (code generation), :mod:`.context` (per-communicator state).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as _np
from numpy import (absolute, add, arctan2, bitwise_and, bitwise_or, bitwise_xor, bool_, ceil, cos, divide, e,
                   equal, exp, float32, float64, floor, greater, greater_equal, inf, int32, int64, isfinite, isnan,
                   less, less_equal, log, log10, logical_and, logical_not, logical_or, maximum, minimum, multiply,
                   nan, negative, newaxis, not_equal, pi, positive, power, sin, sqrt, square, subtract, tan, tanh,
                   true_divide)

from . import random
from .array import _FUNCTIONS as _NATIVE, DistArray, _reduce, dot, matmul, roll, transpose, where
from .creation import (arange, array, asanyarray, asarray, ascontiguousarray, empty, empty_like, from_numpy, full,
                       full_like, may_share_memory, ones, ones_like, require, shares_memory, zeros,
                       zeros_like)
from .distribution import Distribution
from .context import configure, context_for
engine_for = context_for  # the former name, kept
from .errors import (CopyNotViewWarning, DistArrayDivergence, DistArrayError, DistArrayTimeout, DistributionError, IndexOutOfBounds, ShapeError,
                     UnsupportedOperation)
from .fallback import NumPyFallbackWarning
from .numpy_reductions import (all, amax, amin, any, argmax, argmin, count_nonzero, max, mean, min, nanmax,
                               nanmean, nanmin, nanprod, nanstd, nansum, nanvar, prod, std, sum, var)
from .numpy_cumulative import cumprod, cumsum
from .numpy_shapes import around, clip, cross, diagonal, expand_dims, flip, outer, round, squeeze, swapaxes, trace
from . import linalg
from .numpy_sorting import argsort, searchsorted, sort
from .numpy_reshaping import argwhere, flatnonzero, moveaxis, nonzero, ravel, repeat, reshape, tile
from .numpy_joining import append, column_stack, concat, concatenate, dstack, hstack, stack, vstack
from .numpy_signal import convolve, correlate
from . import masking as _masking  # registers a[mask], a[mask] = v, a[:, idx] with DistArray
from .numpy_indexing import argpartition, choose, compress, partition, put, resize, take
from .grids import eye, fromfunction, geomspace, identity, indices, linspace, logspace, meshgrid
from .index_grids import mgrid, ogrid
from .fused_kernels import kernel_stats
from . import fallback as _fallback
from ..core import jit_warmup as _jit_warmup

_jit_warmup.start()  # numba's one-time start in the background (NBMPI_JIT_WARMUP=0: off)

abs = absolute  # noqa: A001 - the numpy-like namespace


def copy(a: Any) -> Any:
    """``numpy.copy``: a new array with ``a``'s values (recorded for a DistArray; NumPy's copy otherwise)."""
    return a.copy() if isinstance(a, DistArray) else _np.copy(a)


def astype(x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Any:
    """``numpy.astype``: ``x.astype(dtype, copy=copy)`` (recorded for a DistArray; NumPy's otherwise)."""
    return x.astype(dtype, copy=copy) if isinstance(x, DistArray) else _np.astype(x, dtype, copy=copy)


def permute_dims(a: Any, axes: Any = None) -> Any:
    """``numpy.permute_dims``: :func:`transpose` (the array API's name)."""
    return transpose(a, axes)


def redistribute(a: DistArray, dist: Any) -> DistArray:
    """``a.redistribute(dist)``: a copy of ``a`` with its rows spread by ``dist`` (recorded; see
    :meth:`DistArray.redistribute`)."""
    return a.redistribute(dist)


def evaluate(comm=None, latency_hiding: Optional[bool] = None) -> None:
    """Run every operation recorded on ``comm`` (default ``COMM_WORLD``) now: a force point.
    Collective. ``latency_hiding`` overrides the setting for this evaluation only."""
    context_for(comm).flush("evaluate()", latency_hiding=latency_hiding)


def stats(comm=None) -> Dict[str, Any]:
    """Counters of this rank (local): evaluations, recorded/fused/dropped operations, plans built (and the
    nanoseconds spent building them, ``plan_build_ns``) and reused, blocks computed, messages and bytes sent, time waited, local buffers of at least 64 KiB
    allocated (lazily, for results actually stored), reused and released (given back inside a force point by a
    dead temporary after its last use), and the compiled kernels
    (``kernels``: ``compiled``/``loaded``/``signatures``). ``last`` describes the last evaluation."""
    ctx = context_for(comm)
    out: Dict[str, Any] = dict(ctx.stats)
    out["pending"] = len(ctx.pending)
    out["buffers_allocated"] = ctx.buffers.allocated
    out["buffers_reused"] = ctx.buffers.reused
    out["buffers_released"] = ctx.buffers.released
    out["kernels"] = kernel_stats()
    out["fallback"] = _fallback.stats()
    out["last"] = dict(ctx.last)
    out["settings"] = dict(latency_hiding=ctx.latency_hiding, threshold=ctx.threshold,
                           chunk_elems=ctx.chunk_elems, timeout=ctx.timeout)
    return out


__all__ = [
    "DistArray", "Distribution", "DistArrayError", "DistArrayDivergence", "DistArrayTimeout", "DistributionError",
    "ShapeError", "UnsupportedOperation", "IndexOutOfBounds", "NumPyFallbackWarning", "CopyNotViewWarning",
    "zeros", "ones", "empty", "full", "arange", "from_numpy", "array", "asarray", "asanyarray", "ascontiguousarray",
    "require", "zeros_like", "ones_like", "empty_like", "full_like", "shares_memory", "may_share_memory", "random",
    "linspace", "logspace", "geomspace", "meshgrid", "indices", "identity", "eye",
    "fromfunction", "copy", "astype",
    "sum", "prod", "mean", "std", "var", "min", "max", "amin", "amax", "any", "all", "argmin", "argmax",
    "count_nonzero", "nansum", "nanprod", "nanmean", "nanstd", "nanvar", "nanmin", "nanmax", "cumsum", "cumprod",
    "expand_dims", "squeeze", "flip", "swapaxes", "clip", "round", "around", "outer", "diagonal", "trace", "linalg",
    "where", "dot", "matmul", "transpose", "roll",
    "sort", "argsort", "searchsorted", "reshape", "ravel", "repeat", "tile", "nonzero", "flatnonzero", "argwhere",
    "moveaxis", "permute_dims",
    "concatenate", "concat", "stack", "hstack", "vstack", "dstack", "column_stack", "append", "convolve", "correlate", "cross",
    "take", "compress", "choose", "put", "partition", "argpartition", "resize",
    "evaluate", "configure", "stats", "redistribute",
    "add", "subtract", "multiply", "divide", "true_divide", "power", "negative", "positive", "absolute", "abs",
    "square", "sqrt", "exp", "log", "log10", "sin", "cos", "tan", "tanh", "floor", "ceil", "isnan", "isfinite",
    "maximum", "minimum", "less", "less_equal", "greater", "greater_equal", "equal", "not_equal", "logical_and",
    "logical_or", "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "arctan2",
    "pi", "e", "inf", "nan", "newaxis", "float64", "float32", "int64", "int32", "bool_",
]
_ = _np


def __getattr__(name: str) -> Any:
    """Any other name NumPy has: its constants, types and ufuncs as they are (a ufunc on DistArrays runs
    natively, :mod:`.ufuncs`); a function with a native implementation (the one ``numpy.<name>(distarray)``
    dispatches to) that one; its other functions through the NumPy fallback (:mod:`.fallback`:
    distributed operands gathered, NumPy called, the result distributed)."""
    target = getattr(_np, name, _MISSING)
    if target is _MISSING:
        raise AttributeError(f"module 'nbmpi.workers.distarray' has no attribute {name!r}, and neither has numpy")
    if callable(target) and not isinstance(target, (type, _np.ufunc)):    # a ufunc dispatches itself (.ufuncs)
        impl = _NATIVE.get(target)
        target = _fallback.wrap(target, name) if impl is None else _native(impl, name)
    globals()[name] = target
    return target


def _native(impl: Any, name: str) -> Any:
    """The native implementation ``impl`` of ``numpy.<name>`` (registered for ``numpy.<name>(distarray)``), counted
    as a native call in the coverage report."""
    def native(*args: Any, **kwargs: Any) -> Any:
        _fallback.note_native(name)
        return impl(*args, **kwargs)
    native.__name__ = native.__qualname__ = name
    native.__doc__ = impl.__doc__
    native.__wrapped__ = impl
    return native


_MISSING = object()
