# The batch of one fusion and its signature log (included by _core.pyx).

cdef class BatchBase:
    """Fields of a fusion batch (declared in ``_core.pxd``; subclassed by
    fused_reductions.pending._Batch; the reference is pending._PyBatchBase)."""

    def __init__(self, Py_ssize_t threshold_words):
        batch_fill(self, threshold_words)


cdef int batch_fill(BatchBase b, Py_ssize_t threshold) except -1:
    if not ref.bound:
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
    b.f8_nonsum = ref.nod
    b.i8 = ref.nol
    b.i8_ops = ref.nol
    b.arrs = ref.nol
    b.kmap = ref.nod
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
    if b.cpos >= ref.log_cap:
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
    if len(log) >= ref.log_cap:
        b.fold()
    return 0
