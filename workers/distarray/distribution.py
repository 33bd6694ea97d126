"""Distributions of an array's rows (axis 0) over the ranks: block, cyclic, block-cyclic, replicated.

A :class:`Distribution` answers, for any global row, which rank owns it and where the row
sits in the owner's local buffer. Each rank stores the rows it owns contiguously, in
increasing global order, as one local NumPy array of shape ``(local_rows, *shape[1:])``.
Everything is vectorized over arrays of rows, so the per-rank transfer plans
(:mod:`~nbmpi.workers.distarray.operations`) are computed without a Python loop per row.

* ``block``: rank ``r`` owns one contiguous run of rows; runs differ by at most one row
  (``n // P`` or ``n // P + 1`` rows, the larger ones first);
* ``cyclic``: row ``g`` lives on rank ``g % P``;
* ``block-cyclic`` with block size ``b``: block ``k`` (rows ``[k*b, (k+1)*b)``) lives on
  rank ``k % P``;
* ``replicated``: every rank holds every row (reduction results, NumPy operands).

Distributions are immutable and compare equal when they place every row identically.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, List, Optional, Tuple, Union

import numpy as np

from .errors import DistributionError

__all__ = ["Distribution", "DistSpec", "make_distribution", "KINDS"]

KINDS = ("block", "cyclic", "block-cyclic", "replicated")

#: What ``dist=`` accepts: a kind name, ``("block-cyclic", b)``, or a Distribution (its kind is reused).
DistSpec = Union[str, Tuple[str, int], "Distribution"]


class Distribution:
    """How the ``nrows`` rows of an array are spread over ``nranks`` ranks (see the module doc).

    Local object: building one never communicates. ``key`` identifies the placement
    (equal keys place every row on the same rank at the same local index).
    """

    __slots__ = ("kind", "nrows", "nranks", "block", "key", "_offsets", "_offs")

    def __init__(self, kind: str, nrows: int, nranks: int, block: int = 1):
        if kind not in KINDS:
            raise DistributionError(f"unknown distribution {kind!r}; expected one of "
                                    f"{', '.join(map(repr, KINDS))} or ('block-cyclic', block_size)")
        if nranks < 1:
            raise DistributionError(f"a distribution needs at least one rank, got {nranks}")
        if nrows < 0:
            raise DistributionError(f"negative number of rows {nrows}")
        if kind == "block-cyclic":
            if not isinstance(block, (int, np.integer)) or block < 1:
                raise DistributionError(f"block-cyclic needs a block size >= 1 rows, got {block!r}; "
                                        "write dist=('block-cyclic', 64)")
        else:
            block = 1
        self.kind, self.nrows, self.nranks, self.block = kind, int(nrows), int(nranks), int(block)
        self.key = (kind, self.nrows, self.nranks, self.block)
        if kind == "block":
            q, rem = divmod(self.nrows, self.nranks)
            counts = np.full(self.nranks, q, dtype=np.int64)
            counts[:rem] += 1
            self._offsets = np.zeros(self.nranks + 1, dtype=np.int64)
            np.cumsum(counts, out=self._offsets[1:])
            #: ``_offsets`` as Python ints (scalar look-ups: :meth:`owner_of`, :meth:`block_range`)
            self._offs: Optional[List[int]] = self._offsets.tolist()
        else:
            self._offsets = None
            self._offs = None

    # -- identity -----------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Distribution) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def replicated(self) -> bool:
        """True if every rank holds every row."""
        return self.kind == "replicated"

    def with_rows(self, nrows: int) -> "Distribution":
        """The same kind (and block size) over ``nrows`` rows."""
        return Distribution(self.kind, nrows, self.nranks, self.block)

    # -- placement (vectorized) -----------------------------------------------------
    def owner(self, rows: np.ndarray) -> np.ndarray:
        """Rank owning each global row of ``rows`` (int64 array; -1 for replicated: every rank)."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.kind == "block":
            cuts = self._sorted_cuts(rows)
            if cuts is not None:
                out = np.empty(len(rows), dtype=np.int64)
                for r in range(self.nranks):
                    out[cuts[r]:cuts[r + 1]] = r
                return out
            return np.searchsorted(self._offsets[1:], rows, side="right").astype(np.int64)
        if self.kind == "replicated":
            return np.full(rows.shape, -1, dtype=np.int64)
        return (rows // self.block) % self.nranks

    def _sorted_cuts(self, rows: np.ndarray) -> Any:
        """For ``block``, when ``rows`` (1-D int64) is non-decreasing (the rows of a view with a positive
        step, the usual case): ``cuts`` such that ``rows[cuts[r]:cuts[r + 1]]`` are rank ``r``'s (``nranks``
        binary searches instead of one per row); else None."""
        if rows.ndim != 1 or len(rows) < 1024 or rows[0] < 0 or rows[-1] >= self.nrows \
                or not bool((rows[1:] >= rows[:-1]).all()):
            return None
        return np.searchsorted(rows, self._offsets, side="left").tolist()

    def local_index(self, rows: np.ndarray) -> np.ndarray:
        """Index of each global row of ``rows`` in its owner's local buffer."""
        rows = np.asarray(rows, dtype=np.int64)
        if self.kind == "block":
            cuts = self._sorted_cuts(rows)
            if cuts is not None:
                out = np.empty(len(rows), dtype=np.int64)
                for r in range(self.nranks):
                    np.subtract(rows[cuts[r]:cuts[r + 1]], self._offsets[r], out=out[cuts[r]:cuts[r + 1]])
                return out
            own = np.searchsorted(self._offsets[1:], rows, side="right")
            return rows - self._offsets[own]
        if self.kind == "replicated":
            return rows.copy()
        b, p = self.block, self.nranks
        return (rows // b // p) * b + rows % b

    @property
    def offsets(self) -> np.ndarray:
        """For ``block``: the first global row of each rank, then the number of rows (``nranks + 1``
        entries, a copy); for other kinds an empty array."""
        return np.empty(0, dtype=np.int64) if self._offsets is None else self._offsets.copy()

    def owner_of(self, row: int) -> int:
        """Rank owning global row ``row`` (-1 for replicated): :meth:`owner` of one row, in closed form."""
        row = int(row)
        if self.kind == "block":
            return bisect_right(self._offs, row, 1) - 1
        if self.kind == "replicated":
            return -1
        return (row // self.block) % self.nranks

    def local_index_of(self, row: int) -> int:
        """Index of global row ``row`` in its owner's local buffer: :meth:`local_index` of one row, in closed form."""
        row = int(row)
        if self.kind == "block":
            return row - self._offs[bisect_right(self._offs, row, 1) - 1]
        if self.kind == "replicated":
            return row
        b, p = self.block, self.nranks
        return (row // b // p) * b + row % b

    def local_count(self, rank: int) -> int:
        """Number of rows stored on ``rank``."""
        if self.kind == "replicated":
            return self.nrows
        if self.kind == "block":
            return int(self._offsets[rank + 1] - self._offsets[rank])
        b, p, n = self.block, self.nranks, self.nrows
        nblocks = -(-n // b)
        mine = max(0, (nblocks - rank + p - 1) // p) if rank < nblocks else 0
        count = mine * b
        if mine and (nblocks - 1) % p == rank:
            count -= nblocks * b - n
        return count

    def global_rows(self, rank: int) -> np.ndarray:
        """Global rows stored on ``rank``, in local storage order (increasing)."""
        if self.kind == "replicated":
            return np.arange(self.nrows, dtype=np.int64)
        if self.kind == "block":
            return np.arange(self._offsets[rank], self._offsets[rank + 1], dtype=np.int64)
        b, p = self.block, self.nranks
        starts = np.arange(rank * b, self.nrows, p * b, dtype=np.int64)
        if len(starts) == 0:
            return np.empty(0, dtype=np.int64)
        rows = (starts[:, None] + np.arange(b, dtype=np.int64)[None, :]).ravel()
        return rows[rows < self.nrows]

    def local_runs(self, rank: int) -> List[Tuple[int, int]]:
        """Runs of consecutive global rows stored on ``rank``, in local storage order, as ``(first row, count)``
        pairs, maximal, in closed form (no array of every row: :meth:`global_rows` of a 35M-row block is 280 MB).
        One run for ``block``, ``replicated`` and one rank, one per block for ``cyclic``/``block-cyclic`` (see
        :meth:`local_run_count` before asking for many)."""
        n = self.nrows
        if self.kind == "replicated":
            return [(0, n)] if n else []
        if self.kind == "block":
            lo, hi = int(self._offsets[rank]), int(self._offsets[rank + 1])
            return [(lo, hi - lo)] if hi > lo else []
        b, p = self.block, self.nranks
        if p == 1:
            return [(0, n)] if n else []
        return [(s, min(b, n - s)) for s in range(rank * b, n, p * b)]

    def local_run_count(self, rank: int) -> int:
        """``len(self.local_runs(rank))``, without making them."""
        if self.kind in ("replicated", "block") or self.nranks == 1:
            return 1 if self.local_count(rank) else 0
        return len(range(rank * self.block, self.nrows, self.nranks * self.block))

    def block_range(self, rank: int) -> Tuple[int, int]:
        """``(first, stop)`` global rows of ``rank`` for a ``block`` distribution."""
        if self.kind != "block":
            raise DistributionError(f"block_range is only defined for block distributions, not {self.kind}")
        return self._offs[rank], self._offs[rank + 1]

    def segments(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Maximal runs of consecutive rows on one rank: ``(start, stop, owner, local_start)`` arrays.

        For redistribution and packing: a run is copied with one slice on each side.
        """
        n = self.nrows
        if self.kind == "replicated":
            z = np.zeros(1 if n else 0, dtype=np.int64)
            return z, z + n, z - 1, z
        if self.kind == "block":
            starts, stops = self._offsets[:-1], self._offsets[1:]
            keep = stops > starts
            return starts[keep].copy(), stops[keep].copy(), np.nonzero(keep)[0].astype(np.int64), \
                np.zeros(int(keep.sum()), dtype=np.int64)
        starts = np.arange(0, n, self.block, dtype=np.int64)
        stops = np.minimum(starts + self.block, n)
        return starts, stops, self.owner(starts), self.local_index(starts)

    # -- text -------------------------------------------------------------------------
    def describe(self) -> str:
        """One line saying where every row lives."""
        n, p = self.nrows, self.nranks
        if self.kind == "replicated":
            return f"replicated: each of the {p} ranks holds all {n} rows"
        head = f"{self.kind}" + (f" (block {self.block})" if self.kind == "block-cyclic" else "") + \
            f" over axis 0, {n} rows on {p} ranks: "
        if self.kind == "block":
            parts = []
            for r in range(p):
                lo, hi = self.block_range(r)
                parts.append(f"rows {lo}-{hi - 1} on rank {r}" if hi > lo else f"no rows on rank {r}")
            return head + ", ".join(parts)
        if self.kind == "cyclic":
            return head + f"row g on rank g % {p}"
        return head + f"rows [{self.block}k, {self.block}k+{self.block}) on rank k % {p}"

    def __repr__(self) -> str:
        extra = f", block={self.block}" if self.kind == "block-cyclic" else ""
        return f"Distribution({self.kind!r}, nrows={self.nrows}, nranks={self.nranks}{extra})"

    def __str__(self) -> str:
        return self.describe()


def make_distribution(spec: Any, nrows: int, nranks: int) -> Distribution:
    """Turn a ``dist=`` argument into a :class:`Distribution` of ``nrows`` rows on ``nranks`` ranks.

    Accepts ``"block"``, ``"cyclic"``, ``"replicated"``, ``("block-cyclic", b)`` (also
    ``"block-cyclic:b"``), or a Distribution (its kind and block size are reused).
    Raises :class:`DistributionError` saying what is accepted.
    """
    if isinstance(spec, Distribution):
        if spec.nranks != nranks:
            raise DistributionError(f"the distribution {spec!r} is for {spec.nranks} ranks but the "
                                    f"communicator has {nranks}")
        return spec.with_rows(nrows)
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s.startswith("block-cyclic"):
            _, _, b = s.partition(":")
            if not b:
                raise DistributionError("block-cyclic needs a block size: write dist=('block-cyclic', 64)")
            try:
                return Distribution("block-cyclic", nrows, nranks, int(b))
            except ValueError:
                raise DistributionError(f"block size {b!r} in {spec!r} is not an integer") from None
        return Distribution(s, nrows, nranks)
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str):
        kind = spec[0].strip().lower()
        if kind != "block-cyclic":
            raise DistributionError(f"only block-cyclic takes a block size, got {spec!r}")
        return Distribution(kind, nrows, nranks, spec[1])
    raise DistributionError(f"dist={spec!r} is not a distribution; expected 'block', 'cyclic', "
                            "'replicated', ('block-cyclic', block_size) or a Distribution")
