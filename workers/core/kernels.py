"""Numba-compiled combining kernels: the one set every runtime reduction uses.

Channel reductions (:mod:`nbmpi.workers.channels.channel`) combine whole buffers
elementwise with :func:`combine_sum`, :func:`combine_prod`, :func:`combine_min`,
:func:`combine_max` (``out[i] = op(a[i], b[i])``, flat contiguous 1-D arrays;
``out`` may alias ``a``); :func:`combiner` turns an op name or a user binary
function compiled with ``numba.njit`` into such a kernel. Fused reductions
(:mod:`nbmpi.workers.fused_reductions`) combine a fused buffer whose words
carry different ops with :func:`combine_words`, which applies the same scalar
rules (:func:`op_sum` ... :func:`op_max`) word by word.

NaN rule (every kernel, every dtype): ``sum`` and ``prod`` follow IEEE
arithmetic; ``min`` and ``max`` propagate NaN: if either operand is NaN the
result is NaN, whichever order the operands come in (the rule of
``numpy.minimum``/``numpy.maximum``). So a reduction's result never depends on
which rank's value MPI happens to combine first.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Union

import numba
import numpy as np
from numba.core.registry import CPUDispatcher

BUILTIN_OPS = ("sum", "prod", "min", "max")


# --------------------------------------------------------------------------- scalar rules
@numba.njit(inline="always")
def op_sum(a, b):  # pragma: no cover - compiled
    """``a + b``."""
    return a + b


@numba.njit(inline="always")
def op_prod(a, b):  # pragma: no cover - compiled
    """``a * b``."""
    return a * b


@numba.njit(inline="always")
def op_min(a, b):  # pragma: no cover - compiled
    """The smaller of ``a`` and ``b``; NaN if either is NaN."""
    return a if (a < b or a != a) else b


@numba.njit(inline="always")
def op_max(a, b):  # pragma: no cover - compiled
    """The larger of ``a`` and ``b``; NaN if either is NaN."""
    return a if (a > b or a != a) else b


# --------------------------------------------------------------------------- elementwise kernels
@numba.njit(cache=True, nogil=True)
def combine_sum(out, a, b):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = op_sum(a[i], b[i])


@numba.njit(cache=True, nogil=True)
def combine_prod(out, a, b):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = op_prod(a[i], b[i])


@numba.njit(cache=True, nogil=True)
def combine_min(out, a, b):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = op_min(a[i], b[i])


@numba.njit(cache=True, nogil=True)
def combine_max(out, a, b):  # pragma: no cover - compiled
    for i in range(out.size):
        out[i] = op_max(a[i], b[i])


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


# --------------------------------------------------------------------------- fused buffers
# Layout of a fused buffer of int64 words (nbmpi.workers.fused_reductions.wire):
#   [0, 4)            signature header: four float64 words, always summed
#   4                 nlay: words of the layout record (these fields included)
#   5                 L: words of the whole buffer
#   6, 7, 8           n_f8, n_i8, nseg
#   [9, 9 + nops)     op codes of the n_f8 + n_i8 scalar words, one byte each (8 per word)
#   then nseg x 4     segments (start, words, op, kind); kind 0 float64, 1 int64, 2 complex128
#   [4 + nlay, ...)   the n_f8 float64 scalar words, then the n_i8 int64 ones, then the segments
# op codes: 0 sum, 1 prod, 2 min, 3 max, 4 consume (reduces as sum).
LAYOUT_FIXED = 5


@numba.njit(inline="always")
def _op_word(op, a, b):  # pragma: no cover - compiled
    if op == 1:
        return op_prod(a, b)
    if op == 2:
        return op_min(a, b)
    if op == 3:
        return op_max(a, b)
    return op_sum(a, b)


@numba.njit(cache=True, nogil=True)
def combine_words(inw, outw):  # pragma: no cover - compiled
    """``outw = op(inw, outw)`` for two fused buffers (int64 views), each word with the op
    its layout names. The header is always summed; the rest only when both buffers carry
    the same layout within their size (ranks that diverged: the header reports it)."""
    inf = inw.view(np.float64)
    outf = outw.view(np.float64)
    n = min(inw.size, outw.size)
    for i in range(min(4, n)):
        outf[i] = inf[i] + outf[i]
    if n < 4 + LAYOUT_FIXED:
        return
    nlay = outw[4]
    if nlay < LAYOUT_FIXED or 4 + nlay > n or outw[5] > n:
        return
    for j in range(4, 4 + nlay):
        if inw[j] != outw[j]:
            return
    n_f8 = outw[6]
    n_i8 = outw[7]
    nseg = outw[8]
    nops = (n_f8 + n_i8 + 7) // 8
    if LAYOUT_FIXED + nops + 4 * nseg != nlay or 4 + nlay + n_f8 + n_i8 > n:
        return
    ops = outw[9:9 + nops].view(np.int8)
    d = 4 + nlay
    for k in range(n_f8):
        i = d + k
        outf[i] = _op_word(ops[k], inf[i], outf[i])
    for k in range(n_i8):
        i = d + n_f8 + k
        outw[i] = _op_word(ops[n_f8 + k], inw[i], outw[i])
    base = 9 + nops
    for s in range(nseg):
        st = outw[base + 4 * s]
        w = outw[base + 4 * s + 1]
        op = outw[base + 4 * s + 2]
        kind = outw[base + 4 * s + 3]
        if st < d or st + w > n:
            return
        if kind == 0:
            for i in range(st, st + w):
                outf[i] = _op_word(op, inf[i], outf[i])
        elif kind == 1:
            for i in range(st, st + w):
                outw[i] = _op_word(op, inw[i], outw[i])
        elif op == 1:   # complex128 as (re, im) word pairs: the complex product
            for i in range(st, st + w - 1, 2):
                ar = inf[i]
                ai = inf[i + 1]
                br = outf[i]
                bi = outf[i + 1]
                outf[i] = ar * br - ai * bi
                outf[i + 1] = ar * bi + ai * br
        else:           # complex sum: word by word
            for i in range(st, st + w):
                outf[i] = inf[i] + outf[i]


_MPI_COMBINE: Optional[Callable] = None


def combine_words_mpi_address() -> int:
    """Address of :func:`combine_words` as a C ``MPI_User_function``
    (``void f(void *in, void *inout, int *len, MPI_Datatype *type)``; MPI reduces one
    element, a whole fused buffer, whose own layout says its size), compiled on the first call with
    ``numba.cfunc``. For an MPI operation made in compiled code (MPI calls it directly,
    no Python in the combine)."""
    global _MPI_COMBINE
    if _MPI_COMBINE is None:
        from numba import types

        sig = types.void(types.voidptr, types.voidptr, types.CPointer(types.intc), types.voidptr)

        @numba.cfunc(sig, nopython=True, cache=True)
        def mpi_combine_words(inp, inoutp, lenp, datatype):  # pragma: no cover - compiled
            head_in = numba.carray(inp, 6, np.int64)
            head_out = numba.carray(inoutp, 6, np.int64)
            size = head_out[5]
            if head_in[5] < size:
                size = head_in[5]
            if size < 4 + LAYOUT_FIXED:
                size = 4
            combine_words(numba.carray(inp, size, np.int64), numba.carray(inoutp, size, np.int64))

        _MPI_COMBINE = mpi_combine_words
    return _MPI_COMBINE.address
