"""Buffers of dead temporaries given back to the pool inside a force point, after their last use.

A base the user can no longer see at the force point (``Base.nviews == 0``, not ``exported``)
that the flush materializes (it has several readers, so fusion could not inline it) is needed
only by the groups of this flush that read or write it. :class:`Releases` counts, per such base,
the groups of the flush whose tasks touch it; the scheduler reports each group once all its units
have run (:meth:`Releases.group_done`), and at zero the base's buffer goes back to the
context's :class:`~.context.BufferCache` (:meth:`~.graph.Base.release`), where the next base
of the same shape and dtype allocated by a later group of the same flush finds it.

Counting whole groups, not single units, keeps it exact without trusting every unit to declare
its accesses: a group is done only when every unit of it ran, which includes the unit that waits
for an in-place send from the base's memory (:mod:`~.operations.redistribution`); packed sends
copied the data out when their unit ran. Bases whose buffer was installed by other means than
:meth:`~.graph.Base.ensure` (the caller's memory, ``from_local``) are never given back here.
"""
from __future__ import annotations

from typing import Any, Dict, List

__all__ = ["Releases"]


def _releasable(base: Any) -> bool:
    """True if the user cannot see ``base`` and its local buffer is large enough to be pooled."""
    if base.nviews or base.exported:
        return False
    n = base.dtype.itemsize
    for s in base.local_shape():
        n *= s
    return n >= base.context.buffers.min_bytes


class Releases:
    """The dead temporaries of one force point and the groups that still have to use them.

    Built from the fusion pass's groups (the whole flush, every segment) before anything runs;
    local, deterministic, no communication. Only the scheduler uses it, on the main thread."""

    __slots__ = ("left", "bases_of")

    def __init__(self, groups: List[Any]):
        self.left: Dict[int, int] = {}
        self.bases_of: Dict[int, List[Any]] = {}
        for g in groups:
            mine: Dict[int, Any] = {}
            for t in g.tasks:
                for leaf in t.reads() + t.writes():
                    b = leaf.base
                    if b.serial not in mine and _releasable(b):
                        mine[b.serial] = b
            if mine:
                self.bases_of[id(g)] = list(mine.values())
                for s in mine:
                    self.left[s] = self.left.get(s, 0) + 1

    def group_done(self, group: Any) -> None:
        """Group ``group`` ran completely (every unit, every send from a base's memory completed): give
        back the buffers of the dead temporaries no later group uses. Local, not blocking."""
        bases = self.bases_of.pop(id(group), None)
        if not bases:
            return
        left = self.left
        for b in bases:
            n = left[b.serial] - 1
            left[b.serial] = n
            if n == 0:
                b.release()
