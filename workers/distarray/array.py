"""The user-facing distributed array: a NumPy-like view of a base distributed over the ranks.

A :class:`DistArray` is a view (:class:`~.indexing.View`) of a :class:`~.graph.Base`. Slicing
returns another view of the same base without copying (as in NumPy and DistNumPy).
Arithmetic, ufuncs (``__array_ufunc__``), comparisons, ``where``, assignment ``v[...] = x``,
reductions, ``@`` and reading one element (``a[i, j]``: a lazy 0-d copy, like a reduction's result) only
*record* work; it runs at a force point, on every rank at once:

* ``float(a)``, ``int(a)``, ``bool(a)``, ``a.item()``, ``print(a)``,
  ``repr(a)``, ``a.to_numpy()``, ``numpy.asarray(a)``, ``a.local``, ``a.evaluate()`` /
  :func:`nbmpi.workers.distarray.evaluate`;
* or when the number of recorded operations reaches the threshold (``NBMPI_DISTARRAY_THRESHOLD``).

Every force point is collective over the array's communicator: SPMD programs reach it on
every rank with the same recorded operations (checked; a difference raises
:class:`~.errors.DistArrayDivergence` on every rank).
"""
from __future__ import annotations

import operator
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np

from . import elementwise, fallback, gather_direct, irregular, matmul_recording, numpy_math, reductions, ufuncs
from .distribution import Distribution, make_distribution
from .assigned_values import assigned_value
from . import context as _context
from .context import ArrayContext
from .errors import CopyNotViewWarning, DistributionError, ShapeError, UnsupportedOperation, ufunc_cast_error
from .graph import Base, Leaf
from .indexing import View, c_contiguous
from .numpy_keywords import renamed
from .plans import my_rows, selector

__all__ = ["DistArray", "wrap"]


#: Array methods implemented natively by other modules of this package (``sum``, ``cumsum``, ``clip``,
#: ``diagonal``, ...), registered by them at import (they import this module, so it cannot import them):
#: ``a.<name>(...)`` calls ``_METHODS[name](a, ...)``. Names neither here nor in the class go through the
#: NumPy fallback (:meth:`DistArray.__getattr__`).
_METHODS: Dict[str, Callable[..., Any]] = {}
#: Indexing basic views lack (a distributed mask, ``a[:, idx]``, a replicated array), registered by
#: :mod:`.masking`: ``"getitem"(a, key)`` gives the result or None, ``"setitem"(a, key, value)`` True if done.
_INDEXERS: Dict[str, Callable[..., Any]] = {}


def _unsupported_get(a: "DistArray", key: Any) -> Any:
    """``a[key]`` for a key basic views lack: :mod:`.masking`'s native indexing (masks, a trailing index
    array), then :mod:`.numpy_indexing`'s (index arrays mixed with slices), else the NumPy fallback."""
    got = _INDEXERS["getitem"](a, key)
    if got is None and "_getitem_mixed" in _METHODS:
        got = _METHODS["_getitem_mixed"](a, key)
    return got if got is not None else fallback.call(operator.getitem, (a, key), {}, "ndarray.__getitem__")


def copy_of_view(res: Any, a: Any, what: str) -> Any:
    """``res``, the result of ``what`` on ``a`` (``a.T``, ``reshape``, ...), which NumPy makes a view of ``a``
    but is a copy here, marked so that writes into it warn (:func:`_warn_copy_write`). ``res`` itself when it is
    ``a`` or shares ``a``'s base (a true view). Local."""
    if isinstance(res, DistArray) and res is not a and (not isinstance(a, DistArray) or res._base is not a._base):
        res._base.copy_of = what
        if isinstance(a, DistArray):        # a later write into ``a`` leaves ``res`` stale: :func:`warn_stale_copies`
            src = a._base
            res._base.source = weakref.ref(src)
            src.copies = [r for r in (src.copies or ()) if r() is not None] + [weakref.ref(res._base)]
            a.context.copied = True
    return res


def _unseen(base: Any) -> bool:
    """Whether the user holds no DistArray on ``base`` (a weak reference's target; dead counts as unseen)."""
    return base is None or base.nviews == 0


def warn_stale_copies(base: Any) -> None:
    """A write into ``base`` is being recorded: if a copy made from it where NumPy has a view (``a.T``,
    ``reshape``, :func:`copy_of_view`) is still held by the user, warn (rank 0, once per call site) that the copy
    keeps the values from before the write, where NumPy's view would show it. Local."""
    live = [r for r in base.copies if not _unseen(r())]
    base.copies = live or None
    if live and base.context.rank == 0:
        _warn_copy(f"writing into an array after {live[0]().copy_of} of it was made: on distributed arrays that "
                   "result is a copy (NumPy's is a view), which keeps the values from before this write; make it "
                   "again after the write")


_COPY_WARNED: Dict[Any, Any] = {}
_context.STALE_COPIES[0] = warn_stale_copies


def _warn_copy(text: str) -> None:
    """A CopyNotViewWarning with ``text`` at the user's line, once per line."""
    site = fallback._call_site()
    warnings.warn_explicit(text, CopyNotViewWarning, site[0], site[1], registry=_COPY_WARNED)


def _warn_copy_write(a: "DistArray") -> None:
    """Warn (rank 0, once per call site) that ``a`` is a copy where NumPy has a view: the write does not reach
    the array it was made from. Where NumPy's view is read-only, raise NumPy's ValueError instead (every rank)."""
    if a._base.read_only:
        raise ValueError("assignment destination is read-only")
    src = a._base.source
    if a.context.rank != 0 or (src is not None and _unseen(src())):    # nobody sees the array it was made from
        return
    _warn_copy(f"writing into the result of {a._base.copy_of}, which on distributed arrays is a copy (NumPy's is a "
               "view): the array it was made from does not change; write into that array instead (a[:, k] = v for "
               "a.T[k] = v)")


def _warn_copy_outs(out: Any) -> None:
    """:func:`_warn_copy_write` for each ``out=`` operand of a ufunc (one or a tuple) that is such a copy."""
    for o in out if isinstance(out, tuple) else (out,):
        if isinstance(o, DistArray) and o._base.copy_of:
            _warn_copy_write(o)


def _unsupported_set(a: "DistArray", key: Any, value: Any) -> None:
    """``a[key] = value`` for a key basic views lack: :mod:`.masking`'s native assignment, then
    :mod:`.numpy_indexing`'s, else the fallback."""
    if _INDEXERS["setitem"](a, key, value):
        return
    if not ("_setitem_mixed" in _METHODS and _METHODS["_setitem_mixed"](a, key, value)):
        fallback.setitem(a, key, value)


def _basic_key(key: Any) -> bool:
    """Whether ``key`` is a Python int, a slice, or a tuple of those, None and ``...`` (a view: no index array,
    mask or DistArray to look for)."""
    t = type(key)
    if t is tuple:
        for k in key:
            tk = type(k)
            if tk is not int and tk is not slice and k is not None and k is not Ellipsis:
                return False
        return True
    return t is int or t is slice or key is Ellipsis or key is None


def wrap(leaf: Leaf) -> "DistArray":
    """The DistArray showing ``leaf`` (then the threshold of recorded operations is checked)."""
    d = DistArray(leaf.base, leaf.view)
    d._base.context.maybe_flush()
    return d


class DistArray:
    """A distributed (or replicated) N-d array (see the module doc).

    Attributes follow NumPy: ``shape``, ``dtype``, ``ndim``, ``size``, ``T``. ``dist`` is the
    :class:`~.distribution.Distribution` of the base's rows; ``local`` is this rank's part.
    """

    __slots__ = ("_base", "_view", "__weakref__")
    __array_priority__ = 100.0
    __hash__ = None  # type: ignore[assignment] - mutable and compared elementwise, like ndarray

    def __init__(self, base: Base, view: View):
        self._base = base
        self._view = view
        base.nviews += 1

    def __del__(self) -> None:
        try:
            self._base.nviews -= 1
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- description ------------------------------------------------------------------
    @property
    def shape(self) -> Tuple[int, ...]:
        return self._view.shape

    @shape.setter
    def shape(self, value: Any) -> None:
        """``a.shape = s``: where NumPy allows it (:func:`~.numpy_indexing.set_shape`); collective."""
        _METHODS["_set_shape"](self, value)

    @property
    def dtype(self) -> np.dtype:
        return self._base.dtype

    @property
    def ndim(self) -> int:
        return len(self._view.shape)

    @property
    def size(self) -> int:
        return self._view.size

    @property
    def nbytes(self) -> int:
        """Bytes of the whole (global) array."""
        return self.size * self.dtype.itemsize

    @property
    def dist(self) -> Distribution:
        """How the rows (axis 0) of the base array are spread over the ranks; ``str()`` of it says
        where every row lives. For a view, :meth:`describe` also names the view."""
        return self._base.dist

    @property
    def comm(self):
        """The communicator the array lives on."""
        return self._base.context.comm

    @property
    def context(self) -> ArrayContext:
        return self._base.context

    def describe(self) -> str:
        """A readable description: shape, dtype, distribution, and the view of the base if any."""
        b = self._base
        head = f"{self.shape} {self.dtype}, {b.dist.describe()}"
        if self._view.is_full:
            return head
        return f"{head}; a view {self._view.text()} of the base {b.shape}"

    @property
    def base_shape(self) -> Tuple[int, ...]:
        """Shape of the base this array views."""
        return self._base.shape

    def _leaf(self) -> Leaf:
        return Leaf(self._base, self._view)

    # -- force points -----------------------------------------------------------------
    def evaluate(self) -> "DistArray":
        """Run every recorded operation of this array's communicator now (collective). Returns self."""
        self.context.flush("evaluate()")
        return self

    def to_numpy(self, root: Optional[int] = None, _reason: str = "to_numpy()") -> Optional[np.ndarray]:
        """Gather the array into a NumPy array: on every rank (``root=None``, an allgather) or on
        ``root`` only (the others get None). Collective; a force point. Returns a new array."""
        ctx = self.context
        if self._base.replicated:
            ctx.flush(_reason)
            if root is not None and ctx.rank != root:
                return None
            return np.array(self._base.ensure()[self._view.numpy_index()], copy=True)
        if root is not None and not 0 <= root < ctx.size:
            raise ValueError(f"to_numpy: root {root} is not a rank of the communicator (0..{ctx.size - 1})")
        if gather_direct.applies(self._base, self._view):    # the local blocks are the result's bytes in order
            return gather_direct.gather_block(self._base, root, _reason)
        rep = elementwise.replicate_leaf(ctx, self._leaf(), "to_numpy()" if root is None else
                                         f"to_numpy(root={root})", root=root)
        keep = DistArray(rep.base, rep.view)  # read below: it must not look dead to the fusion pass
        ctx.flush(_reason)
        del keep
        if root is not None and ctx.rank != root:
            return None
        rb = rep.base
        loc = rb.ensure()
        if rep.view.is_full and loc.shape == self.shape:
            rb.exported = True  # the gathered copy is made for this call only: handed over, not copied again
            return loc
        return np.array(loc[rep.view.numpy_index()], copy=True)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype)

    def _scalar(self, what: str, error: type = TypeError):
        if self.size != 1:   # NumPy's errors: item() a ValueError, float()/int() a TypeError
            raise error("can only convert an array of size 1 to a Python scalar" if error is ValueError else
                        "only 0-dimensional arrays can be converted to Python scalars")
        return self.to_numpy(_reason=what).reshape(())[()]

    def item(self, *args: Any) -> Any:
        """The single element, or the one at a flat index or a tuple of indices (NumPy's ``item``), as a Python
        scalar (force point, collective)."""
        if args:
            key = args[0] if len(args) == 1 else args
            return np.asarray(self.flat[key] if np.ndim(key) == 0 and not isinstance(key, tuple) else self[key]).item()
        return self._scalar("item()", ValueError).item()

    def __float__(self) -> float:
        return float(_only_0d(self, _SCALAR_TEXT)._scalar("float()"))

    def __int__(self) -> int:
        return int(_only_0d(self, _SCALAR_TEXT)._scalar("int()"))

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError("only integer arrays can be used as an index")
        return int(_only_0d(self, "only integer scalar arrays can be converted to a scalar index")._scalar("index"))

    def __bool__(self) -> bool:
        if self.size == 0:
            raise ValueError("The truth value of an empty array is ambiguous. Use `array.size > 0` to check that an "
                             "array is not empty.")
        if self.size != 1:
            raise ValueError("The truth value of an array with more than one element is ambiguous. "
                             "Use a.any() or a.all()")
        return bool(self._scalar("bool()"))

    def tolist(self):
        return self.to_numpy().tolist()

    @property
    def local(self) -> np.ndarray:
        """This rank's part of the array as a NumPy array (a force point if operations are pending:
        collective). For a view keeping axis 0 it holds this rank's rows of the view, in order
        (:attr:`local_rows` gives their indices); it is a view of the local buffer (writes go to
        the array) unless the rows are not evenly spaced locally (then a copy). A replicated array
        gives all of it. Once taken, the base's buffer is never exchanged by fusion."""
        ctx = self.context
        b, v = self._base, self._view
        b.unshare()          # the user may write into the buffer: no other base may view it (before the
        ctx.flush(".local")  # force point: a lazy concatenate of this array records its copies, evaluated now)
        b.exported = True
        loc = b.ensure()
        if b.replicated:
            return loc[v.numpy_index()]
        if v.is_full:
            return loc
        s, t, n = v.row_params
        _, lidx = my_rows(b.dist, s, t, n, ctx.rank)
        if not v.row_kept and len(lidx) == 0:
            return np.empty((0,) + self.shape, dtype=self.dtype)
        sel = selector(lidx) if v.row_kept else int(lidx[0])
        return loc[v.numpy_index(row_sel=sel)]

    @property
    def local_rows(self) -> np.ndarray:
        """Indices along axis 0 (of this view) of the rows in :attr:`local`. Local, no force point."""
        b, v = self._base, self._view
        if b.replicated:
            return np.arange(self.shape[0] if self.shape else 1, dtype=np.int64)
        s, t, n = v.row_params
        i, _ = my_rows(b.dist, s, t, n, self.context.rank)
        return i

    # -- printing -----------------------------------------------------------------------
    def __str__(self) -> str:
        arr = _printable(self)
        if arr.ndim == 0:       # NumPy's reduction gives a scalar: its text (differs under legacy='1.13')
            return str(arr[()])
        with _print_options(arr, self):
            return str(arr)

    def __repr__(self) -> str:
        arr = _printable(self)
        with _print_options(arr, self):
            body = np.array2string(arr, separator=", ", prefix="DistArray(")
        return f"DistArray({body}, dtype={self.dtype}, dist={self.dist.kind!r})"

    def __format__(self, spec: str) -> str:
        if not self.shape:      # NumPy's scalar's format (float32's f"{x}" shows its float64 digits)
            return format(self._scalar("format()"), spec)
        if spec:
            raise TypeError("unsupported format string passed to DistArray.__format__")
        return str(self)

    # -- indexing -----------------------------------------------------------------------
    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator[Any]:
        """Axis 0 as NumPy: 1-D yields NumPy scalars gathered once (one force point), N-d the views a[i]."""
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        if self.ndim == 1:
            yield from self.to_numpy(_reason="iteration")
            return
        for i in range(self.shape[0]):
            yield self[i]

    def _index_key(self, key: Any) -> Any:
        """The index array ``key`` selects rows with (an int64 NumPy array, or a DistArray of integers), or None
        for a basic index (integers, slices, None, ...). See :mod:`~.irregular`."""
        if isinstance(key, DistArray):
            if key.dtype.kind not in "iu":
                raise UnsupportedOperation(
                    f"indexing with a distributed {key.dtype} array is not supported: distributed index arrays must "
                    "be integers (a[idx], b[idx] = a); for a distributed mask use where(mask, x, y), or select "
                    "rows with a NumPy boolean mask")
            if key.ndim != 1:
                raise UnsupportedOperation(f"a distributed index array must be 1-D, got shape {key.shape}")
            if key.context is not self.context:
                raise DistributionError("the index array lives on another communicator than the indexed array; "
                                        "create both with the same comm=")
            return key if key._view.is_full else key.redistribute(key.dist)
        if isinstance(key, tuple):
            if any(isinstance(k, (list, np.ndarray, DistArray, bool, np.bool_)) for k in key):
                raise UnsupportedOperation("index arrays are supported alone, selecting along axis 0 (a[idx], "
                                           "b[idx] = a); combine them with slices in two steps: a[idx][:, 1:]")
            return None
        if isinstance(key, (bool, np.bool_)):     # a[True]: NumPy's new axis of length 1 (0), a copy: the fallback
            raise UnsupportedOperation("a boolean scalar index is indexed by NumPy")
        return irregular.numpy_index(key, self.shape[0] if self.shape else 0, self.shape)

    def __getitem__(self, key: Any):
        if not _basic_key(key):
            try:
                idx = self._index_key(key)
            except UnsupportedOperation:     # e.g. index arrays mixed with slices: NumPy's own indexing
                return _unsupported_get(self, key)
            if idx is not None:
                return _take(self, key, idx)
        view = self._view.index(key)
        if view.ndim == 0:
            return self._element(view)
        return DistArray(self._base, view)

    def _element(self, view: View) -> "DistArray":
        """``a[i, j, ...]`` (one element): a 0-d replicated copy of it, recorded, not a force point (like a
        reduction's result; ``float()``, ``int()``, ``bool()``, printing force it). A copy, as NumPy's scalar
        is: a later write to ``a`` does not change it. Its owner sends it to every rank within the next
        evaluation (a :class:`~.graph.Replicate` of one element), so ``M[k + 1:, k] / M[k, k]`` costs no
        extra force point."""
        leaf = Leaf(self._base, view)
        if self._base.replicated:
            return wrap(elementwise.record_cast(self.context, leaf, self.dtype))
        return wrap(elementwise.replicate_leaf(self.context, leaf, "a[i, j]: one element to every rank"))

    def __setitem__(self, key: Any, value: Any) -> None:
        ctx = self._base.context
        if self._base.copy_of:
            _warn_copy_write(self)
        value = assigned_value(value, self._base.dtype, ctx.rank, not _basic_key(key))
        if _basic_key(key):
            elementwise.record_assign(ctx, Leaf(self._base, self._view.index(key)),
                                      value._leaf() if isinstance(value, DistArray) else value)
            ctx.maybe_flush()
            return
        if isinstance(key, (DistArray, np.ndarray)) and key.dtype == np.bool_ and (
                isinstance(key, DistArray) or key.shape == self.shape and np.ndim(value) == 0):
            # a[mask] = value with a mask of a's shape is where(mask, value, a), in place
            if key.shape != self.shape and _INDEXERS["setitem"](self, key, value):
                return
            if key.shape != self.shape:
                raise IndexError(f"boolean index did not match indexed array: the mask's shape is {key.shape}, the "
                                 f"array's {self.shape}")
            if isinstance(value, DistArray) or np.ndim(value) != 0:
                _unsupported_set(self, key, value)
                return
            val = value
            mk = key._leaf() if isinstance(key, DistArray) else key
            res = elementwise.record_where(ctx, mk, val, self._leaf())
            elementwise.record_assign(ctx, self._leaf(), res)
            ctx.maybe_flush()
            return
        try:
            idx = self._index_key(key)
        except UnsupportedOperation:     # e.g. index arrays mixed with slices: NumPy's own indexing
            _unsupported_set(self, key, value)
            return
        if idx is not None:
            if irregular.rows_view(self._view):
                _put_rows(self, idx, value)
            else:                            # into a row's elements (a[1][[0, 2]] = v)
                fallback.setitem(self, key, value)
            return
        target = Leaf(self._base, self._view.index(key))
        val = value._leaf() if isinstance(value, DistArray) else value
        elementwise.record_assign(ctx, target, val)
        ctx.maybe_flush()

    def fill(self, value: Any) -> None:
        """Set every element to ``value`` (recorded)."""
        self[...] = value

    # -- NumPy protocols -------------------------------------------------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any):
        if ufunc is np.matmul and method == "__call__":
            out = kwargs.pop("out", None)                  # NumPy passes out= as a tuple of one
            return matmul(*inputs, out=out[0] if isinstance(out, tuple) else out, **kwargs)
        _warn_copy_outs(kwargs.get("out"))
        return ufuncs.dispatch(ufunc, method, inputs, kwargs, _METHODS)     # every ufunc natively (.ufuncs)

    def __array_function__(self, func, types, args, kwargs):
        impl = _FUNCTIONS.get(func)
        name = getattr(func, "__name__", str(func))
        if impl is None:
            return fallback.call(func, args, kwargs, name)
        fallback.note_native(name)
        return impl(*args, **(renamed(func, impl, kwargs) if kwargs else kwargs))

    def __getattr__(self, name: str) -> Any:
        # only for names the class lacks: an ndarray method or attribute runs through the NumPy fallback
        if name.startswith("_") or not hasattr(np.ndarray, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        impl = _METHODS.get(name)
        if impl is not None:
            def bound(*args: Any, **kwargs: Any) -> Any:
                fallback.note_native(f"ndarray.{name}")
                return impl(self, *args, **kwargs)
            bound.__name__ = name
            bound.__doc__ = impl.__doc__
            return bound
        return fallback.method(self, name)

    # -- arithmetic (recorded) -------------------------------------------------------------
    def _u(self, ufunc: np.ufunc, *inputs: Any) -> "DistArray":
        for x in inputs:
            if isinstance(x, (complex, np.complexfloating)):  # NumPy's complex result (a NumPy array): fallback
                return fallback.call(ufunc, inputs, {}, ufunc.__name__)
            if not isinstance(x, (DistArray, np.ndarray, np.generic, int, float, bool, list, tuple)):
                return NotImplemented
        if (numpy_math.applies(ufunc.__name__, inputs) or not ufuncs.compiled_dtypes(ufunc, inputs)
                or ufuncs.numpy_power(ufunc, inputs)):
            res = ufuncs.call(ufunc, inputs, {})         # NumPy's own loops on each block (recorded)
            if res is not ufuncs.FALLBACK:
                fallback.note_native(ufunc.__name__)
                return res
            return fallback.call(ufunc, inputs, {}, ufunc.__name__)
        fallback.note_native(ufunc.__name__)
        args = [x._leaf() if isinstance(x, DistArray) else x for x in inputs]
        return wrap(elementwise.record_ufunc(self.context, ufunc, args))

    def _iu(self, ufunc: np.ufunc, other: Any) -> "DistArray":
        if not self._view.shape:      # a 0-d result stands for NumPy's immutable scalar: ``s += 1`` rebinds ``s``
            return self._u(ufunc, self, other)
        if self._base.copy_of:
            _warn_copy_write(self)
        if ufunc is np.power and self.dtype.kind in "iu":
            ufuncs.check_exponents(other, self.dtype)   # NumPy's error for a negative integer exponent
        if not ufuncs.compiled_dtypes(ufunc, (self, other)):
            return _in_place_blocks(self, ufunc, other)
        o = other._leaf() if isinstance(other, DistArray) else other
        fallback.note_native(ufunc.__name__)
        elementwise.record_ufunc(self.context, ufunc, [self._leaf(), o], out=self._leaf())
        self.context.maybe_flush()
        return self

    def __add__(self, o): return self._u(np.add, self, o)
    def __radd__(self, o): return self._u(np.add, o, self)
    def __sub__(self, o): return self._u(np.subtract, self, o)
    def __rsub__(self, o): return self._u(np.subtract, o, self)
    def __mul__(self, o): return _repeat(o, self) if type(o) in (list, tuple) and not self._view.shape \
        else self._u(np.multiply, self, o)
    def __rmul__(self, o): return _repeat(o, self) if type(o) in (list, tuple) and not self._view.shape \
        else self._u(np.multiply, o, self)
    def __truediv__(self, o): return self._u(np.true_divide, self, o)
    def __rtruediv__(self, o): return self._u(np.true_divide, o, self)
    def __pow__(self, o): return (self._u(np.square, self) if type(o) is int and o == 2 and self.dtype.kind == "b"
                                  and self._view.shape else self._u(np.power, self, o))  # ndarray ** 2 is square
    def __rpow__(self, o): return self._u(np.power, o, self)
    def __and__(self, o): return self._u(np.bitwise_and, self, o)
    def __rand__(self, o): return self._u(np.bitwise_and, o, self)
    def __or__(self, o): return self._u(np.bitwise_or, self, o)
    def __ror__(self, o): return self._u(np.bitwise_or, o, self)
    def __xor__(self, o): return self._u(np.bitwise_xor, self, o)
    def __rxor__(self, o): return self._u(np.bitwise_xor, o, self)
    def __lt__(self, o): return self._u(np.less, self, o)
    def __le__(self, o): return self._u(np.less_equal, self, o)
    def __gt__(self, o): return self._u(np.greater, self, o)
    def __ge__(self, o): return self._u(np.greater_equal, self, o)
    def __eq__(self, o): return self._compare(np.equal, operator.eq, o)  # type: ignore[override]
    def __ne__(self, o): return self._compare(np.not_equal, operator.ne, o)  # type: ignore[override]

    def _compare(self, ufunc: np.ufunc, op: Callable[[Any, Any], Any], other: Any) -> Any:
        return _compare(self, ufunc, op, other)

    def __neg__(self): return self._u(np.negative, self)
    def __pos__(self): return self._u(np.positive, self)
    def __abs__(self): return self._u(np.absolute, self)
    def __invert__(self):
        return self._u(np.logical_not, self) if self.dtype == np.bool_ else np.invert(self)   # integers: per block
    def __iadd__(self, o): return self._iu(np.add, o)
    def __isub__(self, o): return self._iu(np.subtract, o)
    def __imul__(self, o): return self._iu(np.multiply, o)
    def __itruediv__(self, o): return self._iu(np.true_divide, o)
    def __ipow__(self, o): return self._iu(np.power, o)
    def __ifloordiv__(self, o): return _in_place(self, np.floor_divide, o)
    def __imod__(self, o): return _in_place(self, np.remainder, o)
    def __ilshift__(self, o): return _in_place(self, np.left_shift, o)
    def __irshift__(self, o): return _in_place(self, np.right_shift, o)
    def __iand__(self, o): return _in_place(self, np.bitwise_and, o)
    def __ior__(self, o): return _in_place(self, np.bitwise_or, o)
    def __ixor__(self, o): return _in_place(self, np.bitwise_xor, o)
    def __imatmul__(self, o): return _imatmul(self, o)
    def __matmul__(self, o): return matmul(self, o)
    def __rmatmul__(self, o): return matmul(o, self)

    def __floordiv__(self, o): return np.floor_divide(self, o)
    def __rfloordiv__(self, o): return np.floor_divide(o, self)
    def __lshift__(self, o): return np.left_shift(self, o)
    def __rlshift__(self, o): return np.left_shift(o, self)
    def __rshift__(self, o): return np.right_shift(self, o)
    def __rrshift__(self, o): return np.right_shift(o, self)
    def __divmod__(self, o): return np.divmod(self, o)
    def __rdivmod__(self, o): return np.divmod(o, self)
    def __mod__(self, o): return np.remainder(self, o)
    def __rmod__(self, o): return np.remainder(o, self)

    # -- methods -------------------------------------------------------------------------
    def redistribute(self, dist: Any) -> "DistArray":
        """A new array with this array's values and shape, its rows spread over the ranks by ``dist``
        (``"block"``, ``"cyclic"``, ``("block-cyclic", b)``, ``"replicated"`` or a
        :class:`~.distribution.Distribution` whose kind and block size are used).

        Copy semantics: the result always has its own base and buffers, even if ``dist`` places the
        rows as they are now (then the copy needs no communication); for a view, the result holds the
        view's elements, compacted (shape ``self.shape``). Later writes to either array do not show in
        the other. Lazy like every operation: recorded on every rank (SPMD) and run at the next force
        point as one aggregated transfer with at most one message per peer (:mod:`~.operations.redistribution`);
        collective at that force point. Same as ``b = dnp.empty(a.shape, a.dtype, dist=dist); b[...] = a``.
        """
        if self.ndim == 0:
            raise UnsupportedOperation("redistribute of a 0-d array: it has no rows to distribute")
        ctx = self.context
        d = make_distribution(dist, self.shape[0], ctx.size)
        base = Base(ctx, self.shape, self.dtype, d, origin=f"redistribute:{d.kind}:{d.block}")
        target = Leaf(base, View.full(self.shape))
        elementwise.record_assign(ctx, target, self._leaf())
        return wrap(target)

    def dot(self, other: Any, out: Any = None) -> Any:
        """``a.dot(b)``: :func:`dot`."""
        return dot(self, other, out=out)

    def __round__(self, ndigits: Optional[int] = None) -> Any: return _round(self, ndigits)

    @property
    def T(self) -> "DistArray":
        return transpose(self)

    def transpose(self, *axes: Any) -> "DistArray":
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return transpose(self, tuple(axes) if axes else None)

    def reshape(self, *shape: Any, order: str = "C") -> "DistArray":
        """``numpy.reshape(self, shape)`` in C order (native, see :mod:`.numpy_reshaping`); other orders through
        the NumPy fallback. A new array, not a view: writes to it do not change ``self``."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if order != "C":
            return fallback.call(np.reshape, (self, tuple(shape)), dict(order=order), "reshape")
        if tuple(shape) == self.shape:
            return self
        impl = _METHODS.get("reshape")       # the native one (numpy_reshaping), by global flat index
        if impl is not None:
            return impl(self, tuple(shape))
        return fallback.call(np.reshape, (self, tuple(shape)), {}, "reshape")


def _compare(self: DistArray, ufunc: np.ufunc, op: Callable[[Any, Any], Any], other: Any) -> Any:
    """``self == other`` / ``self != other``: recorded for the operands the arrays hold; for any other
    (``None``, a complex number, an object) NumPy's elementwise answer through the fallback (``a == None``
    is an array of False, as NumPy's, never the scalar ``False`` of an identity test)."""
    if other is None and not self._view.shape:      # NumPy's scalar compared with None: a Python bool
        return op is operator.ne
    res = self._u(ufunc, self, other)
    if res is NotImplemented and not isinstance(other, DistArray):
        return fallback.call(op, (self, other), {}, ufunc.__name__)
    return res


#: NumPy's TypeError text for ``int()``/``float()`` of an array with dimensions.
_SCALAR_TEXT = "only 0-dimensional arrays can be converted to Python scalars"


def _only_0d(a: DistArray, text: str) -> DistArray:
    """``a`` if it is 0-d (a reduction's result, ``a[i]``); NumPy's TypeError ``text`` for an array with dimensions,
    even of one element (NumPy 2)."""
    if a._view.shape:
        raise TypeError(text)
    return a


def _repeat(seq: Any, n: DistArray) -> Any:
    """``seq * n`` for a list or tuple and a 0-d array, which stands for NumPy's scalar: the sequence repeated
    ``int(n)`` times for an integer (a force point, collective), NumPy's TypeError otherwise."""
    if n.dtype.kind not in "iu":
        raise TypeError(f"can't multiply sequence by non-int of type 'numpy.{n.dtype.type.__name__}'")
    return seq * int(n)


def _in_place(self: DistArray, ufunc: np.ufunc, other: Any) -> DistArray:
    """``self <op>= other`` for the operators the fused kernels do not compile in place: NumPy's ``ufunc``
    on each block with ``out=self`` (recorded), so ``self`` and every view of it change, with NumPy's
    casting rules (``same_kind``). Returns ``self``. A copy where NumPy has a view warns (``out=``). A 0-d ``self``
    stands for NumPy's immutable scalar (``a[i]``, ``a.sum()``): a new result, ``self`` unchanged."""
    if not self._view.shape:
        return ufunc(self, other)
    ufunc(self, other, out=self)
    return self


def _in_place_blocks(self: DistArray, ufunc: np.ufunc, other: Any) -> DistArray:
    """``self <op>= other`` where the fused kernels cannot compute it (float16): NumPy's ``ufunc`` on each block
    into ``self`` (recorded; the NumPy fallback if the operands are not aligned). Returns ``self``."""
    if ufuncs.call(ufunc, (self, other), {"out": self}) is ufuncs.FALLBACK:
        fallback.call(ufunc, (self, other), {"out": self}, ufunc.__name__)
    else:
        fallback.note_native(ufunc.__name__)
    self.context.maybe_flush()
    return self


def _imatmul(self: DistArray, o: Any) -> DistArray:
    """``a @= b``: ``a[...] = a @ b`` (recorded), with NumPy's checks: the product must have ``a``'s shape
    and cast to its dtype under ``same_kind``."""
    res = matmul(self, o)
    if not np.can_cast(res.dtype, self.dtype, "same_kind"):
        raise ufunc_cast_error("matmul", res.dtype, self.dtype)
    if tuple(np.shape(res)) != self.shape:
        raise ValueError(f"matmul: a @= b needs a product of a's shape {self.shape}, got {tuple(np.shape(res))}")
    self[...] = res
    return self


def _round(self: DistArray, ndigits: Optional[int]) -> Any:
    """``round(a)``, ``round(a, n)`` of a 0-d array (a reduction's result, ``a[i, j]``), which stands for
    NumPy's scalar: what ``round`` gives for that scalar (a Python int, or a NumPy scalar rounded to ``n``
    digits). A force point, collective. Arrays of one or more dimensions raise TypeError, as NumPy's do
    (``numpy.round(a, n)`` rounds them)."""
    if self.ndim != 0:
        raise TypeError("type DistArray doesn't define __round__ method for arrays of 1 or more dimensions "
                        "(nor does numpy.ndarray): use numpy.round(a, decimals)")
    value = self._scalar("round()")
    return round(value) if ndigits is None else round(value, ndigits)


def _take(a: "DistArray", key: Any, idx: Any) -> "DistArray":
    """``a[key]`` with an index array (``idx``: ``key`` converted): a new array (a force point, collective).
    Inside a row (``a[1][[0, 2]]``, axis 0 is not the distributed one): through the NumPy fallback."""
    ctx = a.context
    if a.ndim == 0:
        raise IndexError("too many indices for array: array is 0-dimensional, but 1 were indexed")
    if a._base.replicated:
        ix = idx.to_numpy() if isinstance(idx, DistArray) else idx
        return wrap(elementwise.rep_base_from_numpy(ctx, a.to_numpy()[ix]))
    if not irregular.rows_view(a._view):
        return fallback.call(operator.getitem, (a, key), {}, "ndarray.__getitem__")
    out = irregular.record_take(ctx, a._leaf(), idx._leaf() if isinstance(idx, DistArray) else idx)
    res = DistArray(out.base, out.view)
    ctx.flush("a[idx]")
    return res


def _leading_ones(shape: Tuple[int, ...], ndim: int) -> int:
    """How many leading length-1 axes NumPy drops from a value of ``shape`` assigned into ``ndim`` axes."""
    k = 0
    while len(shape) - k > ndim and shape[k] == 1:
        k += 1
    return k


def _broadcasts(shape: Tuple[int, ...], want: Tuple[int, ...]) -> bool:
    """Whether a value of ``shape`` broadcasts to ``want`` in an assignment (leading length-1 axes dropped)."""
    shape = tuple(shape)
    try:
        return np.broadcast_shapes(shape[_leading_ones(shape, len(want)):], want) == tuple(want)
    except ValueError:
        return False


def _put_rows(self: "DistArray", idx: Any, value: Any) -> None:
    """``self[idx] = value`` with an index array (a force point, collective)."""
    ctx = self.context
    irregular.check_rows_view(self._leaf(), "b[idx] = a")
    m = idx.shape[0] if isinstance(idx, DistArray) else len(idx)
    want = (m,) + tuple(self.shape[1:])
    if isinstance(value, DistArray) and value.shape != want and value.context is ctx and _broadcasts(value.shape, want):
        value = value.to_numpy()     # broadcast as NumPy does (a row for every index): a small value, gathered
    if isinstance(value, DistArray):
        if value.context is not ctx:
            raise DistributionError("b[idx] = a: a lives on another communicator than b; create both with the "
                                    "same comm=")
        if value.shape != want:
            raise ShapeError(f"b[idx] = a: a has shape {value.shape}, expected {want} (one row of b's shape "
                             f"{tuple(self.shape[1:])} per index; only a scalar is broadcast)")
        v = value
        if isinstance(idx, DistArray) and not (value._view.is_full and value.dist == idx.dist):
            v = value.redistribute(idx.dist)   # aligned with the index: each rank holds a[k] with idx[k]
    else:
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise UnsupportedOperation(f"b[idx] = a: values of dtype {arr.dtype} are not supported")
        arr = arr.reshape(arr.shape[_leading_ones(arr.shape, len(want)):])   # as NumPy drops them
        try:
            arr = np.broadcast_to(arr, want)
        except ValueError:
            raise ShapeError(f"b[idx] = a: could not broadcast a of shape {np.shape(value)} to {want}") from None
        if isinstance(idx, DistArray):
            d = idx.dist
            base = Base(ctx, want, arr.dtype, d, temp=True)
            base.set_local(np.ascontiguousarray(arr[d.global_rows(ctx.rank)]))
            v = DistArray(base, View.full(want))
        else:
            v = wrap(elementwise.rep_base_from_numpy(ctx, arr))
    irregular.record_put(ctx, self._leaf(), idx._leaf() if isinstance(idx, DistArray) else idx, v._leaf())
    ctx.flush("b[idx] = a")


# --------------------------------------------------------------------------- functions
def _context_from(*xs: Any) -> ArrayContext:
    for x in xs:
        if isinstance(x, DistArray):
            return x.context
    from .context import context_for

    return context_for()


def _reduce(a: Any, op: str, axis: Any = None) -> Any:
    if not isinstance(a, DistArray):
        return getattr(np, op)(a, axis=axis)
    fallback.note_native(op)
    return wrap(reductions.record_reduce(a.context, a._leaf(), op, axis))


def dot(a: Any, b: Any, out: Any = None) -> Any:
    """``numpy.dot``: a product with a scalar operand is ``multiply`` (recorded), 1-D and 2-D operands are
    :func:`matmul`; other ranks and ``out=`` as NumPy's, the N-d forms through the NumPy fallback."""
    if not isinstance(a, DistArray) and not isinstance(b, DistArray):
        return np.dot(a, b, out=out)
    if np.ndim(a) == 0 or np.ndim(b) == 0:
        res = np.multiply(a, b)
    elif np.ndim(a) > 2 or np.ndim(b) > 2:
        return fallback.call(np.dot, (a, b), {} if out is None else dict(out=out), "dot")
    else:
        sa, sb = np.shape(a), np.shape(b)
        if sa[-1] != sb[0]:                     # NumPy's dot error (not matmul's), from stand-ins
            np.dot(np.broadcast_to(0.0, sa), np.broadcast_to(0.0, sb))
        res = matmul(a, b)
    if isinstance(out, DistArray) and (out.dtype != res.dtype or not c_contiguous(out._view)):
        # NumPy's out= of dot: a C-array of the result's dtype only
        raise ValueError("output array is not acceptable (must have the right datatype, number of dimensions, and "
                         "be a C-Array)")
    return _into(res, out)


def _into(res: Any, out: Any) -> Any:
    """``res``, or ``out`` with ``res`` written into it (``out[...] = res``, recorded) when ``out`` is given; a
    mismatched shape raises as NumPy's ``out=`` does."""
    if out is None:
        return res
    if tuple(np.shape(out)) != tuple(np.shape(res)):
        raise ValueError(f"output array has shape {tuple(np.shape(out))}, the result has shape "
                         f"{tuple(np.shape(res))}: pass out= of the result's shape")
    out[...] = res
    return out


def matmul(a: Any, b: Any, out: Any = None, **kwargs: Any) -> Any:
    """``a @ b`` (recorded); see :mod:`~.matmul_recording` for what is supported. ``out=`` receives the result
    (recorded copy); NumPy's other keywords (``dtype``, ``casting``, ``axes``, ...) go through the fallback."""
    if kwargs:
        return fallback.call(np.matmul, (a, b), dict(kwargs, out=out) if out is not None else kwargs, "matmul")
    if out is not None:
        return _into(matmul(a, b), out)
    if not isinstance(a, DistArray) and not isinstance(b, DistArray):
        return np.matmul(a, b)
    ctx = _context_from(a, b)
    la = a._leaf() if isinstance(a, DistArray) else a
    lb = b._leaf() if isinstance(b, DistArray) else b
    try:
        return wrap(matmul_recording.record_matmul(ctx, la, lb))
    except UnsupportedOperation:         # shapes the distributed matmul lacks (e.g. 1-D @ 2-D): NumPy's
        return fallback.call(np.matmul, (a, b), {}, "matmul")


def transpose(a: Any, axes: Any = None) -> Any:
    """``numpy.transpose``: ``a.T`` of a 2-D array distributed by rows is recorded; explicit axes, N-d arrays and
    views that move the distributed axis are permuted by an exchange of elements (a collective step)."""
    if not isinstance(a, DistArray):
        return np.transpose(a, axes)
    if axes is not None and tuple(operator.index(k) % max(a.ndim, 1) for k in axes) == tuple(range(a.ndim)):
        return a
    v = a._view
    if (a.ndim > 2 or axes is not None and tuple(axes) != tuple(range(a.ndim))[::-1]
            or a.ndim == 2 and not a._base.replicated and not (v.row_kept and v.lead_new() == 0
                                                               and len(a._base.shape) == 2)):
        permute = _METHODS.get("_permute")          # by exchange of elements (numpy_reshaping)
        if permute is None:
            raise UnsupportedOperation("transpose with explicit axes is not supported")
        return copy_of_view(permute(a, tuple(range(a.ndim))[::-1] if axes is None else tuple(axes)), a,
                            "a.T / transpose / swapaxes")
    if a._base.replicated and a.ndim == 2:     # every rank holds all of it: transposed locally (a force point)
        return wrap(elementwise.rep_base_from_numpy(a.context, a.to_numpy(_reason="transpose").T))
    res = matmul_recording.record_transpose(a.context, a._leaf())
    return a if res.base is a._base and res.view == a._view else copy_of_view(wrap(res), a,
                                                                               "a.T / transpose / swapaxes")


_NOT_GIVEN: Any = object()


def where(cond: Any, x: Any = _NOT_GIVEN, y: Any = _NOT_GIVEN) -> Any:
    """``x`` where ``cond`` is true, else ``y`` (recorded, elementwise, NumPy's dtype rules); ``where(cond)`` alone
    is ``nonzero(cond)`` (a collective step). One of ``x``, ``y`` alone: NumPy's ValueError."""
    if x is _NOT_GIVEN and y is _NOT_GIVEN:
        if isinstance(cond, DistArray) and "nonzero" in _METHODS:
            return _METHODS["nonzero"](cond)        # numpy.where(cond) is nonzero(cond) (numpy_reshaping)
        return np.where(cond)
    if x is _NOT_GIVEN or y is _NOT_GIVEN:
        raise ValueError("either both or neither of x and y should be given")
    if any(ufuncs.foreign(v) for v in (cond, x, y)) and any(isinstance(v, DistArray) for v in (cond, x, y)):
        return fallback.call(np.where, (cond, x, y), {}, "where")   # None, a string, a complex: NumPy's array
    if not any(isinstance(v, DistArray) for v in (cond, x, y)):
        return np.where(cond, x, y)
    ctx = _context_from(cond, x, y)
    args = [v._leaf() if isinstance(v, DistArray) else v for v in (cond, x, y)]
    return wrap(elementwise.record_where(ctx, *args))


def roll(a: Any, shift: Any, axis: Any = None) -> Any:
    """``numpy.roll`` along one axis or several: a new array, recorded (nothing moves yet) as copies of the
    pieces of ``a`` into it (two per rolled axis); an elementwise operation reading the result reads the
    pieces of ``a`` in place instead (:mod:`.piece_inlining`; along the distributed axis the rows a rank lacks come
    from their owner, wrapping around from the last rank to the first). Shifts are taken modulo the axis
    length, as NumPy's. Callable on every rank alike (SPMD), not blocking."""
    if not isinstance(a, DistArray):
        return np.roll(a, shift, axis)
    if axis is None:           # NumPy rolls the flattened array and restores the shape
        if a.ndim == 1:
            return roll(a, shift, 0)
        return roll(a.reshape(-1), shift, 0).reshape(a.shape)
    try:                       # NumPy broadcasts shift against axis and adds the shifts of a repeated axis
        pairs = [(operator.index(s), operator.index(ax)) for s, ax in np.broadcast(shift, axis)]
    except ValueError:
        raise ValueError("'shift' and 'axis' should be scalars or 1D sequences of the same length") from None
    total = {}
    for s, ax in pairs:
        if not -a.ndim <= ax < a.ndim:
            raise np.exceptions.AxisError(ax, a.ndim)
        total[ax % a.ndim] = total.get(ax % a.ndim, 0) + s
    cur = a
    for ax, s in total.items():
        n = a.shape[ax]
        k = s % n if n else 0
        if k == 0:
            continue
        out = wrap(elementwise.result_leaf(cur.context, [cur._leaf()], cur.shape, cur.dtype))
        pre = (slice(None),) * ax
        out[pre + (slice(k, None),)] = cur[pre + (slice(0, n - k),)]
        out[pre + (slice(0, k),)] = cur[pre + (slice(n - k, n),)]
        cur = out
    if cur is a:               # nothing moved: still a new array, as NumPy's
        cur = wrap(elementwise.result_leaf(a.context, [a._leaf()], a.shape, a.dtype))
        cur[...] = a
    return cur


def _copyto(dst: Any, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    """``numpy.copyto`` into a DistArray, in place (recorded): ``dst[...] = src``, or with a mask
    ``dst[...] = where(mask, src, dst)``; NumPy's TypeError when ``casting`` forbids the copy (found by NumPy's
    copyto on empty stand-ins). A NumPy ``dst``: NumPy's copyto (distributed operands gathered). SPMD."""
    if not isinstance(dst, DistArray):
        return fallback.call(np.copyto, (dst, src), dict(casting=casting, where=where), "copyto")
    if isinstance(src, (DistArray, np.ndarray)):
        stand: Any = np.empty((1,), src.dtype)
    else:
        stand = src if np.ndim(src) == 0 else np.empty((1,), np.asarray(src).dtype)
    np.copyto(np.empty((0,), dst.dtype), stand, casting=casting)    # raises NumPy's error, if NumPy raises one
    if where is True:
        dst[...] = src
    else:
        dst[...] = globals()["where"](where, src, dst)


_FUNCTIONS = {
    np.where: where,
    np.dot: dot,
    np.transpose: transpose,
    np.roll: roll,
    np.copyto: _copyto,
    np.shape: lambda a: a.shape if isinstance(a, DistArray) else np.shape(a),
    np.ndim: lambda a: a.ndim if isinstance(a, DistArray) else np.ndim(a),
    np.size: lambda a, axis=None: (a.size if axis is None else a.shape[axis]) if isinstance(a, DistArray)
    else np.size(a, axis),
}
if hasattr(np, "astype"):    # numpy.astype (NumPy 2): the method
    _FUNCTIONS[np.astype] = lambda x, dtype, copy=True, device=None: x.astype(dtype, copy=copy)


def _print_options(arr: np.ndarray, a: DistArray) -> Any:
    """NumPy's print options now (``formatter`` and every other one kept: ``numpy.printoptions`` resets what it is
    not given), with ``threshold`` 0 when ``arr`` holds only the edges of ``a`` (:func:`_printable`), so that NumPy
    summarizes it as it would ``a``."""
    opts = np.get_printoptions()
    if arr.size != a.size:
        opts["threshold"] = 0
    return np.printoptions(**opts)


def _printable(a: DistArray) -> np.ndarray:
    """``a``, or for a large array an array of the edge elements that NumPy prints the same
    way (each long axis shortened to edge + 1 + edge elements). Collective."""
    opts = np.get_printoptions()
    edge = int(opts["edgeitems"])
    if a.size <= opts["threshold"] or a.ndim == 0:
        return a.to_numpy()
    n0 = a.shape[0]
    if n0 > 2 * edge:
        head = elementwise.replicate_leaf(a.context, DistArray(a._base, a._view.index(slice(0, edge)))
                                          ._leaf(), "print")
        tail = elementwise.replicate_leaf(a.context, DistArray(a._base, a._view.index(
            slice(n0 - edge, n0)))._leaf(), "print")
        held = (DistArray(head.base, head.view), DistArray(tail.base, tail.view))  # read below
        a.context.flush("print")
        assert held
        h = head.base.ensure()[head.view.numpy_index()]
        tl = tail.base.ensure()[tail.view.numpy_index()]
        arr = np.concatenate([h, h[:1], tl], axis=0)
    else:
        arr = a.to_numpy()
    for ax in range(1, arr.ndim):
        m = arr.shape[ax]
        if m > 2 * edge:
            idx = list(range(edge)) + [0] + list(range(m - edge, m))
            arr = np.take(arr, idx, axis=ax)
    return arr


fallback.register(DistArray=DistArray)
