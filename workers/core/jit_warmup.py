"""Numba's one-time start, done in a background thread so a program's first kernel does not wait for it.

The first numba kernel a process runs, compiled or loaded from the on-disk cache, pays numba's start:
``CPUContext.refresh()`` imports and registers numba's implementation registries (``numba.typed``, the
NumPy and random implementations, cffi support with its C parser...). Measured on this project's
2-core machine under load: 0.9 s, several times what loading all of one NumPy program's kernels from the
cache costs (0.04-0.25 s for 3-10 kernels). :func:`start` runs that refresh in a daemon thread, so it
overlaps with whatever the process does first (the rest of its imports, MPI start-up, creating arrays,
waiting for peers); a kernel needed before it ends waits on numba's own compiler lock, which the thread
holds, and then finds the work done (never done twice). Measured (black_scholes, 2 ranks, load 9-10):
the first kernel's wait for numba went from 0.9-1.3 s to 0.14-0.5 s. The thread's CPU time is spent even
by a process that never runs a kernel, and its Python work shares the GIL with the main thread.

Who calls: :mod:`nbmpi.workers.distarray` on import (``NBMPI_JIT_WARMUP=0`` turns it off). Non-blocking;
idempotent; thread-safe. Fork safety: a ``fork()`` while the thread holds numba's compiler lock would
leave the child with that lock taken for good, so the parent joins the thread before every fork
(``os.register_at_fork``, at most :data:`FORK_WAIT_S` seconds).
"""
from __future__ import annotations

import os
import threading
from typing import Optional

from .switches import env_switch

__all__ = ["start", "wait", "enabled", "state"]

_lock = threading.Lock()
_thread: Optional[threading.Thread] = None
_state = dict(started=False, done=False, seconds=None, error=None)


def enabled() -> bool:
    """``NBMPI_JIT_WARMUP`` as a bool (default True; ``0``/``off``/``false``/``no`` turn it off)."""
    return env_switch("NBMPI_JIT_WARMUP")


def _run() -> None:
    import time

    t0 = time.perf_counter()
    try:
        from numba.core.compiler_lock import global_compiler_lock
        from numba.core.registry import cpu_target

        with global_compiler_lock:        # the lock numba's own compile and cache load take
            cpu_target.target_context.refresh()
    except Exception as exc:  # noqa: BLE001 - a failed warm-up only loses its gain: numba retries on first use
        _state["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        _state["seconds"] = time.perf_counter() - t0
        _state["done"] = True


def start() -> bool:
    """Start the warm-up thread unless it ran already or ``NBMPI_JIT_WARMUP`` is off; returns whether a
    thread was started by this call. Local, non-blocking."""
    global _thread
    if not enabled():
        return False
    with _lock:
        if _state["started"]:
            return False
        _state["started"] = True
        _thread = threading.Thread(target=_run, name="nbmpi-jit-warmup", daemon=True)
        _thread.start()
        return True


def wait(timeout: Optional[float] = None) -> bool:
    """Block until the warm-up thread ended (at most ``timeout`` seconds; None: no bound); True if it
    ended or never started. Local."""
    t = _thread
    if t is None or t is threading.current_thread():
        return True
    t.join(timeout)
    return not t.is_alive()


def state() -> dict:
    """A copy of the warm-up's state: ``started``, ``done``, ``seconds`` (its duration), ``error``
    (None, or what failed: numba then starts on first use as without the warm-up). Local."""
    return dict(_state)


#: Longest a ``fork()`` waits for the warm-up thread (it takes about a second; a bound, so a fork never hangs).
FORK_WAIT_S = 120.0


def _before_fork() -> None:
    wait(FORK_WAIT_S)


os.register_at_fork(before=_before_fork)
