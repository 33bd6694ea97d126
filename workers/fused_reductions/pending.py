"""What is pending between two force points: the batch of one fusion, snapshots, lazy nodes.

* :class:`_Batch`: every contribution made since the last force point (the
  float64 word list, other segments, the signature log) and, once resolved,
  the reduced words (``res``) or the error that failed the fusion.
* :class:`_Snap`: a shared variable's state frozen at one point (base value
  plus pending entries), an operand of lazy arithmetic.
* :class:`_Derived`: a lazily computed shared value ``fn(*operands)``.

With the compiled core the batch and the lazy node are its types (same fields
and constructors). Local, no communication.
"""
from __future__ import annotations

import types
from typing import Any, List, Optional, Tuple

from .implementation import core as _core
from .wire import _LOG_CAP, CREATED, HEADER

_EMPTY: list = []
_NOL: tuple = ()                              # "no list yet" of a batch
_NOD = types.MappingProxyType({})             # "no dict yet" of a batch


class _PyBatchBase:
    """The fields of a batch (the compiled ``BatchBase`` has the same fields and init)."""

    __slots__ = ("f8", "f8_nonsum", "i8", "i8_ops", "arrs", "sig", "nseg", "words", "room", "allsum",
                 "nvars", "log", "kmap", "folded", "done", "res", "error", "cnext", "cpos")

    def __init__(self, threshold_words: int) -> None:
        # float64 scalar segments: one word each in f8 (after the header words); their op
        # is SUM (or CONSUME) unless listed in f8_nonsum {index: op}
        self.f8: List[Any] = [0.0, 0.0, 0.0, 0.0]
        # the rarely used containers start as shared empty immutables (_NOL/_NOD, cheap
        # to create a batch per force point); writers replace them on first use
        self.f8_nonsum: Any = _NOD
        self.i8: Any = _NOL
        self.i8_ops: Any = _NOL
        self.arrs: Any = _NOL   # [acc (flat working array), op, kind]
        self.sig = 0x5EED
        self.nseg = 0        # segments other than float64 scalars
        self.words = 0       # words of those segments
        self.room = threshold_words - 1   # a float64 scalar appended at index i > room crosses the threshold
        self.allsum = True
        self.nvars = 0
        self.log: List[Any] = []     # steps: int keys (see kmap), tuples, or -16 - code + value (note_uniform)
        self.kmap: Any = _NOD   # contribution key -> (variable, op, dtype num, shape)
        self.done = False
        self.res: Optional[Tuple[list, list, list]] = None
        self.error: Optional[BaseException] = None
        self.folded = 0
        # note_created: the id whose creation may be logged as a bare float, valid while
        # the log's length is cpos (the last step is the creation of cnext - 1)
        self.cnext = -1
        self.cpos = -1


class _Batch(_core.BatchBase if _core is not None else _PyBatchBase):  # type: ignore[misc]
    """Everything pending between two force points (one fusion)."""

    __slots__ = ()

    def segments(self) -> int:
        """Number of pending segments."""
        return self.nseg + len(self.f8) - HEADER

    def total_words(self) -> int:
        return len(self.f8) + self.words

    def add_words(self, w: int) -> None:
        self.nseg += 1
        self.words += w
        self.room -= w

    def note(self, key: Any) -> None:
        """Append one step to the sequence (hashed into the signature at the force point)."""
        log = self.log
        log.append(key)
        if len(log) >= _LOG_CAP:
            self.fold()

    def note_created(self, vid: int, value: float) -> None:
        """Log the creation of float64 scalar variable ``vid`` with the (non-NaN) float
        ``value``: the key ``vid << 3 | CREATED`` then the value, or only the value when
        the last step is the creation of ``vid - 1`` (a run of ``shared(c)``: no tuple,
        no int per variable; :func:`~.diagnosis._decode_log` reads both back)."""
        log = self.log
        if vid != self.cnext or len(log) != self.cpos:
            log.append((vid << 3) | CREATED)
        log.append(value)
        self.cnext = vid + 1
        self.cpos = len(log)
        if len(log) >= _LOG_CAP:
            self.fold()

    def note_uniform(self, code: int, key: Any) -> None:
        """Append a uniform operand of operation ``code`` (``_FN_CODES``) with value key
        ``key`` as two steps, the tag ``-16 - code`` then the key (no tuple; the compiled
        path logs the same; :func:`_decode_log` reads them back). A fold never separates them."""
        log = self.log
        log.append(-16 - code)
        log.append(key)
        if len(log) >= _LOG_CAP:
            self.fold()

    def fold(self) -> None:
        """Hash the logged steps into ``sig`` and forget them (bounded memory)."""
        self.sig = hash((self.sig, tuple(self.log)))
        self.log = []
        self.folded += 1
        self.cpos = -1


class _Snap:
    """A shared variable's state frozen at one point: base value plus pending entries."""

    __slots__ = ("base", "entries", "cast", "shape")

    def __init__(self, base, entries, cast, shape):
        self.base, self.entries, self.cast, self.shape = base, entries, cast, shape


class _Derived:
    """A lazily computed shared value: ``fn(*operands)`` (operands: snapshots, derived, constants)."""

    __slots__ = ("fn", "args", "cast", "value")

    def __init__(self, fn, args, cast):
        self.fn, self.args, self.cast, self.value = fn, args, cast, None


if _core is not None:
    _Derived = _core.Derived  # type: ignore[misc]  # noqa: F811  # same constructor and fields, evaluated in C
