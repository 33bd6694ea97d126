# The compiled force points: signature, packing, the persistent request, result words
# (the reference: fusion.Fuser.flush and _reduce; included by _core.pyx).

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
    if not ref.tuplehash:
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


cdef int finish(object fuser, BatchBase b, Py_ssize_t L, long long t0, long long t1, int tag,
                array res) except -1:
    """After the collective: its trace event (tracer.record), then the signature check on the
    reduced header words res[0..3] (wire._same_signature; a mismatch is diagnosed)."""
    cdef long long seq = st.seq
    cdef double P = <double>st.size
    cdef double *w = res.data.as_doubles
    st.seq += 1
    tr = ref.get_tracer()
    if isinstance(tr, TracerCore):   # the compiled record buffer: record's C entry
        if (<TracerCore>tr).enabled:
            (<TracerCore>tr).record_c(ref.kind_fused, 0, -1, tag, L * 8, t0, t1, -1, seq, st.chan, b.nvars)
    elif tr.enabled:
        tr.record(ref.kind_fused, 0, -1, tag, L * 8, t0, t1, -1, seq, st.chan, b.nvars)
    if st.size <= 64:   # exact in float64 below 2**53
        same = (P * w[1] == w[0] * w[0]) and (P * w[3] == w[2] * w[2])
    else:
        same = ref.same_signature(st.size, res)
    if not same:
        raise fuser._divergence(b, L)
    return 0


cdef object fuse_failed(object fuser, BatchBase b, Py_ssize_t L, object exc):
    """Error of the collective: the Python handling (diagnosis, b.error) decides what to raise."""
    err = fuser._fuse_failed(b, L, exc)
    if err is exc:
        raise exc
    raise err from exc


cpdef object fuse(object fuser, BatchBase b):
    """Fuser.flush's hot path (only float64 scalar sums pending) in C.

    Returns the number of variables resolved, or None if the Python path must run
    (no buffer or persistent request of this size class yet). Same steps as the
    Python code: new current batch (the previous fusion's batch when nothing refers
    to it any more), signature words, pack, Start + Test polls (then fuser._wait),
    trace record, result words, signature check."""
    cdef list f8 = b.f8
    cdef Py_ssize_t n1 = len(f8), L = size_class(n1), i
    cdef double *d
    cdef long long t0, t1
    cdef array res
    if st.bufp == NULL or st.preq is None or st.buflen < L:
        return None
    req = st.preq.get(L)
    if req is None:
        return None
    next_batch()      # the next fusion starts now
    d = st.bufp
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
    run_request(fuser, b, req, L)
    t1 = now_ns()
    try:
        res = clone(k_words, n1, False)
        memcpy(res.data.as_doubles, st.bufp, n1 * sizeof(double))
        finish(fuser, b, L, t0, t1, 0, res)
        b.res = (res, ref.empty, ref.empty)
        b.done = True
    except BaseException as exc:   # b.error = the exception, as the Python path's `except BaseException`
        b.error = exc
        raise
    st.spare = b   # reused by a later fusion once nothing refers to it
    st.compiled_fusions += 1
    return b.nvars


cdef int force_batch(BatchBase b) except -1:
    """Make batch b resolved (a force point): the compiled force point when b is the current
    batch and the fuser is ready, else the Python _force (which flushes or raises b.error)."""
    if not b.done and b is st.batch and st.fuser is not None and st.ready and b.error is None:
        if b.nseg == 0 and b.allsum is True:
            if len(b.f8) > HEADER_WORDS:
                fuse(st.fuser, b)
        else:
            fuse_general(st.fuser, b)
    if not b.done:
        ref.force(b)
    return 0


cdef BatchBase next_batch():
    """Start the next fusion: a new current batch (the previous fusion's batch when nothing
    refers to it any more)."""
    cdef BatchBase nb
    if st.spare is not None and refcnt(<PyObject *>st.spare) == 1 and type(st.spare) is ref.batch_type:
        nb = st.spare
        st.spare = None
    else:
        nb = <BatchBase>new_instance(ref.batch_type, k_noargs)
    batch_fill(nb, st.threshold)
    st.batch = nb      # fuser.batch (a view of state.batch)
    return nb


cdef int run_request(object fuser, BatchBase b, object req, Py_ssize_t L) except -1:
    """Start the persistent request, a few Test polls, then the fuser's interruptible wait;
    an error goes through the fuser's diagnosis (fuser._fuse_failed) and is raised."""
    cdef Runner runner = st.runner if st.runner is not None else k_mpi4py
    cdef long k = 0
    cdef long long t0
    try:
        runner.start(req)
        t0 = now_ns()
        while True:   # Test polls for SPIN_NS (a partner a few us late is common), then the Python wait
            if runner.test(req):
                return 0
            k += 1
            if k >= ref.spin and (k & 31) == 0 and now_ns() - t0 > SPIN_NS:
                break
        fuser._wait(req, b, L)   # raises a diagnosed error
    except BaseException as exc:
        fuse_failed(fuser, b, L, exc)
    return 0


cpdef object fuse_general(object fuser, BatchBase b):
    """Fuser._reduce in C: any ops on float64/int64 scalars and on arrays (the
    ``MPI_SUM`` request when everything is a float64 sum, else the user-defined operation
    with the layout record after the header; see wire.layout_words).

    Returns the number of variables resolved, or None if the Python path must run (no
    buffer or persistent request of this size class yet)."""
    cdef list f8 = b.f8
    cdef object i8 = b.i8
    cdef Py_ssize_t n1 = len(f8), nf = n1 - HEADER_WORDS, n2 = len(i8), nseg = len(b.arrs)
    cdef bint allsum = b.allsum is True
    cdef Py_ssize_t nops = (nf + n2 + 7) // 8
    cdef Py_ssize_t nlay = 0 if allsum else LAYOUT_FIXED + nops + 4 * nseg
    cdef Py_ssize_t d = HEADER_WORDS + nlay, words = n1 + nlay + <Py_ssize_t>b.words
    cdef Py_ssize_t L = size_class(words), k, pos, seg0
    cdef double *buf = st.bufp
    cdef long long *lw = <long long *>st.bufp
    cdef long long t0, t1
    cdef array res
    cdef list places
    if buf == NULL or st.preq is None or st.buflen < L:
        return None
    req = st.preq.get(<object>L if allsum else (L, False))
    if req is None:
        return None
    next_batch()      # the next fusion starts now
    places = []
    try:
        write_signature(b, L, buf)
        for k in range(nf):
            buf[d + k] = <double>f8[HEADER_WORDS + k]
        if not allsum:
            write_layout(b, lw, nlay, L, nf, n2, nseg, nops)
        pos = d + nf
        for k in range(n2):
            lw[pos + k] = i8[k]
        seg0 = pos + n2
        pos = pack_segments(b, seg0, L, 0 if allsum else LAYOUT_FIXED + 4 + nops, places)
        if pos < L:
            memset(&buf[pos], 0, (L - pos) * 8)
    except BaseException as exc:
        b.error = exc
        raise
    t0 = now_ns()
    run_request(fuser, b, req, L)
    t1 = now_ns()
    try:
        res = clone(k_words, n1, False)
        memcpy(res.data.as_doubles, buf, HEADER_WORDS * sizeof(double))
        if nf:
            memcpy(&res.data.as_doubles[HEADER_WORDS], &buf[d], nf * sizeof(double))
        finish(fuser, b, L, t0, t1, 0 if allsum else 1, res)
        res_i8 = [lw[d + nf + k] for k in range(n2)] if n2 else ref.empty
        b.res = (res, res_i8, segment_results(seg0, pos, places) if nseg else [])
        b.done = True
    except BaseException as exc:
        b.error = exc
        raise
    st.spare = b       # reused by a later fusion once nothing refers to it
    st.compiled_fusions += 1
    return b.nvars


cdef int write_layout(BatchBase b, long long *lw, Py_ssize_t nlay, Py_ssize_t L, Py_ssize_t nf, Py_ssize_t n2,
                      Py_ssize_t nseg, Py_ssize_t nops) except -1:
    """The layout record after the header (wire.layout_words) but the segments' entries
    (pack_segments): (nlay, L, n_f8, n_i8, nseg), then one op byte per scalar word."""
    cdef signed char *opb = <signed char *>&lw[LAYOUT_FIXED + 4]
    cdef object i8_ops = b.i8_ops
    cdef Py_ssize_t k
    lw[4] = nlay
    lw[5] = L
    lw[6] = nf
    lw[7] = n2
    lw[8] = nseg
    memset(opb, 0, nops * 8)
    for i, op in b.f8_nonsum.items():
        opb[<Py_ssize_t>i - HEADER_WORDS] = op
    for k in range(n2):
        opb[nf + k] = i8_ops[k]
    return 0


cdef Py_ssize_t pack_segments(BatchBase b, Py_ssize_t pos, Py_ssize_t L, Py_ssize_t lay, list places) except -1:
    """Copy b's array segments into the fusion buffer from word ``pos`` on (an error if they
    pass word L), each one's layout entry (start, words, op, kind) at word ``lay`` on (0:
    ``MPI_SUM``, no layout record); ``places`` gets (offset from the first, words, kind).
    Returns the word after the last segment."""
    cdef object arrs = b.arrs
    cdef long long *lw = <long long *>st.bufp
    cdef Py_ssize_t k, w, seg0 = pos
    cdef Py_buffer view
    for k in range(len(arrs)):
        acc, op, kind = arrs[k]
        PyObject_GetBuffer(acc, &view, PyBUF_ANY_CONTIGUOUS)
        try:
            w = view.len // 8
            if pos + w > L:
                raise ValueError("nbmpi fused reductions: a segment does not fit its fusion buffer")
            memcpy(&st.bufp[pos], view.buf, w * 8)
        finally:
            PyBuffer_Release(&view)
        if lay:
            lw[lay + 4 * k] = pos
            lw[lay + 4 * k + 1] = w
            lw[lay + 4 * k + 2] = op
            lw[lay + 4 * k + 3] = kind
        places.append((pos - seg0, w, kind))
        pos += w
    return pos


cdef list segment_results(Py_ssize_t seg0, Py_ssize_t end, list places):
    """The reduced array segments (words seg0..end of the buffer): one copy, each segment's
    result a view of it in its working dtype."""
    cdef list out = []
    block = st.buf[seg0:end].copy()
    for o, w, kind in places:
        part = block[o:o + w]
        out.append(part if kind == 0 else part.view(np.int64 if kind == 1 else np.complex128))
    return out


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

