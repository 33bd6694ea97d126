"""Pools: shared float variables from which ranks draw with bounded reductions.

``g = p.consume(request, floor)`` on a :class:`SharedPool` (made by
:func:`pool`) asks for ``request``; every rank's :class:`~.grants.Grant` and
the pool's new level resolve at the next force point, fused with everything
else pending.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..core.errors import SharedVariableError
from .fusion import fuser
from .grants import Grant
from .implementation import core as _core
from .pending import _NOL
from .values import SharedVar, _snap
from .wire import CONSUME, W_F8, _value_key


class SharedPool(SharedVar):
    """A shared float variable from which ranks draw with bounded reductions (:meth:`consume`).

    Contributions (``+=`` refills, ``-=``...) work as for any shared variable.
    """

    __slots__ = ()

    def __init__(self, level: Any, name: Optional[str] = None):
        super().__init__(level, name=name)
        if self._kind != W_F8:
            raise SharedVariableError(f"pool #{self._id} has dtype {self.dtype}; pools need a float level "
                                      "(e.g. pool(100.0))")

    def consume(self, request: Any, floor: Any = 0.0) -> "Grant":
        """Ask for ``request`` (>= 0, rank-local) from the pool; return this rank's :class:`Grant`.

        Lazy: the grant and the pool's new level resolve at the next force
        point, fused with everything else. If the ranks' total request
        exceeds ``level - floor`` every grant is scaled so the pool ends at
        exactly ``floor``. ``floor`` must be the same on every rank (checked).
        Elementwise for array pools (``request`` broadcast to the pool's shape).
        """
        if _core is not None:   # a float pool and a real request: the same steps, compiled
            grant = _core.consume_f8(self, request, floor)
            if grant is not None:
                return grant
        e = fuser()
        b = e.batch
        before = _snap(self)
        if self.shape == ():
            r = float(request.value if isinstance(request, Grant) else request)
            if not r >= 0.0 or r == float("inf"):
                raise SharedVariableError(f"consume({request!r}) from pool #{self._id}: a request must be a "
                                          "finite number >= 0; return amounts with pool += amount")
            fl = float(floor)
            b.f8.append(r)
            blk, i, w = 0, len(b.f8) - 1, 1
        else:
            r = np.array(np.broadcast_to(np.asarray(request, dtype=np.float64), self.shape), dtype=np.float64)
            if not (np.all(r >= 0.0) and np.all(np.isfinite(r))):
                raise SharedVariableError(f"consume() from pool #{self._id}: every request must be finite "
                                          "and >= 0; return amounts with pool += amount")
            fl = np.array(np.broadcast_to(np.asarray(floor, dtype=np.float64), self.shape))
            if b.arrs is _NOL:
                b.arrs = []
            b.arrs.append([r.reshape(-1).copy(), CONSUME, W_F8])
            blk, i, w = 2, len(b.arrs) - 1, r.size
        b.note((-9, _value_key(fl)))
        grant = Grant(before, b, blk, i, r, fl, self.shape)
        self._new_slot(e, b, CONSUME, blk, i, w, fl)
        return grant


def pool(level: Any, name: Optional[str] = None) -> SharedPool:
    """Create a :class:`SharedPool` (a float shared variable with :meth:`~SharedPool.consume`)."""
    return SharedPool(level, name=name)
