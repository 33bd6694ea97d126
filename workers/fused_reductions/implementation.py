"""Which implementation of the shared-variable hot path runs: compiled or pure Python.

The compiled part is optional (built by ``pip install`` with Cython when a C
compiler is there): :data:`core` is the compiled module ``_core`` or None, and
:data:`IMPLEMENTATION` says which implementation runs; ``NBMPI_PURE_PYTHON=1``
selects the pure-Python reference, which has the same semantics. The compiled
MPI glue (``_direct_mpi``) is loaded by :func:`direct_mpi` at the first force
point, once MPI is initialised. Local; importing this does not initialise MPI.
"""
from __future__ import annotations

from typing import Any, Optional

from ..core.switches import env_switch

PURE_PYTHON_ENV = "NBMPI_PURE_PYTHON"
#: ``NBMPI_DIRECT_MPI=0``: the compiled force point calls Start/Test through mpi4py
#: instead of calling the MPI library directly (same semantics, slower).
DIRECT_MPI_ENV = "NBMPI_DIRECT_MPI"

core: Any = None
if not env_switch(PURE_PYTHON_ENV, default=False):
    try:
        from . import _core as core
    except ImportError:   # not built (no C compiler at install): the pure-Python implementation
        core = None
#: which implementation of the float64-scalar hot path runs: "compiled" (the Cython
#: extension ``_core``) or "python" (not built, or ``NBMPI_PURE_PYTHON=1``).
#: Both have the same semantics; the compiled one only makes the common cases cheaper.
IMPLEMENTATION = "compiled" if core is not None else "python"

_DIRECT: Any = False   # not loaded yet


def direct_mpi() -> Optional[Any]:
    """The compiled MPI glue ``_direct_mpi`` (``DirectRunner``, ``op_create``), or None
    with the pure-Python implementation or when it cannot be loaded (not built, or this
    mpi4py uses another MPI library than the one it was compiled against). Imports
    ``mpi4py.MPI``: call it once MPI may be initialised. Local."""
    global _DIRECT
    if _DIRECT is False:
        _DIRECT = None
        if core is not None:
            try:
                from . import _direct_mpi
            except (ImportError, ValueError):   # not built / another MPI ABI (mpi4py's type sizes differ)
                pass
            else:
                _DIRECT = _direct_mpi
    return _DIRECT
