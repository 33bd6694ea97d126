# Shared arithmetic on float64 scalars and the creation of shared variables (the reference:
# values._f8_operand, values._f8_binary, SharedVar.__init__; included by _core.pyx).

cdef int log_uniform(object x, int code) except -1:
    """A uniform operand as two steps, the tag -16 - code then the value (both before the
    fold check, so a fold never separates them)."""
    cdef BatchBase b = st.batch
    if code < 0 or code >= 16:
        raise ValueError(f"nbmpi fused reductions: operation code {code} out of range")
    cdef list log = b.log
    log.append(k_utag[code])
    log.append(ref.nan_key if (type(x) is float and x != x) else x)
    if len(log) >= ref.log_cap:
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
    return ref.snap_type(base, e, float, ())


cdef VarBase new_lazy(object base):
    """A new float64 scalar shared result (a _LazyF8) with every field set; its id and
    signature key become Python ints only when read."""
    cdef VarBase r = <VarBase>new_instance(ref.lazy_type, k_noargs)
    st.next_id += 1
    r._cid1 = st.next_id
    r._base = base
    r._ents = ()
    r._sf = True
    r.dtype = ref.f8
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
    if type(value) is ndarray and ref.bound and (<object>value).ndim:
        return shared_array(value, name)
    if type(value) is float and ref.bound:
        if st.fuser is None:
            ref.make_fuser()
        vid = st.next_id
        st.next_id = vid + 1
        v = <VarBase>new_instance(ref.shared_type, k_noargs)
        v._cid1 = vid + 1          # the id becomes a Python int only when read (var_id)
        v.name = name
        v.dtype = ref.f8
        v.shape = ()
        v._base = value
        v._ents = ()
        v._oop = -1
        v._sf = True
        v._cast = float
        v._init = value
        if <double>value == <double>value:
            note_created(st.batch, vid, value)
        else:
            note_step(st.batch, (-8, vid, ref.nan_key))
        return v
    return ref.new_var(value, name=name)


cdef object shared_array(object value, object name):
    """shared(array) (the reference: SharedVar.__init__'s array case): a read-only copy;
    the creation value is logged as the crc32 of its bytes."""
    cdef VarBase v
    cdef long long vid
    dtype = value.dtype
    cast = ref.casters.get(dtype)
    if cast is None:      # a dtype not seen yet (or not supported): the reference decides
        return ref.new_var(value, name=name)
    if st.fuser is None:
        ref.make_fuser()
    copy = value.copy()
    copy.flags.writeable = False
    vid = st.next_id
    st.next_id = vid + 1
    v = <VarBase>new_instance(ref.shared_type, k_noargs)
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
    note_step(st.batch, (-8, vid, (-2, k_crc32(copy), copy.shape, dtype.num)))
    return v


