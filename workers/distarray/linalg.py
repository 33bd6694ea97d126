"""``nbmpi.workers.distarray.linalg``: NumPy's ``numpy.linalg`` for distributed arrays.

``norm`` runs natively (recorded reductions, nothing gathered) for vectors (1-D, or ``axis`` an int) with
``ord`` None, 2, 1, inf, -inf, 0 or any other number, and for matrices (2-D with ``axis`` None or a pair)
with ``ord`` None, ``'fro'``, 1, -1, inf, -inf; ``keepdims`` as NumPy. Every other name of
``numpy.linalg`` (``solve``, ``inv``, ``eig``, ``svd``, ``norm(ord=2)`` of a matrix, ...) runs through the
NumPy fallback (:mod:`.fallback`: operands gathered on every rank, NumPy called, the result
distributed). Call SPMD on every rank with the same arguments. The recording of ``a @ b`` is in
:mod:`.matmul_recording`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import fallback
from .array import _FUNCTIONS, DistArray
from .numpy_reductions import count_nonzero, keep_dims, max as _max, min as _min, normalize_axes, sum as _sum

__all__ = ["norm"]


def _vector_norm(x: DistArray, ord: Any, axis: Any, keepdims: bool) -> Any:
    """The vector norm of ``x`` along ``axis`` (an int, or None for a 1-D ``x``)."""
    ax = np.absolute(x)
    if ord is None or ord == 2:
        return np.sqrt(_sum(ax * ax if x.dtype.kind == "f" else (ax * ax).astype(np.float64), axis=axis,
                            keepdims=keepdims))
    if ord == np.inf:       # NumPy's max(initial=0): 0 where there is no element
        empty = (x.size if axis is None else x.shape[axis]) == 0
        return _max(ax, axis=axis, keepdims=keepdims, **({"initial": 0} if empty else {}))
    if ord == -np.inf:
        return _min(ax, axis=axis, keepdims=keepdims)
    if ord == 0:
        return count_nonzero(x, axis=axis, keepdims=keepdims).astype(x.dtype if x.dtype.kind == "f" else np.float64)
    if ord == 1:
        return _sum(ax if x.dtype.kind == "f" else ax.astype(np.float64), axis=axis, keepdims=keepdims)
    p = float(ord)
    fx = ax if x.dtype.kind == "f" else ax.astype(np.float64)
    return _sum(fx ** p, axis=axis, keepdims=keepdims) ** (1.0 / p)


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:
    """``numpy.linalg.norm`` of a DistArray (recorded; see the module doc for what runs natively). SPMD."""
    native = isinstance(x, DistArray) and x.dtype.kind in "biuf" and x.ndim >= 1
    if native:
        axes = normalize_axes(axis, x.ndim) if axis is not None else None
        vector = (axis is None and x.ndim == 1) or (axes is not None and len(axes) == 1)
        matrix = (axis is None and x.ndim == 2) or (axes is not None and len(axes) == 2 and x.ndim == 2)
        if axis is None and ord is None:
            fallback.note_native("linalg.norm")
            r = _vector_norm(x, None, None, False)
            return keep_dims(r, None, x.ndim) if keepdims else r
        if vector and not isinstance(ord, str):
            fallback.note_native("linalg.norm")
            return _vector_norm(x, ord, None if axes is None else axes[0], keepdims)
        if matrix and ord in ("fro", 1, -1, np.inf, -np.inf):
            fallback.note_native("linalg.norm")
            return _matrix_norm(x, ord, 0 if axis is None else int(tuple(axis)[0]) % 2, keepdims)
    return fallback.call(np.linalg.norm, (x,), dict(ord=ord, axis=axis, keepdims=keepdims), "linalg.norm")


def _matrix_norm(x: DistArray, ord: Any, row_axis: int, keepdims: bool) -> Any:
    """Frobenius, 1, -1, inf and -inf norms of a 2-D ``x`` whose rows run along ``row_axis`` (NumPy's
    ``axis=(row_axis, col_axis)``; 0 by default): ord 1 sums along ``row_axis``, inf along the other."""
    ax = np.absolute(x)
    if x.dtype.kind != "f":
        ax = ax.astype(np.float64)
    if ord == "fro":
        r = np.sqrt(_sum(ax * ax))
    elif ord in (1, -1):
        r = (_max if ord == 1 else _min)(_sum(ax, axis=row_axis))
    else:
        r = (_max if ord == np.inf else _min)(_sum(ax, axis=1 - row_axis))
    return keep_dims(r, None, 2) if keepdims else r


def __getattr__(name: str) -> Any:
    """Every other name of ``numpy.linalg``: its functions through the NumPy fallback, its other objects
    (exceptions such as ``LinAlgError``) as they are."""
    target = getattr(np.linalg, name, None)
    if target is None or name.startswith("__"):
        raise AttributeError(f"module 'nbmpi.workers.distarray.linalg' has no attribute {name!r}, and neither has "
                             "numpy.linalg")
    if callable(target) and not isinstance(target, type):
        target = fallback.wrap(target, f"linalg.{name}")
    globals()[name] = target
    return target


# numpy.linalg.norm(distarray) dispatches here through DistArray.__array_function__
_FUNCTIONS[np.linalg.norm] = norm
