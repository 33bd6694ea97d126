"""Wire format of a fused collective: op codes, word kinds, size classes, the signature.

A force point packs every pending segment into one buffer of 8-byte words
after a :data:`HEADER` of four signature words and reduces it in place. This
module says what the words mean and how a rank proves that every rank packed
the same sequence:

* op codes (:data:`SUM` ... :data:`CONSUME`) and word kinds (:data:`W_F8`,
  :data:`W_I8`, :data:`W_C16`);
* :func:`_size_class`: the number of words actually reduced, so ranks whose
  pending sequences differ slightly still pass equal counts to MPI;
* the signature: the pending sequence is logged as steps (contribution keys,
  uniform operands, creation values; see :func:`_value_key`), hashed at the
  force point into two numbers ``1 <= h < 2**20`` (:func:`signature_words`)
  sent as ``(h, h**2)`` in the same ``MPI_SUM``; :func:`_same_signature`
  checks the sums (Cauchy-Schwarz);
* the layout record of a general fusion (:func:`layout_words`), which tells
  the combine kernel the op of every word.

Local, no communication.
"""
from __future__ import annotations

import struct
import zlib
from typing import Any, Dict, Tuple

import numpy as np

from ..core.kernels import LAYOUT_FIXED

# op codes (also the combine kernel's); CONSUME reduces like SUM
SUM, PROD, MIN, MAX, CONSUME = 0, 1, 2, 3, 4
OP_NAMES = ("sum", "prod", "min", "max", "consume")
# word kinds of a segment
W_F8, W_I8, W_C16 = 0, 1, 2
#: signature words at the start of every fused buffer
HEADER = 4
#: logged steps kept before they are folded into the running hash (bounded memory)
_LOG_CAP = 4096
_M20A, _M20B = (1 << 20) - 3, (1 << 20) - 5
_F8 = np.dtype(np.float64)
_F8_NUM = _F8.num
_NAN_KEY = (-1, -1)

# operations of shared arithmetic, as logged for uniform operands (-16 - code)
_FN_NAMES = {1: "+", 2: "-", 3: "*", 4: "/", 5: "//", 6: "%", 7: "**", 8: "min", 9: "max"}
_UNIFORM_TAGS = range(-31, -15)   # -16 - code for the operation codes 0..15 (_Batch.note_uniform)
#: the low 3 bits of the log key ``id << 3 | CREATED``: float64 scalar variable ``id`` created with
#: the value logged next; a float right after a creation step is the creation of the next id
#: (``_Batch.note_created``: a run of ``shared(c)`` logs one float each, no tuple)
CREATED = 5


def _size_class(words: int) -> int:
    """Words actually reduced: at least 16, rounded up to 8 steps per power of two,
    so ranks whose pending sequences differ slightly still pass equal counts to MPI."""
    if words <= 16:
        return 16
    step = 1 << max(0, words.bit_length() - 4)
    return -(-words // step) * step


def signature_words(sig: int) -> Tuple[float, float, float, float]:
    """The four header words of a fusion whose pending sequence hashed to ``sig``:
    ``(h1, h1**2, h2, h2**2)`` with two independent ``1 <= h < 2**20``."""
    h1 = float((sig % _M20A) + 1)
    h2 = float(((sig >> 20) % _M20B) + 1)
    return h1, h1 * h1, h2, h2 * h2


def _same_signature(P: int, res) -> bool:
    """True iff every rank contributed the same signature: words 0..3 of the reduced
    buffer are ``sum h1, sum h1**2, sum h2, sum h2**2`` over P ranks with integers
    ``1 <= h < 2**20``; by Cauchy-Schwarz ``P * sum(h**2) == sum(h)**2`` iff all h are
    equal. Exact: the float64 sums are integers below 2**53 for P < 8192, and the
    products are formed as Python ints."""
    s1, q1, s2, q2 = res[0], res[1], res[2], res[3]
    if P <= 64:   # the products stay below 2**53: exact in float64
        return P * q1 == s1 * s1 and P * q2 == s2 * s2
    s1, q1, s2, q2 = int(s1), int(q1), int(s2), int(q2)
    return P * q1 == s1 * s1 and P * q2 == s2 * s2


def _ckey(vid: int, op: int, num: int, shape: tuple) -> Tuple[int, tuple]:
    """(int key, step) of a contribution: the signature hashes the int (cheap, and equal
    in every process: tuples of ints hash deterministically); the step names it on errors."""
    t = (vid, op, num, shape)
    return hash(t), t


def _value_key(v: Any) -> Any:
    """A key of a uniform operand / creation value whose hash is the same in every
    process (floats and ints hash by value; NaN and strings would not)."""
    if isinstance(v, float):
        return v if v == v else _NAN_KEY
    if isinstance(v, (int, bool)):
        return int(v)
    if isinstance(v, np.ndarray) and v.shape != ():
        a = np.ascontiguousarray(v)
        return (-2, zlib.crc32(a), a.shape, a.dtype.num)
    a = np.asarray(v)
    if a.dtype.kind == "c":
        c = complex(a)
        return (c.real, c.imag) if c == c else _NAN_KEY
    if a.dtype.kind in "biu":
        return int(a)
    f = float(a)
    return f if f == f else _NAN_KEY


# --------------------------------------------------------------------------- packing
_WORDS: Dict[int, struct.Struct] = {}
_STRUCT_MAX = 512   # larger fusions use numpy (bounds the cache; numpy's overhead is small there)


def _words(n: int) -> struct.Struct:
    """The native-double ``struct`` of ``n`` words (packs the float64 list into the buffer
    and reads it back without numpy's per-call conversion overhead)."""
    st = _WORDS[n] = struct.Struct(f"={n}d")
    return st


# --------------------------------------------------------------------------- layout
def layout_words(n_f8: int, n_i8: int, nseg: int) -> int:
    """Words of the layout record a general fusion (not only float64 sums) carries right
    after the header: the fixed part ``(nlay, L, n_f8, n_i8, nseg)``, the op codes of the
    ``n_f8 + n_i8`` scalar words (one byte each, eight per word) and ``(start, words, op,
    kind)`` per segment; the scalar words follow it. The combine kernel
    (:func:`nbmpi.workers.core.kernels.combine_words`, which documents the layout) reads it from
    the buffer itself, so a compiled MPI operation needs no state beside the buffer."""
    return LAYOUT_FIXED + (n_f8 + n_i8 + 7) // 8 + 4 * nseg
