# The typed interface of the compiled core (_core.pyx and its include files):
#
# * Bindings: the pure-Python reference the core falls back to, the types it
#   creates and the constants it shares with it; built once by binding.py
#   (Bindings(**reference)) and handed over with bind(). The core reads
#   nothing else of the Python modules.
# * FuserState: the state of the process's Fuser that the compiled
#   hot paths read and write (counters, current batch, fusion buffer and
#   persistent requests, runner); one instance, _core.state, which
#   fusion.py keeps current.
# * BatchBase: the fields of a fusion batch (pending._Batch subclasses it).
# * Runner: how the force point starts and tests its persistent request
#   (_direct_mpi.DirectRunner subclasses it).


cdef class Runner:
    cdef int start(self, object req) except -1
    cdef int test(self, object req) except -1


cdef class BatchBase:
    cdef public object f8, f8_nonsum, i8, i8_ops, arrs, sig, nseg, words, allsum, log, kmap, res, error, folded
    cdef public Py_ssize_t room, nvars, cpos
    cdef public long long cnext
    cdef public bint done


cdef class Bindings:
    cdef readonly bint bound                # handed to the core by bind()
    # the reference methods of a shared variable the compiled operators fall back to
    # (values._PyVarBase's, called as plain functions)
    cdef readonly object reset, iadd, isub, imul, min_with, max_with, float_
    # ops: the reference's __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__
    cdef readonly tuple ops
    # the rest of the reference: lazy._force, lazy._eval, SharedVar (general creation),
    # fusion.fuser (creates the fuser), tracing's get_tracer, wire._same_signature
    cdef readonly object force, eval_, new_var, make_fuser, get_tracer, same_signature
    # the functions lazy nodes carry: operator.add, sub, mul, truediv
    cdef readonly object add, sub, mul, div
    # the types the core creates or recognises: SharedVar, _LazyF8, _Batch, _Snap, Grant
    cdef readonly type shared_type, lazy_type, batch_type, snap_type, grant_type
    cdef readonly tuple fast_types          # types taken as real numbers (values._REAL_FAST)
    cdef readonly tuple work                # working dtype per word kind: float64, int64, complex128
    cdef readonly dict casters              # dtype -> cast of an array shared variable (values._CASTERS)
    # constants shared with the reference: the float64 dtype, the log key of NaN, the batch's
    # "no dict/list yet" (_NOD, _NOL), the empty result list, the signature log's cap,
    # the trace kind of a fused collective, the Test polls before the interruptible wait
    cdef readonly object f8, nan_key, nod, nol
    cdef readonly list empty
    cdef readonly Py_ssize_t log_cap
    cdef readonly long kind_fused, spin
    cdef readonly bint tuplehash            # signature_hash computes hash((sig, L, tuple(log))) itself (bind)


cdef class FuserState:
    cdef public long long next_id           # id of the next shared variable (creation order)
    cdef public long long seq               # fused collectives run so far
    cdef public long long compiled_fusions  # of those, run by the compiled force points
    cdef public bint ready                  # connected, not broken, not strict: compiled force points may run
    cdef public object fuser               # the Fuser (flush, _wait, _fuse_failed, _divergence)
    cdef public BatchBase batch             # its current batch, which the hot paths fill
    cdef public Runner runner               # starts/tests the request; None: mpi4py's methods
    cdef BatchBase spare                    # the batch the last compiled fusion resolved (reused when free)
    cdef object buf                         # the fusion buffer (fuser._buf) ...
    cdef double *bufp                       # ... its words ...
    cdef Py_ssize_t buflen                  # ... and their number
    cdef dict preq                          # size class (or (size class, False)) -> persistent request
    cdef long long threshold, chan, size    # threshold in words, the trace channel, ranks
