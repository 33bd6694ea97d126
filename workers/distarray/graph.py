"""The lazy graph: base arrays, elementwise expression nodes and the recorded tasks.

Nothing here computes. Recording an operation on distributed arrays appends a task to the
context's pending list (:meth:`ArrayContext.record`); a force point hands the list to the
scheduler. Tasks refer to :class:`Base` objects and :class:`~.indexing.View` objects, never
to the user's DistArray objects, so a temporary array the user no longer holds can be
recognized at the force point (``Base.nviews == 0``) and fused away instead of stored.

* :class:`Base`: a whole distributed (or replicated) array: shape, dtype, distribution and,
  once needed, this rank's local buffer;
* expression nodes: :class:`Leaf` (a view of a base), :class:`Const` (a Python or NumPy
  scalar), :class:`Op` (a ufunc, ``where`` or a cast applied to nodes);
* tasks: :class:`Assign` (``out[view] = expr``), :class:`Reduce`, :class:`Matmul`, :class:`VecMat`,
  :class:`Transpose`, :class:`Replicate` (gather a view to every rank), :class:`Swap`
  (made by fusion from a copy out of a dying temporary), :class:`Redistribute` (made by fusion
  from a copy between different row layouts), :class:`IndexedCopy` (``b[idx] = a`` and
  ``a[idx]`` with an index array).

Each task has ``sig``, a canonical form of what was recorded (nested tuples of numbers: bases
by serial number, distributions, views, dtypes, scalar values), hashed at the force point to
detect ranks that diverge, and ``desc``, the human-readable form used in error messages;
both are computed only when needed.
"""
from __future__ import annotations

import math
import struct
import weakref
import zlib
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import lazy_joins, pool_memory
from .distribution import Distribution
from .indexing import View

__all__ = ["Base", "Leaf", "Const", "Op", "Node", "RowSpace", "Task", "Assign", "Reduce", "Matmul", "VecMat",
           "Transpose", "Replicate", "Swap", "Redistribute", "IndexedCopy", "leaves", "substitute", "node_sig",
           "node_desc"]


class Base:
    """A whole array: global ``shape``, ``dtype``, ``dist`` over axis 0, and this rank's local buffer.

    ``local`` is allocated on first use (:meth:`ensure`); a temporary that is fused away is
    never allocated. ``nviews`` counts the user's DistArray objects on this base (a base with
    ``nviews == 0`` at a force point is dead for the user). ``exported`` is set once the
    user got a NumPy view of the local buffer (``.local``): such a base is never swapped.
    ``pooled`` is True while ``local`` is a buffer :meth:`ensure` made (fresh or from the pool), the only
    kind :meth:`release` gives back during a force point (a buffer installed by :meth:`set_local` may be
    the caller's memory). ``owner``: the base whose local buffer this one views, read-only, until either is
    written (:meth:`share`); ``aliases``: weak references to the bases viewing this one's buffer. ``grid``: for a
    lazy coordinate grid (:mod:`.lazy_grids`), the small base of coordinates whose broadcast is its value (no
    local buffer until :meth:`ensure` fills one from it); None for any other base. ``join``: for a lazy
    ``concatenate`` result (:mod:`.lazy_joins`), its parts ``(lo, hi, DistArray)``; None for any other base.
    """

    __slots__ = ("context", "serial", "shape", "dtype", "dist", "local", "flat", "nviews", "exported",
                 "temp", "origin", "origin_code", "pooled", "replicated", "_sig_head", "owner", "aliases",
                 "grid", "join", "fill", "copy_of", "read_only", "source", "copies", "__weakref__")

    def __init__(self, context, shape: Tuple[int, ...], dtype: np.dtype, dist: Distribution, temp: bool = False,
                 origin: str = ""):
        self.context = context
        self.serial = context.next_serial()
        self.shape = tuple([int(s) for s in shape])
        self.dtype = np.dtype(dtype)
        if self.dtype.char == "e":        # float16: the context checks what it records from now on
            context.float16_seen = True
        self.dist = dist
        #: every rank holds every row (``dist.replicated``; a base's distribution never changes)
        self.replicated: bool = dist.replicated
        self.local: Optional[np.ndarray] = None
        self.flat: Optional[np.ndarray] = None
        self.nviews = 0
        self.exported = False
        self.pooled = False
        self.temp = temp
        self.owner: Optional["Base"] = None
        self.aliases: Optional[List[Any]] = None
        self.grid: Optional["Base"] = None
        self.join: Optional[List[Any]] = None
        #: ``zeros``/``ones``: the value the buffer is set to when :meth:`ensure` takes it (None: nothing)
        self.fill: Any = None
        #: what NumPy would return as a view of another array where this base is a copy (``a.T``, ``reshape``):
        #: writes into it warn (:class:`~.errors.CopyNotViewWarning`); "" for any other base
        self.copy_of = ""
        #: for such a copy, a weak reference to the base it was made from (None: unknown); ``copies``: weak
        #: references to the copies made from this base (None: none), whose values a later write here leaves stale
        self.source: Optional[Any] = None
        self.copies: Optional[List[Any]] = None
        #: NumPy's result is read-only (``diagonal``, ``broadcast_to``): a write raises ValueError, as NumPy's does
        self.read_only = False
        self.origin = origin
        self.origin_code = zlib.crc32(origin.encode()) if origin else 0
        self._sig_head: Optional[Tuple[int, ...]] = None

    @property
    def sig_head(self) -> Tuple[int, ...]:
        """The start of the signature of a Leaf of this base (see node_sig; nothing in it ever changes), made on
        first use (at a force point: a temporary allocates one object less while it is recorded)."""
        h = self._sig_head
        if h is None:
            d = self.dist
            h = self._sig_head = (0, self.serial, _KIND_CODE[d.kind], d.nrows, d.block, self.dtype.num,
                                  self.origin_code)
        return h

    def local_shape(self) -> Tuple[int, ...]:
        """Shape of this rank's local buffer."""
        if self.replicated or not self.shape:
            return self.shape
        return (self.dist.local_count(self.context.rank),) + self.shape[1:]

    def ensure(self) -> np.ndarray:
        """This rank's local buffer, allocated (uninitialized) on first use; a buffer of the same
        shape and dtype left by a base that died is reused (no fresh pages to fault in); a base made by ``zeros`` or
        ``ones`` (``fill`` set) is filled then. A lazy grid
        (``grid`` set) is materialised: its new buffer is filled with its coordinates, and it becomes an
        ordinary base. A lazy join (``join`` set) is materialised and evaluated at once: a force point,
        collective (only collective calls reach it; a task using it materialised it when it was recorded)."""
        if self.join is not None:
            ctx = self.context
            if ctx.in_flush:
                raise RuntimeError(f"{self.name()}: a lazy concatenate result was reached during an evaluation "
                                   "without being materialised first; this is a bug of nbmpi's lazy joins")
            lazy_joins.materialise(self)
            ctx.flush("a concatenate result's buffer")
        if self.local is None:
            shape = self.local_shape()
            arr = self.context.buffers.take(shape, self.dtype)
            if arr is None:
                nbytes = math.prod(shape) * self.dtype.itemsize
                if nbytes >= self.context.buffers.min_bytes:
                    arr = pool_memory.fresh(shape, self.dtype)
                    self.context.buffers.allocated += 1
                else:
                    arr = np.empty(shape, dtype=self.dtype)
            self.set_local(arr, pooled=True)
            if self.fill is not None:
                arr.fill(self.fill)
                self.fill = None
            if self.grid is not None:
                coords, self.grid = self.grid, None
                self.context.lazy_grids -= 1
                np.copyto(arr, coords.local)
        return self.local

    def release(self) -> bool:
        """Give the local buffer back to the context's pool now, if :meth:`ensure` made it, it is large
        enough to be pooled and the user cannot see this base (``nviews == 0``, not ``exported``); then
        ``local`` and ``flat`` are None (a later use allocates afresh instead of reading a buffer another
        base may own). Local, not blocking. Only the scheduler calls it, once no unit of the running
        force point reads or writes this base any more and no send from its memory is in flight.
        Returns True if the buffer was given back."""
        arr = self.local
        if arr is None or not self.pooled or self.nviews or self.exported:
            return False
        pool = self.context.buffers
        if arr.nbytes < pool.min_bytes:
            return False
        self.local = self.flat = None
        self.pooled = False
        pool.give(arr)
        pool.released += 1
        return True

    def __del__(self) -> None:
        try:
            if self.grid is not None:
                self.context.lazy_grids -= 1
            if self.join is not None:
                lazy_joins.forget_dead(self)
            if self.owner is not None:
                self.owner._drop_alias(self)
            elif self.local is not None and not self.exported:
                self.context.buffers.give(self.local)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def share(self, owner: "Base") -> None:
        """Make this new base (never allocated, same dtype and local size as ``owner``) view ``owner``'s local
        buffer instead of copying it: copy on write. While shared, both bases count as exported (never
        released, pooled or swapped by fusion) and ``owner`` stays alive; :meth:`unshare` (called by
        ``ArrayContext.record`` for a recorded write to either, and by ``DistArray.local``) gives this base
        its own copy first. Local. The caller must have evaluated ``owner`` (no pending write to it) and
        checked that ``owner`` is neither exported nor shared itself."""
        src = owner.ensure()
        self.set_local(src.reshape(self.local_shape()))
        self.exported = True
        self.owner = owner
        if owner.aliases is None:
            owner.aliases = []
        owner.aliases.append(weakref.ref(self))
        owner.exported = True
        self.context.shared += 1

    def unshare(self) -> None:
        """End every sharing this base is part of (:meth:`share`): each base viewing another's buffer gets a
        copy of it of its own (from the pool when a dead base left one). Local, not blocking; only between
        force points (no unit may be reading the buffers). A lazy join (``join`` set, or listed among the
        aliases of a base) is materialised: its copies are recorded, before the write that asked for it."""
        if self.join is not None:
            lazy_joins.materialise(self)
        if self.owner is not None:
            view = self.local
            owner = self.owner
            self.local = self.flat = None
            self.exported = False
            np.copyto(self.ensure(), view)
            owner._drop_alias(self)
        if self.aliases:
            for ref in list(self.aliases):
                alias = ref()
                if alias is not None:
                    alias.unshare()

    def _drop_alias(self, alias: "Base") -> None:
        """``alias`` no longer views this base's buffer (it died or got its own copy)."""
        alias.owner = None
        self.aliases = [r for r in (self.aliases or ()) if r() is not None and r() is not alias]
        self.context.shared -= 1
        if not self.aliases:
            self.aliases = None
            self.exported = False

    def set_local(self, arr: np.ndarray, pooled: bool = False) -> None:
        """Install ``arr`` (C-contiguous, local shape, dtype) as the local buffer; ``pooled``: it was made by
        :meth:`ensure` (see the class doc), False for any other memory."""
        self.local = arr
        self.flat = arr.reshape(-1)
        self.pooled = pooled

    def name(self) -> str:
        return f"array#{self.serial}"


# --------------------------------------------------------------------------- expression nodes
class Leaf:
    """A read (or the target) of a base through a view."""

    __slots__ = ("base", "view", "shape", "dtype")

    def __init__(self, base: Base, view: View):
        self.base, self.view = base, view
        self.shape = view.shape
        self.dtype = base.dtype

    @property
    def key(self) -> Tuple[int, Any]:
        return (self.base.serial, self.view.key)

    @property
    def rep(self) -> bool:
        return self.base.replicated


class Const:
    """A scalar operand: a Python scalar (weakly typed, as in NumPy 2) or a NumPy scalar."""

    __slots__ = ("value", "dtype", "weak", "shape")

    def __init__(self, value: Any):
        if isinstance(value, bool):       # NumPy types a Python bool as np.bool_ (it is not weak)
            value = np.bool_(value)
        if isinstance(value, np.generic):
            self.value, self.dtype, self.weak = value, value.dtype, False
        else:
            self.value, self.weak = value, True
            self.dtype = np.dtype(np.int64 if isinstance(value, int) else np.float64)
        self.shape = ()

    @property
    def spec(self) -> Any:
        """What ``ufunc.resolve_dtypes`` takes for this operand (a Python type when weak)."""
        return type(self.value) if self.weak else self.dtype


class Op:
    """``name(*args)``: ``name`` is a ufunc name, ``'where'`` or ``'cast'``; ``in_dtypes`` are the
    dtypes the arguments are cast to before the operation, ``dtype`` the result's; ``depth`` the longest chain of
    Ops from this one to a Leaf or Const (1 when every argument is one)."""

    __slots__ = ("name", "args", "dtype", "in_dtypes", "shape", "_leaves", "depth")

    def __init__(self, name: str, args: Tuple["Node", ...], dtype: np.dtype, in_dtypes: Tuple[np.dtype, ...],
                 shape: Tuple[int, ...]):
        self.name, self.args, self.dtype, self.in_dtypes, self.shape = name, tuple(args), np.dtype(dtype), \
            tuple(np.dtype(d) for d in in_dtypes), tuple(shape)
        self._leaves: Optional[Tuple[Leaf, ...]] = None   # leaves(self), made on first use (an Op never changes)
        self.depth = _depth_over(self.args)

    @classmethod
    def of(cls, name: str, args: Tuple["Node", ...], dtype: np.dtype, in_dtypes: Tuple[np.dtype, ...],
           shape: Tuple[int, ...]) -> "Op":
        """``Op(name, args, dtype, in_dtypes, shape)`` for arguments already of the stored types (a tuple of nodes,
        a ``numpy.dtype``, a tuple of them, a tuple of ints): no conversions. Internal (the recording's hot path)."""
        op = cls.__new__(cls)
        op.name, op.args, op.dtype, op.in_dtypes, op.shape, op._leaves = name, args, dtype, in_dtypes, shape, None
        op.depth = _depth_over(args)
        return op

    def with_args(self, args: Tuple["Node", ...]) -> "Op":
        """The same operation on other ``args`` (a tuple of nodes of the same shapes and dtypes); no checks."""
        op = Op.__new__(Op)
        op.name, op.args, op.dtype, op.in_dtypes, op.shape, op._leaves = \
            self.name, args, self.dtype, self.in_dtypes, self.shape, None
        op.depth = _depth_over(args)
        return op


def _depth_over(args: Tuple["Node", ...]) -> int:
    """The depth of an Op over ``args``: one more than its deepest argument's (a Leaf or Const counts 0)."""
    d = 0
    for a in args:
        if type(a) is Op and a.depth > d:
            d = a.depth
    return d + 1


def depth(node: "Node") -> int:
    """The depth of an expression: 0 for a Leaf or Const, else :attr:`Op.depth`."""
    return node.depth if type(node) is Op else 0


Node = Any  # Leaf | Const | Op


def leaves(node: Node) -> Tuple[Leaf, ...]:
    """Every Leaf of ``node`` (depth first, left to right, repeats included), as a tuple. An Op keeps its
    tuple (nodes are immutable), so asking again, or for a node containing it, does not walk it again."""
    t = type(node)
    if t is Leaf:
        return (node,)
    if t is not Op:
        return ()
    got = node._leaves
    if got is None:
        got = node._leaves = _collect_leaves(node)
    return got


def _collect_leaves(node: "Op") -> Tuple[Leaf, ...]:
    """The leaves of ``node`` (iterative: an inlined chain may be deeper than the recursion limit), reusing
    the tuples its sub-Ops already have."""
    out: List[Leaf] = []
    stack: List[Node] = list(reversed(node.args))
    while stack:
        n = stack.pop()
        t = type(n)
        if t is Leaf:
            out.append(n)
        elif t is Op:
            got = n._leaves
            if got is not None:
                out.extend(got)
            else:
                stack.extend(reversed(n.args))
    return tuple(out)


def substitute(node: Node, fn) -> Node:
    """``node`` with every Leaf ``l`` replaced by ``fn(l)`` (``fn`` returns a node or None to keep it).
    Shared sub-nodes stay shared."""
    memo: Dict[int, Node] = {}

    def go(n: Node) -> Node:
        got = memo.get(id(n))
        if got is not None:
            return got
        if isinstance(n, Leaf):
            r = fn(n)
            out = n if r is None else r
        elif isinstance(n, Op):
            args = tuple([go(a) for a in n.args])
            out = n if all(a is b for a, b in zip(args, n.args)) else n.with_args(args)
        else:
            out = n
        memo[id(n)] = out
        return out

    try:
        return go(node)
    finally:   # go refers to itself through its closure: break that cycle, or the nodes it saw (and
        go = None  # their buffers) would live until the garbage collector runs


_KIND_CODE = {"block": 1, "cyclic": 2, "block-cyclic": 3, "replicated": 4}
_ENTRY_CODE = {"s": 0, "i": 1, "n": 2}
_NAME_CODES: Dict[str, int] = {}


def _name_code(name: str) -> int:
    """A stable integer for an operation name (the same on every rank: derived from the text)."""
    c = _NAME_CODES.get(name)
    if c is None:
        c = _NAME_CODES[name] = zlib.crc32(name.encode())
    return c


def _view_sig(v: View) -> Tuple[int, ...]:
    """The view as numbers: its base shape, -1, then each entry with its kind as a code (no strings: their
    ``hash()`` differs between processes). Kept on the view (``View.sig``; a view never changes)."""
    got = v.sig
    if got is not None:
        return got
    out: List[int] = list(v.base_shape)
    out.append(-1)
    codes = _ENTRY_CODE
    for e in v.entries:
        out.append(codes[e[0]])
        out.extend(e[1:])
    got = v.sig = tuple(out)
    return got


def node_sig(node: Node) -> Tuple:
    """Canonical form of an expression as nested tuples of numbers (bases by serial number), equal on
    every rank that recorded the same thing; ``hash()`` of it is the same in every process (no strings,
    no None, so no per-process hash randomization)."""
    t = type(node)
    if t is Leaf:
        v = node.view
        vs = v.sig
        b = node.base
        h = b._sig_head
        return (b.sig_head if h is None else h) + ((_view_sig(v) if vs is None else vs),)
    if t is Const:
        v = node.value
        if isinstance(v, (bool, np.bool_, int, np.integer)):
            return (1, int(node.weak), node.dtype.num, int(v))
        # floats by their bits: hash(nan) differs between processes, and 0.0 == -0.0 must not match
        return (1, int(node.weak), node.dtype.num, struct.unpack("<q", struct.pack("<d", float(v)))[0])
    return (2, _name_code(node.name), node.dtype.num) + tuple([node_sig(a) for a in node.args])


def node_desc(node: Node) -> str:
    """Readable text of an expression for error messages, e.g. ``add(array#3[1:3999], 0.2)``."""
    if isinstance(node, Leaf):
        b = node.base
        if node.view.is_full:
            return f"{b.name()}{b.shape}"
        return f"{b.name()}{node.view.text()}"
    if isinstance(node, Const):
        return repr(node.value)
    return f"{node.name}(" + ", ".join(node_desc(a) for a in node.args) + ")"


def array_fingerprint(arr: np.ndarray) -> str:
    """A short fingerprint of a NumPy operand's content for the divergence check (CRC32 of the bytes
    up to 1 MiB; larger arrays are compared by shape and dtype only)."""
    if arr.nbytes <= 1 << 20:
        return f"crc{zlib.crc32(np.ascontiguousarray(arr).view(np.uint8).reshape(-1)):08x}"
    return "large"


# --------------------------------------------------------------------------- row spaces
class RowSpace:
    """The rows an elementwise computation runs over and who computes each.

    ``kind='dist'``: row ``i`` of the iteration is base row ``start + i*step`` of a base
    distributed by ``dist``, computed by that row's owner; ``kept`` says whether the row is a
    user axis (False: a single fixed row, computed by its owner). ``kind='rep'``: every rank
    computes every row (replicated results). ``shape``: the iteration's internal shape,
    axis 0 being the rows.
    """

    __slots__ = ("kind", "dist", "start", "step", "count", "kept", "shape", "user_ndim", "key")

    def __init__(self, kind: str, dist: Optional[Distribution], start: int, step: int, count: int, kept: bool,
                 shape: Tuple[int, ...], user_ndim: int):
        self.kind, self.dist, self.start, self.step, self.count, self.kept = kind, dist, start, step, count, kept
        self.shape = shape = tuple(shape)
        self.user_ndim = user_ndim
        #: what the space is made of, as one flat tuple (equal keys: the same rows, computed by the same ranks)
        self.key = (kind, dist.key if dist is not None else None, start, step, count, kept, shape, user_ndim)

    @classmethod
    def of_leaf(cls, leaf: Leaf, shape: Tuple[int, ...]) -> "RowSpace":
        """The row space of computing into (or aligned with) ``leaf`` over the user shape ``shape``."""
        b = leaf.base
        u = len(shape)
        if b.replicated:
            internal = tuple(shape) if shape else (1,)
            return cls("rep", None, 0, 1, internal[0], True, internal, u)
        e = leaf.view.row_entry        # (as View.row_params and View.row_kept)
        if e is not None and e[0] == "s":
            return cls("dist", b.dist, e[1], e[2], e[3], True, tuple(shape), u)
        return cls("dist", b.dist, 0 if e is None else e[1], 1, 1, False, (1,) + tuple(shape), u)

    @property
    def rep(self) -> bool:
        return self.kind == "rep"


# --------------------------------------------------------------------------- tasks
class Task:
    """A recorded operation. ``sig`` (computed on first use): canonical nested tuple of numbers of what was
    recorded, hashed at the force point to detect diverging ranks; ``desc``: readable text for errors; ``fpe``:
    NumPy's floating-point error handling when it was recorded and ``wf`` the ``warnings.filters`` list then (both
    set by the context's ``record``)."""

    __slots__ = ("_sig", "_desc", "_desc_fn", "fpe", "wf")
    kind = "task"

    def _init_text(self, desc_fn) -> None:
        self._sig = None
        self._desc = None
        self._desc_fn = desc_fn

    @property
    def sig(self) -> Tuple:
        if self._sig is None:
            self._sig = self._make_sig()
        return self._sig

    @property
    def desc(self) -> str:
        if self._desc is None:
            fn = self._desc_fn
            self._desc = fn() if fn is not None else self._make_desc()
        return self._desc

    def _make_desc(self) -> str:  # pragma: no cover - a task without a text function overrides it
        """The task's text when no text function was given (``_desc_fn`` None)."""
        raise TypeError(f"{type(self).__name__} has no text: give _init_text a function or override _make_desc")

    def _make_sig(self) -> Tuple:  # pragma: no cover - every task kind overrides it
        """The task's signature (its kind, shapes and dtypes): the key of plan and kernel caches."""
        raise TypeError(f"{type(self).__name__} is a task kind without a signature; "
                        "every Task subclass defines _make_sig")

    def reads(self) -> List[Leaf]:
        return []

    def writes(self) -> List[Leaf]:
        return []


class ExprTask(Task):
    """A task computing one expression into ``out``: the expression (``expr``, replaceable by
    fusion, which forgets the cached leaves it reads) and the leaves it reads and writes."""

    __slots__ = ("out", "_expr", "_reads")

    @property
    def expr(self) -> Node:
        return self._expr

    @expr.setter
    def expr(self, node: Node) -> None:
        self._expr = node
        self._reads = None

    def reads(self) -> List[Leaf]:
        if self._reads is None:
            self._reads = list(leaves(self._expr))
        return self._reads

    def writes(self) -> List[Leaf]:
        return [self.out]


class Assign(ExprTask):
    """``out[...] = expr`` elementwise, over the row space of ``out`` (``space``)."""

    __slots__ = ("space", "_op_desc", "_expr0")
    kind = "assign"

    def __init__(self, out: Leaf, expr: Node, op_desc: Any = ""):
        self.out = out
        self._expr = self._expr0 = expr       # the recorded expression (its text), fusion may replace ``expr``
        self._reads = None
        self.space = RowSpace.of_leaf(out, out.shape)
        self._sig = self._desc = self._desc_fn = None   # the text from _make_desc: no closure per recorded task
        self._op_desc = op_desc

    def _make_desc(self) -> str:
        op_desc, out = self._op_desc, self.out
        return ((op_desc() if callable(op_desc) else op_desc) or
                f"{node_desc(out)} = {node_desc(self._expr0)}") + f" -> {out.dtype} {out.shape}"

    def _make_sig(self) -> Tuple:
        return (10, node_sig(self.out), node_sig(self.expr))


class Reduce(ExprTask):
    """``out = op(expr, axis)``. ``axis`` is an internal axis of ``space`` (0 = the rows) or None
    (everything). ``out`` is a replicated 0-d / trailing-shaped base for ``axis`` None or 0, and
    a base aligned with the rows for other axes. ``count``: elements per result (for mean)."""

    __slots__ = ("op", "axis", "space", "count", "acc_dtype")
    kind = "reduce"

    def __init__(self, expr: Node, op: str, axis: Optional[int], out: Leaf, space: RowSpace, count: int,
                 acc_dtype: np.dtype, op_desc: str):
        self.expr, self.op, self.axis, self.out, self.space, self.count = expr, op, axis, out, space, count
        self.acc_dtype = np.dtype(acc_dtype)
        self._init_text(lambda: f"{op_desc} -> {out.dtype} {out.shape}")

    def _make_sig(self) -> Tuple:
        return (11, _name_code(self.op), -1 if self.axis is None else self.axis, node_sig(self.out),
                node_sig(self.expr))


class Matmul(Task):
    """``out = a @ b``: ``a`` 2-D with distributed rows, ``b`` 1-D or 2-D (distributed rows or
    replicated); ``out`` aligned with ``a``'s rows."""

    __slots__ = ("a", "b", "out")
    kind = "matmul"

    def __init__(self, a: Leaf, b: Leaf, out: Leaf):
        self.a, self.b, self.out = a, b, out
        self._init_text(lambda: f"{node_desc(out)} = {node_desc(a)} @ {node_desc(b)}")

    def _make_sig(self) -> Tuple:
        return (12, node_sig(self.out), node_sig(self.a), node_sig(self.b))

    def reads(self) -> List[Leaf]:
        return [self.a, self.b]

    def writes(self) -> List[Leaf]:
        return [self.out]


class VecMat(Task):
    """``out = v @ b``: ``v`` 1-D, replicated or one fixed row of a distributed base, ``b`` 2-D with distributed
    rows (kept, first); ``out`` 1-D: on ``v``'s owner when ``v`` is a fixed row, else replicated. Each rank
    multiplies its rows of ``b`` by their entries of ``v`` (BLAS), then the ranks' partial products are summed in
    rank order, on the owner or on every rank (see :mod:`~.operations.linalg`)."""

    __slots__ = ("v", "b", "out")
    kind = "vecmat"

    def __init__(self, v: Leaf, b: Leaf, out: Leaf):
        self.v, self.b, self.out = v, b, out
        self._init_text(lambda: f"{node_desc(out)} = {node_desc(v)} @ {node_desc(b)}")

    def _make_sig(self) -> Tuple:
        return (16, node_sig(self.out), node_sig(self.v), node_sig(self.b))

    def reads(self) -> List[Leaf]:
        return [self.v, self.b]

    def writes(self) -> List[Leaf]:
        return [self.out]


class Transpose(Task):
    """``out = src.T`` for a 2-D ``src`` with distributed rows; ``out`` is distributed by rows too."""

    __slots__ = ("src", "out")
    kind = "transpose"

    def __init__(self, src: Leaf, out: Leaf):
        self.src, self.out = src, out
        self._init_text(lambda: f"{node_desc(out)} = {node_desc(src)}.T")

    def _make_sig(self) -> Tuple:
        return (13, node_sig(self.out), node_sig(self.src))

    def reads(self) -> List[Leaf]:
        return [self.src]

    def writes(self) -> List[Leaf]:
        return [self.out]


class Replicate(Task):
    """``out = src`` gathered: ``out`` is a replicated base holding the view ``src`` packed
    (shape ``(rows, *packed trailing)``), on every rank (``root`` None) or on ``root`` only."""

    __slots__ = ("src", "out", "root")
    kind = "replicate"

    def __init__(self, src: Leaf, out: Leaf, root: Optional[int] = None, why: str = ""):
        self.src, self.out, self.root = src, out, root
        self._init_text(lambda: why or f"gather {node_desc(src)}" + ("" if root is None else f" to rank {root}"))

    def _make_sig(self) -> Tuple:
        return (14, -1 if self.root is None else self.root, node_sig(self.out), node_sig(self.src))

    def reads(self) -> List[Leaf]:
        return [self.src]

    def writes(self) -> List[Leaf]:
        return [self.out]


class Swap(Task):
    """Made by fusion from ``target[view] = source[view]`` when ``source`` is a dying temporary laid
    out exactly like ``target``: the elements of ``target`` outside the view are copied into
    ``source``'s buffer, then the two local buffers are exchanged (no full copy)."""

    __slots__ = ("target", "source", "box")
    kind = "swap"

    def __init__(self, target: Leaf, source: Leaf, box, origin: Task):
        self.target, self.source, self.box = target, source, box
        self._init_text(lambda: origin.desc)
        self._sig = origin.sig

    def reads(self) -> List[Leaf]:
        return [self.source, Leaf(self.target.base, View.full(self.target.base.shape))]

    def writes(self) -> List[Leaf]:
        return [Leaf(self.target.base, View.full(self.target.base.shape)),
                Leaf(self.source.base, View.full(self.source.base.shape))]


class Redistribute(Task):
    """Made by fusion from ``out[view] = src[view]`` (a plain copy, cast to ``out``'s dtype if they differ)
    between two distributed bases whose rows are laid out differently (another distribution, block
    size, start or step): run as one aggregated transfer, at most one message per peer
    (:mod:`~.operations.redistribution`)."""

    __slots__ = ("out", "src")
    kind = "redistribute"

    def __init__(self, out: Leaf, src: Leaf, origin: Task):
        self.out, self.src = out, src
        self._init_text(lambda: origin.desc)
        self._sig = origin.sig

    def reads(self) -> List[Leaf]:
        return [self.src]

    def writes(self) -> List[Leaf]:
        return [self.out]


class IndexedCopy(Task):
    """An irregular copy through an index array, run through the project's Aggregator
    (:mod:`~.irregular`): ``mode='scatter'``: ``out[idx[k]] = src[k]``; ``mode='gather'``:
    ``out[k] = src[idx[k]]``. ``idx`` is a Leaf of a distributed integer array aligned with the
    rows of ``src`` (scatter) or ``out`` (gather), or a replicated NumPy array (``idx_array``,
    identified by ``idx_digest``)."""

    __slots__ = ("mode", "out", "src", "idx", "idx_array", "idx_digest")
    kind = "indexed"

    def __init__(self, mode: str, out: Leaf, src: Leaf, idx: Optional[Leaf], idx_array: Optional[np.ndarray],
                 idx_digest: int, desc: str):
        self.mode, self.out, self.src, self.idx = mode, out, src, idx
        self.idx_array, self.idx_digest = idx_array, int(idx_digest)
        self._init_text(lambda: desc)

    def _make_sig(self) -> Tuple:
        idx = node_sig(self.idx) if self.idx is not None else (3, self.idx_digest, len(self.idx_array))
        return (15, 1 if self.mode == "scatter" else 2, node_sig(self.out), node_sig(self.src), idx)

    def reads(self) -> List[Leaf]:
        return [self.src] + ([self.idx] if self.idx is not None else [])

    def writes(self) -> List[Leaf]:
        return [self.out]
