"""Bounded reads of one ``.npy`` file: the rows a request needs, read with ``os.pread``, never the file.

A memory map of a large index file is the wrong tool for a long-lived server: every page a read
touches (and the kernel's read-ahead around it, often 128 KiB per fault) stays in the process's
resident set while the map is open, so a few thousand scattered reads of a 4 M-event trace's
index put most of its gigabyte in the controller's RSS. :class:`NpyColumn` reads instead with
``pread`` into fresh arrays: what a caller holds is what it asked for, the file's pages stay in the
kernel's page cache (shared, reclaimable, not the process's).

Reads (all thread-safe, blocking on local disk only): :meth:`NpyColumn.read` (a row range),
:meth:`NpyColumn.take` (rows by index, nearby ones read together in pieces of at most :data:`BLOCK_BYTES`),
``column[i]`` / ``column[i, j]`` / ``column[idx, j]`` / ``column[a:b]``, and
:meth:`NpyColumn.searchsorted` for a sorted 1-D column: a binary search on its in-memory
skeleton (every :data:`SKELETON_STRIDE`-th value, ``NAME.skel.npy``, written by
:func:`save_with_skeleton` or :class:`NpyAppender`) and one block read per key.

Writes: :func:`save_with_skeleton` (an array in memory), :class:`NpyAppender` (a file written piece
by piece, e.g. lane by lane, without the whole of it in memory).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple, Union

import numpy as np

__all__ = ["NpyColumn", "NpyAppender", "save_with_skeleton", "SKELETON_STRIDE", "BLOCK_BYTES", "GAP_BYTES",
           "SEARCH_GAP_BYTES"]

#: One value of a sorted column's skeleton per this many rows.
SKELETON_STRIDE = 1024
#: Largest single read of :meth:`NpyColumn.take` (bytes).
BLOCK_BYTES = 1 << 20
#: Rows asked for by :meth:`NpyColumn.take` at most this far apart (bytes) are read in one piece.
GAP_BYTES = 8192
#: Blocks :meth:`NpyColumn.searchsorted` reads at most this far apart (bytes) are read in one piece
#: (a search needs a few values per block: reading past a short gap is cheaper than another read).
SEARCH_GAP_BYTES = 1 << 17


def _skeleton_path(path: Path) -> Path:
    return path.with_name(path.stem + ".skel.npy")


def save_with_skeleton(path: os.PathLike, values: np.ndarray) -> None:
    """Write the sorted 1-D ``values`` to ``path`` (``.npy``) and their skeleton beside it (every
    :data:`SKELETON_STRIDE`-th value), for :meth:`NpyColumn.searchsorted`."""
    path = Path(path)
    np.save(path, values)
    np.save(_skeleton_path(path), np.ascontiguousarray(values[::SKELETON_STRIDE]))


class NpyColumn:
    """One ``.npy`` file (C order, 1-D or 2-D) read in bounded pieces (see the module docstring).
    Opening reads only the header; the file descriptor stays open until :meth:`close`."""

    def __init__(self, path: os.PathLike):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            self.offset = f.tell()
        if fortran and len(shape) > 1:
            raise ValueError(f"{self.path} is in Fortran order; the index writes C order (rebuild the index)")
        self.shape: Tuple[int, ...] = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.row_shape = self.shape[1:]
        self.row_bytes = int(self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64)))
        self._fd = os.open(self.path, os.O_RDONLY)
        self._skeleton: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return int(self.shape[0]) if self.shape else 0

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- reads --------------------------------------------------------------------------------------
    def read(self, a: int, b: int) -> np.ndarray:
        """Rows ``[a, b)`` (clipped to the file) as a new array."""
        n = len(self)
        a, b = max(int(a), 0), min(int(b), n)
        if b <= a or self.row_bytes == 0:
            return np.empty((0,) + self.row_shape, self.dtype)
        want = (b - a) * self.row_bytes
        buf = bytearray(want)
        view, got = memoryview(buf), 0
        while got < want:
            k = os.preadv(self._fd, [view[got:]], self.offset + a * self.row_bytes + got)
            if k <= 0:
                raise OSError(f"{self.path} ends before row {b} (truncated index: rebuild it)")
            got += k
        return np.frombuffer(buf, self.dtype).reshape((b - a,) + self.row_shape)

    def take(self, idx) -> np.ndarray:
        """Rows ``idx`` (any integer array; negative counts from the end), in ``idx``'s shape. The
        distinct rows asked for are read in runs (rows at most :data:`GAP_BYTES` apart together,
        each read at most :data:`BLOCK_BYTES`): one read per row at worst, never the gaps between
        distant rows."""
        idx = np.asarray(idx, np.int64)
        flat = idx.ravel()
        n = len(self)
        flat = np.where(flat < 0, flat + n, flat)
        if len(flat) and (flat.min() < 0 or flat.max() >= n):
            raise IndexError(f"row index out of range for {self.path.name} with {n} rows")
        uniq, inv = np.unique(flat, return_inverse=True)
        got = np.empty((len(uniq),) + self.row_shape, self.dtype)
        span = max(BLOCK_BYTES // max(self.row_bytes, 1), 1)
        gap = max(GAP_BYTES // max(self.row_bytes, 1), 1)
        # runs of rows close enough to be read together (each at most `span` rows)
        cuts = np.nonzero(np.diff(uniq) > gap)[0] + 1 if len(uniq) else np.empty(0, np.int64)
        for i, j in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(uniq)]]).tolist()):
            while i < j:
                a = int(uniq[i])
                k = min(int(np.searchsorted(uniq[i:j], a + span, "left")) + i, j)
                block = self.read(a, int(uniq[k - 1]) + 1)
                got[i:k] = block[uniq[i:k] - a]
                i = k
        return got[inv.ravel()].reshape(idx.shape + self.row_shape)

    def __getitem__(self, key) -> Union[np.ndarray, np.generic]:
        """``[i]`` a row, ``[a:b]`` rows (step 1), ``[idx]`` rows by index, ``[rows, j]`` column ``j``
        of those rows (2-D files)."""
        col = None
        if isinstance(key, tuple):
            if len(key) != 2 or len(self.shape) != 2:
                raise IndexError(f"{self.path.name}: only [rows, column] indexing of a 2-D file")
            key, col = key
        if isinstance(key, slice):
            a, b, step = key.indices(len(self))
            if step != 1:
                raise IndexError(f"{self.path.name}: slices with a step are not read")
            rows = self.read(a, b)
        elif isinstance(key, (int, np.integer)):
            i = int(key) + (len(self) if int(key) < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"row {key} out of range for {self.path.name} with {len(self)} rows")
            rows = self.read(i, i + 1)[0]
        else:
            rows = self.take(key)
        return rows if col is None else rows[..., col]

    # -- search -------------------------------------------------------------------------------------
    def skeleton(self) -> np.ndarray:
        """Every :data:`SKELETON_STRIDE`-th value of this sorted 1-D column (loaded once)."""
        if self._skeleton is None:
            sk = _skeleton_path(self.path)
            self._skeleton = np.load(sk) if sk.exists() else self.take(np.arange(0, len(self), SKELETON_STRIDE))
        return self._skeleton

    def searchsorted(self, keys, side: str = "left", lo: int = 0, hi: Optional[int] = None) -> np.ndarray:
        """``lo + np.searchsorted(column[lo:hi], keys, side)`` for a column sorted within
        ``[lo, hi)`` (default: all of it), reading the block of at most :data:`SKELETON_STRIDE` + 1
        rows each key falls in (blocks close together in one read, see :data:`SEARCH_GAP_BYTES`).
        Returns int64 of ``keys``' shape."""
        left, right = self.searchsorted_both(keys, lo, hi)
        return left if side == "left" else right

    def searchsorted_both(self, keys, lo: int = 0, hi: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """:meth:`searchsorted` of ``keys`` on both sides (``left``, ``right``), each block read once."""
        hi = len(self) if hi is None else int(hi)
        lo = int(lo)
        keys = np.asarray(keys, np.float64 if self.dtype.kind == "f" else self.dtype)
        flat = keys.ravel()
        left = np.full(len(flat), lo, np.int64)
        right = left.copy()
        if hi <= lo or not len(flat):
            return left.reshape(keys.shape), right.reshape(keys.shape)
        sk = self.skeleton()
        k0 = -(-lo // SKELETON_STRIDE)                 # skeleton entries inside [lo, hi)
        k1 = -(-hi // SKELETON_STRIDE)
        part = sk[k0:k1]
        # the rows around each key: from the skeleton value before it (left) to the one after it (right)
        pos_l = np.searchsorted(part, flat, "left")     # keys before skeleton entry k0 + pos
        pos_r = np.searchsorted(part, flat, "right")
        starts = np.clip(np.where(pos_l == 0, lo, (k0 + pos_l - 1) * SKELETON_STRIDE), lo, hi)
        stops = np.where(k0 + pos_r < k1, np.minimum((k0 + pos_r) * SKELETON_STRIDE + 1, hi), hi)
        order = np.argsort(starts, kind="stable")
        starts, stops = starts[order], np.maximum.accumulate(stops[order])
        # blocks at most SEARCH_GAP_BYTES apart are read together (up to BLOCK_BYTES): many keys over a
        # short range cost a few large reads, not one small read each
        gap = max(SEARCH_GAP_BYTES // max(self.row_bytes, 1), 1)
        span = max(BLOCK_BYTES // max(self.row_bytes, 1), SKELETON_STRIDE + 1)
        i, n = 0, len(order)
        while i < n:
            a, j = int(starts[i]), i + 1
            while j < n and starts[j] <= stops[j - 1] + gap and stops[j] - a <= span:
                j += 1
            m = order[i:j]
            block = self.read(a, int(stops[j - 1]))
            left[m] = a + np.searchsorted(block, flat[m], "left")
            right[m] = a + np.searchsorted(block, flat[m], "right")
            i = j
        return left.reshape(keys.shape), right.reshape(keys.shape)


class NpyAppender:
    """Writes one ``.npy`` file piece by piece, never holding more than a piece: the pieces go to
    ``PATH.raw`` as they come, :meth:`finish` writes ``PATH`` (header, then the rows copied in
    blocks of :data:`BLOCK_BYTES`) and, with ``skeleton`` (a sorted column), its skeleton (see
    :func:`save_with_skeleton`). One writer; not thread-safe."""

    def __init__(self, path: os.PathLike, skeleton: bool = False):
        self.path = Path(path)
        self.skeleton = skeleton
        self.n = 0
        self.dtype: Optional[np.dtype] = None
        self.row_shape: Tuple[int, ...] = ()
        self._raw = open(self.path.with_name(self.path.name + ".raw"), "wb")
        self._skeleton: list = []

    def add(self, values: np.ndarray) -> None:
        """Append the rows ``values`` (every piece of one dtype and row shape)."""
        values = np.ascontiguousarray(values)
        if self.dtype is None:
            self.dtype, self.row_shape = values.dtype, values.shape[1:]
        elif values.dtype != self.dtype or values.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path.name}: a piece of {values.dtype}{values.shape[1:]} after "
                             f"{self.dtype}{self.row_shape} pieces")
        if self.skeleton:
            self._skeleton.append(values[(-self.n) % SKELETON_STRIDE::SKELETON_STRIDE].copy())
        if values.size:
            self._raw.write(memoryview(values).cast("B"))
        self.n += len(values)

    def finish(self) -> None:
        """Write the ``.npy`` file (and skeleton) and remove the pieces."""
        raw = Path(self._raw.name)
        self._raw.close()
        dtype = self.dtype if self.dtype is not None else np.dtype(np.float64)
        header = dict(descr=np.lib.format.dtype_to_descr(dtype), fortran_order=False,
                      shape=(self.n,) + tuple(self.row_shape))
        with open(self.path, "wb") as out, open(raw, "rb") as src:
            np.lib.format.write_array_header_2_0(out, header)
            while True:
                block = src.read(BLOCK_BYTES)
                if not block:
                    break
                out.write(block)
        raw.unlink()
        if self.skeleton:
            skel = np.concatenate(self._skeleton) if self._skeleton else np.empty(0, dtype)
            np.save(_skeleton_path(self.path), skel)
