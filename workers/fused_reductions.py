"""Lazy fused reductions on shared variables (the CFL idea of seed 001, extended).

A *shared variable* (:func:`shared`, :class:`SharedVar`) holds the same value
on every rank of ``COMM_WORLD``. SPMD code updates it with rank-local values
and never writes communication; the runtime delays every reduction and, at a
*force point*, resolves ALL pending reductions of ALL shared variables with
ONE collective call.

Semantics (``x``, ``y`` shared; ``a`` rank-local, i.e. anything that is not a
shared variable: Python/numpy numbers and arrays)
-------------------------------------------------------------------------------

Contributions (every rank contributes its own ``a``; nothing is communicated
when they are made):

* ``x += a``, ``x = x + a``, ``x = a + x``: global sum, ``x + sum_r a_r``;
  ``x -= a``, ``x = x - a``: ``x - sum_r a_r``; ``x = a - x``: ``sum_r a_r - x``.
* ``x *= a``: global product, ``x * prod_r a_r``.
* ``x.min_with(a)`` / ``x.max_with(a)``: ``min(x, min_r a_r)`` / ``max(...)``.
* ``g = p.consume(request, floor=0.0)`` on a pool (:func:`pool`,
  :class:`SharedPool`): a *bounded* reduction. Every rank asks for
  ``request >= 0``. With ``level`` the pool's value and ``total = sum_r
  request_r``: if ``total <= level - floor`` every rank is granted its
  request and the pool drops by ``total``; otherwise every grant is scaled by
  ``(level - floor) / total`` and the pool is left at exactly ``floor`` (a
  pool already at or below ``floor`` grants 0 and does not change). ``g`` is a
  :class:`Grant`, a rank-local value that resolves at the next force point.
  Several consumes of one pool in one fusion apply in program order.
  Elementwise for array pools.

Repeated contributions of one kind to one variable between force points are
accumulated locally (``for v in data: x += v`` makes one segment, not
``len(data)``). Mixed kinds on one variable apply in program order:
``x += a; x *= b`` gives ``(x + sum a) * prod b``.

Local arithmetic (no communication; the result is again a shared variable):

* shared with shared (``x + y``, ``x - y``, ``x * y``, ``x / y``, ``x ** y``,
  ``x += y``, ``x *= y``, ``x.min_with(y)``...) is computed on every rank's
  replica. If an operand still has pending contributions the result is lazy
  (a snapshot of the operands: later contributions to ``x`` do not change an
  already computed ``x * y``).
* ``x * c``, ``c * x``, ``x / c``, ``c / x``, ``x // c``, ``x % c``,
  ``x ** c``, ``-x``, ``abs(x)``: *uniform* operands. ``c`` must be the same
  on every rank (e.g. ``N`` in ``s1 * s1 / N``); this is checked at the next
  force point and a difference raises :class:`SPMDDivergence`. Note
  ``x * c`` (scale every replica) is NOT ``x *= c`` (product of every rank's
  contribution), and ``x + c`` IS a contribution: ``x + 1.0`` on P ranks
  adds P. Use ``x.value + 1.0`` for local arithmetic.

Assignment: assigning a purely local value to a shared variable is an error
(:class:`SharedVariableError`): ``x.value = a``, ``x.assign(a)``, and the
plain rebinding ``x = a`` in code nbmpi runs (top-level code of
``%%distributed`` cells, scripts and ``-c`` code of ``nbmpi run`` and of
controller jobs), which :mod:`~nbmpi.workers.rebinding_guard` rewrites to
check the old value of the name: at module level every plain name, inside
a function the names it binds to shared variables or uses as such
(``x.reset()``...). A function that rebinds a shared variable it got from
elsewhere and used only with ``+=`` and arithmetic is not caught (Python has
no hook there; see that module for the exact coverage). ``del x`` releases
a name on purpose.
``x.assign(y)`` (``y`` shared) and ``x.reset()`` (back to the creation
value) or ``x.reset(c)`` (uniform ``c``) are allowed. Creation values
(``shared(c)``) must be equal on every rank; like uniform operands this is
checked at the next force point.

Force points (all blocking and collective: every rank must reach them in the
same order, as in any SPMD program):

* reading a shared variable: ``float()``, ``int()``, ``complex()``,
  ``bool()``, comparisons, ``str()``/``print``/``format``, numpy conversion
  (``np.asarray(x)``, storing into an array ``var[i] = x``), indexing,
  ``.value``, any numpy function other than + - * / (which keep the shared
  semantics above), reading a :class:`Grant`;
* :func:`flush`; leaving a :func:`fused` block; a contribution that makes the
  pending data exceed the size threshold (:func:`configure`,
  ``NBMPI_FUSE_THRESHOLD`` bytes, default 1 MiB).

A force point resolves every pending contribution of every shared variable
(and every grant) in ONE collective call on a private duplicate of
``COMM_WORLD`` (a force point with nothing pending communicates nothing):
all segments are packed into one buffer of 8-byte words (float64, int64,
complex128 as two words) after a 4-word signature header, padded to a size
class (16 words, then 8 steps per power of two), and reduced in place by a
persistent ``MPI_Allreduce_init`` request made once per size class (so a
force point costs ``MPI_Start`` plus ``MPI_Test`` polls, no new schedule).
If every segment is a float64 sum (or consume) the operation is ``MPI_SUM``
on doubles; otherwise it is a user-defined MPI operation on one contiguous
datatype (MPI never splits it) whose combining function runs a
numba-compiled kernel over the segments with per-segment op codes, on
copy-free views of MPI's buffers. After a few polls the wait is
:func:`nbmpi.workers.waiting.wait` (timeout ``NBMPI_TIMEOUT``,
interruptible). ``repr()`` never forces (safe in debuggers).

Cost model (what the hot path does): ``x += a`` on a float64 scalar with a
real number appends one word to the batch's list and a few field writes
(repeated ``+=`` between force points add in place); ``x.reset()`` is two
field writes; shared arithmetic on float64 scalars builds one small lazy node
per operator whose operands refer to the pending word directly (no copy); a
force point with only float64 scalar sums pending packs the list into the
preallocated buffer and runs the ``MPI_SUM`` request. These cases run in C
when the optional extension ``nbmpi.workers._fused_core`` is built (the
default install compiles it; :data:`IMPLEMENTATION` says which one runs).
The compiled force point calls ``MPI_Start``/``MPI_Test`` of the MPI library
mpi4py loaded directly, on the handle from mpi4py's C API (no Python call per
poll; :attr:`FusionEngine.direct_mpi`; ``NBMPI_DIRECT_MPI=0`` goes through
mpi4py's methods instead). The extension
it works on the same fields and data structures as the Python code below,
which stays the reference and handles every other case (arrays, other ops,
errors). ``NBMPI_PURE_PYTHON=1`` selects the pure-Python implementation;
both give the same results (the tests run both). What remains is one
interpreter call per operator, contribution and read, which is what
separates lazy code from a hand-packed ``Allreduce`` (see
``benchmarks/fused_reductions.py``).

SPMD safety: variables are identified across ranks by creation order (the
n-th shared variable created on a rank is variable #n everywhere, also for
intermediate results of shared arithmetic, which are :class:`SharedVar`
instances too). The header carries two hashes ``h`` (``1 <= h < 2**20``) of
the pending sequence (variable, op, dtype, shape, order, uniform operands,
creation values, size class) as ``(h, h**2)`` float64 words in the same
``MPI_SUM``; after the sum, ``P * sum(h**2) == sum(h)**2`` holds iff all
ranks had the same ``h`` (Cauchy-Schwarz; exact below 2**53, i.e. for
P < 8192), and every rank sees the same sums, so either all ranks accept or
all raise :class:`SPMDDivergence`; two independent hashes make an undetected
difference a 2**-40 event. On a mismatch the ranks exchange their sequence
logs over a second private communicator (error path only: two more
collectives there) and the error names the first difference (that part of
the message is the same on every rank). Values of a failed fusion are never
used: reading an affected variable raises the error again, and the engine
stays usable if all ranks' fused buffers had the same size.

Ranks whose pending data differ in size class pass different counts to MPI,
which then completes the collective on no rank (MPICH: every rank stays in
it). This is found without a timeout: each rank has a *size board* (three
words in an RMA window on the diagnosis communicator, written only on slow
paths), and a rank still waiting in a force point after 0.2 s reads its peers'
boards every 0.2 s (``MPI_Rget``, never blocking; a read completes once the
peer is in an MPI call, as a rank stuck in a force point is). A peer
in the same collective with another size means it can never complete, so the
rank joins the diagnosis; every rank then raises :class:`SPMDDivergence`
naming the first difference, and the engine is unusable afterwards (the
collective is left pending; restart the program). A peer that has not
reached the collective yet is only late, and the rank keeps waiting (no
false alarm on load imbalance). An MPI error instead of a hang (e.g.
truncation in another MPI library) and a timeout (``NBMPI_TIMEOUT`` or
:func:`configure`) lead to the same diagnosis; if the other ranks do not join
it (a rank never reached the force point) the original
:class:`~nbmpi.workers.errors.CommTimeout` or MPI error is raised, after at
most ``min(NBMPI_TIMEOUT, 10) + 5`` s more. Without a timeout a rank that
never reaches the force point at all is waited for forever (interruptibly),
as by any MPI collective. Divergences that keep the size class equal
(different variables, ops, order, uniform operands of the same size) are
detected by the signature of the one collective.

Tracing: each fused collective is one event of kind ``fused_allreduce``
(``DIR_NONE``, per-engine ``seq``, ``count`` = number of variables it
resolved, ``tag`` 0 for ``MPI_SUM``, 1 for the compiled op).
"""
from __future__ import annotations

import contextlib
import operator
import os
import pickle
import struct
import time
import types
import zlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numba
import numpy as np

from . import tracing as _tracing
from . import waiting
from .errors import CommTimeout, NbmpiError, SharedVariableError, SPMDDivergence
from .runtime import MPI, default_timeout, mpi_library_functions, world

PURE_PYTHON_ENV = "NBMPI_PURE_PYTHON"
#: ``NBMPI_DIRECT_MPI=0``: the compiled force point calls Start/Test through mpi4py
#: instead of calling the MPI library directly (same semantics, slower).
DIRECT_MPI_ENV = "NBMPI_DIRECT_MPI"
_core: Any = None
if os.environ.get(PURE_PYTHON_ENV, "").strip() in ("", "0"):
    try:
        from . import _fused_core as _core
    except ImportError:   # not built (no C compiler at install): the pure-Python implementation
        _core = None
#: which implementation of the float64-scalar hot path runs: "compiled" (the C
#: extension ``_fused_core``) or "python" (not built, or ``NBMPI_PURE_PYTHON=1``).
#: Both have the same semantics; the compiled one only makes the common cases cheaper.
IMPLEMENTATION = "compiled" if _core is not None else "python"

__all__ = ["SharedVar", "SharedPool", "Grant", "shared", "pool", "flush", "fused", "configure",
           "engine", "FusionEngine", "SPMDDivergence", "SharedVariableError"]

K_FUSED = _tracing.register_kind("fused_allreduce")

# op codes (also the kernel's); CONSUME reduces like SUM
SUM, PROD, MIN, MAX, CONSUME = 0, 1, 2, 3, 4
OP_NAMES = ("sum", "prod", "min", "max", "consume")
# word kinds of a segment
W_F8, W_I8, W_C16 = 0, 1, 2
HEADER = 4
THRESHOLD_ENV = "NBMPI_FUSE_THRESHOLD"
DEFAULT_THRESHOLD_BYTES = 1 << 20
_LOG_CAP = 4096
_SPIN = 64   # Test polls of a force point before the (slower to enter) interruptible wait
# a force point still waiting after _WATCH_START s reads its peers' size boards, then every _WATCH_EVERY s
_WATCH_START, _WATCH_EVERY = 0.2, 0.2
_M20A, _M20B = (1 << 20) - 3, (1 << 20) - 5


# --------------------------------------------------------------------------- compiled kernel
@numba.njit(cache=True, nogil=True)
def _combine_words(inw, outw, n_f8, ops_f8, n_i8, ops_i8, segs):  # pragma: no cover - compiled
    """outw = op(inw, outw) segment by segment. Words [0, n_f8) are float64
    scalars with per-word ops, then n_i8 int64 scalars, then the segments
    ``segs[s] = (start, words, op, kind)``. Only the header is combined if a
    buffer is shorter than the layout (ranks diverged; the header reports it)."""
    need = n_f8 + n_i8
    for s in range(segs.shape[0]):
        e = segs[s, 0] + segs[s, 1]
        if e > need:
            need = e
    inf = inw.view(np.float64)
    outf = outw.view(np.float64)
    if inw.size < need or outw.size < need:
        for i in range(min(4, inw.size, outw.size)):
            outf[i] = inf[i] + outf[i]
        return
    for i in range(n_f8):
        a = inf[i]
        b = outf[i]
        op = ops_f8[i]
        if op == 0 or op == 4:
            outf[i] = a + b
        elif op == 1:
            outf[i] = a * b
        elif op == 2:
            outf[i] = a if (a < b or a != a) else b
        else:
            outf[i] = a if (a > b or a != a) else b
    for k in range(n_i8):
        i = n_f8 + k
        a = inw[i]
        b = outw[i]
        op = ops_i8[k]
        if op == 0 or op == 4:
            outw[i] = a + b
        elif op == 1:
            outw[i] = a * b
        elif op == 2:
            outw[i] = a if a < b else b
        else:
            outw[i] = a if a > b else b
    for s in range(segs.shape[0]):
        st = segs[s, 0]
        n = segs[s, 1]
        op = segs[s, 2]
        kind = segs[s, 3]
        if kind == 0:
            if op == 0 or op == 4:
                for i in range(st, st + n):
                    outf[i] = inf[i] + outf[i]
            elif op == 1:
                for i in range(st, st + n):
                    outf[i] = inf[i] * outf[i]
            elif op == 2:
                for i in range(st, st + n):
                    a = inf[i]
                    b = outf[i]
                    outf[i] = a if (a < b or a != a) else b
            else:
                for i in range(st, st + n):
                    a = inf[i]
                    b = outf[i]
                    outf[i] = a if (a > b or a != a) else b
        elif kind == 1:
            if op == 0 or op == 4:
                for i in range(st, st + n):
                    outw[i] = inw[i] + outw[i]
            elif op == 1:
                for i in range(st, st + n):
                    outw[i] = inw[i] * outw[i]
            elif op == 2:
                for i in range(st, st + n):
                    outw[i] = inw[i] if inw[i] < outw[i] else outw[i]
            else:
                for i in range(st, st + n):
                    outw[i] = inw[i] if inw[i] > outw[i] else outw[i]
        else:  # complex128 as (re, im) word pairs; sum or prod
            if op == 1:
                for i in range(st, st + n, 2):
                    ar = inf[i]
                    ai = inf[i + 1]
                    br = outf[i]
                    bi = outf[i + 1]
                    outf[i] = ar * br - ai * bi
                    outf[i + 1] = ar * bi + ai * br
            else:
                for i in range(st, st + n):
                    outf[i] = inf[i] + outf[i]


_LAYOUT: List[Any] = [0, np.zeros(1, np.int8), 0, np.zeros(1, np.int8), np.zeros((0, 4), np.int64)]


def _user_combine(inbuf, inoutbuf, datatype) -> None:
    """Combining function of the user-defined MPI op: copy-free int64 views of
    MPI's buffers, the layout of the fusion in flight, the compiled kernel."""
    lay = _LAYOUT
    _combine_words(np.frombuffer(inbuf, np.int64), np.frombuffer(inoutbuf, np.int64),
                   lay[0], lay[1], lay[2], lay[3], lay[4])


def _size_class(words: int) -> int:
    """Words actually reduced: at least 16, rounded up to 8 steps per power of two,
    so ranks whose pending sequences differ slightly still pass equal counts to MPI."""
    if words <= 16:
        return 16
    step = 1 << max(0, words.bit_length() - 4)
    return -(-words // step) * step


_NAN_KEY = (-1, -1)
_EMPTY: list = []
_NOL: tuple = ()                              # "no list yet" of a batch
_NOD = types.MappingProxyType({})             # "no dict yet" of a batch
_WORDS: Dict[int, struct.Struct] = {}
_STRUCT_MAX = 512   # larger fusions use numpy (bounds the cache; numpy's overhead is small there)


def _words(n: int) -> struct.Struct:
    """The native-double ``struct`` of ``n`` words (packs the float64 list into the buffer
    and reads it back without numpy's per-call conversion overhead)."""
    st = _WORDS[n] = struct.Struct(f"={n}d")
    return st


def _same_signature(P: int, res: list) -> bool:
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
        return (-2, zlib.crc32(a.view(np.uint8).reshape(-1)), a.shape, a.dtype.num)
    a = np.asarray(v)
    if a.dtype.kind == "c":
        c = complex(a)
        return (c.real, c.imag) if c == c else _NAN_KEY
    if a.dtype.kind in "biu":
        return int(a)
    f = float(a)
    return f if f == f else _NAN_KEY


# --------------------------------------------------------------------------- batches
class _PyBatchBase:
    """The fields of a batch (the compiled ``BatchBase`` has the same fields and init)."""

    __slots__ = ("f8", "f8_nonsum", "i8", "i8_ops", "arrs", "sig", "nseg", "words", "room", "allsum",
                 "nvars", "log", "kmap", "folded", "done", "res", "error")

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
    _Derived = _core.Derived  # type: ignore[misc]  # same constructor and fields, evaluated in C


# --------------------------------------------------------------------------- the engine
class FusionEngine:
    """Pending contributions of this rank and the one-collective resolution.

    One engine per process (:func:`engine`) serves every shared variable; its
    communicator is a duplicate of ``COMM_WORLD`` made at the first force
    point (``MPI_Comm_idup``, so even that wait can time out).
    """

    def __init__(self) -> None:
        self.next_id = 0
        self.comm = None
        self.diag = None
        self.rank = -1
        self.size = 0
        self.chan = 0
        self.seq = 0
        self.timeout = default_timeout()
        raw = os.environ.get(THRESHOLD_ENV, "").strip()
        nbytes = DEFAULT_THRESHOLD_BYTES
        if raw:
            try:
                nbytes = int(float(raw))
            except ValueError:
                raise ValueError(f"{THRESHOLD_ENV}={raw!r} is not a number of bytes; set e.g. 1048576 "
                                 "or unset it") from None
        self.threshold_words = max(HEADER + 1, nbytes // 8)
        self.batch = _Batch(self.threshold_words)
        self._buf = np.zeros(256, dtype=np.float64)
        self._ops_f8 = np.zeros(256, dtype=np.int8)
        self._ops_i8 = np.zeros(64, dtype=np.int8)
        self._types: Dict[int, Any] = {}
        self._preq: Dict[Any, Any] = {}   # words (MPI_SUM) or (words, False) -> persistent Allreduce_init request
        self._op = None
        self._broken: Optional[str] = None
        self._diag_broken = False
        self._win = None      # the size board (RMA window on ``diag``), see _publish / _size_watch
        self._board = None
        self._strict = 0
        self._ready = False   # connected, not broken, not inside fused(strict=True): the fast flush may run
        self._mpi = None
        #: the compiled force point calls ``MPI_Start``/``MPI_Test`` directly (set at the
        #: first force point; False: through mpi4py, or the pure-Python implementation)
        self.direct_mpi = False
        self._sync_core()

    if _core is not None:
        # counters and flags the compiled hot path reads and writes live in the extension
        next_id = property(lambda self: _core.next_id(), lambda self, v: _core.next_id(v),
                           doc="Id of the next shared variable (creation order identifies variables).")
        seq = property(lambda self: _core.seq(), lambda self, v: _core.seq(v),
                       doc="Number of fused collectives run so far (local).")
        _ready = property(lambda self: _core.ready(), lambda self, v: _core.ready(v),
                          doc="Connected, not broken, not in fused(strict=True): the fast force point may run.")

    def _sync_core(self) -> None:
        """Give the compiled force point the buffer, requests, threshold and communicator facts."""
        if _core is not None:
            _core.set_state(self._buf, self._preq, self.threshold_words, self.chan, max(self.size, 1))

    @property
    def batch(self) -> "_Batch":
        """The pending contributions (the current fusion)."""
        return self._batch

    @batch.setter
    def batch(self, b: "_Batch") -> None:
        self._batch = b
        if _core is not None:
            _core.set_batch(b)   # the compiled hot path appends to it

    # -- setup ----------------------------------------------------------------
    def _connect(self) -> None:
        m = MPI()
        w = world()
        self.rank = w.Get_rank()
        comm, req = w.Idup()
        waiting.wait(req, self.timeout, self.rank, None, "fused reductions: first force point (Comm_idup)",
                     CommTimeout, self._abandoned("Comm_idup"), cancellable=False)
        self.comm = comm
        self.size = comm.Get_size()
        # a second duplicate for the divergence diagnosis only: it still works when the
        # ranks' fused collectives did not match (different sizes) and one is left pending
        diag, req = w.Idup()
        waiting.wait(req, self.timeout, self.rank, None, "fused reductions: first force point (Comm_idup)",
                     CommTimeout, self._abandoned("Comm_idup"), cancellable=False)
        self.diag = diag
        self._open_board(diag)
        self.chan = _tracing.get_tracer().new_channel_id(comm)
        self._op = m.Op.Create(_user_combine, commute=True)
        self._mpi = m
        self._sync_core()
        if _core is not None:
            # the compiled force point calls MPI_Start/MPI_Test itself (no Python call per poll)
            self.direct_mpi = False
            if os.environ.get(DIRECT_MPI_ENV, "").strip() != "0":
                fns = mpi_library_functions("MPI_Start", "MPI_Test")
                capi = getattr(m, "__pyx_capi__", {}).get("PyMPIRequest_Get")
                if fns and capi is not None:
                    _core.set_mpi(fns["MPI_Start"], fns["MPI_Test"], capi, m.Exception)
                    self.direct_mpi = True
            if not self.direct_mpi:
                _core.set_mpi(None)
        self._ready = not self._strict

    def _open_board(self, diag) -> None:
        """The size board: three int64 words per rank in an RMA window on the diagnosis
        communicator, ``(k, words, k)`` for the fused collective #k this rank is stuck in
        (or diagnosing), written only on those slow paths. A rank stuck in a force point
        reads its peers' boards (``Rget``; passive target, though the read completes only
        once the peer is in some MPI call) to find a collective that cannot complete
        because the sizes differ.

        Collective, right after the two ``Comm_idup`` completed (so every rank is here).
        Without RMA support (the window cannot be made) there is no board and a size
        divergence is found by the timeout alone."""
        m = MPI()
        board = np.full(3, -1, dtype=np.int64)
        try:
            # a dynamic window over our own array: no collective is needed to release it at
            # exit (a window from Win.Allocate must be freed collectively, or UCX complains)
            win = m.Win.Create_dynamic(comm=diag)
            win.Attach(board)
            addrs = np.zeros(self.size, dtype=np.int64)
            req = diag.Iallgather(np.array([m.Get_address(board)], dtype=np.int64), addrs)
            waiting.wait(req, self.timeout, self.rank, None, "fused reductions: first force point (size boards)",
                         CommTimeout, self._abandoned("size boards"), cancellable=False)
            win.Lock_all(m.MODE_NOCHECK)
        except m.Exception:   # pragma: no cover - every MPI-3 library has passive-target RMA
            return
        self._win, self._board = win, board
        self._peers = [p for p in range(self.size) if p != self.rank]
        self._addrs = [int(addrs[p]) for p in self._peers]
        self._seen = np.full((max(len(self._peers), 1), 3), -1, dtype=np.int64)
        self._reads: List[Any] = [None] * len(self._peers)   # a pending Rget per peer (into _seen[i])

    def _publish(self, seq: int, words: int) -> None:
        """Write ``(seq, words, seq)`` to this rank's board (a reader takes it only when the
        two ``seq`` words agree, so a torn read is ignored)."""
        board = self._board
        if board is not None:
            board[2] = -2
            board[0] = seq
            board[1] = words
            board[2] = seq

    def _size_watch(self, seq: int, words: int) -> Optional[Callable[[], None]]:
        """The ``check`` of the force point's wait: from ``_WATCH_START`` s on, publish
        this rank's ``(seq, words)`` and read each peer's board (``Rget``), again every
        ``_WATCH_EVERY`` s. A peer in (or diagnosing) the same collective #seq with a
        different size means MPI cannot complete it on any rank: raise
        :class:`_SizeMismatch`, and ``_wait`` turns that into the diagnosis. A peer that
        has not reached #seq yet is just late: keep waiting.

        Never blocks: a read completes only when the peer's MPI library makes progress
        (MPICH: when the peer is in an MPI call, as a rank stuck in a force point is), so
        each peer's read is tested on its own, a peer whose read is still pending is not
        read again, and reads still pending when the wait ends stay parked on the engine
        (``_reads``) for the next wait. A finished read of an older wait is still valid:
        a rank's board words for a given ``seq`` never change. Nothing is sent, so
        nothing is left to drain."""
        if self._win is None or not self._peers:
            return None
        m, win, seen, peers, addrs, reads = self._mpi, self._win, self._seen, self._peers, self._addrs, self._reads
        due = [time.monotonic() + _WATCH_START]

        def check() -> None:
            now = time.monotonic()
            if now >= due[0]:
                due[0] = now + _WATCH_EVERY
                self._publish(seq, words)   # from now on peers may read it (repeating is harmless)
                for i, p in enumerate(peers):
                    if reads[i] is None:
                        reads[i] = win.Rget([seen[i], 3, m.INT64_T], p, target=(addrs[i], 3, m.INT64_T))
            for i, rq in enumerate(reads):
                if rq is not None and rq.Test():
                    reads[i] = None
                    k, w, k2 = seen[i].tolist()
                    if k == seq and k2 == seq and w != words:
                        raise _SizeMismatch(
                            f"rank {self.rank}: fused reduction #{seq} cannot complete: rank {peers[i]} is in "
                            f"it with {w} words, this rank with {words} (the ranks' pending data differ in size)")
        return check

    def _abandoned(self, what: str) -> Callable[[], None]:
        def mark() -> None:
            self._ready = False
            self._broken = (f"the fused collective ({what}) was abandoned by a timeout or interrupt while "
                            "other ranks may still be in it")
        return mark

    @property
    def collectives(self) -> int:
        """Number of fused collectives this engine has run (local)."""
        return self.seq

    @property
    def compiled_collectives(self) -> int:
        """How many of them the compiled force point ran (the others took the Python
        path, e.g. the first fusion of each buffer size, or other ops than float64
        sums); 0 with the pure-Python implementation. Local."""
        return _core.compiled_fusions() if _core is not None else 0

    def _run(self, req, b: _Batch, words: int) -> None:
        """Start the persistent collective ``req`` of batch ``b`` and return when it is
        done: a few ``Test`` polls, then :meth:`_wait` (interruptible, with the timeout)."""
        req.Start()
        test = req.Test
        for _ in range(_SPIN + 1):
            if test():
                return
        self._wait(req, b, words)

    def _wait(self, req, b: _Batch, words: int) -> None:
        """The force point's collective is not done after a few polls: the interruptible
        wait with the timeout (a timeout or interrupt leaves the engine unusable).

        While waiting it watches the peers' size boards (:meth:`_size_watch`). On a size
        mismatch found there, a timeout or an MPI error the ranks' sequences are compared
        over the diagnosis communicator: if they differ (typically in size, so MPI could
        not match the collective) the error is :class:`SPMDDivergence` naming the first
        difference, otherwise the original error."""
        seq = self.seq
        check = self._size_watch(seq, words)
        try:
            waiting.wait(req, self.timeout, self.rank, None,
                         f"fused reduction #{seq} of {b.nvars} shared variable(s)", CommTimeout,
                         self._abandoned(f"#{seq}"), cancellable=False, check=check)
        except (CommTimeout, _SizeMismatch, self._mpi.Exception) as exc:
            self._abandoned(f"#{seq}")()
            err = self._failed(b, words, exc)
            if err is exc:
                raise
            raise err from exc

    def _fuse_failed(self, b: _Batch, words: int, exc: BaseException) -> BaseException:
        """What the hot path's force point raises for ``exc`` (also the compiled one's):
        an MPI error (e.g. truncation: the ranks passed different sizes) is diagnosed
        unless ``_wait`` already did; the batch keeps the error for its readers."""
        err = exc
        if isinstance(exc, self._mpi.Exception) and not self._broken:
            self._abandoned(f"#{self.seq}")()
            err = self._failed(b, words, exc)
        b.error = err
        return err

    def _failed(self, b: _Batch, words: int, exc: BaseException) -> BaseException:
        """Error of a fused collective that did not complete on this rank."""
        self._publish(self.seq, words)
        t = self.timeout
        logs = self._exchange_logs(b, words, None if t is None else min(t, 10.0) + 5.0)
        detail = None if logs is None else _compare(logs)
        if detail is None and isinstance(exc, _SizeMismatch):   # proof enough, even without the logs
            self._broken = "the ranks' fused collectives had different sizes (an SPMD divergence)"
            return SPMDDivergence(self.rank, f"fused reduction #{self.seq}",
                                  f"{exc}; the other ranks did not report their sequences in time, so the "
                                  "first difference cannot be named")
        if detail is None:
            if isinstance(exc, self._mpi.Exception) and hasattr(exc, "add_note"):
                exc.add_note(f"rank {self.rank}: in fused reduction #{self.seq} of {b.nvars} shared variable(s) "
                             "(a force point); shared variables are unusable now: restart the program")
            return exc
        return SPMDDivergence(self.rank, f"fused reduction #{self.seq}", detail + _size_note(logs))

    def _grow(self, words: int) -> None:
        """A larger fusion buffer; the persistent requests bound to the old one are freed."""
        for req in self._preq.values():
            req.Free()
        self._preq.clear()
        self._buf = np.zeros(max(words, 2 * self._buf.size), dtype=np.float64)
        self._sync_core()

    def _persistent(self, words: int, allsum: bool):
        """The persistent ``MPI_Allreduce_init`` request reducing ``words`` words of the
        fusion buffer in place (``MPI_SUM`` on doubles, or the compiled op on one
        contiguous datatype). Made once per size class: a force point then costs
        ``Start`` + ``Test`` instead of building a nonblocking schedule each time."""
        m = self._mpi
        fb = self._buf
        if allsum:
            req = self.comm.Allreduce_init(m.IN_PLACE, [fb, words, m.DOUBLE], op=m.SUM)
        else:
            req = self.comm.Allreduce_init(m.IN_PLACE, [fb, 1, self._dtype(words)], op=self._op)
        self._preq[words if allsum else (words, False)] = req
        return req

    def _dtype(self, words: int):
        t = self._types.get(words)
        if t is None:
            t = self._types[words] = MPI().INT64_T.Create_contiguous(words).Commit()
        return t

    # -- resolution --------------------------------------------------------------
    def pending(self) -> int:
        """Number of pending segments (contributions not yet communicated). Local."""
        return self.batch.segments()

    def flush(self) -> int:
        """Resolve every pending contribution with one collective call; return
        the number of variables resolved (0: nothing pending, no communication)."""
        b = self.batch
        f8 = b.f8
        n1 = len(f8)
        if b.nseg == 0:
            if n1 == HEADER:
                return 0
            if self._ready and b.allsum:
                # the hot path: only float64 scalar sums pending -> MPI_SUM on the preallocated
                # buffer through a persistent request, signature words in the same buffer
                # (the compiled version does the same steps; None: no request/buffer of this size yet)
                if _core is not None:
                    nv = _core.fuse(self, b)
                    if nv is not None:
                        return nv
                self.batch = _Batch(self.threshold_words)
                try:
                    L = 16 if n1 <= 16 else _size_class(n1)
                    fb = self._buf
                    if fb.size < L:
                        self._grow(L)
                        fb = self._buf
                    sig = hash((b.sig, L, tuple(b.log)))
                    h1 = float((sig % _M20A) + 1)
                    h2 = float(((sig >> 20) % _M20B) + 1)
                    f8[:4] = (h1, h1 * h1, h2, h2 * h2)
                    # words n1..L-1 are padding: summed, never read
                    if _core is not None:
                        st = _core
                        _core.pack(f8, fb)
                    elif n1 <= _STRUCT_MAX:
                        st = _WORDS.get(n1) or _words(n1)
                        st.pack_into(fb, 0, *f8)
                    else:
                        st = None
                        fb[:n1] = f8
                    req = self._preq.get(L) or self._persistent(L, True)
                    t0 = time.perf_counter_ns()
                    self._run(req, b, L)
                    t1 = time.perf_counter_ns()
                    seq = self.seq
                    self.seq = seq + 1
                    tr = _tracing._TRACER
                    if tr is not None and tr.enabled:
                        tr.record(K_FUSED, _tracing.DIR_NONE, -1, 0, L * 8, t0, t1, -1, seq, self.chan, b.nvars)
                    if st is not None and st is _core:
                        res = _core.unpack(fb, n1)
                    else:
                        res = st.unpack_from(fb) if st is not None else fb[:n1].tolist()
                    P = self.size
                    if P > 64 or P * res[1] != res[0] * res[0] or P * res[3] != res[2] * res[2]:
                        if not _same_signature(P, res):
                            raise self._divergence(b, L)
                    b.res = (res, _EMPTY, _EMPTY)
                    b.done = True
                except BaseException as exc:
                    err = self._fuse_failed(b, L, exc)
                    if err is exc:
                        raise
                    raise err from exc
                return b.nvars
        if self._strict:
            raise SharedVariableError(
                f"rank {self.rank if self.rank >= 0 else world().Get_rank()}: a force point (a shared value "
                "was read or flushed) inside `with fused(strict=True)`; read shared values after the block")
        if self._broken:
            raise NbmpiError(f"rank {self.rank}: shared variables are unusable: {self._broken}; restart the "
                             "program (all ranks)")
        if self.comm is None:
            self._connect()
        self.batch = _Batch(self.threshold_words)
        try:
            self._reduce(b)
        except BaseException as exc:
            b.error = exc
            raise
        return b.nvars

    def _reduce(self, b: _Batch) -> None:
        m = self._mpi
        n1, n2 = len(b.f8), len(b.i8)
        words = n1 + b.words
        L = 16 if words <= 16 else _size_class(words)
        if self._buf.size < L:
            self._grow(L)
        fb = self._buf
        ib = fb.view(np.int64)
        sig = hash((b.sig, L, tuple(b.log)))
        h1 = float((sig % _M20A) + 1)
        h2 = float(((sig >> 20) % _M20B) + 1)
        f8 = b.f8
        f8[0] = h1
        f8[1] = h1 * h1
        f8[2] = h2
        f8[3] = h2 * h2
        fb[:n1] = f8
        if n2:
            ib[n1:n1 + n2] = b.i8
        pos = n1 + n2
        segs = None
        if b.arrs:
            segs = np.empty((len(b.arrs), 4), dtype=np.int64)
            for s, (acc, op, kind) in enumerate(b.arrs):
                w = acc.size * (2 if kind == W_C16 else 1)
                if kind == W_I8:
                    ib[pos:pos + w] = acc
                else:
                    fb[pos:pos + w] = acc.view(np.float64)
                segs[s] = (pos, w, op, kind)
                pos += w
        if pos < L:
            fb[pos:L] = 0.0
        comm = self.comm
        tr = _tracing._TRACER
        allsum = b.allsum
        req = self._preq.get(L if allsum else (L, False))
        if req is None:
            req = self._persistent(L, allsum)
        if allsum:
            tag = 0
        else:
            ops1 = self._ops_f8 if self._ops_f8.size >= n1 else np.zeros(2 * n1, np.int8)
            self._ops_f8 = ops1
            ops1[:n1] = 0
            for i, op in b.f8_nonsum.items():
                ops1[i] = op
            ops2 = self._ops_i8 if self._ops_i8.size >= max(n2, 1) else np.zeros(2 * n2, np.int8)
            self._ops_i8 = ops2
            if n2:
                ops2[:n2] = b.i8_ops
            lay = _LAYOUT
            lay[0], lay[1], lay[2], lay[3] = n1, ops1, n2, ops2
            lay[4] = segs if segs is not None else np.zeros((0, 4), np.int64)
            tag = 1
        t0 = time.perf_counter_ns()
        try:
            self._run(req, b, L)
        except self._mpi.Exception as exc:   # e.g. truncation: the ranks passed different sizes
            if self._broken:   # already diagnosed (by _wait)
                raise
            self._abandoned(f"#{self.seq}")()
            err = self._failed(b, L, exc)
            if err is exc:
                raise
            raise err from exc
        t1 = time.perf_counter_ns()
        seq = self.seq
        self.seq = seq + 1
        if tr is not None and tr.enabled:
            tr.record(K_FUSED, _tracing.DIR_NONE, -1, tag, L * 8, t0, t1, -1, seq, self.chan, b.nvars)
        res = fb[:n1].tolist()
        if not _same_signature(self.size, res):
            raise self._divergence(b, L)
        res_arrs = []
        if b.arrs:
            for (acc, op, kind), (st, w, _, _) in zip(b.arrs, segs.tolist()):
                if kind == W_I8:
                    res_arrs.append(ib[st:st + w].copy())
                elif kind == W_C16:
                    res_arrs.append(fb[st:st + w].copy().view(np.complex128))
                else:
                    res_arrs.append(fb[st:st + w].copy())
        b.res = (res, ib[n1:n1 + n2].tolist() if n2 else [], res_arrs)
        b.done = True

    def _divergence(self, b: _Batch, words: int) -> SPMDDivergence:
        """Error path after a completed collective whose signatures differ: exchange the
        sequence logs, name the first difference (the same text on every rank). Waits
        long enough for ranks whose own collective could not complete to time out and
        join (see :meth:`_failed`)."""
        self._publish(self.seq - 1, words)   # ranks stuck in this collective compare sizes with it
        t = self.timeout
        logs = self._exchange_logs(b, words, None if t is None else 2.0 * t + 10.0)
        op = f"fused reduction #{self.seq - 1}"
        if logs is None:
            return SPMDDivergence(self.rank, op, "the signatures differ; the other ranks did not report their "
                                  "sequences in time, so the difference cannot be named")
        detail = _compare(logs) or _first_difference([lg for lg, _, _ in logs], logs[0][1] > 0)
        note = _size_note(logs)
        if note:
            self._ready = False
            self._broken = "the ranks' fused collectives had different sizes (an SPMD divergence)"
        return SPMDDivergence(self.rank, op, detail + note)

    def _exchange_logs(self, b: _Batch, words: int, timeout: Optional[float]) -> Optional[list]:
        """Every rank's ``(steps, folded, words)`` over the diagnosis communicator
        (error paths only; pickled); None if that exchange timed out."""
        comm, rank = self.diag, self.rank
        if comm is None or self._diag_broken:
            return None
        steps = _decode_log(b.log, b.kmap)
        mine = np.frombuffer(pickle.dumps((steps, b.folded, words)), dtype=np.uint8)
        sizes = np.zeros(self.size, dtype=np.int64)
        try:
            req = comm.Iallgather(np.array([mine.size], dtype=np.int64), sizes)
            waiting.wait(req, timeout, rank, None, "SPMD divergence diagnosis (sizes)", cancellable=False)
            allb = np.empty(int(sizes.sum()), dtype=np.uint8)
            req = comm.Iallgatherv(mine, [allb, sizes])
            waiting.wait(req, timeout, rank, None, "SPMD divergence diagnosis (logs)", cancellable=False)
        except CommTimeout:
            self._diag_broken = True
            return None
        logs, off = [], 0
        for s in sizes.tolist():
            logs.append(pickle.loads(allb[off:off + s].tobytes()))
            off += s
        return logs


class _SizeMismatch(NbmpiError):
    """Internal: a peer's size board shows the same fused collective with another size
    (``FusionEngine._size_watch``); ``_wait`` turns it into the diagnosis."""


_UNIFORM_TAGS = range(-31, -15)   # -16 - code for the operation codes 0..15 (_Batch.note_uniform)


def _decode_log(log: list, kmap: dict) -> list:
    """The batch's signature log as readable steps: an int is the key of a contribution
    (``kmap``; a float64 scalar one is ``id << 3 | op``) or the tag ``-16 - code`` of a
    uniform operand, followed by the operand's key (read as ``(-7, code, key)``); tuples
    are steps already."""
    steps = []
    it = iter(log)
    for k in it:
        if type(k) is not int:
            steps.append(k)
        elif k in kmap:
            steps.append(kmap[k])
        elif k in _UNIFORM_TAGS:
            steps.append((-7, -16 - k, next(it, None)))
        else:
            steps.append((k >> 3, k & 7, _F8_NUM, ()))
    return steps


def _size_note(logs: list) -> str:
    """Suffix of the divergence text when the ranks' fused buffers differed in size."""
    if all(w == logs[0][2] for _, _, w in logs):
        return ""
    return ("; the ranks' pending data differed in size, so MPI could not match the collective and shared "
            "variables are unusable now (restart the program)")


def _compare(logs: list) -> Optional[str]:
    """The first difference of the ranks' ``(steps, folded, words)``; None if they agree."""
    folds = [f for _, f, _ in logs]
    if any(f != folds[0] for f in folds):
        return (f"the sequences differ within the first {max(folds) * _LOG_CAP} pending steps (not kept); "
                "force more often (flush()) to locate the difference")
    steps = [lg for lg, _, _ in logs]
    if any(lg != steps[0] for lg in steps[1:]):
        return _first_difference(steps, folds[0] > 0)
    words = [w for _, _, w in logs]
    if any(w != words[0] for w in words):
        return "pending sizes differ: " + ", ".join(f"rank {r}: {w} words" for r, w in enumerate(words))
    return None


def _describe(key: Optional[tuple]) -> str:
    if key is None:
        return "nothing (its sequence ended here)"
    tag = key[0]
    if tag == -7:
        return f"uniform operand {_show(key[2])} of {_FN_NAMES.get(key[1], 'an operation')}"
    if tag == -8:
        return f"shared variable #{key[1]} created/reset with value {_show(key[2])}"
    if tag == -9:
        return f"consume with floor {_show(key[1])}"
    vid, op, num, shape = key
    shp = "scalar" if shape == () else f"shape {shape}"
    return f"{OP_NAMES[op]} contribution to shared variable #{vid} ({_dtype_name(num)}, {shp})"


def _show(vkey: Any) -> str:
    if isinstance(vkey, tuple):
        if len(vkey) == 4 and vkey[0] == -2:
            return f"<array shape {vkey[2]} {_dtype_name(vkey[3])}, crc32 {vkey[1]:#x}>"
        if vkey == _NAN_KEY:
            return "nan"
        return repr(complex(*vkey))
    return repr(vkey)


def _dtype_name(num: int) -> str:
    for t in np.sctypeDict.values():
        try:
            if np.dtype(t).num == num:
                return str(np.dtype(t))
        except TypeError:
            continue
    return f"dtype#{num}"


def _first_difference(logs: List[List[tuple]], truncated: bool) -> str:
    n = max(len(lg) for lg in logs)
    for i in range(n):
        items = [lg[i] if i < len(lg) else None for lg in logs]
        if any(it != items[0] for it in items[1:]):
            parts = "; ".join(f"rank {r}: {_describe(it)}" for r, it in enumerate(items))
            hint = ""
            if any(it is not None and it[0] == -7 for it in items):
                hint = (". A uniform operand (c in x * c, x / c, ...) scales every rank's copy and must be the "
                        "same on every rank; for the product of every rank's a write x *= a, for local "
                        "arithmetic read the value first (float(x) * a)")
            return f"first difference at pending step {i}: {parts}{hint}"
    if truncated:
        return (f"the sequences differ within earlier pending steps that were folded away (more than "
                f"{_LOG_CAP} steps without a force point); force more often (flush()) to locate it")
    return "the sequences differ in a way the logs do not show (e.g. NaN creation values)"


_ENGINE: Optional[FusionEngine] = None


def engine() -> FusionEngine:
    """This process's fusion engine (created on first use, no communication)."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = FusionEngine()
        if _core is not None:
            _core.set_engine(_ENGINE)
    return _ENGINE


def flush() -> int:
    """Force point: resolve all pending contributions now, in one collective call.

    Collective (every rank, same program point), blocking. Returns the number
    of variables resolved (0 and no communication if nothing is pending).
    """
    return engine().flush()


@contextlib.contextmanager
def fused(strict: bool = False) -> Iterator[FusionEngine]:
    """Block whose contributions are resolved together when it ends (one collective).

    Leaving the block is a force point (collective; skipped if the block
    raised). With ``strict=True`` any force point inside the block (reading a
    shared value, ``flush()``, the size threshold) raises
    :class:`SharedVariableError`, which guarantees at most one collective for
    the block.
    """
    e = engine()
    if strict:
        e._strict += 1
        e._ready = False
    try:
        yield e
    finally:
        if strict:
            e._strict -= 1
            e._ready = e.comm is not None and not e._strict and not e._broken
    e.flush()


def configure(threshold_bytes: Optional[int] = None, timeout: Any = ...) -> None:
    """Set the size threshold (pending bytes that force a flush early) and/or the
    timeout (seconds, ``None`` = forever) of force points. Local, but every
    rank must use the same threshold (it decides where collectives happen)."""
    e = engine()
    if threshold_bytes is not None:
        if int(threshold_bytes) < 8:
            raise ValueError(f"threshold_bytes={threshold_bytes} is too small; expected at least 8 bytes")
        e.threshold_words = max(HEADER + 1, int(threshold_bytes) // 8)
        e._sync_core()
        e.batch.room = e.threshold_words - 1 - e.batch.words
    if timeout is not ...:
        e.timeout = None if timeout is None else float(timeout)


# --------------------------------------------------------------------------- values
def _working(dtype: np.dtype) -> int:
    k = dtype.kind
    if k == "c":
        return W_C16
    if k == "f":
        return W_F8
    return W_I8


_WORK_DTYPE = {W_F8: np.dtype(np.float64), W_I8: np.dtype(np.int64), W_C16: np.dtype(np.complex128)}
_F8 = np.dtype(np.float64)
_F8_NUM = _F8.num
_NUM_TYPES = (int, float, complex, bool, np.number, np.bool_)
_REAL_FAST = frozenset((float, int, np.float64, np.float32, np.int64, np.int32))


def _check_dtype(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind not in "biufc" or (dtype.kind == "u" and dtype.itemsize == 8):
        raise SharedVariableError(f"{where}: dtype {dtype} is not supported for shared variables; use a "
                                  "bool, int (up to int64), uint (up to uint32), float or complex dtype")
    return dtype


def _apply(cast, shape: tuple, v: Any, entries) -> Any:
    """Apply resolved entries (op, batch, block, index, extra) to value ``v`` in program order."""
    for ent in entries:
        op, b, blk, i = ent[0], ent[1], ent[2], ent[3]
        if b.error is not None:
            raise b.error
        r = b.res[blk][i]
        if blk == 2:
            r = r.reshape(shape) if shape else r[0]
        if op == SUM:
            v = cast(v + r)
        elif op == PROD:
            v = cast(v * r)
        elif op == MIN:
            v = cast(np.minimum(v, r) if shape else (r if (r < v or r != r) else v))
        elif op == MAX:
            v = cast(np.maximum(v, r) if shape else (r if (r > v or r != r) else v))
        else:  # CONSUME
            v = cast(_consume_level(v, r, ent[4]))
    return v


def _eval(node) -> Any:
    """Value of a base / snapshot / derived node (forces if it has unresolved entries)."""
    if type(node) is _Derived:
        v = node.value
        if v is None:
            args = node.args
            if len(args) == 2:
                v = node.fn(_arg(args[0]), _arg(args[1]))
            else:
                v = node.fn(*[_arg(a) for a in args])
            if type(v) is not float or node.cast is not float:
                v = node.cast(v)
            node.value = v
            node.args = ()
        return v
    if type(node) is _Snap:
        v = node.base
        ents = node.entries
        if type(v) is float and len(ents) == 1:
            op, b, blk, i, _ = ents[0]
            if op == 0 and blk == 0:
                if not b.done:
                    _ensure_done(ents)
                v = v + b.res[0][i]
                node.base = v
                node.entries = ()
                return v
        if type(v) is _Snap or type(v) is _Derived:
            v = _eval(v)
        if node.entries:
            _ensure_done(node.entries)
            v = _apply(node.cast, node.shape, v, node.entries)
            node.base, node.entries = v, ()
        return v
    return node


def _arg(a: Any) -> Any:
    """Value of an operand of a :class:`_Derived`: a constant, a lazy node, or a *slot
    reference* ``(base, batch, index)`` = float64 base plus one reduced sum word (the
    cheap snapshot of a float64 scalar with one pending sum; constants are never tuples)."""
    t = type(a)
    if t is tuple:
        base, b, i = a
        if not b.done:
            _force(b)
        return base + b.res[0][i]
    if t is _Derived:
        v = a.value
        return v if v is not None else _eval(a)
    if t is _Snap:
        return _eval(a)
    return a


def _force(b: "_Batch") -> None:
    """Make batch ``b`` resolved (a force point) or raise the error that failed it."""
    if b.error is None:
        engine().flush()
    if b.error is not None:
        raise b.error


def _ensure_done(entries) -> None:
    for ent in entries:
        b = ent[1]
        if not b.done:
            if b.error is not None:
                raise b.error
            engine().flush()
            if b.error is not None:
                raise b.error
            return


_VAR_SLOTS = ("_id", "dtype", "shape", "_kind", "_base", "_entries", "_ob", "_oi", "_oop", "_oblk", "_init",
              "_cast", "_lastb", "_sf", "_ksum", "name")


class _PyVarBase:
    """The fields of a shared variable and the pure-Python implementation of its hot
    operators (``reset``, ``+=``, ``-=``, ``float()``, ``+ - * /``).

    This is the reference implementation. When the compiled ``_fused_core`` extension
    is available, :class:`SharedVar` derives from its ``VarBase`` instead, which does
    the common float64-scalar cases in C on the same fields and calls these methods
    (as plain functions) for everything else."""

    __slots__ = _VAR_SLOTS

    def __float__(self) -> float:
        ents = self._entries
        base = self._base
        if not ents:
            if type(base) is float:
                return base
            if type(base) is _Derived:
                v = base.value
                if v is None:
                    v = _eval(base)
                if type(v) is float:
                    self._base = v
                    return v
        elif len(ents) == 1 and type(base) is float:
            op, b, blk, i, _ = ents[0]
            if op == 0 and blk == 0:   # one float64 sum slot: base + reduced word
                if not b.done:
                    _ensure_done(ents)
                v = base + b.res[0][i]
                self._base = v
                self._entries = ()   # (_ob is a resolved batch now, never the current one)
                return v
        return float(self.value)

    def reset(self, value: Any = None) -> "SharedVar":
        """Set the variable back to its creation value, or to ``value``, which must be
        the same on every rank (checked at the next force point). Local, no force;
        pending contributions of this variable are dropped from its value."""
        if value is None:
            init = self._init
            if init is not None:
                self._base = init
                if self._entries:
                    self._entries = ()
                    self._ob = None
                return self
        if isinstance(value, SharedVar):
            return self.assign(value)
        if value is None:
            if self._init is None:
                raise SharedVariableError(f"shared variable #{self._id} is an intermediate result and has "
                                          "no creation value; pass reset(value)")
            v = self._init
        else:
            v = self._coerce_uniform(value, "reset")
            engine().batch.note((-8, self._id, _value_key(v)))
        self._base = v
        self._entries = ()
        self._ob = None
        return self

    def _fast_sum(self, a: float) -> "SharedVar":
        """``x += a`` for a float64 scalar variable and a real number (the hot path: a few
        attribute writes; the signature step is the int ``id << 3``, decoded on the error
        path by :meth:`FusionEngine._exchange_logs`)."""
        b = _ENGINE._batch
        if self._ob is b and self._oop == 0:
            b.f8[self._oi] += a
            return self
        f8 = b.f8
        i = len(f8)
        f8.append(a)
        ents = self._entries
        if len(ents) == 1 and type(self._base) is float:
            op, ob, blk, j, _ = ents[0]
            if op == 0 and blk == 0 and ob.done:   # a resolved sum nobody read: fold it in (bounded entries)
                self._base += ob.res[0][j]
                ents = ()
        self._entries = ents + ((0, b, 0, i, None),)
        self._ob = b
        self._oi = i
        self._oop = 0
        self._oblk = 0
        if self._lastb is not b:
            self._lastb = b
            b.nvars += 1
        b.log.append(self._ksum)
        if i > b.room:
            _ENGINE.flush()
        return self

    def __iadd__(self, a):
        if self._sf:
            if type(a) is float:
                return self._fast_sum(a)
            if type(a) in _REAL_FAST:
                return self._fast_sum(float(a))
        if isinstance(a, SharedVar):
            return self._local_inplace(operator.add, a)
        return self._contribute(SUM, a)

    def __isub__(self, a):
        if self._sf and type(a) in _REAL_FAST:
            return self._fast_sum(-float(a))
        if isinstance(a, SharedVar):
            return self._local_inplace(operator.sub, a)
        return self._contribute(SUM, _neg(a))

    def __add__(self, a):
        if isinstance(a, SharedVar):
            if self._sf and a._sf and (type(a) is _LazyF8 or type(a) is SharedVar):
                return _f8_binary(operator.add, 1, self, a, True, True)
            return _binary(operator.add, self, a)
        return self.copy()._contribute(SUM, a)

    __radd__ = __add__

    def __sub__(self, a):
        if isinstance(a, SharedVar):
            if self._sf and a._sf and (type(a) is _LazyF8 or type(a) is SharedVar):
                return _f8_binary(operator.sub, 2, self, a, True, True)
            return _binary(operator.sub, self, a)
        return self.copy()._contribute(SUM, _neg(a))

    def __rsub__(self, a):
        return _unary(operator.neg, self)._contribute(SUM, a)

    def __mul__(self, a):
        return _scaling(self, a, operator.mul, 3)

    def __rmul__(self, a):
        return _rscaling(self, a, operator.mul, 3)

    def __truediv__(self, a):
        return _scaling(self, a, operator.truediv, 4)

    def __rtruediv__(self, a):
        return _rscaling(self, a, operator.truediv, 4)


def _scaling(self: "SharedVar", a: Any, fn, code: int) -> "SharedVar":
    """``self * a`` / ``self / a``: a float/int ``a`` is a uniform operand, a shared one is local arithmetic."""
    if self._sf:
        ta = type(a)
        if ta is float or ta is int:
            return _f8_binary(fn, code, self, a, True, False)
        if (ta is _LazyF8 or ta is SharedVar) and a._sf:
            return _f8_binary(fn, code, self, a, True, True)
    return _binary(fn, self, a)


def _rscaling(self: "SharedVar", a: Any, fn, code: int) -> "SharedVar":
    """``a * self`` / ``a / self`` for a non-shared ``a`` (a uniform operand)."""
    if self._sf and (type(a) is float or type(a) is int):
        return _f8_binary(fn, code, a, self, False, True)
    return _binary(fn, a, self)


class SharedVar(_core.VarBase if _core is not None else _PyVarBase):  # type: ignore[misc]
    """A value replicated on every rank (scalar or numpy array), updated lazily.

    Create with :func:`shared` (collective in meaning, no communication):
    every rank must create its shared variables in the same order with the
    same value. See the module docstring for the meaning of each operator.
    Attributes ``shape``, ``dtype``, ``ndim``, ``size``, ``name`` never force.
    """

    __slots__ = ("__weakref__",)
    __array_priority__ = 1000

    def __init__(self, value: Any, name: Optional[str] = None, _check: bool = True):
        e = _ENGINE or engine()
        vid = self._id = e.next_id
        e.next_id = vid + 1
        self.name = name
        if type(value) is float:   # the common case, inline (same result as _setup below)
            self.dtype = _F8
            self.shape = ()
            self._kind = W_F8
            self._base = value
            self._entries = ()
            self._ob = None
            self._oi = 0
            self._oop = -1
            self._oblk = 0
            self._lastb = None
            self._sf = True
            self._ksum = vid << 3
            self._cast = float
            self._init = value
            if _check:
                e.batch.note((-8, vid, value if value == value else _NAN_KEY))
            return
        if isinstance(value, SharedVar):
            raise SharedVariableError("shared(x) of a shared variable: use x.copy() (or shared arithmetic)")
        if isinstance(value, (float, int)) and not isinstance(value, bool):
            dtype = _F8 if isinstance(value, float) else np.dtype(np.int64)
            shape: tuple = ()
            v = float(value) if isinstance(value, float) else np.int64(value)
        else:
            arr = np.asarray(value)
            dtype = _check_dtype(arr.dtype, f"shared({type(value).__name__})")
            shape = arr.shape
            if shape == ():
                v = float(arr) if dtype == _F8 else arr[()]
            else:
                v = arr.copy()
                v.flags.writeable = False
        self._setup(dtype, shape, v)
        self._init = v
        if _check:
            e.batch.note((-8, self._id, _value_key(v)))

    def _setup(self, dtype: np.dtype, shape: tuple, base: Any) -> None:
        self.dtype = dtype
        self.shape = shape
        self._kind = _working(dtype)
        self._base = base
        self._entries: tuple = ()   # pending (op, batch, block, index, extra), program order
        self._ob = None
        self._oi = 0
        self._oop = -1
        self._oblk = 0
        self._lastb = None
        self._sf = shape == () and dtype == _F8
        self._ksum = self._id << 3   # signature step of a float64 scalar sum (decoded in FusionEngine._exchange_logs)
        if shape == ():
            self._cast = float if dtype == _F8 else dtype.type
        else:
            self._cast = _array_caster(dtype)

    @classmethod
    def _derived(cls, base: Any, dtype: np.dtype, shape: tuple) -> "SharedVar":
        self = SharedVar.__new__(SharedVar)
        e = engine()
        self._id = e.next_id
        e.next_id += 1
        self.name = None
        self._setup(dtype, shape, base)
        self._init = None
        return self

    # -- introspection (no force) -------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1

    @property
    def id(self) -> int:
        """Creation index: the identity of this variable across ranks."""
        return self._id

    @property
    def pending(self) -> bool:
        """True if this variable's value still needs communication (local, no force)."""
        base = self._base
        if (type(base) is _Derived and base.value is None) or (type(base) is _Snap and base.entries):
            return True
        return any(not ent[1].done for ent in self._entries)

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        if not self._entries and type(self._base) is not _Derived and type(self._base) is not _Snap:
            return f"SharedVar#{self._id}{label}({self._base!r})"
        shp = "" if self.shape == () else f" shape={self.shape}"
        return f"SharedVar#{self._id}{label}(<lazy: {len(self._entries)} pending update(s)> dtype={self.dtype}{shp})"

    # -- reading (force points) ------------------------------------------------------
    @property
    def value(self) -> Any:
        """The value (same on every rank). Force point if anything is pending.

        Scalars come back as Python float (float64) or numpy scalars, arrays
        as read-only numpy arrays.
        """
        base = self._base
        if not self._entries and type(base) is not _Derived and type(base) is not _Snap:
            return base
        return self._resolve()

    @value.setter
    def value(self, v: Any) -> None:
        self.assign(v)

    def _resolve(self) -> Any:
        if self._entries:
            _ensure_done(self._entries)
        base = self._base
        if type(base) is _Derived or type(base) is _Snap:
            base = _eval(base)
        v = _apply(self._cast, self.shape, base, self._entries) if self._entries else base
        self._base = v
        self._entries = ()
        self._ob = None
        return v


    def __int__(self) -> int:
        return int(self.value)

    def __complex__(self) -> complex:
        return complex(self.value)

    def __index__(self) -> int:
        if self.dtype.kind not in "biu":
            raise TypeError(f"shared variable #{self._id} of dtype {self.dtype} cannot be used as an index")
        return int(self.value)

    def __bool__(self) -> bool:
        return bool(self.value)

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __array__(self, dtype=None, copy=None):
        v = np.asarray(self.value)
        if dtype is not None:
            v = v.astype(dtype)
        return v.copy() if copy else v

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of scalar shared variable #{self._id}")
        return self.shape[0]

    def __getitem__(self, idx):
        return self.value[idx]

    def __iter__(self):
        return iter(self.value)

    def __lt__(self, o):
        return self.value < _local(o)

    def __le__(self, o):
        return self.value <= _local(o)

    def __gt__(self, o):
        return self.value > _local(o)

    def __ge__(self, o):
        return self.value >= _local(o)

    def __eq__(self, o):  # type: ignore[override]
        return self.value == _local(o)

    def __ne__(self, o):  # type: ignore[override]
        return self.value != _local(o)

    __hash__ = None  # type: ignore[assignment]

    # -- assignment ----------------------------------------------------------------------
    def assign(self, other: "SharedVar") -> "SharedVar":
        """Make this variable equal to shared ``other`` (local, lazy). Assigning a
        rank-local value raises :class:`SharedVariableError`, as in the seed."""
        if not isinstance(other, SharedVar):
            raise SharedVariableError(
                f"assigning a rank-local value ({type(other).__name__}) to shared variable #{self._id} is "
                "not allowed: the ranks could end up with different values. Contribute it instead "
                "(x += a, x *= a, x.min_with(a), x.max_with(a)) or reset the variable to a value that is "
                "the same on every rank with x.reset(value)")
        self._rebase(_snap(other), other.dtype, other.shape)
        return self


    def copy(self) -> "SharedVar":
        """A new shared variable with this one's (possibly pending) value. Local."""
        return SharedVar._derived(_snap(self), self.dtype, self.shape)

    def _coerce_uniform(self, value: Any, what: str) -> Any:
        arr = np.asarray(value)
        if not np.can_cast(arr.dtype, self.dtype, "same_kind") and not isinstance(value, (int, float)):
            raise SharedVariableError(f"{what} of shared variable #{self._id} ({self.dtype}) with a value of "
                                      f"dtype {arr.dtype}; expected a value castable to {self.dtype}")
        try:
            arr = np.broadcast_to(arr.astype(self.dtype), self.shape)
        except ValueError:
            raise SharedVariableError(f"{what} of shared variable #{self._id}: shape {arr.shape} does not "
                                      f"broadcast to {self.shape}") from None
        if self.shape == ():
            return self._cast(arr[()])
        out = arr.copy()
        out.flags.writeable = False
        return out

    def _rebase(self, base: Any, dtype: np.dtype, shape: tuple) -> None:
        self._setup(dtype, shape, base)

    # -- contributions ---------------------------------------------------------------------
    def _contribute(self, op: int, a: Any) -> "SharedVar":
        e = engine()
        b = e.batch
        kind = self._kind
        if self.shape == ():
            if isinstance(a, Grant):
                a = a.value
            if not isinstance(a, _NUM_TYPES):
                arr = np.asarray(a)
                if arr.shape != ():
                    raise SharedVariableError(
                        f"{OP_NAMES[op]} contribution of shape {arr.shape} to scalar shared variable "
                        f"#{self._id}; expected a scalar (create the variable from an array for array "
                        "reductions)")
                a = arr[()]
            if kind == W_F8 and isinstance(a, (float, int)):
                a = float(a)
                adt = None
            else:
                adt = np.asarray(a).dtype if not isinstance(a, (int, float, bool)) else None
            if adt is None and kind == W_F8:
                pass
            elif kind == W_F8:
                if isinstance(a, complex) or (adt is not None and adt.kind == "c"):
                    raise SharedVariableError(f"complex contribution to real shared variable #{self._id} "
                                              f"({self.dtype}); create it from a complex value")
                a = float(a)
            elif kind == W_I8:
                if isinstance(a, float) or (adt is not None and adt.kind not in "biu"):
                    raise SharedVariableError(
                        f"{OP_NAMES[op]} contribution of a non-integer value ({a!r}) to integer shared "
                        f"variable #{self._id} ({self.dtype}); create the variable from a float value")
                a = int(a)
            else:
                a = complex(a)
            if self._ob is b and self._oop == op:
                lst = b.f8 if self._oblk == 0 else (b.i8 if self._oblk == 1 else None)
                i = self._oi
                if lst is not None:
                    lst[i] = _acc(op, lst[i], a)
                else:
                    acc = b.arrs[i][0]
                    acc[0] = _acc(op, complex(acc[0]), a)
                return self
            if kind == W_F8:
                i = len(b.f8)
                b.f8.append(a)
                if op != SUM:
                    if b.f8_nonsum is _NOD:
                        b.f8_nonsum = {}
                    b.f8_nonsum[i] = op
                blk, w = 0, 1
            elif kind == W_I8:
                if b.i8 is _NOL:
                    b.i8, b.i8_ops = [], []
                b.i8.append(a)
                b.i8_ops.append(op)
                blk, i, w = 1, len(b.i8) - 1, 1
                b.allsum = False
            else:
                if b.arrs is _NOL:
                    b.arrs = []
                b.arrs.append([np.array([a], dtype=np.complex128), op, W_C16])
                blk, i, w = 2, len(b.arrs) - 1, 2
                b.allsum = False
        else:
            if isinstance(a, Grant):
                a = a.value
            arr = np.asarray(a)
            if not np.can_cast(arr.dtype, _WORK_DTYPE[kind], "same_kind"):
                raise SharedVariableError(
                    f"{OP_NAMES[op]} contribution of dtype {arr.dtype} to shared array #{self._id} "
                    f"({self.dtype}); expected values castable to {self.dtype}")
            try:
                arr = np.broadcast_to(arr, self.shape)
            except ValueError:
                raise SharedVariableError(
                    f"{OP_NAMES[op]} contribution of shape {arr.shape} to shared array #{self._id} of shape "
                    f"{self.shape}; expected a scalar or an array broadcastable to {self.shape}") from None
            if self._ob is b and self._oop == op:
                acc = b.arrs[self._oi][0].reshape(self.shape)
                _acc_array(op, acc, arr)
                return self
            acc = np.array(arr, dtype=_WORK_DTYPE[kind], copy=True).reshape(-1)
            if b.arrs is _NOL:
                b.arrs = []
            b.arrs.append([acc, op, kind])
            blk, i = 2, len(b.arrs) - 1
            w = acc.size * (2 if kind == W_C16 else 1)
            if kind != W_F8:
                b.allsum = False
        if op != SUM and op != CONSUME:
            b.allsum = False
        return self._new_slot(e, b, op, blk, i, w, None)

    def _new_slot(self, e: FusionEngine, b: _Batch, op: int, blk: int, i: int, w: int, extra) -> "SharedVar":
        self._entries += ((op, b, blk, i, extra),)
        if op != CONSUME:
            self._ob, self._oi, self._oop, self._oblk = b, i, op, blk
        else:
            self._ob = None
        if self._lastb is not b:
            self._lastb = b
            b.nvars += 1
        if blk != 0:
            b.add_words(w)
        if self._sf:
            b.note((self._id << 3) | op)     # float64 scalar: an int key (decoded in FusionEngine._exchange_logs)
        else:
            k, t = _ckey(self._id, op, self.dtype.num, self.shape)
            if b.kmap is _NOD:
                b.kmap = {}
            b.kmap[k] = t
            b.note(k)
        if len(b.f8) + b.words > e.threshold_words:
            e.flush()
        return self


    def __imul__(self, a):
        if isinstance(a, SharedVar):
            return self._local_inplace(operator.mul, a)
        return self._contribute(PROD, a)

    def min_with(self, a) -> "SharedVar":
        """``x = min(x, min over ranks of a)`` (a rank-local) or elementwise min with shared ``a``. Lazy."""
        if isinstance(a, SharedVar):
            return self._local_inplace(np.fmin, a)
        self._no_complex("min_with")
        return self._contribute(MIN, a)

    def max_with(self, a) -> "SharedVar":
        """``x = max(x, max over ranks of a)`` (a rank-local) or elementwise max with shared ``a``. Lazy."""
        if isinstance(a, SharedVar):
            return self._local_inplace(np.fmax, a)
        self._no_complex("max_with")
        return self._contribute(MAX, a)

    def _no_complex(self, what: str) -> None:
        if self._kind == W_C16:
            raise SharedVariableError(f"{what} on complex shared variable #{self._id}: complex numbers are "
                                      "unordered; reduce abs() values in a real shared variable instead")

    def _local_inplace(self, fn, other: "SharedVar") -> "SharedVar":
        res = _binary(fn, self, other)
        self._setup(res.dtype, res.shape, res._base)
        return self

    # binary operators ------------------------------------------------------------------------
    # the float64 scalar operators test for the fast lane inline (one call less per operator)


    def __floordiv__(self, a):
        return _binary(operator.floordiv, self, a)

    def __rfloordiv__(self, a):
        return _binary(operator.floordiv, a, self)

    def __mod__(self, a):
        return _binary(operator.mod, self, a)

    def __pow__(self, a):
        return _binary(operator.pow, self, a)

    def __rpow__(self, a):
        return _binary(operator.pow, a, self)

    def __neg__(self):
        return _unary(operator.neg, self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _unary(abs, self)

    # numpy: + - * / keep shared semantics, every other function forces and returns a local value
    _UFUNC_OPS = {np.add: "__add__", np.subtract: "__sub__", np.multiply: "__mul__",
                  np.true_divide: "__truediv__"}
    _UFUNC_ROPS = {np.add: "__radd__", np.subtract: "__rsub__", np.multiply: "__rmul__",
                   np.true_divide: "__rtruediv__"}

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method == "__call__" and not kwargs and len(inputs) == 2 and ufunc in SharedVar._UFUNC_OPS:
            x, y = inputs
            if x is self:
                return getattr(self, SharedVar._UFUNC_OPS[ufunc])(y)
            return getattr(self, SharedVar._UFUNC_ROPS[ufunc])(x)
        args = [i.value if isinstance(i, SharedVar) else i for i in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.value if isinstance(o, SharedVar) else o for o in kwargs["out"])
        return getattr(ufunc, method)(*args, **kwargs)


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
        e = engine()
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


def _consume_level(level, total, floor):
    """Pool level after a consume of ``total`` (sum of requests) with ``floor``."""
    if isinstance(level, np.ndarray) or isinstance(total, np.ndarray):
        level = np.asarray(level, dtype=np.float64)
        avail = np.maximum(level - floor, 0.0)
        return np.where(total <= avail, level - total, np.where(level > floor, floor, level))
    avail = level - floor
    if avail <= 0.0:
        return level
    return level - total if total <= avail else floor


def _grant_scale(level, total, floor):
    if isinstance(level, np.ndarray) or isinstance(total, np.ndarray):
        level = np.asarray(level, dtype=np.float64)
        avail = np.maximum(level - floor, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(total <= avail, 1.0, avail / np.where(total > 0, total, 1.0))
    avail = level - floor
    if avail <= 0.0:
        return 0.0 if total > 0 else 1.0
    return 1.0 if total <= avail else avail / total


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
            _ensure_done([(0, b)])
            total = b.res[self._blk][self._i]
            if self._blk == 2:
                total = total.reshape(self.shape)
            level = _eval(self._before)
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


# --------------------------------------------------------------------------- helpers
def _short(v: Any) -> str:
    s = repr(v.tolist() if isinstance(v, np.ndarray) and v.size <= 6 else v)
    return s if len(s) <= 60 else s[:57] + "..."


def _local(o: Any) -> Any:
    return o.value if isinstance(o, (SharedVar, Grant)) else o


def _neg(a: Any) -> Any:
    if isinstance(a, Grant):
        a = a.value
    if isinstance(a, (list, tuple)):
        a = np.asarray(a)
    return -a


def _acc(op: int, cur, a):
    if op == SUM or op == CONSUME:
        return cur + a
    if op == PROD:
        return cur * a
    if op == MIN:
        return a if (a < cur or a != a) else cur
    return a if (a > cur or a != a) else cur


def _acc_array(op: int, acc: np.ndarray, arr: np.ndarray) -> None:
    if op == SUM:
        np.add(acc, arr, out=acc, casting="same_kind")
    elif op == PROD:
        np.multiply(acc, arr, out=acc, casting="same_kind")
    elif op == MIN:
        np.minimum(acc, arr, out=acc, casting="same_kind")
    else:
        np.maximum(acc, arr, out=acc, casting="same_kind")


def _array_caster(dtype: np.dtype) -> Callable[[Any], np.ndarray]:
    def cast(v):
        out = np.array(v, dtype=dtype, copy=True)
        out.flags.writeable = False
        return out
    return cast


def _snap(x: SharedVar) -> Any:
    """x's current state for use in a derived value (closes x's open slot)."""
    if not x._entries:
        return x._base
    x._ob = None
    return _Snap(x._base, x._entries, x._cast, x.shape)


def _is_concrete(x: SharedVar) -> bool:
    return not x._entries and type(x._base) is not _Derived and type(x._base) is not _Snap


_FN_CODES = {operator.add: 1, operator.sub: 2, operator.mul: 3, operator.truediv: 4, operator.floordiv: 5,
             operator.mod: 6, operator.pow: 7, np.fmin: 8, np.fmax: 9}
_FN_NAMES = {1: "+", 2: "-", 3: "*", 4: "/", 5: "//", 6: "%", 7: "**", 8: "min", 9: "max"}

_RESULT_CACHE: Dict[tuple, Tuple[np.dtype, tuple]] = {}


def _result_meta(fn, a: Any, b: Any) -> Tuple[np.dtype, tuple]:
    def meta(v):
        if isinstance(v, SharedVar):
            return v.dtype, v.shape, True
        if isinstance(v, (float, int, complex, bool)):
            return type(v), (), False
        arr = np.asarray(v)
        return arr.dtype, arr.shape, False

    ma, mb = meta(a), meta(b)
    key = (fn, ma, mb)
    r = _RESULT_CACHE.get(key)
    if r is None:
        def sample(m):
            dt, shape, is_shared = m
            if isinstance(dt, type):
                return dt(1)
            return np.ones(shape, dtype=dt)[()] if shape == () else np.ones(shape, dtype=dt)

        with np.errstate(all="ignore"):
            out = np.asarray(fn(sample(ma), sample(mb)))
        r = (_check_dtype(out.dtype, f"result of {getattr(fn, '__name__', fn)}"), out.shape)
        _RESULT_CACHE[key] = r
    return r


class _LazyF8(SharedVar):
    """A float64 scalar shared variable made by shared arithmetic (``s1 * s1 / N``).

    Exactly a :class:`SharedVar`; only its rarely used attributes are filled on
    first use (:meth:`__getattr__` runs only for a slot that is not set yet), so
    an intermediate result of an expression costs a few attribute writes."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name in _LAZY_FILL:
            _fill_f8(self)
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_LAZY_FILL = frozenset(("name", "dtype", "shape", "_kind", "_ob", "_oi", "_oop", "_oblk", "_lastb", "_ksum",
                        "_cast", "_init"))


def _fill_f8(self: SharedVar) -> None:
    """Set the slots a :class:`_LazyF8` was created without to their float64-scalar
    defaults; slots already set (e.g. by an assignment that changed the dtype) are kept."""
    defaults = dict(name=None, dtype=_F8, shape=(), _kind=W_F8, _ob=None, _oi=0, _oop=-1, _oblk=0,
                    _lastb=None, _ksum=self._id << 3, _cast=float, _init=None)
    for name, v in defaults.items():
        try:
            object.__getattribute__(self, name)
        except AttributeError:
            object.__setattr__(self, name, v)


_UNIFORM_OK = (float, int)


def _f8_operand(x: Any, is_shared: bool, code: int) -> Tuple[Any, bool]:
    """One operand of :func:`_f8_binary`: ``(value, resolved)``. A shared operand with
    pending contributions becomes a slot reference ``(base, batch, index)`` or a
    :class:`_Snap` (and its open slot is closed); a uniform operand is logged for the
    SPMD check at the next force point."""
    if is_shared:
        e = x._entries
        v = x._base
        if not e:
            return v, type(v) is float
        x._ob = None
        if len(e) == 1 and type(v) is float:
            op, bb, blk, i, _ = e[0]
            return ((v, bb, i) if (op == 0 and blk == 0) else _Snap(v, e, float, ())), False
        return _Snap(v, e, float, ()), False
    _ENGINE.batch.note_uniform(code, x if x == x else _NAN_KEY)
    return x, True


def _f8_binary(fn, code: int, a: Any, b: Any, sa: bool, sb: bool) -> SharedVar:
    """``fn(a, b)`` (``code`` = ``_FN_CODES[fn]``) for float64 scalar shared operands
    (``sa``/``sb``) and Python float/int uniform ones: the result is a new float64
    shared variable, computed now if both operands are resolved, else a lazy node
    whose operand for a variable with one pending sum is the slot reference
    ``(base, batch, index)`` (a snapshot without a copy; the variable's open slot is
    closed so later contributions go to a new slot)."""
    va, ca = _f8_operand(a, sa, code)
    if b is a:
        vb, cb = va, ca
    else:
        vb, cb = _f8_operand(b, sb, code)
    if ca and cb:
        base = fn(va, vb)
        if type(base) is not float:
            base = float(base)
    else:
        base = _Derived(fn, (va, vb), float)
    res = _LazyF8.__new__(_LazyF8)
    e = _ENGINE
    vid = e.next_id
    e.next_id = vid + 1
    res._id = vid
    res._base = base
    res._entries = ()
    res._sf = True
    return res


def _binary(fn, a: Any, b: Any) -> SharedVar:
    """Local shared arithmetic; a non-shared operand must be uniform (checked at the next force point)."""
    ta = type(a)
    tb = type(b)
    if (ta is _LazyF8 or ta is SharedVar) and a._sf:
        if (tb is _LazyF8 or tb is SharedVar) and b._sf:
            return _f8_binary(fn, _FN_CODES.get(fn, 0), a, b, True, True)
        if tb in _UNIFORM_OK:
            return _f8_binary(fn, _FN_CODES.get(fn, 0), a, b, True, False)
    elif (tb is _LazyF8 or tb is SharedVar) and b._sf and ta in _UNIFORM_OK:
        return _f8_binary(fn, _FN_CODES.get(fn, 0), a, b, False, True)
    if isinstance(a, Grant) or isinstance(b, Grant):
        raise SharedVariableError("a Grant is a rank-local value and cannot be a uniform operand of shared "
                                  "arithmetic; contribute it (x += g) or read it (g.value)")
    if isinstance(a, (tuple, list)):
        a = np.asarray(a)
    if isinstance(b, (tuple, list)):
        b = np.asarray(b)
    sa, sb = isinstance(a, SharedVar), isinstance(b, SharedVar)
    if sa and sb and a._kind == W_F8 and b._kind == W_F8 and a.shape == () and b.shape == ():
        dtype, shape = _F8, ()
    else:
        dtype, shape = _result_meta(fn, a, b)
    for v, s in ((a, sa), (b, sb)):
        if not s:
            engine().batch.note_uniform(_FN_CODES.get(fn, 0), _value_key(v))
    cast = float if (dtype == _F8 and shape == ()) else (dtype.type if shape == () else _array_caster(dtype))
    if (not sa or _is_concrete(a)) and (not sb or _is_concrete(b)):
        with np.errstate(all="ignore"):
            v = cast(fn(a._base if sa else a, b._base if sb else b))
        return SharedVar._derived(v, dtype, shape)
    node = _Derived(fn, (_snap(a) if sa else a, _snap(b) if sb else b), cast)
    return SharedVar._derived(node, dtype, shape)


def _unary(fn, a: SharedVar) -> SharedVar:
    if _is_concrete(a):
        v = a._cast(fn(a._base))
        return SharedVar._derived(v, a.dtype, a.shape)
    return SharedVar._derived(_Derived(fn, (_snap(a),), a._cast), a.dtype, a.shape)


def shared(value: Any, name: Optional[str] = None) -> SharedVar:
    """Create a shared variable with initial ``value`` (scalar or array).

    Every rank must create its shared variables in the same order with the
    same value (checked at the next force point). No communication. A
    Python float gives float64, an int int64; arrays keep their dtype.
    ``name`` labels error messages.
    """
    return SharedVar(value, name=name)


def pool(level: Any, name: Optional[str] = None) -> SharedPool:
    """Create a :class:`SharedPool` (a float shared variable with :meth:`~SharedPool.consume`)."""
    return SharedPool(level, name=name)


if _core is not None:
    # the compiled hot path falls back to these (the reference implementation) for every
    # case it does not handle itself
    _f8_binary_py = _f8_binary
    _core.bind(reset=_PyVarBase.reset, iadd=_PyVarBase.__iadd__, isub=_PyVarBase.__isub__,
               float=_PyVarBase.__float__,
               ops=(_PyVarBase.__add__, _PyVarBase.__radd__, _PyVarBase.__sub__, _PyVarBase.__rsub__,
                    _PyVarBase.__mul__, _PyVarBase.__rmul__, _PyVarBase.__truediv__, _PyVarBase.__rtruediv__),
               fns=(operator.add, operator.sub, operator.mul, operator.truediv), force=_force, eval=_eval,
               snap=_Snap, f8_binary=_f8_binary_py, shared=SharedVar,
               lazy=_LazyF8, fast_types=tuple(_REAL_FAST), f8=_F8, nan_key=_NAN_KEY, nod=_NOD, nol=_NOL,
               log_cap=_LOG_CAP, batch_type=_Batch, tracing=_tracing, empty_list=_EMPTY,
               same_signature=_same_signature, kind_fused=K_FUSED, spin=_SPIN)
    _f8_binary = _core.f8_binary  # noqa: F811  (same function, compiled)
