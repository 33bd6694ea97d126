"""``concatenate`` results that are not stored until something needs them.

``r = concatenate([a, b, c])`` along axis 0 into a block-distributed result whose operands are all whole
distributed arrays (not views: a join keeps its parts alive; none a lazy join itself: no chains) records
nothing: the result's base keeps its parts (``join``: ``(lo, hi, part)`` per operand, rows ``lo:hi`` of the
result) and has no local buffer. When the only use of ``r`` is to be gathered (``r.to_numpy()``,
``numpy.asarray(r)``), each part is gathered straight into its rows of the NumPy result
(:func:`~.gather_direct.gather_join`): the result's distributed block is never written, its pages never touched.

Anything else *materialises* the join (:func:`materialise`: the copies ``r[lo:hi] = part`` are recorded, as an
eager ``concatenate`` records them), before it can see the difference:

* a recorded task reading or writing ``r`` (``ArrayContext.record`` calls :func:`on_record` first);
* a recorded write to a part, or a direct write into a part's buffer (``.local``, a boolean-mask assignment):
  each part's base lists the join among its ``aliases``, so ``Base.unshare`` (called on those writes, as for
  copy-on-write views) materialises the join first, and the copies read the values from before the write;
* ``Base.ensure`` of ``r`` (``.local``, a reshape, anything wanting its buffer): the copies are recorded and
  evaluated at once (a force point: every such caller is collective).

Call SPMD: every rank makes the same joins and materialises them at the same points.
"""
from __future__ import annotations

import weakref
from typing import Any, List, Tuple

from . import fallback
from .indexing import View

__all__ = ["make_lazy", "materialise", "on_record", "forget_dead"]


def make_lazy(out: Any, parts: List[Tuple[int, int, Any]]) -> None:
    """Make ``out`` (a new DistArray over a whole, never allocated, block-distributed base) the lazy join of
    ``parts`` (``(lo, hi, DistArray)``: rows ``lo:hi`` of ``out`` along axis 0 are the part). Local. Called by
    ``concatenate`` only."""
    base = out._base
    ctx = base.context
    base.join = list(parts)
    ref = weakref.ref(base)
    for _, _, x in parts:
        pb = x._base
        if pb.aliases is None:
            pb.aliases = []
        pb.aliases.append(ref)
        ctx.shared += 1            # ArrayContext.record now ends the "sharing" on a write to a part
    ctx.lazy_joins += 1


def _forget(base: Any) -> List[Tuple[int, int, Any]]:
    """Take the parts out of ``base`` (a lazy join) and remove it from its parts' aliases. Local."""
    parts, base.join = base.join, None
    ctx = base.context
    ctx.lazy_joins -= 1
    for _, _, x in parts:
        pb = x._base
        ctx.shared -= 1
        if pb.aliases:
            pb.aliases = [r for r in pb.aliases if r() is not None and r() is not base] or None
    return parts


def forget_dead(base: Any) -> None:
    """Bookkeeping of a lazy join whose base dies unmaterialised (``Base.__del__``): the context's counters."""
    ctx = base.context
    ctx.lazy_joins -= 1
    ctx.shared -= len(base.join)
    base.join = None


def materialise(base: Any) -> None:
    """Record the copies of lazy join ``base`` (``base[lo:hi] = part`` for each part); ``base`` becomes an
    ordinary array written by them. Local, recorded (not evaluated, never a threshold flush, as it may run
    inside the recording of another operation: the caller flushes if it needs the values now)."""
    parts = _forget(base)
    whole = fallback.REGISTRY["DistArray"](base, View.full(base.shape))
    ctx = base.context
    ctx.hold_flush += 1     # called while another operation is being recorded: its temporaries are not held yet
    try:
        for lo, hi, x in parts:
            whole[lo:hi] = x
    finally:
        ctx.hold_flush -= 1


def on_record(task: Any) -> None:
    """Materialise every lazy join ``task`` (being recorded) reads or writes, so its copies come first. Local.
    Called by ``ArrayContext.record`` while a lazy join exists."""
    for leaf in task.reads():
        if leaf.base.join is not None:
            materialise(leaf.base)
    for leaf in task.writes():
        if leaf.base.join is not None:
            materialise(leaf.base)
