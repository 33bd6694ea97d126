"""Which implementation of the shared-variable hot path runs: compiled or pure Python.

The compiled core is optional: without a C compiler at install (or with
``NBMPI_PURE_PYTHON=1``) the pure-Python reference runs, with the same
semantics. :data:`core` is the compiled module or None; :data:`IMPLEMENTATION`
says which one runs. Local; importing this does not initialise MPI.
"""
from __future__ import annotations

import os
from typing import Any

PURE_PYTHON_ENV = "NBMPI_PURE_PYTHON"
#: ``NBMPI_DIRECT_MPI=0``: the compiled force point calls Start/Test through mpi4py
#: instead of calling the MPI library directly (same semantics, slower).
DIRECT_MPI_ENV = "NBMPI_DIRECT_MPI"

core: Any = None
if os.environ.get(PURE_PYTHON_ENV, "").strip() in ("", "0"):
    try:
        from .. import _fused_core as core
    except ImportError:   # not built (no C compiler at install): the pure-Python implementation
        core = None
#: which implementation of the float64-scalar hot path runs: "compiled" (the C
#: extension ``_fused_core``) or "python" (not built, or ``NBMPI_PURE_PYTHON=1``).
#: Both have the same semantics; the compiled one only makes the common cases cheaper.
IMPLEMENTATION = "compiled" if core is not None else "python"
