/* nbmpi.workers._fused_core: the compiled hot path of float64 scalar shared variables.

   fused_reductions.py is the reference implementation and owns the semantics.
   This module gives SharedVar a C base type (VarBase) whose fields are the
   same attributes the Python code reads and writes (_base, _entries, _ob, ...),
   and implements in C only the common cases of

     reset(), x += a, x -= a, float(x)        (float64 scalar x, real number a)
     x + y, x - y, x * y, x / y                (float64 scalar shared x/y, float/int uniform operands)

   with exactly the data structures of the Python code (entries tuples
   (op, batch, block, index, extra), slot references (base, batch, index),
   lazy _Derived nodes, the batch's f8 word list and signature log). Every other
   case calls the Python implementation bound with bind(), so both paths share
   one set of semantics. The extension is optional: without it (or with
   NBMPI_PURE_PYTHON=1) fused_reductions.py uses its Python methods.

   Per-operation costs it avoids: Python calls (operators, MPI_Start/MPI_Test,
   the tracer's attribute lookups) and allocations (a lazy result gets its id as
   a Python int only when read; a finished batch is reused; the signature is
   hashed without building tuples). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* ------------------------------------------------------------------ bound objects */
static PyObject *g_engine;                        /* the FusionEngine (set_engine) */
static PyObject *g_batch;                         /* engine.batch, kept current by set_batch() */
static PyObject *g_spare;                         /* the batch the last compiled fusion resolved (py_fuse) */
static PyObject *g_reset, *g_iadd, *g_isub, *g_float;
static PyObject *g_ops[8];                        /* add radd sub rsub mul rmul truediv rtruediv */
static PyObject *g_force, *g_eval, *g_snap, *g_f8_binary_py;
static PyTypeObject *g_shared_t, *g_lazy_t;
#define BatchCheck(o) ((PyObject *)Py_TYPE(o) == g_batch_type || PyObject_TypeCheck((o), &BatchType))
static PyObject *g_fast_types;                    /* tuple of types taken as real numbers */
static PyObject *g_f8, *g_nan_key, *g_nod, *g_nol;
static PyObject *g_fn[4];                         /* operator.add sub mul truediv */
static Py_ssize_t g_log_cap = 4096;
static PyObject *s_flush, *s_fold;
#define N_UTAGS 16
static PyObject *k_zero, *k_minus1, *k_empty, *k_fzero, *k_seed;
static PyObject *k_utag[N_UTAGS];                 /* -16 - code: a uniform operand's log tag */
static int g_bound = 0;
static long long g_next_id = 0;
/* the engine's force-point state (FusionEngine._sync_core; seq and _ready are properties on these) */
static long long g_compiled_fusions = 0;          /* fusions py_fuse completed (the rest ran in Python) */
static long long g_seq = 0, g_threshold = 1 << 17, g_chan = 0, g_size = 1;
static int g_ready = 0;
static PyObject *g_preq;                          /* size class -> persistent MPI_SUM request */
static Py_buffer g_fbuf;                          /* the fusion buffer (engine._buf), held */
static Py_buffer g_trview;                        /* the tracer's record buffer, held while it is current */                  /* FusionEngine.next_id (creation order = identity) */
/* the compiled force point (fuse) */
static PyObject *g_batch_type, *g_tracing, *g_empty_list, *g_same_signature;
static long g_kind_fused, g_spin = 64;
static long long g_m20a = (1 << 20) - 3, g_m20b = (1 << 20) - 5;
#define HEADER_WORDS 4                            /* fused_reductions.HEADER: the signature words */
/* MPI_Start / MPI_Test of the library mpi4py loaded, called directly (set_mpi); NULL: through mpi4py */
typedef int (*mpi_start_fn)(void *request);
typedef int (*mpi_test_fn)(void *request, int *flag, void *status);
typedef void *(*request_get_fn)(PyObject *request);   /* mpi4py's C API PyMPIRequest_Get */
static mpi_start_fn g_mpi_start;
static mpi_test_fn g_mpi_test;
static request_get_fn g_request_get;
static PyObject *g_mpi_exception;                 /* mpi4py.MPI.Exception: made from an error code */
static long long g_status[32];                    /* room for an MPI_Status of any ABI (the result is ignored) */
static PyObject *s_batch_, *s_TRACER, *s_Start, *s_Test;

enum { OP_ADD, OP_RADD, OP_SUB, OP_RSUB, OP_MUL, OP_RMUL, OP_DIV, OP_RDIV };

static inline void set_field(PyObject **slot, PyObject *v)
{
    Py_XINCREF(v);
    Py_XSETREF(*slot, v);
}

static inline int is_small(PyObject *o, long v)
{
    if (o == NULL || !PyLong_CheckExact(o))
        return 0;
    int overflow = 0;
    long x = PyLong_AsLongAndOverflow(o, &overflow);
    return !overflow && x == v;
}

/* ------------------------------------------------------------------ Batch */
typedef struct {
    PyObject_HEAD
    PyObject *f8, *f8_nonsum, *i8, *i8_ops, *arrs, *sig, *nseg, *words, *allsum, *log, *kmap, *res, *error,
        *folded;
    Py_ssize_t room, nvars;
    char done;
} BatchObject;

static int batch_traverse(BatchObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->f8); Py_VISIT(self->f8_nonsum); Py_VISIT(self->i8); Py_VISIT(self->i8_ops);
    Py_VISIT(self->arrs); Py_VISIT(self->sig); Py_VISIT(self->nseg); Py_VISIT(self->words);
    Py_VISIT(self->allsum); Py_VISIT(self->log); Py_VISIT(self->kmap); Py_VISIT(self->res);
    Py_VISIT(self->error); Py_VISIT(self->folded);
    return 0;
}

static int batch_clear(BatchObject *self)
{
    Py_CLEAR(self->f8); Py_CLEAR(self->f8_nonsum); Py_CLEAR(self->i8); Py_CLEAR(self->i8_ops);
    Py_CLEAR(self->arrs); Py_CLEAR(self->sig); Py_CLEAR(self->nseg); Py_CLEAR(self->words);
    Py_CLEAR(self->allsum); Py_CLEAR(self->log); Py_CLEAR(self->kmap); Py_CLEAR(self->res);
    Py_CLEAR(self->error); Py_CLEAR(self->folded);
    return 0;
}

static void batch_dealloc(BatchObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    batch_clear(self);
    tp->tp_free((PyObject *)self);   /* a heap subclass's type reference is dropped by subtype_dealloc */
}

static int batch_fill(BatchObject *self, Py_ssize_t threshold);

/* _Batch(threshold_words): everything pending between two force points (see fused_reductions._Batch) */
static int batch_init(BatchObject *self, PyObject *args, PyObject *kwds)
{
    Py_ssize_t threshold;
    static char *kwlist[] = {"threshold_words", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &threshold))
        return -1;
    return batch_fill(self, threshold);
}

/* del lst[n:] keeping the list's allocation (the items are numbers and tuples of numbers) */
static void list_truncate(PyObject *lst, Py_ssize_t n)
{
    Py_ssize_t m = PyList_GET_SIZE(lst);
    PyObject **items = ((PyListObject *)lst)->ob_item;
    Py_SET_SIZE(lst, n);   /* first: the list is consistent whatever the decrefs below run */
    for (Py_ssize_t i = n; i < m; i++)
        Py_DECREF(items[i]);
}

static int batch_fill(BatchObject *self, Py_ssize_t threshold)
{
    if (!g_bound) {
        PyErr_SetString(PyExc_RuntimeError, "nbmpi.workers._fused_core is not bound; import "
                        "nbmpi.workers.fused_reductions first");
        return -1;
    }
    /* a reused batch (see py_fuse) keeps its lists when nothing else refers to them */
    if (self->f8 && PyList_CheckExact(self->f8) && Py_REFCNT(self->f8) == 1 &&
        PyList_GET_SIZE(self->f8) >= HEADER_WORDS && PyList_GET_SIZE(self->f8) <= 4096) {
        list_truncate(self->f8, HEADER_WORDS);
    }
    else {
        PyObject *f8 = PyList_New(HEADER_WORDS);
        if (!f8)
            return -1;
        for (int i = 0; i < HEADER_WORDS; i++) {
            Py_INCREF(k_fzero);
            PyList_SET_ITEM(f8, i, k_fzero);
        }
        Py_XSETREF(self->f8, f8);
    }
    if (self->log && PyList_CheckExact(self->log) && Py_REFCNT(self->log) == 1 &&
        PyList_GET_SIZE(self->log) <= 4096) {
        list_truncate(self->log, 0);
    }
    else {
        PyObject *log = PyList_New(0);
        if (!log)
            return -1;
        Py_XSETREF(self->log, log);
    }
    set_field(&self->sig, k_seed);
    set_field(&self->f8_nonsum, g_nod);
    set_field(&self->i8, g_nol);
    set_field(&self->i8_ops, g_nol);
    set_field(&self->arrs, g_nol);
    set_field(&self->kmap, g_nod);
    set_field(&self->nseg, k_zero);
    set_field(&self->words, k_zero);
    set_field(&self->folded, k_zero);
    set_field(&self->allsum, Py_True);
    set_field(&self->res, Py_None);
    set_field(&self->error, Py_None);
    self->room = threshold - 1;
    self->nvars = 0;
    self->done = 0;
    return 0;
}

#define BM(name, field, kind) {name, kind, offsetof(BatchObject, field), 0, NULL}
static PyMemberDef batch_members[] = {
    BM("f8", f8, T_OBJECT_EX), BM("f8_nonsum", f8_nonsum, T_OBJECT_EX), BM("i8", i8, T_OBJECT_EX),
    BM("i8_ops", i8_ops, T_OBJECT_EX), BM("arrs", arrs, T_OBJECT_EX), BM("sig", sig, T_OBJECT_EX),
    BM("nseg", nseg, T_OBJECT_EX), BM("words", words, T_OBJECT_EX), BM("allsum", allsum, T_OBJECT_EX),
    BM("log", log, T_OBJECT_EX), BM("kmap", kmap, T_OBJECT_EX), BM("res", res, T_OBJECT),
    BM("error", error, T_OBJECT), BM("folded", folded, T_OBJECT_EX), BM("room", room, T_PYSSIZET),
    BM("nvars", nvars, T_PYSSIZET), BM("done", done, T_BOOL),
    {NULL}
};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nbmpi.workers._fused_core.BatchBase",
    .tp_doc = "Fields of a fusion batch (subclassed by fused_reductions._Batch).",
    .tp_basicsize = sizeof(BatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)batch_traverse,
    .tp_clear = (inquiry)batch_clear,
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_members = batch_members,
    .tp_init = (initproc)batch_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ Derived */
/* fn(*args): a binary node keeps its two operands inline (x, y; no args tuple on the hot
   path), any other arity keeps the tuple in `other`. `args` reads/writes either form. */
typedef struct {
    PyObject_HEAD
    PyObject *fn, *cast, *value, *x, *y, *other;
} DerivedObject;

static PyTypeObject DerivedType;

static int derived_traverse(DerivedObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn); Py_VISIT(self->cast); Py_VISIT(self->value);
    Py_VISIT(self->x); Py_VISIT(self->y); Py_VISIT(self->other);
    return 0;
}

static int derived_clear(DerivedObject *self)
{
    Py_CLEAR(self->fn); Py_CLEAR(self->cast); Py_CLEAR(self->value);
    Py_CLEAR(self->x); Py_CLEAR(self->y); Py_CLEAR(self->other);
    return 0;
}

static void derived_dealloc(DerivedObject *self)
{
    PyObject_GC_UnTrack(self);
    derived_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int derived_set_args(DerivedObject *d, PyObject *args)
{
    if (!args || !PyTuple_Check(args)) {
        PyErr_SetString(PyExc_TypeError, "Derived.args must be a tuple");
        return -1;
    }
    if (PyTuple_GET_SIZE(args) == 2) {
        set_field(&d->x, PyTuple_GET_ITEM(args, 0));
        set_field(&d->y, PyTuple_GET_ITEM(args, 1));
        Py_CLEAR(d->other);
    }
    else {
        Py_CLEAR(d->x);
        Py_CLEAR(d->y);
        set_field(&d->other, args);
    }
    return 0;
}

static PyObject *derived_get_args(DerivedObject *d, void *closure)
{
    if (d->x && d->y)
        return PyTuple_Pack(2, d->x, d->y);
    return Py_NewRef(d->other ? d->other : k_empty);
}

static int derived_setter(DerivedObject *d, PyObject *v, void *closure)
{
    return derived_set_args(d, v);
}

static PyObject *derived_make2(PyObject *fn, PyObject *x, PyObject *y, PyObject *cast)
{
    DerivedObject *d = PyObject_GC_New(DerivedObject, &DerivedType);
    if (!d)
        return NULL;
    d->fn = Py_NewRef(fn);
    d->cast = Py_NewRef(cast);
    d->value = Py_NewRef(Py_None);
    d->x = Py_NewRef(x);
    d->y = Py_NewRef(y);
    d->other = NULL;
    PyObject_GC_Track(d);
    return (PyObject *)d;
}

static PyObject *derived_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *fn, *a, *cast;
    static char *kwlist[] = {"fn", "args", "cast", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!O", kwlist, &fn, &PyTuple_Type, &a, &cast))
        return NULL;
    DerivedObject *d = PyObject_GC_New(DerivedObject, &DerivedType);
    if (!d)
        return NULL;
    d->fn = Py_NewRef(fn);
    d->cast = Py_NewRef(cast);
    d->value = Py_NewRef(Py_None);
    d->x = d->y = d->other = NULL;
    PyObject_GC_Track(d);
    if (derived_set_args(d, a) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return (PyObject *)d;
}

static PyMemberDef derived_members[] = {
    {"fn", T_OBJECT_EX, offsetof(DerivedObject, fn), 0, NULL},
    {"cast", T_OBJECT_EX, offsetof(DerivedObject, cast), 0, NULL},
    {"value", T_OBJECT, offsetof(DerivedObject, value), 0, NULL},
    {NULL}
};

static PyGetSetDef derived_getset[] = {
    {"args", (getter)derived_get_args, (setter)derived_setter, "the operands (a tuple)", NULL},
    {NULL}
};

static PyTypeObject DerivedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nbmpi.workers._fused_core.Derived",
    .tp_doc = "Derived(fn, args, cast): a lazily computed shared value fn(*args) (value None until computed).",
    .tp_basicsize = sizeof(DerivedObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)derived_traverse,
    .tp_clear = (inquiry)derived_clear,
    .tp_dealloc = (destructor)derived_dealloc,
    .tp_members = derived_members,
    .tp_getset = derived_getset,
    .tp_new = derived_new,
};

/* ------------------------------------------------------------------ VarBase */
typedef struct {
    PyObject_HEAD
    PyObject *id, *dtype, *shape, *kind, *base, *entries, *ob, *oi, *oop, *oblk, *init, *cast, *lastb, *sf,
        *ksum, *name;
    long long cid;   /* the id as a C number when `id` is not made yet (-1: none); see var_get_id */
} VarObject;

static PyTypeObject VarType;
#define VarCheck(o) (Py_TYPE(o) == g_shared_t || Py_TYPE(o) == g_lazy_t || PyObject_TypeCheck((o), &VarType))

static int var_traverse(VarObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->id); Py_VISIT(self->dtype); Py_VISIT(self->shape); Py_VISIT(self->kind);
    Py_VISIT(self->base); Py_VISIT(self->entries); Py_VISIT(self->ob); Py_VISIT(self->oi);
    Py_VISIT(self->oop); Py_VISIT(self->oblk); Py_VISIT(self->init); Py_VISIT(self->cast);
    Py_VISIT(self->lastb); Py_VISIT(self->sf); Py_VISIT(self->ksum); Py_VISIT(self->name);
    return 0;
}

static int var_clear(VarObject *self)
{
    Py_CLEAR(self->id); Py_CLEAR(self->dtype); Py_CLEAR(self->shape); Py_CLEAR(self->kind);
    Py_CLEAR(self->base); Py_CLEAR(self->entries); Py_CLEAR(self->ob); Py_CLEAR(self->oi);
    Py_CLEAR(self->oop); Py_CLEAR(self->oblk); Py_CLEAR(self->init); Py_CLEAR(self->cast);
    Py_CLEAR(self->lastb); Py_CLEAR(self->sf); Py_CLEAR(self->ksum); Py_CLEAR(self->name);
    return 0;
}

static void var_dealloc(VarObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    var_clear(self);
    tp->tp_free((PyObject *)self);   /* a heap subclass's type reference is dropped by subtype_dealloc */
}

static PyObject *call2(PyObject *fn, PyObject *a, PyObject *b)
{
    PyObject *args[2] = {a, b};
    return PyObject_Vectorcall(fn, args, 2, NULL);
}

static BatchObject *current_batch(void)
{
    if (!g_batch) {
        PyErr_SetString(PyExc_RuntimeError, "nbmpi fused reductions: no current batch (set_batch)");
        return NULL;
    }
    Py_INCREF(g_batch);
    return (BatchObject *)g_batch;
}

/* fields the fast paths read; all set for every variable made by SharedVar.__init__ or here */
static inline int var_ready(VarObject *v)
{
    return v->sf == Py_True && v->entries && PyTuple_CheckExact(v->entries) && v->base && v->ob && v->oi &&
        v->oop && v->ksum && v->lastb;
}

/* fields shared arithmetic and float() read (a lazy result has only these until filled) */
static inline int var_operand_ready(VarObject *v)
{
    return v->sf == Py_True && v->entries && PyTuple_CheckExact(v->entries) && v->base;
}

static inline int is_fast_type(PyTypeObject *t)
{
    Py_ssize_t n = PyTuple_GET_SIZE(g_fast_types);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)t == PyTuple_GET_ITEM(g_fast_types, i))
            return 1;
    return 0;
}

static int batch_word(BatchObject *b, PyObject *pi, double *out);

/* x += a for a float64 scalar x (the reference: _PyVarBase._fast_sum); aobj: a as an exact float, or NULL */
static PyObject *fast_sum(VarObject *self, double a, PyObject *aobj)
{
    BatchObject *b = current_batch();
    if (!b)
        return NULL;
    PyObject *f8 = b->f8;
    if (!f8 || !PyList_CheckExact(f8) || !b->log || !PyList_CheckExact(b->log)) {
        Py_DECREF(b);
        PyErr_SetString(PyExc_TypeError, "nbmpi fused reductions: corrupt batch");
        return NULL;
    }
    if (self->ob == (PyObject *)b && is_small(self->oop, 0)) {
        Py_ssize_t i = PyLong_AsSsize_t(self->oi);
        if (i < 0 || i >= PyList_GET_SIZE(f8)) {
            Py_DECREF(b);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_IndexError, "nbmpi fused reductions: slot index out of range");
            return NULL;
        }
        double cur = PyFloat_AsDouble(PyList_GET_ITEM(f8, i));
        if (cur == -1.0 && PyErr_Occurred()) {
            Py_DECREF(b);
            return NULL;
        }
        PyObject *nv = PyFloat_FromDouble(cur + a);
        Py_DECREF(b);
        if (!nv)
            return NULL;
        PyList_SetItem(f8, i, nv);
        Py_INCREF(self);
        return (PyObject *)self;
    }
    Py_ssize_t i = PyList_GET_SIZE(f8);
    PyObject *w = aobj ? (Py_INCREF(aobj), aobj) : PyFloat_FromDouble(a), *pi = NULL, *ent = NULL, *ents = NULL;
    if (!w || PyList_Append(f8, w) < 0)
        goto fail;
    Py_CLEAR(w);
    pi = PyLong_FromSsize_t(i);
    if (!pi)
        goto fail;
    ent = PyTuple_Pack(5, k_zero, (PyObject *)b, k_zero, pi, Py_None);
    if (!ent)
        goto fail;
    if (PyTuple_GET_SIZE(self->entries) == 1 && PyFloat_CheckExact(self->base)) {
        /* a resolved sum nobody read yet: fold it into the base (entries stay bounded) */
        PyObject *old = PyTuple_GET_ITEM(self->entries, 0);
        if (PyTuple_CheckExact(old) && PyTuple_GET_SIZE(old) == 5 && is_small(PyTuple_GET_ITEM(old, 0), 0) &&
            is_small(PyTuple_GET_ITEM(old, 2), 0) && BatchCheck(PyTuple_GET_ITEM(old, 1)) &&
            ((BatchObject *)PyTuple_GET_ITEM(old, 1))->done) {
            double word;
            if (batch_word((BatchObject *)PyTuple_GET_ITEM(old, 1), PyTuple_GET_ITEM(old, 3), &word) < 0)
                goto fail;
            PyObject *nb = PyFloat_FromDouble(PyFloat_AS_DOUBLE(self->base) + word);
            if (!nb)
                goto fail;
            Py_XSETREF(self->base, nb);
            set_field(&self->entries, k_empty);
        }
    }
    Py_ssize_t n = PyTuple_GET_SIZE(self->entries);
    ents = PyTuple_New(n + 1);
    if (!ents)
        goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *it = PyTuple_GET_ITEM(self->entries, k);
        Py_INCREF(it);
        PyTuple_SET_ITEM(ents, k, it);
    }
    PyTuple_SET_ITEM(ents, n, ent);
    ent = NULL;
    Py_XSETREF(self->entries, ents);
    ents = NULL;
    set_field(&self->ob, (PyObject *)b);
    Py_XSETREF(self->oi, pi);
    pi = NULL;
    set_field(&self->oop, k_zero);
    set_field(&self->oblk, k_zero);
    if (self->lastb != (PyObject *)b) {
        set_field(&self->lastb, (PyObject *)b);
        b->nvars += 1;
    }
    if (PyList_Append(b->log, self->ksum) < 0)
        goto fail;
    if (i > b->room) {
        PyObject *r = PyObject_CallMethodNoArgs(g_engine, s_flush);
        if (!r)
            goto fail;
        Py_DECREF(r);
    }
    Py_DECREF(b);
    Py_INCREF(self);
    return (PyObject *)self;
fail:
    Py_XDECREF(w); Py_XDECREF(pi); Py_XDECREF(ent); Py_XDECREF(ents);
    Py_DECREF(b);
    return NULL;
}

static PyObject *var_fast_sum(VarObject *self, PyObject *a)
{
    double v = PyFloat_AsDouble(a);
    if (v == -1.0 && PyErr_Occurred())
        return NULL;
    if (!var_ready(self) && self->sf == Py_True) {
        /* a lazy result: reading a missing field makes _LazyF8.__getattr__ fill them all */
        PyObject *k = PyObject_GetAttrString((PyObject *)self, "_ksum");
        if (!k)
            return NULL;
        Py_DECREF(k);
    }
    if (!var_ready(self)) {
        PyErr_SetString(PyExc_TypeError, "_fast_sum needs a float64 scalar shared variable");
        return NULL;
    }
    return fast_sum(self, v, NULL);
}

static PyObject *var_iadd(PyObject *s, PyObject *a)
{
    VarObject *self = (VarObject *)s;
    if (g_bound && var_ready(self)) {
        PyTypeObject *ta = Py_TYPE(a);
        if (ta == &PyFloat_Type)
            return fast_sum(self, PyFloat_AS_DOUBLE(a), a);
        if (is_fast_type(ta)) {
            double v = PyFloat_AsDouble(a);
            if (v == -1.0 && PyErr_Occurred())
                return NULL;
            return fast_sum(self, v, NULL);
        }
    }
    return call2(g_iadd, s, a);
}

static PyObject *var_isub(PyObject *s, PyObject *a)
{
    VarObject *self = (VarObject *)s;
    if (g_bound && var_ready(self) && is_fast_type(Py_TYPE(a))) {
        double v = PyFloat_AsDouble(a);
        if (v == -1.0 && PyErr_Occurred())
            return NULL;
        return fast_sum(self, -v, NULL);
    }
    return call2(g_isub, s, a);
}

/* ------------------------------------------------------------------ Words: the reduced float64 words */
typedef struct {
    PyObject_VAR_HEAD
    double w[1];
} WordsObject;

static Py_ssize_t words_len(WordsObject *self) { return Py_SIZE(self); }

static PyObject *words_item(WordsObject *self, Py_ssize_t i)
{
    if (i < 0 || i >= Py_SIZE(self)) {
        PyErr_SetString(PyExc_IndexError, "word index out of range");
        return NULL;
    }
    return PyFloat_FromDouble(self->w[i]);
}

static PySequenceMethods words_as_sequence = {
    .sq_length = (lenfunc)words_len,
    .sq_item = (ssizeargfunc)words_item,
};

static PyTypeObject WordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nbmpi.workers._fused_core.Words",
    .tp_doc = "The reduced float64 words of one fusion (a read-only sequence of floats).",
    .tp_basicsize = offsetof(WordsObject, w),
    .tp_itemsize = sizeof(double),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_sequence = &words_as_sequence,
};

/* reduced word i of a resolved batch: b.res[0][i] */
static int batch_word(BatchObject *b, PyObject *pi, double *out)
{
    if (!b->res || !PyTuple_Check(b->res) || PyTuple_GET_SIZE(b->res) < 1) {
        PyErr_SetString(PyExc_RuntimeError, "nbmpi fused reductions: batch has no result");
        return -1;
    }
    PyObject *r0 = PyTuple_GET_ITEM(b->res, 0);
    PyObject *w;
    Py_ssize_t i = PyLong_AsSsize_t(pi);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (Py_TYPE(r0) == &WordsType && i >= 0 && i < Py_SIZE(r0)) {
        *out = ((WordsObject *)r0)->w[i];
        return 0;
    }
    if (PyTuple_CheckExact(r0) && i >= 0 && i < PyTuple_GET_SIZE(r0))
        w = PyTuple_GET_ITEM(r0, i), Py_INCREF(w);
    else if (PyList_CheckExact(r0) && i >= 0 && i < PyList_GET_SIZE(r0))
        w = PyList_GET_ITEM(r0, i), Py_INCREF(w);
    else if (!(w = PySequence_GetItem(r0, i)))
        return -1;
    *out = PyFloat_AsDouble(w);
    Py_DECREF(w);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *derived_value(PyObject *node);
static int force_batch(BatchObject *b);

/* value of a float64 operand of a Derived node: constant, slot reference, node; 1 = not handled here */
static int operand_value(PyObject *a, double *out)
{
    if (PyFloat_CheckExact(a)) {
        *out = PyFloat_AS_DOUBLE(a);
        return 0;
    }
    if (PyLong_CheckExact(a)) {
        *out = PyLong_AsDouble(a);
        return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
    }
    if (PyTuple_CheckExact(a) && PyTuple_GET_SIZE(a) == 3) {   /* (base, batch, index) */
        PyObject *base = PyTuple_GET_ITEM(a, 0), *bb = PyTuple_GET_ITEM(a, 1);
        if (!PyFloat_CheckExact(base) || !BatchCheck(bb))
            return 1;
        if (!((BatchObject *)bb)->done && force_batch((BatchObject *)bb) < 0)
            return -1;
        double w;
        if (batch_word((BatchObject *)bb, PyTuple_GET_ITEM(a, 2), &w) < 0)
            return -1;
        *out = PyFloat_AS_DOUBLE(base) + w;
        return 0;
    }
    if (Py_TYPE(a) == &DerivedType) {
        PyObject *v = derived_value(a);
        if (!v)
            return -1;
        if (!PyFloat_CheckExact(v)) {
            Py_DECREF(v);
            return 1;
        }
        *out = PyFloat_AS_DOUBLE(v);
        Py_DECREF(v);
        return 0;
    }
    return 1;
}

static int fn_code(PyObject *fn)
{
    for (int k = 0; k < 4; k++)
        if (fn == g_fn[k])
            return k + 1;
    return 0;
}

static int arith(int code, double x, double y, double *out)
{
    switch (code) {
    case 1: *out = x + y; return 0;
    case 2: *out = x - y; return 0;
    case 3: *out = x * y; return 0;
    case 4:
        if (y == 0.0) {
            PyErr_SetString(PyExc_ZeroDivisionError, "float division by zero");
            return -1;
        }
        *out = x / y;
        return 0;
    }
    return 1;
}

/* node.value, computing it (and forcing) if needed; the reference is fused_reductions._eval */
static PyObject *derived_value(PyObject *node)
{
    DerivedObject *d = (DerivedObject *)node;
    if (d->value && d->value != Py_None) {
        Py_INCREF(d->value);
        return d->value;
    }
    int code = fn_code(d->fn);
    if (code && d->cast == (PyObject *)&PyFloat_Type && d->x && d->y) {
        double x, y, r;
        int s = operand_value(d->x, &x);
        if (s < 0)
            return NULL;
        if (s == 0) {
            s = operand_value(d->y, &y);
            if (s < 0)
                return NULL;
            if (s == 0) {
                if (arith(code, x, y, &r) < 0)
                    return NULL;
                PyObject *v = PyFloat_FromDouble(r);
                if (!v)
                    return NULL;
                set_field(&d->value, v);
                Py_CLEAR(d->x);   /* args = () */
                Py_CLEAR(d->y);
                Py_CLEAR(d->other);
                return v;
            }
        }
    }
    return PyObject_CallOneArg(g_eval, node);
}

static PyObject *var_float(PyObject *s)
{
    VarObject *self = (VarObject *)s;
    PyObject *ents = self->entries, *base = self->base;
    if (g_bound && ents && base && PyTuple_CheckExact(ents)) {
        Py_ssize_t ne = PyTuple_GET_SIZE(ents);
        if (ne == 0) {
            if (PyFloat_CheckExact(base)) {
                Py_INCREF(base);
                return base;
            }
            if (Py_TYPE(base) == &DerivedType) {
                PyObject *v = derived_value(base);
                if (!v)
                    return NULL;
                if (PyFloat_CheckExact(v)) {
                    set_field(&self->base, v);
                    return v;
                }
                Py_DECREF(v);
            }
        }
        else if (ne == 1 && PyFloat_CheckExact(base)) {
            PyObject *ent = PyTuple_GET_ITEM(ents, 0);
            if (PyTuple_CheckExact(ent) && PyTuple_GET_SIZE(ent) == 5 && is_small(PyTuple_GET_ITEM(ent, 0), 0) &&
                is_small(PyTuple_GET_ITEM(ent, 2), 0) && BatchCheck(PyTuple_GET_ITEM(ent, 1))) {
                BatchObject *b = (BatchObject *)PyTuple_GET_ITEM(ent, 1);
                Py_INCREF(b);
                if (!b->done && force_batch(b) < 0) {
                    Py_DECREF(b);
                    return NULL;
                }
                double w;
                int rc = batch_word(b, PyTuple_GET_ITEM(ent, 3), &w);
                Py_DECREF(b);
                if (rc < 0)
                    return NULL;
                PyObject *v = PyFloat_FromDouble(PyFloat_AS_DOUBLE(base) + w);
                if (!v)
                    return NULL;
                set_field(&self->base, v);
                set_field(&self->entries, k_empty);
                return v;
            }
        }
    }
    return PyObject_CallOneArg(g_float, s);
}

static PyObject *var_reset(PyObject *s, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    VarObject *self = (VarObject *)s;
    if (g_bound && nargs == 0 && kwnames == NULL && self->init && self->init != Py_None && self->entries &&
        PyTuple_CheckExact(self->entries)) {
        set_field(&self->base, self->init);
        if (PyTuple_GET_SIZE(self->entries)) {
            set_field(&self->entries, k_empty);
            set_field(&self->ob, Py_None);
        }
        Py_INCREF(s);
        return s;
    }
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nk > 4) {
        PyErr_SetString(PyExc_TypeError, "reset() takes at most one argument (value)");
        return NULL;
    }
    PyObject *full[5];
    full[0] = s;
    for (Py_ssize_t k = 0; k < nargs + nk; k++)
        full[k + 1] = args[k];
    return PyObject_Vectorcall(g_reset, full, nargs + 1, kwnames);
}

/* --- shared arithmetic on float64 scalars (the reference: fused_reductions._f8_binary) */
static PyObject *log_uniform(PyObject *x, int code)
{
    BatchObject *b = current_batch();
    if (!b)
        return NULL;
    PyObject *key = x;
    if (PyFloat_Check(x) && Py_IS_NAN(PyFloat_AS_DOUBLE(x)))
        key = g_nan_key;
    /* two steps, the tag -16 - code then the value (fused_reductions._f8_operand), both
       before the fold check so a fold never separates them */
    if (code < 0 || code >= N_UTAGS) {
        PyErr_Format(PyExc_ValueError, "nbmpi fused reductions: operation code %d out of range", code);
        Py_DECREF(b);
        return NULL;
    }
    if (PyList_Append(b->log, k_utag[code]) < 0) {
        Py_DECREF(b);
        return NULL;
    }
    if (PyList_Append(b->log, key) < 0) {   /* never leave a tag without its value */
        Py_ssize_t n = PyList_GET_SIZE(b->log);
        list_truncate(b->log, n - 1);
        Py_DECREF(b);
        return NULL;
    }
    if (PyList_GET_SIZE(b->log) >= g_log_cap) {
        PyObject *r = PyObject_CallMethodNoArgs((PyObject *)b, s_fold);
        if (!r) {
            Py_DECREF(b);
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_DECREF(b);
    Py_RETURN_NONE;
}

/* (value, resolved) of one operand; *val is a new reference */
static int f8_operand(PyObject *x, int is_shared, int code, PyObject **val, int *resolved)
{
    if (!is_shared) {
        PyObject *r = log_uniform(x, code);
        if (!r)
            return -1;
        Py_DECREF(r);
        Py_INCREF(x);
        *val = x;
        *resolved = 1;
        return 0;
    }
    VarObject *v = (VarObject *)x;
    PyObject *e = v->entries, *base = v->base;
    if (!PyTuple_GET_SIZE(e)) {
        Py_INCREF(base);
        *val = base;
        *resolved = PyFloat_CheckExact(base);
        return 0;
    }
    set_field(&v->ob, Py_None);
    *resolved = 0;
    if (PyTuple_GET_SIZE(e) == 1 && PyFloat_CheckExact(base)) {
        PyObject *ent = PyTuple_GET_ITEM(e, 0);
        if (PyTuple_CheckExact(ent) && PyTuple_GET_SIZE(ent) == 5 && is_small(PyTuple_GET_ITEM(ent, 0), 0) &&
            is_small(PyTuple_GET_ITEM(ent, 2), 0)) {
            *val = PyTuple_Pack(3, base, PyTuple_GET_ITEM(ent, 1), PyTuple_GET_ITEM(ent, 3));
            return *val ? 0 : -1;
        }
    }
    PyObject *a[4] = {base, e, (PyObject *)&PyFloat_Type, k_empty};
    *val = PyObject_Vectorcall(g_snap, a, 4, NULL);
    return *val ? 0 : -1;
}

/* A new float64 scalar shared result: as the Python reference (_f8_binary), only the id,
   base, entries and the float64-scalar flag are set; _LazyF8.__getattr__ fills the other
   fields with their defaults if anything reads them. The id is made as a Python int only
   when read (var_get_id). */
static PyObject *new_lazy(PyObject *base)
{
    VarObject *r = (VarObject *)g_lazy_t->tp_alloc(g_lazy_t, 0);
    if (!r)
        return NULL;
    r->cid = g_next_id++;
    set_field(&r->base, base);
    set_field(&r->entries, k_empty);
    set_field(&r->sf, Py_True);
    return (PyObject *)r;
}

static PyObject *f8_binary(PyObject *fn, int code, PyObject *a, PyObject *b, int sa, int sb)
{
    PyObject *va = NULL, *vb = NULL, *base = NULL, *res = NULL;
    int ca, cb;
    if (f8_operand(a, sa, code, &va, &ca) < 0)
        return NULL;
    if (b == a) {
        Py_INCREF(va);
        vb = va;
        cb = ca;
    }
    else if (f8_operand(b, sb, code, &vb, &cb) < 0) {
        Py_DECREF(va);
        return NULL;
    }
    if (ca && cb) {
        double x, y, r;
        int k = fn_code(fn);
        int sx = k ? operand_value(va, &x) : 1;
        int sy = (k && sx == 0) ? operand_value(vb, &y) : 1;
        if (sx < 0 || sy < 0)
            goto done;
        if (sx == 0 && sy == 0) {
            if (arith(k, x, y, &r) < 0)
                goto done;
            base = PyFloat_FromDouble(r);
        }
        else {
            base = call2(fn, va, vb);
            if (base && !PyFloat_CheckExact(base))
                Py_SETREF(base, PyNumber_Float(base));
        }
    }
    else {
        base = derived_make2(fn, va, vb, (PyObject *)&PyFloat_Type);
    }
    if (base)
        res = new_lazy(base);
done:
    Py_XDECREF(va); Py_XDECREF(vb); Py_XDECREF(base);
    return res;
}

#define SHAREDF8(o) ((Py_TYPE(o) == g_lazy_t || Py_TYPE(o) == g_shared_t) && var_operand_ready((VarObject *)(o)))
#define UNIFORM(o) (Py_TYPE(o) == &PyFloat_Type || Py_TYPE(o) == &PyLong_Type)

/* x + y, x - y: fast only for two float64 scalar shared operands (a local operand is a contribution) */
static PyObject *additive(PyObject *x, PyObject *y, int code, int op, int rop)
{
    if (!g_bound)
        Py_RETURN_NOTIMPLEMENTED;
    if (VarCheck(x)) {
        if (VarCheck(y) && var_operand_ready((VarObject *)x) && SHAREDF8(y))
            return f8_binary(g_fn[code - 1], code, x, y, 1, 1);
        return call2(g_ops[op], x, y);
    }
    if (!VarCheck(y))
        Py_RETURN_NOTIMPLEMENTED;
    return call2(g_ops[rop], y, x);
}

/* x * y, x / y: also with float/int uniform operands */
static PyObject *scaling(PyObject *x, PyObject *y, int code, int op, int rop)
{
    if (!g_bound)
        Py_RETURN_NOTIMPLEMENTED;
    if (VarCheck(x)) {
        VarObject *X = (VarObject *)x;
        if (var_operand_ready(X)) {
            if (UNIFORM(y))
                return f8_binary(g_fn[code - 1], code, x, y, 1, 0);
            if (SHAREDF8(y))
                return f8_binary(g_fn[code - 1], code, x, y, 1, 1);
        }
        return call2(g_ops[op], x, y);
    }
    if (!VarCheck(y))
        Py_RETURN_NOTIMPLEMENTED;
    VarObject *Y = (VarObject *)y;
    if (var_operand_ready(Y) && UNIFORM(x))
        return f8_binary(g_fn[code - 1], code, x, y, 0, 1);
    return call2(g_ops[rop], y, x);
}

static PyObject *var_add(PyObject *x, PyObject *y) { return additive(x, y, 1, OP_ADD, OP_RADD); }
static PyObject *var_sub(PyObject *x, PyObject *y) { return additive(x, y, 2, OP_SUB, OP_RSUB); }
static PyObject *var_mul(PyObject *x, PyObject *y) { return scaling(x, y, 3, OP_MUL, OP_RMUL); }
static PyObject *var_div(PyObject *x, PyObject *y) { return scaling(x, y, 4, OP_DIV, OP_RDIV); }

static PyNumberMethods var_as_number = {
    .nb_add = var_add,
    .nb_subtract = var_sub,
    .nb_multiply = var_mul,
    .nb_true_divide = var_div,
    .nb_inplace_add = var_iadd,
    .nb_inplace_subtract = var_isub,
    .nb_float = var_float,
};

PyDoc_STRVAR(reset_doc,
"reset(value=None)\n--\n\n"
"Set the variable back to its creation value, or to ``value``, which must be\n"
"the same on every rank (checked at the next force point). Local, no force;\n"
"pending contributions of this variable are dropped from its value.");

static PyMethodDef var_methods[] = {
    {"reset", (PyCFunction)(void (*)(void))var_reset, METH_FASTCALL | METH_KEYWORDS, reset_doc},
    {"_fast_sum", (PyCFunction)var_fast_sum, METH_O, "x += a for a float64 scalar x and a real a (hot path)."},
    {NULL}
};

static PyObject *var_get_id(VarObject *self, void *closure)
{
    if (!self->id) {
        if (self->cid < 0) {
            PyErr_SetString(PyExc_AttributeError, "_id");
            return NULL;
        }
        if (!(self->id = PyLong_FromLongLong(self->cid)))
            return NULL;
    }
    return Py_NewRef(self->id);
}

static int var_set_id(VarObject *self, PyObject *v, void *closure)
{
    long long c = -1;
    if (v && PyLong_CheckExact(v)) {
        c = PyLong_AsLongLong(v);
        if (c == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            c = -1;
        }
    }
    Py_XINCREF(v);
    Py_XSETREF(self->id, v);
    self->cid = v ? c : -1;
    return 0;
}

static PyGetSetDef var_getset[] = {
    {"_id", (getter)var_get_id, (setter)var_set_id, "The variable's id (creation order; the same on every rank).",
     NULL},
    {NULL}
};

static PyObject *var_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    VarObject *self = (VarObject *)PyType_GenericNew(type, args, kwds);
    if (self)
        self->cid = -1;
    return (PyObject *)self;
}

#define VM(name, field) {name, T_OBJECT_EX, offsetof(VarObject, field), 0, NULL}
static PyMemberDef var_members[] = {
    VM("dtype", dtype), VM("shape", shape), VM("_kind", kind), VM("_base", base),
    VM("_entries", entries), VM("_ob", ob), VM("_oi", oi), VM("_oop", oop), VM("_oblk", oblk),
    VM("_init", init), VM("_cast", cast), VM("_lastb", lastb), VM("_sf", sf), VM("_ksum", ksum),
    VM("name", name),
    {NULL}
};

static PyTypeObject VarType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nbmpi.workers._fused_core.VarBase",
    .tp_doc = "Fields and compiled hot-path operators of a shared variable (base of SharedVar).",
    .tp_basicsize = sizeof(VarObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)var_traverse,
    .tp_clear = (inquiry)var_clear,
    .tp_dealloc = (destructor)var_dealloc,
    .tp_as_number = &var_as_number,
    .tp_methods = var_methods,
    .tp_members = var_members,
    .tp_getset = var_getset,
    .tp_new = var_new,
};

/* ------------------------------------------------------------------ the compiled force point */
static Py_ssize_t size_class(Py_ssize_t words)   /* fused_reductions._size_class */
{
    if (words <= 16)
        return 16;
    int bits = 0;
    for (Py_ssize_t w = words; w; w >>= 1)
        bits++;
    Py_ssize_t step = (Py_ssize_t)1 << (bits - 4 > 0 ? bits - 4 : 0);
    return (words + step - 1) / step * step;
}

static inline long long floor_mod(long long a, long long m)
{
    long long r = a % m;
    return r < 0 ? r + m : r;
}

static long long now_ns(void)   /* time.perf_counter_ns() on Linux: CLOCK_MONOTONIC */
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The tracer's slots (tracing.Tracer has __slots__): read and written at their offsets,
   as the slot descriptors do, without an attribute lookup per field. */
static PyTypeObject *g_tracer_t;                  /* tracing.Tracer */
static PyObject *g_tracing_dict;                  /* tracing.__dict__ (holds _TRACER) */
static Py_ssize_t off_enabled, off_pend, off_n, off_cap, off_buf;
#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static int slot_offset(PyTypeObject *t, const char *name, Py_ssize_t *off)
{
    PyObject *d = PyDict_GetItemString(t->tp_dict, name);
    if (!d || Py_TYPE(d) != &PyMemberDescr_Type || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "bind(): %s.%s is not a __slots__ field", t->tp_name, name);
        return -1;
    }
    *off = ((PyMemberDescrObject *)d)->d_member->offset;
    return 0;
}

static int bind_tracer(PyObject *tracing)
{
    PyObject *t = PyObject_GetAttrString(tracing, "Tracer");
    if (!t)
        return -1;
    if (!PyType_Check(t) || slot_offset((PyTypeObject *)t, "enabled", &off_enabled) ||
        slot_offset((PyTypeObject *)t, "pend", &off_pend) || slot_offset((PyTypeObject *)t, "n", &off_n) ||
        slot_offset((PyTypeObject *)t, "cap", &off_cap) || slot_offset((PyTypeObject *)t, "buf", &off_buf)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "bind(): tracing.Tracer is not a type");
        Py_DECREF(t);
        return -1;
    }
    Py_XSETREF(g_tracer_t, (PyTypeObject *)t);
    set_field(&g_tracing_dict, PyModule_GetDict(tracing));
    return g_tracing_dict ? 0 : -1;
}

/* one trace record of the fused collective (Tracer.record semantics: flushes deferred records first) */
static int trace_fused(long long tag, long long nbytes, long long t0, long long t1, long long seq, long long chan,
                       long long count)
{
    PyObject *tr = PyDict_GetItemWithError(g_tracing_dict, s_TRACER);   /* borrowed */
    if (!tr)
        return PyErr_Occurred() ? -1 : 0;
    if (tr == Py_None)
        return 0;
    if (Py_TYPE(tr) != g_tracer_t) {   /* not exactly a Tracer: its attributes and methods decide */
        PyObject *en = PyObject_GetAttrString(tr, "enabled");
        if (!en)
            return -1;
        int on = PyObject_IsTrue(en);
        Py_DECREF(en);
        if (on <= 0)
            return on;
        goto python;
    }
    PyObject *en = SLOT(tr, off_enabled), *pend = SLOT(tr, off_pend), *pn = SLOT(tr, off_n), *pc = SLOT(tr, off_cap),
             *buf = SLOT(tr, off_buf);
    if (en != Py_True) {   /* tracing off (a non-bool: its truth value) */
        int on = en ? PyObject_IsTrue(en) : 0;
        if (on <= 0)
            return on;
        goto python;
    }
    if (!pend || !PyLong_CheckExact(pend) || !pn || !PyLong_CheckExact(pn) || !pc || !PyLong_CheckExact(pc) || !buf)
        goto python;   /* anything unusual: the Python method decides */
    long long n = PyLong_AsLongLong(pn), cap = PyLong_AsLongLong(pc);
    if (PyErr_Occurred())
        return -1;
    if (!is_small(pend, 0) || n >= cap)   /* the Python method flushes / grows / counts a drop */
        goto python;
    if (buf != g_trview.obj) {   /* a new tracer or a grown buffer: export it once */
        Py_buffer view;
        if (PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        if (g_trview.obj)
            PyBuffer_Release(&g_trview);
        g_trview = view;
    }
    if ((long long)g_trview.len < (n + 1) * 11 * 8)
        goto python;
    long long *row = (long long *)g_trview.buf + n * 11;
    row[0] = g_kind_fused; row[1] = 0; row[2] = -1; row[3] = tag; row[4] = nbytes; row[5] = t0; row[6] = t1;
    row[7] = -1; row[8] = seq; row[9] = chan; row[10] = count;
    PyObject *nn = PyLong_FromLongLong(n + 1);
    if (!nn)
        return -1;
    Py_SETREF(SLOT(tr, off_n), nn);
    return 0;
python:
    {
        PyObject *r = PyObject_CallMethod(tr, "record", "lllLLLLLLLL", g_kind_fused, 0L, -1L, tag, nbytes, t0, t1,
                                          -1LL, seq, chan, count);
        Py_XDECREF(r);
        return r ? 0 : -1;
    }
}

/* the current exception as one object (Python 3.11 API) / raise it again */
static PyObject *take_exception(void)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb && v)
        PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
}

static void raise_exception(PyObject *v)   /* steals v */
{
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(v)), v, PyException_GetTraceback(v));
}

/* Error of the collective: the Python handling (diagnosis, b.error) decides what to raise. */
static PyObject *fuse_failed(PyObject *engine, PyObject *b, Py_ssize_t L)
{
    PyObject *exc = take_exception();
    PyObject *err = PyObject_CallMethod(engine, "_fuse_failed", "OnO", b, L, exc);
    if (!err) {
        Py_DECREF(exc);
        return NULL;
    }
    if (err != exc)
        PyException_SetCause(err, Py_NewRef(exc));
    raise_exception(err);
    Py_DECREF(exc);
    return NULL;
}

/* hash() of a tuple whose items hash to lanes[0..n-1]: CPython's tuplehash (xxHash-based,
   Objects/tupleobject.c), so the value equals Python's hash(tuple(...)) */
#if SIZEOF_PY_UHASH_T > 4
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define XXROTATE(x) ((x << 31) | (x >> 33))
#else
#define XXPRIME_1 ((Py_uhash_t)2654435761UL)
#define XXPRIME_2 ((Py_uhash_t)2246822519UL)
#define XXPRIME_5 ((Py_uhash_t)374761393UL)
#define XXROTATE(x) ((x << 13) | (x >> 19))
#endif
static inline Py_uhash_t lane_add(Py_uhash_t acc, Py_uhash_t lane)
{
    acc += lane * XXPRIME_2;
    acc = XXROTATE(acc);
    return acc * XXPRIME_1;
}

static inline Py_hash_t lanes_final(Py_uhash_t acc, Py_ssize_t n)
{
    acc += n ^ (XXPRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

/* hash((b.sig, L, tuple(b.log))) without building the tuples */
static Py_hash_t signature_hash(BatchObject *b, Py_ssize_t L)
{
    PyObject *log = b->log;
    Py_ssize_t n = PyList_GET_SIZE(log);
    Py_uhash_t inner = XXPRIME_5;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_hash_t h = PyObject_Hash(PyList_GET_ITEM(log, i));
        if (h == -1)
            return -1;
        inner = lane_add(inner, (Py_uhash_t)h);
    }
    Py_hash_t hs = PyObject_Hash(b->sig);
    if (hs == -1)
        return -1;
    Py_uhash_t acc = lane_add(XXPRIME_5, (Py_uhash_t)hs);
    acc = lane_add(acc, (Py_uhash_t)L);          /* hash(L) == L for 0 <= L < 2**61 - 1 */
    acc = lane_add(acc, (Py_uhash_t)lanes_final(inner, n));
    return lanes_final(acc, 3);
}

/* raise mpi4py.MPI.Exception(ierr), as mpi4py does for a failed call */
static void mpi_error(int ierr)
{
    PyObject *e = PyObject_CallFunction(g_mpi_exception, "i", ierr);
    if (e) {
        PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        Py_DECREF(e);
    }
}

/* fuse(engine, b): FusionEngine.flush's hot path (only float64 scalar sums pending) in C.
   Returns the number of variables resolved, or None if the Python path must run (no
   buffer or persistent request of this size class yet). Same steps as the Python code:
   new current batch (the previous fusion's batch when nothing refers to it any more),
   signature words, pack, Start + Test polls (MPI_Start/MPI_Test called directly after
   set_mpi(), else through mpi4py; then engine._wait), trace record, result words,
   signature check. */
static PyObject *py_fuse(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyObject_TypeCheck(args[1], &BatchType)) {
        PyErr_SetString(PyExc_TypeError, "fuse(engine, batch) takes the engine and its current batch");
        return NULL;
    }
    PyObject *engine = args[0];
    BatchObject *b = (BatchObject *)args[1];
    PyObject *f8 = b->f8;
    if (!f8 || !PyList_CheckExact(f8) || !b->log || !PyList_CheckExact(b->log))
        Py_RETURN_NONE;
    Py_ssize_t n1 = PyList_GET_SIZE(f8), L = size_class(n1);
    PyObject *req = NULL, *key = NULL, *nb = NULL, *result = NULL;
    Py_buffer *view = &g_fbuf;
    if (!view->obj || !g_preq || (Py_ssize_t)view->len < L * 8 || !(key = PyLong_FromSsize_t(L)))
        goto python_path;
    req = PyDict_GetItemWithError(g_preq, key);
    if (!req)
        goto python_path;
    Py_INCREF(req);
    /* the next fusion starts now */
    {
        PyTypeObject *bt = (PyTypeObject *)g_batch_type;
        if (g_spare && Py_REFCNT(g_spare) == 1 && Py_TYPE(g_spare) == bt) {
            nb = g_spare;   /* the batch of the previous fusion, no longer referenced: reuse it */
            g_spare = NULL;
        }
        else
            nb = bt->tp_alloc(bt, 0);
        if (!nb || batch_fill((BatchObject *)nb, (Py_ssize_t)g_threshold) < 0 ||
            PyObject_SetAttr(engine, s_batch_, nb) < 0)
            goto fail_early;
        set_field(&g_batch, nb);
    }
    /* signature words: hash((b.sig, L, tuple(b.log))) as in the Python path, written straight
       into the buffer (words 0..3; the list's header words are not read after a fusion) */
    {
        Py_hash_t h = signature_hash(b, L);
        if (h == -1 && PyErr_Occurred())
            goto fail;
        double h1 = (double)(floor_mod(h, g_m20a) + 1), h2 = (double)(floor_mod(h >> 20, g_m20b) + 1);
        double *d = (double *)view->buf;
        d[0] = h1; d[1] = h1 * h1; d[2] = h2; d[3] = h2 * h2;
    }
    {
        double *d = (double *)view->buf;
        for (Py_ssize_t i = HEADER_WORDS; i < n1; i++) {
            PyObject *o = PyList_GET_ITEM(f8, i);
            double x = PyFloat_CheckExact(o) ? PyFloat_AS_DOUBLE(o) : PyFloat_AsDouble(o);
            if (x == -1.0 && PyErr_Occurred())
                goto fail;
            d[i] = x;
        }
    }
    long long t0 = now_ns();
    {
        int done = 0;
        PyObject *r;
        if (g_mpi_start) {   /* straight into the MPI library: no Python call, no GIL release */
            void *h = g_request_get(req);
            if (!h)
                goto fail_mpi;
            int ierr = g_mpi_start(h);
            for (long k = 0; !ierr && k <= g_spin && !done; k++)
                ierr = g_mpi_test(h, &done, g_status);
            if (ierr) {
                mpi_error(ierr);
                goto fail_mpi;
            }
        }
        else {
            r = PyObject_CallMethodNoArgs(req, s_Start);
            if (!r)
                goto fail_mpi;
            Py_DECREF(r);
            for (long k = 0; k <= g_spin && !done; k++) {
                r = PyObject_CallMethodNoArgs(req, s_Test);
                if (!r)
                    goto fail_mpi;
                done = PyObject_IsTrue(r);
                Py_DECREF(r);
                if (done < 0)
                    goto fail_mpi;
            }
        }
        if (!done) {   /* the interruptible wait with the timeout (raises a diagnosed error) */
            r = PyObject_CallMethod(engine, "_wait", "OOn", req, (PyObject *)b, L);
            if (!r)
                goto fail_mpi;
            Py_DECREF(r);
        }
    }
    long long t1 = now_ns();
    {
        long long seq = g_seq++, chan = g_chan, P = g_size;
        if (trace_fused(0, L * 8, t0, t1, seq, chan, b->nvars) < 0)
            goto fail;
        WordsObject *w = PyObject_NewVar(WordsObject, &WordsType, n1);
        if (!w)
            goto fail;
        memcpy(w->w, view->buf, n1 * sizeof(double));
        int same;
        if (P <= 64) {   /* _same_signature: exact in float64 below 2**53 */
            double s1 = w->w[0], q1 = w->w[1], s2 = w->w[2], q2 = w->w[3];
            same = ((double)P * q1 == s1 * s1) && ((double)P * q2 == s2 * s2);
        }
        else {
            PyObject *pp = PyLong_FromLongLong(P);
            PyObject *r = pp ? call2(g_same_signature, pp, (PyObject *)w) : NULL;
            Py_XDECREF(pp);
            same = r ? PyObject_IsTrue(r) : -1;
            Py_XDECREF(r);
            if (same < 0) {
                Py_DECREF(w);
                goto fail;
            }
        }
        PyObject *res = PyTuple_Pack(3, (PyObject *)w, g_empty_list, g_empty_list);
        Py_DECREF(w);
        if (!res)
            goto fail;
        if (!same) {
            Py_DECREF(res);
            PyObject *e = PyObject_CallMethod(engine, "_divergence", "On", (PyObject *)b, L);
            if (e) {
                PyErr_SetObject((PyObject *)Py_TYPE(e), e);
                Py_DECREF(e);
            }
            goto fail;
        }
        Py_XSETREF(b->res, res);
        b->done = 1;
        set_field(&g_spare, (PyObject *)b);   /* reused by a later fusion once nothing refers to it */
        g_compiled_fusions++;
    }
    result = PyLong_FromSsize_t(b->nvars);
    goto out;
fail_mpi:
    fuse_failed(engine, (PyObject *)b, L);
    goto out;
fail:
    {   /* b.error = the exception, as the Python path's `except BaseException` */
        PyObject *exc = take_exception();
        set_field(&b->error, exc);
        raise_exception(exc);
    }
    goto out;
fail_early:
    goto out;
python_path:
    if (!PyErr_Occurred())
        result = Py_NewRef(Py_None);
out:
    Py_XDECREF(req); Py_XDECREF(key); Py_XDECREF(nb);
    return result;
}

/* Make batch b resolved (a force point): the compiled fuse when only float64 scalar sums
   are pending in the current batch, else the Python _force (which flushes or raises b.error). */
static int force_batch(BatchObject *b)
{
    if (!b->done && (PyObject *)b == g_batch && g_engine && b->error == Py_None && b->allsum == Py_True &&
        is_small(b->nseg, 0) && PyList_GET_SIZE(b->f8) > 4) {
        if (g_ready) {
            PyObject *args[2] = {g_engine, (PyObject *)b};
            PyObject *r = py_fuse(NULL, args, 2);
            if (!r)
                return -1;
            Py_DECREF(r);
            if (b->done)
                return 0;
        }
    }
    if (b->done)
        return 0;
    PyObject *r = PyObject_CallOneArg(g_force, (PyObject *)b);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ------------------------------------------------------------------ module functions */
static PyObject *py_f8_binary(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "f8_binary(fn, code, a, b, sa, sb) takes 6 arguments");
        return NULL;
    }
    long code = PyLong_AsLong(args[1]);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    int sa = PyObject_IsTrue(args[4]), sb = PyObject_IsTrue(args[5]);
    if (sa < 0 || sb < 0)
        return NULL;
    if ((sa && !(VarCheck(args[2]) && var_operand_ready((VarObject *)args[2]))) ||
        (sb && !(VarCheck(args[3]) && var_operand_ready((VarObject *)args[3]))))
        return PyObject_Vectorcall(g_f8_binary_py, args, 6, NULL);   /* fields not all set: the Python path */
    return f8_binary(args[0], (int)code, args[2], args[3], sa, sb);
}

static PyObject *py_set_engine(PyObject *mod, PyObject *e)
{
    set_field(&g_engine, e);
    Py_RETURN_NONE;
}

static PyObject *py_next_id(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1) {
        long long v = PyLong_AsLongLong(args[0]);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        g_next_id = v;
    }
    else if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "next_id([value])");
        return NULL;
    }
    return PyLong_FromLongLong(g_next_id);
}

static PyObject *counter(long long *c, PyObject *const *args, Py_ssize_t nargs, const char *name)
{
    if (nargs == 1) {
        long long v = PyLong_AsLongLong(args[0]);
        if (v == -1 && PyErr_Occurred())
            return NULL;
        *c = v;
    }
    else if (nargs) {
        PyErr_Format(PyExc_TypeError, "%s([value])", name);
        return NULL;
    }
    return PyLong_FromLongLong(*c);
}

static PyObject *py_seq(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    return counter(&g_seq, args, nargs, "seq");
}

static PyObject *py_compiled_fusions(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    return counter(&g_compiled_fusions, args, nargs, "compiled_fusions");
}

static PyObject *py_ready(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1) {
        int v = PyObject_IsTrue(args[0]);
        if (v < 0)
            return NULL;
        g_ready = v;
    }
    else if (nargs) {
        PyErr_SetString(PyExc_TypeError, "ready([value])");
        return NULL;
    }
    return PyBool_FromLong(g_ready);
}

/* set_state(buf, preq, threshold_words, chan, size): what the compiled force point uses */
static PyObject *py_set_state(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_state(buf, preq: dict, threshold_words, chan, size)");
        return NULL;
    }
    long long thr = PyLong_AsLongLong(args[2]), chan = PyLong_AsLongLong(args[3]), size = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (g_fbuf.obj)
        PyBuffer_Release(&g_fbuf);
    g_fbuf = v;
    set_field(&g_preq, args[1]);
    g_threshold = thr;
    g_chan = chan;
    g_size = size;
    Py_RETURN_NONE;
}

/* set_mpi(start, test, request_get, exception): addresses of MPI_Start and MPI_Test in the
   MPI library mpi4py loaded, mpi4py's PyMPIRequest_Get capsule and mpi4py.MPI.Exception;
   set_mpi(None) goes back to calling Start/Test through mpi4py. */
static PyObject *py_set_mpi(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 1 && args[0] == Py_None) {
        g_mpi_start = NULL;
        g_mpi_test = NULL;
        g_request_get = NULL;
        Py_RETURN_NONE;
    }
    if (nargs != 4 || !PyLong_Check(args[0]) || !PyLong_Check(args[1]) || !PyCapsule_CheckExact(args[2]) ||
        !PyType_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "set_mpi(start_address, test_address, PyMPIRequest_Get capsule, "
                        "MPI.Exception) or set_mpi(None)");
        return NULL;
    }
    void *start = PyLong_AsVoidPtr(args[0]), *test = PyLong_AsVoidPtr(args[1]);
    void *get = PyCapsule_GetPointer(args[2], PyCapsule_GetName(args[2]));
    if (PyErr_Occurred())
        return NULL;
    if (!start || !test || !get) {
        PyErr_SetString(PyExc_ValueError, "set_mpi(): a null function address");
        return NULL;
    }
    set_field(&g_mpi_exception, args[3]);
    g_mpi_start = (mpi_start_fn)start;
    g_mpi_test = (mpi_test_fn)test;
    g_request_get = (request_get_fn)get;
    Py_RETURN_NONE;
}

static PyObject *py_set_batch(PyObject *mod, PyObject *b)
{
    if (!PyObject_TypeCheck(b, &BatchType)) {
        PyErr_SetString(PyExc_TypeError, "set_batch() needs a batch");
        return NULL;
    }
    set_field(&g_batch, b);
    Py_RETURN_NONE;
}

/* pack(words, buffer): buffer[:len(words)] = words (float64), the fusion buffer before the collective */
static PyObject *py_pack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pack(words: list, buffer) takes a list and a writable float64 buffer");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *lst = args[0];
    Py_ssize_t n = PyList_GET_SIZE(lst);
    if ((Py_ssize_t)(n * sizeof(double)) > view.len) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "pack(): %zd words do not fit a buffer of %zd bytes", n, view.len);
        return NULL;
    }
    double *d = (double *)view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyList_GET_ITEM(lst, i);
        double x = PyFloat_CheckExact(o) ? PyFloat_AS_DOUBLE(o) : PyFloat_AsDouble(o);
        if (x == -1.0 && PyErr_Occurred()) {
            PyBuffer_Release(&view);
            return NULL;
        }
        d[i] = x;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* unpack(buffer, n): a Words copy of the first n float64 words (the fusion's result) */
static PyObject *py_unpack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "unpack(buffer, n) takes 2 arguments");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (n < 0 || (Py_ssize_t)(n * sizeof(double)) > view.len) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "unpack(): %zd words exceed a buffer of %zd bytes", n, view.len);
        return NULL;
    }
    WordsObject *w = PyObject_NewVar(WordsObject, &WordsType, n);
    if (w)
        memcpy(w->w, view.buf, n * sizeof(double));
    PyBuffer_Release(&view);
    return (PyObject *)w;
}

static int take(PyObject *kw, const char *name, PyObject **slot)
{
    PyObject *v = PyDict_GetItemString(kw, name);
    if (!v) {
        PyErr_Format(PyExc_TypeError, "bind(): missing %s", name);
        return -1;
    }
    set_field(slot, v);
    return 0;
}

static PyObject *py_bind(PyObject *mod, PyObject *args, PyObject *kw)
{
    PyObject *ops = NULL, *fns = NULL, *st = NULL, *lt = NULL, *cap = NULL;
    if (!kw || PyTuple_GET_SIZE(args)) {
        PyErr_SetString(PyExc_TypeError, "bind() takes keyword arguments only");
        return NULL;
    }
    if (take(kw, "reset", &g_reset) || take(kw, "iadd", &g_iadd) || take(kw, "isub", &g_isub) ||
        take(kw, "float", &g_float) || take(kw, "force", &g_force) ||
        take(kw, "eval", &g_eval) || take(kw, "snap", &g_snap) || take(kw, "f8_binary", &g_f8_binary_py) || take(kw, "fast_types", &g_fast_types) ||
        take(kw, "f8", &g_f8) || take(kw, "nan_key", &g_nan_key) || take(kw, "nod", &g_nod) ||
        take(kw, "nol", &g_nol) || take(kw, "ops", &ops) || take(kw, "fns", &fns) || take(kw, "shared", &st) ||
        take(kw, "lazy", &lt) || take(kw, "log_cap", &cap) || take(kw, "batch_type", &g_batch_type) ||
        take(kw, "tracing", &g_tracing) || take(kw, "empty_list", &g_empty_list) ||
        take(kw, "same_signature", &g_same_signature) || bind_tracer(g_tracing) < 0)
        goto fail;
    {
        PyObject *kf = PyDict_GetItemString(kw, "kind_fused"), *sp = PyDict_GetItemString(kw, "spin");
        if (!kf || !sp) {
            PyErr_SetString(PyExc_TypeError, "bind(): missing kind_fused or spin");
            goto fail;
        }
        g_kind_fused = PyLong_AsLong(kf);
        g_spin = PyLong_AsLong(sp);
        if (PyErr_Occurred())
            goto fail;
    }
    if (!PyTuple_Check(ops) || PyTuple_GET_SIZE(ops) != 8 || !PyTuple_Check(fns) || PyTuple_GET_SIZE(fns) != 4 ||
        !PyTuple_Check(g_fast_types) || !PyType_Check(st) || !PyType_Check(lt) ||
        !PyType_IsSubtype((PyTypeObject *)st, &VarType) || !PyType_IsSubtype((PyTypeObject *)lt, &VarType)) {
        PyErr_SetString(PyExc_TypeError, "bind(): ops must be 8 callables, fns 4, fast_types a tuple, shared/lazy "
                        "subclasses of VarBase");
        goto fail;
    }
    for (int k = 0; k < 8; k++)
        set_field(&g_ops[k], PyTuple_GET_ITEM(ops, k));
    for (int k = 0; k < 4; k++)
        set_field(&g_fn[k], PyTuple_GET_ITEM(fns, k));
    set_field((PyObject **)&g_shared_t, st);
    set_field((PyObject **)&g_lazy_t, lt);
    g_log_cap = PyLong_AsSsize_t(cap);
    if (g_log_cap == -1 && PyErr_Occurred())
        goto fail;
    Py_DECREF(ops); Py_DECREF(fns); Py_DECREF(st); Py_DECREF(lt); Py_DECREF(cap);
    g_bound = 1;
    Py_RETURN_NONE;
fail:
    Py_XDECREF(ops); Py_XDECREF(fns); Py_XDECREF(st); Py_XDECREF(lt); Py_XDECREF(cap);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))py_bind, METH_VARARGS | METH_KEYWORDS,
     "bind(**python_implementation): the Python functions and types the compiled paths fall back to."},
    {"set_engine", py_set_engine, METH_O, "set_engine(engine): the FusionEngine (its flush() and next_id)."},
    {"next_id", (PyCFunction)(void (*)(void))py_next_id, METH_FASTCALL,
     "next_id([value]): the id the next shared variable gets (set it with an argument)."},
    {"seq", (PyCFunction)(void (*)(void))py_seq, METH_FASTCALL, "seq([value]): FusionEngine.seq (fused collectives run)."},
    {"compiled_fusions", (PyCFunction)(void (*)(void))py_compiled_fusions, METH_FASTCALL,
     "compiled_fusions([value]): how many fused collectives the compiled force point ran."},
    {"ready", (PyCFunction)(void (*)(void))py_ready, METH_FASTCALL,
     "ready([value]): FusionEngine._ready (connected, not broken, not strict: the fast force point may run)."},
    {"set_state", (PyCFunction)(void (*)(void))py_set_state, METH_FASTCALL,
     "set_state(buf, preq, threshold_words, chan, size): the engine state the compiled force point uses."},
    {"set_mpi", (PyCFunction)(void (*)(void))py_set_mpi, METH_FASTCALL,
     "set_mpi(start, test, request_get, exception): call MPI_Start/MPI_Test directly (set_mpi(None): via mpi4py)."},
    {"set_batch", py_set_batch, METH_O, "set_batch(batch): the engine's current batch, which the hot path fills."},
    {"pack", (PyCFunction)(void (*)(void))py_pack, METH_FASTCALL, "pack(words, buffer): buffer[:len(words)] = words."},
    {"unpack", (PyCFunction)(void (*)(void))py_unpack, METH_FASTCALL,
     "unpack(buffer, n): a read-only sequence (Words) copying the first n float64 words of buffer."},
    {"fuse", (PyCFunction)(void (*)(void))py_fuse, METH_FASTCALL,
     "fuse(engine, batch): the force point's hot path (float64 scalar sums only); None = use the Python path."},
    {"f8_binary", (PyCFunction)(void (*)(void))py_f8_binary, METH_FASTCALL,
     "f8_binary(fn, code, a, b, sa, sb): float64 scalar shared arithmetic (see fused_reductions._f8_binary)."},
    {NULL}
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_fused_core",
    "Compiled hot path of float64 scalar shared variables (see nbmpi.workers.fused_reductions).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__fused_core(void)
{
    if (PyType_Ready(&BatchType) < 0 || PyType_Ready(&DerivedType) < 0 || PyType_Ready(&VarType) < 0 ||
        PyType_Ready(&WordsType) < 0)
        return NULL;
    s_flush = PyUnicode_InternFromString("flush");
    s_fold = PyUnicode_InternFromString("fold");
    s_batch_ = PyUnicode_InternFromString("_batch");
    s_TRACER = PyUnicode_InternFromString("_TRACER");
    s_Start = PyUnicode_InternFromString("Start");
    s_Test = PyUnicode_InternFromString("Test");
    if (!s_batch_ || !s_TRACER ||
        !s_Start || !s_Test)
        return NULL;
    k_zero = PyLong_FromLong(0);
    k_minus1 = PyLong_FromLong(-1);
    for (int c = 0; c < N_UTAGS; c++)
        if (!(k_utag[c] = PyLong_FromLong(-16 - c)))
            return NULL;
    k_empty = PyTuple_New(0);
    k_fzero = PyFloat_FromDouble(0.0);
    k_seed = PyLong_FromLong(0x5EED);   /* _Batch's initial signature */
    if (!s_flush || !s_fold || !k_zero || !k_minus1 || !k_empty || !k_fzero || !k_seed)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    Py_INCREF(&VarType);
    Py_INCREF(&BatchType);
    Py_INCREF(&DerivedType);
    if (PyModule_AddObject(m, "VarBase", (PyObject *)&VarType) < 0 ||
        PyModule_AddObject(m, "BatchBase", (PyObject *)&BatchType) < 0 ||
        PyModule_AddObject(m, "Derived", (PyObject *)&DerivedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
