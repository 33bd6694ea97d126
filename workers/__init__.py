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

Importing this package does not initialise MPI; the first channel (or
:func:`init`) does.
"""
from .aggregation import Aggregator
from .channels import ArrayChannel
from .errors import AggregationError, AggregationTimeout, ChannelError, ChannelTimeout, CommTimeout, NbmpiError
from .errors import SharedVariableError, SPMDDivergence
from .fused_reductions import Grant, SharedPool, SharedVar, flush, fused, pool, shared
from .runtime import world
from .startup import init
from .trace_analysis import Trace
from .tracing import gather_trace, get_tracer

__all__ = [
    "AggregationError", "AggregationTimeout", "Aggregator",
    "ArrayChannel", "ChannelError", "ChannelTimeout", "CommTimeout", "NbmpiError",
    "Trace", "gather_trace", "get_tracer", "init", "world",
    "Grant", "SharedPool", "SharedVar", "SharedVariableError", "SPMDDivergence", "flush", "fused", "pool",
    "shared",
]
