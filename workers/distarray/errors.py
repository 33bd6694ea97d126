"""Errors of the distributed arrays (:mod:`nbmpi.workers.distarray`): what was wrong, what was expected.

Every class derives from :class:`nbmpi.workers.core.errors.NbmpiError`. Errors found while
recording an operation (shapes, distributions, unsupported operations) are raised on the
rank that records it, before anything is communicated; since every rank records the same
program (SPMD), every rank raises the same error. Errors found at a force point
(divergence, timeout) are raised on every rank that takes part in it.
"""
from __future__ import annotations

from typing import Any, Optional

from ..core.errors import CommTimeout, NbmpiError, SPMDDivergence

__all__ = ["DistArrayError", "ShapeError", "DistributionError", "UnsupportedOperation",
           "DistArrayDivergence", "DistArrayTimeout", "IndexOutOfBounds", "CopyNotViewWarning"]


def ufunc_cast_error(name: str, from_dtype: Any, to_dtype: Any) -> TypeError:
    """NumPy's own exception (a ``UFuncTypeError``, with NumPy's text) for ufunc ``name``'s output of ``from_dtype``
    that ``same_kind`` casting cannot store into ``to_dtype`` (``int_array += 1.5``): NumPy raises it for
    one-element operands here, so callers catching ``numpy.exceptions``' types see the same one. A plain TypeError
    with the same text if NumPy has no such ufunc. Local."""
    import numpy as np
    text = (f"Cannot cast ufunc {name!r} output from {np.dtype(from_dtype)!r} to {np.dtype(to_dtype)!r} with "
            "casting rule 'same_kind'")
    uf = getattr(np, name, None)
    if not isinstance(uf, np.ufunc):      # ``clip``: NumPy's function calls the ufunc of its umath module
        uf = getattr(getattr(getattr(np, "_core", None), "umath", None), name, None)
    if isinstance(uf, np.ufunc) and uf.nout == 1:
        shape = (1, 1) if uf.signature else (1,)
        try:
            uf(*[np.zeros(shape, dtype=from_dtype)] * uf.nin, out=np.zeros(shape, dtype=to_dtype))
        except TypeError as e:
            if str(e) == text:
                return e
    return TypeError(text)


class DistArrayError(NbmpiError):
    """Base class of the distributed-array errors."""


class ShapeError(DistArrayError, ValueError):
    """Operand shapes that do not broadcast together (as in NumPy), or an assignment whose
    value does not broadcast to the target's shape."""


class DistributionError(DistArrayError, ValueError):
    """A distribution that is invalid (unknown kind, block size < 1) or arrays whose
    distributions cannot be combined (arrays on different communicators)."""


class UnsupportedOperation(DistArrayError, NotImplementedError):
    """An operation the distributed arrays do not implement (yet); the message says what is
    supported instead."""


class IndexOutOfBounds(DistArrayError, IndexError):
    """An index array holds an index outside ``-n .. n-1`` for an axis of length ``n`` (as NumPy's
    IndexError). Raised on every rank of the force point, even if only one rank holds the bad index.
    Attributes: ``index`` (the bad value), ``position`` (where it sits in the index array), ``holder``
    (the first rank that found it), ``size`` (the axis length)."""

    def __init__(self, rank: int, what: str, index: int, position: int, holder: int, size: int):
        self.index, self.position, self.holder, self.size = index, position, holder, size
        NbmpiError.__init__(
            self,
            f"rank {rank}: {what}: index {index} is out of bounds for axis 0 with size {size} (position {position} "
            f"of the index array, found by rank {holder}); valid indices are {-size}..{size - 1}. Nothing was "
            "written; fix the index array and repeat the operation")


class DistArrayDivergence(DistArrayError, SPMDDivergence):
    """The ranks reached a force point with different recorded operations.

    Raised on every rank. Attributes: ``rank``, ``op`` (the force point), ``detail`` (the
    first differing operation as each rank recorded it; the same text on every rank).
    """

    def __init__(self, rank: int, op: str, detail: str):
        self.rank, self.op, self.detail = rank, op, detail
        NbmpiError.__init__(
            self,
            f"rank {rank}: {op}: the ranks recorded different distributed-array operations, so no "
            f"result can be trusted ({detail}). Every rank must run the same array operations in the "
            "same order (SPMD): make rank-dependent branches act on .local data, not on whole arrays")


class DistArrayTimeout(CommTimeout, DistArrayError):
    """A blocking wait of a distributed-array force point exceeded ``NBMPI_TIMEOUT``."""

    def __init__(self, rank: int, peer: Optional[int], op: str, waited: float, detail: str = ""):
        super().__init__(rank, peer, op, waited, detail)


class CopyNotViewWarning(UserWarning):
    """A write into an array that NumPy would have made a view of another (``a.T``, ``transpose``, ``swapaxes``,
    ``moveaxis``, ``reshape``, ``ravel``, ``flip``) but which on distributed arrays is a copy: the other array does
    not change. Warned once per call site, on rank 0."""
