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
case calls the Python implementation given to :func:`bind`, so both paths
share one set of semantics (the tests run both).

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

# ------------------------------------------------------------------ bound state (bind, set_*)
cdef bint g_bound = False
cdef object g_engine = None                 # the FusionEngine (set_engine)
cdef object g_engine_fn = None              # fused_reductions.engine (creates it)
cdef BatchBase g_batch = None               # engine.batch, kept current by set_batch()
cdef BatchBase g_spare = None               # the batch the last compiled fusion resolved (fuse)
cdef object g_reset, g_iadd, g_isub, g_imul, g_min_with, g_max_with, g_float
cdef tuple g_ops = ()                       # add radd sub rsub mul rmul truediv rtruediv (the reference)
cdef object g_force, g_eval, g_snap, g_new_var
cdef type g_shared_t = None, g_lazy_t = None, g_batch_t = None
cdef tuple g_fast_types = ()                # types taken as real numbers
cdef object g_f8, g_nan_key, g_nod, g_nol
cdef object g_add, g_sub, g_mul, g_div      # operator.add sub mul truediv
cdef Py_ssize_t g_log_cap = 4096
cdef object g_get_tracer, g_empty_list, g_same_signature
cdef dict g_casters = {}                    # dtype -> cast of an array shared variable (values._CASTERS)
cdef tuple g_work = ()                      # working dtype per word kind (values._WORK_DTYPE)
cdef object g_crc32 = None                  # zlib.crc32
cdef object g_grant_t = None                # grants.Grant
cdef long g_kind_fused = 0
cdef long g_spin = 64                        # Test polls at least, then ...
cdef long long g_spin_ns = 50000            # ... polls for up to this long (ns) before the interruptible wait
cdef bint g_tuplehash = True                # signature_hash equals hash((sig, L, tuple(log))) (checked in bind)
cdef tuple k_utag = tuple([-16 - c for c in range(16)])   # a uniform operand's log tag: -16 - code
cdef object k_seed = 0x5EED                 # _Batch's initial signature
cdef array k_words = array("d")             # template of the reduced words (res[0])
# the engine's force-point state (FusionEngine._sync_core; seq and _ready are properties on these)
cdef long long g_threshold = 1 << 17, g_chan = 0, g_size = 1
cdef dict g_preq = None                     # size class -> persistent MPI_SUM request
cdef object g_buf = None                    # the fusion buffer (engine._buf)
cdef double *g_bufp = NULL
cdef Py_ssize_t g_buflen = 0                # words
cdef Runner g_runner = None                 # set_runner(); None: mpi4py's methods (g_mpi4py)

cdef enum:
    HEADER_WORDS = 4                        # wire.HEADER: the signature words
    CREATED = 5                             # wire.CREATED: low bits of a creation's log key
    LAYOUT_FIXED = 5                        # kernels.LAYOUT_FIXED: (nlay, L, n_f8, n_i8, nseg)
    M20A = (1 << 20) - 3
    M20B = (1 << 20) - 5
    # index of the reference operator in g_ops
    OP_ADD = 0
    OP_RADD = 1
    OP_SUB = 2
    OP_RSUB = 3
    OP_MUL = 4
    OP_RMUL = 5
    OP_DIV = 6
    OP_RDIV = 7


cdef class EngineState:
    """The counters and the flag of the engine that the compiled hot paths read and write
    (FusionEngine.next_id, .seq, ._ready and .compiled_collectives are views of :data:`state`)."""

    cdef public long long next_id            # id of the next shared variable (creation order)
    cdef public long long seq                # fused collectives run so far
    cdef public long long compiled_fusions   # of those, run by the compiled force points
    cdef public bint ready                   # connected, not broken, not strict: compiled force points may run


cdef EngineState st = EngineState()
state = st


cdef class Runner:
    """Starts and tests the force point's persistent request through mpi4py's methods
    (``req.Start()``, ``req.Test()``). Subclassed by ``_direct_mpi.DirectRunner``."""

    cdef int start(self, object req) except -1:
        req.Start()
        return 0

    cdef int test(self, object req) except -1:
        return 1 if req.Test() else 0


cdef Runner g_mpi4py = Runner()


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
    for k in range(len(g_fast_types)):
        if (<PyObject *>t) == (<PyObject *>(<tuple>g_fast_types)[k]):
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


# ------------------------------------------------------------------ Batch
cdef class BatchBase:
    """Fields of a fusion batch (subclassed by fused_reductions.pending._Batch; see _PyBatchBase)."""

    cdef public object f8, f8_nonsum, i8, i8_ops, arrs, sig, nseg, words, allsum, log, kmap, res, error, folded
    cdef public Py_ssize_t room, nvars, cpos
    cdef public long long cnext
    cdef public bint done

    def __init__(self, Py_ssize_t threshold_words):
        batch_fill(self, threshold_words)


cdef int batch_fill(BatchBase b, Py_ssize_t threshold) except -1:
    if not g_bound:
        raise RuntimeError("nbmpi.workers.fused_reductions._core is not bound; import "
                           "nbmpi.workers.fused_reductions first")
    # a reused batch (see fuse) keeps its lists when nothing else refers to them
    if type(b.f8) is list and refcnt(<PyObject *>b.f8) == 1 and HEADER_WORDS <= len(b.f8) <= 4096:
        list_truncate(b.f8, HEADER_WORDS)
    else:
        b.f8 = [0.0, 0.0, 0.0, 0.0]
    if type(b.log) is list and refcnt(<PyObject *>b.log) == 1 and len(b.log) <= 4096:
        list_truncate(b.log, 0)
    else:
        b.log = []
    b.sig = k_seed
    b.f8_nonsum = g_nod
    b.i8 = g_nol
    b.i8_ops = g_nol
    b.arrs = g_nol
    b.kmap = g_nod
    b.nseg = 0
    b.words = 0
    b.folded = 0
    b.allsum = True
    b.res = None
    b.error = None
    b.room = threshold - 1
    b.nvars = 0
    b.done = False
    b.cnext = -1
    b.cpos = -1
    return 0


cdef double batch_word(BatchBase b, object i) except? -1.0:
    """Reduced word i of a resolved batch: b.res[0][i]."""
    cdef object r0 = b.res[0]
    cdef Py_ssize_t k
    if type(r0) is array:
        k = i
        if 0 <= k < len(<array>r0):
            return (<array>r0).data.as_doubles[k]
    return r0[i]


cdef int note_created(BatchBase b, long long vid, object value) except -1:
    """_Batch.note_created: the creation of float64 scalar variable vid with the float value
    (not NaN): ``vid << 3 | CREATED`` then the value, only the value in a run of creations."""
    cdef list log = b.log
    if vid != b.cnext or len(log) != b.cpos:
        log.append((vid << 3) | CREATED)
    log.append(value)
    b.cnext = vid + 1
    b.cpos = len(log)
    if b.cpos >= g_log_cap:
        b.fold()
    return 0


cdef double batch_word_at(BatchBase b, Py_ssize_t k) except? -1.0:
    """Reduced word k of a resolved batch: b.res[0][k]."""
    cdef object r0 = b.res[0]
    if type(r0) is array and 0 <= k < len(<array>r0):
        return (<array>r0).data.as_doubles[k]
    return r0[k]


cdef int note_step(BatchBase b, object step) except -1:
    """_Batch.note: one step of the signature log (folded into sig past the cap)."""
    cdef list log = b.log
    log.append(step)
    if len(log) >= g_log_cap:
        b.fold()
    return 0


# ------------------------------------------------------------------ Derived
@cython.final
@cython.freelist(64)
cdef class Derived:
    """Derived(fn, args, cast): a lazily computed shared value fn(*args) (value None until computed).

    A binary node keeps its two operands inline (no args tuple on the hot path);
    ``args`` reads and writes either form."""

    cdef public object fn, cast, value
    cdef object x, y
    cdef tuple other      # None: the binary form (x, y)

    def __init__(self, fn, tuple args, cast):
        self.fn = fn
        self.cast = cast
        self.value = None
        self.args = args

    @property
    def args(self):
        """The operands (a tuple)."""
        if self.other is None:
            return (self.x, self.y)
        return self.other

    @args.setter
    def args(self, tuple args):
        if len(args) == 2:
            self.x, self.y = args
            self.other = None
        else:
            self.x = self.y = None
            self.other = args


cdef Derived derived_make2(object fn, object x, object y, object cast):
    cdef Derived d = Derived.__new__(Derived)
    d.fn = fn
    d.cast = cast
    d.value = None
    d.x = x
    d.y = y
    return d


cdef int fn_code(object fn):
    if fn is g_add:
        return 1
    if fn is g_sub:
        return 2
    if fn is g_mul:
        return 3
    if fn is g_div:
        return 4
    return 0


cdef int arith(int code, double x, double y, double *out) except -1:
    if code == 1:
        out[0] = x + y
    elif code == 2:
        out[0] = x - y
    elif code == 3:
        out[0] = x * y
    elif code == 4:
        if y == 0.0:
            raise ZeroDivisionError("float division by zero")
        out[0] = x / y
    else:
        return 1
    return 0


cdef int operand_value(object a, double *out) except -1:
    """Value of a float64 operand of a Derived node: constant, slot reference, node;
    returns 1 if not handled here (the Python _arg decides)."""
    cdef object v
    cdef BatchBase bb
    if type(a) is float:
        out[0] = <double>a
        return 0
    if type(a) is int:
        out[0] = as_double(a)
        return 0
    if type(a) is tuple and len(<tuple>a) == 3:   # (base, batch, index)
        base = (<tuple>a)[0]
        if type(base) is not float or not isinstance((<tuple>a)[1], BatchBase):
            return 1
        bb = (<tuple>a)[1]
        if not bb.done:
            force_batch(bb)
        out[0] = <double>base + batch_word(bb, (<tuple>a)[2])
        return 0
    if type(a) is Derived:
        v = derived_value(<Derived>a)
        if type(v) is not float:
            return 1
        out[0] = <double>v
        return 0
    if type(a) is g_snap:   # a float64 scalar's base and pending entries (lazy._eval)
        base = a.base
        ents = a.entries
        if type(base) is float and type(ents) is tuple:
            if not ents:
                out[0] = <double>base
                return 0
            if len(<tuple>ents) == 1 and type((<tuple>ents)[0]) is tuple:
                if entry_value(<double>base, (<tuple>ents)[0], out) == 0:
                    a.base = out[0]
                    a.entries = ()
                    return 0
    return 1


cdef object derived_value(Derived d):
    """node.value, computing it (and forcing) if needed; the reference is lazy._eval."""
    cdef double x, y, r
    if d.value is not None:
        return d.value
    cdef int code = fn_code(d.fn)
    if code and d.cast is float and d.other is None:
        if operand_value(d.x, &x) == 0 and operand_value(d.y, &y) == 0:
            arith(code, x, y, &r)
            v = r
            d.value = v
            d.x = d.y = None
            d.other = ()
            return v
    return g_eval(d)


cdef int apply_f8(int op, double v, double r, object extra, double *out) except -1:
    """lazy._apply of one resolved entry to a float64 scalar: v op r; 1 if not handled here."""
    cdef double fl, avail
    if op == 0:
        out[0] = v + r
    elif op == 1:
        out[0] = v * r
    elif op == 2:
        out[0] = r if (r < v or r != r) else v
    elif op == 3:
        out[0] = r if (r > v or r != r) else v
    elif op == 4 and type(extra) is float:   # consume: lazy._consume_level
        fl = <double>extra
        avail = v - fl
        out[0] = v if avail <= 0.0 else (v - r if r <= avail else fl)
    else:
        return 1
    return 0


cdef int entry_value(double base, tuple ent, double *out) except -1:
    """``base`` with the one pending entry ``ent`` (float64 scalar word, block 0) applied,
    forcing its batch if needed; 1 if not handled here."""
    cdef BatchBase b
    if len(ent) != 5 or ent[2] != 0 or type(ent[0]) is not int or not isinstance(ent[1], BatchBase):
        return 1
    b = ent[1]
    if not b.done:
        force_batch(b)
    return apply_f8(ent[0], base, batch_word(b, ent[3]), ent[4], out)


# ------------------------------------------------------------------ VarBase
cdef class VarBase:
    """Fields and compiled hot-path operators of a shared variable (base of SharedVar)."""

    cdef public object dtype, shape, _base, _ob, _init, _cast, _lastb, name
    # _entries (a property): the pending entries, program order. One pending float64 sum
    # word, the common case, is kept as (_e1b, _e1i) with _ents == () and becomes the
    # tuple ((0, _e1b, 0, _e1i, None),) only when Python code reads _entries (var_entries)
    cdef object _ents
    cdef BatchBase _e1b
    cdef Py_ssize_t _e1i
    cdef public Py_ssize_t _oi
    cdef public int _oop, _oblk, _kind
    cdef public bint _sf
    cdef object _idobj, _ksumobj
    cdef long long _cid1      # id + 1 while _idobj is not made (0: no id)

    @property
    def _id(self):
        """The variable's id (creation order; the same on every rank)."""
        return var_id(self)

    @_id.setter
    def _id(self, v):
        self._idobj = v
        self._cid1 = (<long long>v) + 1 if type(v) is int else 0

    @property
    def _entries(self):
        """The pending entries ``(op, batch, block, index, extra)``, program order (a tuple)."""
        return var_entries(self)

    @_entries.setter
    def _entries(self, v):
        self._ents = v
        self._e1b = None

    @property
    def _ksum(self):
        """Signature step of a float64 scalar sum contribution: ``id << 3``."""
        return var_ksum(self)

    @_ksum.setter
    def _ksum(self, v):
        self._ksumobj = v

    # -- contributions ---------------------------------------------------------------
    def __iadd__(self, a):
        cdef object t = type(a)
        if g_bound:
            if self._sf:
                if t is float:
                    return fast_sum(self, <double>a, a)
                if is_fast_type(t):
                    return fast_sum(self, as_double(a), None)
            elif t is ndarray:
                r = contribute_array(self, 0, a)
                if r is not None:
                    return r
        return g_iadd(self, a)

    def __isub__(self, a):
        if g_bound and self._sf and is_fast_type(type(a)):
            return fast_sum(self, -as_double(a), None)
        return g_isub(self, a)

    def __imul__(self, a):
        if g_bound and self._sf and is_fast_type(type(a)):
            return contribute_f8(self, 1, as_double(a))
        return g_imul(self, a)

    def min_with(self, a):
        """``x = min(x, min over ranks of a)`` (a rank-local) or elementwise min with shared ``a``. Lazy."""
        if g_bound and self._sf and is_fast_type(type(a)):
            return contribute_f8(self, 2, as_double(a))
        return g_min_with(self, a)

    def max_with(self, a):
        """``x = max(x, max over ranks of a)`` (a rank-local) or elementwise max with shared ``a``. Lazy."""
        if g_bound and self._sf and is_fast_type(type(a)):
            return contribute_f8(self, 3, as_double(a))
        return g_max_with(self, a)

    def _fast_sum(self, a):
        """x += a for a float64 scalar x and a real a (hot path)."""
        if not self._sf:
            raise TypeError("_fast_sum needs a float64 scalar shared variable")
        return fast_sum(self, float(a), None)

    def reset(self, value=None):
        """Set the variable back to its creation value, or to ``value``, which must be
        the same on every rank (checked at the next force point). Local, no force;
        pending contributions of this variable are dropped from its value."""
        if value is None and g_bound and self._init is not None:
            self._base = self._init
            if self._e1b is not None or self._ents:
                self._ents = ()
                self._e1b = None
                self._ob = None
            return self
        return g_reset(self, value)

    # -- reading ---------------------------------------------------------------------
    def __float__(self):
        cdef object ents, base = self._base, ent, v
        cdef Py_ssize_t ne
        cdef double x
        cdef BatchBase b = self._e1b
        if b is not None and g_bound and type(base) is float:   # one float64 sum: base + the reduced word
            if not b.done:
                force_batch(b)
            v = <double>base + batch_word_at(b, self._e1i)
            self._base = v
            self._e1b = None
            return v
        ents = var_entries(self)
        if g_bound and type(ents) is tuple:
            ne = len(<tuple>ents)
            if ne == 0:
                if type(base) is float:
                    return base
                if type(base) is Derived:
                    v = derived_value(<Derived>base)
                    if type(v) is float:
                        self._base = v
                        return v
            elif ne == 1 and type(base) is float:
                ent = (<tuple>ents)[0]
                if (type(ent) is tuple and len(<tuple>ent) == 5 and (<tuple>ent)[0] is k_zero
                        and (<tuple>ent)[2] is k_zero and type((<tuple>ent)[1]) is g_batch_t):
                    b = <BatchBase>(<tuple>ent)[1]   # one float64 sum: base + the reduced word
                    if not b.done:
                        force_batch(b)
                    v = <double>base + batch_word(b, (<tuple>ent)[3])
                    self._base = v
                    self._ents = ()
                    return v
                if type(ent) is tuple and entry_value(<double>base, <tuple>ent, &x) == 0:
                    v = x
                    self._base = v
                    self._ents = ()
                    self._ob = None
                    return v
        return g_float(self)

    # -- shared arithmetic (float64 scalars; everything else: the reference) ----------
    # One C slot per operator serves both operand orders (c_api_binop_methods: the
    # Python subclasses SharedVar and _LazyF8 then inherit the slot itself, not a
    # generic wrapper that looks the method up); x is this type, or y is.
    def __add__(x, y):
        return additive(x, y, g_add, 1, OP_ADD, OP_RADD)

    def __sub__(x, y):
        return additive(x, y, g_sub, 2, OP_SUB, OP_RSUB)

    def __mul__(x, y):
        return scaling(x, y, g_mul, 3, OP_MUL, OP_RMUL)

    def __truediv__(x, y):
        return scaling(x, y, g_div, 4, OP_DIV, OP_RDIV)


slot_wrappers(VarBase)


cdef object var_entries(VarBase v):
    """v._entries: the one pending sum word (_e1b, _e1i) made the tuple the Python code reads."""
    if v._e1b is not None:
        v._ents = ((0, v._e1b, 0, v._e1i, None),)
        v._e1b = None
    return v._ents


cdef inline object var_id(VarBase v):
    """v._id: made a Python int only when read."""
    if v._idobj is None:
        if v._cid1 == 0:
            raise AttributeError("_id")
        v._idobj = v._cid1 - 1
    return v._idobj


cdef inline object var_ksum(VarBase v):
    """v._ksum: the signature step ``id << 3`` of a float64 sum, made once."""
    if v._ksumobj is None:
        v._ksumobj = (v._cid1 - 1) << 3 if v._cid1 else var_id(v) << 3
    return v._ksumobj


cdef inline bint shared_f8(object o):
    """o is a float64 scalar SharedVar or lazy result."""
    cdef object t = type(o)
    return (t is g_lazy_t or t is g_shared_t) and (<VarBase>o)._sf


cdef object additive(object x, object y, object fn, int code, int op, int rop):
    """x + y, x - y: compiled only for two float64 scalar shared operands (a rank-local
    operand is a contribution: the reference)."""
    if isinstance(x, VarBase):
        if g_bound and (<VarBase>x)._sf and shared_f8(y):
            return f8_binary(fn, code, x, y, True, True)
        return g_ops[op](x, y)
    return g_ops[rop](y, x)


cdef object scaling(object x, object y, object fn, int code, int op, int rop):
    """x * y, x / y: also with float/int uniform operands."""
    cdef object t
    if isinstance(x, VarBase):
        if g_bound and (<VarBase>x)._sf:
            t = type(y)
            if t is float or t is int:
                return f8_binary(fn, code, x, y, True, False)
            if shared_f8(y):
                return f8_binary(fn, code, x, y, True, True)
        return g_ops[op](x, y)
    t = type(x)
    if g_bound and (<VarBase>y)._sf and (t is float or t is int):
        return f8_binary(fn, code, x, y, False, True)
    return g_ops[rop](y, x)


cdef object fast_sum(VarBase self, double a, object aobj):
    """x += a for a float64 scalar x (the reference: _PyVarBase._fast_sum); aobj: a as an exact float, or None."""
    cdef BatchBase b = g_batch
    if b is None:
        raise RuntimeError("nbmpi fused reductions: no current batch (set_batch)")
    cdef list f8 = b.f8
    cdef Py_ssize_t i, j
    cdef tuple ents, old
    cdef BatchBase ob
    if self._ob is b and self._oop == 0:
        i = self._oi
        f8[i] = <double>f8[i] + a
        return self
    i = len(f8)
    f8.append(aobj if aobj is not None else a)
    ob = self._e1b
    if ob is not None and ob.done and type(self._base) is float:
        # a resolved sum nobody read yet: fold it into the base (entries stay bounded)
        self._base = <double>self._base + batch_word_at(ob, self._e1i)
        self._e1b = None
        ents = ()
    else:
        ents = var_entries(self)
        if len(ents) == 1 and type(self._base) is float:
            old = ents[0]
            if (len(old) == 5 and old[0] is k_zero and old[2] is k_zero and isinstance(old[1], BatchBase)
                    and (<BatchBase>old[1]).done):
                self._base = <double>self._base + batch_word(<BatchBase>old[1], old[3])
                ents = ()
    if not ents:   # the one pending sum word, kept without a tuple (var_entries)
        self._ents = ()
        self._e1b = b
        self._e1i = i
    else:
        self._ents = ents + ((0, b, 0, i, None),)
    self._ob = b
    self._oi = i
    self._oop = 0
    self._oblk = 0
    if self._lastb is not b:
        self._lastb = b
        b.nvars += 1
    (<list>b.log).append(var_ksum(self))
    if i > b.room:
        g_engine.flush()
    return self


cdef object contribute_f8(VarBase self, int op, double a):
    """x *= a, x.min_with(a), x.max_with(a) for a float64 scalar x and a real a (the
    reference: SharedVar._contribute then _new_slot)."""
    cdef BatchBase b = g_batch
    if b is None:
        raise RuntimeError("nbmpi fused reductions: no current batch (set_batch)")
    cdef list f8 = b.f8
    cdef Py_ssize_t i
    cdef double cur
    if self._ob is b and self._oop == op and self._oblk == 0:
        i = self._oi
        cur = <double>f8[i]
        if op == 1:
            cur = cur * a
        elif op == 2:
            cur = a if (a < cur or a != a) else cur
        else:
            cur = a if (a > cur or a != a) else cur
        f8[i] = cur
        return self
    i = len(f8)
    f8.append(a)
    if b.f8_nonsum is g_nod:
        b.f8_nonsum = {}
    b.f8_nonsum[i] = op
    b.allsum = False
    self._ents = var_entries(self) + ((op, b, 0, i, None),)
    self._ob = b
    self._oi = i
    self._oop = op
    self._oblk = 0
    if self._lastb is not b:
        self._lastb = b
        b.nvars += 1
    note_step(b, (var_id(self) << 3) | op)
    if len(f8) + b.words > g_threshold:
        g_engine.flush()
    return self


# ------------------------------------------------------------------ shared arithmetic (values._f8_binary)
cdef int log_uniform(object x, int code) except -1:
    """A uniform operand as two steps, the tag -16 - code then the value (both before the
    fold check, so a fold never separates them)."""
    cdef BatchBase b = g_batch
    if code < 0 or code >= 16:
        raise ValueError(f"nbmpi fused reductions: operation code {code} out of range")
    cdef list log = b.log
    log.append(k_utag[code])
    log.append(g_nan_key if (type(x) is float and x != x) else x)
    if len(log) >= g_log_cap:
        b.fold()
    return 0


cdef object f8_operand(object x, bint is_shared, int code, bint *resolved):
    """Value of one operand of f8_binary (the reference: values._f8_operand)."""
    cdef VarBase v
    cdef tuple e, ent
    if not is_shared:
        log_uniform(x, code)
        resolved[0] = True
        return x
    v = <VarBase>x      # callers pass a VarBase as a shared operand
    base = v._base
    if v._e1b is not None and type(base) is float:   # one sum word: a slot reference
        v._ob = None
        resolved[0] = False
        return (base, v._e1b, v._e1i)
    e = var_entries(v)
    if not e:
        resolved[0] = type(base) is float
        return base
    v._ob = None
    resolved[0] = False
    if len(e) == 1 and type(base) is float:
        ent = e[0]
        if len(ent) == 5 and ent[0] is k_zero and ent[2] is k_zero:   # one sum word: a slot reference
            return (base, ent[1], ent[3])
    return g_snap(base, e, float, ())


cdef VarBase new_lazy(object base):
    """A new float64 scalar shared result (a _LazyF8) with every field set; its id and
    signature key become Python ints only when read."""
    cdef VarBase r = <VarBase>new_instance(g_lazy_t, k_noargs)
    st.next_id += 1
    r._cid1 = st.next_id
    r._base = base
    r._ents = ()
    r._sf = True
    r.dtype = g_f8
    r.shape = ()
    r._oop = -1
    r._cast = float
    return r


cpdef object f8_binary(object fn, int code, object a, object b, bint sa, bint sb):
    """fn(a, b) for float64 scalar shared operands (sa/sb) and float/int uniform ones
    (the reference: values._f8_binary)."""
    cdef bint ca, cb
    cdef double x, y, r
    cdef int k
    va = f8_operand(a, sa, code, &ca)
    if b is a:
        vb = va
        cb = ca
    else:
        vb = f8_operand(b, sb, code, &cb)
    if ca and cb:
        k = fn_code(fn)
        if k and operand_value(va, &x) == 0 and operand_value(vb, &y) == 0:
            arith(k, x, y, &r)
            base = r
        else:
            base = fn(va, vb)
            if type(base) is not float:
                base = float(base)
    else:
        base = derived_make2(fn, va, vb, float)
    return new_lazy(base)


def shared(value, name=None):
    """Create a shared variable with initial ``value`` (scalar or array).

    Every rank must create its shared variables in the same order with the
    same value (checked at the next force point). No communication. A
    Python float gives float64, an int int64; arrays keep their dtype.
    ``name`` labels error messages.
    """
    cdef VarBase v
    cdef long long vid
    if type(value) is ndarray and g_bound and (<object>value).ndim:
        return shared_array(value, name)
    if type(value) is float and g_bound:
        if g_engine is None:
            g_engine_fn()
        vid = st.next_id
        st.next_id = vid + 1
        v = <VarBase>new_instance(g_shared_t, k_noargs)
        v._cid1 = vid + 1          # the id becomes a Python int only when read (var_id)
        v.name = name
        v.dtype = g_f8
        v.shape = ()
        v._base = value
        v._ents = ()
        v._oop = -1
        v._sf = True
        v._cast = float
        v._init = value
        if <double>value == <double>value:
            note_created(g_batch, vid, value)
        else:
            note_step(g_batch, (-8, vid, g_nan_key))
        return v
    return g_new_var(value, name=name)


cdef object shared_array(object value, object name):
    """shared(array) (the reference: SharedVar.__init__'s array case): a read-only copy;
    the creation value is logged as the crc32 of its bytes."""
    cdef VarBase v
    cdef long long vid
    dtype = value.dtype
    cast = g_casters.get(dtype)
    if cast is None:      # a dtype not seen yet (or not supported): the reference decides
        return g_new_var(value, name=name)
    if g_engine is None:
        g_engine_fn()
    copy = value.copy()
    copy.flags.writeable = False
    vid = st.next_id
    st.next_id = vid + 1
    v = <VarBase>new_instance(g_shared_t, k_noargs)
    v._cid1 = vid + 1
    v.name = name
    v.dtype = dtype
    v.shape = copy.shape
    v._kind = 2 if dtype.kind == "c" else (0 if dtype.kind == "f" else 1)
    v._base = copy
    v._ents = ()
    v._oop = -1
    v._cast = cast
    v._init = copy
    note_step(g_batch, (-8, vid, (-2, g_crc32(copy), copy.shape, dtype.num)))
    return v


cdef object contribute_array(VarBase self, int op, object a):
    """x += a for a shared array x and an array a of its shape and working dtype (the
    reference: SharedVar._contribute's array case, then _new_slot); None if not that case."""
    cdef BatchBase b = g_batch
    cdef int kind = self._kind
    cdef Py_ssize_t i, w
    work = g_work[kind]
    dt = a.dtype
    if (dt is not work and dt != work) or a.shape != self.shape:
        return None
    if self._ob is b and self._oop == op:   # accumulate in place: the reference
        return None
    acc = a.flatten()
    arrs = b.arrs
    if arrs is g_nol:
        arrs = b.arrs = []
    i = len(<list>arrs)
    (<list>arrs).append([acc, op, kind])
    if kind != 0 or (op != 0 and op != 4):
        b.allsum = False
    w = acc.size * (2 if kind == 2 else 1)
    self._ents = var_entries(self) + ((op, b, 2, i, None),)
    if op != 4:
        self._ob = b
        self._oi = i
        self._oop = op
        self._oblk = 2
    else:
        self._ob = None
    if self._lastb is not b:
        self._lastb = b
        b.nvars += 1
    b.nseg = b.nseg + 1
    b.words = b.words + w
    b.room -= w
    step = (var_id(self), op, self.dtype.num, self.shape)
    k = hash(step)
    if b.kmap is g_nod:
        b.kmap = {}
    b.kmap[k] = step
    note_step(b, k)
    if len(<list>b.f8) + b.words > g_threshold:
        g_engine.flush()
    return self


def consume_f8(VarBase pool, request, floor):
    """pool.consume(request, floor) for a float64 scalar pool and real request and floor
    (the reference: pools.SharedPool.consume); None if not that case or the request is
    not a finite number >= 0 (the reference raises the error)."""
    cdef BatchBase b = g_batch
    cdef double r, fl
    cdef Py_ssize_t i
    if not (g_bound and pool._sf and is_fast_type(type(request)) and is_fast_type(type(floor))):
        return None
    r = as_double(request)
    fl = as_double(floor)
    if not r >= 0.0 or r == float("inf"):
        return None
    ents = var_entries(pool)
    if not ents:
        before = pool._base
    else:
        pool._ob = None
        before = g_snap(pool._base, ents, pool._cast, pool.shape)
    f8 = b.f8
    i = len(<list>f8)
    (<list>f8).append(r)
    flo = fl
    note_step(b, (-9, flo if fl == fl else g_nan_key))
    grant = g_grant_t(before, b, 0, i, r, flo, ())
    pool._ents = ents + ((4, b, 0, i, flo),)
    pool._ob = None
    if pool._lastb is not b:
        pool._lastb = b
        b.nvars += 1
    note_step(b, (var_id(pool) << 3) | 4)
    if len(<list>f8) + b.words > g_threshold:
        g_engine.flush()
    return grant


# ------------------------------------------------------------------ the compiled force point
cdef Py_uhash_t XXPRIME_1 = 11400714785074694791ULL
cdef Py_uhash_t XXPRIME_2 = 14029467366897019727ULL
cdef Py_uhash_t XXPRIME_5 = 2870177450012600261ULL


cdef inline Py_uhash_t lane_add(Py_uhash_t acc, Py_uhash_t lane) noexcept:
    acc += lane * XXPRIME_2
    acc = (acc << 31) | (acc >> 33)
    return acc * XXPRIME_1


cdef inline Py_hash_t lanes_final(Py_uhash_t acc, Py_ssize_t n) noexcept:
    acc += (<Py_uhash_t>n) ^ (XXPRIME_5 ^ 3527539ULL)
    return 1546275796 if acc == <Py_uhash_t>-1 else <Py_hash_t>acc


cdef Py_hash_t signature_hash(BatchBase b, Py_ssize_t L) except? -1:
    """hash((b.sig, L, tuple(b.log))) without building the tuples: CPython's tuplehash
    (xxHash-based, 64-bit), checked against Python's own at bind()."""
    if not g_tuplehash:
        return hash((b.sig, L, tuple(b.log)))
    cdef list log = b.log
    cdef Py_ssize_t n = len(log), i
    cdef Py_uhash_t inner = XXPRIME_5, acc
    for i in range(n):
        inner = lane_add(inner, <Py_uhash_t>hash(log[i]))
    acc = lane_add(XXPRIME_5, <Py_uhash_t>hash(b.sig))
    acc = lane_add(acc, <Py_uhash_t>L)            # hash(L) == L for 0 <= L < 2**61 - 1
    acc = lane_add(acc, <Py_uhash_t>lanes_final(inner, n))
    return lanes_final(acc, 3)


cdef int write_signature(BatchBase b, Py_ssize_t L, double *buf) except -1:
    """The header words: hash((b.sig, L, tuple(b.log))) as in the Python path, as (h1, h1**2,
    h2, h2**2) (wire.signature_words), written straight into the buffer."""
    cdef Py_hash_t h = signature_hash(b, L)
    cdef double h1 = <double>(floor_mod(h, M20A) + 1), h2 = <double>(floor_mod(h >> 20, M20B) + 1)
    buf[0] = h1
    buf[1] = h1 * h1
    buf[2] = h2
    buf[3] = h2 * h2
    return 0


cdef int finish(object engine, BatchBase b, Py_ssize_t L, long long t0, long long t1, int tag,
                array res) except -1:
    """After the collective: its trace event (tracer.record), then the signature check on the
    reduced header words res[0..3] (wire._same_signature; a mismatch is diagnosed)."""
    cdef long long seq = st.seq
    cdef double P = <double>g_size
    cdef double *w = res.data.as_doubles
    st.seq += 1
    tr = g_get_tracer()
    if isinstance(tr, TracerCore):   # the compiled record buffer: record's C entry
        if (<TracerCore>tr).enabled:
            (<TracerCore>tr).record_c(g_kind_fused, 0, -1, tag, L * 8, t0, t1, -1, seq, g_chan, b.nvars)
    elif tr.enabled:
        tr.record(g_kind_fused, 0, -1, tag, L * 8, t0, t1, -1, seq, g_chan, b.nvars)
    if g_size <= 64:   # exact in float64 below 2**53
        same = (P * w[1] == w[0] * w[0]) and (P * w[3] == w[2] * w[2])
    else:
        same = g_same_signature(g_size, res)
    if not same:
        raise engine._divergence(b, L)
    return 0


cdef object fuse_failed(object engine, BatchBase b, Py_ssize_t L, object exc):
    """Error of the collective: the Python handling (diagnosis, b.error) decides what to raise."""
    err = engine._fuse_failed(b, L, exc)
    if err is exc:
        raise exc
    raise err from exc


cpdef object fuse(object engine, BatchBase b):
    """FusionEngine.flush's hot path (only float64 scalar sums pending) in C.

    Returns the number of variables resolved, or None if the Python path must run
    (no buffer or persistent request of this size class yet). Same steps as the
    Python code: new current batch (the previous fusion's batch when nothing refers
    to it any more), signature words, pack, Start + Test polls (then engine._wait),
    trace record, result words, signature check."""
    global g_spare
    cdef list f8 = b.f8
    cdef Py_ssize_t n1 = len(f8), L = size_class(n1), i
    cdef double *d
    cdef long long t0, t1
    cdef array res
    if g_bufp == NULL or g_preq is None or g_buflen < L:
        return None
    req = g_preq.get(L)
    if req is None:
        return None
    next_batch()      # the next fusion starts now
    d = g_bufp
    try:
        # signature words: hash((b.sig, L, tuple(b.log))) as in the Python path, written straight
        # into the buffer (words 0..3; the list's header words are not read after a fusion)
        write_signature(b, L, d)
        for i in range(HEADER_WORDS, n1):
            d[i] = <double>f8[i]
    except BaseException as exc:
        b.error = exc
        raise
    t0 = now_ns()
    run_request(engine, b, req, L)
    t1 = now_ns()
    try:
        res = clone(k_words, n1, False)
        memcpy(res.data.as_doubles, g_bufp, n1 * sizeof(double))
        finish(engine, b, L, t0, t1, 0, res)
        b.res = (res, g_empty_list, g_empty_list)
        b.done = True
    except BaseException as exc:   # b.error = the exception, as the Python path's `except BaseException`
        b.error = exc
        raise
    g_spare = b   # reused by a later fusion once nothing refers to it
    st.compiled_fusions += 1
    return b.nvars


cdef int force_batch(BatchBase b) except -1:
    """Make batch b resolved (a force point): the compiled force point when b is the current
    batch and the engine is ready, else the Python _force (which flushes or raises b.error)."""
    if not b.done and b is g_batch and g_engine is not None and st.ready and b.error is None:
        if b.nseg == 0 and b.allsum is True:
            if len(b.f8) > HEADER_WORDS:
                fuse(g_engine, b)
        else:
            fuse_general(g_engine, b)
    if not b.done:
        g_force(b)
    return 0


cdef BatchBase next_batch():
    """Start the next fusion: a new current batch (the previous fusion's batch when nothing
    refers to it any more)."""
    global g_batch, g_spare
    cdef BatchBase nb
    if g_spare is not None and refcnt(<PyObject *>g_spare) == 1 and type(g_spare) is g_batch_t:
        nb = g_spare
        g_spare = None
    else:
        nb = <BatchBase>new_instance(g_batch_t, k_noargs)
    batch_fill(nb, g_threshold)
    g_batch = nb      # engine.batch (the engine reads it from here: current_batch())
    return nb


cdef int run_request(object engine, BatchBase b, object req, Py_ssize_t L) except -1:
    """Start the persistent request, a few Test polls, then the engine's interruptible wait;
    an error goes through the engine's diagnosis (engine._fuse_failed) and is raised."""
    cdef Runner runner = g_runner if g_runner is not None else g_mpi4py
    cdef long k = 0
    cdef long long t0
    try:
        runner.start(req)
        t0 = now_ns()
        while True:   # Test polls for g_spin_ns (a partner a few us late is common), then the Python wait
            if runner.test(req):
                return 0
            k += 1
            if k >= g_spin and (k & 31) == 0 and now_ns() - t0 > g_spin_ns:
                break
        engine._wait(req, b, L)   # raises a diagnosed error
    except BaseException as exc:
        fuse_failed(engine, b, L, exc)
    return 0


cpdef object fuse_general(object engine, BatchBase b):
    """FusionEngine._reduce in C: any ops on float64/int64 scalars and on arrays (the
    ``MPI_SUM`` request when everything is a float64 sum, else the user-defined operation
    with the layout record after the header; see wire.layout_words).

    Returns the number of variables resolved, or None if the Python path must run (no
    buffer or persistent request of this size class yet)."""
    global g_spare
    cdef list f8 = b.f8
    cdef object i8 = b.i8, arrs = b.arrs, i8_ops = b.i8_ops
    cdef Py_ssize_t n1 = len(f8), nf = n1 - HEADER_WORDS, n2 = len(i8), nseg = len(arrs)
    cdef bint allsum = b.allsum is True
    cdef Py_ssize_t nops = (nf + n2 + 7) // 8
    cdef Py_ssize_t nlay = 0 if allsum else LAYOUT_FIXED + nops + 4 * nseg
    cdef Py_ssize_t d = HEADER_WORDS + nlay, words = n1 + nlay + <Py_ssize_t>b.words
    cdef Py_ssize_t L = size_class(words), k, pos, w, seg0, base
    cdef double *buf = g_bufp
    cdef long long *lw = <long long *>g_bufp
    cdef signed char *opb
    cdef long long t0, t1
    cdef Py_buffer view
    cdef array res
    cdef list places
    if buf == NULL or g_preq is None or g_buflen < L:
        return None
    req = g_preq.get(<object>L if allsum else (L, False))
    if req is None:
        return None
    next_batch()      # the next fusion starts now
    places = []
    try:
        write_signature(b, L, buf)
        for k in range(nf):
            buf[d + k] = <double>f8[HEADER_WORDS + k]
        if not allsum:
            lw[4] = nlay
            lw[5] = L
            lw[6] = nf
            lw[7] = n2
            lw[8] = nseg
            memset(&lw[LAYOUT_FIXED + 4], 0, nops * 8)
            opb = <signed char *>&lw[LAYOUT_FIXED + 4]
            for i, op in b.f8_nonsum.items():
                opb[<Py_ssize_t>i - HEADER_WORDS] = op
            for k in range(n2):
                opb[nf + k] = i8_ops[k]
        pos = d + nf
        for k in range(n2):
            lw[pos + k] = i8[k]
        pos += n2
        seg0 = pos
        base = LAYOUT_FIXED + 4 + nops
        for k in range(nseg):
            acc, op, kind = arrs[k]
            PyObject_GetBuffer(acc, &view, PyBUF_ANY_CONTIGUOUS)
            try:
                w = view.len // 8
                if pos + w > L:
                    raise ValueError("nbmpi fused reductions: a segment does not fit its fusion buffer")
                memcpy(&buf[pos], view.buf, w * 8)
            finally:
                PyBuffer_Release(&view)
            if not allsum:
                lw[base + 4 * k] = pos
                lw[base + 4 * k + 1] = w
                lw[base + 4 * k + 2] = op
                lw[base + 4 * k + 3] = kind
            places.append((pos - seg0, w, kind))
            pos += w
        if pos < L:
            memset(&buf[pos], 0, (L - pos) * 8)
    except BaseException as exc:
        b.error = exc
        raise
    t0 = now_ns()
    run_request(engine, b, req, L)
    t1 = now_ns()
    try:
        res = clone(k_words, n1, False)
        memcpy(res.data.as_doubles, buf, HEADER_WORDS * sizeof(double))
        if nf:
            memcpy(&res.data.as_doubles[HEADER_WORDS], &buf[d], nf * sizeof(double))
        finish(engine, b, L, t0, t1, 0 if allsum else 1, res)
        res_i8 = [lw[d + nf + k] for k in range(n2)] if n2 else g_empty_list
        res_arrs = []
        if nseg:
            block = g_buf[seg0:pos].copy()   # one copy; each segment's result is a view of it
            for o, w, kind in places:
                part = block[o:o + w]
                res_arrs.append(part if kind == 0 else part.view(np.int64 if kind == 1 else np.complex128))
        b.res = (res, res_i8, res_arrs)
        b.done = True
    except BaseException as exc:
        b.error = exc
        raise
    g_spare = b       # reused by a later fusion once nothing refers to it
    st.compiled_fusions += 1
    return b.nvars


# ------------------------------------------------------------------ module functions
def set_engine(engine):
    """set_engine(engine): the FusionEngine (its flush() and _wait())."""
    global g_engine
    g_engine = engine


def set_batch(BatchBase b):
    """set_batch(batch): the engine's current batch, which the hot path fills."""
    global g_batch
    g_batch = b


def current_batch():
    """current_batch(): the engine's current batch (FusionEngine.batch)."""
    return g_batch


def set_state(double[::1] buf, dict preq, long long threshold_words, long long chan, long long size):
    """set_state(buf, preq, threshold_words, chan, size): the engine state the compiled force point uses."""
    global g_buf, g_bufp, g_buflen, g_preq, g_threshold, g_chan, g_size
    g_buf = buf.base if buf.base is not None else buf
    g_bufp = &buf[0] if buf.shape[0] else NULL
    g_buflen = buf.shape[0]
    g_preq = preq
    g_threshold = threshold_words
    g_chan = chan
    g_size = size


def set_runner(Runner runner=None):
    """set_runner(runner): how the compiled force point starts and tests its request
    (``_direct_mpi.DirectRunner()``: the MPI library directly; None: mpi4py's methods)."""
    global g_runner
    g_runner = runner


def pack(list words, double[::1] buf):
    """pack(words, buffer): buffer[:len(words)] = words (float64), the fusion buffer before the collective."""
    cdef Py_ssize_t n = len(words), i
    if n > buf.shape[0]:
        raise ValueError(f"pack(): {n} words do not fit a buffer of {buf.shape[0]} words")
    for i in range(n):
        buf[i] = <double>words[i]


def unpack(const double[::1] buf, Py_ssize_t n):
    """unpack(buffer, n): a copy of the first n float64 words of buffer (an array('d'), the fusion's result)."""
    if n < 0 or n > buf.shape[0]:
        raise ValueError(f"unpack(): {n} words exceed a buffer of {buf.shape[0]} words")
    cdef array res = clone(k_words, n, False)
    if n:
        memcpy(res.data.as_doubles, &buf[0], n * sizeof(double))
    return res


def bind(*, reset, iadd, isub, imul, min_with, max_with, float_, tuple ops, tuple fns, force, eval_, snap,
         new_var, type shared, type lazy, tuple fast_types, f8, nan_key, nod, nol, Py_ssize_t log_cap,
         type batch_type, get_tracer, engine, list empty_list, same_signature, long kind_fused, long spin,
         dict casters, tuple work, grant):
    """bind(**python_implementation): the Python functions and types the compiled paths
    fall back to and create (called once by fused_reductions.binding)."""
    global g_reset, g_iadd, g_isub, g_imul, g_min_with, g_max_with, g_float, g_ops, g_force, g_eval, g_snap
    global g_new_var, g_shared_t, g_lazy_t, g_fast_types, g_f8, g_nan_key, g_nod, g_nol, g_log_cap
    global g_batch_t, g_get_tracer, g_engine_fn, g_empty_list, g_same_signature, g_kind_fused, g_spin
    global g_add, g_sub, g_mul, g_div, g_bound, g_tuplehash, g_casters, g_work, g_crc32, g_grant_t
    if len(ops) != 8 or len(fns) != 4:
        raise TypeError("bind(): ops must be 8 callables, fns 4")
    if not issubclass(shared, VarBase) or not issubclass(lazy, VarBase) or not issubclass(batch_type, BatchBase):
        raise TypeError("bind(): shared/lazy must subclass VarBase, batch_type BatchBase")
    g_reset, g_iadd, g_isub, g_imul, g_min_with, g_max_with, g_float = reset, iadd, isub, imul, min_with, max_with, float_
    g_ops = ops
    g_add, g_sub, g_mul, g_div = fns
    g_force, g_eval, g_snap, g_new_var = force, eval_, snap, new_var
    g_shared_t, g_lazy_t, g_batch_t = shared, lazy, batch_type
    g_fast_types = fast_types
    g_f8, g_nan_key, g_nod, g_nol = f8, nan_key, nod, nol
    g_log_cap = log_cap
    g_get_tracer, g_engine_fn = get_tracer, engine
    g_empty_list, g_same_signature = empty_list, same_signature
    g_kind_fused, g_spin = kind_fused, spin
    g_casters, g_work, g_crc32, g_grant_t = casters, work, zlib.crc32, grant
    g_bound = True
    # the compiled signature must equal the Python reference's hash((sig, L, tuple(log)))
    probe = batch_type(1 << 10)
    probe.log.extend([1, -17, 2.5, (-8, 3, 0.0), 123456789 << 3, g_nan_key, 7])
    g_tuplehash = sizeof(Py_uhash_t) == 8
    if g_tuplehash and signature_hash(probe, 48) != hash((probe.sig, 48, tuple(probe.log))):
        g_tuplehash = False
