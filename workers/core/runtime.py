"""MPI start-up for nbmpi: thread level, the world communicator, timeouts and tracing switches from the environment.

Importing this module does NOT initialise MPI. The first call to :func:`world`
(or anything that needs MPI) imports ``mpi4py.MPI``, which initialises MPI with
the thread level chosen here:

* default ``funneled``: measured on MPICH 5, mpi4py's own default ``multiple``
  doubles small-message latency and slows large reductions ~2.5x;
* overridable with mpi4py's usual environment variable
  ``MPI4PY_RC_THREAD_LEVEL`` (``single``, ``funneled``, ``serialized``,
  ``multiple``), which always wins.

This module imports nothing from nbmpi; the collective start of the runtime
(tracer, clock alignment) is :func:`nbmpi.workers.tracing.startup.init`, above it.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Optional

import mpi4py

from .switches import env_switch

if TYPE_CHECKING:  # pragma: no cover
    from mpi4py import MPI as _MPI

DEFAULT_THREAD_LEVEL = "funneled"
THREAD_LEVEL_ENV = "MPI4PY_RC_THREAD_LEVEL"
#: Environment variable giving the default timeout (seconds) of blocking
#: communication; unset or empty means wait forever (still interruptible).
TIMEOUT_ENV = "NBMPI_TIMEOUT"
#: Environment variable switching tracing off when set to 0/false/off.
TRACE_ENV = "NBMPI_TRACE"


def configure_thread_level() -> str:
    """Set mpi4py's requested thread level before MPI is initialised.

    Returns the level that will be requested. Has no effect (and returns the
    level in force) once ``mpi4py.MPI`` has been imported elsewhere.
    """
    level = os.environ.get(THREAD_LEVEL_ENV, "").strip() or DEFAULT_THREAD_LEVEL
    if "mpi4py.MPI" not in __import__("sys").modules:
        mpi4py.rc.thread_level = level
    return str(mpi4py.rc.thread_level)


def MPI() -> "_MPI":  # noqa: N802 - mirrors the module name
    """Return the ``mpi4py.MPI`` module, initialising MPI (funneled) on first use."""
    configure_thread_level()
    from mpi4py import MPI as _m

    return _m


def world():
    """Return ``MPI.COMM_WORLD`` (initialising MPI on first use)."""
    return MPI().COMM_WORLD


def default_timeout() -> Optional[float]:
    """The default timeout in seconds for blocking communication (``NBMPI_TIMEOUT``).

    ``None`` (the default) waits forever; the wait stays interruptible by SIGINT.
    """
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{TIMEOUT_ENV}={raw!r} is not a number of seconds; set it to e.g. 30 or unset it"
        ) from None
    return value if value > 0 else None


def tracing_enabled_by_env() -> bool:
    """False when ``NBMPI_TRACE`` is 0/false/off/no, else True."""
    return env_switch(TRACE_ENV)

