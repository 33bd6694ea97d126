"""Shared variables: creation, contributions, reading, and shared arithmetic.

:class:`SharedVar` (made by :func:`shared`) holds the same value on every
rank. Contributions (``x += a``, ``x *= a``, ``min_with``/``max_with``) are
appended to the fuser's current batch and resolved at the next force point;
shared arithmetic (``x * y``, ``s1 * s1 / N``) builds lazy results that are
themselves shared variables (float64 scalars: :class:`_LazyF8`). The hot
float64-scalar operators are those of the compiled core when it is built
(:mod:`.implementation`), else of :class:`_PyVarBase`, the pure-Python
reference with the same semantics. See the package docstring for the rules.
"""
from __future__ import annotations

import operator
import zlib
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from ..core.errors import SharedVariableError
from . import fusion as _fusion
from .fusion import Fuser, fuser
from .grants import Grant
from .implementation import core as _core
from .lazy import _apply, _ensure_done, _eval
from .pending import _NOD, _NOL, _Batch, _Derived, _Snap
from .wire import _F8, _NAN_KEY, CONSUME, MAX, MIN, OP_NAMES, PROD, SUM, W_C16, W_F8, W_I8, _ckey, _value_key


def _working(dtype: np.dtype) -> int:
    k = dtype.kind
    if k == "c":
        return W_C16
    if k == "f":
        return W_F8
    return W_I8


_WORK_DTYPE = {W_F8: np.dtype(np.float64), W_I8: np.dtype(np.int64), W_C16: np.dtype(np.complex128)}
_NUM_TYPES = (int, float, complex, bool, np.number, np.bool_)
_REAL_FAST = frozenset((float, int, np.float64, np.float32, np.int64, np.int32))


def _check_dtype(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind not in "biufc" or (dtype.kind == "u" and dtype.itemsize == 8):
        raise SharedVariableError(f"{where}: dtype {dtype} is not supported for shared variables; use a "
                                  "bool, int (up to int64), uint (up to uint32), float or complex dtype")
    return dtype


_VAR_SLOTS = ("_id", "dtype", "shape", "_kind", "_base", "_entries", "_ob", "_oi", "_oop", "_oblk", "_init",
              "_cast", "_lastb", "_sf", "_ksum", "name")


class _PyVarBase:
    """The fields of a shared variable and the pure-Python implementation of its hot
    operators (``reset``, ``+=``, ``-=``, ``*=``, ``min_with``, ``max_with``,
    ``float()``, ``+ - * /``).

    This is the reference implementation. When the compiled core is built
    (:mod:`.implementation`), :class:`SharedVar` derives from its ``VarBase`` instead,
    which does the common float64-scalar cases in C on the same fields and calls these
    methods (as plain functions, see :mod:`.binding`) for everything else."""

    __slots__ = _VAR_SLOTS

    def __float__(self) -> float:
        ents = self._entries
        base = self._base
        if not ents:
            if type(base) is float:
                return base
            if type(base) is _Derived:
                v = base.value
                if v is None:
                    v = _eval(base)
                if type(v) is float:
                    self._base = v
                    return v
        elif len(ents) == 1 and type(base) is float:
            op, b, blk, i, _ = ents[0]
            if op == 0 and blk == 0:   # one float64 sum slot: base + reduced word
                if not b.done:
                    _ensure_done(ents)
                v = base + b.res[0][i]
                self._base = v
                self._entries = ()   # (_ob is a resolved batch now, never the current one)
                return v
        return float(self.value)

    def reset(self, value: Any = None) -> "SharedVar":
        """Set the variable back to its creation value, or to ``value``, which must be
        the same on every rank (checked at the next force point). Local, no force;
        pending contributions of this variable are dropped from its value."""
        if value is None:
            init = self._init
            if init is not None:
                self._base = init
                if self._entries:
                    self._entries = ()
                    self._ob = None
                return self
        if isinstance(value, SharedVar):
            return self.assign(value)
        if value is None:
            if self._init is None:
                raise SharedVariableError(f"shared variable #{self._id} is an intermediate result and has "
                                          "no creation value; pass reset(value)")
            v = self._init
        else:
            v = self._coerce_uniform(value, "reset")
            fuser().batch.note((-8, self._id, _value_key(v)))
        self._base = v
        self._entries = ()
        self._ob = None
        return self

    def _fast_sum(self, a: float) -> "SharedVar":
        """``x += a`` for a float64 scalar variable and a real number (the hot path: a few
        attribute writes; the signature step is the int ``id << 3``, decoded on the error
        path by :meth:`Fuser._exchange_logs`)."""
        e = _fusion._FUSER
        b = e._batch
        if self._ob is b and self._oop == 0:
            b.f8[self._oi] += a
            return self
        f8 = b.f8
        i = len(f8)
        f8.append(a)
        ents = self._entries
        if len(ents) == 1 and type(self._base) is float:
            op, ob, blk, j, _ = ents[0]
            if op == 0 and blk == 0 and ob.done:   # a resolved sum nobody read: fold it in (bounded entries)
                self._base += ob.res[0][j]
                ents = ()
        self._entries = ents + ((0, b, 0, i, None),)
        self._ob = b
        self._oi = i
        self._oop = 0
        self._oblk = 0
        if self._lastb is not b:
            self._lastb = b
            b.nvars += 1
        b.log.append(self._ksum)
        if i > b.room:
            e.flush()
        return self

    def __iadd__(self, a):
        if self._sf:
            if type(a) is float:
                return self._fast_sum(a)
            if type(a) in _REAL_FAST:
                return self._fast_sum(float(a))
        if isinstance(a, SharedVar):
            return self._local_inplace(operator.add, a)
        return self._contribute(SUM, a)

    def __isub__(self, a):
        if self._sf and type(a) in _REAL_FAST:
            return self._fast_sum(-float(a))
        if isinstance(a, SharedVar):
            return self._local_inplace(operator.sub, a)
        return self._contribute(SUM, _neg(a))

    def __imul__(self, a):
        if isinstance(a, SharedVar):
            return self._local_inplace(operator.mul, a)
        return self._contribute(PROD, a)

    def min_with(self, a) -> "SharedVar":
        """``x = min(x, min over ranks of a)`` (a rank-local) or elementwise min with shared ``a``
        (NaN wins, as in every reduction: :mod:`nbmpi.workers.core.kernels`). Lazy, local."""
        if isinstance(a, SharedVar):
            return self._local_inplace(np.minimum, a)
        self._no_complex("min_with")
        return self._contribute(MIN, a)

    def max_with(self, a) -> "SharedVar":
        """``x = max(x, max over ranks of a)`` (a rank-local) or elementwise max with shared ``a``
        (NaN wins, as in every reduction: :mod:`nbmpi.workers.core.kernels`). Lazy, local."""
        if isinstance(a, SharedVar):
            return self._local_inplace(np.maximum, a)
        self._no_complex("max_with")
        return self._contribute(MAX, a)

    def __add__(self, a):
        if isinstance(a, SharedVar):
            if self._sf and a._sf and (type(a) is _LazyF8 or type(a) is SharedVar):
                return _f8_binary(operator.add, 1, self, a, True, True)
            return _binary(operator.add, self, a)
        return self.copy()._contribute(SUM, a)

    __radd__ = __add__

    def __sub__(self, a):
        if isinstance(a, SharedVar):
            if self._sf and a._sf and (type(a) is _LazyF8 or type(a) is SharedVar):
                return _f8_binary(operator.sub, 2, self, a, True, True)
            return _binary(operator.sub, self, a)
        return self.copy()._contribute(SUM, _neg(a))

    def __rsub__(self, a):
        return _unary(operator.neg, self)._contribute(SUM, a)

    def __mul__(self, a):
        return _scaling(self, a, operator.mul, 3)

    def __rmul__(self, a):
        return _rscaling(self, a, operator.mul, 3)

    def __truediv__(self, a):
        return _scaling(self, a, operator.truediv, 4)

    def __rtruediv__(self, a):
        return _rscaling(self, a, operator.truediv, 4)


def _scaling(self: "SharedVar", a: Any, fn, code: int) -> "SharedVar":
    """``self * a`` / ``self / a``: a float/int ``a`` is a uniform operand, a shared one is local arithmetic."""
    if self._sf:
        ta = type(a)
        if ta is float or ta is int:
            return _f8_binary(fn, code, self, a, True, False)
        if (ta is _LazyF8 or ta is SharedVar) and a._sf:
            return _f8_binary(fn, code, self, a, True, True)
    return _binary(fn, self, a)


def _rscaling(self: "SharedVar", a: Any, fn, code: int) -> "SharedVar":
    """``a * self`` / ``a / self`` for a non-shared ``a`` (a uniform operand)."""
    if self._sf and (type(a) is float or type(a) is int):
        return _f8_binary(fn, code, a, self, False, True)
    return _binary(fn, a, self)


class SharedVar(_core.VarBase if _core is not None else _PyVarBase):  # type: ignore[misc]
    """A value replicated on every rank (scalar or numpy array), updated lazily.

    Create with :func:`shared` (collective in meaning, no communication):
    every rank must create its shared variables in the same order with the
    same value. See the module docstring for the meaning of each operator.
    Attributes ``shape``, ``dtype``, ``ndim``, ``size``, ``name`` never force.
    """

    __slots__ = ("__weakref__",)
    __array_priority__ = 1000

    def __init__(self, value: Any, name: Optional[str] = None, _check: bool = True):
        e = _fusion._FUSER or fuser()
        vid = self._id = e.next_id
        e.next_id = vid + 1
        self.name = name
        if type(value) is float:   # the common case, inline (same result as _setup below)
            self.dtype = _F8
            self.shape = ()
            self._kind = W_F8
            self._base = value
            self._entries = ()
            self._ob = None
            self._oi = 0
            self._oop = -1
            self._oblk = 0
            self._lastb = None
            self._sf = True
            self._ksum = vid << 3
            self._cast = float
            self._init = value
            if _check:
                if value == value:
                    e.batch.note_created(vid, value)
                else:
                    e.batch.note((-8, vid, _NAN_KEY))
            return
        if type(value) is np.ndarray and value.ndim:   # an array: the same steps as below, fewer calls
            dtype = _check_dtype(value.dtype, "shared(ndarray)")
            v = value.copy()
            v.flags.writeable = False
            self._setup(dtype, v.shape, v)
            self._init = v
            if _check:
                e.batch.note((-8, vid, (-2, zlib.crc32(v), v.shape, dtype.num)))   # = _value_key(v)
            return
        if isinstance(value, SharedVar):
            raise SharedVariableError("shared(x) of a shared variable: use x.copy() (or shared arithmetic)")
        if isinstance(value, (float, int)) and not isinstance(value, bool):
            dtype = _F8 if isinstance(value, float) else np.dtype(np.int64)
            shape: tuple = ()
            v = float(value) if isinstance(value, float) else np.int64(value)
        else:
            arr = np.asarray(value)
            dtype = _check_dtype(arr.dtype, f"shared({type(value).__name__})")
            shape = arr.shape
            if shape == ():
                v = float(arr) if dtype == _F8 else arr[()]
            else:
                v = arr.copy()
                v.flags.writeable = False
        self._setup(dtype, shape, v)
        self._init = v
        if _check:
            e.batch.note((-8, self._id, _value_key(v)))

    def _setup(self, dtype: np.dtype, shape: tuple, base: Any) -> None:
        self.dtype = dtype
        self.shape = shape
        self._kind = _working(dtype)
        self._base = base
        self._entries: tuple = ()   # pending (op, batch, block, index, extra), program order
        self._ob = None
        self._oi = 0
        self._oop = -1
        self._oblk = 0
        self._lastb = None
        self._sf = shape == () and dtype == _F8
        self._ksum = self._id << 3   # signature step of a float64 scalar sum (decoded in Fuser._exchange_logs)
        if shape == ():
            self._cast = float if dtype == _F8 else dtype.type
        else:
            self._cast = _CASTERS.get(dtype) or _array_caster(dtype)

    @classmethod
    def _derived(cls, base: Any, dtype: np.dtype, shape: tuple) -> "SharedVar":
        self = SharedVar.__new__(SharedVar)
        e = fuser()
        self._id = e.next_id
        e.next_id += 1
        self.name = None
        self._setup(dtype, shape, base)
        self._init = None
        return self

    # -- introspection (no force) -------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def id(self) -> int:
        """Creation index: the identity of this variable across ranks."""
        return self._id

    @property
    def pending(self) -> bool:
        """True if this variable's value still needs communication (local, no force)."""
        base = self._base
        if (type(base) is _Derived and base.value is None) or (type(base) is _Snap and base.entries):
            return True
        return any(not ent[1].done for ent in self._entries)

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        if not self._entries and type(self._base) is not _Derived and type(self._base) is not _Snap:
            return f"SharedVar#{self._id}{label}({self._base!r})"
        shp = "" if self.shape == () else f" shape={self.shape}"
        return f"SharedVar#{self._id}{label}(<lazy: {len(self._entries)} pending update(s)> dtype={self.dtype}{shp})"

    # -- reading (force points) ------------------------------------------------------
    @property
    def value(self) -> Any:
        """The value (same on every rank). Force point if anything is pending.

        Scalars come back as Python float (float64) or numpy scalars, arrays
        as read-only numpy arrays.
        """
        base = self._base
        if not self._entries and type(base) is not _Derived and type(base) is not _Snap:
            return base
        return self._resolve()

    @value.setter
    def value(self, v: Any) -> None:
        self.assign(v)

    def _resolve(self) -> Any:
        ents = self._entries
        base = self._base
        if len(ents) == 1 and type(base) is np.ndarray:   # an array with one pending sum: the common read
            op, b, blk, i, _ = ents[0]
            if op == SUM and blk == 2:
                if not b.done:
                    _ensure_done(ents)
                v = base + b.res[2][i].reshape(self.shape)
                if v.dtype == self.dtype:
                    v.flags.writeable = False   # a new array already: what the cast would copy
                else:
                    v = self._cast(v)
                self._base = v
                self._entries = ()
                self._ob = None
                return v
        if self._entries:
            _ensure_done(self._entries)
        base = self._base
        if type(base) is _Derived or type(base) is _Snap:
            base = _eval(base)
        v = _apply(self._cast, self.shape, base, self._entries) if self._entries else base
        self._base = v
        self._entries = ()
        self._ob = None
        return v


    def __int__(self) -> int:
        return int(self.value)

    def __complex__(self) -> complex:
        return complex(self.value)

    def __index__(self) -> int:
        if self.dtype.kind not in "biu":
            raise TypeError(f"shared variable #{self._id} of dtype {self.dtype} cannot be used as an index")
        return int(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __array__(self, dtype=None, copy=None):
        v = np.asarray(self.value)
        if dtype is not None:
            v = v.astype(dtype)
        return v.copy() if copy else v

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of scalar shared variable #{self._id}")
        return self.shape[0]

    def __getitem__(self, idx):
        return self.value[idx]

    def __iter__(self):
        return iter(self.value)

    def __lt__(self, o):
        return self.value < _local(o)

    def __le__(self, o):
        return self.value <= _local(o)

    def __gt__(self, o):
        return self.value > _local(o)

    def __ge__(self, o):
        return self.value >= _local(o)

    def __eq__(self, o):  # type: ignore[override]
        return self.value == _local(o)

    def __ne__(self, o):  # type: ignore[override]
        return self.value != _local(o)

    __hash__ = None  # type: ignore[assignment]

    # -- assignment ----------------------------------------------------------------------
    def assign(self, other: "SharedVar") -> "SharedVar":
        """Make this variable equal to shared ``other`` (local, lazy). Assigning a
        rank-local value raises :class:`SharedVariableError`, as in CFL."""
        if not isinstance(other, SharedVar):
            raise SharedVariableError(
                f"assigning a rank-local value ({type(other).__name__}) to shared variable #{self._id} is "
                "not allowed: the ranks could end up with different values. Contribute it instead "
                "(x += a, x *= a, x.min_with(a), x.max_with(a)) or reset the variable to a value that is "
                "the same on every rank with x.reset(value)")
        self._rebase(_snap(other), other.dtype, other.shape)
        return self


    def copy(self) -> "SharedVar":
        """A new shared variable with this one's (possibly pending) value. Local."""
        return SharedVar._derived(_snap(self), self.dtype, self.shape)

    def _coerce_uniform(self, value: Any, what: str) -> Any:
        arr = np.asarray(value)
        if not np.can_cast(arr.dtype, self.dtype, "same_kind") and not isinstance(value, (int, float)):
            raise SharedVariableError(f"{what} of shared variable #{self._id} ({self.dtype}) with a value of "
                                      f"dtype {arr.dtype}; expected a value castable to {self.dtype}")
        try:
            arr = np.broadcast_to(arr.astype(self.dtype), self.shape)
        except ValueError:
            raise SharedVariableError(f"{what} of shared variable #{self._id}: shape {arr.shape} does not "
                                      f"broadcast to {self.shape}") from None
        if self.shape == ():
            return self._cast(arr[()])
        out = arr.copy()
        out.flags.writeable = False
        return out

    def _rebase(self, base: Any, dtype: np.dtype, shape: tuple) -> None:
        self._setup(dtype, shape, base)

    # -- contributions ---------------------------------------------------------------------
    def _contribute(self, op: int, a: Any) -> "SharedVar":
        """Contribute the rank-local ``a`` with operation ``op`` to this variable: appended
        to the fuser's current batch (or accumulated into this variable's last segment of
        the same op). Local; a force point only when the batch passes the threshold."""
        if isinstance(a, Grant):
            a = a.value
        e = fuser()
        if self.shape == ():
            return self._contribute_scalar(e, e.batch, op, self._scalar_operand(op, a))
        return self._contribute_array(e, e.batch, op, a)

    def _scalar_operand(self, op: int, a: Any) -> Any:
        """``a`` as a contribution to this scalar variable: a float, int or complex of its
        word kind; :class:`SharedVariableError` names what does not fit."""
        kind = self._kind
        if not isinstance(a, _NUM_TYPES):
            arr = np.asarray(a)
            if arr.shape != ():
                raise SharedVariableError(
                    f"{OP_NAMES[op]} contribution of shape {arr.shape} to scalar shared variable "
                    f"#{self._id}; expected a scalar (create the variable from an array for array "
                    "reductions)")
            a = arr[()]
        if kind == W_F8 and isinstance(a, (float, int)):
            return float(a)
        adt = np.asarray(a).dtype if not isinstance(a, (int, float, bool)) else None
        if kind == W_F8:
            if isinstance(a, complex) or (adt is not None and adt.kind == "c"):
                raise SharedVariableError(f"complex contribution to real shared variable #{self._id} "
                                          f"({self.dtype}); create it from a complex value")
            return float(a)
        if kind == W_I8:
            if isinstance(a, float) or (adt is not None and adt.kind not in "biu"):
                raise SharedVariableError(
                    f"{OP_NAMES[op]} contribution of a non-integer value ({a!r}) to integer shared "
                    f"variable #{self._id} ({self.dtype}); create the variable from a float value")
            return int(a)
        return complex(a)

    def _contribute_scalar(self, e: Fuser, b: _Batch, op: int, a: Any) -> "SharedVar":
        """:meth:`_contribute` of the scalar ``a`` (already of this variable's word kind)."""
        kind = self._kind
        if self._ob is b and self._oop == op:
            lst = b.f8 if self._oblk == 0 else (b.i8 if self._oblk == 1 else None)
            i = self._oi
            if lst is not None:
                lst[i] = _acc(op, lst[i], a)
            else:
                acc = b.arrs[i][0]
                acc[0] = _acc(op, complex(acc[0]), a)
            return self
        if kind == W_F8:
            i = len(b.f8)
            b.f8.append(a)
            if op != SUM:
                if b.f8_nonsum is _NOD:
                    b.f8_nonsum = {}
                b.f8_nonsum[i] = op
            blk, w = 0, 1
        elif kind == W_I8:
            if b.i8 is _NOL:
                b.i8, b.i8_ops = [], []
            b.i8.append(a)
            b.i8_ops.append(op)
            blk, i, w = 1, len(b.i8) - 1, 1
            b.allsum = False
        else:
            if b.arrs is _NOL:
                b.arrs = []
            b.arrs.append([np.array([a], dtype=np.complex128), op, W_C16])
            blk, i, w = 2, len(b.arrs) - 1, 2
            b.allsum = False
        if op != SUM and op != CONSUME:
            b.allsum = False
        return self._new_slot(e, b, op, blk, i, w, None)

    def _contribute_array(self, e: Fuser, b: _Batch, op: int, a: Any) -> "SharedVar":
        """:meth:`_contribute` to this shared array: ``a`` an array broadcastable to its shape
        and castable to its dtype (else :class:`SharedVariableError`), or a scalar."""
        kind = self._kind
        work = _WORK_DTYPE[kind]
        if type(a) is np.ndarray and a.shape == self.shape and a.dtype == work:
            # the common case (an array of the variable's shape and working dtype): no checks needed
            if self._ob is b and self._oop == op:
                _acc_array(op, b.arrs[self._oi][0].reshape(self.shape), a)
                return self
            acc = a.flatten()
        else:
            arr = np.asarray(a)
            if not np.can_cast(arr.dtype, work, "same_kind"):
                raise SharedVariableError(
                    f"{OP_NAMES[op]} contribution of dtype {arr.dtype} to shared array #{self._id} "
                    f"({self.dtype}); expected values castable to {self.dtype}")
            try:
                arr = np.broadcast_to(arr, self.shape)
            except ValueError:
                raise SharedVariableError(
                    f"{OP_NAMES[op]} contribution of shape {arr.shape} to shared array #{self._id} of shape "
                    f"{self.shape}; expected a scalar or an array broadcastable to {self.shape}") from None
            if self._ob is b and self._oop == op:
                _acc_array(op, b.arrs[self._oi][0].reshape(self.shape), arr)
                return self
            acc = np.array(arr, dtype=work, copy=True).reshape(-1)
        if b.arrs is _NOL:
            b.arrs = []
        b.arrs.append([acc, op, kind])
        if kind != W_F8 or (op != SUM and op != CONSUME):
            b.allsum = False
        return self._new_slot(e, b, op, 2, len(b.arrs) - 1, acc.size * (2 if kind == W_C16 else 1), None)

    def _new_slot(self, e: Fuser, b: _Batch, op: int, blk: int, i: int, w: int, extra) -> "SharedVar":
        self._entries += ((op, b, blk, i, extra),)
        if op != CONSUME:
            self._ob, self._oi, self._oop, self._oblk = b, i, op, blk
        else:
            self._ob = None
        if self._lastb is not b:
            self._lastb = b
            b.nvars += 1
        if blk != 0:
            b.add_words(w)
        if self._sf:
            b.note((self._id << 3) | op)     # float64 scalar: an int key (decoded in Fuser._exchange_logs)
        else:
            k, t = _ckey(self._id, op, self.dtype.num, self.shape)
            if b.kmap is _NOD:
                b.kmap = {}
            b.kmap[k] = t
            b.note(k)
        if len(b.f8) + b.words > e.threshold_words:
            e.flush()
        return self


    def _no_complex(self, what: str) -> None:
        if self._kind == W_C16:
            raise SharedVariableError(f"{what} on complex shared variable #{self._id}: complex numbers are "
                                      "unordered; reduce abs() values in a real shared variable instead")

    def _local_inplace(self, fn, other: "SharedVar") -> "SharedVar":
        res = _binary(fn, self, other)
        self._setup(res.dtype, res.shape, res._base)
        return self

    # binary operators ------------------------------------------------------------------------
    # the float64 scalar operators test for the fast lane inline (one call less per operator)


    def __floordiv__(self, a):
        return _binary(operator.floordiv, self, a)

    def __rfloordiv__(self, a):
        return _binary(operator.floordiv, a, self)

    def __mod__(self, a):
        return _binary(operator.mod, self, a)

    def __pow__(self, a):
        return _binary(operator.pow, self, a)

    def __rpow__(self, a):
        return _binary(operator.pow, a, self)

    def __neg__(self):
        return _unary(operator.neg, self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _unary(abs, self)

    # numpy: + - * / keep shared semantics, every other function forces and returns a local value
    _UFUNC_OPS = {np.add: "__add__", np.subtract: "__sub__", np.multiply: "__mul__",
                  np.true_divide: "__truediv__"}
    _UFUNC_ROPS = {np.add: "__radd__", np.subtract: "__rsub__", np.multiply: "__rmul__",
                   np.true_divide: "__rtruediv__"}

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method == "__call__" and not kwargs and len(inputs) == 2 and ufunc in SharedVar._UFUNC_OPS:
            x, y = inputs
            if x is self:
                return getattr(self, SharedVar._UFUNC_OPS[ufunc])(y)
            return getattr(self, SharedVar._UFUNC_ROPS[ufunc])(x)
        args = [i.value if isinstance(i, SharedVar) else i for i in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.value if isinstance(o, SharedVar) else o for o in kwargs["out"])
        return getattr(ufunc, method)(*args, **kwargs)

def _short(v: Any) -> str:
    s = repr(v.tolist() if isinstance(v, np.ndarray) and v.size <= 6 else v)
    return s if len(s) <= 60 else s[:57] + "..."


def _local(o: Any) -> Any:
    return o.value if isinstance(o, (SharedVar, Grant)) else o


def _neg(a: Any) -> Any:
    if isinstance(a, Grant):
        a = a.value
    if isinstance(a, (list, tuple)):
        a = np.asarray(a)
    return -a


def _acc(op: int, cur, a):
    if op == SUM or op == CONSUME:
        return cur + a
    if op == PROD:
        return cur * a
    if op == MIN:
        return a if (a < cur or a != a) else cur
    return a if (a > cur or a != a) else cur


def _acc_array(op: int, acc: np.ndarray, arr: np.ndarray) -> None:
    if op == SUM:
        np.add(acc, arr, out=acc, casting="same_kind")
    elif op == PROD:
        np.multiply(acc, arr, out=acc, casting="same_kind")
    elif op == MIN:
        np.minimum(acc, arr, out=acc, casting="same_kind")
    else:
        np.maximum(acc, arr, out=acc, casting="same_kind")


_CASTERS: Dict[np.dtype, Callable[[Any], np.ndarray]] = {}


def _array_caster(dtype: np.dtype) -> Callable[[Any], np.ndarray]:
    """The cast of an array shared variable of ``dtype``: a read-only copy (one per dtype)."""
    def cast(v):
        out = np.array(v, dtype=dtype, copy=True)
        out.flags.writeable = False
        return out
    _CASTERS[dtype] = cast
    return cast


def _snap(x: SharedVar) -> Any:
    """x's current state for use in a derived value (closes x's open slot)."""
    if not x._entries:
        return x._base
    x._ob = None
    return _Snap(x._base, x._entries, x._cast, x.shape)


def _is_concrete(x: SharedVar) -> bool:
    return not x._entries and type(x._base) is not _Derived and type(x._base) is not _Snap


_FN_CODES = {operator.add: 1, operator.sub: 2, operator.mul: 3, operator.truediv: 4, operator.floordiv: 5,
             operator.mod: 6, operator.pow: 7, np.minimum: 8, np.maximum: 9}

_RESULT_CACHE: Dict[tuple, Tuple[np.dtype, tuple]] = {}


def _result_meta(fn, a: Any, b: Any) -> Tuple[np.dtype, tuple]:
    def meta(v):
        if isinstance(v, SharedVar):
            return v.dtype, v.shape, True
        if isinstance(v, (float, int, complex, bool)):
            return type(v), (), False
        arr = np.asarray(v)
        return arr.dtype, arr.shape, False

    ma, mb = meta(a), meta(b)
    key = (fn, ma, mb)
    r = _RESULT_CACHE.get(key)
    if r is None:
        def sample(m):
            dt, shape, is_shared = m
            if isinstance(dt, type):
                return dt(1)
            return np.ones(shape, dtype=dt)[()] if shape == () else np.ones(shape, dtype=dt)

        with np.errstate(all="ignore"):
            out = np.asarray(fn(sample(ma), sample(mb)))
        r = (_check_dtype(out.dtype, f"result of {getattr(fn, '__name__', fn)}"), out.shape)
        _RESULT_CACHE[key] = r
    return r


class _LazyF8(SharedVar):
    """A float64 scalar shared variable made by shared arithmetic (``s1 * s1 / N``).

    Exactly a :class:`SharedVar`; only its rarely used attributes are filled on
    first use (:meth:`__getattr__` runs only for a slot that is not set yet), so
    an intermediate result of an expression costs a few attribute writes."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name in _LAZY_FILL:
            _fill_f8(self)
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_LAZY_FILL = frozenset(("name", "dtype", "shape", "_kind", "_ob", "_oi", "_oop", "_oblk", "_lastb", "_ksum",
                        "_cast", "_init"))


def _fill_f8(self: SharedVar) -> None:
    """Set the slots a :class:`_LazyF8` was created without to their float64-scalar
    defaults; slots already set (e.g. by an assignment that changed the dtype) are kept."""
    defaults = dict(name=None, dtype=_F8, shape=(), _kind=W_F8, _ob=None, _oi=0, _oop=-1, _oblk=0,
                    _lastb=None, _ksum=self._id << 3, _cast=float, _init=None)
    for name, v in defaults.items():
        try:
            object.__getattribute__(self, name)
        except AttributeError:
            object.__setattr__(self, name, v)


_UNIFORM_OK = (float, int)


def _f8_operand(x: Any, is_shared: bool, code: int) -> Tuple[Any, bool]:
    """One operand of :func:`_f8_binary`: ``(value, resolved)``. A shared operand with
    pending contributions becomes a slot reference ``(base, batch, index)`` or a
    :class:`_Snap` (and its open slot is closed); a uniform operand is logged for the
    SPMD check at the next force point."""
    if is_shared:
        e = x._entries
        v = x._base
        if not e:
            return v, type(v) is float
        x._ob = None
        if len(e) == 1 and type(v) is float:
            op, bb, blk, i, _ = e[0]
            return ((v, bb, i) if (op == 0 and blk == 0) else _Snap(v, e, float, ())), False
        return _Snap(v, e, float, ()), False
    _fusion._FUSER.batch.note_uniform(code, x if x == x else _NAN_KEY)
    return x, True


def _f8_binary(fn, code: int, a: Any, b: Any, sa: bool, sb: bool) -> SharedVar:
    """``fn(a, b)`` (``code`` = ``_FN_CODES[fn]``) for float64 scalar shared operands
    (``sa``/``sb``) and Python float/int uniform ones: the result is a new float64
    shared variable, computed now if both operands are resolved, else a lazy node
    whose operand for a variable with one pending sum is the slot reference
    ``(base, batch, index)`` (a snapshot without a copy; the variable's open slot is
    closed so later contributions go to a new slot)."""
    va, ca = _f8_operand(a, sa, code)
    if b is a:
        vb, cb = va, ca
    else:
        vb, cb = _f8_operand(b, sb, code)
    if ca and cb:
        base = fn(va, vb)
        if type(base) is not float:
            base = float(base)
    else:
        base = _Derived(fn, (va, vb), float)
    res = _LazyF8.__new__(_LazyF8)
    e = _fusion._FUSER
    vid = e.next_id
    e.next_id = vid + 1
    res._id = vid
    res._base = base
    res._entries = ()
    res._sf = True
    return res


def _binary(fn, a: Any, b: Any) -> SharedVar:
    """Local shared arithmetic; a non-shared operand must be uniform (checked at the next force point)."""
    ta = type(a)
    tb = type(b)
    if (ta is _LazyF8 or ta is SharedVar) and a._sf:
        if (tb is _LazyF8 or tb is SharedVar) and b._sf:
            return _f8_binary(fn, _FN_CODES.get(fn, 0), a, b, True, True)
        if tb in _UNIFORM_OK:
            return _f8_binary(fn, _FN_CODES.get(fn, 0), a, b, True, False)
    elif (tb is _LazyF8 or tb is SharedVar) and b._sf and ta in _UNIFORM_OK:
        return _f8_binary(fn, _FN_CODES.get(fn, 0), a, b, False, True)
    if isinstance(a, Grant) or isinstance(b, Grant):
        raise SharedVariableError("a Grant is a rank-local value and cannot be a uniform operand of shared "
                                  "arithmetic; contribute it (x += g) or read it (g.value)")
    if isinstance(a, (tuple, list)):
        a = np.asarray(a)
    if isinstance(b, (tuple, list)):
        b = np.asarray(b)
    sa, sb = isinstance(a, SharedVar), isinstance(b, SharedVar)
    if sa and sb and a._kind == W_F8 and b._kind == W_F8 and a.shape == () and b.shape == ():
        dtype, shape = _F8, ()
    else:
        dtype, shape = _result_meta(fn, a, b)
    for v, s in ((a, sa), (b, sb)):
        if not s:
            fuser().batch.note_uniform(_FN_CODES.get(fn, 0), _value_key(v))
    cast = float if (dtype == _F8 and shape == ()) else (dtype.type if shape == () else _array_caster(dtype))
    if (not sa or _is_concrete(a)) and (not sb or _is_concrete(b)):
        with np.errstate(all="ignore"):
            v = cast(fn(a._base if sa else a, b._base if sb else b))
        return SharedVar._derived(v, dtype, shape)
    node = _Derived(fn, (_snap(a) if sa else a, _snap(b) if sb else b), cast)
    return SharedVar._derived(node, dtype, shape)


def _unary(fn, a: SharedVar) -> SharedVar:
    if _is_concrete(a):
        v = a._cast(fn(a._base))
        return SharedVar._derived(v, a.dtype, a.shape)
    return SharedVar._derived(_Derived(fn, (_snap(a),), a._cast), a.dtype, a.shape)


def shared(value: Any, name: Optional[str] = None) -> SharedVar:
    """Create a shared variable with initial ``value`` (scalar or array).

    Every rank must create its shared variables in the same order with the
    same value (checked at the next force point). No communication. A
    Python float gives float64, an int int64; arrays keep their dtype.
    ``name`` labels error messages.
    """
    return SharedVar(value, name=name)

if _core is not None:
    # the compiled versions (same semantics; see .binding for what they fall back to)
    _f8_binary_py = _f8_binary
    _f8_binary = _core.f8_binary  # noqa: F811
    shared = _core.shared  # noqa: F811
