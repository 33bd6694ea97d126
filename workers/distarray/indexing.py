"""Basic-slicing views of a distributed base array: index normalization and view composition.

A :class:`View` says which elements of a base array a DistArray shows, one entry per base
axis in base order, with inserted axes between them:

* ``('s', start, step, count)``: a sliced base axis (a user-visible axis);
* ``('i', index)``: a base axis fixed by an integer (not user-visible);
* ``('n',)``: a new axis of length 1 (``None`` in the index; user-visible).

Views compose (``a[1:-1][::2]`` is one View of the base), never copy, and are hashable so
transfer plans can be cached by them. Axis 0 of the base is the distributed axis; a view
whose row entry is ``'s'`` and comes first keeps the distributed axis as its user axis 0.
Only basic indexing (integers, slices, ``None``, ``...``) is a view, as in NumPy; :meth:`View.index`
raises :class:`UnsupportedOperation` for index arrays and boolean masks (a DistArray handles an index
array along axis 0 as a copy, :mod:`~.irregular`, before it gets here).
"""
from __future__ import annotations

import math
import operator
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .errors import UnsupportedOperation

__all__ = ["View", "Entry", "c_strides", "c_contiguous"]

Entry = Tuple[Any, ...]


#: c_strides by shape (a program has few shapes); cleared when it reaches _STRIDES_MAX
_STRIDES: dict = {}
_STRIDES_MAX = 4096


def c_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    """C-order strides of ``shape`` in elements (a tuple of Python ints, shared: never to be changed)."""
    key = tuple(shape)
    got = _STRIDES.get(key)
    if got is not None:
        return got
    out = [1] * len(key)
    acc = 1
    for j in range(len(key) - 1, -1, -1):
        out[j] = acc
        acc *= int(key[j])
    got = tuple(out)
    if len(_STRIDES) >= _STRIDES_MAX:
        _STRIDES.clear()
    _STRIDES[key] = got
    return got


def _slice_of(start: int, step: int, count: int) -> slice:
    """The Python slice selecting ``count`` items from ``start`` by ``step``."""
    if count <= 0:
        return slice(0, 0)
    stop = start + step * count
    if stop < 0:
        stop = None
    return slice(start, stop, step)


def _offset_strides(entries, es: Sequence[int]) -> Tuple[int, Tuple[int, ...]]:
    """``(offset, strides)`` in elements of view ``entries`` (``("n",)`` new axis, ``("s", start,
    step, ...)`` slice, ``("i", index)`` integer) over a C-order buffer whose axes have element
    strides ``es``, one per non-new entry."""
    off = 0
    strides: List[int] = []
    j = 0
    for e in entries:
        if e[0] == "n":
            strides.append(0)
            continue
        off += e[1] * es[j]
        if e[0] == "s":
            strides.append(e[2] * es[j])
        j += 1
    return off, tuple(strides)


class View:
    """Which elements of a base of shape ``base_shape`` are visible (see the module doc). Immutable."""

    __slots__ = ("base_shape", "entries", "shape", "key", "_row", "row_entry", "row_kept", "sig")

    def __init__(self, base_shape: Tuple[int, ...], entries: Tuple[Entry, ...]):
        self._set(tuple([int(s) for s in base_shape]), tuple(entries))

    def _set(self, base_shape: Tuple[int, ...], entries: Tuple[Entry, ...]) -> None:
        """Fill the slots from a tuple of Python ints and a tuple of entries (no conversion)."""
        self.base_shape = base_shape
        self.entries = entries
        shape = []
        row = None
        for k, e in enumerate(entries):
            tag = e[0]
            if tag == "s":
                shape.append(e[3])
            elif tag == "n":
                shape.append(1)
                continue
            if row is None:
                row = k
        self.shape = tuple(shape)
        self.key = (base_shape, entries)
        self._row = row
        #: The entry of base axis 0 (None for a 0-d base).
        self.row_entry: Optional[Entry] = None if row is None else entries[row]
        #: True if base axis 0 is a user axis (sliced, not fixed by an integer).
        self.row_kept: bool = row is not None and entries[row][0] == "s"
        #: The view as numbers (``graph._view_sig``), made when first asked.
        self.sig: Optional[Tuple[int, ...]] = None

    @classmethod
    def _of(cls, base_shape: Tuple[int, ...], entries: Tuple[Entry, ...]) -> "View":
        """A view of a ``base_shape`` that is already a tuple of Python ints, ``entries`` a tuple (internal:
        skips the conversions of the constructor)."""
        v = cls.__new__(cls)
        v._set(base_shape, entries)
        return v

    @classmethod
    def full(cls, base_shape: Tuple[int, ...]) -> "View":
        """The view of the whole base."""
        bs = tuple([int(n) for n in base_shape])
        return cls._of(bs, tuple([("s", 0, 1, n) for n in bs]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, View) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"View{self.text()}"

    # -- properties -------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_full(self) -> bool:
        """True if the view shows the whole base unchanged."""
        ents = self.entries
        if len(ents) != len(self.base_shape):
            return False
        for e, n in zip(ents, self.base_shape):
            if e[0] != "s" or e[1] != 0 or e[2] != 1 or e[3] != n:
                return False
        return True

    @property
    def row_pos(self) -> Optional[int]:
        """User axis of the distributed (row) axis, None if it is fixed by an integer."""
        return self._row if self.row_kept else None

    @property
    def row_params(self) -> Tuple[int, int, int]:
        """``(start, step, count)`` of the base rows shown; a fixed row gives ``(index, 1, 1)``."""
        e = self.row_entry
        if e is None:
            return (0, 1, 1)
        if e[0] == "s":
            return (e[1], e[2], e[3])
        return (e[1], 1, 1)

    def after_row(self) -> Tuple[Entry, ...]:
        """Entries after the row entry (base axes 1.. and new axes among them)."""
        return () if self._row is None else self.entries[self._row + 1:]

    def lead_new(self) -> int:
        """Number of new axes before the row entry."""
        return 0 if self._row is None else self._row

    # -- indexing -------------------------------------------------------------------
    def index(self, key: Any) -> "View":
        """The view ``self[key]`` for a basic index (ints, slices, None, Ellipsis).

        Raises IndexError for out-of-range integers or too many indices (as NumPy), and
        :class:`UnsupportedOperation` for index arrays, lists and booleans.
        """
        if not isinstance(key, tuple):
            key = (key,)
        got = self._index_plain(key)
        return got if got is not None else self._index_general(key)

    def _index_general(self, key: Tuple[Any, ...]) -> "View":
        """:meth:`index` for any basic index tuple ``key`` (the general pass)."""
        items: List[Any] = []
        for it in key:
            if it is None or it is Ellipsis or isinstance(it, slice):
                items.append(it)
            elif isinstance(it, (bool, np.bool_)):
                raise UnsupportedOperation("indexing a distributed array with a boolean is not supported; "
                                           "use where(mask, x, y) for masked selection")
            elif isinstance(it, (int, np.integer)):
                items.append(operator.index(it))
            else:   # NumPy's error for a float, a string or another object as an index
                raise IndexError("only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) and integer "
                                 "or boolean arrays are valid indices")
        consumers = sum(1 for it in items if it is not None and it is not Ellipsis)
        if sum(1 for it in items if it is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if consumers > self.ndim:
            raise IndexError(f"too many indices for array: array is {self.ndim}-dimensional, "
                             f"but {consumers} were indexed")
        expanded: List[Any] = []
        for it in items:
            if it is Ellipsis:
                expanded.extend([slice(None)] * (self.ndim - consumers))
            else:
                expanded.append(it)
        if Ellipsis not in items:
            expanded.extend([slice(None)] * (self.ndim - consumers))
        out: List[Entry] = []
        ents = self.entries
        p = 0
        ax = -1             # the axis of the indexed array ``it`` indexes (in NumPy's messages)
        for it in expanded:
            if it is None:
                out.append(("n",))
                continue
            ax += 1
            while p < len(ents) and ents[p][0] == "i":
                out.append(ents[p])
                p += 1
            e = ents[p]
            p += 1
            if e[0] == "s":
                _, start, step, count = e
                if isinstance(it, slice):
                    s2, e2, st2 = it.indices(count)
                    c2 = len(range(s2, e2, st2))
                    out.append(("s", start + s2 * step if c2 else 0, step * st2 if c2 else 1, c2))
                else:
                    k = it + count if it < 0 else it
                    if not 0 <= k < count:
                        raise IndexError(f"index {it} is out of bounds for axis {ax} with size {count}")
                    out.append(("i", start + k * step))
            else:  # a new axis of length 1
                if isinstance(it, slice):
                    if len(range(1)[it]) != 1:
                        raise UnsupportedOperation("an empty slice of a new axis is not supported")
                    out.append(e)
                elif it not in (0, -1):
                    raise IndexError(f"index {it} is out of bounds for axis {ax} with size 1")
        out.extend(ents[p:])
        return View._of(self.base_shape, tuple(out))

    def _index_plain(self, key: Tuple[Any, ...]) -> Optional["View"]:
        """:meth:`index` for the common key (Python ints and slices only, one per leading entry of the view,
        each a sliced base axis): the same View, without the general pass; None for any other key or view."""
        ents = self.entries
        nk = len(key)
        if nk > len(ents):
            return None
        for j in range(nk):
            if ents[j][0] != "s":
                return None
        out: List[Entry] = []
        shape: List[int] = []
        row = None          # position of the first entry that is not a new axis (the row entry)
        j = 0
        for it in key:
            e = ents[j]
            t = type(it)
            if t is slice:
                _, start, step, count = e
                s2, e2, st2 = it.indices(count)
                c2 = len(range(s2, e2, st2))
                out.append(("s", start + s2 * step, step * st2, c2) if c2 else ("s", 0, 1, 0))
                shape.append(c2)
            elif t is int:
                count = e[3]
                k = it + count if it < 0 else it
                if not 0 <= k < count:
                    raise IndexError(f"index {it} is out of bounds for axis {j} with size {count}")
                out.append(("i", e[1] + k * e[2]))
            else:
                return None
            if row is None:
                row = j
            j += 1
        for e in ents[nk:]:      # what the general pass gives for the axes left: ``[:]`` of each
            tag = e[0]
            if tag == "s":
                if not e[3]:
                    e = ("s", 0, 1, 0)
                shape.append(e[3])
            elif tag == "n":
                shape.append(1)
                out.append(e)
                j += 1
                continue
            if row is None:
                row = j
            out.append(e)
            j += 1
        v = View.__new__(View)
        v.base_shape = self.base_shape
        v.entries = entries = tuple(out)
        v.shape = tuple(shape)
        v.key = (self.base_shape, entries)
        v._row = row
        v.row_entry = None if row is None else entries[row]
        v.row_kept = row is not None and entries[row][0] == "s"
        v.sig = None
        return v

    # -- index tuples for NumPy arrays ------------------------------------------------
    def numpy_index(self, row_sel: Any = None) -> Tuple[Any, ...]:
        """The NumPy index of this view into an array of the base's shape (replicated data), or,
        with ``row_sel``, into a local buffer whose axis 0 is selected by ``row_sel`` instead."""
        out: List[Any] = []
        for k, e in enumerate(self.entries):
            if e[0] == "n":
                out.append(None)
            elif k == self._row and row_sel is not None:
                out.append(row_sel)
            elif e[0] == "s":
                out.append(_slice_of(e[1], e[2], e[3]))
            else:
                out.append(e[1])
        return tuple(out)

    def trail_items(self) -> Tuple[Any, ...]:
        """Index items for base axes 1.. (slices and ints, no new axes): what packing applies."""
        out = []
        for e in self.after_row():
            if e[0] == "s":
                out.append(_slice_of(e[1], e[2], e[3]))
            elif e[0] == "i":
                out.append(e[1])
        return tuple(out)

    def packed_trail_shape(self) -> Tuple[int, ...]:
        """Shape of one packed row: the sliced base axes 1.. (ints dropped, no new axes)."""
        return tuple(e[3] for e in self.after_row() if e[0] == "s")

    # -- strides for the fused kernels (elements of a flat C-order buffer) ------------
    def trail_strides(self, buf_trail_shape: Tuple[int, ...]) -> Tuple[int, Tuple[int, ...]]:
        """``(offset, strides)`` of the user axes after the row entry over a local buffer
        ``(rows, *buf_trail_shape)`` in C order, per row (the row term is added by the caller)."""
        return _offset_strides(self.after_row(), c_strides(buf_trail_shape))

    def packed_strides(self) -> Tuple[int, ...]:
        """Strides of the user axes after the row entry over packed rows (:meth:`trail_items` applied)."""
        pes = c_strides(self.packed_trail_shape())
        strides: List[int] = []
        j = 0
        for e in self.after_row():
            if e[0] == "n":
                strides.append(0)
            elif e[0] == "s":
                strides.append(pes[j])
                j += 1
        return tuple(strides)

    def full_strides(self) -> Tuple[int, Tuple[int, ...]]:
        """``(offset, strides)`` of all user axes over a C-order buffer of the base's shape."""
        return _offset_strides(self.entries, c_strides(self.base_shape))

    def box(self) -> Optional[Tuple[Tuple[int, int], ...]]:
        """``((start, stop), ...)`` per base axis if the view is a contiguous box (all axes sliced with
        step 1, no new axes), else None."""
        out = []
        for e in self.entries:
            if e[0] != "s" or (e[2] != 1 and e[3] > 1):
                return None
            out.append((e[1], e[1] + e[3]))
        return tuple(out)

    # -- text ------------------------------------------------------------------------
    def text(self) -> str:
        """The view as an index expression of its base, e.g. ``[1:3999, 1:3999]``."""
        parts = []
        for e in self.entries:
            if e[0] == "n":
                parts.append("None")
            elif e[0] == "i":
                parts.append(str(e[1]))
            else:
                _, s, st, c = e
                if c == 0:
                    parts.append("0:0")
                    continue
                stop = s + st * c
                if st == 1:
                    parts.append(f"{s}:{stop}")
                else:
                    parts.append(f"{s}:{'' if stop < 0 else stop}:{st}")
        return "[" + ", ".join(parts) + "]"


def c_contiguous(v: "View") -> bool:
    """Whether NumPy's view with the entries of ``v`` (a :class:`View`) would be C-contiguous."""
    if 0 in v.shape:
        return True
    single = False          # an inner axis is partial: every outer axis must then take one element
    for e, n in zip(reversed([e for e in v.entries if e[0] != "n"]), reversed(v.base_shape)):
        if e[0] == "i" or e[3] <= 1:
            single = True
        elif single or e[2] != 1:
            return False
        elif e[1] != 0 or e[3] != n:
            single = True
    return True
