# The shared variable type: its fields, contributions (x += a, x *= a, min_with, max_with,
# x += array, consume) and reading (the reference: values._PyVarBase, SharedVar._contribute,
# pools.SharedPool.consume; included by _core.pyx).

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
        if ref.bound:
            if self._sf:
                if t is float:
                    return fast_sum(self, <double>a, a)
                if is_fast_type(t):
                    return fast_sum(self, as_double(a), None)
            elif t is ndarray:
                r = contribute_array(self, 0, a)
                if r is not None:
                    return r
        return ref.iadd(self, a)

    def __isub__(self, a):
        if ref.bound and self._sf and is_fast_type(type(a)):
            return fast_sum(self, -as_double(a), None)
        return ref.isub(self, a)

    def __imul__(self, a):
        if ref.bound and self._sf and is_fast_type(type(a)):
            return contribute_f8(self, 1, as_double(a))
        return ref.imul(self, a)

    def min_with(self, a):
        """``x = min(x, min over ranks of a)`` (a rank-local) or elementwise min with shared ``a``. Lazy."""
        if ref.bound and self._sf and is_fast_type(type(a)):
            return contribute_f8(self, 2, as_double(a))
        return ref.min_with(self, a)

    def max_with(self, a):
        """``x = max(x, max over ranks of a)`` (a rank-local) or elementwise max with shared ``a``. Lazy."""
        if ref.bound and self._sf and is_fast_type(type(a)):
            return contribute_f8(self, 3, as_double(a))
        return ref.max_with(self, a)

    def _fast_sum(self, a):
        """x += a for a float64 scalar x and a real a (hot path)."""
        if not self._sf:
            raise TypeError("_fast_sum needs a float64 scalar shared variable")
        return fast_sum(self, float(a), None)

    def reset(self, value=None):
        """Set the variable back to its creation value, or to ``value``, which must be
        the same on every rank (checked at the next force point). Local, no force;
        pending contributions of this variable are dropped from its value."""
        if value is None and ref.bound and self._init is not None:
            self._base = self._init
            if self._e1b is not None or self._ents:
                self._ents = ()
                self._e1b = None
                self._ob = None
            return self
        return ref.reset(self, value)

    # -- reading ---------------------------------------------------------------------
    def __float__(self):
        cdef object ents, base = self._base, ent, v
        cdef Py_ssize_t ne
        cdef double x
        cdef BatchBase b = self._e1b
        if b is not None and ref.bound and type(base) is float:   # one float64 sum: base + the reduced word
            if not b.done:
                force_batch(b)
            v = <double>base + batch_word_at(b, self._e1i)
            self._base = v
            self._e1b = None
            return v
        ents = var_entries(self)
        if ref.bound and type(ents) is tuple:
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
                        and (<tuple>ent)[2] is k_zero and type((<tuple>ent)[1]) is ref.batch_type):
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
        return ref.float_(self)

    # -- shared arithmetic (float64 scalars; everything else: the reference) ----------
    # One C slot per operator serves both operand orders (c_api_binop_methods: the
    # Python subclasses SharedVar and _LazyF8 then inherit the slot itself, not a
    # generic wrapper that looks the method up); x is this type, or y is.
    def __add__(x, y):
        return additive(x, y, ref.add, 1, OP_ADD, OP_RADD)

    def __sub__(x, y):
        return additive(x, y, ref.sub, 2, OP_SUB, OP_RSUB)

    def __mul__(x, y):
        return scaling(x, y, ref.mul, 3, OP_MUL, OP_RMUL)

    def __truediv__(x, y):
        return scaling(x, y, ref.div, 4, OP_DIV, OP_RDIV)


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
    return (t is ref.lazy_type or t is ref.shared_type) and (<VarBase>o)._sf


cdef object additive(object x, object y, object fn, int code, int op, int rop):
    """x + y, x - y: compiled only for two float64 scalar shared operands (a rank-local
    operand is a contribution: the reference)."""
    if isinstance(x, VarBase):
        if ref.bound and (<VarBase>x)._sf and shared_f8(y):
            return f8_binary(fn, code, x, y, True, True)
        return ref.ops[op](x, y)
    return ref.ops[rop](y, x)


cdef object scaling(object x, object y, object fn, int code, int op, int rop):
    """x * y, x / y: also with float/int uniform operands."""
    cdef object t
    if isinstance(x, VarBase):
        if ref.bound and (<VarBase>x)._sf:
            t = type(y)
            if t is float or t is int:
                return f8_binary(fn, code, x, y, True, False)
            if shared_f8(y):
                return f8_binary(fn, code, x, y, True, True)
        return ref.ops[op](x, y)
    t = type(x)
    if ref.bound and (<VarBase>y)._sf and (t is float or t is int):
        return f8_binary(fn, code, x, y, False, True)
    return ref.ops[rop](y, x)


cdef object fast_sum(VarBase self, double a, object aobj):
    """x += a for a float64 scalar x (the reference: _PyVarBase._fast_sum); aobj: a as an exact float, or None."""
    cdef BatchBase b = st.batch
    if b is None:
        raise RuntimeError("nbmpi fused reductions: the fuser has no current batch yet; call "
                           "nbmpi.workers.fused_reductions.fuser() first")
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
        st.fuser.flush()
    return self


cdef object contribute_f8(VarBase self, int op, double a):
    """x *= a, x.min_with(a), x.max_with(a) for a float64 scalar x and a real a (the
    reference: SharedVar._contribute then _new_slot)."""
    cdef BatchBase b = st.batch
    if b is None:
        raise RuntimeError("nbmpi fused reductions: the fuser has no current batch yet; call "
                           "nbmpi.workers.fused_reductions.fuser() first")
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
    if b.f8_nonsum is ref.nod:
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
    if len(f8) + b.words > st.threshold:
        st.fuser.flush()
    return self



cdef object contribute_array(VarBase self, int op, object a):
    """x += a for a shared array x and an array a of its shape and working dtype (the
    reference: SharedVar._contribute's array case, then _new_slot); None if not that case."""
    cdef BatchBase b = st.batch
    cdef int kind = self._kind
    cdef Py_ssize_t i, w
    work = ref.work[kind]
    dt = a.dtype
    if (dt is not work and dt != work) or a.shape != self.shape:
        return None
    if self._ob is b and self._oop == op:   # accumulate in place: the reference
        return None
    acc = a.flatten()
    arrs = b.arrs
    if arrs is ref.nol:
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
    if b.kmap is ref.nod:
        b.kmap = {}
    b.kmap[k] = step
    note_step(b, k)
    if len(<list>b.f8) + b.words > st.threshold:
        st.fuser.flush()
    return self


def consume_f8(VarBase pool, request, floor):
    """pool.consume(request, floor) for a float64 scalar pool and real request and floor
    (the reference: pools.SharedPool.consume); None if not that case or the request is
    not a finite number >= 0 (the reference raises the error)."""
    cdef BatchBase b = st.batch
    cdef double r, fl
    cdef Py_ssize_t i
    if not (ref.bound and pool._sf and is_fast_type(type(request)) and is_fast_type(type(floor))):
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
        before = ref.snap_type(pool._base, ents, pool._cast, pool.shape)
    f8 = b.f8
    i = len(<list>f8)
    (<list>f8).append(r)
    flo = fl
    note_step(b, (-9, flo if fl == fl else ref.nan_key))
    grant = ref.grant_type(before, b, 0, i, r, flo, ())
    pool._ents = ents + ((4, b, 0, i, flo),)
    pool._ob = None
    if pool._lastb is not b:
        pool._lastb = b
        b.nvars += 1
    note_step(b, (var_id(pool) << 3) | 4)
    if len(<list>f8) + b.words > st.threshold:
        st.fuser.flush()
    return grant


