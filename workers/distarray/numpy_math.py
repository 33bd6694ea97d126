"""NumPy's own transcendental functions on each rank's rows, for results identical to NumPy's.

The fused kernels compute ``exp``, ``log``, ``sin``, ... with numba, whose math library can
differ from NumPy's own (SIMD) implementations in the last bit: float32 ``exp`` differs by up to
1 ulp on about 40 % of random inputs, which a long float32 simulation amplifies. Elementwise
float64 arithmetic (``+ - * /``, ``sqrt``) is correctly rounded in both and is always identical.

With NumPy math on (``NBMPI_DISTARRAY_NUMPY_MATH=1``, or ``configure(numpy_math=True)``), the
ufuncs in :data:`TRANSCENDENTAL` are not fused: they are recorded like every ufunc the fused kernels do
not compile (:mod:`.ufuncs`), NumPy's own ufunc on each rank's block at the next force point, without
communication for aligned operands. The results equal NumPy's on contiguous operands (NumPy's SIMD loops
can give other last bits for a strided view than for a contiguous copy of it).
"""
from __future__ import annotations

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
