"""Constructors of coordinate grids and special matrices: ``linspace``, ``logspace``, ``geomspace``,
``meshgrid``, ``indices``, ``identity``, ``eye``, ``fromfunction``, ``copy``, ``asarray(dtype=)``.

Like the constructors of :mod:`.creation` they are local: each rank computes only the rows it
owns (axis 0), from the same arguments on every rank, without communicating, and the values equal
NumPy's bit for bit (each rank evaluates NumPy's own formula at its rows). Call them on every rank
with the same arguments (SPMD); ``dist=`` and ``comm=`` as in :mod:`.creation`.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Sequence, Tuple

import numpy as np

from .array import _FUNCTIONS, DistArray
from .creation import _dtype, _new, _shape, from_numpy
from .distribution import Distribution
from .graph import Base
from .indexing import View
from .lazy_grids import make_lazy

__all__ = ["linspace", "logspace", "geomspace", "meshgrid", "indices", "identity", "eye", "fromfunction"]


def _from_rows(shape: Any, dtype: Any, dist: Any, comm: Any, fill: Callable[[np.ndarray], np.ndarray],
               origin: str) -> DistArray:
    """A new array of ``shape`` whose local block is ``fill(rows)``, ``rows`` the global indices
    (axis 0) this rank owns. Local. A ``fill`` result that is already a C-contiguous array of its own of the
    dtype and local shape becomes the local buffer; any other (a broadcast view, as ``mgrid``'s) is copied
    into a pooled buffer (a dead base's of the same shape when there is one: no fresh pages)."""
    b, ctx = _new(_shape(shape), dtype, dist, comm, origin)
    rows = b.dist.global_rows(ctx.rank) if b.shape else np.zeros(1, dtype=np.int64)
    vals = fill(rows)
    lshape = b.local_shape()
    if (isinstance(vals, np.ndarray) and vals.base is None and vals.flags.c_contiguous and vals.dtype == b.dtype
            and vals.shape == lshape):
        b.set_local(vals)
    else:
        np.copyto(b.ensure(), np.asarray(vals).reshape(lshape), casting="unsafe")
    return DistArray(b, View.full(b.shape))


def lazy_grid(shape: Tuple[int, ...], dtype: np.dtype, dist: Any, comm: Any, vec: np.ndarray, axis: int,
              origin: str) -> DistArray:
    """A new coordinate array of ``shape`` whose element at index ``i`` is ``vec[i[axis]]`` (``vec``: the 1-D
    coordinates, of length ``shape[axis]``, converted to ``dtype`` as ``numpy.copyto`` does), not stored: a lazy
    grid (:mod:`.lazy_grids`) keeping only this rank's coordinates (its rows of ``vec`` if ``axis`` is 0, else
    all of ``vec``). Local. A replicated or empty array is stored at once (:func:`_from_rows`)."""
    b, ctx = _new(shape, dtype, dist, comm, origin)
    vals = np.asarray(vec).astype(b.dtype, copy=False)
    cshape = tuple(n if j == axis else 1 for j, n in enumerate(b.shape))
    if b.replicated or 0 in b.shape:
        def fill(rows: np.ndarray) -> np.ndarray:
            v = vals[rows] if axis == 0 else vals
            return np.broadcast_to(v.reshape(cshape[:axis] + (-1,) + cshape[axis + 1:]), (len(rows),) + b.shape[1:])
        return _from_rows(b.shape, b.dtype, dist, comm, fill, origin)
    if axis == 0:
        coords = Base(ctx, cshape, b.dtype, b.dist, origin=origin + " coordinates")
        coords.set_local(np.ascontiguousarray(vals[b.dist.global_rows(ctx.rank)]).reshape(coords.local_shape()))
    else:
        coords = Base(ctx, cshape, b.dtype, Distribution("replicated", 1, ctx.size), origin=origin + " coordinates")
        coords.set_local(np.array(vals, order="C").reshape(cshape))
    make_lazy(b, coords)
    return DistArray(b, View.full(b.shape))


def _gathered(x: Any) -> np.ndarray:
    """``x`` as a NumPy array (a DistArray is gathered: collective)."""
    return x.to_numpy() if isinstance(x, DistArray) else np.asarray(x)


def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, retstep: bool = False, dtype: Any = None,
             axis: int = 0, dist: Any = "block", comm: Any = None) -> Any:
    """``numpy.linspace`` as a distributed 1-D array (scalar ``start``/``stop``, ``axis=0``). Local.
    Each rank evaluates NumPy's linspace and keeps its rows: O(num) work per rank, no communication."""
    full, step = np.linspace(start, stop, num, endpoint=endpoint, retstep=True, dtype=dtype, axis=axis)
    out = from_numpy(full, dist=dist, comm=comm) if full.ndim else full
    return (out, step) if retstep else out


def logspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, base: float = 10.0, dtype: Any = None,
             axis: int = 0, dist: Any = "block", comm: Any = None) -> DistArray:
    """``numpy.logspace`` as a distributed 1-D array. Local."""
    return from_numpy(np.logspace(start, stop, num, endpoint=endpoint, base=base, dtype=dtype, axis=axis),
                      dist=dist, comm=comm)


def geomspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, dtype: Any = None, axis: int = 0,
              dist: Any = "block", comm: Any = None) -> DistArray:
    """``numpy.geomspace`` as a distributed 1-D array. Local."""
    return from_numpy(np.geomspace(start, stop, num, endpoint=endpoint, dtype=dtype, axis=axis), dist=dist, comm=comm)


def meshgrid(*xi: Any, indexing: str = "xy", sparse: bool = False, copy: bool = True, dist: Any = "block",
             comm: Any = None) -> tuple:
    """``numpy.meshgrid``: a tuple of coordinate arrays from 1-D coordinate vectors, each distributed over its
    axis 0 (for ``indexing="xy"`` with two or more vectors that is the second vector's axis). Local,
    except that distributed coordinate vectors are gathered first (collective). ``sparse=True``
    returns NumPy's sparse grids (small, replicated as NumPy arrays). The dense grids are not stored until
    something needs their memory (:func:`lazy_grid`)."""
    if indexing not in ("xy", "ij"):
        raise ValueError("meshgrid: indexing must be 'xy' or 'ij'")
    vecs = [_gathered(x).reshape(-1) for x in xi]
    if sparse or not vecs:
        return np.meshgrid(*vecs, indexing=indexing, sparse=sparse, copy=copy)
    lead = 1 if indexing == "xy" and len(vecs) > 1 else 0          # the input that runs along axis 0
    lens = [len(v) for v in vecs]
    shape = tuple(lens) if lead == 0 else (lens[1], lens[0], *lens[2:])
    out = []
    for k in range(len(vecs)):           # each grid keeps its own vector's dtype, as NumPy's
        axis = (1 - k if k < 2 else k) if lead == 1 else k    # the axis output k varies along
        out.append(lazy_grid(shape, vecs[k].dtype, dist, comm, vecs[k], axis, f"meshgrid[{k}]"))
    return tuple(out)


def indices(dimensions: Sequence[int], dtype: Any = int, sparse: bool = False, dist: Any = "block",
            comm: Any = None) -> Any:
    """``numpy.indices``: the grid of indices of ``dimensions``, shape ``(len(dimensions), *dimensions)``,
    distributed over its axis 0 (one row per dimension). ``sparse=True``: NumPy's tuple of one array per
    dimension (length 1 on the other axes), each distributed. Local."""
    dims = tuple(int(d) for d in dimensions)
    if sparse:
        from .creation import from_numpy
        return tuple(from_numpy(x, dist=dist, comm=comm) for x in np.indices(dims, dtype=dtype, sparse=True))
    return _from_rows((len(dims),) + dims, dtype, dist, comm, lambda rows: np.indices(dims, dtype=dtype)[rows],
                      f"indices{dims}")


def eye(N: int, M: Any = None, k: int = 0, dtype: Any = float, order: str = "C", dist: Any = "block",
        comm: Any = None) -> DistArray:
    """``numpy.eye``: ones on the ``k``-th diagonal of an ``N x M`` matrix. Local (a 0-d DistArray ``N``, ``M`` or
    ``k`` is read first: a force point on every rank)."""
    N, k = operator.index(N), operator.index(k)
    cols = N if M is None else operator.index(M)

    def fill(rows: np.ndarray) -> np.ndarray:
        local = np.zeros((len(rows), cols), dtype=_dtype(dtype))
        c = rows + k
        keep = (c >= 0) & (c < cols)
        local[np.flatnonzero(keep), c[keep]] = 1
        return local
    return _from_rows((N, cols), dtype, dist, comm, fill, f"eye({N},{cols},{k})")


def identity(n: int, dtype: Any = float, dist: Any = "block", comm: Any = None) -> DistArray:
    """``numpy.identity``: the ``n x n`` identity matrix. Local."""
    return eye(n, dtype=dtype, dist=dist, comm=comm)


def fromfunction(function: Callable[..., Any], shape: Sequence[int], *, dtype: Any = float, dist: Any = "block",
                 comm: Any = None, **kwargs: Any) -> Any:
    """``numpy.fromfunction``: ``function(*grids, **kwargs)`` called once, as NumPy calls it, with one coordinate
    array per axis of ``shape`` (of ``dtype``; distributed by ``dist``, lazy grids: no memory until an operation
    needs it); returns whatever ``function`` returns (a distributed array computed by the operations it records,
    a scalar, a tuple). So a function that is not elementwise (``i[::-1]``, ``i.max()``, ``cumsum``) sees the
    whole grids, as in NumPy. SPMD: call on every rank."""
    shp = _shape(shape)
    dt = np.dtype(dtype)
    grids = [lazy_grid(shp, dt, dist, comm, np.arange(n), axis, "fromfunction") for axis, n in enumerate(shp)]
    return function(*grids, **kwargs)


def rows_from_function(function: Callable[..., Any], shape: Sequence[int], *, dtype: Any = float,
                       dist: Any = "block", comm: Any = None) -> DistArray:
    """A new array of ``shape`` whose elements are ``function(*coordinates)``, ``function`` evaluated with NumPy
    on each rank's rows only (and once on one element, for its result's dtype): for the library's own
    elementwise functions of the coordinates (index grids of reductions, ``tri``), nothing recorded. Local."""
    shp = _shape(shape)

    def fill(rows: np.ndarray) -> np.ndarray:
        grids = np.meshgrid(rows.astype(dtype), *[np.arange(n, dtype=dtype) for n in shp[1:]], indexing="ij")
        return np.broadcast_to(function(*grids), (len(rows),) + shp[1:])
    probe = np.asarray(function(*[np.zeros(1, dtype=dtype) for _ in shp]))
    return _from_rows(shp, probe.dtype, dist, comm, fill, "fromfunction")


# numpy.<name>(distarray, ...) dispatches here through DistArray.__array_function__
_FUNCTIONS.update({np.meshgrid: meshgrid})
