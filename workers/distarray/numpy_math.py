"""NumPy's own transcendental functions on each rank's rows, for results identical to NumPy's.

The fused kernels compute ``exp``, ``log``, ``sin``, ... with numba, whose math library can
differ from NumPy's own (SIMD) implementations in the last bit: float32 ``exp`` differs by up to
1 ulp on about 40 % of random inputs, which a long float32 simulation amplifies. Elementwise
float64 arithmetic (``+ - * /``, ``sqrt``) is correctly rounded in both and is always identical.

With NumPy math on (``NBMPI_DISTARRAY_NUMPY_MATH=1``, or ``configure(numpy_math=True)``), the
ufuncs in :data:`TRANSCENDENTAL` are not fused: their distributed operands are evaluated (a force
point; a view is first copied into an array of its own, laid out alike), and every rank applies
NumPy's ufunc to its own rows, without communication. Operands that would need broadcasting or
replicated NumPy arrays go through the NumPy fallback (:mod:`.fallback`), identical to NumPy as
well. Call it SPMD, like every recorded operation.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .context import NUMPY_MATH

#: The ufuncs whose compiled and NumPy implementations can differ in the last bit.
TRANSCENDENTAL = frozenset({"exp", "log", "log10", "sin", "cos", "tan", "tanh", "arctan2", "power"})

def enabled() -> bool:
    """Whether NumPy math is on in this process."""
    return NUMPY_MATH["on"]


def set_enabled(on: bool) -> None:
    """Turn NumPy math on or off in this process (local; do it on every rank alike)."""
    NUMPY_MATH["on"] = bool(on)


def applies(name: str) -> bool:
    """Whether ufunc ``name`` runs through NumPy math now."""
    return NUMPY_MATH["on"] and name in TRANSCENDENTAL


def apply(ufunc: np.ufunc, inputs: Sequence[Any]) -> Any:
    """``ufunc(*inputs)`` with NumPy's own implementation on each rank's rows: a new DistArray laid
    out like the first distributed operand. Collective (a force point)."""
    from . import fallback

    DistArray = fallback.REGISTRY["DistArray"]
    arrays = [x for x in inputs if isinstance(x, DistArray)]
    first = arrays[0]
    if (any(x.shape != first.shape for x in arrays) or first.ndim == 0 or first.dist.replicated
            or any(not isinstance(x, DistArray) and np.ndim(x) != 0 for x in inputs)):
        return fallback.call(ufunc, tuple(inputs), {}, ufunc.__name__)
    src = first if first._view.is_full else first.copy()
    ops = [src if x is first else x for x in inputs]
    ops = [x.redistribute(src.dist) if isinstance(x, DistArray) and x is not src else x for x in ops]
    locals_ = [x.local if isinstance(x, DistArray) else x for x in ops]     # a force point
    return fallback.REGISTRY["from_local"](ufunc(*locals_), src)
