"""The buffer pool of the distributed arrays' local buffers (:class:`BufferCache`, ``Base.ensure``), and its fresh
memory: NumPy's allocator or anonymous mappings with a chosen transparent-hugepage advice.

``NBMPI_DISTARRAY_POOL_BYTES`` (read when a communicator's array context is made): the most bytes one rank's pool
keeps, as a number of bytes or with a unit (``512M``, ``4G``); default 1 GiB. A larger pool measured no better
here (seven benchmark programs in one process on 2 ranks, 1 GiB against 3 GiB: first runs and warm runs within
the noise), and memory the pool keeps is memory the program's own NumPy arrays cannot use.

``NBMPI_DISTARRAY_HUGEPAGE`` (read once, at import):

* unset or ``0`` (default): an anonymous mapping advised ``MADV_NOHUGEPAGE`` (4 KiB pages: more page
  faults, but no huge-page allocation, zeroing or compaction when the pages are first touched);
* ``numpy``: ``numpy.empty`` (NumPy advises ``MADV_HUGEPAGE`` on arrays of 4 MiB or more unless
  ``NUMPY_MADVISE_HUGEPAGE=0``);
* ``1``: an anonymous mapping advised ``MADV_HUGEPAGE``.

The default was measured on the xray program (n=6000, 2 ranks, THP ``enabled=madvise defrag=madvise``, a
loaded 2-core machine): pool buffers on 4 KiB pages made the first run's system time 0.35-0.37 s instead of
1.1-1.5 s (NumPy's huge pages), first run 1.4-2.3 s instead of 3.9-5.5 s, with the warm runs unchanged
(0.34-0.57 s vs 0.30-0.69 s: the pool's buffers are reused, their faults are paid once). The user's own
arrays (``to_numpy`` results) stay NumPy's: on 4 KiB pages the warm runs were slower (0.86-0.90 s vs 0.48-0.61 s).

Only pool buffers of at least :data:`MAP_MIN_BYTES` (32 MiB) get their own mapping: smaller ones come from
``numpy.empty`` whatever the setting (glibc serves them from memory it already has once a larger block was
freed, without fresh page faults). A mapping is unmapped when the last array on it is freed.
"""
from __future__ import annotations

import mmap
import os
import weakref
from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple

import numpy as np

__all__ = ["HUGEPAGE_ENV", "POOL_BYTES_ENV", "MAP_MIN_BYTES", "BufferCache", "advice", "fresh", "pool_bytes"]

HUGEPAGE_ENV = "NBMPI_DISTARRAY_HUGEPAGE"
#: The smallest buffer given a mapping of its own (glibc's largest dynamic mmap threshold).
MAP_MIN_BYTES = 32 << 20


def _advice_from_env() -> Optional[int]:
    v = os.environ.get(HUGEPAGE_ENV, "").strip().lower() or "0"
    if v == "numpy":
        return None
    if v in ("0", "off", "no", "false"):
        return getattr(mmap, "MADV_NOHUGEPAGE", None)
    if v in ("1", "on", "yes", "true"):
        return getattr(mmap, "MADV_HUGEPAGE", None)
    raise ValueError(f"{HUGEPAGE_ENV}={v!r}: use 0 (default: 4 KiB pages), 1 (huge pages) or numpy "
                     "(NumPy's own allocation)")


#: The ``madvise`` advice given to fresh pool buffers, or None for NumPy's own allocation.
advice: Optional[int] = _advice_from_env()


def fresh(shape: Tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A new uninitialized C-contiguous array of ``shape`` and ``dtype`` for the pool (see the module doc).
    Local; whoever makes a pool buffer calls it (``Base.ensure``)."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if advice is None or nbytes < MAP_MIN_BYTES:
        return np.empty(shape, dtype=dt)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(advice)
    return np.frombuffer(m, dtype=dt).reshape(shape)


POOL_BYTES_ENV = "NBMPI_DISTARRAY_POOL_BYTES"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def pool_bytes(env=None) -> int:
    """The pool's limit per rank (see the module doc): ``NBMPI_DISTARRAY_POOL_BYTES`` if set, else 1 GiB. Raises
    ValueError naming the variable for a value that is not a byte count."""
    env = os.environ if env is None else env
    v = env.get(POOL_BYTES_ENV, "").strip().lower().removesuffix("b").removesuffix("i")
    if v:
        unit = v[-1] if v[-1] in _UNITS else ""
        num = v[:-1] if unit else v
        try:
            n = int(float(num) * _UNITS[unit])
        except (ValueError, OverflowError):     # OverflowError: inf
            raise ValueError(f"{POOL_BYTES_ENV}={env[POOL_BYTES_ENV]!r}: use a byte count such as 1073741824, "
                             "512M or 4G") from None
        if n < 0:
            raise ValueError(f"{POOL_BYTES_ENV}={env[POOL_BYTES_ENV]!r}: must not be negative")
        return n
    return 1 << 30


class BufferCache:
    """Local buffers of bases that died, kept for the next base that needs memory (DistNumPy's lazy
    de-allocation: a time loop that makes a new temporary each step reuses the same memory instead of faulting
    in fresh pages; on this project's VM a fresh page costs about 12x a write to a warm one).

    :meth:`take` serves a request with a kept buffer of the same shape and dtype, else with the smallest kept
    buffer of at least its bytes and at most :attr:`slack` times them: a prefix of that buffer's memory in the
    request's shape and dtype (so one program's or one step's freed arrays serve another's of other shapes).
    When that view is given back (:meth:`give`), its whole buffer returns to the pool. At most ``max_bytes``
    are kept (default :func:`pool_bytes`); the oldest go first. Only buffers never handed to the user
    (``.local``) come here, and only of at least ``min_bytes`` (64 KiB; smaller ones are cheap to allocate).
    ``allocated`` counts fresh allocations of at least ``min_bytes``, ``reused`` the allocations served from
    the pool, ``released`` the buffers of dead temporaries given back during a force point, once its last unit
    using them ran (:mod:`~.releases`), so that later units of the same force point reuse them. Local (one
    rank's memory); not thread-safe (the rank's main thread uses it)."""

    #: A request takes a kept buffer of another shape only if it needs at least 1/slack of its bytes.
    slack = 2

    def __init__(self, max_bytes: Optional[int] = None, min_bytes: int = 1 << 16):
        self.max_bytes = pool_bytes() if max_bytes is None else max_bytes
        self.min_bytes = min_bytes
        self.bytes = 0
        self.free: "OrderedDict[int, Any]" = OrderedDict()
        #: id of a lent view -> (weak reference to the view, the whole buffer it is a prefix of)
        self._lent: Dict[int, Tuple[Any, np.ndarray]] = {}
        self.reused = 0
        self.allocated = 0
        self.released = 0

    def give(self, arr: np.ndarray) -> None:
        """Keep ``arr`` (a local buffer no one uses any more; a view :meth:`take` lent: its whole buffer)."""
        lent = self._lent.pop(id(arr), None)
        if lent is not None and lent[0]() is arr:
            arr = lent[1]
        if arr.nbytes < self.min_bytes or arr.nbytes > self.max_bytes:
            return
        self.free[id(arr)] = arr
        self.bytes += arr.nbytes
        while self.bytes > self.max_bytes and self.free:
            _, old = self.free.popitem(last=False)
            self.bytes -= old.nbytes

    def clear(self) -> None:
        """Drop every pooled buffer (their memory goes back to the allocator). Local."""
        self.free.clear()
        self.bytes = 0

    def take(self, shape: Tuple[int, ...], dtype: Any) -> Optional[np.ndarray]:
        """A kept buffer for a new C-contiguous array of ``shape`` and ``dtype`` (uninitialized; see the class
        doc), removed from the pool, or None if none fits."""
        shape = tuple(shape)
        dtype = np.dtype(dtype)
        need = dtype.itemsize
        for s in shape:
            need *= s
        best = None
        for k, arr in reversed(self.free.items()):
            if arr.shape == shape and arr.dtype == dtype:
                best = k
                break
            if (self.min_bytes <= need <= arr.nbytes <= self.slack * need
                    and (best is None or arr.nbytes < self.free[best].nbytes)):
                best = k
        if best is None:
            return None
        arr = self.free.pop(best)
        self.bytes -= arr.nbytes
        self.reused += 1
        if arr.shape == shape and arr.dtype == dtype:
            return arr
        view = arr.reshape(-1).view(np.uint8)[:need].view(dtype).reshape(shape)
        key = id(view)
        self._lent[key] = (weakref.ref(view, lambda ref, k=key: self._forget(k, ref)), arr)
        return view

    def _forget(self, key: int, ref: Any) -> None:
        lent = self._lent.get(key)
        if lent is not None and lent[0] is ref:
            del self._lent[key]
