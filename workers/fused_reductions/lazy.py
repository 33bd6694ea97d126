"""Forcing and evaluating lazy values: what reading a pending shared value computes.

A shared variable's value is its base (a number, an array, a lazy
:class:`~.pending._Derived` node or a :class:`~.pending._Snap`) plus pending
entries ``(op, batch, block, index, extra)``. Reading it forces the batches
the entries refer to (a force point: :meth:`Fuser.flush
<.fusion.Fuser.flush>`, collective) and applies the reduced values in
program order (:func:`_apply`); bounded reductions (consume) follow
:func:`_consume_level` / :func:`_grant_scale`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .fusion import fuser
from .pending import _Batch, _Derived, _Snap
from .wire import MAX, MIN, PROD, SUM


def _apply(cast, shape: tuple, v: Any, entries) -> Any:
    """Apply resolved entries (op, batch, block, index, extra) to value ``v`` in program order."""
    for ent in entries:
        op, b, blk, i = ent[0], ent[1], ent[2], ent[3]
        if b.error is not None:
            raise b.error
        r = b.res[blk][i]
        if blk == 2:
            r = r.reshape(shape) if shape else r[0]
        if op == SUM:
            v = cast(v + r)
        elif op == PROD:
            v = cast(v * r)
        elif op == MIN:
            v = cast(np.minimum(v, r) if shape else (r if (r < v or r != r) else v))
        elif op == MAX:
            v = cast(np.maximum(v, r) if shape else (r if (r > v or r != r) else v))
        else:  # CONSUME
            v = cast(_consume_level(v, r, ent[4]))
    return v


def _eval(node) -> Any:
    """Value of a base / snapshot / derived node (forces if it has unresolved entries)."""
    if type(node) is _Derived:
        v = node.value
        if v is None:
            args = node.args
            if len(args) == 2:
                v = node.fn(_arg(args[0]), _arg(args[1]))
            else:
                v = node.fn(*[_arg(a) for a in args])
            if type(v) is not float or node.cast is not float:
                v = node.cast(v)
            node.value = v
            node.args = ()
        return v
    if type(node) is _Snap:
        v = node.base
        ents = node.entries
        if type(v) is float and len(ents) == 1:
            op, b, blk, i, _ = ents[0]
            if op == 0 and blk == 0:
                if not b.done:
                    _ensure_done(ents)
                v = v + b.res[0][i]
                node.base = v
                node.entries = ()
                return v
        if type(v) is _Snap or type(v) is _Derived:
            v = _eval(v)
        if node.entries:
            _ensure_done(node.entries)
            v = _apply(node.cast, node.shape, v, node.entries)
            node.base, node.entries = v, ()
        return v
    return node


def _arg(a: Any) -> Any:
    """Value of an operand of a :class:`_Derived`: a constant, a lazy node, or a *slot
    reference* ``(base, batch, index)`` = float64 base plus one reduced sum word (the
    cheap snapshot of a float64 scalar with one pending sum; constants are never tuples)."""
    t = type(a)
    if t is tuple:
        base, b, i = a
        if not b.done:
            _force(b)
        return base + b.res[0][i]
    if t is _Derived:
        v = a.value
        return v if v is not None else _eval(a)
    if t is _Snap:
        return _eval(a)
    return a


def _force(b: "_Batch") -> None:
    """Make batch ``b`` resolved (a force point) or raise the error that failed it."""
    if b.error is None:
        fuser().flush()
    if b.error is not None:
        raise b.error


def _ensure_done(entries) -> None:
    for ent in entries:
        b = ent[1]
        if not b.done:
            if b.error is not None:
                raise b.error
            fuser().flush()
            if b.error is not None:
                raise b.error
            return


def _consume_level(level, total, floor):
    """Pool level after a consume of ``total`` (sum of requests) with ``floor``."""
    if isinstance(level, np.ndarray) or isinstance(total, np.ndarray):
        level = np.asarray(level, dtype=np.float64)
        avail = np.maximum(level - floor, 0.0)
        return np.where(total <= avail, level - total, np.where(level > floor, floor, level))
    avail = level - floor
    if avail <= 0.0:
        return level
    return level - total if total <= avail else floor


def _grant_scale(level, total, floor):
    if isinstance(level, np.ndarray) or isinstance(total, np.ndarray):
        level = np.asarray(level, dtype=np.float64)
        avail = np.maximum(level - floor, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total <= avail, 1.0, avail / np.where(total > 0, total, 1.0))
    avail = level - floor
    if avail <= 0.0:
        return 0.0 if total > 0 else 1.0
    return 1.0 if total <= avail else avail / total
