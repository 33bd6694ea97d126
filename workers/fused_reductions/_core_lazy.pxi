# Lazy nodes of shared arithmetic and their evaluation (the reference: pending._Derived,
# lazy._eval, lazy._apply; included by _core.pyx).

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
    if fn is ref.add:
        return 1
    if fn is ref.sub:
        return 2
    if fn is ref.mul:
        return 3
    if fn is ref.div:
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
    if type(a) is ref.snap_type:   # a float64 scalar's base and pending entries (lazy._eval)
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
    return ref.eval_(d)


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


