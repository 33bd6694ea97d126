"""NumPy for everything the distributed arrays do not implement: gather, call NumPy, distribute.

Any NumPy function, ufunc method, array method or attribute that has no distributed
implementation still runs on :class:`~.array.DistArray` operands (as cuNumeric falls back to
NumPy):

1. every distributed operand is gathered on every rank (``to_numpy()``: a force point, an
   allgather),
2. NumPy's own function is called on every rank with the gathered operands (the same inputs on
   every rank give the same result on every rank),
3. an array result of a supported dtype (bool, integer, float) with at least one dimension is
   distributed again with the layout kind of the first distributed operand, each rank keeping
   its own rows; scalars, 0-d results and other dtypes are returned as NumPy gives them;
4. a distributed operand NumPy writes in place (``copyto``'s ``dst``, ``place``, ``putmask``,
   ``put_along_axis``, ``fill_diagonal``, ``put``, a ufunc's ``at``, ``shuffle``, ``ndarray.byteswap(inplace=True)``,
   ``ndarray.setfield``: :func:`written_operand`) gets the gathered copy NumPy changed written back, each
   rank its own rows, so the write is not lost; ``out=`` a DistArray receives the result the same way.

Who must call it: every rank of the operands' communicator, in the same order (SPMD), as for any
collective. Blocking (the gathers are waited with ``NBMPI_TIMEOUT``). Without distributed
operands a fallback is NumPy's own call, local.

Each fallback call is counted (:func:`stats`, part of ``dnp.stats()["fallback"]``), marked on the
timeline (event kind ``numpy_fallback``, its bytes the bytes gathered) and warned about once per
call site of the user's program (:class:`NumPyFallbackWarning`, on rank 0: the function and the
bytes moved). ``NBMPI_REPORT_COVERAGE=1`` prints at exit, on rank 0, how many calls ran natively
and how many fell back, with their call sites.
"""
from __future__ import annotations

import atexit
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..tracing import tracer as tracing

#: Event kind of one fallback call on the timeline.
K_FALLBACK = tracing.register_kind("numpy_fallback")

#: ``NBMPI_REPORT_COVERAGE=1``: count native calls too and print the coverage report at exit.
COVERAGE_ENV = "NBMPI_REPORT_COVERAGE"
REPORT = os.environ.get(COVERAGE_ENV, "") not in ("", "0")

_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_NUMPY_DIR = str(Path(np.__file__).resolve().parent)
_DISTRIBUTABLE = "biuf"   # dtype kinds a DistArray holds

_calls: Counter = Counter()          # function name -> fallback calls
_bytes: Counter = Counter()          # function name -> bytes gathered
_sites: Counter = Counter()          # (name, "file:line") -> fallback calls
_native: Counter = Counter()         # (name, "file:line") -> native calls (only with REPORT)
_warned: Dict[Any, int] = {}         # warnings registry: once per call site


class NumPyFallbackWarning(UserWarning):
    """A NumPy function ran through the fallback: its operands were gathered on every rank."""


def user_frame() -> Any:
    """The innermost frame of the calling stack outside this package and NumPy (the user's call), or None. Local."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not (path.startswith(_PACKAGE_DIR) or path.startswith(_NUMPY_DIR) or path.startswith("<__array_function__")):
            return frame
        frame = frame.f_back
    return None


def _call_site() -> Tuple[str, int]:
    """File and line of the user's call (:func:`user_frame`)."""
    frame = user_frame()
    return ("<unknown>", 0) if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def report_coverage(on: bool = True) -> None:
    """Count native calls too (from now on, this process), for :func:`coverage_report`; what
    ``NBMPI_REPORT_COVERAGE=1`` does at import. Local."""
    global REPORT
    REPORT = bool(on)


def note_native(name: str) -> None:
    """Count one native (distributed) call of ``name`` at the user's call site, for the coverage
    report. Local; does nothing unless ``NBMPI_REPORT_COVERAGE=1``."""
    if REPORT:
        path, line = _call_site()
        _native[(name, f"{path}:{line}")] += 1


#: The DistArray class and the constructors this module uses, registered by the modules that
#: define them (``array``, ``creation``): they import this module, so it imports neither.
REGISTRY: Dict[str, Any] = {}


def register(**items: Any) -> None:
    """Register ``DistArray``, ``from_numpy`` or ``from_local`` (at import of their modules)."""
    REGISTRY.update(items)


def _distarray_type():
    return REGISTRY["DistArray"]


def _gather(value: Any, found: List[Any], reason: str) -> Any:
    """``value`` with every DistArray in it (also inside lists, tuples and dicts) gathered."""
    DistArray = _distarray_type()
    if isinstance(value, DistArray):
        found.append(value)
        return value.to_numpy(_reason=reason)
    if isinstance(value, list):
        return [_gather(v, found, reason) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_gather(v, found, reason) for v in value)
    if isinstance(value, dict):
        return {k: _gather(v, found, reason) for k, v in value.items()}
    return value


def _distribute(result: Any, like: Any) -> Any:
    """``result`` with each array of a distributable dtype and at least one dimension made a
    DistArray laid out like ``like`` (local: every rank holds the same ``result``)."""
    if isinstance(result, tuple) and not hasattr(result, "_fields"):
        return tuple(_distribute(r, like) for r in result)
    if isinstance(result, list) and result and all(isinstance(r, np.ndarray) for r in result):
        return [_distribute(r, like) for r in result]
    if not isinstance(result, np.ndarray) or result.ndim == 0 or result.dtype.kind not in _DISTRIBUTABLE:
        return result
    return REGISTRY["from_numpy"](result, dist=like.dist, comm=like.comm)   # the same kind (and block size) of layout


def _warn(name: str, nbytes: int, site: Tuple[str, int], rank: int) -> None:
    if rank != 0:
        return
    warnings.warn_explicit(
        f"numpy.{name} has no distributed implementation: its operands ({nbytes} bytes) were gathered on every "
        "rank and NumPy computed the result (counted in dnp.stats()['fallback'])",
        NumPyFallbackWarning, site[0], site[1], registry=_warned)


#: NumPy functions that write into an operand: its position and keyword.
_WRITERS: Dict[Any, Tuple[int, str]] = {
    np.copyto: (0, "dst"), np.place: (0, "arr"), np.putmask: (0, "a"), np.put_along_axis: (0, "arr"),
    np.fill_diagonal: (0, "a"), np.put: (0, "a")}


def written_operand(func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[int, str]:
    """``(position, keyword)`` of the operand ``func(*args, **kwargs)`` writes in place, or ``(-1, "")``: the
    functions of :data:`_WRITERS`, a ufunc's ``at``, a random generator's ``shuffle``, ``ndarray.setfield`` and
    ``ndarray.byteswap(inplace=True)`` (called with the array first). Local."""
    hit = _WRITERS.get(func)
    if hit is not None:
        return hit
    owner = getattr(func, "__self__", None)
    if getattr(func, "__name__", "") == "at" and isinstance(owner, np.ufunc):
        return 0, "a"
    if getattr(func, "__name__", "") == "shuffle" and isinstance(owner, (np.random.Generator, np.random.RandomState)):
        return 0, "x"
    if func is np.ndarray.setfield or (func is np.ndarray.byteswap and (kwargs.get("inplace") or args[1:2] == (True,))):
        return 0, "self"
    if func is np.nan_to_num and (kwargs.get("copy") is False or args[1:2] == (False,)):
        return 0, "x"
    return -1, ""


def _write_back(func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any], gargs: Tuple[Any, ...],
                gkwargs: Dict[str, Any]) -> Optional[Tuple[Any, Any]]:
    """Write the gathered copy NumPy changed in place back into its DistArray (see the module doc, 4.); returns
    ``(the DistArray, its gathered copy)``, or None when ``func`` writes no distributed operand."""
    pos, key = written_operand(func, args, kwargs)
    if pos < 0:
        return None
    DistArray = _distarray_type()
    if pos < len(args) and isinstance(args[pos], DistArray):
        args[pos][...] = gargs[pos]
        return args[pos], gargs[pos]
    if key in kwargs and isinstance(kwargs[key], DistArray):
        kwargs[key][...] = gkwargs[key]
        return kwargs[key], gkwargs[key]
    return None


def call(func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any], name: str) -> Any:
    """Run NumPy's ``func(*args, **kwargs)`` with every DistArray operand gathered, and distribute
    its array result (see the module docstring). Collective over the operands' communicator when
    any operand is distributed (SPMD: every rank calls it); without distributed operands it is just
    ``func(*args, **kwargs)``. ``out=`` may name a DistArray: the result is written into it; so is an
    operand NumPy writes in place (:func:`written_operand`)."""
    out = kwargs.get("out")
    DistArray = _distarray_type()
    out_dist = out if isinstance(out, DistArray) else (
        out[0] if isinstance(out, tuple) and len(out) == 1 and isinstance(out[0], DistArray) else None)
    if out_dist is not None:
        kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    found: List[Any] = []
    reason = f"numpy fallback: {name}"
    t0 = time.perf_counter_ns()
    gargs = _gather(args, found, reason)
    gkwargs = _gather(kwargs, found, reason)
    if not found and out_dist is None:
        return func(*gargs, **gkwargs)
    like = found[0] if found else out_dist
    nbytes = sum(int(d.nbytes) for d in found)
    from . import file_writes
    path = file_writes.written_path(func, args, kwargs)
    if path is not None:          # a file every rank names alike: written by one rank, read back whole by all
        result = file_writes.write_once(func, gargs, gkwargs, path, like.context, name)
    else:
        result = func(*gargs, **gkwargs)
    site = _call_site()
    count(name, nbytes)
    tr = tracing.get_tracer()
    if tr.enabled:
        tr.record(K_FALLBACK, tracing.DIR_NONE, -1, 0, nbytes, t0, time.perf_counter_ns(), wait=-1,
                  count=len(found))
    _warn(name, nbytes, site, like.context.rank)
    written = _write_back(func, args, kwargs, gargs, gkwargs)
    if written is not None and result is written[1]:    # NumPy returns the operand it wrote (nan_to_num(copy=False))
        return written[0]
    if out_dist is not None:
        out_dist[...] = result
        return out_dist
    if _is_numpy_out(result, out):      # NumPy returns the NumPy array(s) it wrote (out=): the same object(s)
        return result
    res = _distribute(result, like)
    _mark_views(result, res, _arrays_in((gargs, gkwargs)), name)
    return res


def _is_numpy_out(result: Any, out: Any) -> bool:
    """Whether ``result`` is the NumPy ``out=`` argument itself (one array, or a tuple of them)."""
    if out is None:
        return False
    outs = out if isinstance(out, tuple) else (out,)
    if not all(isinstance(o, np.ndarray) for o in outs):
        return False
    got = result if isinstance(result, tuple) else (result,)
    return len(got) == len(outs) and all(g is o for g, o in zip(got, outs))


def _arrays_in(value: Any) -> List[np.ndarray]:
    """The NumPy arrays in ``value`` (inside tuples, lists and dicts)."""
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _arrays_in(v)]
    return []


#: NumPy's ``NPY_ARRAY_WRITEABLE`` bit of ``ndarray.flags.num``.
_WRITEABLE = 0x0400


def _mark_views(result: Any, res: Any, gathered: List[np.ndarray], name: str) -> None:
    """Mark each distributed array of ``res`` made from a NumPy view of a gathered operand (``numpy.rot90``,
    ``a.view(dtype)``) as a copy where NumPy has a view, so that a write into it warns
    (:class:`~.errors.CopyNotViewWarning`), and each made from a read-only NumPy result (``broadcast_to``) as
    read-only, so that a write raises NumPy's ValueError."""
    if isinstance(result, (tuple, list)) and isinstance(res, (tuple, list)):
        for r, d in zip(result, res):
            _mark_views(r, d, gathered, name)
        return
    if not isinstance(result, np.ndarray) or not isinstance(res, _distarray_type()):
        return
    if not result.flags.num & _WRITEABLE:   # (flags.writeable warns for broadcast_arrays' results, NumPy 2)
        res._base.copy_of, res._base.read_only = f"numpy.{name}", True
    elif any(np.may_share_memory(result, g) for g in gathered):
        res._base.copy_of = f"numpy.{name}"


def setitem(array: Any, key: Any, value: Any) -> None:
    """``array[key] = value`` through NumPy, for an index the distributed assignment lacks: the array
    (and distributed parts of ``key`` and ``value``) gathered, NumPy's assignment on every rank, the
    result written back in place (each rank its own rows). Collective (SPMD)."""
    def assign(full: np.ndarray, k: Any, v: Any) -> np.ndarray:
        full = full.copy()
        full[k] = v
        return full
    updated = call(assign, (array, key, value), {}, "ndarray.__setitem__")
    array[...] = updated.to_numpy() if isinstance(updated, _distarray_type()) else updated


def count(name: str, nbytes: int) -> None:
    """Count one fallback call of ``name`` that gathered ``nbytes`` (for callers that do their own
    NumPy call, e.g. random draws every rank makes whole). Local."""
    site = _call_site()
    _calls[name] += 1
    _bytes[name] += nbytes
    _sites[(name, f"{site[0]}:{site[1]}")] += 1


def wrap(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``func`` (a NumPy function or ufunc) as a function of distributed operands through :func:`call`."""
    def fallback(*args: Any, **kwargs: Any) -> Any:
        return call(func, args, kwargs, name)
    fallback.__name__ = getattr(func, "__name__", name)
    fallback.__qualname__ = fallback.__name__
    fallback.__doc__ = (f"numpy.{name} on distributed arrays through the NumPy fallback (operands gathered on every "
                        f"rank, the result distributed; see nbmpi.workers.distarray.fallback).\n\n"
                        + (getattr(func, "__doc__", None) or ""))
    fallback.__wrapped__ = func
    return fallback


def method(array: Any, name: str) -> Any:
    """``array.<name>`` for an ndarray attribute a DistArray does not implement: a bound fallback
    for a method, the value (through :func:`call`) for a property such as ``real``."""
    attr = getattr(np.ndarray, name)
    if callable(attr):
        def bound(*args: Any, **kwargs: Any) -> Any:
            return call(attr, (array,) + args, kwargs, f"ndarray.{name}")
        bound.__name__ = name
        return bound
    return call(lambda x: getattr(x, name), (array,), {}, f"ndarray.{name}")


def stats() -> Dict[str, Any]:
    """This rank's fallback counters (local): ``calls``, ``bytes`` (gathered), and per function
    ``functions`` = {name: {"calls", "bytes"}}."""
    return {"calls": int(sum(_calls.values())), "bytes": int(sum(_bytes.values())),
            "functions": {n: {"calls": int(c), "bytes": int(_bytes[n])} for n, c in sorted(_calls.items())}}


def coverage_report() -> str:
    """The coverage report: native and fallback calls, with their call sites (local counts)."""
    native, fell = sum(_native.values()), sum(_sites.values())
    total = native + fell
    share = 100.0 * native / total if total else 100.0
    lines = [f"nbmpi distarray coverage: {native} native and {fell} NumPy-fallback calls "
             f"({share:.1f}% native)"]
    for title, table in (("fallback", _sites), ("native", _native)):
        for (name, site), n in sorted(table.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {title:8s} {n:6d}  {name:28s} {site}")
    return "\n".join(lines)


def _report_at_exit() -> None:
    # MPI may be finalized by now: the launcher's rank variable says which rank this is
    rank = os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", "0"))
    if rank == "0":
        print(coverage_report(), file=sys.stderr, flush=True)


if REPORT:
    atexit.register(_report_at_exit)
