"""Matrix products and transposition of distributed arrays: ``a @ b``, ``dot``, ``a.T``.

* ``A @ x`` / ``A @ B`` with ``A`` 2-D distributed by rows: the result's rows are ``A``'s
  rows (aligned with ``A``), so each rank multiplies its own rows. ``x``/``B`` may be
  distributed any way (or a NumPy array): each owner sends its rows of ``x`` once to every
  rank; the product with the local rows of ``x`` is computed while the others fly, then one
  accumulation per received part (BLAS through NumPy's ``@``). This is DistNumPy's Jacobi
  (matrix-vector) communication pattern.
* ``dot(a, b)`` of two 1-D arrays is ``sum(a * b)`` (one fused reduction) in NumPy's result dtype (``any(a & b)``
  for booleans).
* ``v @ B`` (1-D @ 2-D, float and int64) with ``B``'s rows distributed: one :class:`~.graph.VecMat` task
  (``v`` sent where ``B``'s rows are, each rank's rows of ``B`` times their entries of ``v`` through NumPy's
  ``@`` (BLAS gemv), the ranks' partial products summed in rank order: on ``v``'s owner when ``v`` is one fixed
  row of a distributed base (the result lives there, no collective), else on every rank). With ``B``
  replicated or its rows not first: ``sum(v[:, None] * B, axis=0)`` (one fused reduction).
* ``A.T`` of a 2-D array distributed by rows: a new array distributed by rows in the same
  kind of distribution; each rank sends every other rank one message with the block it
  needs, transposed, and transposes its own block while they fly.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .elementwise import as_node, dist_of, record_cast, record_ufunc, replicate_leaf
from .errors import DistributionError, ShapeError, UnsupportedOperation
from .graph import Base, Leaf, Matmul, Transpose, VecMat, node_desc
from .indexing import View
from .reductions import record_reduce

__all__ = ["record_matmul", "record_transpose"]


def _as_leaf(context, x: Any) -> Leaf:
    if type(x) is Leaf:
        return x
    n = as_node(context, x)
    if not isinstance(n, Leaf):
        raise ShapeError("matmul: scalar operands are not allowed, use '*' instead")
    return n


#: ``numpy.result_type`` of two dtypes, by the pair (a product's result dtype; a program has a few pairs)
_RESULT_TYPES: dict = {}


def _result_type(x: np.dtype, y: np.dtype) -> np.dtype:
    """``numpy.result_type(x, y)`` of two dtypes, memoised."""
    got = _RESULT_TYPES.get((x, y))
    if got is None:
        got = _RESULT_TYPES[(x, y)] = np.result_type(x, y)
    return got


def record_matmul(context, a: Any, b: Any) -> Leaf:
    """Record ``a @ b``; return the result's Leaf (see the module doc for what is supported)."""
    a, b = _as_leaf(context, a), _as_leaf(context, b)
    if a.base.context is not context or b.base.context is not context:
        raise DistributionError("matmul: the operands live on different communicators")
    # a view that drops axes of a higher-dimensional base (``b[:, 2]`` of a 3-D ``b``) is copied into an array of
    # its own shape first: the products below read 1-D and 2-D bases
    a, b = [_own_base(context, x) for x in (a, b)]
    na, nb = len(a.shape), len(b.shape)
    if na == 0 or nb == 0:
        raise ShapeError("matmul: Input operand does not have enough dimensions (scalars: use '*')")
    if na == 1 and nb == 1:
        if a.shape[0] != b.shape[0]:
            raise ShapeError(f"matmul: Input operand 1 has a mismatch in its core dimension 0 (size {b.shape[0]} "
                             f"is different from {a.shape[0]})")
        dt = _result_type(a.dtype, b.dtype)
        if dt.kind == "b":       # NumPy's boolean dot: any(a and b)
            return record_reduce(context, record_ufunc(context, np.logical_and, [a, b]), "any", None, desc_name="dot")
        res = record_reduce(context, record_ufunc(context, np.multiply, [a, b]), "sum", None, desc_name="dot")
        # NumPy's dot keeps the operands' dtype (int16 wraps in int16): the sum (int64 for small integers) cast
        # back wraps the same way (sums agree modulo 2**bits)
        return res if res.dtype == dt else record_cast(context, res, dt)
    if na == 1 and nb == 2:
        return _record_vecmat(context, a, b)
    if na != 2 or nb > 2:
        raise UnsupportedOperation(
            f"matmul of a {na}-D and a {nb}-D array is not supported; supported: 2-D @ 1-D, 2-D @ 2-D, 1-D @ 2-D and "
            "1-D @ 1-D")
    if a.shape[1] != b.shape[0]:
        raise ShapeError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
                         f"(n?,k),(k,m?)->(n?,m?) (size {b.shape[0]} is different from {a.shape[1]})")
    dt = _result_type(a.dtype, b.dtype)
    if dt.kind not in "biuf":
        raise UnsupportedOperation(f"matmul: dtype {dt} is not supported")
    if not a.rep and not (a.view.row_kept and a.view.lead_new() == 0):
        a = replicate_leaf(context, a, f"gather {node_desc(a)} to every rank for matmul")
    if a.rep and not b.rep:
        b = replicate_leaf(context, b, f"gather {node_desc(b)} to every rank for matmul with a replicated matrix")
    if not b.rep and not (b.view.row_kept and b.view.lead_new() == 0):
        b = replicate_leaf(context, b, f"gather {node_desc(b)} to every rank for matmul")
    oshape = (a.shape[0],) + tuple(b.shape[1:])
    ab = a.base
    s, t, c = a.view.row_params
    # the result's rows are a's rows: same base rows, same distribution (replicated if a is)
    ob = Base(context, (ab.shape[0],) + oshape[1:], dt, ab.dist, temp=True)
    out = Leaf(ob, View._of(ob.shape, (("s", s, t, c),) + tuple([("s", 0, 1, n) for n in ob.shape[1:]])))
    context.record(Matmul(a, b, out))
    return out


def _own_base(context, x: Leaf) -> Leaf:
    """``x``, or for a view dropping axes of a 3-D or larger base, or adding new axes (``a[None]``, ``a[:, None]``),
    its copy on a base of its own shape: rows of the distributed axis kept (``b[:, 2]``), a recorded copy laid out
    by those rows. Raises UnsupportedOperation
    (on every rank alike: the caller runs NumPy's matmul through the fallback) for a view with the distributed axis
    indexed (``b[3]``)."""
    new_axes = any(e[0] == "n" for e in x.view.entries)     # a[None], a[:, None]: copied as well
    if not new_axes and (len(x.base.shape) <= 2 or len(x.base.shape) == len(x.shape)):  # 1-D, 2-D: as they are
        return x
    if x.view.row_kept or new_axes:
        y = record_cast(context, x, x.dtype)
        if len(y.base.shape) == len(y.shape) and not any(e[0] == "n" for e in y.view.entries):
            return y
    raise UnsupportedOperation(f"matmul of {node_desc(x)}, a view with the distributed axis of a "
                               f"{len(x.base.shape)}-D array indexed")


def _record_vecmat(context, a: Leaf, b: Leaf) -> Leaf:
    """``v @ B`` (1-D @ 2-D): with ``B``'s rows distributed (kept, first) one VecMat task
    (:func:`_record_blas_vecmat`); otherwise (``B`` replicated, or a fixed row of a 3-D base) as
    ``sum(v[:, None] * B, axis=0)``, one elementwise product and one reduction fused at the force point. Float
    and int64 only (a sum keeps their dtype); others raise UnsupportedOperation (the caller falls back to
    NumPy)."""
    if a.shape[0] != b.shape[0]:
        raise ShapeError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
                         f"(n?,k),(k,m?)->(n?,m?) (size {b.shape[0]} is different from {a.shape[0]})")
    dt = _result_type(a.dtype, b.dtype)
    if dt.kind != "f" and dt != np.int64:
        raise UnsupportedOperation(f"matmul of a 1-D and a 2-D array of dtype {dt} is not supported natively")
    if not b.rep and b.view.row_kept and b.view.lead_new() == 0:
        return _record_blas_vecmat(context, a, b, dt)
    col = Leaf(a.base, a.view.index((slice(None), None)))
    prod = record_ufunc(context, np.multiply, [col, b])
    return record_reduce(context, prod, "sum", 0, desc_name="matmul")


def _record_blas_vecmat(context, a: Leaf, b: Leaf, dt: np.dtype) -> Leaf:
    """``v @ B`` with ``B``'s rows distributed (kept, first) as one :class:`~.graph.VecMat` task: ``v`` is
    replicated, or one fixed row of a distributed base (its owner sends each rank the entries it needs, within
    the task), or else gathered to every rank first (:func:`~.elementwise.replicate_leaf`); each rank multiplies
    its rows of ``B`` by their entries of ``v`` (NumPy's ``@``, BLAS for floats) and the ranks' partial products
    are summed in rank order. The result is 1-D: with ``v`` one fixed row, on ``v``'s owner alone
    (:func:`_owner_result`), else replicated; for a 2-D ``B`` the view of ``B``'s columns in a base as wide as
    ``B``'s (see :func:`~.operations.elementwise.local_key`). Local: records, computes nothing."""
    if not a.rep and (a.view.row_entry is None or a.view.row_kept):
        a = replicate_leaf(context, a, lambda a=a: f"gather {node_desc(a)} to every rank for a vector-matrix product")
    col = b.view.after_row()[0]
    if len(b.base.shape) == 2 and col[0] == "s":
        # the result is the columns of B's view in a base as wide as B's: the same base shape for every
        # window of a loop (``L[k, :k] @ U[:k, k:]``), so the groups reading it share one plan
        w, ent = b.base.shape[1], col
    else:
        w = b.shape[1]
        ent = ("s", 0, 1, w)
    if a.rep:
        ob = Base(context, (w,), dt, dist_of("replicated", w, context.size), temp=True)
        out = Leaf(ob, View._of(ob.shape, (ent,)))
    else:           # on v's owner alone: no allgather
        out = _owner_result(context, a, w, ent, dt)
    context.record(VecMat(a, b, out))
    return out


#: Bytes of ``v``'s base rows times the result's width up to which the result of ``v @ B`` (``v`` a fixed row of a
#: distributed base) is that row of a base laid out like ``v``'s (uninitialized, pooled: only the row is
#: touched), so that storing it into the same row of an array of that layout (``u[k, k:] = a[k, k:] - v @ B``)
#: is one aligned local group whose plan is rebound step to step; above it, a row of a base of one row per rank.
OWNER_ROW_BYTES = 1 << 26


def _owner_result(context, v: Leaf, w: int, ent: tuple, dt: np.dtype) -> Leaf:
    """The result of ``v @ B`` (``v`` one fixed row ``r`` of a distributed base) on ``v``'s owner alone: row
    ``r`` of a base laid out like ``v``'s (:data:`OWNER_ROW_BYTES`), else the owner's row of a base of one row
    per rank (cyclic); ``w`` columns, seen through ``ent`` (a slice entry). Local."""
    r = v.view.row_entry[1]
    d = v.base.dist
    nb = v.base.shape[0]
    if nb * w * dt.itemsize <= OWNER_ROW_BYTES:
        ob = Base(context, (nb, w), dt, d, temp=True)
        return Leaf(ob, View._of(ob.shape, (("i", r), ent)))
    nr = context.size
    ob = Base(context, (nr, w), dt, dist_of("cyclic", nr, nr), temp=True)
    return Leaf(ob, View._of(ob.shape, (("i", d.owner_of(r)), ent)))


def record_transpose(context, a: Leaf) -> Leaf:
    """Record ``a.T`` for a 2-D ``a`` distributed by rows (1-D: ``a`` itself)."""
    if len(a.shape) < 2:
        return a
    if len(a.shape) > 2:
        raise UnsupportedOperation("transpose of arrays with more than 2 dimensions is not supported")
    if a.rep:
        raise UnsupportedOperation("transpose of a replicated array is not supported; use "
                                   "numpy.transpose(x.to_numpy())")
    v = a.view
    if not (v.row_kept and v.lead_new() == 0):
        raise UnsupportedOperation("transpose of a view that does not keep the distributed axis first is not "
                                   "supported")
    n, m = a.shape
    ob = Base(context, (m, n), a.dtype, a.base.dist.with_rows(m), temp=True)
    out = Leaf(ob, View.full((m, n)))
    context.record(Transpose(a, out))
    return out
