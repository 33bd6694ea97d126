"""Same-node shared-memory segments that back channel buffers.

Between two MPI processes on one node, MPICH moves a large message with two
copies (sender -> a shared bounce buffer -> receiver), so a 1 MiB ping-pong
costs about two memcpys per hop. If the channel buffers themselves live in
shared memory, the data can move with one copy, done half by each side at the
same time (see :class:`~nbmpi.workers.channels.ArrayChannel`).

:class:`NodeSegments` gives each rank of a communicator one POSIX shared-memory
segment (a file in ``/dev/shm``, mapped with ``mmap``) and maps the segments
of the other ranks on the same node (``MPI_COMM_TYPE_SHARED``). Every segment
is unlinked as soon as all its node peers have mapped it, so nothing is left
in ``/dev/shm`` even if a process is killed; the memory is freed when the last
mapping goes away. Closing is local (no communication).

Creation is collective over the communicator. If any rank of a node cannot
create or map a segment (no ``/dev/shm``, no space), the whole node falls back
to no shared segments (:attr:`NodeSegments.enabled` is False on those ranks),
so the decision is the same on every pair of ranks. The pages are reserved at
creation (``posix_fallocate``), so a full ``/dev/shm`` means a fallback, never
a crash on first use.
"""
from __future__ import annotations

import mmap
import os
import secrets
from typing import Dict, Optional

import numpy as np

from .runtime import MPI

SHM_DIR = "/dev/shm"
_NAME_BYTES = 64


class NodeSegments:
    """One shared-memory segment of ``nbytes`` per rank of ``comm``, mapped by node peers.

    Collective over ``comm`` (every rank must construct it, with the same
    ``nbytes``; ``want=False`` on any rank of a node disables it on that node).
    ``mine`` is this rank's segment as a ``uint8`` array (zeroed);
    ``peer(r)`` is rank ``r``'s segment (``r`` a rank of ``comm``) if it is on
    this node, else None. No method blocks or communicates after construction.
    """

    def __init__(self, comm, nbytes: int, want: bool = True):
        m = MPI()
        self.nbytes = int(nbytes)
        self._peers: Dict[int, np.ndarray] = {}
        self.mine: Optional[np.ndarray] = None
        node = comm.Split_type(m.COMM_TYPE_SHARED)
        try:
            self._setup(comm, node, want)
        finally:
            node.Free()

    @property
    def enabled(self) -> bool:
        """True when this rank's buffer is shared with its node peers."""
        return self.mine is not None

    def peer(self, rank: int) -> Optional[np.ndarray]:
        """Rank ``rank``'s segment (a rank of the constructing ``comm``), or None if not on this node."""
        return self._peers.get(rank)

    def peer_ranks(self) -> list:
        """Ranks (of the constructing ``comm``) whose segments this rank has mapped, ascending."""
        return sorted(self._peers)

    def close(self) -> None:
        """Drop the peers' mappings (local). Arrays still referencing a segment keep it alive."""
        self._peers.clear()

    # ------------------------------------------------------------------------------------------
    def _setup(self, comm, node, want: bool) -> None:
        m = MPI()
        size = max(self.nbytes, 1)
        name = f"nbmpi-{os.getpid()}-{secrets.token_hex(8)}"
        path = os.path.join(SHM_DIR, name)
        mine: Optional[np.ndarray] = None
        if want and node.Get_size() > 1:
            mine = self._create(path, size)
        ok = np.array([1 if mine is not None else 0], dtype=np.int64)
        names = np.zeros((node.Get_size(), _NAME_BYTES), dtype=np.uint8)
        mine_name = np.zeros(_NAME_BYTES, dtype=np.uint8)
        mine_name[: len(name)] = np.frombuffer(name.encode(), dtype=np.uint8)
        all_ok = np.zeros(1, dtype=np.int64)
        node.Allreduce(ok, all_ok, op=m.MIN)
        peers: Dict[int, np.ndarray] = {}
        if all_ok[0]:
            node.Allgather(mine_name, names)
            node_ranks = list(range(node.Get_size()))
            comm_ranks = m.Group.Translate_ranks(node.Get_group(), node_ranks, comm.Get_group())
            me = node.Get_rank()
            for nr, cr in zip(node_ranks, comm_ranks):
                if nr == me:
                    continue
                pname = bytes(names[nr]).rstrip(b"\0").decode()
                view = self._attach(os.path.join(SHM_DIR, pname), size)
                if view is None:
                    ok[0] = 0
                    break
                peers[int(cr)] = view
            node.Allreduce(ok, all_ok, op=m.MIN)  # doubles as the "everyone has mapped" barrier
        if mine is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if all_ok[0]:
            self.mine = mine[: self.nbytes]
            self._peers = {r: v[: self.nbytes] for r, v in peers.items()}

    @staticmethod
    def _create(path: str, size: int) -> Optional[np.ndarray]:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError:
            return None
        try:
            # Reserve the pages now: a merely truncated (sparse) file on a full tmpfs would
            # fail later with SIGBUS on first touch instead of falling back here.
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size)
        except OSError:
            os.unlink(path)
            return None
        finally:
            os.close(fd)
        return np.frombuffer(mm, dtype=np.uint8)

    @staticmethod
    def _attach(path: str, size: int) -> Optional[np.ndarray]:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < size:
                return None
            mm = mmap.mmap(fd, size)
        except OSError:
            return None
        finally:
            os.close(fd)
        return np.frombuffer(mm, dtype=np.uint8)

