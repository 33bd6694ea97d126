"""Size boards: how a rank stuck in a fused collective finds that it can never complete.

Ranks whose pending data differ in size class pass different counts to MPI,
which then completes the collective on no rank (MPICH: every rank stays in
it). Each rank has a *size board*: three int64 words ``(seq, words, seq)`` in
an RMA window on the diagnosis communicator, written only on slow paths. A
rank still waiting in a force point after :data:`_WATCH_START` s reads its
peers' boards (``MPI_Rget``, passive target, never blocking) every
:data:`_WATCH_EVERY` s; a peer in the same collective with another size means
it can never complete (:class:`_SizeMismatch`), a peer that has not reached it
yet is only late.
"""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional

import numpy as np

from ..core import waiting
from ..core.errors import CommTimeout, NbmpiError
from ..core.runtime import MPI

# a force point still waiting after _WATCH_START s reads its peers' size boards, then every _WATCH_EVERY s
_WATCH_START, _WATCH_EVERY = 0.2, 0.2


class _SizeMismatch(NbmpiError):
    """Internal: a peer's size board shows the same fused collective with another size
    (:meth:`SizeBoards.watch`); the force point's wait turns it into the diagnosis."""


class SizeBoards:
    """This rank's size board and its reads of the peers' boards (one per fuser)."""

    def __init__(self, mpi, win, board: np.ndarray, rank: int, peers: List[int], addrs: List[int],
                 diag=None) -> None:
        self._mpi, self._win, self._board, self._rank, self._diag = mpi, win, board, rank, diag
        self._peers = peers
        self._addrs = addrs
        self._seen = np.full((max(len(peers), 1), 3), -1, dtype=np.int64)
        self._reads: List[Any] = [None] * len(peers)   # a pending Rget per peer (into _seen[i])

    @classmethod
    def open(cls, diag, rank: int, size: int, timeout: Optional[float],
             on_abandon: Callable[[], None]) -> Optional["SizeBoards"]:
        """The size boards on the diagnosis communicator ``diag``: three int64 words per
        rank in an RMA window, ``(k, words, k)`` for the fused collective #k this rank is
        stuck in (or diagnosing).

        Collective on ``diag``, right after the fuser's two ``Comm_idup`` completed (so
        every rank is here). Returns None without RMA support (the window cannot be
        made): a size divergence is then found by the timeout alone."""
        m = MPI()
        board = np.full(3, -1, dtype=np.int64)
        try:
            # a dynamic window over our own array; freed at exit by close() (collective, with a timeout)
            win = m.Win.Create_dynamic(comm=diag)
            win.Attach(board)
            addrs = np.zeros(size, dtype=np.int64)
            req = diag.Iallgather(np.array([m.Get_address(board)], dtype=np.int64), addrs)
            waiting.wait(req, timeout, rank, None, "fused reductions: first force point (size boards)",
                         CommTimeout, on_abandon, cancellable=False)
            win.Lock_all(m.MODE_NOCHECK)
        except m.Exception:   # pragma: no cover - every MPI-3 library has passive-target RMA
            return None
        peers = [p for p in range(size) if p != rank]
        return cls(m, win, board, rank, peers, [int(addrs[p]) for p in peers], diag)

    def close(self, usable: bool, timeout: float = 10.0) -> None:
        """Free the window before ``MPI_Finalize``; the fuser calls it at exit on every rank (``usable``: this
        rank's fuser was never abandoned). Idempotent. Blocks until every rank of the diagnosis communicator
        is here too and agrees that all were usable (an ``Iallreduce``, at most ``timeout`` s); then ends
        the passive-target epoch, detaches the board and frees the window (``MPI_Win_free`` is collective).
        When a peer does not arrive in time (it failed or is stuck) or some rank abandoned a collective (a
        read or a collective may still be pending), the window is left to ``MPI_Finalize``, which never
        hangs on it. Without the free, MPICH's ofi netmod fails to close its fabric at finalize across
        nodes ("fabricclose failed ... Device or resource busy")."""
        win, self._win = self._win, None
        m = self._mpi
        if win is None or m.Is_finalized():
            return
        mine, worst = np.array([0 if usable else 1], np.int64), np.zeros(1, np.int64)
        try:
            waiting.wait(self._diag.Iallreduce(mine, worst, op=m.MAX), timeout, self._rank, None,
                         "fused reductions: freeing the size boards at exit", CommTimeout, None, cancellable=False)
        except (CommTimeout, m.Exception):
            return
        if worst[0]:
            return
        try:
            win.Unlock_all()
            win.Detach(self._board)
            win.Free()
        except m.Exception:   # pragma: no cover - MPI_Finalize releases it then
            pass

    def publish(self, seq: int, words: int) -> None:
        """Write ``(seq, words, seq)`` to this rank's board (a reader takes it only when the
        two ``seq`` words agree, so a torn read is ignored). Local."""
        board = self._board
        board[2] = -2
        board[0] = seq
        board[1] = words
        board[2] = seq

    def watch(self, seq: int, words: int) -> Optional[Callable[[], None]]:
        """The ``check`` of the force point's wait: from ``_WATCH_START`` s on, publish
        this rank's ``(seq, words)`` and read each peer's board (``Rget``), again every
        ``_WATCH_EVERY`` s. A peer in (or diagnosing) the same collective #seq with a
        different size means MPI cannot complete it on any rank: raise
        :class:`_SizeMismatch`, which the wait turns into the diagnosis. A peer that
        has not reached #seq yet is just late: keep waiting.

        Never blocks: a read completes only when the peer's MPI library makes progress
        (MPICH: when the peer is in an MPI call, as a rank stuck in a force point is), so
        each peer's read is tested on its own, a peer whose read is still pending is not
        read again, and reads still pending when the wait ends stay parked here
        (``_reads``) for the next wait. A finished read of an older wait is still valid:
        a rank's board words for a given ``seq`` never change. Nothing is sent, so
        nothing is left to drain."""
        if not self._peers:
            return None
        m, win, seen, peers, addrs, reads = self._mpi, self._win, self._seen, self._peers, self._addrs, self._reads
        due = [time.monotonic() + _WATCH_START]
        rank = self._rank

        def check() -> None:
            now = time.monotonic()
            if now >= due[0]:
                due[0] = now + _WATCH_EVERY
                self.publish(seq, words)   # from now on peers may read it (repeating is harmless)
                for i, p in enumerate(peers):
                    if reads[i] is None:
                        reads[i] = win.Rget([seen[i], 3, m.INT64_T], p, target=(addrs[i], 3, m.INT64_T))
            for i, rq in enumerate(reads):
                if rq is not None and rq.Test():
                    reads[i] = None
                    k, w, k2 = seen[i].tolist()
                    if k == seq and k2 == seq and w != words:
                        raise _SizeMismatch(
                            f"rank {rank}: fused reduction #{seq} cannot complete: rank {peers[i]} is in "
                            f"it with {w} words, this rank with {words} (the ranks' pending data differ in size)")
        return check
