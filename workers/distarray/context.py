"""Per-communicator state of the distributed arrays: recorded operations, settings, plan cache, counters.

One :class:`ArrayContext` exists per communicator (``COMM_WORLD`` unless an array is created with
``comm=``). It owns the list of operations recorded since the last force point and the
settings that govern evaluation:

* ``latency_hiding`` (env ``NBMPI_LATENCY_HIDING``, default on; ``0``/``off`` turns it off):
  start every transfer first and compute what is local while they fly, or (off) exchange
  with blocking waits first and compute afterwards, task by task;
* ``threshold`` (env ``NBMPI_DISTARRAY_THRESHOLD``, default 1000): number of recorded
  operations that forces an evaluation by itself;
* ``chunk_elems`` (env ``NBMPI_DISTARRAY_CHUNK``, default 1048576): elements per block of
  work, i.e. how often a rank polls for arrived messages while it computes. Rows that need
  remote data are always blocks of their own, so a larger chunk only coarsens the polling of
  local work; 2**20 (8 MiB of float64) ran the stencil 4% and the PRK stencil 9% faster than
  2**18 on this project's 2-rank benchmarks, with the same wait %;
* ``timeout`` (env ``NBMPI_TIMEOUT``): bound of every blocking wait of a force point;
* ``numpy_math`` (env ``NBMPI_DISTARRAY_NUMPY_MATH``, default on; ``0``/``off`` turns it off, process-wide):
  ``exp``, ``log``, ``power``, ... as NumPy's own ufunc on each block, results identical to NumPy's, or (off)
  compiled into the fused kernels, faster, within an ulp or two (:mod:`.numpy_math`);
* ``NBMPI_DISTARRAY_GC_FREEZE`` (default on; ``0``/``off`` turns it off): after a force point that
  brought new compiled kernels or new plan instances into the process, ``gc.freeze()`` moves every object
  alive then out of the cyclic garbage collector's reach (reference counting still frees them). Numba's
  compiled code is hundreds of thousands of long-lived objects: without this, each full collection of a warm
  time loop scanned them all (0.3-0.5 s each, about a quarter of a warm 1.5 s program); the cached plans and
  their instances (persistent requests, buffers) are the next largest set (LU n=2700 on 2 ranks: about 110,000
  objects, 40-50 ms per full collection, 5-6 full collections per warm run on a rank that had not frozen
  them). Cached plans hold no reference cycles once evicted (:meth:`~.plans.Plan.free`), so reference
  counting frees them frozen or not. The young generations are collected first (``gc.collect(1)``: the cyclic
  garbage made since the last collection, which includes everything the paused force point made; LU n=1200 first
  run: 0.025 s over 10 freezes, a full collection 0.11 s); older cyclic garbage alive at that moment, and objects
  alive then that later become cyclic garbage, are kept until the next refresh unfreezes everything for one full
  collection (after :data:`FREEZE_REFRESH` freezes, then after twice as many each time);
* ``NBMPI_DISTARRAY_GC_PAUSE`` (default on; ``0``/``off`` turns it off): the cyclic garbage collector is paused
  (``gc.disable()``) while a force point evaluates and enabled again when it ends, also on an error (left off if
  it was off). A force point makes thousands of short-lived objects (units, closures, instances): collections
  during it scanned them and every cached plan for nothing (LU n=1800 on 2 ranks, a warm run: about 1130 young
  and 9 full collections, 0.4-0.6 s of rank 0's time; paused: about 420 and 3-4, 0.16-0.28 s). Reference
  counting still frees most of them at once; cyclic garbage a force point leaves is collected by the first
  collection after it, except after a force point that compiled kernels: the compiler's cyclic leftovers (a
  few hundred small llvmlite/Numba objects per such force point, no arrays, measured) are frozen with its
  kernels.

Creating a context does not communicate; the first force point duplicates the communicator
(so array traffic never mixes with the user's messages) and agrees on a tracer channel id,
both collective, which every rank reaches at the same point of an SPMD program.
"""
from __future__ import annotations

import gc
import os
import time
import warnings
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

from ..core import runtime
from ..core import spmd
from ..core.switches import env_switch
from .errors import DistArrayError
from .graph import Task
from . import lazy_joins, value_warnings
from .fp_errors import current as errstate_now, wants_raise, warnings_raise
from .lazy_grids import substitute_reads
from .pool_memory import BufferCache

__all__ = ["ArrayContext", "context_for", "configure", "env_latency_hiding", "env_gc_pause"]

DEFAULT_THRESHOLD = 1000
DEFAULT_CHUNK = 1 << 20
MAX_PLANS = 512
FIRST_TAG = 1000


def env_latency_hiding() -> bool:
    """``NBMPI_LATENCY_HIDING`` as a bool (default True)."""
    return env_switch("NBMPI_LATENCY_HIDING")


def env_gc_freeze() -> bool:
    """``NBMPI_DISTARRAY_GC_FREEZE`` as a bool (default True)."""
    return env_switch("NBMPI_DISTARRAY_GC_FREEZE")


def env_gc_pause() -> bool:
    """``NBMPI_DISTARRAY_GC_PAUSE`` as a bool (default True)."""
    return env_switch("NBMPI_DISTARRAY_GC_PAUSE")


_frozen_kernels = [0]
#: After this many freezes, then after twice as many each time (32, 64, 128, ...), the frozen objects are given back
#: to the collector (``gc.unfreeze()``) and a full collection runs before freezing again: objects frozen alive that
#: became cyclic garbage since are freed. A long session with new shapes freezes after most force points, and a
#: full collection of a process that loaded numba costs ~0.1 s: doubling keeps them to a logarithmic number
#: (warm loops make no instances, so never get here)
FREEZE_REFRESH = 32
_freezes = [0]
_refresh_at = [1]   # the next refresh: after FREEZE_REFRESH * this many freezes
#: plan instances made in this process (:meth:`ArrayContext.next_tag`), and how many there were at the last freeze
_instances = [0, 0]


def freeze_new_kernels() -> None:
    """``gc.collect(1)`` then ``gc.freeze()`` if kernels were generated or plan instances made since the last call
    (see ``NBMPI_DISTARRAY_GC_FREEZE`` in the module doc). Local; called after every force point."""
    from . import fused_kernels

    n = fused_kernels._STATS["generated"]
    if n != _frozen_kernels[0] or _instances[0] != _instances[1]:
        _frozen_kernels[0] = n
        _instances[1] = _instances[0]
        if env_gc_freeze():
            _freezes[0] += 1
            if _freezes[0] >= FREEZE_REFRESH * _refresh_at[0]:
                _refresh_at[0] *= 2
                gc.unfreeze()
                gc.collect()
            else:
                gc.collect(1)   # the young garbage (all the paused force point made) is freed, not frozen for good
            gc.freeze()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise DistArrayError(f"{name}={raw!r} is not an integer; set it to e.g. {default} or unset it") from None
    if value < 1:
        raise DistArrayError(f"{name}={raw!r} must be at least 1")
    return value


#: What :meth:`ArrayContext.record` calls for a write into a base with copies made from it
#: (:func:`~.array.warn_stale_copies`, registered by :mod:`.array`, which imports this module).
STALE_COPIES: List[Callable[[Any], None]] = [lambda base: None]


class ArrayContext:
    """The distributed-array state of one communicator (see the module doc). Not thread-safe:
    only the main thread records and evaluates (MPI thread level ``funneled``)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.dcomm = None
        self.chan = 0
        self.tracer_ranks: List[int] = list(range(self.size))
        self.pending: List[Task] = []
        self._serial = 0
        self._tag = FIRST_TAG
        self._tag_ub = 32767
        self.flush_no = 0
        self.latency_hiding = env_latency_hiding()
        #: Pause the cyclic garbage collector during a force point (``NBMPI_DISTARRAY_GC_PAUSE``, module doc).
        self.gc_pause = env_gc_pause()
        self.threshold = _env_int("NBMPI_DISTARRAY_THRESHOLD", DEFAULT_THRESHOLD)
        #: a float16 base was made in this context: :meth:`record` refuses float16 in compiled tasks
        self.float16_seen = False
        #: an operation recorded since the last force point raises FloatingPointError for some kind
        #: (:mod:`.fp_errors`): :meth:`maybe_flush` evaluates it at once, and the force point agrees on the errors
        self.fp_raise = False
        #: ``(flag, text, filters)`` of each warning that depends on values recorded since the last force point
        #: (:mod:`.value_warnings`), issued after it
        self.value_warnings: List[Any] = []
        self.chunk_elems = _env_int("NBMPI_DISTARRAY_CHUNK", DEFAULT_CHUNK)
        self.timeout: Optional[float] = runtime.default_timeout()
        self.plans: "OrderedDict[Any, Any]" = OrderedDict()
        #: Plans evicted during the running evaluation: freed when it ends (its units may still use them).
        self.evicted: List[Any] = []
        self.stats: Dict[str, int] = dict(flushes=0, recorded=0, groups=0, split=0, inlined=0, dropped=0, swapped=0,
                                          redistributed=0, indexed=0,
                                          plans_built=0, plan_build_ns=0, plan_hits=0, plans_rebound=0, blocks=0, messages_sent=0, bytes_sent=0,
                                          messages_received=0, wait_ns=0, flush_ns=0, collectives=0)
        self.last: Dict[str, Any] = {}
        self.in_flush = False
        #: While nonzero, :meth:`maybe_flush` does nothing: copies recorded in the middle of recording another
        #: operation (a lazy join materialised) must not flush before that operation's own tasks are held.
        self.hold_flush = 0
        self.buffers = BufferCache()
        #: Bases viewing another base's buffer (``Base.share``): while nonzero, :meth:`record` ends the sharing
        #: of a base before a write to it is recorded.
        self.shared = 0
        #: A copy was made where NumPy has a view (``a.T``, ``reshape``: ``Base.copies``): from then on
        #: :meth:`record` warns when a write into an array leaves such a copy of it, still held, stale.
        self.copied = False
        #: Lazy coordinate grids not yet materialised (:mod:`.lazy_grids`): while nonzero, :meth:`record` lets
        #: elementwise tasks read their coordinates instead and materialises a grid a task writes.
        self.lazy_grids = 0
        #: Lazy concatenate results not yet materialised (:mod:`.lazy_joins`): while nonzero, :meth:`record`
        #: materialises one a task reads or writes before recording the task.
        self.lazy_joins = 0
        #: Aggregators of the irregular copies (:mod:`~.irregular`), per role and item type, reused.
        self.aggregators: Dict[Any, Any] = {}

    # -- identities agreed by construction ----------------------------------------
    def next_serial(self) -> int:
        """Serial number of a new base (same on every rank of an SPMD program)."""
        self._serial += 1
        return self._serial

    def next_tag(self) -> int:
        """MPI tag of a new plan instance (plans are built in the same order on every rank)."""
        _instances[0] += 1
        self._tag += 1
        if self._tag >= self._tag_ub:
            self._tag = FIRST_TAG
        return self._tag

    def ensure_comm(self) -> None:
        """Duplicate the communicator and agree on the tracer channel. Collective, first call only."""
        if self.dcomm is not None:
            return
        from ..tracing import tracer as tracing

        MPI = runtime.MPI()
        self.dcomm = self.comm.Dup()
        ub = self.dcomm.Get_attr(MPI.TAG_UB)
        self._tag_ub = int(ub) if ub else 32767
        tr = tracing.get_tracer()
        self.chan = tr.new_channel_id(self.comm)
        try:
            if tr.comm is not self.comm:
                self.tracer_ranks = spmd.translate_ranks(self.comm, range(self.size), tr.comm)
        except Exception:  # noqa: BLE001 - different worlds: keep this communicator's ranks
            pass

    # -- recording and forcing --------------------------------------------------------
    def record(self, task: Task) -> None:
        """Append ``task`` to the pending list (a base it writes stops sharing its buffer first), with NumPy's
        floating-point error handling and the ``warnings`` filters in effect now (``numpy.geterr()``,
        ``warnings.filters``, :mod:`.fp_errors`). Local."""
        if self.float16_seen and task.kind in NUMBA_KINDS:
            refuse_float16(task)
        if self.copied:
            for w in task.writes():
                if w.base.copies:
                    STALE_COPIES[0](w.base)
        if self.shared:
            for w in task.writes():
                w.base.unshare()
        if self.lazy_joins:
            lazy_joins.on_record(task)
        if self.lazy_grids:
            substitute_reads(task)
        task.fpe = state = errstate_now()
        task.wf = filters = warnings.filters
        if wants_raise(state) or warnings_raise(filters):
            self.fp_raise = True
        self.pending.append(task)
        self.stats["recorded"] += 1

    def maybe_flush(self) -> None:
        """Evaluate everything if the threshold of recorded operations is reached. Called by the
        user-level operations once their results are held by DistArray objects (so the fusion pass
        does not mistake them for dead temporaries). Also evaluates at once an operation recorded while NumPy's
        error state raises for some kind (``numpy.errstate(divide='raise')``): its FloatingPointError is raised at
        its line, as NumPy does, on every rank. Collective when it evaluates."""
        if (len(self.pending) >= self.threshold or self.fp_raise) and not self.in_flush and not self.hold_flush:
            self.flush("floating-point errors raise" if self.fp_raise else "threshold")

    def flush(self, reason: str, latency_hiding: Optional[bool] = None, point: Any = None) -> None:
        """Evaluate every pending operation. Collective over the context's communicator: every rank
        must reach the same force point with the same recorded operations. ``point`` (a
        :class:`~.scheduler.ForcePoint`): the collective that follows, checked with the recorded operations, also
        when none is pending (a rank calling another collective raises DistArrayDivergence on every rank instead
        of mismatching messages). The cyclic garbage collector is paused meanwhile (:attr:`gc_pause`,
        ``NBMPI_DISTARRAY_GC_PAUSE`` in the module doc)."""
        if self.in_flush or (not self.pending and point is None):
            return
        from .scheduler import run_flush

        tasks, self.pending = self.pending, []
        checks, self.value_warnings = self.value_warnings, []     # dropped if the force point fails
        self.in_flush = True
        paused = self.gc_pause and gc.isenabled()
        if paused:
            gc.disable()
        try:
            run_flush(self, tasks, reason, self.latency_hiding if latency_hiding is None else bool(latency_hiding),
                      point)
        finally:
            if paused:
                gc.enable()
            self.in_flush = False
            self.fp_raise = False
            evicted, self.evicted = self.evicted, []
            for old in evicted:
                old.free()
        freeze_new_kernels()
        if checks:
            value_warnings.issue(checks)

    # -- plan cache -----------------------------------------------------------------
    def plan(self, key: Any, build: Callable[[], Any]) -> Any:
        """The cached plan for ``key`` (built by ``build()`` on a miss; least recently used plans are
        evicted, identically on every rank)."""
        p = self.plans.get(key)
        if p is not None:
            self.plans.move_to_end(key)
            self.stats["plan_hits"] += 1
            return p
        t0 = time.perf_counter_ns()
        p = build()
        self.stats["plan_build_ns"] += time.perf_counter_ns() - t0
        self.stats["plans_built"] += 1
        self.plans[key] = p
        while len(self.plans) > MAX_PLANS:
            _, old = self.plans.popitem(last=False)
            if self.in_flush:       # an evaluation with more plans than the cache holds may still use it
                self.evicted.append(old)
            else:
                old.free()
        return p


_CONTEXTS: Dict[Any, ArrayContext] = {}

#: Task kinds whose units run numba code over the elements (fused kernels, transposes, packs, swaps, handlers of
#: indexed copies): numba has no float16.
NUMBA_KINDS = frozenset(("assign", "reduce", "transpose", "swap", "indexed", "redistribute"))


def refuse_float16(task: Task) -> None:
    """Raise UnsupportedOperation if ``task`` (of a :data:`NUMBA_KINDS` kind) reads or writes float16 elements,
    before it is recorded, so every rank raises the same error at the same operation. Compiled on a rank only
    when it holds elements, the kernel would fail on some ranks while the others went on and waited for them:
    a hang until ``NBMPI_TIMEOUT``, or an MPI abort at the next message. Local."""
    from .errors import UnsupportedOperation
    for leaf in task.reads() + task.writes():
        if leaf.dtype.char == "e":
            raise UnsupportedOperation(
                f"{task.desc}: float16 elements cannot be copied, cast, selected or moved between ranks here "
                "(the compiled kernels have no float16; arithmetic, ufuncs, reductions, sort, matmul and masks "
                "work): use float32, e.g. create the array with dtype=numpy.float32")


def context_for(comm=None) -> ArrayContext:
    """The context of ``comm`` (default ``COMM_WORLD``), created on first use. Local."""
    if comm is None:
        comm = runtime.world()
    key = comm.py2f() if hasattr(comm, "py2f") else id(comm)
    ctx = _CONTEXTS.get(key)
    if ctx is None or ctx.comm != comm:
        ctx = _CONTEXTS[key] = ArrayContext(comm)
    return ctx


_UNCHANGED: Any = object()


#: Environment switch of NumPy math (:mod:`.numpy_math`; default on: results identical to NumPy's; ``0``/``off``
#: computes ``exp``, ``log``, ``power``, ... inside the fused kernels, faster, within an ulp or two of NumPy's).
NUMPY_MATH_ENV = "NBMPI_DISTARRAY_NUMPY_MATH"
#: Whether NumPy math is on in this process (``configure(numpy_math=...)`` changes it).
NUMPY_MATH = {"on": env_switch(NUMPY_MATH_ENV)}


def configure(latency_hiding: Optional[bool] = None, threshold: Optional[int] = None,
              chunk_elems: Optional[int] = None, timeout: Any = _UNCHANGED, comm=None,
              numpy_math: Optional[bool] = None) -> Dict[str, Any]:
    """Change the evaluation settings of the context of ``comm`` (default ``COMM_WORLD``); arguments
    left out keep their value (``timeout``: seconds, or None to wait forever; ``numpy_math``: NumPy's
    own transcendental functions instead of the compiled ones, for results identical to NumPy's,
    process-wide, see :mod:`.numpy_math`). Local; call it on every rank with the same values.
    Returns the settings now in force."""
    if numpy_math is not None:
        NUMPY_MATH["on"] = bool(numpy_math)
    ctx = context_for(comm)
    if latency_hiding is not None:
        ctx.latency_hiding = bool(latency_hiding)
    if threshold is not None:
        if threshold < 1:
            raise DistArrayError(f"threshold must be at least 1 recorded operation, got {threshold}")
        ctx.threshold = int(threshold)
    if chunk_elems is not None:
        if chunk_elems < 1:
            raise DistArrayError(f"chunk_elems must be at least 1, got {chunk_elems}")
        ctx.chunk_elems = int(chunk_elems)
    if timeout is not _UNCHANGED:
        if timeout is not None and timeout <= 0:
            raise DistArrayError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        ctx.timeout = timeout
    return dict(latency_hiding=ctx.latency_hiding, threshold=ctx.threshold, chunk_elems=ctx.chunk_elems,
                timeout=ctx.timeout, numpy_math=NUMPY_MATH["on"])
