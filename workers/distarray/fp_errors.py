"""NumPy's floating-point error handling (``numpy.errstate``, ``numpy.seterr``) for what a force point evaluates.

NumPy reads the processor's floating-point status flags after each ufunc loop and, as ``numpy.geterr()`` says for
each kind (divide by zero, overflow, underflow, invalid value), warns (``RuntimeWarning: divide by zero encountered
in divide``), raises ``FloatingPointError``, calls the ``numpy.seterrcall`` function, logs or prints. A distributed
array's operations run later, at a force point, in compiled kernels and in NumPy loops over blocks, each only on
the ranks that hold its elements. So:

* each recorded operation keeps the handling in effect when it was recorded (:func:`current`, stored in the task
  by :meth:`~.context.ArrayContext.record`): ``with numpy.errstate(divide='ignore'): c = a / b`` is quiet even
  when ``c`` is computed after the ``with`` block; operations recorded under different states are not fused
  into one compiled loop (:func:`fusable`), so each flag meets the state of the operation that raised it;
* the force point runs its units with NumPy's own handling off (``errstate(all='ignore')``: a NumPy loop on one
  rank must not raise while the other ranks go on and then wait for it), and reads and clears the flags after
  each unit (:class:`Collector`; C's ``fetestexcept``, about 0.3 us a unit);
* when the units have run, each flag a unit raised is handled as its operations' recorded mode says: ``warn``
  (a ``RuntimeWarning`` at the user's line of the force point, shown once per line as NumPy's are), ``print``,
  ``log`` and ``call`` on the ranks where it happened; ``raise`` on every rank (:func:`raise_agreed`: the ranks
  exchange what they found, so that all raise the same ``FloatingPointError``);
* the ``warnings`` filters in effect when an operation was recorded are the ones its warning meets
  (``with warnings.catch_warnings(): warnings.simplefilter('ignore'); c = numpy.log(a)`` is quiet when ``c`` is
  computed after the block); filters that make the warning an exception (``simplefilter('error')``) make the
  operation a force point of its own with the ``raise`` modes below, and every rank raises the RuntimeWarning;
* an operation recorded while some kind is ``raise`` is a force point of its own
  (:meth:`~.context.ArrayContext.maybe_flush`), so the error is raised at its line, as NumPy raises it, and
  nothing recorded after it has run.

The text names the operation NumPy would name: the ufunc (``divide``, ``log``, ``cast``, ``matmul``; ``reduce``
for a reduction); operations evaluated together in one compiled loop are named together when more than one of
them could have raised the flag (``divide by zero encountered in divide or log``).

An integer division or remainder by zero gives NumPy's 0 and its divide-by-zero flag, and the lowest integer
divided by -1 its overflow flag (:func:`raise_flags`, from what the compiled kernel counted). Not like NumPy: a
warning of an operation is issued at the next force point's line rather than at the operation's own; operations that run
through the NumPy fallback (gathered to every rank) are NumPy's own, warnings included. Where the C library
or the processor's flag numbering is unknown (not Linux on x86-64 or aarch64), no flag is read and no
warning is given (:data:`AVAILABLE`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["AVAILABLE", "KINDS", "current", "library_steps", "merged", "fusable", "joined", "wants_raise", "warnings_raise", "warn_at", "warn_under", "signal", "warning_action", "Collector", "report", "raise_agreed", "raise_flags"]

#: NumPy's kinds of floating-point error, in its order, with the text of its messages and the flag NumPy passes to
#: a ``seterrcall`` function.
KINDS: Tuple[Tuple[str, str, int], ...] = (
    ("divide", "divide by zero", 1), ("over", "overflow", 2), ("under", "underflow", 4),
    ("invalid", "invalid value", 8))

#: ``<fenv.h>``'s flag bits per machine, in the order of :data:`KINDS`.
_FE_BITS = {"x86_64": (4, 8, 16, 1), "amd64": (4, 8, 16, 1), "aarch64": (2, 4, 8, 1), "arm64": (2, 4, 8, 1)}


def _libm() -> Optional[Tuple[Any, Any, Tuple[int, ...], Any]]:
    """``(fetestexcept, feclearexcept, bits, feraiseexcept)`` from the C math library, or None where unknown."""
    bits = _FE_BITS.get(platform.machine().lower())
    name = ctypes.util.find_library("m")
    if bits is None or name is None or not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(name)
        test, clear, set_ = lib.fetestexcept, lib.feclearexcept, lib.feraiseexcept
    except (OSError, AttributeError):
        return None
    test.argtypes = clear.argtypes = set_.argtypes = [ctypes.c_int]
    test.restype = clear.restype = set_.restype = ctypes.c_int
    return test, clear, bits, set_


def raise_flags(code: int) -> None:
    """Set the processor's divide-by-zero flag if ``code & 1`` and its overflow flag if ``code & 2``: what a compiled
    kernel found in an integer ``floor_divide``/``remainder`` (a zero divisor; the lowest integer divided by -1),
    flags NumPy's integer loops set so that their warnings come out. Read with the others after the unit. Local."""
    if _LIB is not None and code:
        bits = _LIB[2]
        _LIB[3]((bits[0] if code & 1 else 0) | (bits[1] if code & 2 else 0))


_LIB = _libm()
#: Whether the floating-point flags are read (Linux on x86-64 or aarch64 with a C math library).
AVAILABLE = _LIB is not None
_ALL_BITS = sum(_LIB[2]) if _LIB else 0

# numpy.geterr() made again only when the error state changes: NumPy 2 keeps it in a context variable whose value
# is replaced by every change (numpy.errstate, numpy.seterr); elsewhere numpy.geterr() is called each time.
try:
    from numpy._core._ufunc_config import _extobj_contextvar as _STATE_VAR   # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - NumPy 1.x
    _STATE_VAR = None
_last: List[Any] = [object(), None]
_QUIET = {"divide": "ignore", "over": "ignore", "under": "ignore", "invalid": "ignore"}
_internal = [0]


def current() -> Dict[str, str]:
    """``numpy.geterr()`` now, as a dict shared (not to be changed) while the error state stays the same; all
    ``ignore`` inside :func:`library_steps`. Local."""
    if _internal[0]:
        return _QUIET
    if _STATE_VAR is None:  # pragma: no cover - NumPy 1.x
        return np.geterr()
    token = _STATE_VAR.get()
    if token is not _last[0]:
        _last[0], _last[1] = token, np.geterr()
    return _last[1]


def library_steps(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a NumPy function built of recorded steps that gives NumPy's own warnings itself (``mean``: "Mean of
    empty slice", then the "invalid value encountered in divide" of NumPy's own division, through
    :mod:`.value_warnings`): the flags of the operations it records are not reported (its steps are not NumPy's, so
    their flags would not be NumPy's). NumPy's error state is not changed."""
    @functools.wraps(fn)
    def steps(*args: Any, **kwargs: Any) -> Any:
        _internal[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _internal[0] -= 1
    return steps


def merged(a: Optional[Dict[str, str]], b: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    """The error state of an operation made of two (fusion inlines one into the other): per kind the stronger
    mode (raise, call, log, print, warn, ignore); ``a`` itself when both are the same. None is NumPy's default.
    Local."""
    a, b = a or _DEFAULT, b or _DEFAULT
    if a is b or a == b:
        return a
    return {k: max(a.get(k, "ignore"), b.get(k, "ignore"), key=_STRENGTH.get) for k in a.keys() | b.keys()}


def fusable(a: Optional[Dict[str, str]], b: Optional[Dict[str, str]]) -> bool:
    """Whether operations recorded under the error states ``a`` and ``b`` may run in one compiled loop (inlined or
    grouped by fusion): the same state, or one of them the quiet state of :func:`library_steps`. Two user states
    that differ are kept apart, as a flag raised in one loop cannot be told to one operation:
    ``a = x - 5`` then, under ``numpy.seterr(all='ignore')``, ``r = 1 / a`` fused would report the division by
    zero under ``a``'s ``warn``. None is NumPy's default. Local."""
    a, b = a or _DEFAULT, b or _DEFAULT
    return a is b or a is _QUIET or b is _QUIET or a == b


def joined(group: Optional[Dict[str, str]], state: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    """The error state a fusion group keeps after an operation of ``state`` (:func:`fusable` with it) joined it:
    the group's own, unless that is only the quiet state of library steps. Local."""
    return state if group is _QUIET else group


def wants_raise(state: Optional[Dict[str, str]]) -> bool:
    """Whether the error state ``state`` (a :func:`current` dict) raises for some kind. Local."""
    return state is not None and "raise" in state.values()


#: ``warnings._filters_mutated`` (CPython's: the warnings registries' cache is stale after the list is swapped)
_FILTERS_MUTATED: Callable[[], None] = getattr(warnings, "_filters_mutated", lambda: None)
_ERRORING: List[Any] = [None, -1, False]   # the filters list last asked about, its length, the answer


def warnings_raise(filters: List[Any]) -> bool:
    """Whether the ``warnings.filters`` list ``filters`` makes NumPy's floating-point RuntimeWarnings exceptions
    (``warnings.simplefilter('error')``, ``-W error``): then an operation recorded under it is a force point of its
    own, as under ``errstate(...='raise')``, and the ranks agree on raising (:func:`raise_agreed`). Cached per list
    and length (``catch_warnings`` makes a new list, ``simplefilter`` inserts into it). Local."""
    if filters is _ERRORING[0] and len(filters) == _ERRORING[1]:
        return _ERRORING[2]
    got = any(warning_action(filters, message(kind, "an operation")) == "error" for kind, _, _ in KINDS)
    _ERRORING[:] = [filters, len(filters), got]
    return got


def warning_action(filters: Sequence[Any], text: str) -> str:
    """The action of the first entry of ``filters`` matching a RuntimeWarning with ``text`` (a filter for some
    module is taken to match: the module of the line warned at is not known when an operation is recorded)."""
    for entry in filters:
        action, msg, category = entry[0], entry[1], entry[2]
        if issubclass(RuntimeWarning, category) and (msg is None or msg.match(text)):
            return action
    return warnings.defaultaction


#: Ufuncs that may raise "divide by zero" (the other kinds may come from nearly any operation).
_DIVIDING = frozenset(("divide", "true_divide", "floor_divide", "remainder", "fmod", "divmod", "reciprocal", "log",
                       "log2", "log10", "log1p", "power", "float_power", "arctanh"))


def _expr_names(node: Any, out: List[str]) -> None:
    """The ufunc names of the operations in expression ``node``, innermost first."""
    args = getattr(node, "args", None)
    if args is None or not isinstance(getattr(node, "name", None), str):
        return
    for a in args:
        _expr_names(a, out)
    if node.name != "where":
        out.append(node.name)


def _task_names(task: Any) -> List[str]:
    """What NumPy would name in an error of ``task``: its ufunc(s), ``reduce``, ``matmul`` or ``cast``."""
    names: List[str] = []
    ufunc = getattr(task, "ufunc", None)
    if isinstance(ufunc, np.ufunc):
        method = getattr(task, "method", "__call__")
        return [ufunc.__name__ if method == "__call__" else method]
    expr = getattr(task, "expr", None)
    if expr is not None:
        _expr_names(expr, names)
        if task.kind == "reduce":
            names.append("reduce")
        return names or ["cast"]
    return ["matmul"] if task.kind in ("matmul", "vecmat") else ["cast"]


class Collector:
    """The flags the units of one force point raised, with the operations of each unit's group.

    Made by the scheduler for a flush; :meth:`clear` before the units run, :meth:`after` after each unit. Local,
    not thread-safe."""

    __slots__ = ("hits", "filters")

    def __init__(self) -> None:
        #: ``(flag bits, tasks)`` per unit that raised a flag
        self.hits: List[Tuple[int, Sequence[Any]]] = []
        #: the ``warnings.filters`` recorded with the operations of each triple of :meth:`found`
        self.filters: Dict[Tuple[str, str, str], Any] = {}

    @staticmethod
    def clear() -> None:
        """Clear the processor's flags (before the first unit of the flush)."""
        if _LIB is not None:
            _LIB[1](_ALL_BITS)

    def after(self, where: Any) -> None:
        """Read (and clear) the flags after a unit ran; ``where``: its group, the group's run (a
        :class:`~.units.GroupRun`, whose ``group`` is the group) or None; a group's ``tasks`` are its operations."""
        if _LIB is None:
            return
        bits = _LIB[0](_ALL_BITS)
        if bits:
            _LIB[1](_ALL_BITS)
            group = getattr(where, "group", where)
            self.hits.append((bits, tuple(getattr(group, "tasks", None) or ())))

    def found(self) -> List[Tuple[str, str, str]]:
        """``(kind, mode, operation names)`` of each flag found, once per distinct triple, in the order found,
        with the mode recorded with the group's operations (the strongest when they differ: raise, call, log,
        print, warn, ignore), naming the operations whose mode is not ``ignore``."""
        seen: Dict[Tuple[str, str, str], None] = {}
        fe = _LIB[2] if _LIB else ()
        for bits, tasks in self.hits:
            for (kind, _text, _flag), bit in zip(KINDS, fe):
                if not bits & bit:
                    continue
                modes = [(getattr(t, "fpe", None) or _DEFAULT).get(kind, "ignore") for t in tasks]
                mode = max(modes, key=_STRENGTH.get) if tasks else current().get(kind, "ignore")
                if mode == "ignore":
                    continue
                if kind == "invalid" and tasks and all(_nan_quiet(t) for t, m in zip(tasks, modes) if m != "ignore"):
                    continue    # a compiled comparison met a NaN, where NumPy's loops stay quiet
                names: List[str] = []
                for t, m in zip(tasks, modes):   # the operations that report this kind
                    if m != "ignore":
                        names.extend(n for n in _task_names(t) if n not in names)
                if kind == "divide" and any(n in _DIVIDING for n in names):
                    names = [n for n in names if n in _DIVIDING]
                elif kind == "invalid" and any(n not in _NAN_QUIET for n in names):
                    names = [n for n in names if n not in _NAN_QUIET]
                key = (kind, mode, " or ".join(names) or "an operation")
                seen[key] = None
                if key not in self.filters:
                    self.filters[key] = next((getattr(t, "wf", None) for t, m in zip(tasks, modes) if m == mode), None)
        return list(seen)


#: Ufuncs whose NumPy loops give no "invalid value" error for NaN operands (they compare or copy signs, or take
#: integers and booleans only: a flag in their loop came from a library step fused with them). The fused
#: kernels compare floats quietly (:func:`~.fused_kernels._quiet_compare`); an invalid flag raised by a unit made of
#: these alone (compiled code elsewhere, the processor's own comparisons) is still not reported.
_NAN_QUIET = frozenset(("maximum", "minimum", "fmax", "fmin", "greater", "greater_equal", "less", "less_equal",
                        "equal", "not_equal", "isnan", "isinf", "isfinite", "signbit", "sign", "clip", "where",
                        "logical_and", "logical_or", "logical_xor", "logical_not", "absolute", "negative", "positive",
                        "copysign", "bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift"))
#: Reductions that give no "invalid value" error for NaN elements in NumPy.
_NAN_QUIET_REDUCTIONS = frozenset(("max", "min", "argmax", "argmin", "any", "all"))


def _nan_quiet(task: Any) -> bool:
    """Whether NumPy reports no "invalid value" error for the operations of ``task`` (only :data:`_NAN_QUIET`
    ufuncs, or a max/min/any/all reduction of such an expression): an invalid flag it raised came from comparing a
    NaN. Local."""
    ufunc = getattr(task, "ufunc", None)
    if isinstance(ufunc, np.ufunc):
        return ufunc.__name__ in _NAN_QUIET and getattr(task, "method", "__call__") in ("__call__", "reduce")
    expr = getattr(task, "expr", None)
    if expr is None or (task.kind == "reduce" and getattr(task, "op", None) not in _NAN_QUIET_REDUCTIONS
                        and np.dtype(getattr(task, "acc_dtype", "f8")).kind not in "biu"
                        and np.dtype(getattr(expr, "dtype", "f8")).kind != "b"):
        return False   # (a sum in integers or of booleans, count_nonzero(a > 0), raises no invalid flag of its own)
    names: List[str] = []
    _expr_names(expr, names)
    return all(n in _NAN_QUIET for n in names)


_DEFAULT = {"divide": "warn", "over": "warn", "under": "ignore", "invalid": "warn"}
_STRENGTH = {"ignore": 0, "warn": 1, "print": 2, "log": 3, "call": 4, "raise": 5}
_TEXT = {kind: text for kind, text, _ in KINDS}
_FLAG = {kind: flag for kind, _, flag in KINDS}


def message(kind: str, names: str) -> str:
    """NumPy's text for an error of ``kind`` in the operation(s) ``names``."""
    return f"{_TEXT[kind]} encountered in {names}"


def report(found: Sequence[Tuple[str, str, str]], user_frame: Any,
           filters: Optional[Dict[Tuple[str, str, str], Any]] = None) -> None:
    """Handle each flag of :meth:`Collector.found` whose mode is not ``raise`` as NumPy does, on this rank: warn at
    ``user_frame``'s line under the ``warnings`` filters recorded with the operation (``filters``:
    :attr:`Collector.filters`; a ``catch_warnings`` block that ignored them has ended by now), print, log or
    call. Local."""
    for kind, mode, names in found:
        text = message(kind, names)
        if mode == "warn":
            warn_under(text, user_frame, (filters or {}).get((kind, mode, names)))
        elif mode == "print":
            print(f"Warning: {text}", flush=True)
        elif mode == "log":
            np.geterrcall().write(f"Warning: {text}\n")
        elif mode == "call":
            np.geterrcall()(_TEXT[kind], _FLAG[kind])


def signal(kind: str, names: str, state: Dict[str, str], frame: Any, filters: Optional[List[Any]]) -> None:
    """Handle one floating-point error of ``kind`` in the operation(s) ``names`` as the error state ``state`` (a
    ``numpy.geterr()`` dict) says, on this rank: raise ``FloatingPointError``, or :func:`report` it (a warning at
    ``frame``'s line under the ``warnings`` filters ``filters``, print, log, call), or nothing (``ignore``).
    Local."""
    mode = state.get(kind, "ignore")
    if mode == "raise":
        raise FloatingPointError(message(kind, names))
    if mode != "ignore":
        report([(kind, mode, names)], frame, {(kind, mode, names): filters})


def warn_under(text: str, frame: Any, recorded: Optional[List[Any]]) -> None:
    """:func:`warn_at` under the ``warnings.filters`` list ``recorded`` (the one in effect when the operation was
    recorded; None: the current one), swapped in as ``catch_warnings`` does and back. Local."""
    if recorded is None or recorded is warnings.filters:
        warn_at(text, frame)
        return
    now = warnings.filters
    warnings.filters = recorded
    _FILTERS_MUTATED()      # what catch_warnings does when it swaps the list
    try:
        warn_at(text, frame)
    finally:
        warnings.filters = now
        _FILTERS_MUTATED()


def warn_at(text: str, frame: Any) -> None:
    """``RuntimeWarning(text)`` as if issued at ``frame``'s line (what ``warnings.warn`` does with a stacklevel;
    ``frame`` None: the caller's caller). Local."""
    if frame is None:
        warnings.warn(text, RuntimeWarning, stacklevel=3)
        return
    g = frame.f_globals
    warnings.warn_explicit(text, RuntimeWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=g.get("__name__", "<string>"), registry=g.setdefault("__warningregistry__", {}),
                           module_globals=g)


def raise_agreed(comm: Any, found: Sequence[Tuple[str, str, str]], how: Dict[str, Any],
                 filters: Optional[Dict[Tuple[str, str, str], Any]] = None) -> None:
    """Raise ``FloatingPointError`` on every rank if a flag whose mode is ``raise`` was found on some rank, else
    ``RuntimeWarning`` (the warning as an exception) if a ``warn`` one was found whose recorded ``warnings``
    filters (``filters``: :attr:`Collector.filters`) make it an error; the text of the lowest such rank's first
    one. Collective over ``comm`` (every rank must call it when the flush held an operation recorded under a
    ``raise`` mode or erroring filters, :func:`warnings_raise`); ``how``: the timeout arguments of
    :func:`~nbmpi.workers.core.spmd.gather`."""
    from ..core import spmd

    mine = next((("raise", message(kind, names)) for kind, mode, names in found if mode == "raise"), None)
    if mine is None and filters:
        mine = next((("warn", message(kind, names)) for kind, mode, names in found if mode == "warn"
                     and filters.get((kind, mode, names)) is not None
                     and warning_action(filters[(kind, mode, names)], message(kind, names)) == "error"), None)
    every = spmd.gather(comm, mine, **how)
    first = next((t for t in every if t is not None), None)
    if first is not None:
        raise (FloatingPointError if first[0] == "raise" else RuntimeWarning)(first[1])
