"""Scatter and gather of :class:`~nbmpi.workers.channels.channel.ArrayChannel`:
disjoint regions of the participants' buffers.

Regions are given by an axis split (``numpy.array_split`` sizes, in
participant order) or a map rank -> index range (a slice, ``(start, stop)``
along the axis, or a tuple of slices); they must be in bounds, have step 1 and
be disjoint (:meth:`_Regions.regions`). After ``scatter`` each rank's region of
its buffer equals that region of root's; after ``gather`` root's buffer holds
every rank's region. Non-contiguous regions travel as MPI subarray datatypes,
committed once per region (no copies); root starts one persistent request per
peer and region and waits for them in completion order.

:class:`_Regions` is a mixin of ``ArrayChannel``: its methods work on the
channel's own attributes. ``scatter``/``gather`` are collective over the
participants and blocking; ``regions`` is local.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from ..tracing import tracer as _tracing
from ..core import waiting
from ..core.errors import ChannelError, ChannelTimeout
from ..core.runtime import MPI
from .collectives import _UNSET

__all__: list = []

TAG_SCATTER, TAG_GATHER = 14, 15
K_SCATTER = _tracing.register_kind("scatter")
K_GATHER = _tracing.register_kind("gather")
_SEND, _RECV = _tracing.DIR_SEND, _tracing.DIR_RECV
_now = time.perf_counter_ns

Box = Tuple[Tuple[int, int], ...]
RegionSpec = Union[slice, range, Tuple[int, int], Tuple[slice, ...]]


class _Regions:
    """Mixin of ``ArrayChannel``: regions of the buffer, scatter and gather."""

    def regions(self, axis: int = 0, regions: Optional[Union[Mapping[int, RegionSpec],
                                                            Callable[[int], RegionSpec]]] = None
                ) -> Dict[int, Tuple[slice, ...]]:
        """The region (tuple of slices) of each participant for scatter/gather (local, no communication).

        Without ``regions``: ``axis`` is split into nearly equal contiguous
        blocks in participant order (``numpy.array_split`` sizes). With
        ``regions``: a mapping or callable ``rank -> spec``, where spec is a
        slice or ``(start, stop)`` along ``axis``, or a tuple of slices (one per
        dimension). Regions must be in bounds, have step 1 and be disjoint.
        """
        boxes = self._boxes(axis, regions, "regions")
        return {self.participants[i]: tuple(slice(a, b) for a, b in box) for i, box in boxes.items()}

    def _boxes(self, axis: int, regions, opname: str) -> Dict[int, Box]:
        nd = len(self.shape)
        if nd == 0:
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: a 0-d buffer has no regions")
        if not -nd <= axis < nd:
            raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: axis {axis} out of range "
                               f"for shape {self.shape}")
        axis %= nd
        full = [(0, s) for s in self.shape]
        boxes: Dict[int, Box] = {}
        if regions is None:
            edges = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(self.shape[axis]), self._n)])
            for i in range(self._n):
                b = list(full)
                b[axis] = (int(edges[i]), int(edges[i + 1]))
                boxes[i] = tuple(b)
            return boxes
        getter = regions if callable(regions) else (lambda p: regions.get(p))
        if not callable(regions):
            extra = [p for p in regions if p not in self._local_of]
            if extra:
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: regions given for "
                                   f"non-participants {extra} (participants: {self.participants})")
        for i, p in enumerate(self.participants):
            spec = getter(p)
            if spec is None:
                continue
            boxes[i] = self._box(spec, axis, full, p, opname)
        items = list(boxes.items())
        for x in range(len(items)):
            for y in range(x + 1, len(items)):
                (i, bi), (j, bj) = items[x], items[y]
                if all(max(a0, b0) < min(a1, b1) for (a0, a1), (b0, b1) in zip(bi, bj)) and \
                        all(a1 > a0 for a0, a1 in bi) and all(b1 > b0 for b0, b1 in bj):
                    raise ChannelError(
                        f"rank {self.rank}: {opname} on {self.name}: regions of ranks {self.participants[i]} "
                        f"{bi} and {self.participants[j]} {bj} overlap; regions must be disjoint")
        return boxes

    def _box(self, spec, axis: int, full: List[Tuple[int, int]], p: int, opname: str) -> Box:
        def one(s, extent: int, dim: int) -> Tuple[int, int]:
            if isinstance(s, range):
                s = slice(s.start, s.stop, s.step)
            if isinstance(s, tuple) and len(s) == 2 and all(isinstance(v, (int, np.integer)) for v in s):
                s = slice(int(s[0]), int(s[1]))
            if not isinstance(s, slice):
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: region of rank {p} is "
                                   f"{spec!r}; expected a slice, range or (start, stop) along the axis, "
                                   "or a tuple of slices")
            if s.step not in (None, 1):
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: region of rank {p} has step "
                                   f"{s.step}; only contiguous ranges (step 1) are supported")
            a = 0 if s.start is None else int(s.start)
            b = extent if s.stop is None else int(s.stop)
            if not 0 <= a <= b <= extent:
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: region of rank {p} "
                                   f"[{a}:{b}] is out of bounds for dimension {dim} of extent {extent}")
            return a, b

        if isinstance(spec, tuple) and spec and all(isinstance(s, slice) for s in spec):
            if len(spec) > len(full):
                raise ChannelError(f"rank {self.rank}: {opname} on {self.name}: region of rank {p} has "
                                   f"{len(spec)} slices for a {len(full)}-d buffer")
            box = [one(s, full[d][1], d) for d, s in enumerate(spec)] + full[len(spec):]
            return tuple(box)
        box = list(full)
        box[axis] = one(spec, full[axis][1], axis)
        return tuple(box)

    def _region_type(self, box: Box):
        t = self._types.get(box)
        if t is None:
            m = MPI()
            elem = m.BYTE.Create_contiguous(self.dtype.itemsize)
            t = elem.Create_subarray(list(self.shape), [b - a for a, b in box], [a for a, _ in box],
                                     order=m.ORDER_C).Commit()
            elem.Free()
            self._types[box] = t
        return t

    def scatter(self, root: int = 0, axis: int = 0, regions=None,
                timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Send each participant its region of ``root``'s buffer, into the same region of its own buffer.

        Collective over the participants (same ``axis``/``regions`` everywhere),
        blocking: root returns when every region was received. Returns this
        rank's region of its buffer (a view).
        """
        return self._scatter_gather(root, axis, regions, timeout, scatter=True)

    def gather(self, root: int = 0, axis: int = 0, regions=None,
               timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Collect each participant's region of its buffer into the same region of ``root``'s buffer.

        Collective over the participants, blocking. Returns root's whole
        buffer on root and this rank's region elsewhere.
        """
        return self._scatter_gather(root, axis, regions, timeout, scatter=False)

    def _scatter_gather(self, root: int, axis: int, regions, timeout, scatter: bool) -> np.ndarray:
        what = "scatter" if scatter else "gather"
        opname = f"{what}(root={root})"
        self._usable(opname)
        lroot = self._root(root, opname)
        boxes = self._boxes(axis, regions, opname)
        t = self._timeout(timeout)
        kind, tag = (K_SCATTER, TAG_SCATTER) if scatter else (K_GATHER, TAG_GATHER)
        me = self._lrank
        mine = boxes.get(me)
        if me == lroot:
            peers, reqs = [], []
            for i, box in boxes.items():
                if i == me or any(b <= a for a, b in box):
                    continue
                key = (what, i, box)
                dtype = self._region_type(box)
                if scatter:
                    req = self._req(key, lambda: self.comm.Ssend_init([self._bytes, 1, dtype], i, tag))
                else:
                    req = self._req(key, lambda: self.comm.Recv_init([self._bytes, 1, dtype], i, tag))
                peers.append(i)
                reqs.append(req)
            t0 = _now()
            for req in reqs:
                req.Start()
            direction = _SEND if scatter else _RECV
            for k in waiting.wait_each(reqs, t, self.rank, [self.participants[i] for i in peers], opname,
                                       ChannelTimeout, self._abandoned(opname), cancellable=not scatter):
                i = peers[k]
                nb = int(np.prod([b - a for a, b in boxes[i]])) * self.dtype.itemsize
                # each message's slice spans its posting to its completion (they overlap on the root's lane,
                # the trace's states lay them end to end): a peer's receive never ends before it starts
                self._trace_p2p(kind, direction, i, tag, nb, t0)
            return self._buffer if not scatter else self._region_view(mine)
        if mine is not None and all(b > a for a, b in mine):
            dtype = self._region_type(mine)
            key = (what, lroot, mine)
            if scatter:
                req = self._req(key, lambda: self.comm.Recv_init([self._bytes, 1, dtype], lroot, tag))
            else:
                req = self._req(key, lambda: self.comm.Ssend_init([self._bytes, 1, dtype], lroot, tag))
            t0 = _now()
            req.Start()
            self._wait(req, t, lroot, opname, sending=not scatter)
            nb = int(np.prod([b - a for a, b in mine])) * self.dtype.itemsize
            self._trace_p2p(kind, _RECV if scatter else _SEND, lroot, tag, nb, t0)
        return self._region_view(mine)

    def _region_view(self, box: Optional[Box]) -> np.ndarray:
        if box is None:
            return self._buffer[tuple(slice(0, 0) for _ in self.shape)]
        return self._buffer[tuple(slice(a, b) for a, b in box)]
