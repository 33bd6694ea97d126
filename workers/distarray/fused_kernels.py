"""The fused kernel compiler: one numba-compiled loop nest per chain of elementwise operations.

A recorded chain such as ``0.2 * (c + n + s + e + w)`` (and reductions and stores fused with
it) becomes ONE generated Python function, compiled by numba, that reads every operand once
per element, keeps intermediate values in registers and writes only the results: no
temporary array per operation. Kernels are cached by the *shape* of the expression (the
operations, dtypes, which operand axes broadcast, which strides are unit), never by values:
scalars and strides are arguments, so the second time step of a program compiles nothing.

Every array argument is passed as ``(flat C-contiguous buffer, element offset, strides...)``:
the plan computes offsets and strides from the views by arithmetic, and an innermost unit
stride is known at compile time (so LLVM sees a unit-stride inner loop and vectorizes it).
Indexes are cast to unsigned integers, which spares numba's negative-index test on every
access (measured: 2.5x slower without it on the 5-point stencil).

Results are NumPy's bit for bit where NumPy's are defined by IEEE rounding: kernels are compiled without
``fastmath`` (no FMA contraction, no reassociation, no reciprocal for a division), and a float ``sum``/``mean``
along the innermost axis stores the row's values and adds them in NumPy's pairwise order
(:func:`_pairwise_source`). Transcendental functions are numba's (the C library's) and can differ from
NumPy's SIMD loops in the last bit; by default they are not compiled here at all (:mod:`.numpy_math`).

Generated sources are written to a cache directory (``NBMPI_DISTARRAY_CACHE``, default
``~/.cache/nbmpi/distarray-kernels-<versions>``; ``off`` keeps them in memory only) and
compiled with ``numba.njit(cache=True)``, so a later process loads the machine code instead
of compiling it. :func:`kernel_stats` counts signatures compiled and loaded.

The on-disk cache, one per machine and user:

* where: ``<dir>/k_<digest>.py`` (the generated source) and numba's ``<dir>/__pycache__/k_<digest>-*.nbi``
  (index) and ``.nbc`` (machine code per signature);
* keyed by: the digest (blake2b) of the generated source, which spells out everything that shapes the
  kernel (operations, dtypes, broadcast axes, unit inner strides, reductions); numba's index adds the
  argument types, the source file's mtime and size, and the CPU name and features;
* invalidated by: a new Python, numba or NumPy version (the directory name holds all three); a changed
  code generator makes new sources, hence new digests (old files are merely unused); delete the directory
  to reclaim the space;
* several processes at once: a source file is written under a private temporary name and hard-linked
  into place, so the first writer wins and the file never changes (numba's index stays valid); numba
  writes its index and machine code the same way (temporary file, then ``os.replace``).

Measured: a new process reusing the cache compiles nothing (``kernel_stats()["compiled"] == 0``). What
remains of its first run's extra time is not compilation: numba's one-time start (~1 s under load, its
typing and target contexts; started in a background thread on import, :mod:`nbmpi.workers.core.jit_warmup`,
so the first kernel waits only for what is left of it), loading each kernel's machine code (10-40 ms per
signature), building the communication plans (per layout, kept in memory for the process's later runs) and
faulting in fresh pages for the first buffers (later runs reuse them: :class:`~.context.BufferCache`).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numba
import numpy as np

from ..core.switches import OFF_WORDS

__all__ = ["UNARY", "BINARY", "SUPPORTED_UFUNCS", "KernelSpec", "get_kernel", "kernel_stats", "transpose_copy",
           "cache_dir"]

# ufunc name -> numba expression template ({0}, {1}: the arguments, already cast to the loop dtypes)
UNARY: Dict[str, str] = {
    "negative": "(-{0})", "positive": "(+{0})", "absolute": "abs({0})", "square": "({0} * {0})",
    "sqrt": "np.sqrt({0})", "exp": "np.exp({0})", "log": "np.log({0})", "sin": "np.sin({0})",
    "cos": "np.cos({0})", "tan": "np.tan({0})", "log10": "np.log10({0})", "tanh": "np.tanh({0})",
    "floor": "np.floor({0})", "ceil": "np.ceil({0})", "rint": "np.rint({0})", "isnan": "np.isnan({0})", "isfinite": "np.isfinite({0})",
    "logical_not": "(not {0})", "cast": "{0}",
}
BINARY: Dict[str, str] = {
    "add": "({0} + {1})", "subtract": "({0} - {1})", "multiply": "({0} * {1})", "divide": "({0} / {1})",
    "true_divide": "({0} / {1})", "power": "({0} ** {1})",
    # Python's % and // for integers (error_model='numpy' gives NumPy's 0 for a division by zero); for floats
    # NumPy's npy_divmod with quiet comparisons (_float_divmod_source)
    "remainder": "({0} % {1})", "floor_divide": "({0} // {1})",
    "less": "({0} < {1})", "less_equal": "({0} <= {1})", "greater": "({0} > {1})",
    "greater_equal": "({0} >= {1})", "equal": "({0} == {1})", "not_equal": "({0} != {1})",
    "logical_and": "({0} and {1})", "logical_or": "({0} or {1})", "bitwise_and": "({0} & {1})",
    "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})", "arctan2": "np.arctan2({0}, {1})",
    "maximum": "max", "minimum": "min",  # NaN-propagating forms generated below
}
#: Every ufunc name the fused kernels implement (plus ``where``).
SUPPORTED_UFUNCS = tuple(sorted(set(UNARY) - {"cast"} | set(BINARY)))
_LOGICAL = ("logical_and", "logical_or", "logical_not")

_lock = threading.Lock()
_KERNELS: Dict[Any, Any] = {}
_STATS = dict(generated=0, memory_hits=0)
_COUNTS: Dict[int, Tuple[int, Tuple[int, int, int]]] = {}   # id(kernel) -> (overloads, counts); kernels live forever


def cache_dir() -> Optional[str]:
    """Where generated kernel sources (and numba's machine code next to them) are kept; None when
    ``NBMPI_DISTARRAY_CACHE=off`` or the directory cannot be created."""
    raw = os.environ.get("NBMPI_DISTARRAY_CACHE", "").strip()
    if raw.lower() in OFF_WORDS:
        return None
    if not raw:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        raw = os.path.join(base, "nbmpi", f"distarray-kernels-py{sys.version_info[0]}{sys.version_info[1]}-"
                                          f"numba{numba.__version__}-np{np.__version__}")
    try:
        os.makedirs(raw, exist_ok=True)
    except OSError:
        return None
    return raw if os.access(raw, os.W_OK) else None


def _np_name(dt: np.dtype) -> str:
    return "bool_" if dt.kind == "b" else dt.name


def _cast(expr: str, frm: np.dtype, to: np.dtype) -> str:
    """``expr`` (of dtype ``frm``) converted to ``to`` in numba code."""
    if frm == to:
        return expr
    if to.kind == "b":
        return f"({expr} != 0)"
    if frm.kind == "f" and to.kind in "iu":
        return _float_to_int(expr, frm, to)
    return f"np.{_np_name(to)}({expr})"


#: Whether NumPy's float-to-integer casts are x86's (:func:`_float_to_int`).
_X86 = platform.machine().lower() in ("x86_64", "amd64")


def _float_to_int(expr: str, frm: np.dtype, to: np.dtype) -> str:
    """``expr`` (float dtype ``frm``) cast to integer dtype ``to`` with NumPy's values and "invalid value" flags
    on x86-64, also for NaN, infinities and values out of ``to``'s range, whatever the loop's vectorization.
    NumPy's cast loops convert with x86's truncating conversion, which gives the "integer indefinite" (the lowest
    int32 or int64) for what does not fit: to int8/int16/uint8/uint16 through int32 then wrapped (300.0 -> int8
    44, 40000.0 -> int16 -25536, inf -> 0); to int32 and int64 directly; to uint32/uint64 through int32/int64 of
    ``x - 2**31`` (``2**63``) with the top bit flipped for ``x`` from there up (-3.0 -> 2**32 - 3, 1e10 -> 0,
    nan -> 2**31). That is NumPy's vectorized loop; NumPy's own scalar loop (arrays under 4 elements, the last
    ``n % 4``, strided ones) converts to uint32 through int64 instead (1e10 -> 1410065408, nan -> 0), so NumPy
    itself gives both for the same value. LLVM's own narrow casts of out-of-range values are undefined: vectorized loops saturated and
    scalar ones did not, so results depended on the block sizes (on the rank count). One conversion per element,
    so the invalid flag is set exactly for the elements NumPy's is. Elsewhere (aarch64, whose conversions
    saturate) negative floats to unsigned integers wrap through int64, as NumPy's, the rest is numba's cast."""
    t = _np_name(to)
    f = f"np.{_np_name(frm)}"
    if not _X86:
        if to.kind == "u":
            return f"(np.{t}(np.int64({expr})) if abs({expr}) < 9.2e18 else np.{t}({expr}))"
        return f"np.{t}({expr})"
    if to.itemsize < 4:
        return f"np.{t}(np.int32({expr}))"
    if to.kind == "i":
        return f"np.{t}({expr})"
    s = "int32" if to.itemsize == 4 else "int64"
    big = f"{f}({float(2 ** (to.itemsize * 8 - 1))!r})"
    low = -2 ** (to.itemsize * 8 - 1)
    return (f"np.{t}(np.{s}({expr} - {big} if {expr} >= {big} else {expr}) ^ "
            f"(np.{s}({low}) if {expr} >= {big} else np.{s}(0)))")


def _identity(op: str, dt: np.dtype) -> str:
    """The identity of reduction ``op`` in dtype ``dt`` as a numba literal expression."""
    if op in ("sum", "mean"):
        return "False" if dt.kind == "b" else f"np.{_np_name(dt)}(0)"
    if op == "prod":
        return "True" if dt.kind == "b" else f"np.{_np_name(dt)}(1)"
    if op == "any":
        return "False"
    if op == "all":
        return "True"
    big = op == "min"
    if dt.kind == "b":
        return "True" if big else "False"
    if dt.kind == "f":
        return f"np.{_np_name(dt)}({'np.inf' if big else '-np.inf'})"
    info = np.iinfo(dt)
    return f"np.{_np_name(dt)}({info.max if big else info.min})"


def _combine(op: str, acc: str, v: str, dt: np.dtype) -> str:
    """The expression combining accumulator ``acc`` with value ``v`` (both of dtype ``dt``)."""
    if op in ("sum", "mean"):
        return f"({acc} + {v})"
    if op == "prod":
        return f"({acc} * {v})"
    if op == "any":
        return f"({acc} or {v})"
    if op == "all":
        return f"({acc} and {v})"
    cmp = "<" if op == "min" else ">"
    if dt.kind == "f":      # a tie (0.0 and -0.0) gives the later element (NumPy's for rows under 8 elements)
        return f"({v} if ({v} != {v} or ({acc} == {acc} and _qk({v}) {cmp}= _qk({acc}))) else {acc})"
    return f"({v} if {v} {cmp} {acc} else {acc})"


#: The decorator of every generated function, without its closing parenthesis. ``CACHE`` is set by the
#: header :func:`_load_module` puts before the source: True in a file of the cache directory, else False.
_JIT = "@numba.njit(cache=CACHE, nogil=True"


#: ``_qk(x)``: an int64 whose order is the order of float ``x`` (float32 or float64, not NaN; -0.0 and 0.0 the
#: same key). A compiled ``x < y`` of floats becomes a vector compare that sets the processor's "invalid" flag when
#: it meets a NaN (x86's ``cmpltpd`` signals); NumPy's comparisons, ``maximum``/``minimum`` and max/min reductions
#: are quiet. So the kernels order floats by these integer keys, after quiet ``==`` tests for NaN
#: (:func:`_quiet_compare`): a NaN in the data raises no flag, and an "invalid value" flag of a fused loop comes from
#: its arithmetic alone (``np.where(a > 0, a * 2, 0)`` over data with NaNs is quiet, as in NumPy). Measured on a
#: 1M-element ``a * 2 if a >= 0.5`` loop: 6 % slower than the signalling compare. Emitted into a kernel's source
#: when it compares floats.
_QK_SOURCE = (f"{_JIT}, inline='always')\n"
              "def _qk(x):\n"
              "    i = np.float64(x + 0.0).view(np.int64)\n"
              "    return i ^ ((i >> 63) & 0x7fffffffffffffff)\n\n\n")

#: The Python comparison operator of each ordering ufunc.
_ORDERING = {"less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">="}


def _quiet_compare(a: str, op: str, b: str) -> str:
    """Numba code of ``a op b`` (``op`` one of ``<``, ``<=``, ``>``, ``>=``) for floats ``a`` and ``b`` (variable names
    or literals) that sets no floating-point flag for a NaN: False when either is NaN, as the IEEE comparison."""
    return f"({a} == {a} and {b} == {b} and _qk({a}) {op} _qk({b}))"


def _int_division_checks(name: str, argv: Sequence[int], argdt: Sequence[str], indt: Sequence[str]) -> List[str]:
    """Statements after an integer ``floor_divide``/``remainder`` setting bits of the kernel's return value ``zf``:
    1 for a zero divisor, 2 for the lowest signed integer floor-divided by -1 (the flags NumPy's loops set: "divide
    by zero encountered in floor_divide", "overflow ..."; the caller raises them, :func:`~.fp_errors.raise_flags`).
    No statement for other operations."""
    it = np.dtype(indt[0])
    if name not in ("floor_divide", "remainder") or it.kind not in "iu":
        return []
    a, b = [_cast(f"v{v}", np.dtype(dt), np.dtype(t)) for v, dt, t in zip(argv, argdt, indt)]
    out = [f"if {b} == 0: zf |= 1"]
    if name == "floor_divide" and it.kind == "i":
        t = _np_name(it)
        out.append(f"if {b} == -1 and {a} == np.{t}({np.iinfo(it).min + 1}) - np.{t}(1): zf |= 2")
    return out


def _float_divmod_source(dt: np.dtype) -> str:
    """Numba functions ``_fdiv_<dtype>(a, b)`` and ``_fmod_<dtype>(a, b)``: NumPy's float ``floor_divide`` and
    ``remainder`` (``npy_divmod``: ``fmod``, the sign fix-up, the rounding of the quotient; ``a / b`` and ``fmod``
    for a zero ``b``) with its quiet comparisons (C's ``isless``, ``isgreater``), so that NaN operands set no
    "invalid value" flag (numba's ``//`` and ``%`` of floats compare with signalling instructions). Emitted into a
    kernel's source when needed, after :data:`_QK_SOURCE`."""
    t = _np_name(dt)
    return (f"{_JIT}, inline='always')\n"
            f"def _neg_{t}(x):\n"
            f"    return x == x and _qk(x) < 0\n\n\n"
            f"{_JIT}, inline='always')\n"
            f"def _fmod_{t}(a, b):\n"
            f"    mod = np.fmod(a, b)\n"
            f"    if b == 0:\n"
            f"        return mod\n"
            f"    if mod != 0:\n"
            f"        if _neg_{t}(b) != _neg_{t}(mod):\n"
            f"            mod += b\n"
            f"    else:\n"
            f"        mod = np.copysign(np.{t}(0), b)\n"
            f"    return mod\n\n\n"
            f"{_JIT}, inline='always')\n"
            f"def _fdiv_{t}(a, b):\n"
            f"    if b == 0:\n"
            f"        return a / b\n"
            f"    mod = np.fmod(a, b)\n"
            f"    div = (a - mod) / b\n"
            f"    if mod != 0:\n"
            f"        if _neg_{t}(b) != _neg_{t}(mod):\n"
            f"            div -= np.{t}(1)\n"
            f"    if div != 0:\n"
            f"        fd = np.floor(div)\n"
            f"        h = div - fd\n"
            f"        if h == h and _qk(h) > _qk(np.{t}(0.5)):\n"
            f"            fd += np.{t}(1)\n"
            f"    else:\n"
            f"        fd = np.copysign(np.{t}(0), a / b)\n"
            f"    return fd\n\n\n")


def _pairwise_source(dt: np.dtype) -> str:
    """Numba functions ``_pairwise_<dtype>(a, lo, n)``: the sum of ``a[lo:lo + n]`` added in NumPy's order
    (``pairwise_sum`` of NumPy's ``add.reduce`` along a row: under 8 elements one by one from -0.0; up to 128
    in 8 interleaved partial sums combined as a tree, the rest one by one; a longer row is split in two
    halves, the first a multiple of 8 long, summed alike and added). The halving runs on an explicit stack
    (numba's on-disk cache cannot hold a recursive function). Emitted into a kernel's source when needed."""
    t = _np_name(dt)
    acc = "".join(f"r{j} = r{j} + a[lo + i + {j}]\n" + " " * 12 for j in range(8)).rstrip()
    init = "; ".join(f"r{j} = a[lo + {j}]" for j in range(8))
    return (f"{_JIT})\n"
            f"def _pwleaf_{t}(a, lo, n):\n"
            f"    if n < 8:\n"
            f"        res = np.{t}(-0.0)\n"
            f"        for i in range(n):\n"
            f"            res = res + a[lo + i]\n"
            f"        return res\n"
            f"    {init}\n"
            f"    i = 8\n"
            f"    m = n - n % 8\n"
            f"    while i < m:\n"
            f"        {acc.replace(' ' * 12, ' ' * 8)}\n"
            f"        i += 8\n"
            f"    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))\n"
            f"    while i < n:\n"
            f"        res = res + a[lo + i]\n"
            f"        i += 1\n"
            f"    return res\n\n\n"
            f"{_JIT})\n"
            f"def _pairwise_{t}(a, lo, n):\n"
            f"    if n <= 128:\n"
            f"        return _pwleaf_{t}(a, lo, n)\n"
            f"    slo = np.empty(200, np.int64)\n"
            f"    sn = np.empty(200, np.int64)\n"
            f"    sst = np.empty(200, np.int64)\n"
            f"    vals = np.empty(100, np.{t})\n"
            f"    slo[0] = lo; sn[0] = n; sst[0] = 0\n"
            f"    top = 1\n"
            f"    nv = 0\n"
            f"    while top > 0:\n"
            f"        top -= 1\n"
            f"        l = slo[top]; m = sn[top]\n"
            f"        if sst[top] == 1:\n"
            f"            nv -= 1\n"
            f"            vals[nv - 1] = vals[nv - 1] + vals[nv]\n"
            f"        elif m <= 128:\n"
            f"            vals[nv] = _pwleaf_{t}(a, l, m)\n"
            f"            nv += 1\n"
            f"        else:\n"
            f"            n2 = m // 2\n"
            f"            n2 -= n2 % 8\n"
            f"            sst[top] = 1\n"
            f"            slo[top + 1] = l + n2; sn[top + 1] = m - n2; sst[top + 1] = 0\n"
            f"            slo[top + 2] = l; sn[top + 2] = n2; sst[top + 2] = 0\n"
            f"            top += 3\n"
            f"    return vals[0]\n\n\n")


class KernelSpec:
    """Everything that determines a generated kernel's source (hashable; the cache key).

    * ``ndim``: loop nest depth (the iteration's internal shape);
    * ``arrays``: per array argument ``(dtype str, bcast flags per axis, unit inner stride)``;
    * ``nscalars``: scalar arguments;
    * ``stmts``: ``('ld', var, array)``, ``('sc', var, scalar)``,
      ``('op', var, name, argvars, argdtypes, in_dtypes, out_dtype)``,
      ``('st', array, var, var_dtype)``, ``('rd', reduction, var, var_dtype)``;
    * ``reductions``: per reduction ``(op, axis, acc dtype str, target array)``; ``axis`` None
      accumulates everything into one element, else the target is indexed by the other axes.
    """

    __slots__ = ("ndim", "arrays", "nscalars", "stmts", "reductions", "key", "_src", "_argplan")

    def __init__(self, ndim: int, arrays: Sequence[Tuple], nscalars: int, stmts: Sequence[Tuple],
                 reductions: Sequence[Tuple]):
        self.ndim = ndim
        self.arrays = tuple(arrays)
        self.nscalars = nscalars
        self.stmts = tuple(stmts)
        self.reductions = tuple(reductions)
        self.key = (ndim, self.arrays, nscalars, self.stmts, self.reductions)
        self._src: Optional[str] = None
        # per array: which stride arguments are passed (not broadcast, not a unit inner stride)
        self._argplan = tuple(tuple(k for k in range(ndim) if not bc[k] and not (k == ndim - 1 and unit))
                              for (_, bc, unit) in self.arrays)

    def stride_args(self, a: int) -> Tuple[int, ...]:
        """The axes whose stride is passed as an argument for array ``a``."""
        return self._argplan[a]

    # -- code generation ------------------------------------------------------------
    def _index(self, a: int) -> str:
        _, bc, unit = self.arrays[a]
        terms = [f"o{a}"]
        for k in range(self.ndim):
            if bc[k]:
                continue
            if k == self.ndim - 1 and unit:
                terms.append(f"i{k}")
            else:
                terms.append(f"i{k} * s{a}_{k}")
        # an unsigned index: numba then skips the negative-index wraparound test on every access
        return "np.uint64(" + " + ".join(terms) + ")"

    def source(self, name: str) -> str:
        """The Python source of the kernel function ``name``."""
        if self._src is not None:
            return self._src.replace("def __KERNEL__", f"def {name}")
        d = self.ndim
        params = [f"n{k}" for k in range(d)]
        for a in range(len(self.arrays)):
            params += [f"b{a}", f"o{a}"] + [f"s{a}_{k}" for k in self._argplan[a]]
        params += [f"c{s}" for s in range(self.nscalars)]
        lines: List[str] = [f"def __KERNEL__({', '.join(params)}):"]
        ind = "    "
        red_scalar_outer: List[int] = []   # accumulate everything into a scalar
        red_scalar_inner: List[int] = []   # innermost-axis reduction: scalar per outer position
        red_inplace: List[int] = []        # accumulate in place into the target array
        for r, (op, axis, adt, tgt) in enumerate(self.reductions):
            dt = np.dtype(adt)
            if axis is None:
                red_scalar_outer.append(r)
                lines.append(f"{ind}r{r} = {_identity(op, dt)}")
            elif axis == d - 1 and d >= 2:
                red_scalar_inner.append(r)
            else:
                red_inplace.append(r)
                lines += self._init_loops(tgt, _identity(op, dt), ind)
        pairwise = [r for r in red_scalar_inner if self._pairwise(r)]
        for r in pairwise:
            lines.append(f"{ind}t{r} = np.empty(n{d - 1}, np.{_np_name(np.dtype(self.reductions[r][2]))})")
        body_ind = ind
        for k in range(d):
            if k == d - 1:
                for r in red_scalar_inner:
                    op, _, adt, _ = self.reductions[r]
                    lines.append(f"{body_ind}r{r} = {_identity(op, np.dtype(adt))}")
            lines.append(f"{body_ind}for i{k} in range(n{k}):")
            body_ind += ind
        lines += self._body_lines(body_ind, pairwise, red_inplace)
        # after the innermost loop (inside the next-to-innermost one): innermost-axis reductions
        if red_scalar_inner:
            after = ind * d  # indentation of the body of loop d-2
            for r in red_scalar_inner:
                op, _, adt, tgt = self.reductions[r]
                if r in pairwise:
                    lines.append(f"{after}if n{d - 1} >= 8:")
                    lines.append(f"{after}    r{r} = {_identity(op, np.dtype(adt))} + "
                                 f"_pairwise_{_np_name(np.dtype(adt))}(t{r}, 0, n{d - 1})")
                val = f"r{r}"
                if op == "mean":   # NumPy divides by an intp count: in float64, then casts (float32 too)
                    val = f"r{r} / n{d - 1}"
                lines.append(f"{after}b{tgt}[{self._index(tgt)}] = {_cast(val, np.dtype(np.float64) if op == 'mean' else np.dtype(adt), np.dtype(self.arrays[tgt][0]))}")
        for r in red_scalar_outer:
            tgt = self.reductions[r][3]
            lines.append(f"{ind}b{tgt}[o{tgt}] = r{r}")
        for r in red_inplace:
            op, axis, adt, tgt = self.reductions[r]
            if op == "mean" and axis is not None and axis > 0:
                lines += self._init_loops(tgt, None, ind, divide=f"n{axis}")
        if any(" zf |= " in line for line in lines):    # an integer division's flags (_int_division_checks)
            lines.insert(1, f"{ind}zf = 0")
            lines.append(f"{ind}return zf")
        else:
            lines.append(f"{ind}return 0")
        helpers = "".join(_pairwise_source(np.dtype(t)) for t in sorted({self.reductions[r][2] for r in pairwise}))
        body = "\n".join(lines) + "\n"
        for t in ("float32", "float64"):
            if f"_fdiv_{t}(" in body or f"_fmod_{t}(" in body:
                helpers = _float_divmod_source(np.dtype(t)) + helpers
        self._src = (_QK_SOURCE if "_qk(" in body + helpers else "") + helpers + body
        return self._src.replace("def __KERNEL__", f"def {name}")

    def _body_lines(self, body_ind: str, pairwise: List[int], red_inplace: List[int]) -> List[str]:
        """The innermost loop's statements of :meth:`source` (loads, scalars, operations, stores and
        reduction updates), indented by ``body_ind``."""
        d = self.ndim
        lines: List[str] = []
        for st in self.stmts:
            tag = st[0]
            if tag == "ld":
                _, v, a = st
                lines.append(f"{body_ind}v{v} = b{a}[{self._index(a)}]")
            elif tag == "sc":
                _, v, s = st
                lines.append(f"{body_ind}v{v} = c{s}")
            elif tag == "op":
                _, v, name, argv, argdt, indt, outdt = st
                lines.append(f"{body_ind}v{v} = {self._op_expr(name, argv, argdt, indt, outdt)}")
                lines += [body_ind + c for c in _int_division_checks(name, argv, argdt, indt)]
            elif tag == "st":
                _, a, v, vdt = st
                adt = np.dtype(self.arrays[a][0])
                lines.append(f"{body_ind}b{a}[{self._index(a)}] = {_cast(f'v{v}', np.dtype(vdt), adt)}")
            elif tag == "rd":
                _, r, v, vdt = st
                op, axis, adt, tgt = self.reductions[r]
                dt = np.dtype(adt)
                val = _cast(f"v{v}", np.dtype(vdt), dt)
                if r in pairwise:   # rows under 8 long add one by one (NumPy too): no call for them
                    lines.append(f"{body_ind}t{r}[i{d - 1}] = {val}")
                    lines.append(f"{body_ind}r{r} = {_combine(op, f'r{r}', f't{r}[i{d - 1}]', dt)}")
                elif r in red_inplace:
                    idx = self._index(tgt)
                    lines.append(f"{body_ind}b{tgt}[{idx}] = {_combine(op, f'b{tgt}[{idx}]', val, dt)}")
                else:
                    lines.append(f"{body_ind}r{r} = {_combine(op, f'r{r}', val, dt)}")
        return lines

    def _pairwise(self, r: int) -> bool:
        """Whether innermost-axis reduction ``r`` adds in NumPy's pairwise order: a float ``sum``/``mean`` in the
        values' own dtype (NumPy casts in 8192-element buffers otherwise), as NumPy's ``add.reduce`` does along
        a row, contiguous or strided. (NumPy adds one by one instead when the summed axis is not the innermost
        in memory, a transposed operand: a distributed ``.T`` is a copy by then, so that case differs in the
        order of the additions.)"""
        op, _, adt, _ = self.reductions[r]
        if op not in ("sum", "mean") or np.dtype(adt).kind != "f":
            return False
        return not any(st[0] == "rd" and st[1] == r and np.dtype(st[3]) != np.dtype(adt) for st in self.stmts)

    def _init_loops(self, a: int, value: Optional[str], ind: str, divide: Optional[str] = None) -> List[str]:
        """Loops over the non-broadcast axes of array ``a`` setting every element to ``value``
        (or dividing it by ``divide``)."""
        _, bc, _ = self.arrays[a]
        out: List[str] = []
        cur = ind
        for k in range(self.ndim):
            if bc[k]:
                out.append(f"{cur}i{k} = 0")
                continue
            out.append(f"{cur}for i{k} in range(n{k}):")
            cur += "    "
        idx = self._index(a)
        if divide is None:
            out.append(f"{cur}b{a}[{idx}] = {value}")
        else:
            out.append(f"{cur}b{a}[{idx}] = b{a}[{idx}] / {divide}")
        return out

    @staticmethod
    def _op_expr(name: str, argv, argdt, indt, outdt) -> str:
        outdt = np.dtype(outdt)
        if name in _LOGICAL:
            args = [_cast(f"v{v}", np.dtype(dt), np.dtype(np.bool_)) for v, dt in zip(argv, argdt)]
        else:
            args = [_cast(f"v{v}", np.dtype(dt), np.dtype(it)) for v, dt, it in zip(argv, argdt, indt)]
        if name == "where":
            c = _cast(f"v{argv[0]}", np.dtype(argdt[0]), np.dtype(np.bool_))
            return f"({args[1]} if {c} else {args[2]})"
        if name in ("maximum", "minimum"):
            cmp = ">" if name == "maximum" else "<"
            a, b = args
            if np.dtype(indt[0]).kind == "f":    # NaN: the NaN operand (the first if both); a tie: the second
                expr = f"({a} if ({a} != {a} or ({b} == {b} and _qk({a}) {cmp} _qk({b}))) else {b})"
            else:
                expr = f"({a} if {a} {cmp}= {b} else {b})"
            return _cast(expr, np.dtype(indt[0]), outdt)
        if name in _ORDERING and np.dtype(indt[0]).kind == "f":
            return _cast(_quiet_compare(args[0], _ORDERING[name], args[1]), np.dtype(np.bool_), outdt)
        tmpl = UNARY.get(name) or BINARY[name]
        if name in ("floor_divide", "remainder") and np.dtype(indt[0]).kind == "f":
            tmpl = f"_{'fdiv' if name == 'floor_divide' else 'fmod'}_{_np_name(np.dtype(indt[0]))}({{0}}, {{1}})"
        if name in ("floor_divide", "remainder") and np.dtype(indt[0]).kind == "i":
            # NumPy's MIN // -1 is MIN (wrapped, as -MIN) and MIN % -1 is 0, where numba's division gives 0
            tmpl = "(-{0} if {1} == -1 else {0} // {1})" if name == "floor_divide" else "(0 if {1} == -1 else {0} % {1})"
        expr = tmpl.format(*args)
        if name == "cast":
            return _cast(expr, np.dtype(indt[0]), outdt)
        natural = np.dtype(np.bool_) if name in ("less", "less_equal", "greater", "greater_equal", "equal",
                                                 "not_equal", "isnan", "isfinite") or name in _LOGICAL \
            else None
        if natural is not None:
            return _cast(expr, natural, outdt)
        # arithmetic: numba may widen (int32 + int32 -> int64); cast back to NumPy's result dtype
        return f"np.{_np_name(outdt)}({expr})" if outdt.kind != "b" else f"(({expr}) != 0)"


def _load_module(name: str, src: str):
    """Compile ``src`` as module ``name``: from a file in the cache directory (numba's on-disk cache
    works there) or, without one, in memory."""
    d = cache_dir()
    header = "import numpy as np\nimport numba\n\nCACHE = {}\n\n"
    if d is not None:
        path = os.path.join(d, f"{name}.py")
        full = header.format(True) + src
        try:
            if not os.path.exists(path):
                # the first writer wins and the file never changes afterwards: numba's index of the machine
                # code is keyed by the source file's mtime and size, so a second writer replacing it (same
                # text, new mtime) would make every later process recompile once
                tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
                with open(tmp, "w") as f:
                    f.write(full)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass
                finally:
                    os.unlink(tmp)
            spec = importlib.util.spec_from_file_location(f"nbmpi_distarray_kernels_{name}", path)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
            return mod
        except OSError:
            pass
    import types

    mod = types.ModuleType(f"nbmpi_distarray_kernels_{name}")
    # numba's cache needs a source file: without one (``NBMPI_DISTARRAY_CACHE=off``, a read-only directory) the
    # kernel and its helpers (``CACHE`` in their decorators) are compiled in memory only
    exec(compile(header.format(False) + src, f"<nbmpi distarray kernel {name}>", "exec"), mod.__dict__)  # noqa: S102
    return mod


def get_kernel(spec: KernelSpec):
    """The compiled kernel (a numba dispatcher) for ``spec``; generated and compiled on first use,
    then cached in memory (and on disk, see the module doc). Local, no communication."""
    k = _KERNELS.get(spec.key)
    if k is not None:
        _STATS["memory_hits"] += 1
        return k
    with _lock:
        k = _KERNELS.get(spec.key)
        if k is not None:
            return k
        raw = spec.source("__KERNEL__")
        digest = hashlib.blake2b(raw.encode(), digest_size=10).hexdigest()
        name = f"k_{digest}"
        src = spec.source(name).replace(f"def {name}", f"{_JIT}, error_model='numpy')\ndef {name}")
        mod = _load_module(name, src)
        k = getattr(mod, name)
        _KERNELS[spec.key] = k
        _STATS["generated"] += 1
        return k


def _kernel_counts(k) -> Tuple[int, int, int]:
    """(signatures, compiled, loaded) of one dispatcher. numba builds its ``signatures`` and ``stats`` anew on
    every access (tens of microseconds), and both change only when an overload is added (compiled or loaded
    from the cache), so they are read once per overload count and kept in ``_COUNTS``."""
    n = len(k.overloads)
    memo = _COUNTS.get(id(k))
    if memo is not None and memo[0] == n:
        return memo[1]
    st = k.stats
    sigs = len(k.signatures)
    counts = (sigs, sum(st.cache_misses.values()) if st.cache_path else sigs, sum(st.cache_hits.values()))
    _COUNTS[id(k)] = (n, counts)
    return counts


def kernel_stats() -> Dict[str, int]:
    """Counters of this process: ``kernels`` (distinct expression shapes generated), ``signatures``
    (compiled or loaded type signatures), ``compiled`` (numba compilations), ``loaded`` (signatures
    loaded from the on-disk cache), ``memory_hits`` (lookups answered from memory). Cheap: each kernel's
    counts are re-read only after it gained a signature."""
    sigs = compiled = loaded = 0
    for k in list(_KERNELS.values()):
        s, c, ld = _kernel_counts(k)
        sigs += s
        compiled += c
        loaded += ld
    return dict(kernels=len(_KERNELS), signatures=sigs, compiled=compiled, loaded=loaded,
                memory_hits=_STATS["memory_hits"])


@numba.njit(cache=True, nogil=True)
def transpose_copy(dst, src):  # pragma: no cover - compiled
    """``dst[:, :] = src.T`` in 32x32 tiles (both 2-D, any strides)."""
    n0, n1 = dst.shape
    for i0 in range(0, n0, 32):
        e0 = min(i0 + 32, n0)
        for i1 in range(0, n1, 32):
            e1 = min(i1 + 32, n1)
            for a in range(i0, e0):
                for b in range(i1, e1):
                    dst[a, b] = src[b, a]
