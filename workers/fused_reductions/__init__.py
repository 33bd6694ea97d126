"""Lazy fused reductions on shared variables (the Communication Fusion Library's idea, extended).

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
controller jobs), which :mod:`~nbmpi.workers.fused_reductions.rebinding_guard` rewrites to
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
on doubles; otherwise the buffer carries a layout record after the header
(the op of every scalar word, the segments) and the operation is a
user-defined MPI operation on one contiguous datatype (MPI never splits it)
whose combining function is the numba kernel
:func:`nbmpi.workers.core.kernels.combine_words`, reading the layout from the
buffer itself (min/max propagate NaN, as every nbmpi reduction). After a few
polls the wait is :func:`nbmpi.workers.core.waiting.wait` (timeout
``NBMPI_TIMEOUT``, interruptible). ``repr()`` never forces (safe in
debuggers).

Cost model (what the hot path does): ``shared(c)`` of a float is a few field
writes and one logged step; ``x += a`` on a float64 scalar with a real number
appends one word to the batch's list and a few field writes (repeated ``+=``
between force points add in place); ``x.reset()`` is two field writes; shared
arithmetic on float64 scalars builds one small lazy node per operator whose
operands refer to the pending word directly (no copy); a force point packs
the list (and any arrays) into the preallocated buffer and runs the
persistent request. These cases, ``x *= a``, ``min_with``/``max_with``,
array creation and ``x += array`` and the general force point run in C when
the optional compiled core is built (Cython: ``_core.pyx``; the default
install compiles it; :data:`IMPLEMENTATION` says which one runs). The
compiled force point calls ``MPI_Start``/``MPI_Test`` on the request's handle
through mpi4py's C API (``_direct_mpi.pyx``, ``from mpi4py cimport MPI,
libmpi``; no Python call per poll; :attr:`Fuser.direct_mpi`;
``NBMPI_DIRECT_MPI=0`` goes through mpi4py's methods instead), and general
fusions give MPI the combine kernel as a C function
(:attr:`Fuser.compiled_op`). The compiled core works on the same
fields and data structures as the Python modules, which stay the reference
and handle every other case (other dtypes, errors, diagnosis).
``NBMPI_PURE_PYTHON=1`` selects the pure-Python implementation;
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
used: reading an affected variable raises the error again, and the fuser
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
naming the first difference, and the fuser is unusable afterwards (the
collective is left pending; restart the program). A peer that has not
reached the collective yet is only late, and the rank keeps waiting (no
false alarm on load imbalance). An MPI error instead of a hang (e.g.
truncation in another MPI library) and a timeout (``NBMPI_TIMEOUT`` or
:func:`configure`) lead to the same diagnosis; if the other ranks do not join
it (a rank never reached the force point) the original
:class:`~nbmpi.workers.core.errors.CommTimeout` or MPI error is raised, after at
most ``min(NBMPI_TIMEOUT, 10) + 5`` s more. Without a timeout a rank that
never reaches the force point at all is waited for forever (interruptibly),
as by any MPI collective. Divergences that keep the size class equal
(different variables, ops, order, uniform operands of the same size) are
detected by the signature of the one collective.

Tracing: each fused collective is one event of kind ``fused_allreduce``
(``DIR_NONE``, per-fuser ``seq``, ``count`` = number of variables it
resolved, ``tag`` 0 for ``MPI_SUM``, 1 for the compiled op).

Package layout (one job per module): :mod:`.wire` (wire format, signature),
:mod:`.pending` (batches, snapshots, lazy nodes), :mod:`.fusion` (the fuser:
persistent requests, force points, :func:`flush`, :func:`fused`,
:func:`configure`), :mod:`.boards` (RMA size boards), :mod:`.diagnosis`
(divergence diagnosis), :mod:`.lazy` (forcing and evaluating lazy values),
:mod:`.values` (shared variables and their arithmetic), :mod:`.grants` and
:mod:`.pools` (bounded reductions), :mod:`.implementation` (compiled or pure
Python), :mod:`.binding` (what the compiled core falls back to, handed over as
one typed ``_core.Bindings``); the compiled core itself is Cython:
``_core.pyx`` (hot paths; its typed interface in ``_core.pxd``, its code in
``_core_*.pxi`` by idea) and ``_direct_mpi.pyx`` (MPI through mpi4py's C
API).
"""
from __future__ import annotations

# the public API, and the names tests and benchmarks read (re-exported)
# flake8: noqa: F401
from ..core.errors import SharedVariableError, SPMDDivergence
from .diagnosis import _decode_log
from .fusion import (DEFAULT_THRESHOLD_BYTES, K_FUSED, THRESHOLD_ENV, Fuser, configure, fuser, flush,
                     fused)
from .grants import Grant
from .implementation import DIRECT_MPI_ENV, IMPLEMENTATION, PURE_PYTHON_ENV
from .pools import SharedPool, pool
from .values import SharedVar, shared
from .wire import _F8_NUM, CONSUME, HEADER, MAX, MIN, OP_NAMES, PROD, SUM
from .binding import bind as _bind

_bind()

__all__ = ["SharedVar", "SharedPool", "Grant", "shared", "pool", "flush", "fused", "configure",
           "fuser", "Fuser", "SPMDDivergence", "SharedVariableError"]
