# The compiled record buffer of the tracer (tracing.Tracer derives from it): the part
# other compiled modules call (see _tracer_core.pyx).

cdef class TracerCore:
    cdef public bint enabled
    cdef public long long cap, n, dropped, max_events
    cdef object _buf
    cdef long long *_rows
    cdef Py_ssize_t _len          # words of _buf

    cdef int record_c(self, long long kind, long long direction, long long peer, long long tag, long long nbytes,
                      long long t_start, long long t_end, long long wait, long long seq, long long chan,
                      long long count) except -1
