"""The SPMD agreement check: do all ranks call the same thing with the same arguments?

Every nbmpi component whose collective calls must match between the ranks (a channel's
or an aggregator's construction, a distributed-array force point, a fused reduction,
an irregular copy's index check, a node's shared-memory set-up) checks it here, and
names the first difference with the same text on every rank:

* :func:`agree` -- blocking: one small allreduce of a digest of each rank's
  ``signature``; only when the digests differ are the signatures gathered and
  compared (:func:`first_difference`).
* :class:`KeyCheck` -- the same digest comparison, non-blocking: post it early, let
  the rank work, :meth:`KeyCheck.wait` before the next collective.
* :func:`gather` -- every rank's picklable object, in rank order (error paths).
* :func:`first_difference` -- local: the first position where the ranks' sequences
  differ; the reference is what most ranks had (ties: the lowest rank's), so the
  ranks that differ are named identically everywhere.
* :func:`all_ok` -- collective AND of one flag per rank.
* :func:`translate_ranks` -- ranks of one communicator as ranks of another (-1 where
  a process is not in the other one).

Every blocking wait goes through :func:`nbmpi.workers.core.waiting.wait`: it honours
``timeout`` (None: forever), stays interruptible (Ctrl-C) and raises ``error(rank,
None, op, waited)`` (default :class:`~nbmpi.workers.core.errors.CommTimeout`) naming
the waiting rank and the operation. Collective requests are never cancelled (MPI
cannot), so a communicator on which a check timed out must not be used again for
another check before the other ranks joined it.
"""
from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from . import waiting
from .errors import CommTimeout
from .runtime import MPI

__all__ = ["Difference", "KeyCheck", "agree", "all_ok", "digest", "first_difference", "gather", "number_key",
           "translate_ranks"]

#: Mask keeping a key within 62 bits, so that ``-key`` never overflows an int64.
_KEY_BITS = 62


@dataclass(frozen=True)
class Difference:
    """Where the ranks' sequences first differ (see :func:`first_difference`).

    Ranks are positions in the list given to :func:`first_difference` (for :func:`agree`:
    ranks of its communicator).
    """

    #: Position of the first differing item in the sequences (0 for :func:`agree`).
    index: int
    #: Every rank's item at ``index``; None for a rank whose sequence ended before it.
    items: Tuple[Any, ...]
    #: The item most ranks had at ``index`` (ties: the lowest such rank's); None if that is an end.
    reference: Any
    #: Ranks whose item equals the reference, ascending.
    agreeing: Tuple[int, ...]
    #: The other ranks, ascending (never empty).
    differing: Tuple[int, ...]
    #: Ranks whose sequence ended before ``index``, ascending.
    ended: Tuple[int, ...] = ()

    def text(self, show: Callable[[Any], str] = repr) -> str:
        """One sentence naming the difference, e.g. ``item 2: rank(s) [1] had 'b', rank(s) [0, 2] had 'a'``;
        ``show`` renders an item. The same on every rank that holds the same Difference. Local."""
        def item(r: int) -> Any:
            return _END if r in self.ended else self.items[r]

        def had(r: int) -> str:
            return "nothing (its sequence ended)" if r in self.ended else show(self.items[r])

        groups: List[List[int]] = []   # the differing ranks, grouped by equal items
        for r in self.differing:
            g = next((g for g in groups if _same(item(g[0]), item(r))), None)
            if g is None:
                groups.append([r])
            else:
                g.append(r)
        parts = [f"rank(s) {g} had {had(g[0])}" for g in groups]
        parts.append(f"rank(s) {list(self.agreeing)} had {had(self.agreeing[0])}")
        return f"item {self.index}: " + ", ".join(parts)


def _equal(a: Any, b: Any) -> bool:
    """``a == b`` as one bool (NumPy arrays: same shape, dtype and values)."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # e.g. containers of arrays: compare what pickling them gives
        return pickle.dumps(a) == pickle.dumps(b)


_END = object()   # marks the position after the end of a rank's sequence


def first_difference(per_rank_items: Sequence[Sequence[Any]]) -> Optional[Difference]:
    """The first position where the ranks' item sequences differ, or None if they are equal.

    ``per_rank_items[r]`` is rank ``r``'s sequence (of any length); items are compared with
    ``==`` (NumPy arrays by shape, dtype and values). At the first position where not every
    rank has an equal item (a rank whose sequence ended counts as having "nothing"), the
    reference is the item most ranks had, ties going to the lowest rank's; the result names
    the ranks that agree with it and those that differ. Deterministic: ranks that pass the
    same lists (e.g. after :func:`gather`) get equal Differences, hence the same text.
    Local, no communication.
    """
    seqs = [list(s) for s in per_rank_items]
    if len(seqs) < 2:
        return None
    for i in range(max(len(s) for s in seqs)):
        items = [s[i] if i < len(s) else _END for s in seqs]
        if all(_same(items[0], it) for it in items[1:]):
            continue
        counts = [sum(_same(a, b) for b in items) for a in items]
        ref = max(range(len(items)), key=lambda r: (counts[r], -r))
        agreeing = tuple(r for r in range(len(items)) if _same(items[ref], items[r]))
        differing = tuple(r for r in range(len(items)) if r not in agreeing)
        ended = tuple(r for r in range(len(items)) if items[r] is _END)
        shown = tuple(None if it is _END else it for it in items)
        return Difference(i, shown, shown[ref], agreeing, differing, ended)
    return None


def _same(a: Any, b: Any) -> bool:
    if a is _END or b is _END:
        return a is b
    return _equal(a, b)


def number_key(obj: Any) -> int:
    """A 62-bit key of ``obj``, a number or a (nested) tuple of numbers, equal in every process
    (Python's ``hash`` of numbers and tuples does not depend on the process; that of ``str``
    and ``bytes`` does, so use :func:`digest` for those). Fast; local."""
    return hash(obj) >> (64 - _KEY_BITS)


def digest(obj: Any) -> int:
    """A 62-bit key of any picklable ``obj`` (BLAKE2b of its pickle), equal in every process for
    equal objects of the same types. Local."""
    h = hashlib.blake2b(pickle.dumps(obj, protocol=4), digest_size=8).digest()
    return int.from_bytes(h, "little", signed=True) >> (64 - _KEY_BITS)


class KeyCheck:
    """A non-blocking agreement on one integer key (and a count) between the ranks of ``comm``.

    Collective: every rank of ``comm`` creates one, in the same order as its other collectives
    there. The constructor posts one allreduce (MAX) of ``(key, -key, count, -count)`` and
    returns at once; :meth:`wait` blocks until it completed; :attr:`agreed` then says whether
    every rank passed the same key and count. ``key`` must fit in 62 bits (signed; as
    :func:`number_key` and :func:`digest` give). The request is available as :attr:`req` for
    callers that complete it among their other requests.
    """

    def __init__(self, comm: Any, key: int, count: int = 0):
        self.mine = np.array([key, -key, count, -count], dtype=np.int64)
        self.got = np.empty(4, dtype=np.int64)
        #: The allreduce in flight (an ``MPI.Request``).
        self.req = comm.Iallreduce(self.mine, self.got, op=MPI().MAX)

    def wait(self, timeout: Optional[float], rank: int, op: str,
             error: Callable[..., CommTimeout] = CommTimeout) -> bool:
        """Block until the check completed (at most ``timeout`` s: then ``error(rank, None, op,
        waited)``; the request is left to complete with the other ranks); return :attr:`agreed`.
        Called by the rank that created the check."""
        waiting.wait(self.req, timeout, rank, None, op, error, cancellable=False)
        return self.agreed

    @property
    def agreed(self) -> bool:
        """True if every rank passed the same key and count (valid once :attr:`req` completed)."""
        g = self.got
        return bool(g[0] == -g[1] and g[2] == -g[3])


def gather(comm: Any, obj: Any, *, timeout: Optional[float] = None, rank: Optional[int] = None,
           op: str = "gathering every rank's signature", error: Callable[..., CommTimeout] = CommTimeout) -> List[Any]:
    """Every rank's picklable ``obj``, in rank order of ``comm``; the same list on every rank.

    Collective over ``comm``, blocking: two non-blocking allgathers (the pickles' sizes, then
    the pickles), each waited for at most ``timeout`` s; on timeout ``error(rank, None, op,
    waited)`` (``rank`` defaults to this rank of ``comm``). Meant for error paths and small
    objects: it pickles.
    """
    me = comm.Get_rank() if rank is None else rank
    mine = np.frombuffer(pickle.dumps(obj, protocol=4), dtype=np.uint8)
    n = comm.Get_size()
    sizes = np.zeros(n, dtype=np.int64)
    req = comm.Iallgather(np.array([mine.size], dtype=np.int64), sizes)
    waiting.wait(req, timeout, me, None, op + " (sizes)", error, cancellable=False)
    allb = np.empty(int(sizes.sum()), dtype=np.uint8)
    displs = np.zeros(n, dtype=np.int64)
    displs[1:] = np.cumsum(sizes)[:-1]
    req = comm.Iallgatherv(mine, [allb, (sizes, displs), MPI().BYTE])
    waiting.wait(req, timeout, me, None, op, error, cancellable=False)
    return [pickle.loads(allb[d:d + s].tobytes()) for d, s in zip(displs.tolist(), sizes.tolist())]


def agree(comm: Any, signature: Any, *, timeout: Optional[float] = None, rank: Optional[int] = None,
          op: str = "checking that every rank made the same call",
          error: Callable[..., CommTimeout] = CommTimeout) -> Optional[Difference]:
    """Did every rank of ``comm`` pass an equal ``signature``? None if so, else the :class:`Difference`
    (``index`` 0; ``items``: every rank's whole signature; ranks of ``comm``), equal on every rank.

    Collective over ``comm``, blocking. ``signature`` is any picklable object (a tuple of the call's
    name and arguments, shapes, dtypes...). Cost when the ranks agree: one allreduce of 32 bytes
    (of :func:`digest`); otherwise :func:`gather` and :func:`first_difference` follow. Waits at most
    ``timeout`` s each, then ``error(rank, None, op, waited)`` (``rank`` defaults to this rank of
    ``comm``).
    """
    me = comm.Get_rank() if rank is None else rank
    if KeyCheck(comm, digest(signature)).wait(timeout, me, op, error):
        return None
    sigs = gather(comm, signature, timeout=timeout, rank=me, op=op + ": naming the difference", error=error)
    return first_difference([[s] for s in sigs])


def all_ok(comm: Any, ok: bool, *, timeout: Optional[float] = None, rank: Optional[int] = None,
           op: str = "agreeing that every rank succeeded", error: Callable[..., CommTimeout] = CommTimeout) -> bool:
    """True on every rank if ``ok`` is true on every rank of ``comm``, else False on every rank.

    Collective over ``comm``, blocking: one allreduce (MIN) of 8 bytes, waited for at most
    ``timeout`` s, then ``error(rank, None, op, waited)`` (``rank`` defaults to this rank of
    ``comm``). Also a barrier: no rank returns before every rank called it.
    """
    mine = np.array([1 if ok else 0], dtype=np.int64)
    out = np.zeros(1, dtype=np.int64)
    req = comm.Iallreduce(mine, out, op=MPI().MIN)
    waiting.wait(req, timeout, comm.Get_rank() if rank is None else rank, None, op, error, cancellable=False)
    return bool(out[0])


def translate_ranks(from_comm: Any, ranks: Sequence[int], to_comm: Any) -> List[int]:
    """The ranks in ``to_comm`` of the processes that have ``ranks`` in ``from_comm``; -1 for a
    process that is not in ``to_comm``. Local (group arithmetic, no communication); any rank may
    call it, on communicators it belongs to."""
    m = MPI()
    src, dst = from_comm.Get_group(), to_comm.Get_group()
    try:
        got = m.Group.Translate_ranks(src, [int(r) for r in ranks], dst)
    finally:
        src.Free()
        dst.Free()
    return [-1 if r == m.UNDEFINED else int(r) for r in got]
