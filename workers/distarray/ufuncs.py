"""Every NumPy ufunc on distributed arrays: NumPy's own loops on each rank's block (recorded lazily).

The fused kernels (:mod:`.elementwise`, :mod:`.fused_kernels`) compile the common ufuncs. Every
other ufunc (``sinh``, ``arcsin``, ``log1p``, ``sign``, ``isinf``, ``hypot``, ``fmax``, ``frexp``,
``divmod``, ...), and any ufunc called with ``where=``, ``dtype=``, another ``casting=`` or with
several outputs, is recorded here as one :class:`~.operations.block_ufunc.BlockUfunc`: NumPy's
ufunc applied by each rank to its own block at the next force point, so results, dtypes and errors
are NumPy's own, bit for bit.

:func:`call` records ``ufunc(*inputs, out=..., where=..., dtype=..., casting=...)``:

1. NumPy resolves the loop on zero-size stand-ins of the operands (type promotion of arrays, NumPy
   scalars and weak Python scalars; ``casting`` of inputs and outputs; NumPy's own errors);
2. the result's rows are laid out like the first distributed operand (or output) whose rows line up
   with the result's; operands that line up but are laid out otherwise, or are views, are copied
   into that layout first (recorded copies, one aggregated transfer); operands broadcast along the
   rows are gathered to every rank; NumPy operands are split (or kept whole when broadcast);
3. an ``out=`` that is a whole array in that layout is written in place; any other ``out=`` gets
   the result through a temporary (holding ``out``'s values first when ``where=`` is given).

:func:`reduce`, :func:`accumulate` and :func:`outer` are the ufunc methods that run natively
(see each). Who must call them: every rank of the operands' communicator, in the same order (SPMD),
like every recorded operation; ``reduce`` over the distributed axis is a collective step.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import elementwise, fallback
from .distribution import Distribution
from .graph import Base, Leaf
from .indexing import View
from .operations.block_ufunc import BlockUfunc
from .plans import my_rows

__all__ = ["ALL_UFUNCS", "EXACT_REDUCE", "FALLBACK", "call", "reduce", "accumulate", "outer", "method", "dispatch", "is_native", "foreign"]

#: Every ufunc NumPy has, by name (``numpy.abs`` is ``absolute``: one entry). Read from the namespace's
#: dictionary, not ``dir(np)``: ``getattr`` of every name there imports NumPy's lazy submodules (``f2py``,
#: ``testing``, ...: 0.2 s of this package's import), and no ufunc lives in them.
ALL_UFUNCS = frozenset(v.__name__ for v in vars(np).values() if isinstance(v, np.ufunc))
#: What :func:`call` returns when NumPy's fallback must do it (complex or other non-numeric dtypes,
#: NumPy arrays as ``out=``, keywords other than out/where/dtype/casting/order/subok).
FALLBACK = object()
_DISTRIBUTABLE = "biuf"
_KWARGS = {"out", "where", "dtype", "casting", "order", "subok"}


def is_native(ufunc: np.ufunc) -> bool:
    """Whether ``ufunc`` runs natively on distributed arrays (every NumPy ufunc with numeric dtypes)."""
    return ufunc.__name__ in ALL_UFUNCS


def _distarray():
    return fallback.REGISTRY["DistArray"]


def _stand_in(x: Any) -> Any:
    """A zero-size stand-in of operand ``x`` with its dtype (scalars as they are: weak Python scalars
    stay weak), for NumPy's type resolution."""
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return x
    return np.empty((0,), dtype=x.dtype)


def _resolve(ufunc: np.ufunc, inputs: Sequence[Any], outs: Sequence[Any], where: Any, dtype: Any,
             casting: str) -> Tuple[np.dtype, ...]:
    """The dtypes of ``ufunc``'s outputs for these operands (NumPy's resolution; NumPy's errors)."""
    kw: Dict[str, Any] = dict(dtype=dtype, casting=casting)
    if any(o is not None for o in outs):
        kw["out"] = tuple(None if o is None else np.empty((0,), o.dtype) for o in outs)
    if where is not None:
        kw["where"] = _stand_in(where)
    with np.errstate(all="ignore"):
        res = ufunc(*(_stand_in(x) for x in inputs), **kw)
    return tuple(r.dtype for r in (res if isinstance(res, tuple) else (res,)))


def _operand(x: Any) -> Any:
    """``x`` as a DistArray, a NumPy array (ndim >= 1) or a scalar; None if NumPy's fallback must do it."""
    if isinstance(x, _distarray()):
        return x if x.dtype.kind in _DISTRIBUTABLE else None
    if isinstance(x, (bool, int, float)) or (isinstance(x, np.generic) and x.dtype.kind in _DISTRIBUTABLE):
        return x
    a = np.asarray(x)
    if a.dtype.kind not in _DISTRIBUTABLE:
        return None
    return a[()] if a.ndim == 0 else a


def _lines_up(shape: Tuple[int, ...], s: Tuple[int, ...]) -> bool:
    """Whether an operand of shape ``s`` has the result's rows (not broadcast along axis 0)."""
    return bool(shape) and len(s) == len(shape) and s[0] == shape[0]


def _layout(ctx, shape: Tuple[int, ...], arrays: Sequence[Any]) -> Tuple[Distribution, Optional[Any]]:
    """The result's row layout and the array whose layout it is (None: replicated)."""
    DistArray = _distarray()
    for x in arrays:
        if isinstance(x, DistArray) and not x._base.replicated and _lines_up(shape, x.shape):
            v = x._view
            if v.row_kept and v.lead_new() == 0:
                return x._base.dist.with_rows(shape[0]), x
    return Distribution("replicated", shape[0] if shape else 1, ctx.size), None


def _whole(x: Any, dist: Distribution) -> bool:
    """Whether DistArray ``x`` is a whole base laid out by ``dist``."""
    return x._view.is_full and x._base.dist == dist


def _place(ctx, x: Any, shape: Tuple[int, ...], dist: Distribution, what: str) -> Any:
    """Operand ``x`` ready for a :class:`BlockUfunc` with result rows laid out by ``dist`` (recorded
    copies or gathers where needed): a Leaf or a scalar."""
    DistArray = _distarray()
    if isinstance(x, DistArray):
        if dist.replicated or not _lines_up(shape, x.shape):
            if x._base.replicated:
                return x._leaf()
            return elementwise.replicate_leaf(ctx, x._leaf(), f"gather {x.describe()} to every rank for {what} "
                                                             "(broadcast along the rows)")
        if _whole(x, dist):
            return x._leaf()
        tmp = Leaf(Base(ctx, x.shape, x.dtype, dist, temp=True), View.full(x.shape))
        elementwise.record_assign(ctx, tmp, x._leaf())
        return tmp
    if isinstance(x, np.ndarray):
        if dist.replicated or not _lines_up(shape, x.shape):
            return elementwise.rep_base_from_numpy(ctx, x)
        b = Base(ctx, x.shape, x.dtype, dist, temp=True,
                 origin=f"numpy{x.shape}{elementwise.array_fingerprint(x)}")
        b.set_local(np.ascontiguousarray(x[dist.global_rows(ctx.rank)]))
        return Leaf(b, View.full(x.shape))
    return x


def _parse(ufunc: np.ufunc, kwargs: Dict[str, Any]) -> Optional[Tuple[List[Any], Any, Any, str]]:
    """(outs, where, dtype, casting) from the keywords; None if NumPy's fallback must do the call."""
    if not set(kwargs) <= _KWARGS or kwargs.get("subok", True) is not True \
            or kwargs.get("order", "K") not in ("K", "A", "C"):
        return None
    out = kwargs.get("out")
    outs = list(out) if isinstance(out, tuple) else [out]
    outs += [None] * (ufunc.nout - len(outs))
    if len(outs) != ufunc.nout:
        raise ValueError(f"{ufunc.__name__}: the 'out' tuple must have exactly {ufunc.nout} entries: one per output")
    if any(o is not None and not isinstance(o, _distarray()) for o in outs):
        return None
    where = kwargs.get("where", True)
    if where is True:
        where = None
    elif where is not None and not isinstance(where, (bool, np.bool_)):
        where = _operand(where)
        if where is None:
            return None
    return outs, where, kwargs.get("dtype"), kwargs.get("casting", "same_kind")


def _core_ndims(ufunc: np.ufunc) -> List[int]:
    """Core dimensions of each input of a generalized ufunc, from its signature (``'(n),(n)->()'``: 1, 1)."""
    groups = re.findall(r"\(([^)]*)\)", ufunc.signature.split("->")[0])
    return [len([d for d in g.split(",") if d.strip()]) for g in groups]


def _gufunc(ufunc: np.ufunc, ops: List[Any], outs: List[Any], where: Any, dtype: Any, casting: str) -> Any:
    """A generalized ufunc (``vecdot``, ``matvec``, ``vecmat``) whose loop dimensions include the rows: each
    rank applies it to its rows; operands without the row axis (broadcast) are gathered. :data:`FALLBACK`
    when the rows are a core dimension, or for ``out=``/``where=``."""
    core = _core_ndims(ufunc)
    arrays = [x for x in ops if not np.isscalar(x)]
    if len(arrays) != len(ops) or any(o is not None for o in outs) or where is not None:
        return FALLBACK
    loop = [x.ndim - c for x, c in zip(ops, core)]
    DistArray = _distarray()
    lead = next((x for x, l in zip(ops, loop) if isinstance(x, DistArray) and l == max(loop) and l > 0
                 and not x._base.replicated and x._view.row_kept and x._view.lead_new() == 0), None)
    if lead is None:
        return FALLBACK
    n = lead.shape[0]
    dist = lead._base.dist.with_rows(n)
    rep = Distribution("replicated", 1, dist.nranks)
    ctx = lead.context
    args = []
    for x, l in zip(ops, loop):
        if l == max(loop) and x.shape[0] == n:
            args.append(_place(ctx, x, x.shape, dist, ufunc.__name__))
        elif l < max(loop) or x.shape[0] == 1:
            args.append(_place(ctx, x, x.shape, rep, ufunc.__name__))
        else:
            raise ValueError(f"{ufunc.__name__}: operands could not be broadcast together along their loop "
                             f"dimensions ({', '.join(str(np.shape(y)) for y in ops)})")
    with np.errstate(all="ignore"):
        res = ufunc(*(np.empty((0,) + x.shape[1:], x.dtype) if l == max(loop) and x.shape[0] == n
                      else np.empty(np.shape(x), x.dtype) for x, l in zip(ops, loop)), dtype=dtype, casting=casting)
    if res.dtype.kind not in _DISTRIBUTABLE:
        return FALLBACK
    shape = (n,) + res.shape[1:]
    leaf = Leaf(Base(ctx, shape, res.dtype, dist, temp=True), View.full(shape))
    ctx.record(BlockUfunc(ufunc, args, [leaf], None, None if dtype is None else np.dtype(dtype), casting))
    got = DistArray(leaf.base, leaf.view)
    ctx.maybe_flush()           # once the result is held (a force point drops a result nothing holds as dead)
    return got


def check_exponents(e: Any, base: Optional[np.dtype] = None) -> None:
    """NumPy's error for a negative integer exponent, raised on every rank before anything is recorded (NumPy's
    loop raises it only on the ranks whose blocks hold one). A distributed ``e``: a force point. With the dtype
    ``base`` of an unsigned base, a negative Python int is NumPy's OverflowError (it does not fit that dtype)."""
    if base is not None and base.kind == "u" and type(e) is int and e < 0:
        raise OverflowError(f"Python integer {e} out of bounds for {base}")
    kind = e.dtype.kind if isinstance(e, (_distarray(), np.ndarray, np.generic)) else np.asarray(e).dtype.kind
    if kind == "i" and np.size(e) and int(np.min(e)) < 0:
        raise ValueError("Integers to negative integer powers are not allowed.")


def call(ufunc: np.ufunc, inputs: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    """Record ``ufunc(*inputs, **kwargs)`` (see the module doc): the result DistArray (a tuple for
    several outputs; the ``out=`` arrays when given), or :data:`FALLBACK`. Recorded, SPMD."""
    if len(inputs) != ufunc.nin:
        raise TypeError(f"{ufunc.__name__}() takes {ufunc.nin} positional operands, got {len(inputs)}")
    parsed = _parse(ufunc, kwargs)
    ops = [_operand(x) for x in inputs]
    if parsed is None or any(o is None for o in ops):
        return FALLBACK
    outs, where, dtype, casting = parsed
    if ufunc.signature is not None:
        return _gufunc(ufunc, ops, outs, where, dtype, casting)
    dts = _resolve(ufunc, ops, outs, where, dtype, casting)
    if any(d.kind not in _DISTRIBUTABLE for d in dts):
        return FALLBACK
    if ufunc is np.power and dts[0].kind in "iu":
        check_exponents(ops[1])
    DistArray = _distarray()
    ctx = next(x.context for x in list(ops) + outs + [where] if isinstance(x, DistArray))
    shape = tuple(np.broadcast_shapes(*(np.shape(x) for x in ops + [where] if x is not None)))
    for o in outs:
        if o is not None:
            if tuple(np.broadcast_shapes(shape, o.shape)) != o.shape:
                raise ValueError(f"{ufunc.__name__}: non-broadcastable output operand with shape {o.shape} doesn't "
                                 f"match the broadcast shape {shape}")
            shape = o.shape
    dist, _ = _layout(ctx, shape, [o for o in outs if o is not None and o._view.is_full] + ops + [where])
    what = ufunc.__name__
    args = [_place(ctx, x, shape, dist, what) for x in ops]
    wleaf = None if where is None else _place(ctx, where, shape, dist, what)
    targets, copy_back = [], []
    for o, dt in zip(outs, dts):
        if o is not None and (_whole(o, dist) if not dist.replicated else o._base.replicated and o._view.is_full):
            targets.append(o._leaf())
            continue
        leaf = Leaf(Base(ctx, shape, o.dtype if o is not None else dt, dist, temp=True), View.full(shape))
        if o is not None:
            if where is not None:
                elementwise.record_assign(ctx, leaf, o._leaf())
            copy_back.append((o, leaf))
        targets.append(leaf)
    ctx.record(BlockUfunc(ufunc, args, targets, wleaf, None if dtype is None else np.dtype(dtype), casting))
    for o, leaf in copy_back:
        elementwise.record_assign(ctx, o._leaf(), leaf)
    results = []
    for o, leaf in zip(outs, targets):
        results.append(o if o is not None else DistArray(leaf.base, leaf.view))
    ctx.maybe_flush()
    return results[0] if len(results) == 1 else tuple(results)


# --------------------------------------------------------------------------- ufunc methods
#: Ufuncs whose reduction over the distributed axis is exact in any grouping and order (associative and
#: commutative without rounding): each rank reduces its rows, then the ranks' partial results are combined.
EXACT_REDUCE = frozenset({"bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor",
                          "maximum", "minimum", "fmax", "fmin", "gcd", "lcm"})
_EXACT_INTEGER = frozenset({"add", "multiply"})     # exact too on integers and bools (wrapping alike)
_NO_VALUE = getattr(np, "_NoValue", None)


def _axes(axis: Any, ndim: int) -> Tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(np.lib.array_utils.normalize_axis_tuple(axes, ndim)))


def _aligned_whole(ctx, x: Any) -> Leaf:
    """``x``'s Leaf if it is a whole base, else a recorded copy into a whole base laid out like its rows."""
    if x._view.is_full:
        return x._leaf()
    dist = x._base.dist.with_rows(x.shape[0]) if not x._base.replicated else \
        Distribution("replicated", x.shape[0], ctx.size)
    return _place(ctx, x, x.shape, dist, "a ufunc method")


def _block_method(ufunc: np.ufunc, method: str, x: Any, shape: Tuple[int, ...], dtype: Any,
                  extra: Tuple[Tuple[str, Any], ...], out: Any) -> Any:
    """Record ``ufunc.<method>(x, ...)`` along axes other than the rows: each rank its own block."""
    ctx = x.context
    src = _aligned_whole(ctx, x)
    dist = src.base.dist.with_rows(shape[0]) if shape and not src.base.replicated else \
        Distribution("replicated", shape[0] if shape else 1, ctx.size)
    dt = _method_dtype(ufunc, method, x.dtype, dtype, extra)
    if out is not None and out.shape != shape:
        raise ValueError(f"{ufunc.__name__}.{method}: output parameter has shape {out.shape}, expected {shape}")
    direct = out is not None and out._view.is_full and out._base.dist == dist
    leaf = out._leaf() if direct else Leaf(Base(ctx, shape, dt if out is None else out.dtype, dist, temp=True),
                                           View.full(shape))
    ctx.record(BlockUfunc(ufunc, [src], [leaf], None, None if dtype is None else np.dtype(dtype), "same_kind",
                          method, extra))
    if out is not None and not direct:
        elementwise.record_assign(ctx, out._leaf(), leaf)
    got = out if out is not None else _distarray()(leaf.base, leaf.view)
    ctx.maybe_flush()           # once the result is held (a force point drops a result nothing holds as dead)
    return got


def _method_dtype(ufunc: np.ufunc, method: str, dt: np.dtype, dtype: Any, extra) -> np.dtype:
    kw = {k: v for k, v in extra if k == "initial"}
    sample = np.zeros((1, 1), dtype=dt)
    with np.errstate(all="ignore"):
        return np.asarray(getattr(ufunc, method)(sample, axis=0, dtype=dtype, **kw)).dtype


def _allgather_row(ctx, row: np.ndarray, what: str) -> np.ndarray:
    """Every rank's ``row`` stacked in rank order, gathered through a recorded gather (with its timeout).
    Collective."""
    one_each = Distribution("block", ctx.size, ctx.size)
    b = Base(ctx, (ctx.size,) + row.shape, row.dtype, one_each, origin=what)
    b.set_local(np.ascontiguousarray(row[None]))
    return _distarray()(b, View.full(b.shape)).to_numpy(_reason=what)


def _reduce_rows(ufunc: np.ufunc, x: Any, axes: Tuple[int, ...], dtype: Any, keepdims: bool, initial: Any) -> Any:
    """``ufunc.reduce`` over axes including the rows: each rank reduces its rows, the ranks' partial
    results are gathered in rank order and reduced again (exact ufuncs only). Collective, a force point."""
    ctx = x.context
    kw = dict(dtype=dtype) if initial is _NO_VALUE else dict(dtype=dtype, initial=initial)
    if x._base.replicated:
        full = x.to_numpy(_reason=f"{ufunc.__name__}.reduce")
        res = ufunc.reduce(full, axis=axes, keepdims=keepdims, **kw)
    else:
        v = x._view
        if not (v.row_kept and v.lead_new() == 0):
            x = x.copy()
        loc = x.local                                           # a force point: this rank's rows
        s, t, n = x._view.row_params
        counts = [len(my_rows(x._base.dist, s, t, n, k)[0]) for k in range(ctx.size)]
        probe = ufunc.reduce(np.zeros((1,) + x.shape[1:], x.dtype), axis=axes, keepdims=True, dtype=dtype)
        part = ufunc.reduce(loc, axis=axes, keepdims=True, dtype=dtype) if len(loc) else np.zeros_like(probe)
        rows = _allgather_row(ctx, part.reshape(probe.shape[1:]), f"{ufunc.__name__}.reduce")
        rows = rows[[k for k in range(ctx.size) if counts[k] > 0]].reshape((-1,) + probe.shape[1:])
        res = ufunc.reduce(rows, axis=axes, keepdims=True, **kw)
        if not keepdims:
            res = res.reshape(tuple(d for k, d in enumerate(res.shape) if k not in axes))
    if np.ndim(res) == 0:
        return res[()] if isinstance(res, np.ndarray) else res
    leaf = elementwise.rep_base_from_numpy(ctx, res)
    return _distarray()(leaf.base, leaf.view)


def reduce(ufunc: np.ufunc, x: Any, axis: Any = 0, dtype: Any = None, out: Any = None, keepdims: bool = False,
           initial: Any = _NO_VALUE, where: Any = True) -> Any:
    """``ufunc.reduce`` of a DistArray natively: along axes other than the rows, recorded (NumPy's reduce on
    each block); over the rows for the ufuncs of :data:`EXACT_REDUCE` (and ``add``/``multiply`` on integers),
    a collective step. :data:`FALLBACK` otherwise (``where=``, other ufuncs over the rows)."""
    if not isinstance(x, _distarray()) or where is not True or ufunc.nin != 2 or ufunc.nout != 1 \
            or (out is not None and not isinstance(out, _distarray())) or x.dtype.kind not in _DISTRIBUTABLE:
        return FALLBACK
    if x.ndim == 0:
        return FALLBACK
    axes = _axes(axis, x.ndim)
    shape = tuple(1 if k in axes else d for k, d in enumerate(x.shape)) if keepdims else \
        tuple(d for k, d in enumerate(x.shape) if k not in axes)
    if 0 not in axes or x._base.replicated and out is None:
        extra = (("axis", axes), ("keepdims", bool(keepdims)))
        if initial is not _NO_VALUE:
            extra += (("initial", initial),)
        return _block_method(ufunc, "reduce", x, shape, dtype, extra, out)
    exact = ufunc.__name__ in EXACT_REDUCE or (ufunc.__name__ in _EXACT_INTEGER and x.dtype.kind in "biu"
                                               and (dtype is None or np.dtype(dtype).kind in "biu"))
    if not exact or out is not None:
        return FALLBACK
    return _reduce_rows(ufunc, x, axes, dtype, keepdims, initial)


def accumulate(ufunc: np.ufunc, x: Any, axis: int = 0, dtype: Any = None, out: Any = None,
               methods: Optional[Dict[str, Any]] = None) -> Any:
    """``ufunc.accumulate`` of a DistArray natively along an axis other than the rows (recorded, NumPy's on
    each block); over the rows ``add``/``multiply`` are ``cumsum``/``cumprod``. :data:`FALLBACK` otherwise."""
    if not isinstance(x, _distarray()) or ufunc.nin != 2 or ufunc.nout != 1 or x.ndim == 0 \
            or (out is not None and not isinstance(out, _distarray())) or x.dtype.kind not in _DISTRIBUTABLE:
        return FALLBACK
    axes = _axes(axis, x.ndim)
    if len(axes) != 1:
        raise ValueError("accumulate does not allow multiple axes")     # NumPy's (axis=None of an N-d array too)
    ax = axes[0]
    if ax != 0 or x._base.replicated:
        return _block_method(ufunc, "accumulate", x, x.shape, dtype, (("axis", ax),), out)
    f = (methods or {}).get({"add": "cumsum", "multiply": "cumprod"}.get(ufunc.__name__, ""))
    return FALLBACK if f is None else f(x, axis=0, dtype=dtype, out=out)


def outer(ufunc: np.ufunc, a: Any, b: Any, **kwargs: Any) -> Any:
    """``ufunc.outer(a, b)``: ``ufunc(a[..., None, ...], b)`` with a new axis per dimension of ``b`` (recorded,
    the result laid out like ``a``'s rows when ``a`` is distributed)."""
    if ufunc.nin != 2:
        raise ValueError(f"outer product only supported for binary functions ({ufunc.__name__} takes {ufunc.nin})")
    a2 = a if isinstance(a, _distarray()) else np.asarray(a)
    nb = np.ndim(b) if not isinstance(b, _distarray()) else b.ndim
    if a2.ndim == 0:
        return call(ufunc, (a, b), kwargs)
    return call(ufunc, (a2[(Ellipsis,) + (None,) * nb], b), kwargs)


def method(ufunc: np.ufunc, name: str, inputs: Sequence[Any], kwargs: Dict[str, Any],
           methods: Dict[str, Any]) -> Any:
    """``ufunc.<name>(*inputs, **kwargs)`` with DistArray operands: natively where :func:`reduce`,
    :func:`accumulate` (``methods``: the registered array methods, for ``cumsum``/``cumprod``) or
    :func:`outer` can, else through NumPy's fallback. SPMD."""
    kw = dict(kwargs)
    if isinstance(kw.get("out"), tuple):
        if len(kw["out"]) != 1:
            return fallback.call(getattr(ufunc, name), tuple(inputs), kwargs, f"{ufunc.__name__}.{name}")
        kw["out"] = kw["out"][0]
    res = FALLBACK
    try:
        if name == "reduce" and len(inputs) == 1:
            res = reduce(ufunc, inputs[0], **kw)
        elif name == "accumulate" and len(inputs) == 1:
            res = accumulate(ufunc, inputs[0], methods=methods, **kw)
        elif name == "outer" and len(inputs) == 2:
            res = outer(ufunc, inputs[0], inputs[1], **kwargs)
    except TypeError:       # a keyword this path lacks: NumPy's own call decides
        res = FALLBACK
    if res is FALLBACK:
        return fallback.call(getattr(ufunc, name), tuple(inputs), kwargs, f"{ufunc.__name__}.{name}")
    fallback.note_native(f"{ufunc.__name__}.{name}")
    return res


_COMPILED_DTYPES: Dict[Tuple, bool] = {}


def foreign(x: Any) -> bool:
    """Whether ``x`` (a ufunc or ``where`` operand) is neither a DistArray nor a bool, integer or float number or array: None,
    a string, an object or complex value, which NumPy handles and the distributed arrays do not hold."""
    if isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)) or hasattr(x, "_base"):
        return False
    if isinstance(x, np.ndarray):
        return x.dtype.kind not in "biuf"
    return x is None or isinstance(x, (str, bytes, complex, np.complexfloating))


def compiled_dtypes(ufunc: np.ufunc, inputs: Sequence[Any]) -> bool:
    """Whether the fused kernels can compute ``ufunc(*inputs)``: False when an operand or the result (NumPy's
    resolution, e.g. ``sin`` of bools) is float16, which numba lacks; such calls run NumPy's loops per block.
    Local; cached per ufunc and operand types."""
    specs = tuple(x.dtype if isinstance(x, (np.ndarray, np.generic)) or hasattr(x, "_base") else type(x)
                  for x in inputs)
    key = (ufunc.__name__, specs)
    ok = _COMPILED_DTYPES.get(key)
    if ok is None:
        try:
            dts = ufunc.resolve_dtypes(tuple(s if isinstance(s, np.dtype) else s if s in (int, float) else
                                             np.dtype(s) for s in specs) + (None,) * ufunc.nout)
            ok = all(np.dtype(d) != np.float16 for d in dts) and np.dtype(np.float16) not in specs
        except Exception:  # noqa: BLE001 - no loop: the fused path reports it as before
            ok = True
        _COMPILED_DTYPES[key] = ok
    return ok


def numpy_power(ufunc: np.ufunc, inputs: Sequence[Any]) -> bool:
    """Whether ``ufunc(*inputs)`` is a floating ``power`` that runs NumPy's loop on each block rather than
    in a fused kernel: every floating power but ``a ** 2``, ``a ** 0.5`` (fused as ``square`` and ``sqrt``,
    NumPy's own fast paths) and ``a ** 3`` .. ``a ** 8`` (fused as products,
    :data:`~.elementwise.PRODUCT_POWERS`). The kernels would call libm's ``pow`` (NumPy casts the
    exponent to float), several times slower than NumPy's SIMD ``pow`` (4x on AVX-512) and not NumPy's
    last bits; NumPy's loop is NumPy's result by definition. Local, no communication."""
    if ufunc is not np.power or len(inputs) != 2:
        return False
    kinds = [x.dtype.kind if hasattr(x, "_base") else np.dtype(type(x)).kind if isinstance(x, (int, float, bool))
             else np.asarray(x).dtype.kind for x in inputs]
    if "f" not in kinds:
        return False
    e = inputs[1]
    if hasattr(e, "_base") or np.ndim(e) != 0:
        return True
    return not (e == 2 or e == 0.5 or (kinds[0] == "f" and e in elementwise.PRODUCT_POWERS))


#: ``ufunc.reduce`` of these runs as the named reduction (:mod:`.numpy_reductions`).
REDUCE_AS = {"add": "sum", "multiply": "prod", "minimum": "min", "maximum": "max", "logical_or": "any",
             "logical_and": "all"}


def dispatch(ufunc: np.ufunc, method: str, inputs: Sequence[Any], kwargs: Dict[str, Any],
             methods: Dict[str, Any]) -> Any:
    """``DistArray.__array_ufunc__``: the fused kernels for the ufuncs they compile (plain calls, one output),
    :func:`call` for every other call, the reductions of :mod:`.numpy_reductions` for ``add.reduce`` & co
    (``methods``: the array methods registered by the modules, ``sum``, ``cumsum``, ...), :func:`method` for
    the other ufunc methods; NumPy's fallback for what none of them does. SPMD."""
    from . import numpy_math

    DistArray = _distarray()
    name = ufunc.__name__
    out = kwargs.get("out")
    if (method == "reduce" and name in REDUCE_AS and len(inputs) == 1
            and isinstance(inputs[0], DistArray) and kwargs.get("initial") is None
            and (kwargs.get("dtype") is None or REDUCE_AS[name] not in ("any", "all"))):
        kw = {k: v for k, v in kwargs.items() if k != "initial"}
        kw.setdefault("axis", 0)
        if isinstance(kw.get("out"), tuple):
            kw["out"] = kw["out"][0]
        x = inputs[0]
        if REDUCE_AS[name] in ("min", "max", "any", "all") and "dtype" in kw:   # (the functions take no dtype)
            dt = kw.pop("dtype")
            if dt is not None:           # NumPy's loop in that dtype: the input cast to it
                x = x.astype(dt)
        return methods[REDUCE_AS[name]](x, **kw)
    if method != "__call__":
        return globals()["method"](ufunc, method, inputs, kwargs, methods)
    if isinstance(out, tuple) and len(out) == 1:
        out = out[0]
    if any(foreign(x) for x in inputs):      # np.equal(a, None), np.add(a, "x"): NumPy's result or error
        return fallback.call(ufunc, inputs, kwargs, name)
    extra = {k: v for k, v in kwargs.items() if k != "out" and v is not None}
    if (name not in elementwise.SUPPORTED or numpy_math.applies(name, inputs) or ufunc.nout != 1
            or not compiled_dtypes(ufunc, inputs) or numpy_power(ufunc, inputs)
            or out is not None and not isinstance(out, DistArray)
            or extra and not (set(extra) <= {"casting"} and extra.get("casting") == "same_kind")):
        res = call(ufunc, inputs, kwargs)      # NumPy's ufunc on each block (recorded)
        if res is FALLBACK:
            return fallback.call(ufunc, inputs, kwargs, name)
        fallback.note_native(name)
        return res
    fallback.note_native(name)
    ctx = next(x.context for x in list(inputs) + [out] if isinstance(x, DistArray))
    args = [x._leaf() if isinstance(x, DistArray) else x for x in inputs]
    res = elementwise.record_ufunc(ctx, ufunc, args, out=None if out is None else out._leaf())
    got = out if out is not None else DistArray(res.base, res.view)
    ctx.maybe_flush()           # once the result is held (a force point drops a result nothing holds as dead)
    return got
