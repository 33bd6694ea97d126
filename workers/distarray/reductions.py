"""Reductions (``sum``, ``prod``, ``min``, ``max``, ``mean``, ``any``, ``all``) over all axes, axis 0 or a trailing axis.

Recording: :func:`record_reduce` records one :class:`~.graph.Reduce` task whose input is an
elementwise expression; at the force point it is fused with the tasks producing its input
(``sum(abs(center - work))`` is one loop over ``center`` and ``work``, even in the same loop
that computes ``work``). Each rank reduces the rows it owns block by block into per-block
slots; the slots are combined in block order, and the ranks' partial results are combined
after one non-blocking allgather, in rank order, identically on every rank (results are
bit-identical across ranks and do not depend on message arrival order).

* ``axis=None``: a 0-d replicated result (``float()`` of it is a force point);
* ``axis=0`` (the distributed axis) of a 2-D array: a replicated 1-D result;
* a trailing axis: a distributed result aligned with the input's rows, no communication.

Result dtypes follow NumPy (``sum`` of int32 is int64, ``mean`` of ints is float64); ``min``
and ``max`` propagate NaN like NumPy. Over an empty reduced axis (or ``axis=None`` of an empty array)
``min``/``max`` raise NumPy's ValueError, the others give NumPy's value over no element (their identity,
NaN for ``mean``); an empty result over a non-empty reduced axis (``zeros((0, 3)).max(axis=1)``) is an
empty array, as NumPy's.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from .distribution import Distribution
from .errors import UnsupportedOperation
from .graph import Base, Leaf, Node, Reduce, RowSpace, node_desc
from .indexing import View

__all__ = ["OPS", "record_reduce", "combine_partials", "identity_array", "result_dtype"]

OPS = ("sum", "prod", "min", "max", "mean", "any", "all")
_NP = dict(sum=np.add, prod=np.multiply, mean=np.add, min=np.minimum, max=np.maximum, any=np.logical_or, all=np.logical_and)


def result_dtype(op: str, dt: np.dtype) -> Tuple[np.dtype, np.dtype]:
    """``(accumulator dtype, result dtype)`` of reduction ``op`` over dtype ``dt`` (NumPy's)."""
    dt = np.dtype(dt)
    one = np.ones(1, dtype=dt)
    if op in ("sum", "prod"):
        r = (np.sum(one) if op == "sum" else np.prod(one)).dtype
        return r, r
    if op == "mean":   # NumPy adds floats in their own precision (float16 in float32), the rest in float64
        r = np.mean(one).dtype
        if dt.kind == "f":
            return (np.dtype(np.float32) if dt.itemsize < 4 else dt), r
        return np.dtype(np.float64), r
    if op in ("min", "max"):
        return dt, dt
    return np.dtype(np.bool_), np.dtype(np.bool_)


def identity_array(op: str, acc: np.dtype, shape: Tuple[int, ...]) -> np.ndarray:
    """An array of ``shape`` filled with the identity of ``op`` in dtype ``acc``."""
    acc = np.dtype(acc)
    if op in ("sum", "mean", "any"):
        return np.zeros(shape, dtype=acc)
    if op in ("all", "prod"):
        return np.ones(shape, dtype=acc)
    if acc.kind == "b":
        return np.full(shape, op == "min", dtype=acc)
    if acc.kind == "f":
        return np.full(shape, np.inf if op == "min" else -np.inf, dtype=acc)
    info = np.iinfo(acc)
    return np.full(shape, info.max if op == "min" else info.min, dtype=acc)


def combine_partials(op: str, parts: np.ndarray, acc: np.dtype) -> np.ndarray:
    """Combine partial results stacked along axis 0 (block order or rank order) with ``op``."""
    f = _NP[op]
    if op in ("sum", "mean", "prod"):
        return f.reduce(parts, axis=0, dtype=acc)
    return f.reduce(parts, axis=0)


def record_reduce(context, leaf: Node, op: str, axis: Optional[int], desc_name: Optional[str] = None) -> Leaf:
    """Record ``op(leaf, axis)`` and return the Leaf of the (lazy) result.

    ``leaf`` is a Leaf of a DistArray (its producing expression is fused at the force point).
    ``axis``: None or an int (negative counts from the end).
    """
    from .elementwise import replicate_leaf

    if op not in OPS:
        raise UnsupportedOperation(f"reduction {op!r} is not supported; supported: {', '.join(OPS)}")
    name = desc_name or op
    shape = tuple(leaf.shape)
    nd = len(shape)
    if axis is not None:
        if isinstance(axis, (tuple, list)):
            if len(axis) == 1:
                axis = axis[0]
            else:
                raise UnsupportedOperation(f"{name}: a tuple of axes is not supported; reduce one axis at a time "
                                           "or all of them (axis=None)")
        ax = int(axis)
        if not -nd <= ax < nd:
            raise np.exceptions.AxisError(ax, nd)
        ax %= nd
        if nd == 1:
            ax = None
    else:
        ax = None
    size = math.prod(shape)
    count = size if ax is None else shape[ax]
    if op in ("min", "max") and count == 0:   # NumPy: only an empty reduced axis (not an empty result) raises
        raise ValueError(f"zero-size array to reduction operation {'minimum' if op == 'min' else 'maximum'} "
                         "which has no identity")
    acc, rdt = result_dtype(op, leaf.dtype)
    # the row space: the input's rows (gathered first if its rows are not a leading axis)
    if not leaf.rep:
        v = leaf.view
        if not (v.row_kept and v.lead_new() == 0):
            leaf = replicate_leaf(context, leaf, f"gather {node_desc(leaf)} to every rank for {name}")
    space = RowSpace.of_leaf(leaf, shape)
    internal = None if ax is None else (ax if space.kept else ax + 1)
    if internal == 0 and len(space.shape) == 1:
        internal = None
    oshape = () if ax is None else tuple(s for k, s in enumerate(shape) if k != ax)
    if space.rep or internal is None or internal == 0:
        ob = Base(context, oshape, rdt, Distribution("replicated", oshape[0] if oshape else 1, context.size),
                  temp=True)
        out = Leaf(ob, View.full(oshape))
    else:  # a trailing axis: the result is distributed like the input's rows
        b = leaf.base
        s, t, c = leaf.view.row_params
        nb = b.shape[0]
        ob = Base(context, (nb,) + oshape[1:], rdt, b.dist, temp=True)
        out = Leaf(ob, View(ob.shape, (("s", s, t, c),) + tuple(("s", 0, 1, n) for n in oshape[1:])))
    desc = f"{ob.name()} = {name}({node_desc(leaf)}" + ("" if ax is None else f", axis={ax}") + ")"
    context.record(Reduce(leaf, op, internal, out, space, count, acc, desc))
    return out
