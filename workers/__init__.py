"""nbmpi worker runtime: the MPI ranks' library, and the launching of ranks.

One subpackage per idea; each public name below is re-exported here.

* ``core``: MPI start-up (:func:`init`, :data:`world`), errors, waiting with a
  timeout path, the SPMD agreement check, the numba combining kernels.
* ``channels``: :class:`ArrayChannel`, in-place channels with one persistent
  buffer per rank (put/take, reduce, allreduce, bcast, scatter, gather) and
  the same-node shared-memory path.
* ``fused_reductions``: lazy shared variables (:func:`shared`, :func:`pool`);
  all pending reductions resolve in one collective per force point.
* ``aggregation``: :class:`Aggregator`, per-destination buffers of small items,
  numba handlers on the destination, collective ``flush`` with termination
  detection.
* ``distarray``: distributed NumPy arrays with latency hiding, and Block/Cyclic
  redistribution (``import nbmpi.workers.distarray as dnp``).
* ``tracing``: per-rank recording of every communication call, gathered in one
  call (:func:`gather_trace`) into a :class:`Trace`; its analysis, live stream
  and timeline figure (the figure runs where the trace is looked at, not on ranks).
* ``launch``: starting and supervising ranks (``nbmpi run``, the rank entry and
  guard, engine pools, ending processes).

MPI thread level is ``funneled`` unless ``MPI4PY_RC_THREAD_LEVEL`` says otherwise.
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
    "Aggregator": "aggregation.aggregator",
    "ArrayChannel": "channels.channel",
    "AggregationError": "core.errors", "AggregationTimeout": "core.errors", "ChannelError": "core.errors",
    "ChannelTimeout": "core.errors", "CommTimeout": "core.errors", "NbmpiError": "core.errors",
    "SharedVariableError": "core.errors", "SPMDDivergence": "core.errors",
    "Grant": "fused_reductions", "SharedPool": "fused_reductions", "SharedVar": "fused_reductions",
    "flush": "fused_reductions", "fused": "fused_reductions", "pool": "fused_reductions",
    "shared": "fused_reductions",
    "init": "tracing.startup", "world": "core.runtime",
    "Trace": "tracing.analysis",
    "gather_trace": "tracing.tracer", "get_tracer": "tracing.tracer",
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
