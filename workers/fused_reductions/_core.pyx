# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: c_api_binop_methods=True, auto_pickle=False
"""The compiled core of fused reductions: the common shared-variable cases without the interpreter.

The pure-Python modules of the package are the reference and own the
semantics. This module gives them C types with the same fields and
constructors (``VarBase`` under ``SharedVar``, ``BatchBase`` under ``_Batch``,
``Derived``) and does in C only the common cases:

  creation ``shared(c)`` of a float or an array; ``reset()``; ``x += a``,
  ``x -= a``, ``x *= a``, ``x.min_with(a)``, ``x.max_with(a)`` on a float64
  scalar (real a); ``x += array`` (same shape and working dtype); ``consume``
  from a float pool; ``float(x)`` with one pending entry; ``x + y``, ``x - y``,
  ``x * y``, ``x / y`` on float64 scalar shared operands and float/int
  uniform operands, and the evaluation of those lazy nodes; both force
  points (:func:`fuse`: only float64 sums pending; :func:`fuse_general`: any
  ops, int64 words and array segments, the layout record after the header).

with exactly the data structures of the Python code (entries tuples
``(op, batch, block, index, extra)``, slot references ``(base, batch, index)``,
lazy ``Derived`` nodes, the batch's word list and signature log); the one
difference: a variable's single pending float64 sum is kept as two fields and
becomes its entries tuple only when Python code reads ``_entries``. Every other
case calls the Python implementation, so both paths share one set of semantics
(the tests run both).

The interface to the Python modules is typed and declared in ``_core.pxd``:
a :class:`Bindings` (the reference functions, the types the core creates, the
shared constants), built once by ``fused_reductions.binding`` and handed over
with :func:`bind`, and the :class:`FuserState` :data:`state` (counters,
current batch, fusion buffer, persistent requests, runner), which
``Fuser`` keeps current. The code is one extension module in files by
idea: ``_core_batch.pxi`` (the batch and its signature log),
``_core_lazy.pxi`` (lazy nodes and their evaluation), ``_core_var.pxi`` (the
shared variable type: contributions and reading), ``_core_arith.pxi`` (shared
arithmetic and creation), ``_core_force.pxi`` (the force points).

MPI: the force point starts and tests its persistent request through a
:class:`Runner`: this module's calls mpi4py's ``Start``/``Test`` methods; the
one in ``_direct_mpi`` (built against mpi4py's C API, loaded once MPI is
initialised) calls ``MPI_Start``/``MPI_Test`` on the request's handle. Trace
events go through the tracer's public ``record`` call (its C entry
``TracerCore.record_c`` when the tracer is the compiled one). Importing this module
does not initialise MPI.
"""
cimport cython
from cpython.array cimport array, clone
from cpython.buffer cimport PyBUF_ANY_CONTIGUOUS, PyBuffer_Release, PyObject_GetBuffer
from cpython.float cimport PyFloat_AsDouble
from cpython.long cimport PyLong_AsDouble, PyLong_CheckExact
from cpython.object cimport PyObject
from libc.string cimport memset
from libc.string cimport memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from ..tracing._tracer_core cimport TracerCore

import zlib

import numpy as np
from numpy import ndarray

cdef extern from "Python.h":
    ctypedef size_t Py_uhash_t
    ctypedef Py_ssize_t Py_hash_t

cdef extern from *:
    """
    /* del lst[n:] keeping the list's allocation (its items are numbers and tuples of numbers) */
    static void nbmpi_list_truncate(PyObject *lst, Py_ssize_t n)
    {
        Py_ssize_t m = PyList_GET_SIZE(lst);
        PyObject **items = ((PyListObject *)lst)->ob_item;
        Py_SET_SIZE(lst, n);   /* first: the list is consistent whatever the decrefs below run */
        for (Py_ssize_t i = n; i < m; i++)
            Py_DECREF(items[i]);
    }
    """
    void list_truncate "nbmpi_list_truncate"(list lst, Py_ssize_t n)

cdef extern from *:
    """
    /* a new instance of type t without calling __init__: its tp_new (a subclass of one of
       this module's types: Cython's tp_new sets every field), no argument parsing */
    static PyObject *nbmpi_new_instance(PyObject *t, PyObject *noargs)
    {
        return ((PyTypeObject *)t)->tp_new((PyTypeObject *)t, noargs, NULL);
    }
    """
    object new_instance "nbmpi_new_instance"(object t, tuple noargs)

cdef extern from *:
    """
    /* Cython lists a cdef class's binary operators (__add__ ...) in its method table
       (METH_COEXIST) besides the number slot. A Python subclass (SharedVar, _LazyF8) then
       finds a method, not a slot wrapper, and CPython gives it the generic slot that looks
       the method up and calls it on every operation. Put back the slot wrappers CPython
       itself makes (PyDescr_NewWrapper with the wrapperbase of the same operator of
       float), so subclasses inherit the C slot. */
    static int nbmpi_slot_wrappers(PyObject *type)
    {
        static const char *names[] = {"__add__", "__sub__", "__mul__", "__truediv__"};
        PyTypeObject *t = (PyTypeObject *)type;
        PyNumberMethods *nb = t->tp_as_number;
        void *fns[] = {(void *)nb->nb_add, (void *)nb->nb_subtract, (void *)nb->nb_multiply,
                       (void *)nb->nb_true_divide};
        for (int k = 0; k < 4; k++) {
            PyObject *model = PyObject_GetAttrString((PyObject *)&PyFloat_Type, names[k]);
            if (!model)
                return -1;
            if (!PyObject_TypeCheck(model, &PyWrapperDescr_Type) || !fns[k]) {
                Py_DECREF(model);
                continue;
            }
            PyObject *d = PyDescr_NewWrapper(t, ((PyWrapperDescrObject *)model)->d_base, fns[k]);
            Py_DECREF(model);
            if (!d || PyDict_SetItemString(t->tp_dict, names[k], d) < 0) {
                Py_XDECREF(d);
                return -1;
            }
            Py_DECREF(d);
        }
        PyType_Modified(t);
        return 0;
    }
    """
    int slot_wrappers "nbmpi_slot_wrappers"(object t) except -1



cdef tuple k_noargs = ()
cdef object k_zero = 0                      # the small int 0 (one object in CPython): op SUM, block 0
cdef tuple k_utag = tuple([-16 - c for c in range(16)])   # a uniform operand's log tag: -16 - code
cdef object k_seed = 0x5EED                 # _Batch's initial signature
cdef array k_words = array("d")             # template of the reduced words (res[0])
cdef object k_crc32 = zlib.crc32            # a shared array's creation value in the signature log

cdef enum:
    HEADER_WORDS = 4                        # wire.HEADER: the signature words
    CREATED = 5                             # wire.CREATED: low bits of a creation's log key
    LAYOUT_FIXED = 5                        # kernels.LAYOUT_FIXED: (nlay, L, n_f8, n_i8, nseg)
    M20A = (1 << 20) - 3
    M20B = (1 << 20) - 5
    # index of the reference operator in ref.ops
    OP_ADD = 0
    OP_RADD = 1
    OP_SUB = 2
    OP_RSUB = 3
    OP_MUL = 4
    OP_RMUL = 5
    OP_DIV = 6
    OP_RDIV = 7

cdef long long SPIN_NS = 50000              # after ref.spin Test polls, poll up to this long (ns), then wait


# ------------------------------------------------------------------ the typed interface (_core.pxd)
cdef class Bindings:
    """Bindings(**reference): what the compiled core takes from the pure-Python modules,
    as typed read-only attributes (declared in ``_core.pxd``, where each is described).

    Built once by ``fused_reductions.binding`` at the package's import and handed to
    the core with :func:`bind`; the compiled paths read the reference only through it.
    Every argument is keyword-only and required. Local."""

    def __cinit__(self):
        self.ops = self.fast_types = self.work = ()
        self.casters = {}
        self.empty = []
        self.log_cap = 4096
        self.spin = 64

    def __init__(self, *, reset, iadd, isub, imul, min_with, max_with, float_, tuple ops, force, eval_,
                 new_var, make_fuser, get_tracer, same_signature, add, sub, mul, div, type shared_type,
                 type lazy_type, type batch_type, type snap_type, type grant_type, tuple fast_types,
                 tuple work, dict casters, f8, nan_key, nod, nol, list empty, Py_ssize_t log_cap,
                 long kind_fused, long spin):
        if len(ops) != 8 or len(work) != 3:
            raise TypeError(f"Bindings(): ops must be the 8 reference operators, work the 3 working dtypes; "
                            f"got {len(ops)} and {len(work)}")
        if not (issubclass(shared_type, VarBase) and issubclass(lazy_type, VarBase)
                and issubclass(batch_type, BatchBase)):
            raise TypeError("Bindings(): shared_type and lazy_type must subclass _core.VarBase, batch_type "
                            "_core.BatchBase (build them on the compiled core's types)")
        if log_cap < 8:
            raise ValueError(f"Bindings(): log_cap={log_cap}; expected at least 8 steps")
        self.reset, self.iadd, self.isub, self.imul = reset, iadd, isub, imul
        self.min_with, self.max_with, self.float_, self.ops = min_with, max_with, float_, ops
        self.force, self.eval_, self.new_var, self.make_fuser = force, eval_, new_var, make_fuser
        self.get_tracer, self.same_signature = get_tracer, same_signature
        self.add, self.sub, self.mul, self.div = add, sub, mul, div
        self.shared_type, self.lazy_type, self.batch_type = shared_type, lazy_type, batch_type
        self.snap_type, self.grant_type = snap_type, grant_type
        self.fast_types, self.work, self.casters = fast_types, work, casters
        self.f8, self.nan_key, self.nod, self.nol, self.empty = f8, nan_key, nod, nol, empty
        self.log_cap, self.kind_fused, self.spin = log_cap, kind_fused, spin


cdef class FuserState:
    """The state of the process's ``Fuser`` that the compiled hot paths read and
    write (declared in ``_core.pxd``). One instance, :data:`state`: ``Fuser``'s
    ``next_id``, ``seq``, ``_ready``, ``batch`` and ``compiled_collectives`` are views of
    its fields; ``fuser`` and ``runner`` are set by ``fusion.py``. Local."""

    def __cinit__(self):
        self.threshold = 1 << 17
        self.size = 1

    def sync(self, double[::1] buf, dict preq, long long threshold_words, long long chan, long long size):
        """sync(buf, preq, threshold_words, chan, size): the fuser's fusion buffer (float64,
        contiguous; the core keeps a reference), its persistent requests by size class, the
        threshold in words, the trace channel and the number of ranks. Called by
        ``Fuser._sync_core`` whenever one of them changes. Local."""
        self.buf = buf.base if buf.base is not None else buf
        self.bufp = &buf[0] if buf.shape[0] else NULL
        self.buflen = buf.shape[0]
        self.preq = preq
        self.threshold = threshold_words
        self.chan = chan
        self.size = size


cdef class Runner:
    """Starts and tests the force point's persistent request through mpi4py's methods
    (``req.Start()``, ``req.Test()``). Subclassed by ``_direct_mpi.DirectRunner``."""

    cdef int start(self, object req) except -1:
        req.Start()
        return 0

    cdef int test(self, object req) except -1:
        return 1 if req.Test() else 0


cdef Runner k_mpi4py = Runner()             # st.runner None: mpi4py's methods
cdef Bindings ref = Bindings.__new__(Bindings)   # not bound yet (bind() replaces it)
cdef FuserState st = FuserState()
#: the fuser state the compiled paths share with ``Fuser`` (an :class:`FuserState`)
state = st


def bind(Bindings bindings not None):
    """bind(bindings): hand the core the pure-Python reference (a :class:`Bindings`). Called
    once, by ``fused_reductions.binding`` at the package's import; the compiled paths
    refuse to run before. Also checks that the core's own signature hash equals the
    reference's ``hash((sig, L, tuple(log)))`` (else it calls ``hash`` too). Local."""
    global ref
    bindings.bound = True
    ref = bindings
    probe = bindings.batch_type(1 << 10)
    probe.log.extend([1, -17, 2.5, (-8, 3, 0.0), 123456789 << 3, bindings.nan_key, 7])
    bindings.tuplehash = sizeof(Py_uhash_t) == 8
    if bindings.tuplehash and signature_hash(probe, 48) != hash((probe.sig, 48, tuple(probe.log))):
        bindings.tuplehash = False


def bindings():
    """bindings(): the :class:`Bindings` the core runs on (not bound: ``bound`` is False). Local."""
    return ref



cdef inline long long now_ns() noexcept:
    """time.perf_counter_ns() on Linux: CLOCK_MONOTONIC."""
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <long long>ts.tv_sec * 1000000000LL + ts.tv_nsec


cdef inline Py_ssize_t refcnt(PyObject *o) noexcept:
    return o.ob_refcnt


cdef inline bint is_fast_type(object t):
    """t is one of the types taken as real numbers (by identity: ``t in tuple`` would call
    the types' rich comparison for every item before the match)."""
    cdef Py_ssize_t k
    if t is float or t is int:
        return True
    for k in range(len(ref.fast_types)):
        if (<PyObject *>t) == (<PyObject *>(<tuple>ref.fast_types)[k]):
            return True
    return False


cdef inline double as_double(object a) except? -1.0:
    """float(a) of a real number without a temporary float object: a float (or subclass,
    e.g. numpy.float64) is read directly, an int converted by PyLong_AsDouble (OverflowError
    as float(a)), anything else through its __float__ (PyFloat_AsDouble)."""
    if PyLong_CheckExact(a):
        return PyLong_AsDouble(a)
    return PyFloat_AsDouble(a)


cdef inline long long floor_mod(long long a, long long m) noexcept:
    cdef long long r = a % m
    return r + m if r < 0 else r


cdef inline Py_ssize_t size_class(Py_ssize_t words) noexcept:
    """wire._size_class."""
    if words <= 16:
        return 16
    cdef int bits = 0
    cdef Py_ssize_t w = words
    while w:
        bits += 1
        w >>= 1
    cdef Py_ssize_t step = (<Py_ssize_t>1) << (bits - 4 if bits > 4 else 0)
    return (words + step - 1) // step * step


include "_core_batch.pxi"
include "_core_lazy.pxi"
include "_core_var.pxi"
include "_core_arith.pxi"
include "_core_force.pxi"
