"""Bounded-memory record files for the trace index build: append, read in blocks, sort on disk, group.

A :class:`RecordFile` is a raw file of rows of one NumPy structured dtype (no header), written by
:meth:`RecordFile.add` and read back block by block (:meth:`RecordFile.blocks`) with ``pread``:
what a caller holds is the block it asked for, never the file (the file's pages stay in the
kernel's page cache, not in the process's resident set).

:func:`sort_records` sorts such a file by some of its fields (lexicographically, numeric
comparison, stable: rows with equal keys keep their order) in sorted runs of ``chunk`` rows merged
``FAN_IN`` at a time, holding about two chunks of rows at any moment whatever the file's size.

:func:`group_blocks` walks a file sorted by some fields block by block and numbers its groups of
equal keys across block boundaries (group ids and each row's position in its group).

Local files only; one user per file; not thread-safe.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["RecordFile", "sort_records", "group_blocks", "FAN_IN"]

#: Sorted runs merged together in one pass of :func:`sort_records`.
FAN_IN = 8


class RecordFile:
    """A raw file of ``dtype`` rows at ``path`` (created empty unless ``existing``)."""

    def __init__(self, path: os.PathLike, dtype, existing: bool = False):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        if not existing:
            self.path.write_bytes(b"")
        self.n = self.path.stat().st_size // self.dtype.itemsize

    def __len__(self) -> int:
        return self.n

    def add(self, rows: np.ndarray) -> None:
        """Append ``rows`` (of this file's dtype)."""
        if len(rows):
            with open(self.path, "ab") as f:
                f.write(memoryview(np.ascontiguousarray(rows, self.dtype)).cast("B"))
            self.n += len(rows)

    def read(self, a: int, b: int) -> np.ndarray:
        """Rows ``[a, b)`` (clipped to the file) as a new array."""
        a, b = max(int(a), 0), min(int(b), self.n)
        if b <= a:
            return np.empty(0, self.dtype)
        size = self.dtype.itemsize
        buf = bytearray((b - a) * size)
        view, got = memoryview(buf), 0
        with open(self.path, "rb") as f:
            while got < len(buf):
                k = os.preadv(f.fileno(), [view[got:]], a * size + got)
                if k <= 0:
                    raise OSError(f"{self.path} ends before row {b} (it was changed while it was read)")
                got += k
        return np.frombuffer(buf, self.dtype)

    def blocks(self, rows: int) -> Iterator[np.ndarray]:
        """The file's rows in order, ``rows`` at a time."""
        for a in range(0, self.n, max(int(rows), 1)):
            yield self.read(a, a + rows)

    def remove(self) -> None:
        """Delete the file."""
        self.path.unlink(missing_ok=True)


def _order(rows: np.ndarray, keys: Sequence[str]) -> np.ndarray:
    """The stable order of ``rows`` by ``keys`` (first key most significant)."""
    return np.lexsort([rows[k] for k in reversed(keys)])


def _count_le(rows: np.ndarray, keys: Sequence[str], bound: np.void, strict: bool) -> int:
    """How many of the sorted ``rows`` are lexicographically <= (``strict``: <) the row ``bound`` (a prefix)."""
    lt = np.zeros(len(rows), bool)
    eq = np.ones(len(rows), bool)
    for k in keys:
        col, b = rows[k], bound[k]
        lt |= eq & (col < b)
        eq &= col == b
    return int((lt if strict else lt | eq).sum())


def _merge(runs: List[RecordFile], keys: Sequence[str], out: RecordFile, block: int) -> None:
    """Merge the sorted ``runs`` (in this order: stable) into ``out``, ``block`` rows of each at a time."""
    bufs = [r.read(0, block) for r in runs]
    pos = [len(b) for b in bufs]
    while True:
        live = [i for i, b in enumerate(bufs) if len(b)]
        if not live:
            return
        # the smallest last buffered row (the first run holding it: b) bounds what can go now: no unread
        # row sorts before it; rows equal to it go from runs up to b only (later runs' equal rows follow
        # b's unread ones: stable)
        cand = np.concatenate([bufs[i][-1:] for i in live])
        j = int(_order(cand, keys)[0])
        b, bound = live[j], cand[j]
        pieces = []
        for i in live:
            k = _count_le(bufs[i], keys, bound, strict=i > b)
            pieces.append(bufs[i][:k])
            bufs[i] = bufs[i][k:]
            if not len(bufs[i]) and pos[i] < len(runs[i]):
                bufs[i] = runs[i].read(pos[i], pos[i] + block)
                pos[i] += len(bufs[i])
        rows = np.concatenate(pieces)
        out.add(rows[_order(rows, keys)])


def sort_records(src: RecordFile, keys: Sequence[str], chunk: int, out_path: Optional[os.PathLike] = None,
                 remove_src: bool = True) -> RecordFile:
    """``src`` sorted by the fields ``keys`` (stable), as a new file (``out_path``, default beside
    ``src``); holds about two times ``chunk`` rows. ``remove_src``: delete ``src`` once read."""
    chunk = max(int(chunk), 2)
    out_path = Path(out_path) if out_path is not None else src.path.with_name(src.path.name + ".sorted")
    base = src.path.with_name(src.path.name + ".run")
    runs: List[RecordFile] = []
    for k, rows in enumerate(src.blocks(chunk)):
        run = RecordFile(f"{base}0.{k}", src.dtype)
        run.add(rows[_order(rows, keys)])
        runs.append(run)
    if remove_src:
        src.remove()
    level = 0
    while len(runs) > 1:
        level += 1
        block = max(chunk // FAN_IN, 1)
        merged = []
        for g in range(0, len(runs), FAN_IN):
            group = runs[g:g + FAN_IN]
            dst = RecordFile(f"{base}{level}.{g // FAN_IN}", src.dtype)
            _merge(group, keys, dst, block)
            for r in group:
                r.remove()
            merged.append(dst)
        runs = merged
    if not runs:
        return RecordFile(out_path, src.dtype)
    os.replace(runs[0].path, out_path)
    return RecordFile(out_path, src.dtype, existing=True)


def group_blocks(src: RecordFile, keys: Sequence[str], rows: int
                 ) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Walk ``src`` (sorted by ``keys``) ``rows`` at a time: yields ``(block, gid, pos)`` where
    ``gid`` numbers the groups of equal keys over the whole file (0, 1, ...) and ``pos`` is each
    row's position in its group, both carried across block boundaries."""
    prev: Optional[np.void] = None
    gid0, pos0 = -1, 0
    for block in src.blocks(rows):
        new = np.zeros(len(block), bool)
        new[0] = True
        for k in keys:
            col = block[k]
            new[1:] |= col[1:] != col[:-1]
        if prev is not None:
            new[0] = any(block[k][0] != prev[k] for k in keys)
        gid = gid0 + np.cumsum(new)
        idx = np.arange(len(block))
        start = np.maximum.accumulate(np.where(new, idx, 0))
        pos = idx - start
        if prev is not None and not new[0]:
            cont = gid == gid0
            pos[cont] += pos0
        yield block, gid, pos
        prev = block[-1].copy()
        gid0, pos0 = int(gid[-1]), int(pos[-1]) + 1
