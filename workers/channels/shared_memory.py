"""Same-node shared-memory segments that back channel buffers.

Between two MPI processes on one node, MPICH moves a large message with two
copies (sender -> a shared bounce buffer -> receiver). If the channel buffers
themselves live in shared memory, the data can move with one copy, done by
both sides together (see :mod:`nbmpi.workers.channels._node_copy`).

:class:`NodeSegments` gives each rank of a communicator one shared-memory
segment and maps the segments of the other ranks on the same node
(``MPI_COMM_TYPE_SHARED``). A segment is an optional *header* (for control
words, page-aligned, zeroed) followed by the data. How a segment is made, in
order of preference:

1. ``memfd``: an anonymous memory file (``memfd_create``), opened by the node
   peers through ``/proc/<pid>/fd/<fd>``. It has no name anywhere, so nothing
   can be left behind even if a process is killed, and it is not limited by
   the size of ``/dev/shm`` (a container's ``/dev/shm`` is often 64 MiB).
2. ``/dev/shm`` file: where ``/proc`` does not give access to the peers' files
   (separate PID namespaces, ``hidepid``). Unlinked as soon as all node peers
   have mapped it.

The pages are reserved at creation (``posix_fallocate``) so a lack of memory
means a fallback, never a crash on first use, and mapped with
``MAP_POPULATE`` so the first transfer does not pay the page faults.
Creation is collective over the communicator. If any rank of a node cannot
create or map a segment either way, the whole node does without
(:attr:`NodeSegments.enabled` is False there and :attr:`NodeSegments.how`
says why), so every pair of ranks decides the same way. Closing is local.
"""
from __future__ import annotations

import mmap
import os
import secrets
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..core import spmd
from ..core.runtime import MPI

SHM_DIR = "/dev/shm"
#: The ways to make a segment, in the order tried by default.
METHODS = ("memfd", "file")
_NAME_BYTES = 96
_PAGE = mmap.PAGESIZE
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


class NodeSegments:
    """One shared-memory segment per rank of ``comm`` (a ``header_bytes`` header, then ``nbytes`` of data),
    mapped by the node peers.

    Collective over ``comm`` (every rank must construct it, with the same
    ``nbytes`` and ``header_bytes``; ``want=False`` on any rank of a node
    disables it on that node). ``mine`` is this rank's data as a zeroed
    ``uint8`` array, ``header`` its header (zeroed, ``header_bytes`` long);
    ``peer(r)`` / ``peer_header(r)`` are rank ``r``'s (``r`` a rank of ``comm``)
    if it is on this node, else None. ``how`` is ``"memfd"``, ``"/dev/shm file"``
    or the reason there is no sharing. No method blocks or communicates after
    construction. ``methods`` are the ways to try, in order (see the module
    docstring; the same on every rank).
    """

    def __init__(self, comm, nbytes: int, want: bool = True, header_bytes: int = 0,
                 methods: Sequence[str] = METHODS):
        m = MPI()
        self.nbytes = int(nbytes)
        self.header_bytes = int(header_bytes)
        self._hdr = -(-self.header_bytes // _PAGE) * _PAGE       # data starts on a page boundary
        self._peers: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self.mine: Optional[np.ndarray] = None
        self.header: Optional[np.ndarray] = None
        self.how = ("not wanted" if not want else
                    "no node peers: no other participant runs on this rank's node (MPI_COMM_TYPE_SHARED), "
                    "so every transfer is an MPI message")
        unknown = [x for x in methods if x not in METHODS]
        if unknown:
            raise ValueError(f"NodeSegments: unknown methods {unknown}; expected some of {METHODS}")
        self._methods = [self._memfd if x == "memfd" else self._dev_shm for x in methods]
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
        """Rank ``rank``'s data (a rank of the constructing ``comm``), or None if not on this node."""
        p = self._peers.get(rank)
        return None if p is None else p[1]

    def peer_header(self, rank: int) -> Optional[np.ndarray]:
        """Rank ``rank``'s header, or None if not on this node."""
        p = self._peers.get(rank)
        return None if p is None else p[0]

    def peer_ranks(self) -> List[int]:
        """Ranks (of the constructing ``comm``) whose segments this rank has mapped, ascending."""
        return sorted(self._peers)

    def close(self) -> None:
        """Drop the peers' mappings (local). Arrays still referencing a segment keep it alive."""
        self._peers.clear()

    # ------------------------------------------------------------------------------------------
    def _setup(self, comm, node, want: bool) -> None:
        if node.Get_size() == 1:  # the same on every rank of the node: nobody communicates further
            return
        size = self._hdr + max(self.nbytes, 1)
        reasons = []
        for method in self._methods:
            done, why = method(comm, node, size, want)
            if done:
                return
            reasons.append(why)
        self.how = "not wanted" if not want else "no shared memory: " + "; ".join(reasons)

    def _agree(self, node, ok: bool) -> bool:
        return spmd.all_ok(node, ok, op="setting up node shared memory (every node peer mapped the segments?)")

    def _exchange(self, comm, node, handle: str, size: int, attach) -> Tuple[bool, str]:
        """Allgather the handles, map every peer's segment with ``attach(handle)``, agree."""
        names = np.zeros((node.Get_size(), _NAME_BYTES), dtype=np.uint8)
        mine = np.zeros(_NAME_BYTES, dtype=np.uint8)
        mine[: len(handle)] = np.frombuffer(handle.encode(), dtype=np.uint8)
        node.Allgather(mine, names)
        node_ranks = list(range(node.Get_size()))
        comm_ranks = spmd.translate_ranks(node, node_ranks, comm)
        me = node.Get_rank()
        peers: Dict[int, np.ndarray] = {}
        why = ""
        for nr, cr in zip(node_ranks, comm_ranks):
            if nr == me:
                continue
            peer_handle = bytes(names[nr]).rstrip(b"\0").decode()
            view = attach(peer_handle, size)
            if view is None:
                why = f"could not map {peer_handle}"
                break
            peers[int(cr)] = view
        # doubles as the "everyone has mapped" barrier before the creators drop their names
        if not self._agree(node, not why):
            return False, why or "a node peer could not map a segment"
        self._peers = {r: (v[: self.header_bytes], v[self._hdr: self._hdr + self.nbytes]) for r, v in peers.items()}
        return True, ""

    def _adopt(self, seg: np.ndarray, how: str) -> None:
        self.header = seg[: self.header_bytes]
        self.mine = seg[self._hdr: self._hdr + self.nbytes]
        self.how = how

    def _memfd(self, comm, node, size: int, want: bool) -> Tuple[bool, str]:
        fd, seg = -1, None
        if want and hasattr(os, "memfd_create"):
            try:
                fd = os.memfd_create("nbmpi-channel", os.MFD_CLOEXEC)
                os.posix_fallocate(fd, 0, size)
                seg = _map(fd, size)
            except OSError:
                seg = None
        try:
            if not self._agree(node, seg is not None):
                return False, "memfd: not wanted or not available on every rank of the node"
            ok, why = self._exchange(comm, node, f"{os.getpid()}:{fd}", size, _attach_proc_fd)
            if ok:
                self._adopt(seg, "memfd")
            return ok, "memfd: " + why if why else ""
        finally:
            if fd >= 0:
                os.close(fd)

    def _dev_shm(self, comm, node, size: int, want: bool) -> Tuple[bool, str]:
        name = f"nbmpi-{os.getpid()}-{secrets.token_hex(8)}"
        path = os.path.join(SHM_DIR, name)
        seg = _create_file(path, size) if want else None
        try:
            if not self._agree(node, seg is not None):
                return False, (f"{SHM_DIR}: not wanted or no room for a {size}-byte file on every rank of the "
                               "node")
            ok, why = self._exchange(comm, node, name, size,
                                     lambda h, s: _attach_file(os.path.join(SHM_DIR, h), s))
            if ok:
                self._adopt(seg, f"{SHM_DIR} file")
            return ok, f"{SHM_DIR}: " + why if why else ""
        finally:
            if seg is not None:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


def _map(fd: int, size: int) -> np.ndarray:
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
    return np.frombuffer(mm, dtype=np.uint8)


def _attach_proc_fd(handle: str, size: int) -> Optional[np.ndarray]:
    pid, fd = handle.split(":")
    try:
        f = os.open(f"/proc/{int(pid)}/fd/{int(fd)}", os.O_RDWR)
    except (OSError, ValueError):
        return None
    try:
        if os.fstat(f).st_size < size:
            return None
        return _map(f, size)
    except OSError:
        return None
    finally:
        os.close(f)


def _create_file(path: str, size: int) -> Optional[np.ndarray]:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:
        return None
    try:
        # Reserve the pages now: a merely truncated (sparse) file on a full tmpfs would
        # fail later with SIGBUS on first touch instead of falling back here.
        os.posix_fallocate(fd, 0, size)
        return _map(fd, size)
    except OSError:
        os.unlink(path)
        return None
    finally:
        os.close(fd)


def _attach_file(path: str, size: int) -> Optional[np.ndarray]:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < size:
            return None
        return _map(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)
