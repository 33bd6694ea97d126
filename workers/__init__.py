"""nbmpi worker runtime: what runs on every MPI rank.

* :class:`ArrayChannel` (``channels``): in-place channels with one persistent
  buffer per rank (put/take, reduce, allreduce, bcast, scatter, gather).
* :class:`Aggregator` (``aggregation``): per-destination buffers of small
  items, numba handlers on the destination, collective ``flush`` with
  termination detection.
* ``tracing`` / ``trace_analysis``: per-rank recording of every communication
  call, gathered in one call (:func:`gather_trace`) into a :class:`Trace` with
  Chrome/Perfetto export and a per-rank compute/comm/wait summary.
* ``fused_reductions``: lazy shared variables (:func:`shared`, :func:`pool`);
  all pending reductions resolve in one collective per force point.
* :func:`init` (``startup``): collective start (tracer, clock alignment); MPI thread level
  ``funneled`` unless ``MPI4PY_RC_THREAD_LEVEL`` says otherwise.

Importing this package does not initialise MPI (the first channel or
:func:`init` does) and imports nothing heavy: each public name is loaded from
its module on first use (PEP 562), so ``from nbmpi.workers import world`` or
``nbmpi run`` does not pay for numba unless the program uses a component that
needs it.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, List

#: Public name -> module (inside this package) that defines it.
_EXPORTS: Dict[str, str] = {
    "Aggregator": "aggregation",
    "ArrayChannel": "channels",
    "AggregationError": "errors", "AggregationTimeout": "errors", "ChannelError": "errors",
    "ChannelTimeout": "errors", "CommTimeout": "errors", "NbmpiError": "errors",
    "SharedVariableError": "errors", "SPMDDivergence": "errors",
    "Grant": "fused_reductions", "SharedPool": "fused_reductions", "SharedVar": "fused_reductions",
    "flush": "fused_reductions", "fused": "fused_reductions", "pool": "fused_reductions",
    "shared": "fused_reductions",
    "init": "startup", "world": "runtime",
    "Trace": "trace_analysis",
    "gather_trace": "tracing", "get_tracer": "tracing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_EXPORTS))
