"""Numba-compiled combining loops shared by the runtime (channel reductions,
fused reductions). All kernels work on flat, contiguous 1-D arrays and
write ``out[i] = op(a[i], b[i])``; ``out`` may alias ``a`` (in place).

``combiner(op)`` turns an op name (``sum``, ``prod``, ``min``, ``max``) or a
user binary function compiled with ``numba.njit`` into such a kernel.
"""
from __future__ import annotations

from typing import Callable, Dict, Union

import numba
import numpy as np
from numba.core.registry import CPUDispatcher

BUILTIN_OPS = ("sum", "prod", "min", "max")


@numba.njit(cache=True, nogil=True)
def combine_sum(out, a, b):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = a[i] + b[i]


@numba.njit(cache=True, nogil=True)
def combine_prod(out, a, b):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = a[i] * b[i]


@numba.njit(cache=True, nogil=True)
def combine_min(out, a, b):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = a[i] if a[i] <= b[i] else b[i]


@numba.njit(cache=True, nogil=True)
def combine_max(out, a, b):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = a[i] if a[i] >= b[i] else b[i]


_BUILTIN: Dict[str, Callable] = dict(sum=combine_sum, prod=combine_prod, min=combine_min, max=combine_max)
_USER: Dict[int, Callable] = {}

OpSpec = Union[str, Callable]


def is_jitted(fn: object) -> bool:
    """True if ``fn`` is a numba CPU dispatcher (made by ``numba.njit``)."""
    return isinstance(fn, CPUDispatcher)


def describe_op(op: OpSpec) -> str:
    """A short name of ``op`` for messages and traces."""
    if isinstance(op, str):
        return op
    return getattr(op, "__name__", repr(op))


def combiner(op: OpSpec) -> Callable:
    """Return the compiled kernel ``k(out, a, b)`` for ``op``.

    Raises ``ValueError`` for an unknown name or a function not compiled with
    ``numba.njit`` (the message says what is accepted).
    """
    if isinstance(op, str):
        try:
            return _BUILTIN[op]
        except KeyError:
            raise ValueError(
                f"unknown op {op!r}; expected one of {', '.join(map(repr, BUILTIN_OPS))} "
                "or a binary function compiled with numba.njit"
            ) from None
    if is_jitted(op):
        kernel = _USER.get(id(op))
        if kernel is None:
            f = op

            @numba.njit(nogil=True)
            def combine_user(out, a, b):  # pragma: no cover - compiled
                for i in range(out.size):
                    out[i] = f(a[i], b[i])

            kernel = _USER[id(op)] = combine_user
        return kernel
    if callable(op):
        raise ValueError(
            f"op {describe_op(op)!r} is a plain Python function; decorate it with @numba.njit "
            "so the combining loop can be compiled (or use 'sum', 'prod', 'min', 'max')"
        )
    raise ValueError(f"op must be a name or a numba.njit function, got {type(op).__name__}")


def identity(op: str, dtype: np.dtype):
    """Identity element of builtin ``op`` for ``dtype`` (for empty contributions)."""
    dtype = np.dtype(dtype)
    if op == "sum":
        return dtype.type(0)
    if op == "prod":
        return dtype.type(1)
    if op == "min":
        return np.inf if dtype.kind == "f" else np.iinfo(dtype).max
    if op == "max":
        return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
    raise ValueError(f"no identity for op {op!r}")
