"""NumPy's own transcendental functions on each rank's rows: results identical to NumPy's (the default).

Elementwise float64 and float32 arithmetic (``+ - * /``, ``%``, ``//``, ``sqrt``, ``square``, comparisons,
``maximum``/``minimum``, ``floor``/``rint``, casts) is correctly rounded in NumPy and in the fused numba
kernels alike, and the kernels never contract ``a * b + c`` into a fused multiply-add (numba compiles without
``fastmath``, so LLVM keeps every rounding): those results are NumPy's bit for bit. ``a ** 2`` is
``square(a)`` and ``a ** 0.5`` is ``sqrt(a)`` in both (NumPy's own fast paths, which the kernels copy).

The transcendental functions are another matter: numba calls the C library's ``exp``, ``log``, ``pow``, ...,
NumPy its own SIMD loops (SVML on AVX-512 machines), and the two differ in the last bit. Measured on an
AVX-512 machine, 200 000 random values: float64 ``exp`` differs on 5 %, ``tanh`` on 28 %, ``log10`` on 19 %,
``power`` on 5 %, ``arctan2`` on 7 %, ``log`` on 0.2 %, ``tan`` on 0.5 %; float32
``exp`` on 40 %, and every float32 function listed in :data:`TRANSCENDENTAL` on 10-45 %. A long simulation amplifies one ulp (a 50-step float32
model: 1e-5).

So by default (``NBMPI_DISTARRAY_NUMPY_MATH`` unset or ``1``) the ufuncs in :data:`TRANSCENDENTAL` are not
fused: they are recorded like every ufunc the fused kernels do not compile (:mod:`.ufuncs`), NumPy's own ufunc
on each rank's block at the next force point, without communication for aligned operands, and the results
equal NumPy's bit for bit. The arithmetic around them stays fused (a chain is cut in two at each such call).
Float64 ``sin`` and ``cos`` stay fused too: NumPy's float64 loops call the C library's functions, which the
compiled kernels call as well (identical results; NumPy's SIMD ``sin``/``cos`` are float32 only).
``NBMPI_DISTARRAY_NUMPY_MATH=0`` (or ``configure(numpy_math=False)``) opts into the compiled functions inside
the fused kernels instead: one pass over memory instead of one per cut, results within an ulp or two of
NumPy's.

What still differs from NumPy is the order in which sums add (``sum``, ``mean``, ``dot``, ``@``, ...: per rank,
then across ranks), so those agree to rounding only: the README's "Identical to NumPy" and
``tests/test_numpy_programs.py`` list which programs that touches.
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


def _exact_power(inputs: Sequence[Any]) -> bool:
    """Whether ``power(*inputs)`` is a float array to the scalar power 2 or 0.5: the fused kernels compute it
    as ``square``/``sqrt``, which is what NumPy computes too (bit for bit)."""
    if len(inputs) != 2:
        return False
    base, e = inputs
    if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, float, np.integer, np.floating)):
        return False
    dt = getattr(base, "dtype", None)
    return dt is not None and np.dtype(dt).kind == "f" and (e == 2 or e == 0.5)


def _libm_loop(name: str, inputs: Sequence[Any]) -> bool:
    """Whether ``name(*inputs)`` is float64 ``sin``/``cos``: NumPy's loops call the C library's ``sin``/``cos``
    there (its SIMD versions are float32 only), as the fused kernels do, so the compiled ones are NumPy's
    bit for bit (measured: 0 of 14 million values from 1e-3 to 1e300 differ) and stay fused."""
    if name not in ("sin", "cos") or len(inputs) != 1:
        return False
    dt = getattr(inputs[0], "dtype", None)
    if dt is None:
        return False
    try:
        return np.dtype(getattr(np, name).resolve_dtypes((np.dtype(dt), None))[-1]) == np.float64
    except (TypeError, ValueError):
        return False


def applies(name: str, inputs: Sequence[Any] = ()) -> bool:
    """Whether ufunc ``name`` on ``inputs`` runs through NumPy math now (``inputs``: the call's operands;
    without them the call is taken as a general one): NumPy math on, ``name`` in :data:`TRANSCENDENTAL`,
    and not one of the calls whose compiled result is NumPy's anyway (``a ** 2``, ``a ** 0.5``, float64
    ``sin``/``cos``)."""
    if not NUMPY_MATH["on"] or name not in TRANSCENDENTAL:
        return False
    return not (name == "power" and _exact_power(inputs) or _libm_loop(name, inputs))
