"""Constructors of distributed arrays: ``zeros``, ``ones``, ``empty``, ``full``, ``arange``, ``from_numpy``, ``*_like``.

Every constructor takes ``dist=`` (``"block"`` by default, ``"cyclic"``,
``("block-cyclic", b)``, ``"replicated"`` or a Distribution) and ``comm=`` (default
``COMM_WORLD``). They are local: each rank fills only the rows it owns, from the same
arguments, without communicating (``from_numpy(x, root=r)`` is the exception: a collective
scatter from ``r``). Call them on every rank with the same arguments (SPMD).
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Optional, Tuple

import numpy as np

from ..core import runtime
from ..tracing import tracer as tracing
from ..core import waiting
from . import elementwise, fallback
from .array import _FUNCTIONS, _METHODS, DistArray, wrap
from .distribution import make_distribution
from .context import context_for
from .errors import DistArrayTimeout, UnsupportedOperation
from .graph import Base
from .indexing import View, c_contiguous

__all__ = ["zeros", "ones", "empty", "full", "arange", "from_numpy", "array", "asarray", "asanyarray",
           "ascontiguousarray", "require", "zeros_like", "ones_like", "empty_like", "full_like", "shares_memory",
           "may_share_memory"]

K_SCATTER = tracing.register_kind("distarray_scatter")


def _shape(shape: Any) -> Tuple[int, ...]:
    """A shape argument as a tuple of ints, with NumPy's errors (its texts) for what is not one."""
    if isinstance(shape, (int, np.integer)) or (hasattr(shape, "__index__") and not np.shape(shape)):
        shape = (shape,)   # a 0-d integer array too (a DistArray's is read on every rank), as NumPy's
    elif not hasattr(shape, "__iter__"):
        raise TypeError(f"expected a sequence of integers or a single integer, got '{shape}'")
    out = tuple(operator.index(s) for s in shape)
    if any(s < 0 for s in out):
        raise ValueError("negative dimensions are not allowed")
    return out


def _dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind not in "biuf":
        raise UnsupportedOperation(f"dtype {dt} is not supported by distributed arrays; use bool, integer or "
                                   "floating-point dtypes")
    return dt


def _new(shape, dtype, dist, comm, origin: str) -> Tuple[Base, Any]:
    ctx = context_for(comm)
    shape = _shape(shape)
    dt = _dtype(dtype)
    spec = "replicated" if not shape else dist
    d = make_distribution(spec, shape[0] if shape else 1, ctx.size)
    return Base(ctx, shape, dt, d, origin=origin), ctx


def _filled(shape, dtype, dist, comm, fill) -> DistArray:
    b, _ = _new(shape, dtype, dist, comm, "")
    b.set_local(fill(b.local_shape(), b.dtype))
    return DistArray(b, View.full(b.shape))


def _pooled(shape, dtype, dist, comm, value) -> DistArray:
    """A new array set to the scalar ``value`` when its buffer is taken (``Base.ensure``: by the first operation
    that runs on it in a force point, or ``.local``), from the pool when it holds a dead base's buffer that fits,
    one released earlier in the same force point included (:mod:`~.releases`). So a time loop's ``zeros(n)`` each
    step takes the buffer of an array dead two steps before, on the program's first run too (wave_equation on 2
    ranks: 129 fresh buffers in its first run when the fill was done at the call). Local."""
    b, _ = _new(shape, dtype, dist, comm, "")
    b.fill = np.array(value, dtype=b.dtype)[()]
    return DistArray(b, View.full(b.shape))


def zeros(shape, dtype=np.float64, order="C", *, dist="block", comm=None) -> DistArray:
    """A new array of zeros. Local (no communication). ``order`` (NumPy's memory order) is checked as NumPy
    checks it, and has no other effect: a distributed array has no memory order a program can see."""
    _check_order(order)
    return _pooled(shape, dtype, dist, comm, 0)


def ones(shape, dtype=np.float64, order="C", *, dist="block", comm=None) -> DistArray:
    """A new array of ones. Local. ``order``: as in :func:`zeros`."""
    _check_order(order)
    return _pooled(shape, dtype, dist, comm, 1)


def empty(shape, dtype=np.float64, order="C", *, dist="block", comm=None) -> DistArray:
    """A new uninitialized array. Local. Its local buffer is taken on first use, from a dead base of the same
    local shape when the pool holds one (``concatenate``'s result, a grid's stacked form that is never used
    as a whole, fault in no pages up front). ``order``: as in :func:`zeros`."""
    _check_order(order)
    b, _ = _new(shape, dtype, dist, comm, "")
    return DistArray(b, View.full(b.shape))


def full(shape, fill_value, dtype=None, order="C", *, dist="block", comm=None) -> DistArray:
    """A new array filled with ``fill_value`` (dtype as ``numpy.full``). Local. ``order``: as in :func:`zeros`."""
    _check_order(order)
    dt = np.asarray(fill_value).dtype if dtype is None else dtype
    if dtype is None and isinstance(fill_value, float):
        dt = np.float64
    return _filled(shape, dt, dist, comm, lambda s, d: np.full(s, fill_value, dtype=d))


def arange(start, stop=None, step=1, dtype=None, dist="block", comm=None) -> DistArray:
    """Evenly spaced values in ``[start, stop)`` like ``numpy.arange`` (1-D). Local."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ZeroDivisionError("arange: step must not be zero (NumPy raises ZeroDivisionError too)")
    n = max(0, int(np.ceil((stop - start) / step)))
    # NumPy's result dtype comes from start, stop and step together (arange(12.0) is float64)
    if dtype is None:
        dtype = np.result_type(*(np.asarray(v) for v in (start, stop, step)))
    dt = _dtype(dtype)
    head = _arange_head(start, step, n, dt)     # NumPy's conversion errors, before anything is allocated
    b, ctx = _new((n,), dt, dist, comm, f"arange({start!r},{stop!r},{step!r})")
    b.set_local(_arange_values(head, n, b.dist.global_rows(ctx.rank)))
    return DistArray(b, View.full((n,)))


def _arange_head(start: Any, step: Any, n: int, dt: np.dtype) -> np.ndarray:
    """The first two elements of ``numpy.arange(start, ., step, dtype=dt)`` of length ``n`` (zeros past ``n``):
    NumPy stores ``start`` and ``start + step`` (Python arithmetic) with the dtype's own conversion of a scalar:
    ``int()`` then the bounds check for an integer ``dt`` (``OverflowError: Python integer -1 out of bounds for
    uint8`` for ``-1.9`` or ``numpy.int64(-1)``), ``float()`` rounded to a float ``dt``, truth for bool. NumPy's
    ``TypeError`` for a bool ``dt`` longer than 2. Local, the same on every rank."""
    conv = bool if dt.kind == "b" else int if dt.kind in "iu" else float
    head = np.zeros(2, dt)
    if n > 0:
        head[0] = conv(start)
    if n > 1:
        head[1] = conv(start + step)
    if n > 2 and dt.kind == "b":
        raise TypeError("arange() is only supported for booleans when the result has at most length 2.")
    return head


def _arange_values(head: np.ndarray, n: int, g: np.ndarray) -> np.ndarray:
    """The elements at global indices ``g`` (int64) of an ``arange`` of length ``n`` whose first two elements are
    ``head`` (:func:`_arange_head`), bit for bit ``numpy.arange``'s: NumPy fills element ``i`` with
    ``first + i * delta`` computed in the dtype itself, ``delta`` being the second element minus the first in that
    dtype (``arange(0, 1, 0.1, dtype=float32)[9]`` is 0.90000004: ``0.1`` rounded to float32, times 9 in float32).
    Integer dtypes wrap as C integers do (computed modulo 2**64 here, then cast); float16 is computed in float32
    and rounded, as NumPy's fill does. Local."""
    dt = head.dtype
    if n <= 2:
        return head[g]
    if dt.kind in "iu":
        h = head.astype(np.uint64)              # two's complement: exact modulo 2**64
        return (h[:1] + g.astype(np.uint64) * (h[1:] - h[:1])).astype(dt)
    ct = np.dtype(np.float32) if dt == np.float16 else dt
    h = head.astype(ct)
    with np.errstate(all="ignore"):             # NumPy's fill reports no floating-point error
        vals = h[0] + g.astype(ct) * (h[1] - h[0])
        vals[g < 2] = h[g[g < 2]]               # the stored start and start + step, not recomputed
        return vals.astype(dt, copy=False)


def from_numpy(x: Any, dist="block", comm=None, root: Optional[int] = None) -> DistArray:
    """A distributed array with the values of the NumPy array ``x``.

    ``root=None`` (default): every rank passes the same ``x`` and keeps its own rows (local, no
    communication). ``root=r``: only rank ``r``'s ``x`` matters (the others may pass None); its
    rows are scattered (collective, non-blocking scatter waited with ``NBMPI_TIMEOUT``).
    """
    ctx = context_for(comm)
    if root is None:
        a = np.asarray(x)
        b, _ = _new(a.shape, a.dtype, dist, comm, "")
        if b.replicated:
            b.set_local(np.array(a, copy=True, order="C"))
        elif b.dist.kind == "block":
            lo, hi = b.dist.block_range(ctx.rank)
            b.set_local(np.array(a[lo:hi], copy=True, order="C"))
        else:
            b.set_local(np.ascontiguousarray(a[b.dist.global_rows(ctx.rank)]))
        return DistArray(b, View.full(b.shape))
    return _scatter(ctx, x, dist, comm, root)


def _scatter(ctx, x, dist, comm, root: int) -> DistArray:
    MPI = runtime.MPI()
    ctx.ensure_comm()
    tr = tracing.get_tracer()
    rank, size = ctx.rank, ctx.size
    if not 0 <= root < size:
        raise ValueError(f"from_numpy: root {root} is not a rank of the communicator (0..{size - 1})")
    hdr = np.zeros(34, dtype=np.int64)
    if rank == root:
        a = np.ascontiguousarray(np.asarray(x))
        _dtype(a.dtype)
        if a.ndim > 30:
            raise UnsupportedOperation("from_numpy: at most 30 dimensions")
        code = np.frombuffer(a.dtype.str.encode().ljust(8, b" "), dtype=np.int64)[0]
        hdr[0], hdr[1], hdr[2:2 + a.ndim] = a.ndim, code, a.shape
    t0 = time_ns()
    req = ctx.dcomm.Ibcast(hdr, root=root)
    waiting.wait(req, ctx.timeout, rank, root, f"from_numpy(root={root}): header", DistArrayTimeout,
                 cancellable=False)
    nd = int(hdr[0])
    shape = tuple(int(s) for s in hdr[2:2 + nd])
    dt = np.dtype(np.array([hdr[1]], dtype=np.int64).tobytes().decode().strip())
    b, _ = _new(shape, dt, dist, comm, "")
    local = np.empty(b.local_shape(), dtype=dt)
    row_elems = int(np.prod(shape[1:], dtype=np.int64)) if nd else 1
    if b.replicated:
        if rank == root:
            local[...] = a
        req = ctx.dcomm.Ibcast([local, MPI.BYTE], root=root)
    else:
        counts = np.array([b.dist.local_count(r) * row_elems * dt.itemsize for r in range(size)], dtype=np.int64)
        displs = np.zeros(size, dtype=np.int64)
        displs[1:] = np.cumsum(counts)[:-1]
        sendbuf = None
        if rank == root:
            parts = [a[b.dist.global_rows(r)].reshape(-1) for r in range(size)]
            sendbuf = [np.concatenate(parts).view(np.uint8) if parts else np.empty(0, np.uint8), (counts, displs),
                       MPI.BYTE]
        req = ctx.dcomm.Iscatterv(sendbuf, [local.reshape(-1).view(np.uint8), MPI.BYTE], root=root)
    waiting.wait(req, ctx.timeout, rank, root, f"from_numpy(root={root}): scatter", DistArrayTimeout,
                 cancellable=False)
    t1 = time_ns()
    if tr.enabled:
        tr.record(K_SCATTER, tracing.DIR_NONE, -1, 0, local.nbytes, t0, t1, wait=-1, seq=ctx.flush_no,
                  chan=ctx.chan, count=size)
    b.set_local(local)
    return DistArray(b, View.full(shape))


def from_local(local: np.ndarray, like: DistArray) -> DistArray:
    """A new array of ``like``'s shape and layout whose rows on this rank are ``local`` (this rank's
    block, e.g. computed from ``like.local``; its dtype is the result's). Local. A C-contiguous ``local`` is
    not copied: the array uses its memory, which the caller still holds (so the base counts as exported)."""
    b, _ = _new(like.shape, local.dtype, like.dist, like.comm, "local blocks")
    b.set_local(np.ascontiguousarray(local).reshape(b.local_shape()))
    b.exported = True
    return DistArray(b, View.full(like.shape))


def time_ns() -> int:
    import time

    return time.perf_counter_ns()


def array(x: Any, dtype=None, dist="block", comm=None, *, copy: Any = True, order: Any = "K", ndmin: int = 0,
          subok: bool = False, like: Any = None) -> DistArray:
    """``from_numpy(numpy.array(x, dtype, order=order, ndmin=ndmin), dist)`` (every rank passes the same data; a
    DistArray ``x`` is gathered first: a copy). ``order`` has no other effect (no memory order a program can see)."""
    if isinstance(x, DistArray) and ndmin <= x.ndim:
        if copy is False and dtype is not None and np.dtype(dtype) != x.dtype:
            raise ValueError("Unable to avoid copy while creating an array as requested.")
        return x.astype(x.dtype if dtype is None else dtype, copy=bool(copy))    # copy=None: x itself if it can
    return from_numpy(np.array(x, dtype=dtype, order=order, ndmin=ndmin), dist=dist, comm=comm)


def asarray(x: Any, dtype=None, dist="block", comm=None, *, order: Any = None, copy: Any = None,
            device: Any = None, like: Any = None) -> DistArray:
    """``x`` itself if it is a DistArray of ``dtype`` (or ``dtype`` is None) and ``copy`` is not True, a
    recorded ``astype`` of it otherwise, else :func:`array` of it (every rank passes the same data)."""
    if isinstance(x, DistArray):
        if copy:
            return x.astype(x.dtype if dtype is None else dtype)
        return x if dtype is None else x.astype(dtype, copy=False)
    return array(x, dtype=dtype, dist=dist, comm=comm, order=order if order is not None else "K")


def asanyarray(x: Any, dtype=None, order: Any = None, *, like: Any = None, **kwargs: Any) -> DistArray:
    """``numpy.asanyarray``: :func:`asarray` (``x`` itself if it is a DistArray of ``dtype``)."""
    return asarray(x, dtype=dtype, order=order, **kwargs)


def ascontiguousarray(x: Any, dtype=None, *, like: Any = None) -> DistArray:
    """``numpy.ascontiguousarray``: a DistArray ``x`` of ``dtype`` (or ``dtype`` None) itself when NumPy's
    array would be C-contiguous (the whole array, a row, a run of rows), else a copy; a 0-d array becomes 1-d,
    as in NumPy. Anything else: :func:`array` of it (at least 1-d). Local for ``x`` itself, else recorded."""
    if isinstance(x, DistArray) and x.ndim:
        y = x if dtype is None or np.dtype(dtype) == x.dtype else x.astype(dtype)
        return y if y is not x or c_contiguous(x._view) else x.copy()
    if isinstance(x, DistArray):
        return x.reshape(1).astype(x.dtype if dtype is None else dtype)
    return array(x, dtype=dtype, ndmin=1)


_REQUIREMENTS = {"C": "C", "C_CONTIGUOUS": "C", "CONTIGUOUS": "C", "A": "A", "ALIGNED": "A", "W": "W",
                 "WRITEABLE": "W", "O": "O", "OWNDATA": "O", "E": "E", "ENSUREARRAY": "E"}


def require(a: Any, dtype=None, requirements: Any = None, *, like: Any = None) -> Any:
    """``numpy.require`` of a DistArray: ``a`` itself when it meets ``requirements`` (C-contiguous, aligned,
    writeable, owning its data, an array) with ``dtype``, else a copy that does, as NumPy decides it. Fortran order
    (not a property a distributed array has) and non-DistArray operands: NumPy's, through the fallback."""
    reqs = [requirements] if isinstance(requirements, str) else list(requirements or [])
    got = {_REQUIREMENTS.get(str(r).upper()) for r in reqs}
    if not isinstance(a, DistArray) or None in got:
        return fallback.call(np.require, (a,), dict(dtype=dtype, requirements=requirements), "require")
    fallback.note_native("require")
    res = a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    if res is a and ("O" in got and not a._view.is_full or "W" in got and a._base.read_only
                     or "C" in got and not c_contiguous(a._view)):
        res = a.copy()
    return res


def _memory_relation(numpy_test: Any, a: Any, b: Any, max_work: Any) -> Any:
    """``numpy_test`` (``numpy.shares_memory`` or ``may_share_memory``) of two DistArrays as NumPy would answer
    it for their views: False for different bases (a copy never shares, nor do a DistArray and a NumPy array),
    else NumPy's answer for the two views over a stand-in array of the base's shape (C-order addresses of one
    byte an element, nothing allocated). Local, no communication."""
    if not isinstance(a, DistArray) and not isinstance(b, DistArray):
        return numpy_test(a, b) if max_work is None else numpy_test(a, b, max_work)
    if not (isinstance(a, DistArray) and isinstance(b, DistArray)) or a._base is not b._base:
        return False
    shape = tuple(a._base.shape)
    strides = tuple(int(np.prod(shape[k + 1:], dtype=np.int64)) for k in range(len(shape)))
    # C-order addresses over one real byte: NumPy's tests only compute with addresses, never read them
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=np.uint8), shape=shape, strides=strides)
    va, vb = stand_in[a._view.numpy_index()], stand_in[b._view.numpy_index()]
    return numpy_test(va, vb) if max_work is None else numpy_test(va, vb, max_work)


def shares_memory(a: Any, b: Any, max_work: Any = None) -> bool:
    """``numpy.shares_memory``: whether views ``a`` and ``b`` of one distributed array have an element in common
    (see :func:`_memory_relation`). Local; every rank answers alike."""
    return bool(_memory_relation(np.shares_memory, a, b, max_work))


def may_share_memory(a: Any, b: Any, max_work: Any = None) -> bool:
    """``numpy.may_share_memory``: NumPy's bounds test for views ``a`` and ``b`` of one distributed array (see
    :func:`_memory_relation`). Local; every rank answers alike."""
    return bool(_memory_relation(np.may_share_memory, a, b, max_work))


_SETFLAGS_WARNED: dict = {}


def _setflags(a: DistArray, write: Any = None, align: Any = None, uic: Any = None) -> None:
    """``a.setflags(write=...)``: a distributed array is not made read-only, so ``write=False`` warns (rank 0,
    once per line) that writes still succeed; ``write=True`` on one of NumPy's read-only results (``diagonal``,
    ``broadcast_to``) raises NumPy's ValueError; ``align`` and ``uic`` change nothing. Local."""
    if write is None:
        return
    if write and a._base.read_only:
        raise ValueError("cannot set WRITEABLE flag to True of this array")
    if not write and a.context.rank == 0:
        site = fallback._call_site()
        warnings.warn_explicit("a.setflags(write=False) does not make a distributed array read-only: writes into "
                               "it still succeed", UserWarning, site[0], site[1], registry=_SETFLAGS_WARNED)


def _like_dist(a: DistArray, dist):
    return a.dist if dist is None else dist


def _check_order(order: Any, like: bool = False) -> None:
    """NumPy's error for an ``order`` NumPy refuses (checked by NumPy on an empty stand-in); a valid one has no
    effect on a distributed array (no memory order a program can see)."""
    if order not in ("C", "F", "K", "A", None) or (not like and order not in ("C", "F", None)):
        np.empty_like(np.empty((0,)), order=order) if like else np.empty((0,), order=order)


def _like(a: Any, dtype: Any, order: Any, subok: bool, shape: Any, dist: Any) -> Tuple[Tuple[int, ...], Any, Any]:
    """``(shape, dtype, dist)`` of a ``*_like`` result: ``a``'s unless given (NumPy's ``shape=`` too)."""
    _check_order(order, like=True)
    return (a.shape if shape is None else _shape(shape)), (a.dtype if dtype is None else dtype), _like_dist(a, dist)


def zeros_like(a: DistArray, dtype=None, order="K", subok=True, shape=None, *, device=None, dist=None) -> DistArray:
    """Zeros with ``a``'s shape (or ``shape``), dtype (or ``dtype``) and kind of distribution. Local."""
    sh, dt, d = _like(a, dtype, order, subok, shape, dist)
    return zeros(sh, dt, dist=d, comm=a.comm)


def ones_like(a: DistArray, dtype=None, order="K", subok=True, shape=None, *, device=None, dist=None) -> DistArray:
    """Ones with ``a``'s shape (or ``shape``), dtype (or ``dtype``) and kind of distribution. Local."""
    sh, dt, d = _like(a, dtype, order, subok, shape, dist)
    return ones(sh, dt, dist=d, comm=a.comm)


def empty_like(a: DistArray, dtype=None, order="K", subok=True, shape=None, *, device=None, dist=None) -> DistArray:
    """An uninitialized array like ``a`` (or of ``shape``). Local."""
    sh, dt, d = _like(a, dtype, order, subok, shape, dist)
    return empty(sh, dt, dist=d, comm=a.comm)


def full_like(a: DistArray, fill_value, dtype=None, order="K", subok=True, shape=None, *, device=None,
              dist=None) -> DistArray:
    """An array like ``a`` (or of ``shape``) filled with ``fill_value``. Local."""
    sh, dt, d = _like(a, dtype, order, subok, shape, dist)
    return full(sh, fill_value, dt, dist=d, comm=a.comm)


def _astype(a: DistArray, dtype: Any, order: str = "K", casting: str = "unsafe", subok: bool = True,
            copy: bool = True) -> DistArray:
    """``a.astype(dtype, order, casting, subok, copy)``: a new array of ``dtype`` (recorded), or ``a`` itself when
    ``copy`` is false and the dtype is ``a``'s. NumPy's errors for a bad ``order`` or ``casting`` and for a cast
    the ``casting`` rule forbids (checked by NumPy on an empty stand-in, on every rank). Local. A dtype a
    distributed array cannot hold (strings, objects, complex, dates) gives NumPy's array, through the NumPy fallback
    (gathered on every rank: collective)."""
    np.empty((0,), a.dtype).astype(dtype, order=order, casting=casting, subok=subok)
    if np.dtype(dtype).kind not in "biuf":
        return fallback.call(np.ndarray.astype, (a, dtype), dict(order=order, casting=casting, subok=subok,
                                                                copy=copy), "astype")
    if not copy and np.dtype(dtype) == a.dtype:
        return a
    return wrap(elementwise.record_cast(a.context, a._leaf(), dtype))


def _copy(a: DistArray, order: str = "C") -> DistArray:
    """``a.copy(order)``: a new array with ``a``'s values, laid out like ``a`` (recorded; ``order`` is checked as
    NumPy checks it and has no other effect). Local."""
    np.empty((0,)).copy(order=order)
    return wrap(elementwise.record_cast(a.context, a._leaf(), a.dtype))


def _no_pickle(a: DistArray, protocol: Any = None) -> Any:
    raise TypeError("a DistArray cannot be pickled: its parts live on every rank. Pickle a.to_numpy() (every rank "
                    "must call to_numpy) and distribute it again with asarray()")


def _hash(a: DistArray) -> int:
    """``hash(a)``: NumPy's scalar hash for a 0-d array (a reduction's result, ``a[i]``, which stands for NumPy's
    scalar: a dict key, a set member; a force point, collective), NumPy's TypeError for an array."""
    if a.ndim:
        raise TypeError(f"unhashable type: '{type(a).__name__}'")
    return hash(a.item())


def _trunc(a: DistArray) -> int:
    """``math.trunc(a)`` of a 0-d array (NumPy's scalar's); NumPy's TypeError for an array. A force point."""
    if a.ndim:
        raise TypeError(f"type {type(a).__name__} doesn't define __trunc__ method")
    return math.trunc(a.item())


def _scalar_method(name: str) -> Any:
    """``a.NAME(*args)`` of a 0-d array, as NumPy's scalar of its dtype has the method (``is_integer``,
    ``as_integer_ratio``, ``hex``, ``bit_count``): a force point, collective. An array with dimensions, or a dtype
    whose scalar lacks it, raises AttributeError as NumPy's does."""
    def method(a: DistArray, *args: Any) -> Any:
        if a.ndim:
            raise AttributeError(f"'{type(a).__name__}' object has no attribute {name!r}")
        v = np.asarray(a)[()]
        if not hasattr(v, name):
            raise AttributeError(f"'numpy.{type(v).__name__}' object has no attribute {name!r}")
        return getattr(v, name)(*args)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = (f"``a.{name}()`` of a 0-d array (a reduction's result, ``a[i]``), as NumPy's scalar of its "
                      "dtype has it: a force point, collective. Arrays with dimensions have no such method.")
    return method


DistArray.__hash__ = _hash
DistArray.__trunc__ = _trunc
for _name in ("is_integer", "as_integer_ratio", "hex", "bit_count"):
    setattr(DistArray, _name, _scalar_method(_name))
DistArray.astype = _astype
DistArray.copy = _copy
DistArray.__copy__ = _copy                                   # copy.copy(a): NumPy's new array, not a shared one
DistArray.__deepcopy__ = lambda a, memo=None: _copy(a)       # copy.deepcopy(a)
DistArray.__reduce_ex__ = _no_pickle

# NumPy's *_like functions dispatch here through DistArray.__array_function__ (registered from this
# module, which the package always imports, so the array module need not import its constructors)
fallback.register(from_numpy=from_numpy, from_local=from_local)
_FUNCTIONS.update({np.zeros_like: zeros_like, np.ones_like: ones_like, np.empty_like: empty_like,
                   np.full_like: full_like, np.shares_memory: shares_memory, np.may_share_memory: may_share_memory})
_METHODS.update(setflags=_setflags)
