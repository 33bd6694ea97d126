"""Exceptions raised by the nbmpi runtime. Every message names the rank, the
peer(s) and the operation involved, and says what to do."""
from __future__ import annotations

from typing import Optional


class NbmpiError(RuntimeError):
    """Base class of all nbmpi runtime errors."""


class CommTimeout(NbmpiError, TimeoutError):
    """A blocking communication exceeded its timeout.

    Attributes: ``rank`` (who waited), ``peer`` (for whom, ``None`` for a
    collective), ``op`` (operation, e.g. ``"take(src=0)"``), ``waited`` (s).
    """

    def __init__(self, rank: int, peer: Optional[int], op: str, waited: float, detail: str = ""):
        self.rank, self.peer, self.op, self.waited = rank, peer, op, waited
        who = f"rank {peer}" if peer is not None else "the other ranks"
        msg = (
            f"rank {rank}: {op} timed out after {waited:.3f} s waiting for {who}. "
            f"Check that {who} reaches the matching operation (same channel, same order)"
        )
        if detail:
            msg += f"; {detail}"
        super().__init__(msg)


class ChannelError(NbmpiError, ValueError):
    """Wrong use of an :class:`~nbmpi.workers.channels.channel.ArrayChannel`."""


class ChannelTimeout(CommTimeout, ChannelError):
    """A blocking :class:`~nbmpi.workers.channels.channel.ArrayChannel` operation timed out."""


class AggregationError(NbmpiError, ValueError):
    """Wrong use of an :class:`~nbmpi.workers.aggregation.aggregator.Aggregator`."""


class AggregationTimeout(CommTimeout, AggregationError):
    """A blocking :class:`~nbmpi.workers.aggregation.aggregator.Aggregator` wait (free buffer, flush) timed out."""


class SPMDDivergence(NbmpiError):
    """Ranks reached a collective force point with different pending work
    (shared-variable contributions in a different order, of different
    variables, ops, dtypes or shapes, or different uniform operands).

    Raised on every rank. Attributes: ``rank``, ``op``, ``detail`` (the first
    difference, the same text on every rank).
    """

    def __init__(self, rank: int, op: str, detail: str):
        self.rank, self.op, self.detail = rank, op, detail
        super().__init__(
            f"rank {rank}: {op}: the ranks' pending shared-variable updates differ, so no value can be "
            f"trusted ({detail}). Make every rank create shared variables and contribute to them in the "
            "same order (SPMD), with the same uniform operands"
        )


class SharedVariableError(NbmpiError, TypeError):
    """Wrong use of a shared variable (e.g. assigning a rank-local value to it)."""
