"""Fresh memory of the buffer pool (``Base.ensure``): NumPy's allocator or anonymous mappings with a chosen
transparent-hugepage advice.

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
from typing import Optional, Tuple

import numpy as np

__all__ = ["HUGEPAGE_ENV", "MAP_MIN_BYTES", "advice", "fresh"]

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
