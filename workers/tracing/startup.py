"""Collective start of the nbmpi runtime on a communicator: this rank's tracer, its clock aligned with rank 0's.

Sits above :mod:`~nbmpi.workers.core.runtime` (MPI start-up, environment) and
:mod:`~nbmpi.workers.tracing.tracer` (the tracer) and imports both; neither imports it.
``nbmpi run`` (:mod:`~nbmpi.workers.launch.rank_entry`) and the notebook engines call
:func:`init` once per rank before any user code.
"""
from __future__ import annotations

from typing import Optional

from ..core.runtime import tracing_enabled_by_env, world
from .tracer import Tracer, set_tracer

__all__ = ["init"]


def init(comm=None, trace: Optional[bool] = None, align_clocks: bool = True) -> Tracer:
    """Start the nbmpi runtime on ``comm`` (default ``COMM_WORLD``). Collective, blocking.

    Every rank of ``comm`` must call it. It (re)creates this rank's tracer
    (enabled unless ``trace=False`` or ``NBMPI_TRACE=0``) and, if
    ``align_clocks``, estimates this rank's clock offset against rank 0 (a few
    point-to-point round trips with rank 0, then a barrier) so the timelines of
    all ranks line up. Components created afterwards record into the new
    tracer. Returns the tracer.
    """
    comm = world() if comm is None else comm
    enabled = tracing_enabled_by_env() if trace is None else bool(trace)
    tracer = Tracer(comm, enabled=enabled)
    if align_clocks:
        tracer.align_clocks()
    set_tracer(tracer)
    return tracer
