"""One question the process tests ask: is this pid still a running process?

A zombie counts as ended: it has exited and only waits for its parent (often
``init`` in a container) to reap it.
"""
from __future__ import annotations

import psutil


def running(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie. Never raises."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
