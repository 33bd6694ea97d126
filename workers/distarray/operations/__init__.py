"""The operations of a force point, one module per kind: each holds its plan, its cache key and its lowering.

The fusion pass (:mod:`~..fusion`) turns the recorded tasks into groups; every group has a
``kind``. The scheduler (:mod:`~..scheduler`) looks the kind up in one of two tables and
never needs to know what the operation does:

* :data:`LOWERINGS`: ``kind -> lower(flush, group, flush_no) -> GroupRun``. A lowering finds
  (or builds) the operation's per-rank plan in the context's cache under the operation's key and
  returns its executable units (:mod:`~..units`): receives, sends, computations, for a reduction
  an allgather and a finish. The scheduler orders the units of all groups by their accesses and
  runs them with latency hiding.

  ============== ============================ =========================================
  kind           module                       what
  ============== ============================ =========================================
  elementwise    :mod:`.elementwise`          fused Assign/Reduce loop nests
                 (+ :mod:`.reduction`)        (partials of reductions, allgather)
  swap           :mod:`.swap`                 copy-back by exchanging buffers
  matmul         :mod:`.linalg`               ``a @ b``
  transpose      :mod:`.linalg`               ``a.T``
  replicate      :mod:`.gather`               gather a view to every rank or one root
  redistribute   :mod:`.redistribution`       copy between row layouts, one message per peer
  block_ufunc    :mod:`.block_ufunc`          NumPy's own ufunc on each rank's block
  ============== ============================ =========================================

* :data:`BARRIERS`: ``kind -> execute(context, task, op)``. Such an operation is a collective
  step of its own: the groups before it run to completion first, then it runs, blocking.
  Irregular copies through index arrays (``indexed``, :mod:`~..irregular`, through the Aggregator).

Lowering only builds units: it neither communicates nor blocks. A lowering may use from the
flush: ``ctx``, ``rank``, ``size``, ``MPI``, the counter ``blocks``, and the methods
``receives``, ``send_unit``, ``sent`` and ``start`` (see :class:`~..scheduler._Flush`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from .. import irregular
from . import block_ufunc, elementwise, gather, linalg, redistribution, swap

__all__ = ["LOWERINGS", "BARRIERS"]

#: kind of a group -> its lowering into units.
LOWERINGS: Dict[str, Callable[..., Any]] = {
    **elementwise.LOWERINGS, **swap.LOWERINGS, **linalg.LOWERINGS, **gather.LOWERINGS, **redistribution.LOWERINGS,
    **block_ufunc.LOWERINGS}

#: kind of a task run as a collective step of its own -> ``execute(context, task, op)``.
BARRIERS: Dict[str, Callable[..., None]] = {"indexed": irregular.execute}
