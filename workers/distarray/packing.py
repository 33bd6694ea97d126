"""Packing kernels: numba loops that copy strided element sets of local blocks into message buffers and back.

A distributed array's local block is a C-contiguous buffer of ``rows x row_elems`` elements.
The elements a message carries are described once per plan, in two parts:

* **runs of rows**: the local rows, in message order, as maximal arithmetic progressions
  ``(start, step, count)`` (an ``int64`` array of shape ``(runs, 3)``), found by
  :func:`ap_runs` in one compiled pass. A block-to-cyclic transfer is one run per peer,
  block-cyclic transfers one run per block;
* **a row pattern** (:class:`RowPattern`): which elements of each row, in the user's C order:
  ``outer`` element offsets (one per combination of the trailing user axes but the last),
  each followed by ``inner`` elements ``inner_stride`` apart. Axes of length 1 are dropped
  and axes that are contiguous over each other are merged, so a whole row of a 2-D block is
  one offset and one contiguous inner run.

:func:`pack` (local block -> message), :func:`unpack` (message -> local block) and
:func:`copy_rows` (local block -> local block, two patterns at once, for the part of a
transfer that stays on the rank) run these descriptions with no Python loop per element,
per row or per run; whole contiguous rows are copied as one block per run. Unpacking and
copying cast to the destination's dtype as NumPy's ``setitem`` does (``unsafe`` casting).
Every kernel is compiled once per dtype combination and cached on disk (``cache=True``).
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numba
import numpy as np

from .indexing import View

__all__ = ["RowPattern", "row_pattern", "joint_patterns", "ap_runs", "joint_runs", "pack", "unpack", "copy_rows",
           "contiguous_range", "group_by", "Interleave", "OP_PACK", "OP_COPY", "OP_UNPACK"]

#: Stream operations of an :class:`Interleave`.
OP_PACK, OP_COPY, OP_UNPACK = 0, 1, 2


class RowPattern:
    """The elements of one row of a local block, in C order of the view's trailing user axes.

    ``offsets`` (int64): start of each inner run relative to the row's first element;
    ``inner``: elements per inner run; ``stride``: distance between them; ``count``:
    ``len(offsets) * inner`` elements per row; ``row_elems``: elements per row of the buffer.
    """

    __slots__ = ("offsets", "inner", "stride", "count", "row_elems")

    def __init__(self, offsets: np.ndarray, inner: int, stride: int, row_elems: int):
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.inner, self.stride, self.row_elems = int(inner), int(stride), int(row_elems)
        self.count = len(self.offsets) * self.inner

    @property
    def whole_row(self) -> bool:
        """True if the pattern is every element of the row, in storage order."""
        return (len(self.offsets) == 1 and int(self.offsets[0]) == 0 and self.stride == 1
                and self.inner == self.row_elems)

    def is_contiguous(self) -> bool:
        """True if the row's elements form one contiguous range in storage order."""
        if self.inner > 1 and self.stride != 1:
            return False
        return len(self.offsets) == 1 or bool(np.all(np.diff(self.offsets) == self.inner))

    def __repr__(self) -> str:
        return (f"RowPattern({len(self.offsets)} x {self.inner} elements, stride {self.stride}, "
                f"row of {self.row_elems})")


def _axes(view: View, trail_shape: Sequence[int]) -> Tuple[int, List[Tuple[int, int]]]:
    """``(offset, [(extent, stride), ...])`` of the user axes after the row entry of ``view`` over a
    local buffer whose rows have shape ``trail_shape`` (new axes have extent 1 and stride 0)."""
    off, strides = view.trail_strides(tuple(int(s) for s in trail_shape))
    ext = [e[3] if e[0] == "s" else 1 for e in view.after_row() if e[0] != "i"]
    return off, list(zip(ext, strides))


def _offsets(off: int, axes: List[Tuple[int, int]]) -> np.ndarray:
    out = np.array([off], dtype=np.int64)
    for ext, st in axes:
        out = (out[:, None] + np.arange(ext, dtype=np.int64)[None, :] * st).reshape(-1)
    return out


def _build(off: int, axes: List[Tuple[int, int]], keep: List[bool], row_elems: int) -> RowPattern:
    """The pattern of ``axes`` where axis ``j`` is merged into ``j + 1`` when ``keep[j]`` is False."""
    merged: List[Tuple[int, int]] = []
    for j, (ext, st) in enumerate(axes):
        if merged and not keep[j - 1]:
            pext, _ = merged[-1]
            merged[-1] = (pext * ext, st)
        else:
            merged.append((ext, st))
    if not merged:
        return RowPattern(np.array([off], dtype=np.int64), 1, 1, row_elems)
    inner, stride = merged[-1]
    return RowPattern(_offsets(off, merged[:-1]), inner, stride if inner > 1 else 1, row_elems)


def _row_elems(trail_shape: Sequence[int]) -> int:
    """Elements per row of a local buffer whose rows have shape ``trail_shape`` (1 for a 1-D buffer)."""
    return int(np.prod(trail_shape, dtype=np.int64)) if len(trail_shape) else 1


def _mergeable(axes: List[Tuple[int, int]]) -> List[bool]:
    """``m[j]``: axis ``j`` steps over exactly one run of axis ``j + 1`` (they can be one axis)."""
    return [axes[j][1] == axes[j + 1][1] * axes[j + 1][0] for j in range(len(axes) - 1)]


def row_pattern(view: View, trail_shape: Sequence[int]) -> RowPattern:
    """The :class:`RowPattern` of ``view``'s rows over a local buffer with rows of ``trail_shape``."""
    off, axes = _axes(view, trail_shape)
    axes = [a for a in axes if a[0] != 1]
    m = _mergeable(axes)
    return _build(off, axes, [not x for x in m], _row_elems(trail_shape))


def joint_patterns(src: View, src_trail: Sequence[int], dst: View, dst_trail: Sequence[int]
                   ) -> Tuple[RowPattern, RowPattern]:
    """Patterns of two views with the same trailing user shape that share ``inner`` (and the number of
    offsets), so :func:`copy_rows` can walk both at once: axes are merged only where both allow it."""
    so, sa = _axes(src, src_trail)
    do, da = _axes(dst, dst_trail)
    if [e for e, _ in sa] != [e for e, _ in da]:
        raise ValueError(f"trailing shapes differ: {[e for e, _ in sa]} vs {[e for e, _ in da]}")
    keep_axes = [k for k, (e, _) in enumerate(sa) if e != 1]
    sa = [sa[k] for k in keep_axes]
    da = [da[k] for k in keep_axes]
    ms, md = _mergeable(sa), _mergeable(da)
    keep = [not (a and b) for a, b in zip(ms, md)]
    return _build(so, sa, keep, _row_elems(src_trail)), _build(do, da, keep, _row_elems(dst_trail))


# --------------------------------------------------------------------------- runs of rows
@numba.njit(cache=True, nogil=True)
def _ap_runs(seq, out):  # pragma: no cover - compiled
    n = seq.shape[0]
    i = 0
    nr = 0
    while i < n:
        if i + 1 < n:
            d = seq[i + 1] - seq[i]
            j = i + 2
            while j < n and seq[j] - seq[j - 1] == d:
                j += 1
        else:
            d = 1
            j = i + 1
        out[nr, 0] = seq[i]
        out[nr, 1] = d
        out[nr, 2] = j - i
        nr += 1
        i = j
    return nr


@numba.njit(cache=True, nogil=True)
def _joint_runs(a, b, out):  # pragma: no cover - compiled
    n = a.shape[0]
    i = 0
    nr = 0
    while i < n:
        if i + 1 < n:
            da = a[i + 1] - a[i]
            db = b[i + 1] - b[i]
            j = i + 2
            while j < n and a[j] - a[j - 1] == da and b[j] - b[j - 1] == db:
                j += 1
        else:
            da = 1
            db = 1
            j = i + 1
        out[nr, 0] = a[i]
        out[nr, 1] = da
        out[nr, 2] = b[i]
        out[nr, 3] = db
        out[nr, 4] = j - i
        nr += 1
        i = j
    return nr


@numba.njit(cache=True, nogil=True)
def _group(keys, nkeys, order, bounds):  # pragma: no cover - compiled
    for i in range(keys.shape[0]):
        bounds[keys[i] + 1] += 1
    for q in range(nkeys):
        bounds[q + 1] += bounds[q]
    pos = bounds[:-1].copy()
    for i in range(keys.shape[0]):
        q = keys[i]
        order[pos[q]] = i
        pos[q] += 1


def group_by(keys: np.ndarray, nkeys: int) -> Tuple[np.ndarray, np.ndarray]:
    """Stable grouping of ``keys`` (integers in ``0..nkeys-1``): ``(order, bounds)`` with the positions of key
    ``q`` in ``order[bounds[q]:bounds[q + 1]]``, increasing. A counting sort, one compiled pass."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    order = np.empty(len(keys), dtype=np.int64)
    bounds = np.zeros(nkeys + 1, dtype=np.int64)
    _group(keys, nkeys, order, bounds)
    return order, bounds


def ap_runs(seq: np.ndarray) -> np.ndarray:
    """Maximal arithmetic progressions of ``seq`` (greedy, left to right) as ``(start, step, count)`` rows
    of an int64 array. One compiled pass; called once per plan."""
    seq = np.ascontiguousarray(seq, dtype=np.int64)
    out = np.empty((max(1, len(seq)), 3), dtype=np.int64)
    n = _ap_runs(seq, out)
    return out[:n].copy()


def joint_runs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Maximal runs where ``a`` and ``b`` are both arithmetic progressions, as ``(a0, da, b0, db, count)``."""
    a = np.ascontiguousarray(a, dtype=np.int64)
    b = np.ascontiguousarray(b, dtype=np.int64)
    out = np.empty((max(1, len(a)), 5), dtype=np.int64)
    n = _joint_runs(a, b, out)
    return out[:n].copy()


def contiguous_range(runs: np.ndarray, pat: RowPattern) -> Tuple[int, int] | None:
    """``(first, stop)`` element range of the local buffer if the rows ``runs`` with pattern ``pat`` are one
    contiguous range in message order (then the buffer can be sent or received in place), else None."""
    if len(runs) != 1 or not pat.is_contiguous():
        return None
    start, step, count = (int(x) for x in runs[0])
    first = start * pat.row_elems + int(pat.offsets[0])
    if count == 1:
        return first, first + pat.count
    if step == 1 and pat.whole_row:
        return first, first + count * pat.row_elems
    return None


# --------------------------------------------------------------------------- the copy kernels
# One run of rows each; ``whole``: rows are copied whole and contiguously (the pattern is the full row).
@numba.njit(cache=True, nogil=True, inline="always")
def _gather_run(src, row_elems, start, step, cnt, offs, inner, stride, whole, out, pos):  # pragma: no cover
    """out[pos:] = elements of rows start, start+step, ... of src; returns the next position."""
    nout = offs.shape[0]
    if whole and (step == 1 or cnt == 1):
        b = np.uint64(start * row_elems)
        n = np.uint64(cnt * row_elems)
        for k in range(n):
            out[pos + k] = src[b + k]
        return pos + n
    if inner == 1 and nout == 1:
        o = offs[0]
        for c in range(cnt):
            out[pos + np.uint64(c)] = src[np.uint64((start + c * step) * row_elems + o)]
        return pos + np.uint64(cnt)
    uinner = np.uint64(inner)
    for c in range(cnt):
        base = (start + c * step) * row_elems
        for q in range(nout):
            b = base + offs[q]
            if stride == 1:
                ub = np.uint64(b)
                for j in range(uinner):
                    out[pos + j] = src[ub + j]
            else:
                for j in range(inner):
                    out[pos + np.uint64(j)] = src[np.uint64(b + j * stride)]
            pos += uinner
    return pos


@numba.njit(cache=True, nogil=True, inline="always")
def _scatter_run(dst, row_elems, start, step, cnt, offs, inner, stride, whole, inp, pos):  # pragma: no cover
    """Elements of rows start, start+step, ... of dst = inp[pos:] (cast); returns the next position."""
    nout = offs.shape[0]
    if whole and (step == 1 or cnt == 1):
        b = np.uint64(start * row_elems)
        n = np.uint64(cnt * row_elems)
        for k in range(n):
            dst[b + k] = inp[pos + k]
        return pos + n
    if inner == 1 and nout == 1:
        o = offs[0]
        for c in range(cnt):
            dst[np.uint64((start + c * step) * row_elems + o)] = inp[pos + np.uint64(c)]
        return pos + np.uint64(cnt)
    uinner = np.uint64(inner)
    for c in range(cnt):
        base = (start + c * step) * row_elems
        for q in range(nout):
            b = base + offs[q]
            if stride == 1:
                ub = np.uint64(b)
                for j in range(uinner):
                    dst[ub + j] = inp[pos + j]
            else:
                for j in range(inner):
                    dst[np.uint64(b + j * stride)] = inp[pos + np.uint64(j)]
            pos += uinner
    return pos


@numba.njit(cache=True, nogil=True, inline="always")
def _copy_run(dst, d_row, d_offs, d_stride, src, s_row, s_offs, s_stride, inner, whole,
              s0, ds, t0, dt, cnt):  # pragma: no cover - compiled
    """Rows t0, t0+dt, ... of dst = rows s0, s0+ds, ... of src (joint patterns: same inner, same count)."""
    nout = s_offs.shape[0]
    if whole and ((ds == 1 and dt == 1) or cnt == 1):
        sb = np.uint64(s0 * s_row)
        tb = np.uint64(t0 * d_row)
        for k in range(np.uint64(cnt * s_row)):
            dst[tb + k] = src[sb + k]
        return
    if inner == 1 and nout == 1:
        so = s_offs[0]
        do = d_offs[0]
        for c in range(cnt):
            dst[np.uint64((t0 + c * dt) * d_row + do)] = src[np.uint64((s0 + c * ds) * s_row + so)]
        return
    for c in range(cnt):
        sbase = (s0 + c * ds) * s_row
        tbase = (t0 + c * dt) * d_row
        for q in range(nout):
            sb = sbase + s_offs[q]
            tb = tbase + d_offs[q]
            if s_stride == 1 and d_stride == 1:
                usb = np.uint64(sb)
                utb = np.uint64(tb)
                for j in range(np.uint64(inner)):
                    dst[utb + j] = src[usb + j]
            else:
                for j in range(inner):
                    dst[np.uint64(tb + j * d_stride)] = src[np.uint64(sb + j * s_stride)]


@numba.njit(cache=True, nogil=True)
def _pack(src, row_elems, runs, offs, inner, stride, whole, out, pos0):  # pragma: no cover - compiled
    pos = np.uint64(pos0)
    for r in range(runs.shape[0]):
        pos = _gather_run(src, row_elems, runs[r, 0], runs[r, 1], runs[r, 2], offs, inner, stride, whole, out, pos)
    return pos


@numba.njit(cache=True, nogil=True)
def _unpack(dst, row_elems, runs, offs, inner, stride, whole, inp, pos0):  # pragma: no cover - compiled
    pos = np.uint64(pos0)
    for r in range(runs.shape[0]):
        pos = _scatter_run(dst, row_elems, runs[r, 0], runs[r, 1], runs[r, 2], offs, inner, stride, whole, inp, pos)
    return pos


@numba.njit(cache=True, nogil=True)
def _copy_rows(dst, d_row, d_offs, d_stride, src, s_row, s_offs, s_stride, inner, whole, runs):  # pragma: no cover
    for r in range(runs.shape[0]):
        _copy_run(dst, d_row, d_offs, d_stride, src, s_row, s_offs, s_stride, inner, whole,
                  runs[r, 0], runs[r, 1], runs[r, 2], runs[r, 3], runs[r, 4])


def pack(src_flat: np.ndarray, runs: np.ndarray, pat: RowPattern, out_flat: np.ndarray, pos: int = 0) -> int:
    """Copy the elements of rows ``runs`` (pattern ``pat``) of the flat local block ``src_flat`` into
    ``out_flat`` from element ``pos`` on, in message order; return the element after the last written.
    Local, no communication; ``out_flat`` must have ``src_flat``'s dtype."""
    return int(_pack(src_flat, pat.row_elems, runs, pat.offsets, pat.inner, pat.stride, pat.whole_row, out_flat,
                     pos))


def unpack(dst_flat: np.ndarray, runs: np.ndarray, pat: RowPattern, in_flat: np.ndarray, pos: int = 0) -> int:
    """The inverse of :func:`pack`: write ``in_flat[pos:]`` into rows ``runs`` (pattern ``pat``) of the flat
    local block ``dst_flat``, casting to its dtype; return the element after the last read. Local."""
    return int(_unpack(dst_flat, pat.row_elems, runs, pat.offsets, pat.inner, pat.stride, pat.whole_row, in_flat,
                       pos))


def copy_rows(dst_flat: np.ndarray, dst_pat: RowPattern, src_flat: np.ndarray, src_pat: RowPattern,
              runs: np.ndarray) -> None:
    """``dst[rows b] = src[rows a]`` for the joint runs ``(a0, da, b0, db, count)`` of :func:`joint_runs`,
    with patterns from :func:`joint_patterns` (same ``inner`` and offset count), casting like NumPy's
    ``setitem``. Local."""
    _copy_rows(dst_flat, dst_pat.row_elems, dst_pat.offsets, dst_pat.stride, src_flat, src_pat.row_elems,
               src_pat.offsets, src_pat.stride, src_pat.inner, src_pat.whole_row and dst_pat.whole_row, runs)


# --------------------------------------------------------------------------- interleaved streams
@numba.njit(cache=True, nogil=True, inline="always")
def _stream_row(blocked_is_src, row, c, op, x0, dx, elems, src, dst, send, recv):  # pragma: no cover - compiled
    """Move row ``c`` of one stream (see :class:`Interleave`); single elements without a loop."""
    if blocked_is_src:
        sb = np.uint64(row * elems)
        if op == 0:
            tb = np.uint64(x0 + c * elems)
            if elems == 1:
                send[tb] = src[sb]
            else:
                for e in range(np.uint64(elems)):
                    send[tb + e] = src[sb + e]
        else:
            tb = np.uint64((x0 + c * dx) * elems)
            if elems == 1:
                dst[tb] = src[sb]
            else:
                for e in range(np.uint64(elems)):
                    dst[tb + e] = src[sb + e]
    else:
        tb = np.uint64(row * elems)
        if op == 2:
            sb = np.uint64(x0 + c * elems)
            if elems == 1:
                dst[tb] = recv[sb]
            else:
                for e in range(np.uint64(elems)):
                    dst[tb + e] = recv[sb + e]
        else:
            sb = np.uint64((x0 + c * dx) * elems)
            if elems == 1:
                dst[tb] = src[sb]
            else:
                for e in range(np.uint64(elems)):
                    dst[tb + e] = src[sb + e]


@numba.njit(cache=True, nogil=True)
def _interleaved(blocked_is_src, r0, k, ops, cnts, x0s, dxs, elems, src, dst, send, recv):  # pragma: no cover
    """Cache-blocked: the streams take turns over blocks of ``chunk`` rows each, so every block of the
    interleaved side is in cache while all streams pass over it, and each stream's inner loop is simple."""
    cmax = 0
    for j in range(k):
        cmax = max(cmax, cnts[j])
    chunk = max(1, 1024 // elems)
    for c0 in range(0, cmax, chunk):
        for j in range(k):
            c1 = min(c0 + chunk, cnts[j])
            if c1 <= c0:
                continue
            op = ops[j]
            x0 = x0s[j]
            dx = dxs[j]
            if elems != 1:
                for c in range(c0, c1):
                    _stream_row(blocked_is_src, r0 + c * k + j, c, op, x0, dx, elems, src, dst, send, recv)
            elif blocked_is_src:
                if op == 0:
                    for c in range(c0, c1):
                        send[np.uint64(x0 + c)] = src[np.uint64(r0 + c * k + j)]
                elif dx == 1:
                    for c in range(c0, c1):
                        dst[np.uint64(x0 + c)] = src[np.uint64(r0 + c * k + j)]
                else:
                    for c in range(c0, c1):
                        dst[np.uint64(x0 + c * dx)] = src[np.uint64(r0 + c * k + j)]
            else:
                if op == 2:
                    for c in range(c0, c1):
                        dst[np.uint64(r0 + c * k + j)] = recv[np.uint64(x0 + c)]
                elif dx == 1:
                    for c in range(c0, c1):
                        dst[np.uint64(r0 + c * k + j)] = src[np.uint64(x0 + c)]
                else:
                    for c in range(c0, c1):
                        dst[np.uint64(r0 + c * k + j)] = src[np.uint64(x0 + c * dx)]


class Interleave:
    """``k`` streams of whole rows over the rows ``r0 + c*k + j`` of one block (stream ``j``, ``c`` <
    its count), walked together, cache block by cache block: on the sending side (``blocked_is_src``) each row goes to a message
    (``OP_PACK``: element ``x0 + c*elems`` of the send arena) or to a target row (``OP_COPY``: row
    ``x0 + c*dx``); on the receiving side each target row comes from the receive arena (``OP_UNPACK``)
    or from a source row (``OP_COPY``). This is the shape of a block <-> cyclic exchange (and of
    any exchange whose streams are single runs of step ``k``): separate passes would read (or write)
    every cache line of the block from memory once per stream; here each block of rows is in cache
    while every stream passes over it (measured on 32 MiB 1-D blocks, 2 streams: 2.4 ms, as fast as
    ``numpy.copyto`` of the block, against 3.5 ms for one strided pass per stream)."""

    __slots__ = ("blocked_is_src", "r0", "k", "streams", "elems", "_cols")

    def __init__(self, blocked_is_src: bool, r0: int, streams: np.ndarray, elems: int):
        """``streams``: one row ``(op, count, x0, dx)`` per stream ``j``, in the order of their first rows."""
        self.blocked_is_src, self.r0, self.k = bool(blocked_is_src), int(r0), len(streams)
        self.streams = np.ascontiguousarray(streams, dtype=np.int64)
        self.elems = int(elems)
        self._cols = tuple(np.ascontiguousarray(self.streams[:, i]) for i in range(4))

    @classmethod
    def find(cls, blocked_is_src: bool, parts: Sequence[Tuple[int, np.ndarray, int, int]], elems: int):
        """An Interleave of ``parts`` = ``[(op, runs (start, step, count), x0, dx)]`` if each part is one run,
        all with the step ``k = len(parts) > 1`` and starts ``r0 .. r0 + k - 1``; else None."""
        k = len(parts)
        if k < 2 or any(len(r) != 1 for _, r, _, _ in parts):
            return None
        starts = [int(r[0, 0]) for _, r, _, _ in parts]
        steps = {int(r[0, 1]) if int(r[0, 2]) > 1 else k for _, r, _, _ in parts}
        if steps != {k}:
            return None
        order = np.argsort(starts)
        r0 = starts[order[0]]
        if [starts[j] for j in order] != list(range(r0, r0 + k)):
            return None
        streams = np.array([[parts[j][0], int(parts[j][1][0, 2]), parts[j][2], parts[j][3]] for j in order],
                           dtype=np.int64)
        return cls(blocked_is_src, r0, streams, elems)

    def run(self, src_flat: np.ndarray, dst_flat: np.ndarray, send: np.ndarray, recv: np.ndarray) -> None:
        """Walk the streams (see the class doc). Local; ``send``/``recv`` are the arenas as flat arrays of
        the source dtype; copies into ``dst_flat`` cast to its dtype."""
        _interleaved(self.blocked_is_src, self.r0, self.k, *self._cols, self.elems, src_flat, dst_flat, send, recv)
