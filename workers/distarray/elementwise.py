"""Recording of elementwise operations: ufuncs, ``where``, casts and assignments ``v[...] = expr``.

Each call checks shapes (NumPy broadcasting) and dtypes (NumPy's own type resolution,
``ufunc.resolve_dtypes``, so results have exactly NumPy's dtypes, weak Python scalars
included), decides where the result lives and records one :class:`~.graph.Assign`. Nothing
is computed or communicated here.

Where a result lives: aligned with its first distributed operand whose distributed axis is
the result's axis 0 (the result's base has that operand's base's rows and distribution, and
the same row view), so ``0.2 * (center + north + ...)`` is computed where ``center`` is, when the result covers
at least half of that base's rows or is small (:data:`ALIGNED_TEMP_BYTES`); a larger result over fewer rows gets
a base of its own rows spread over every rank.
Operands whose rows do not line up with the result's rows (a row broadcast along axis 0,
``x[None, :]``, a single row ``a[3]``) are gathered to every rank first
(:class:`~.graph.Replicate`) and then read like NumPy operands. A result none of whose distributed operands
keeps a distributed axis (every one a single row ``a[3, 2:]``) lives on the owner of the first one's row (a
base of one row per rank): that rank computes it, no row is gathered, and storing it into a row of that rank
(``u[3, 2:] = a[3, 2:] - v``) is one local group (the temporary is inlined). NumPy arrays are copied at
the call (NumPy semantics: later changes to them do not matter).

An assignment whose value reads the target's base through a different, overlapping view
(``a[1:] = a[:-1]``) is recorded in two steps through a temporary, as NumPy does.

What one recorded operation costs is kept small: NumPy's type resolution is done once per (ufunc, operand
dtypes), the leaves of an expression are listed once, the row space the value is read in is the recorded
:class:`~.graph.Assign`'s own, distributions of results are shared objects (:func:`dist_of`), and the texts of
operations and gathers (for messages) are made only when asked for.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .distribution import Distribution
from .errors import DistributionError, ShapeError, UnsupportedOperation, ufunc_cast_error
from .fused_kernels import SUPPORTED_UFUNCS
from .graph import Assign, Base, Const, Leaf, Node, Op, Replicate, RowSpace, array_fingerprint, leaves, node_desc
from .indexing import View

__all__ = ["SUPPORTED", "record_ufunc", "record_where", "record_cast", "record_assign", "as_node", "replicate_leaf",
           "aligned", "result_leaf", "rep_base_from_numpy"]

SUPPORTED = frozenset(SUPPORTED_UFUNCS)
#: NumPy's type resolution per (ufunc, operand dtypes or weak Python types), computed once.
_RESOLVED: dict = {}
#: Distributions of results by ``(kind, nrows, nranks, block)`` (immutable objects, equal keys place every row
#: alike), so recording a result does not build a new one (a block distribution computes its offsets with NumPy).
_DISTS: Dict[Tuple[str, int, int, int], Distribution] = {}
_DISTS_MAX = 4096
#: A text, or a callable giving it, made only when a message or a description asks for it.
Text = Union[str, Callable[[], str]]


def _text(t: Text) -> str:
    """The string of ``t`` (a str, or a callable returning it)."""
    return t() if callable(t) else t


def dist_of(kind: str, nrows: int, nranks: int, block: int = 1) -> Distribution:
    """The (shared, immutable) :class:`~.distribution.Distribution` ``Distribution(kind, nrows, nranks, block)``,
    built once per key (see :data:`_DISTS`). Local."""
    key = (kind, nrows, nranks, block)
    d = _DISTS.get(key)
    if d is None:
        if len(_DISTS) >= _DISTS_MAX:
            _DISTS.clear()
        d = _DISTS[key] = Distribution(kind, nrows, nranks, block)
    return d


def rows_of(dist: Distribution, nrows: int) -> Distribution:
    """``dist.with_rows(nrows)`` (the same kind and block size over ``nrows`` rows), shared. Local."""
    return dist if dist.nrows == nrows else dist_of(dist.kind, nrows, dist.nranks, dist.block)


def _replicate_task(src: Leaf, out: Leaf, root: Optional[int], why: Text) -> Replicate:
    """A :class:`~.graph.Replicate` whose text (``why``, or a callable giving it) is made only when asked for."""
    if not callable(why):
        return Replicate(src, out, root, why)
    t = Replicate(src, out, root)
    t._init_text(lambda: why() or f"gather {node_desc(src)}" + ("" if root is None else f" to rank {root}"))
    return t


def rep_base_from_numpy(context, arr: np.ndarray) -> Leaf:
    """A replicated base holding a copy of ``arr`` (every rank passes its own, equal, array)."""
    a = np.array(arr, copy=True, order="C")
    if a.dtype.kind not in "biuf":
        raise UnsupportedOperation(f"NumPy operands of dtype {a.dtype} are not supported; use bool, integer or "
                                   "floating-point arrays")
    b = Base(context, a.shape, a.dtype, Distribution("replicated", a.shape[0] if a.shape else 1, context.size),
             temp=True, origin=f"numpy{a.shape}{array_fingerprint(a)}")
    b.set_local(a)
    return Leaf(b, View.full(a.shape))


def as_node(context, x: Any) -> Node:
    """``x`` (a Leaf, a NumPy array or scalar, a Python scalar) as an expression node."""
    if isinstance(x, (Leaf, Op, Const)):
        return x
    if isinstance(x, (bool, int, float, np.generic)):
        if isinstance(x, (complex, np.complexfloating)):
            raise UnsupportedOperation("complex numbers are not supported by distributed arrays")
        return Const(x)
    if isinstance(x, complex):
        raise UnsupportedOperation("complex numbers are not supported by distributed arrays")
    a = np.asarray(x)
    if a.ndim == 0:
        if a.dtype.kind not in "biuf":
            raise UnsupportedOperation(f"scalar of dtype {a.dtype} is not supported")
        return Const(a[()])
    return rep_base_from_numpy(context, a)


def aligned(leaf: Leaf, space: RowSpace) -> bool:
    """True if ``leaf`` (distributed) can be read row by row in ``space`` (same row count, row axis
    first); False means it must be gathered first."""
    v = leaf.view
    if space.rep:
        return False
    if not space.kept:
        return not v.row_kept
    return (v.row_kept and v.lead_new() == 0 and len(v.shape) == space.user_ndim
            and v.shape[0] == space.count)


#: Bytes of one row of a base up to which gathering part of a single row (``a[3, 2:]``, ``a[3, 2]``) to every rank
#: gathers the whole row: later reads of the same row recorded before it changes reuse that copy.
WHOLE_ROW_BYTES = 1 << 16
#: Bytes up to which a result over few of its leading operand's rows (``a[k+1:, k] / p``) still gets a base of all
#: that operand's rows, in its distribution (a few unused rows): computed where its operand lies, no message, and
#: its plan is shared with the next steps' over a moving window (``local_key`` in :mod:`.operations.elementwise`).
#: Larger results over fewer than half the rows get a base of their own rows, spread over every rank.
ALIGNED_TEMP_BYTES = 1 << 16
#: How many of the latest recorded operations are searched for a pending gather of a whole row.
ROW_LOOKBACK = 16


def replicate_leaf(context, leaf: Leaf, why: Text, root: Optional[int] = None) -> Leaf:
    """Record the gathering of ``leaf`` (a view of a distributed base) to every rank (or ``root``);
    return a Leaf of the replicated copy with the same user shape. A view of one fixed row (``a[3, 2:]``,
    ``a[3, 2]``) to every rank gathers the row whole when it is small (:data:`WHOLE_ROW_BYTES`) and reuses a
    pending gather of that row (see :func:`_fixed_row`). ``why``: the text of the gather for messages, or a
    callable giving it (made only when a message asks for it). Local: records, computes nothing."""
    v = leaf.view
    if root is None and v.row_entry is not None and not v.row_kept:
        got = _fixed_row(context, leaf, why)
        if got is not None:
            return got
    s, t, c = v.row_params
    packed = (c,) + v.packed_trail_shape()
    rb = Base(context, packed, leaf.dtype, dist_of("replicated", packed[0], context.size), temp=True)
    context.record(_replicate_task(leaf, Leaf(rb, View.full(packed)), root, why))
    ents = []
    for k, e in enumerate(v.entries):
        if e[0] == "n":
            ents.append(("n",))
        elif k == v._row:
            ents.append(("s", 0, 1, c) if e[0] == "s" else ("i", 0))
        elif e[0] == "s":
            ents.append(("s", 0, 1, e[3]))
    return Leaf(rb, View(packed, tuple(ents)))


def _fixed_row(context, leaf: Leaf, why: Text) -> Optional[Leaf]:
    """``leaf`` (a view of the single base row ``r``) read from a replicated copy of the whole row ``r``: the
    copy gathered by a :class:`~.graph.Replicate` among the last :data:`ROW_LOOKBACK` pending operations when
    nothing recorded after it writes the base or the copy (so it holds what a new gather would), else a new
    gather of the whole row. None when the row is larger than :data:`WHOLE_ROW_BYTES`. Every rank records the
    same operations, so every rank takes the same decision. Local."""
    b, v = leaf.base, leaf.view
    trail = b.shape[1:]
    if math.prod(trail) * b.dtype.itemsize > WHOLE_ROW_BYTES:
        return None
    whole = View._of(b.shape, (("i", v.row_entry[1]),) + tuple([("s", 0, 1, n) for n in trail]))
    rb = _pending_row(context, b, whole)
    if rb is None:
        packed = (1,) + trail
        rb = Base(context, packed, b.dtype, dist_of("replicated", 1, context.size), temp=True)
        src = Leaf(b, whole)
        context.record(_replicate_task(src, Leaf(rb, View._of(packed, tuple([("s", 0, 1, n) for n in packed]))),
                                       None, lambda: f"{_text(why)} (gathers its whole row {node_desc(src)}, "
                                                     "reused by later reads of that row)"))
    row = v.lead_new()
    return Leaf(rb, View._of(rb.shape, tuple([("i", 0) if k == row else e for k, e in enumerate(v.entries)])))


def _pending_row(context, b: Base, whole: View) -> Optional[Base]:
    """The replicated base of a pending gather of ``b[whole]`` to every rank that no later pending operation
    writes, nor ``b``; None if there is none among the last :data:`ROW_LOOKBACK` operations. Local."""
    pend = context.pending
    written = set()
    for j in range(len(pend) - 1, max(-1, len(pend) - 1 - ROW_LOOKBACK), -1):
        t = pend[j]
        if type(t) is Assign:          # writes() is [t.out]: read directly (no list per task)
            wb = t.out.base
            if wb is b:
                return None
            written.add(id(wb))
            continue
        if isinstance(t, Replicate) and t.root is None and t.src.base is b and t.src.view == whole:
            return None if id(t.out.base) in written else t.out.base
        for w in t.writes():
            if w.base is b:
                return None
            written.add(id(w.base))
    return None


def result_leaf(context, nodes: Sequence[Node], shape: Tuple[int, ...], dtype: np.dtype) -> Leaf:
    """Where a new elementwise result of ``shape`` lives (see the module doc); allocates nothing."""
    return _result_of(context, [l for n in nodes for l in leaves(n) if not l.rep], shape, dtype)


def _result_of(context, dist_leaves: Sequence[Leaf], shape: Tuple[int, ...], dtype: np.dtype) -> Leaf:
    """:func:`result_leaf` from the distributed leaves of the operands (in operand order)."""
    shape = tuple(shape)
    lead = None
    for l in dist_leaves:
        v = l.view
        if shape and v.row_kept and v.lead_new() == 0 and len(v.shape) == len(shape) and v.shape[0] == shape[0]:
            lead = l
            break
    if lead is not None:
        b = lead.base
        s, t, c = lead.view.row_params
        nb = b.shape[0]
        lv = lead.view
        if (lv.ndim == len(b.shape) and all(e[0] == "s" for e in lv.entries) and 2 * lv.size >= math.prod(b.shape)
                and lv.shape == shape):
            # laid out exactly like the leading operand's base (a copy back into it can swap buffers)
            base = Base(context, b.shape, dtype, b.dist, temp=True)
            return Leaf(base, View._of(base.shape, lv.entries))
        if 2 * c >= nb or nb * math.prod(shape[1:]) * np.dtype(dtype).itemsize <= ALIGNED_TEMP_BYTES:
            base = Base(context, (nb,) + shape[1:], dtype, b.dist, temp=True)
            ents = (("s", s, t, c),) + tuple([("s", 0, 1, n) for n in shape[1:]])
            return Leaf(base, View._of(base.shape, ents))
        base = Base(context, shape, dtype, rows_of(b.dist, shape[0]), temp=True)
        return Leaf(base, View.full(shape))
    if dist_leaves and shape and any(l.view.row_kept for l in dist_leaves):
        d0 = dist_leaves[0].base.dist
        base = Base(context, shape, dtype, rows_of(d0, shape[0]) if not d0.replicated else d0, temp=True)
        return Leaf(base, View.full(shape))
    if dist_leaves and shape:
        owner = _row_owner(dist_leaves[0])
        if owner >= 0:
            return _owner_row_leaf(context, owner, shape, dtype)
    base = Base(context, shape, dtype, dist_of("replicated", shape[0] if shape else 1, context.size), temp=True)
    return Leaf(base, View.full(shape))


def _row_owner(leaf: Leaf) -> int:
    """The rank owning the one base row that ``leaf`` (a view of a distributed base not keeping its row axis,
    ``a[3, 2:]``) shows; -1 if ``leaf`` shows no fixed row. Local."""
    e = leaf.view.row_entry
    if e is None or e[0] != "i" or leaf.base.replicated:
        return -1
    return leaf.base.dist.owner_of(e[1])


def _owner_row_leaf(context, owner: int, shape: Tuple[int, ...], dtype: np.dtype) -> Leaf:
    """A new result of ``shape`` held by rank ``owner`` alone: row ``owner`` of a base of one row per rank
    (cyclic), seen without its row axis. Where a result over fixed rows only (``a[k, k:] - v``) lives: computed
    by the owner of its first row operand (no gather of that row), and stored into a row of that rank
    (``u[k, k:] = a[k, k:] - v``) without a message (the two are fused into one local group). Local."""
    nr = context.size
    base = Base(context, (nr,) + tuple(shape), dtype, dist_of("cyclic", nr, nr), temp=True)
    return Leaf(base, View._of(base.shape, (("i", owner),) + tuple([("s", 0, 1, n) for n in shape])))


def _check_contexts(context, nodes: Sequence[Node], what: str) -> None:
    _check_leaf_contexts(context, [l for n in nodes for l in leaves(n)], what)


def _check_leaf_contexts(context, ls: Sequence[Leaf], what: str) -> None:
    for l in ls:
        if l.base.context is not context:
            raise DistributionError(
                f"{what}: the operands live on different communicators ({l.base.name()} is on another "
                "communicator than the first distributed operand); create every array of one computation "
                "with the same comm=")


def _broadcast(name: str, shapes: List[Tuple[int, ...]]) -> Tuple[int, ...]:
    first = shapes[0]
    for s in shapes:           # equal shapes (the usual case) broadcast to themselves
        if s != first:
            break
    else:
        return tuple(first)
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{name}: operands could not be broadcast together with shapes "
                         f"{' '.join(str(tuple(s)) for s in shapes)} (NumPy's broadcasting rules: per axis from "
                         "the right, sizes must be equal or 1)") from None


def _gather_why(l: Leaf, what: Text, tail: str = "") -> Callable[[], str]:
    """The (lazy) text of gathering ``l`` to every rank for ``what``."""
    return lambda: f"gather {node_desc(l)} to every rank for {_text(what)}{tail}"


def _align_operands(context, nodes: List[Node], space: RowSpace, what: Text) -> List[Node]:
    out = []
    for n in nodes:
        if isinstance(n, Leaf) and not n.rep and not aligned(n, space):
            n = replicate_leaf(context, n, _gather_why(n, what, " (its rows do not line up with the result's rows)"))
        elif isinstance(n, Op):
            n = _realign(context, n, space, what)
        out.append(n)
    return out


def _realign(context, node: Op, space: RowSpace, what: Text) -> Node:
    from .graph import substitute

    return substitute(node, lambda l: None if (l.rep or aligned(l, space)) else
                      replicate_leaf(context, l, _gather_why(l, what)))


def _needs_gather(ls: Sequence[Leaf], space: RowSpace) -> bool:
    """Whether a leaf of ``ls`` (the leaves of an expression) must be gathered to be read in ``space``."""
    for l in ls:
        if not l.base.replicated and not aligned(l, space):
            return True
    return False


def _gathered(context, expr: Node, space: RowSpace, what: Text) -> Node:
    """``expr`` with the leaves that ``space`` cannot read row by row gathered first (recorded)."""
    if isinstance(expr, Op):
        return _realign(context, expr, space, what)
    return _align_operands(context, [expr], space, what)[0]


def _record(context, target: Leaf, expr: Node, desc, ls: Optional[List[Leaf]] = None) -> Leaf:
    """Record ``target = expr``, through a temporary if ``expr`` reads the target's base elsewhere.
    ``desc``: a callable giving the text of the operation (computed only for messages); ``ls``: the leaves of
    ``expr`` if the caller has them."""
    if target.view.row_kept and target.view.lead_new():     # b[None] = v: written as b[...] = v[0]
        target, expr = _without_lead_new(target, expr)
        ls = None
    if ls is None:
        ls = list(leaves(expr))
    tb, tv = target.base, target.view
    for l in ls:
        if l.base is tb and l.view != tv:
            tmp = _result_of(context, [x for x in ls if not x.base.replicated], expr.shape, expr.dtype)
            task = Assign(tmp, expr, lambda: desc() + " (into a temporary: the value overlaps the target)")
            if _needs_gather(ls, task.space):
                task.expr = _gathered(context, expr, task.space, desc)
            context.record(task)
            expr = tmp
            ls = [tmp]
            break
    task = Assign(target, expr, desc)   # its row space is the one the value is read in
    if _needs_gather(ls, task.space):
        task.expr = _gathered(context, expr, task.space, desc)
    context.record(task)
    return target


def _without_lead_new(target: Leaf, expr: Node) -> Tuple[Leaf, Node]:
    """``(target', expr')`` writing what ``target = expr`` writes, for a ``target`` whose view has new axes before
    its distributed axis (``b[None]``, ``expand_dims(b, 0)``: the kernels take the distributed axis first): those
    axes (of length 1) dropped from the target, and as many leading axes (of length 1) from the value."""
    k = target.view.lead_new()
    tgt = Leaf(target.base, target.view.index((0,) * k))
    return tgt, _drop_leading(expr, len(expr.shape) - len(tgt.shape))


def _drop_leading(node: Node, j: int) -> Node:
    """``node`` without its ``j`` leading axes, all of length 1 (none when ``j <= 0``): each operand loses those of
    its leading axes that broadcast into them."""
    if j <= 0 or type(node) is Const:
        return node
    if isinstance(node, Leaf):
        return Leaf(node.base, node.view.index((0,) * j))
    nd = len(node.shape) - j
    args = tuple([_drop_leading(a, len(a.shape) - nd) for a in node.args])
    return Op.of(node.name, args, node.dtype, node.in_dtypes, node.shape[j:])


#: Integer exponents of a float array that the fused kernels compute as products (``a ** 3`` is
#: ``a * a * a``, left to right) instead of calling libm's ``pow`` (several times slower). A product can
#: differ from NumPy's ``pow`` in the last bits (one rounding per multiplication); with NumPy math on
#: (:mod:`.numpy_math`) ``power`` is NumPy's own on each block.
PRODUCT_POWERS = (3, 4, 5, 6, 7, 8)


def _record_product_power(context, node: Node, e: int) -> Leaf:
    """Record ``x ** e`` into a new array (``node``: ``x``, a float array; ``e`` in :data:`PRODUCT_POWERS`)."""
    dt = node.dtype
    expr: Node = node
    for _ in range(e - 1):
        expr = Op("multiply", (expr, node), dt, (dt, dt), node.shape)
    target = result_leaf(context, [node], node.shape, dt)
    return _record(context, target, expr, lambda: f"{target.base.name()} = power({node_desc(node)}, {e})")


def _resolve(ufunc: np.ufunc, name: str, specs: Tuple[Any, ...]) -> Tuple[Tuple[np.dtype, ...], np.dtype]:
    """``(input dtypes, result dtype)`` of ``ufunc`` for operand ``specs`` (dtypes, or Python types for weak
    scalars): NumPy's own resolution, computed once per key and checked (result kinds bool, integer, float)."""
    got = _RESOLVED.get((name, specs))
    if got is None:
        try:
            dts = ufunc.resolve_dtypes(specs + (None,))
        except TypeError:       # NumPy's own exception (a UFuncTypeError: no loop for these dtypes)
            raise
        except Exception as e:  # noqa: BLE001 - NumPy's own message
            raise TypeError(f"{name}: no implementation for operand dtypes "
                            f"{', '.join(str(getattr(s, '__name__', s)) for s in specs)} ({e})") from None
        in_dt, out_dt = tuple(np.dtype(d) for d in dts[:-1]), np.dtype(dts[-1])
        if out_dt.kind not in "biuf":
            raise UnsupportedOperation(f"{name}: result dtype {dts[-1]} is not supported")
        got = _RESOLVED[(name, specs)] = (in_dt, out_dt)
    return got


#: The comparison ufuncs: NumPy 2 compares a Python int with an integer array by value, also when the int lies
#: outside the array's dtype (``uint8_array == 256`` is all False, ``int8_array < 200`` all True).
COMPARISONS = frozenset({"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"})
#: ``(min, max)`` of each integer dtype (Python ints), computed once per dtype.
_INT_BOUNDS: Dict[np.dtype, Tuple[int, int]] = {}
#: The Python ints a kernel takes as a scalar argument as they are (numba types them int64).
_ARG_MIN, _ARG_MAX = -2**63, 2**63 - 1


def _outside(n: Node, dt: np.dtype) -> bool:
    """Whether ``n`` is a Python int (a weak :class:`~.graph.Const`) outside the range of the integer dtype ``dt``
    it is converted to (300 for int8: the kernels would wrap it to 44; NumPy does not). Local."""
    if type(n) is not Const or not n.weak or dt.kind not in "iu" or not isinstance(n.value, int):
        return False
    got = _INT_BOUNDS.get(dt)
    if got is None:
        info = np.iinfo(dt)
        got = _INT_BOUNDS[dt] = (int(info.min), int(info.max))
    return not got[0] <= n.value <= got[1]


def _misfit(n: Node, dt: np.dtype) -> bool:
    """Whether ``n`` is a Python int the kernels cannot take as it is when NumPy converts it to ``dt``: one
    :func:`_outside` ``dt``, or one outside int64 (a kernel's scalar argument: ``uint64_array == 2**64 - 1``,
    ``a / 2**64``). A range check or two, at record time. Local."""
    if type(n) is not Const or not n.weak or not isinstance(n.value, int):
        return False
    return not _ARG_MIN <= n.value <= _ARG_MAX or _outside(n, dt)


def _as_scalar(value: Any, dt: np.dtype) -> np.generic:
    """``value`` (a Python scalar) converted to ``dt`` the way NumPy stores a Python scalar into an array of
    ``dt`` (its errors and warnings: ``OverflowError`` for an int outside an integer dtype, ``inf`` and NumPy's
    overflow warning for an int beyond a float dtype). Local."""
    a = np.empty((), dt)
    a[()] = value
    return a[()]


def _python_int_expr(ufunc: np.ufunc, nodes: Sequence[Node], in_dt: Tuple[np.dtype, ...], out_dt: np.dtype,
                     shape: Tuple[int, ...]) -> Op:
    """``ufunc(*nodes)`` when a Python int operand is a :func:`_misfit`, as NumPy 2 computes it:

    * NumPy's own error at the call, found by calling ``ufunc`` on one-element stand-ins of the operands (the
      Python ints as they are): ``uint8_array + (-1)`` raises ``OverflowError: Python integer -1 out of bounds
      for uint8``, ``int64_array + 2**63`` ``OverflowError: Python int too large to convert to C long``;
    * a comparison with an int outside the integer dtype compares by value, so its result is the same for every
      element (``uint8_array == 256`` all False, ``uint8_array > -1`` all True): an expression of that constant,
      which reads no operand;
    * else (an int beyond int64 that fits the loop's dtype: ``a / 2**64``, ``uint64_array + 2**63``) the int
      converted to the loop's dtype here.

    Local, on every rank alike (SPMD)."""
    probe = [n.value if type(n) is Const else np.zeros((1,), n.dtype) for n in nodes]
    with np.errstate(all="ignore"):
        got = ufunc(*probe)           # raises NumPy's own error, if NumPy raises one
    if ufunc.__name__ in COMPARISONS and any(_outside(n, dt) for n, dt in zip(nodes, in_dt)):
        c = Const(np.asarray(got, dtype=out_dt).reshape(-1)[0])
        return Op("cast", (c,), out_dt, (c.dtype,), shape)
    args = tuple(Const(_as_scalar(n.value, dt)) if _misfit(n, dt) else n for n, dt in zip(nodes, in_dt))
    return Op.of(ufunc.__name__, args, out_dt, in_dt, shape)


def record_ufunc(context, ufunc: np.ufunc, inputs: Sequence[Any], out: Optional[Leaf] = None) -> Leaf:
    """Record ``ufunc(*inputs[, out=out])``; return the result (``out`` if given)."""
    name = ufunc.__name__
    if name not in SUPPORTED:
        raise UnsupportedOperation(
            f"ufunc {name!r} is not supported on distributed arrays; supported: {', '.join(sorted(SUPPORTED))} "
            "and where()")
    if ufunc.nin != len(inputs):
        raise TypeError(f"{name}() takes {ufunc.nin} operands, got {len(inputs)}")
    nodes = [x if isinstance(x, Leaf) else as_node(context, x) for x in inputs]
    ls = [l for n in nodes for l in (leaves(n) if isinstance(n, Op) else (n,) if isinstance(n, Leaf) else ())]
    _check_leaf_contexts(context, ls, name)
    if name == "power" and isinstance(nodes[1], Const) and not isinstance(nodes[0], Const) \
            and nodes[0].dtype.kind == "f" and nodes[1].dtype.kind in "iuf" \
            and (nodes[1].weak or np.result_type(nodes[0].dtype, nodes[1].dtype) == nodes[0].dtype):
        # NumPy's own fast paths for float arrays (the same results as NumPy, and no pow() call):
        # a ** 2 is square(a), a ** 0.5 is sqrt(a)
        e = nodes[1].value
        if e == 2:
            return record_ufunc(context, np.square, [inputs[0]], out)
        if e == 0.5:
            return record_ufunc(context, np.sqrt, [inputs[0]], out)
        if e in PRODUCT_POWERS and out is None and nodes[1].weak:
            return _record_product_power(context, nodes[0], int(e))
    in_dt, out_dt = _resolve(ufunc, name, tuple([n.spec if type(n) is Const else n.dtype for n in nodes]))
    if out is not None and not np.can_cast(out_dt, out.dtype, casting="same_kind"):
        raise ufunc_cast_error(name, out_dt, out.dtype)     # NumPy checks the cast before the shapes
    shape = _broadcast(name, [n.shape for n in nodes])
    expr = Op.of(name, tuple(nodes), out_dt, in_dt, shape)     # _resolve and _broadcast give the stored types
    reads = ls             # the leaves the recorded value reads (the operands' leaves place the result)
    for n, dt in zip(nodes, in_dt):
        if type(n) is Const and _misfit(n, dt):        # a range check per Python int operand, nothing per element
            expr = _python_int_expr(ufunc, nodes, in_dt, out_dt, shape)
            reads = list(leaves(expr))
            break

    def desc() -> str:
        return f"{name}(" + ", ".join(node_desc(n) for n in nodes) + ")"

    if out is not None:
        _check_contexts(context, [out], name)
        if _broadcast(name, [shape, out.shape]) != out.shape:
            raise ShapeError(f"{name}: non-broadcastable output operand with shape {out.shape} doesn't match the "
                             f"broadcast shape {shape}")
        return _record(context, out, expr, lambda: f"{node_desc(out)} = {desc()}", reads)
    target = _result_of(context, [l for l in ls if not l.base.replicated], shape, out_dt)
    return _record(context, target, expr, lambda: f"{target.base.name()} = {desc()}", reads)


def _where_operand(n: Node, dt: np.dtype) -> Node:
    """Operand ``n`` of ``where(cond, x, y)`` with result dtype ``dt``, as the kernels take it. NumPy casts a
    Python int to ``dt`` unsafely (``where(c, uint8_array, 300)`` holds 44, as the kernels compute it too); one
    outside int64 (which no kernel argument holds as it is) is converted here by NumPy's ``where`` itself: 2**63
    is -2**63 as int64, a float for a float ``dt``, NumPy's ``OverflowError`` beyond 64 bits for an integer one.
    Local."""
    if type(n) is not Const or not n.weak or not isinstance(n.value, int) or _ARG_MIN <= n.value <= _ARG_MAX:
        return n
    return Const(np.where(True, n.value, np.zeros((), dt))[()])


def record_where(context, cond: Any, x: Any, y: Any) -> Leaf:
    """Record ``where(cond, x, y)`` into a new array."""
    nodes = [as_node(context, v) for v in (cond, x, y)]
    _check_contexts(context, nodes, "where")
    shape = _broadcast("where", [n.shape for n in nodes])
    vals = [n.value if (isinstance(n, Const) and n.weak) else np.empty((), n.dtype) for n in nodes[1:]]
    dt = np.result_type(*vals)
    if dt.kind not in "biuf":
        raise UnsupportedOperation(f"where: result dtype {dt} is not supported")
    nodes[1:] = [_where_operand(n, dt) for n in nodes[1:]]
    expr = Op("where", tuple(nodes), dt, (np.dtype(np.bool_), dt, dt), shape)
    target = result_leaf(context, nodes, shape, dt)
    return _record(context, target, expr, lambda: f"{target.base.name()} = where(" +
                   ", ".join(node_desc(n) for n in nodes) + ")")


def record_cast(context, x: Leaf, dtype: Any) -> Leaf:
    """Record ``x.astype(dtype)`` (also ``x.copy()`` with the same dtype) into a new array."""
    dt = np.dtype(dtype)
    if dt.kind not in "biuf":
        raise UnsupportedOperation(f"astype: dtype {dt} is not supported")
    expr = Op("cast", (x,), dt, (x.dtype,), x.shape)
    target = result_leaf(context, [x], x.shape, dt)
    return _record(context, target, expr, lambda: f"{target.base.name()} = {node_desc(x)}.astype({dt})")


def record_assign(context, target: Leaf, value: Any) -> Leaf:
    """Record ``target[...] = value`` (value: a Leaf, NumPy data or scalar; cast like NumPy's setitem)."""
    node = as_node(context, value)
    _check_contexts(context, [node, target], "assignment")
    if node.shape != target.shape:
        try:
            ok = tuple(np.broadcast_shapes(node.shape, target.shape)) == target.shape
        except ValueError:
            ok = False
        if not ok:
            raise ShapeError(f"could not broadcast input array from shape {node.shape} into shape {target.shape} "
                             f"(assignment to {node_desc(target)})")
    if isinstance(node, Const):
        dt = target.dtype
        if _misfit(node, dt):       # NumPy's setitem: an error for 300 into int8, 10**40 into float32 is inf
            node = Const(_as_scalar(node.value, dt))
        node = Op("cast", (node,), dt, (np.dtype(type(node.value)) if node.weak else node.dtype,), ())
    elif node.dtype != target.dtype:
        node = Op("cast", (node,), target.dtype, (node.dtype,), node.shape)
    return _record(context, target, node, lambda: f"{node_desc(target)} = {node_desc(node)}")
