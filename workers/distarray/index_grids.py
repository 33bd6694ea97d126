"""``mgrid`` and ``ogrid``: NumPy's index-trick grids as distributed arrays.

``mgrid[-1:1:5j, 0:3]`` is NumPy's dense grid (shape ``(2, 5, 3)``); ``ogrid[...]`` its open (sparse) form.

* A 1-D key (``mgrid[0:10:2]``, ``mgrid[0:1:5j]``) gives a distributed 1-D array.
* A tuple of ``d`` slices gives, for ``mgrid``, a :class:`GridArray` of shape ``(d, n0, ..., n_{d-1})``: its
  ``d`` coordinate arrays are built distributed over *their* axis 0 (``n0``), so ``y, x = mgrid[...]`` (the
  usual use) gives two well-distributed arrays. Used as a whole (``g ** 2``, ``g.sum(axis=0)``), the grid
  is the stacked ``(d, ...)`` array, distributed over its axis 0 like any array NumPy shapes so. For
  ``ogrid`` the first array ``(n0, 1, ..., 1)`` is distributed; the others have one row each and are
  returned as the small NumPy arrays NumPy gives (a distributed operand broadcasts with them).

Values equal NumPy's bit for bit: each axis' coordinates are NumPy's formula (``index * step + start`` in the
dtype NumPy picks, complex steps as point counts). Local: each rank computes only the rows it owns, from the
same key on every rank, without communicating (SPMD: use the same key on every rank). ``mgrid``'s coordinate
arrays are lazy grids (:mod:`.lazy_grids`): not stored until something needs their memory. The grids use the
default communicator and the block distribution.
"""
from __future__ import annotations

import math
from typing import Any, List, Tuple

import numpy as np

from .array import DistArray
from .grids import _from_rows, lazy_grid
from .numpy_joining import stack

__all__ = ["mgrid", "ogrid", "GridArray"]


def _axes(key: Tuple[slice, ...]) -> Tuple[List[int], np.dtype, List[Any], List[Any]]:
    """NumPy's sizes, dtype, steps and starts for a tuple of slices (``nd_grid.__getitem__``'s rules)."""
    sizes, nums, steps, starts = [], [0], [], []
    for kk in key:
        if not isinstance(kk, slice):
            raise TypeError(f"mgrid/ogrid take slices, like mgrid[0:1:5j, 0:3]; got {kk!r}")
        start = 0 if kk.start is None else kk.start
        step = 1 if kk.step is None else kk.step
        if isinstance(step, (np.complexfloating, complex)):
            count = int(abs(step))
            sizes.append(count)
            nums += [start, kk.stop, abs(step)]
            steps.append(count if count == 1 else (kk.stop - start) / float(count - 1))
        else:
            sizes.append(math.ceil((kk.stop - start) / step))
            nums += [start, kk.stop, step]
            steps.append(step)
        starts.append(start)
    return sizes, np.result_type(*nums), steps, starts


def _coordinates(n: int, typ: np.dtype, step: Any, start: Any) -> np.ndarray:
    """One axis' coordinates as NumPy computes them in a grid: ``(index * step + start)`` stored as ``typ``."""
    return (np.arange(n, dtype=typ) * step + start).astype(typ, copy=False)


class GridArray(DistArray):
    """``mgrid[...]``'s result (see the module doc): the stacked ``(d, ...)`` distributed array, whose rows
    (``g[i]``, iteration, unpacking) are the ``d`` coordinate arrays, each distributed over its own axis 0.

    After an assignment into the grid (``g[0] += 1``, ``g[:, 1] = 0``) its rows are read from the stacked
    array (still NumPy's values). Writing into a coordinate array obtained earlier (``y = g[0]; y[3] = 0``)
    changes that array only, not ``g``.
    """

    __slots__ = ("_parts",)

    def __init__(self, parts: List[DistArray]):
        whole = stack(parts)          # recorded: runs only if the grid is used as a whole
        super().__init__(whole._base, whole._view)
        self._parts: Any = tuple(parts)

    def __iter__(self):
        if self._parts is None:
            return super().__iter__()
        return iter(self._parts)

    def __getitem__(self, key: Any):
        if self._parts is not None:
            first = key[0] if isinstance(key, tuple) and key else key
            if isinstance(first, (int, np.integer)) and not isinstance(first, (bool, np.bool_)):
                i = int(first)
                if not -len(self._parts) <= i < len(self._parts):
                    raise IndexError(f"index {i} is out of bounds for axis 0 with size {len(self._parts)}")
                part = self._parts[i]
                return part[key[1:]] if isinstance(key, tuple) and len(key) > 1 else part
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self._parts = None            # the stacked array is now the only one with the grid's values


class _DistGrid:
    """The ``mgrid`` / ``ogrid`` objects (``sparse``: ``ogrid``); index them like NumPy's."""

    def __init__(self, sparse: bool):
        self.sparse = sparse

    def __repr__(self) -> str:
        return "nbmpi.workers.distarray.ogrid" if self.sparse else "nbmpi.workers.distarray.mgrid"

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            full = np.mgrid[key]                  # 1-D: NumPy's own vector (O(n), no per-rank saving to have)
            return _from_rows(full.shape, full.dtype, "block", None, lambda rows: full[rows], "mgrid")
        key = tuple(key)
        sizes, typ, steps, starts = _axes(key)
        shape = tuple(sizes)
        vecs = [_coordinates(n, typ, s, a) for n, s, a in zip(sizes, steps, starts)]
        if self.sparse:
            return self._open(shape, typ, vecs)
        parts = [lazy_grid(shape, typ, "block", None, vecs[k], k, f"mgrid[{k}]") for k in range(len(shape))]
        return GridArray(parts)

    @staticmethod
    def _open(shape: Tuple[int, ...], typ: np.dtype, vecs: List[np.ndarray]) -> tuple:
        out: List[Any] = []
        d = len(shape)
        for k, v in enumerate(vecs):
            sub = tuple(n if j == k else 1 for j, n in enumerate(shape))
            if k == 0:
                out.append(_from_rows(sub, typ, "block", None, lambda rows: v[rows].reshape((-1,) + (1,) * (d - 1)),
                                      "ogrid[0]"))
            else:
                out.append(v.reshape(sub))
        return tuple(out)


#: ``numpy.mgrid`` for distributed arrays (see the module doc).
mgrid = _DistGrid(sparse=False)
#: ``numpy.ogrid`` for distributed arrays (see the module doc).
ogrid = _DistGrid(sparse=True)
