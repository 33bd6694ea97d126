"""The scheduler of a force point: every transfer first, local work while they fly, waits last.

:func:`run_flush` evaluates the operations recorded since the last force point:

1. **Agreement** (collective): the ranks compare a hash of what they recorded (one small
   non-blocking allreduce; with latency hiding it completes while the rank works, and is
   checked before any collective of the flush starts). If it differs, each rank learns the
   first differing operation of every rank and all raise :class:`DistArrayDivergence` with the
   same text; none hangs.
2. **Fusion** (:mod:`~.fusion`): groups of work, each with a ``kind``.
3. **Lowering**: each group's kind is looked up in the operation tables (:mod:`~.operations`): a
   lowering finds the operation's plan (cached by its key) and returns its units (:mod:`~.units`);
   a barrier kind (irregular copies) runs as a collective step of its own. The scheduler knows
   no operation: it orders units and executes them.
4. **Execution**, with latency hiding (DistNumPy's operation flush):

   * all receives are started at once (persistent requests on pre-allocated buffers);
   * units are kept in two ready queues: communication (pack + start a send, start a
     reduction's allgather) and computation (a block of a fused kernel, an unpack, a
     matrix product). A unit is ready when the messages it reads have arrived and the
     earlier units it conflicts with (same base, overlapping local rows, one of them
     writing) are done, directly or through units that wait for them (DistNumPy's dependency
     heuristic, on rows indexed per base: :mod:`~.dependencies`);
   * communication units always go first; then one computation unit runs (of the ready ones, the
     oldest group's first, so that a group finishes, and the buffers it was the last to use are given
     back, before younger groups allocate theirs), and ``Testsome`` polls the requests in flight
     before the next one;
   * only when no unit is ready the rank blocks, in :func:`nbmpi.workers.core.waiting.wait_each`
     (``NBMPI_TIMEOUT``, Ctrl-C), until some request completes.

   Without latency hiding (``NBMPI_LATENCY_HIDING=0`` or ``evaluate(latency_hiding=False)``)
   each group in turn exchanges its messages with blocking waits, then computes.

   Either way, once the last group using a dead temporary has run completely, its buffer goes
   back to the pool for the later groups of the same flush (:mod:`~.releases`).

Tracing: each send is recorded when started; each blocked interval is recorded once, as the
receive (or allgather) that ended it, with its full length as ``wait`` (so
``Trace.summary()`` gives each rank's wait %); receives that completed while the rank
computed are recorded with zero wait. Sends and receives carry matching (tag, seq), so the
timeline draws their arrows.
"""
from __future__ import annotations

import time
from collections import deque
from functools import partial
from heapq import heappop, heappush
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from ..core import runtime
from ..tracing import tracer as tracing
from ..core import waiting
from ..core import spmd
from .errors import DistArrayDivergence, DistArrayError, DistArrayTimeout
from .dependencies import order_units
from . import fp_errors
from .fallback import user_frame
from .fusion import optimize
from .operations import BARRIERS, LOWERINGS
from .releases import Releases
from .units import GroupRun, Label, Unit, Waitable, after

__all__ = ["run_flush", "ForcePoint"]

K_SEND = tracing.register_kind("distarray_send")
K_RECV = tracing.register_kind("distarray_recv")
K_COLL = tracing.register_kind("distarray_allgather")
K_CHECK = tracing.register_kind("distarray_check")
K_WAIT = tracing.register_kind("distarray_wait")
_now = time.perf_counter_ns


#: Requests in flight tested by most polls of :meth:`_Flush._poll` (the oldest ones), and how often a poll tests
#: them all: ``Testsome`` converts every request it is given, so testing ~100 in flight after every unit was the
#: largest single cost of a small-step loop's execution besides BLAS and waits (LU n=2700).
POLL_WINDOW = 16
FULL_POLL_EVERY = 8

#: The releases of a flush before its groups are known and after it ended (nothing to give back; never changes).
_NO_RELEASES = Releases([])


def _timeout_text(rank: int, peer: Optional[int], op: Any, waited: float) -> DistArrayTimeout:
    """The timeout error of a wait named by a :class:`~.units.Label`: its ``op`` the text."""
    return DistArrayTimeout(rank, peer, str(op), waited)


class _Flush:
    """One force point on this rank: lowers every group into units through the operation tables
    (:meth:`build`; it is the :class:`~.units.Lowering` the operations build into), orders them, runs
    them (:meth:`execute`) and records every transfer and wait into the tracer."""

    def __init__(self, context, reason: str, hiding: bool):
        self.ctx = context
        self.reason = reason
        self.hiding = hiding
        self.MPI = runtime.MPI()
        self.tr = tracing.get_tracer()
        self.trace_on = bool(self.tr.enabled)
        self.rank, self.size = context.rank, context.size
        self.active: List[Waitable] = []
        self._polled: Optional[List[Waitable]] = None   # the list _poll made _polled_reqs from
        self._polled_reqs: List[Any] = []
        self._npolls = 0
        self._testsome = self.MPI.Request.Testsome
        self.ready_comm: deque = deque()
        #: ready computation units as a heap of ``(group order, enqueue number, unit)``
        self.ready_comp: List[Tuple[int, int, Unit]] = []
        self.enqueued = 0
        self.releases = _NO_RELEASES
        self.nunits = 0
        self.ndone = 0
        self.wait_ns = 0
        self.runs: List[GroupRun] = []
        self.msgs_sent = 0
        self.bytes_sent = 0
        self.msgs_recv = 0
        self.blocks = 0
        self.agreement: Optional["_Agreement"] = None
        #: the floating-point flags the units raise (NumPy's error handling, :mod:`.fp_errors`)
        self.fpe = fp_errors.Collector()

    # -- tracing ---------------------------------------------------------------------
    def _rec(self, kind: int, direction: int, peer: int, tag: int, nbytes: int, t0: int, t1: int, wait: int,
             seq: int, count: int = 0) -> None:
        if self.trace_on:
            p = self.ctx.tracer_ranks[peer] if peer >= 0 else -1
            self.tr.record(kind, direction, p, tag, nbytes, t0, t1, wait=wait, seq=seq, chan=self.ctx.chan,
                           count=count)

    def op_name(self, what: Any) -> str:
        return f"distributed-array force point ({self.reason}) flush {self.ctx.flush_no}: {what}"

    def _op_label(self, what: Any) -> Any:
        """:meth:`op_name` of ``what``, built when first shown if ``what`` is a :class:`~.units.Label`
        (the flush itself is not referred to: the label may outlive it in an error)."""
        if not isinstance(what, Label):
            return self.op_name(what)
        return Label(partial(str.format, "distributed-array force point ({}) flush {}: {}", self.reason,
                             self.ctx.flush_no, what))

    # -- blocking waits (the only place a rank blocks) ----------------------------------
    def _wait_one(self, waitables: List[Waitable], what: Any) -> int:
        """Block until one of ``waitables`` completes; return its index. Records the blocked time. ``what``
        (text or a :class:`~.units.Label`) names the wait in a timeout's message."""
        reqs = [w.req for w in waitables]
        peers = [w.peer if w.peer >= 0 else None for w in waitables]
        t0 = _now()
        gen = waiting.wait_each(reqs, self.ctx.timeout, self.rank, peers, self._op_label(what), _timeout_text,
                                on_abandon=None, cancellable=False)
        try:
            idx = next(gen)
        finally:
            gen.close()
        t1 = _now()
        self.wait_ns += t1 - t0
        w = waitables[idx]
        self._completed(w, t0, t1, t1 - t0)
        return idx

    def _completed(self, w: Waitable, t0: int, t1: int, wait: int) -> None:
        w.done = True
        if w.kind == "recv":
            self.msgs_recv += 1
            self._rec(K_RECV, tracing.DIR_RECV, w.peer, w.tag, w.nbytes, t0, t1, wait, w.seq)
        elif w.kind == "coll":
            self._rec(K_COLL, tracing.DIR_NONE, -1, w.tag, w.nbytes, t0, t1, wait, w.seq, count=self.size)
        elif w.kind == "check":
            self._rec(K_CHECK, tracing.DIR_NONE, -1, w.tag, w.nbytes, t0, t1, wait, w.seq, count=self.size)
        elif wait > 0:
            self._rec(K_WAIT, tracing.DIR_NONE, w.peer, w.tag, w.nbytes, t0, t1, wait, w.seq)
        for u in w.units:
            u.ndeps -= 1
            if u.ndeps == 0:
                self._enqueue(u)

    def _poll(self) -> None:
        """Test the requests in flight (``Testsome``) and release what they unblock: the oldest
        :data:`POLL_WINDOW` of them (the receives of the oldest groups come first), every one of them each
        :data:`FULL_POLL_EVERY`-th time (a request outside the window is found complete at most that many polls
        late; MPI progresses every request whichever are tested, and a blocked rank waits on all of them). The
        list of requests follows ``active`` (made again only when ``active`` is replaced, which happens when
        requests complete; extended when it grew)."""
        act = self.active
        n = len(act)
        if not n:
            return
        reqs = self._polled_reqs
        if self._polled is not act:
            reqs = self._polled_reqs = [w.req for w in act]
            self._polled = act
        elif len(reqs) < n:                  # only appended to since (started sends)
            reqs.extend([w.req for w in act[len(reqs):]])
        self._npolls += 1
        if n > POLL_WINDOW and self._npolls % FULL_POLL_EVERY:
            idx = self._testsome(reqs[:POLL_WINDOW])
        else:
            idx = self._testsome(reqs)
        if not idx:
            return
        t = _now()
        done = set(idx)
        for i in sorted(done):
            self._completed(act[i], t, t, 0)
        keep = [i for i in range(n) if i not in done]
        self.active = self._polled = [act[i] for i in keep]
        self._polled_reqs = [reqs[i] for i in keep]

    # -- unit queues -------------------------------------------------------------------
    def _enqueue(self, u: Unit) -> None:
        if u.kind in ("send", "coll"):
            self.ready_comm.append(u)
            return
        self.enqueued += 1
        o = u.owner
        heappush(self.ready_comp, (-1 if o is None else o.order, self.enqueued, u))

    def _run_unit(self, u: Unit) -> None:
        u.fn()
        self.fpe.after(u.owner)
        u.done = True
        self.ndone += 1
        o = u.owner
        if o is not None:
            o.pending -= 1
            if o.pending == 0:
                self.releases.group_done(o.group)
        for d in u.dependents:
            d.ndeps -= 1
            if d.ndeps == 0:
                self._enqueue(d)

    # -- what a lowering may use (see operations) -----------------------------------------
    def start(self, w: Waitable) -> None:
        """Register the started request ``w``: polled with the others in flight, its units released on completion."""
        self.active.append(w)

    def sent(self, req, peer: int, nbytes: int, inst, t0: int, label: Any) -> Waitable:
        """A send of ``nbytes`` to ``peer`` on ``inst``'s tag has just been started (``req``, packing began at
        ``t0``): count it, trace it, and :meth:`start` its waitable, which is returned."""
        self.msgs_sent += 1
        self.bytes_sent += nbytes
        self._rec(K_SEND, tracing.DIR_SEND, peer, inst.tag, nbytes, t0, _now(), 0, inst.uses)
        w = Waitable(req, "send", peer, inst.tag, nbytes, inst.uses, label, inst)
        self.start(w)
        return w

    def group_run(self, plan, flush_no: int, label: str) -> Tuple[Any, GroupRun]:
        """``plan``'s instance for flush ``flush_no`` (one more use counted) and a new :class:`GroupRun` labelled
        ``label`` holding it, with a waitable per incoming message already added (:meth:`receives`)."""
        inst = plan.acquire(self.ctx, flush_no)
        inst.uses += 1
        run = GroupRun(label)
        run.inst = inst
        self.receives(run, plan, inst, label)
        return inst, run

    def receives(self, run: GroupRun, plan, inst, label: str) -> None:
        """Add to ``run`` a waitable per incoming message of ``plan`` (the instance's persistent receives, which
        the scheduler starts all at once)."""
        for k, m in enumerate(plan.msgs_in):
            run.recvs.append(Waitable(inst.recv_reqs[k], "recv", m.peer, inst.tag, m.nbytes, inst.uses,
                                      Label(partial(str.format, "receive for {} from rank {}", label, m.peer)), inst))

    def send_unit(self, plan, inst, k: int, local_of: Optional[Callable[[int], np.ndarray]], serial_of, label: str,
                  pack: Optional[Callable[[], None]] = None) -> Unit:
        """The unit that packs outgoing message ``k`` of ``plan`` (``plan.pack`` with ``local_of``, or ``pack()``)
        and starts its persistent send. Its access reads each part's rows (``serial_of(array slot)``; with
        ``serial_of`` None the caller sets ``access``)."""
        m = plan.msgs_out[k]
        what = Label(partial(str.format, "send for {} to rank {}", label, m.peer))   # text built if shown

        def fn() -> None:
            t0 = _now()
            if pack is None:
                plan.pack(inst, k, local_of)
            else:
                pack()
            req = inst.send_reqs[k]
            req.Start()
            self.sent(req, m.peer, m.nbytes, inst, t0, what)

        access = () if serial_of is None else tuple((serial_of(p.array), p.hull[0], p.hull[1], "R")
                                                    for p in m.parts)
        return Unit("send", fn, f"send to {m.peer}", access)

    # -- building the units ----------------------------------------------------------------
    def build(self, groups: List[Any]) -> None:
        """Lower ``groups`` into units through :data:`~.operations.LOWERINGS` (one segment of the flush: a
        previous segment, if any, has been executed completely), then, with latency hiding, order the
        units of different groups by their accesses."""
        flush_no = self.ctx.flush_no
        self.runs = []
        self.nunits = self.ndone = 0
        for g in groups:
            lower = LOWERINGS.get(g.kind)
            if lower is None:  # pragma: no cover - every group kind has a lowering
                raise DistArrayError(f"internal error: no lowering for operations of kind {g.kind!r}")
            self.runs.append(lower(self, g, flush_no))
        if self.hiding:
            self._dependencies()

    # -- dependencies between groups (latency hiding only) ---------------------------------
    def _dependencies(self) -> None:
        """Make each unit wait for the earlier groups' units it conflicts with (same base, overlapping
        local rows, not both reading, not both accumulating), and each collective for the previous one:
        :func:`~.dependencies.order_units` (rows indexed per base, near-linear in the accesses)."""
        order_units(self.runs)

    # -- execution -------------------------------------------------------------------
    def execute(self, groups: List[Any]) -> None:
        """Run the units of the segment built from ``groups`` (the list given to :meth:`build`)."""
        for k, (run, g) in enumerate(zip(self.runs, groups)):
            run.group, run.order = g, k
        if self.hiding:
            self._execute_hiding()
        else:
            self._execute_blocking()

    def _execute_hiding(self) -> None:
        MPI = self.MPI
        recvs = [w for run in self.runs for w in run.recvs]
        if recvs:
            MPI.Prequest.Startall([w.req for w in recvs])
            self.active.extend(recvs)
        units: List[Unit] = []
        for run in self.runs:
            mine = run.units()
            run.pending = len(mine)
            for u in mine:
                u.owner = run
            units.extend(mine)
            if not mine:
                self.releases.group_done(run.group)
        agr = self.agreement
        verify = Unit("compute", agr.verify, "verify the agreement")
        if not agr.waitable.done:
            verify.ndeps = 1
            agr.waitable.units.append(verify)
            self.active.append(agr.waitable)
        for run in self.runs:
            if run.coll is not None:
                after(run.coll, verify)
        units.append(verify)
        self.nunits = len(units)
        for u in units:
            if u.ndeps == 0:
                self._enqueue(u)
        comm_q, comp_q = self.ready_comm, self.ready_comp
        while True:
            while comm_q:
                self._run_unit(comm_q.popleft())
            if comp_q:
                self._run_unit(heappop(comp_q)[2])
                self._poll()
                continue
            if not self.active:
                break
            self._wait_one(self.active, self._blocked_on())
            self.active = [w for w in self.active if not w.done]
            self._poll()
        if self.ndone != self.nunits:
            stuck = [u.label for u in units if not u.done][:3]
            raise DistArrayError(f"internal error: {self.nunits - self.ndone} units of the flush never became "
                                 f"ready (first: {stuck}); please report this with the program")

    def _blocked_on(self) -> Label:
        """What the rank is about to block on, as text built only if shown (a timeout's message, the
        state probe's ``str(waiting.current[0])``): most waits end without anyone reading it."""
        return Label(partial(str.format, "waiting for {}", self.active[0].label))

    def _execute_blocking(self) -> None:
        MPI = self.MPI
        for run in self.runs:
            units = run.units()
            self.nunits += len(units)
            if run.recvs:
                MPI.Prequest.Startall([w.req for w in run.recvs])
                self.active.extend(run.recvs)
            for u in run.sends:
                self._run_unit(u)
            # blocking exchange: every message of this group, before any computation
            while self.active:
                self._wait_one(self.active, self._blocked_on())
                self.active = [w for w in self.active if not w.done]
            for u in run.computes:
                u.fn()
                self.fpe.after(run)
                u.done = True
                self.ndone += 1
            if run.coll is not None:
                run.coll.fn()
                self.ndone += 1
                while self.active:
                    self._wait_one(self.active, self._blocked_on())
                    self.active = [w for w in self.active if not w.done]
            if run.finish is not None:
                run.finish.fn()
                self.fpe.after(run)
                self.ndone += 1
            self.releases.group_done(run.group)

    def dispose(self) -> None:
        """Break the reference cycles of the flush (units' closures refer back to it, the agreement to
        its verify unit), so that the bases they hold die, and their buffers return to the pool, as
        soon as the flush returns instead of at the next cyclic garbage collection."""
        for run in self.runs:
            for w in run.recvs:
                w.units = []
            run.group = None
            for u in run.units():
                u.fn = None
                u.dependents = []
                u.owner = None
        if self.agreement is not None:
            self.agreement.waitable.units = []
            self.agreement.tasks = None
        self.runs = []
        self.active = []
        self.ready_comm.clear()
        self.ready_comp.clear()
        self.agreement = None
        self.releases = _NO_RELEASES

    def abort(self) -> None:
        """After an error: cancel the receives still in flight; instances with a send or collective
        in flight are never reused (their buffers may still be read)."""
        for w in self.active:
            if w.done:
                continue
            if w.cancellable:
                if not waiting.cancel(w.req) and w.inst is not None:
                    w.inst.broken = True
            elif w.inst is not None:
                w.inst.broken = True
        self.active = []


# --------------------------------------------------------------------------- agreement
def _hash_tasks(tasks) -> int:
    """The combined hash of the tasks' signatures (Python's ``hash`` of tuples of numbers: the same in every
    process), reduced to 62 bits so that ``-h`` never overflows. The per-task hashes are made only when the
    ranks disagree (:func:`_per_task_hashes`)."""
    return spmd.number_key(tuple([t.sig for t in tasks]))


def _per_task_hashes(tasks) -> List[int]:
    """Each task's hash, for locating the first differing operation (the signatures are cached on the tasks
    when first hashed, so fusion's later rewrites of a task's expression do not change them)."""
    return [spmd.number_key(t.sig) for t in tasks]


class _Agreement:
    """The collective check that every rank recorded the same operations (one small non-blocking
    allreduce of a hash). With latency hiding it is started first and completes while the rank
    works; it must be verified before any collective of the flush starts."""

    def __init__(self, fl: _Flush, tasks):
        self.fl, self.tasks = fl, tasks
        ctx = fl.ctx
        total = _hash_tasks(tasks)
        self.t0 = _now()
        self.check = spmd.KeyCheck(ctx.dcomm, total, len(tasks))
        self.req = self.check.req
        self.waitable = Waitable(self.req, "check", -1, 0, 32, ctx.flush_no, "agreeing on the recorded operations")
        self.verified = False

    def wait(self) -> None:
        """Block until the check completed (if it has not), then :meth:`verify`."""
        if not self.waitable.done:
            self.check.wait(self.fl.ctx.timeout, self.fl.rank, self.fl.op_name("agreeing on the recorded operations"),
                            DistArrayTimeout)
            self.waitable.done = True
            self.fl._rec(K_CHECK, tracing.DIR_NONE, -1, 0, 32, self.t0, _now(), -1, self.fl.ctx.flush_no,
                         count=self.fl.size)
        self.verify()

    def verify(self) -> None:
        """Raise DistArrayDivergence (on every rank) if the ranks' hashes differ."""
        if self.verified:
            return
        self.verified = True
        if self.check.agreed:
            return
        _diagnose(self.fl, self.tasks, _per_task_hashes(self.tasks))


def _diagnose(fl: _Flush, tasks, per: List[int]) -> None:
    """The ranks' hashes differ: find the first differing operation and raise on every rank."""
    ctx, MPI = fl.ctx, fl.MPI
    # diagnosis: every rank's per-operation hashes, then the first differing operation's text
    how = dict(timeout=ctx.timeout, rank=ctx.rank, op=fl.op_name("diagnosing a divergence"), error=DistArrayTimeout)
    diff = spmd.first_difference(spmd.gather(ctx.dcomm, per, **how))
    k = len(tasks) if diff is None else diff.index
    mine_text = tasks[k].desc if k < len(tasks) else f"nothing (this rank recorded only {len(tasks)} operations)"
    descs = spmd.gather(ctx.dcomm, mine_text[:400], **how)
    detail = f"operation {k + 1} since the previous force point: " + "; ".join(
        f"rank {r} recorded {d}" for r, d in enumerate(descs))
    # the ranks may have created different numbers of arrays: agree on the serial numbers of the
    # next ones, so that consistent operations after the error are recognized as equal again
    ser = np.array([ctx._serial], dtype=np.int64)
    top = np.empty(1, dtype=np.int64)
    req = ctx.dcomm.Iallreduce(ser, top, op=MPI.MAX)
    waiting.wait(req, ctx.timeout, ctx.rank, None, fl.op_name("diagnosing a divergence"), DistArrayTimeout,
                 cancellable=False)
    ctx._serial = int(top[0])
    raise DistArrayDivergence(ctx.rank, f"force point {fl.reason}", detail)


class ForcePoint:
    """The collective a force point leads to (a direct gather), checked by the agreement after the recorded
    operations (:meth:`~.context.ArrayContext.flush`'s ``point``): ``sig``, numbers the same on every rank for the
    same collective (kind, array serial, shape, dtype, root); ``desc``, its text in a divergence's message."""

    __slots__ = ("sig", "desc")

    def __init__(self, sig: Tuple, desc: str):
        self.sig, self.desc = sig, desc


def _run_segments(context, fl: _Flush, agr: "_Agreement", groups: List[Any]) -> None:
    """Build and execute ``groups`` segment by segment: a barrier group (irregular copies through the Aggregator)
    runs as a collective step of its own, after the groups before it have run to completion."""
    segment: List[Any] = []
    for g in groups + [None]:
        if g is not None and g.kind not in BARRIERS:
            segment.append(g)
            continue
        if segment:
            fl.build(segment)
            fl.fpe.clear()      # flags left by the program or the lowering are not the units'
            fl.execute(segment)
            segment = []
        if g is not None:
            agr.wait()  # the ranks agreed on the recorded operations before this collective step
            fl.fpe.clear()
            BARRIERS[g.kind](context, g.task, fl.op_name(g.kind))
            fl.fpe.after(g)
            fl.releases.group_done(g)


def _fp_errors(context, fl: _Flush) -> None:
    """Handle the floating-point flags the flush's units raised as NumPy would (:mod:`.fp_errors`): warnings on
    this rank; with an operation recorded under a ``raise`` mode (``context.fp_raise``, the same on every rank),
    a FloatingPointError on every rank if any rank found such a flag (collective then)."""
    found = fl.fpe.found() if fl.fpe.hits else []
    if context.fp_raise:    # first, as NumPy stops at the first kind that raises
        how = dict(timeout=context.timeout, rank=context.rank, error=DistArrayTimeout,
                   op=fl.op_name("agreeing on floating-point errors"))
        fp_errors.raise_agreed(context.dcomm, found, how, fl.fpe.filters)
    if found:
        fp_errors.report(found, user_frame(), fl.fpe.filters)


def run_flush(context, tasks, reason: str, hiding: bool, point: Optional[ForcePoint] = None) -> None:
    """Evaluate ``tasks`` (see the module doc); ``point``, if given, is agreed on after them (it runs no unit).
    Collective over the context's communicator."""
    t_start = _now()
    context.ensure_comm()
    context.flush_no += 1
    fl = _Flush(context, reason, hiding)
    agr = fl.agreement = _Agreement(fl, tasks if point is None else list(tasks) + [point])
    if not hiding:
        agr.wait()  # blocking: agree first
    groups, fstats = optimize(tasks)
    fl.releases = Releases(groups)
    try:
        with np.errstate(all="ignore"):   # NumPy's loops in units must not raise on some ranks: flags read instead
            _run_segments(context, fl, agr, groups)
        # Also when fusion dropped every task (writes into arrays that died): the allreduce must complete
        # before its buffers are dropped, else MPI writes its result into freed memory, maybe the next check's.
        agr.wait()
    except BaseException as err:
        fl.abort()
        if not agr.verified and not isinstance(err, (DistArrayTimeout, KeyboardInterrupt)):
            agr.wait()  # a divergence explains the error better (raises DistArrayDivergence)
        raise
    finally:
        fl.dispose()
    _fp_errors(context, fl)
    st = context.stats
    st["flushes"] += 1
    st["groups"] += len(groups)
    st["split"] += fstats["split"]
    st["inlined"] += fstats["inlined"]
    st["dropped"] += fstats["dropped"]
    st["swapped"] += fstats["swapped"]
    st["redistributed"] += fstats["redistributed"]
    st["blocks"] += fl.blocks
    st["messages_sent"] += fl.msgs_sent
    st["bytes_sent"] += fl.bytes_sent
    st["messages_received"] += fl.msgs_recv
    st["wait_ns"] += fl.wait_ns
    dt = _now() - t_start
    st["flush_ns"] += dt
    context.last = dict(reason=reason, latency_hiding=hiding, tasks=len(tasks),
                       kinds=[g.kind for g in groups],
                       blocks=fl.blocks, messages_sent=fl.msgs_sent, bytes_sent=fl.bytes_sent,
                       messages_received=fl.msgs_recv, wait_ns=fl.wait_ns, flush_ns=dt, **fstats)
