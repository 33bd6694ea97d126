"""Grants: this rank's share of a bounded reduction (``pool.consume``), a rank-local lazy value.

A :class:`Grant` resolves at the next force point together with everything
else pending: its value is ``request * scale`` where the scale follows from
the pool's level before the consume, the sum of all ranks' requests and the
floor (:func:`~.lazy._grant_scale`).
"""
from __future__ import annotations

import numpy as np

from .lazy import _ensure_done, _eval, _grant_scale


class Grant:
    """This rank's share of a :meth:`SharedPool.consume`: a rank-local value.

    Reading it (``float()``, ``.value``, arithmetic, numpy) is a force point
    if it is not resolved yet.
    """

    __slots__ = ("_before", "_batch", "_blk", "_i", "request", "floor", "_value", "shape")

    def __init__(self, before, batch, blk, i, request, floor, shape):
        self._before, self._batch, self._blk, self._i = before, batch, blk, i
        self.request, self.floor, self.shape = request, floor, shape
        self._value = None

    @property
    def value(self):
        """The granted amount (float, or array for array pools). Force point if pending."""
        if self._value is None:
            b = self._batch
            if not b.done:
                _ensure_done(((0, b),))
            total = b.res[self._blk][self._i]
            if self._blk == 2:
                total = total.reshape(self.shape)
            before = self._before
            level = before if type(before) is float else _eval(before)
            self._value = self.request * _grant_scale(level, total, self.floor)
            if isinstance(self._value, np.ndarray):
                self._value.flags.writeable = False
            self._before = None
        return self._value

    @property
    def pending(self) -> bool:
        return self._value is None and not self._batch.done

    def __float__(self):
        return float(self.value)

    def __array__(self, dtype=None, copy=None):
        v = np.asarray(self.value)
        return v if dtype is None else v.astype(dtype)

    def __repr__(self):
        return f"Grant({self._value!r})" if self._value is not None else f"Grant(<pending: {self.request!r}>)"

    def __str__(self):
        return str(self.value)

    def __format__(self, spec):
        return format(self.value, spec)

    def __add__(self, o):
        return self.value + o

    def __radd__(self, o):
        return o + self.value

    def __sub__(self, o):
        return self.value - o

    def __rsub__(self, o):
        return o - self.value

    def __mul__(self, o):
        return self.value * o

    def __rmul__(self, o):
        return o * self.value

    def __truediv__(self, o):
        return self.value / o

    def __rtruediv__(self, o):
        return o / self.value

    def __lt__(self, o):
        return self.value < o

    def __le__(self, o):
        return self.value <= o

    def __gt__(self, o):
        return self.value > o

    def __ge__(self, o):
        return self.value >= o

    def __eq__(self, o):  # type: ignore[override]
        return self.value == o

    __hash__ = None  # type: ignore[assignment]
