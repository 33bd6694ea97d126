"""The rank ledger: the one owner of the controller's rank capacity, for jobs and pools alike.

Every running batch job and every starting or running pool holds its ranks
in the ledger under a key (``("job", id)`` or ``("pool", id)``) from the
moment it is admitted until it ends. Jobs that run on a pool hold nothing
extra (they use the pool's ranks). ``capacity`` is ``--max-ranks``; ``None``
means the backend queues work itself (a Slurm cluster), so the ledger only
counts. Thread-safe: :meth:`try_hold` checks and takes ranks atomically, so
the scheduler's admission and pool creation never over-commit together.
"""
from __future__ import annotations

import threading
from typing import Dict, Hashable, Optional


class RankLedger:
    """Ranks held per key, within ``capacity`` (None: unlimited)."""

    def __init__(self, capacity: Optional[int]):
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be at least 1 rank or None, got {capacity}")
        self.capacity = capacity
        self._held: Dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def in_use(self) -> int:
        """Ranks held now."""
        with self._lock:
            return sum(self._held.values())

    def free(self) -> Optional[int]:
        """Ranks free now (None when unlimited)."""
        with self._lock:
            return None if self.capacity is None else self.capacity - sum(self._held.values())

    def try_hold(self, key: Hashable, ranks: int) -> bool:
        """Hold ``ranks`` for ``key`` if they fit; True on success. A key holds at most once."""
        with self._lock:
            if key in self._held:
                raise ValueError(f"{key} already holds {self._held[key]} ranks")
            if self.capacity is not None and sum(self._held.values()) + ranks > self.capacity:
                return False
            self._held[key] = int(ranks)
            return True

    def hold(self, key: Hashable, ranks: int) -> None:
        """Hold ``ranks`` for ``key`` whether they fit or not (work found running after a restart)."""
        with self._lock:
            self._held[key] = int(ranks)

    def release(self, key: Hashable) -> None:
        """Give back what ``key`` holds (nothing if it holds nothing)."""
        with self._lock:
            self._held.pop(key, None)

    def holders(self) -> Dict[Hashable, int]:
        """A copy of what each key holds now (key -> ranks)."""
        with self._lock:
            return dict(self._held)

    def holds(self, key: Hashable) -> bool:
        """True while ``key`` holds ranks."""
        with self._lock:
            return key in self._held
