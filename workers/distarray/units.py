"""The executable units of a force point: what an operation is lowered into, and what the scheduler runs.

An operation module (:mod:`~.operations`) lowers one group of the flush into a :class:`GroupRun`:
receives (:class:`Waitable`, started all at once by the scheduler), sends and computations
(:class:`Unit`), and for a reduction over distributed rows an allgather unit and the unit that
combines the ranks' partial results. A unit declares the local rows it touches (``access``; with the
base columns for a view of some columns) and its prerequisites (``ndeps`` / :func:`after`); the
scheduler (:mod:`~.scheduler`) orders units of different groups by those accesses and runs each one
when it is ready.

Nothing here communicates or blocks; the scheduler owns every wait.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Protocol, Tuple

__all__ = ["Waitable", "Unit", "GroupRun", "after", "FULL", "Access", "columns_of", "access_of", "Lowering", "Label"]

#: ``hi`` of an access that covers every local row of a base.
FULL = 1 << 62

#: ``(base serial, lo, hi, mode)``: local rows ``[lo, hi)`` of a base, every column, mode ``'R'`` (read), ``'W'``
#: (write) or ``'A'`` (accumulate: units accumulating into the same rows need no order among them); or
#: ``(base serial, lo, hi, mode, c0, c1)``: only base columns ``[c0, c1)`` (base axis 1, ``c0 < c1``) of those rows
#: (:func:`access_of` makes either).
Access = Tuple[Any, ...]


def columns_of(view: Any, items: Optional[Tuple[int, int]] = None) -> Optional[Tuple[int, int]]:
    """The base columns ``[c0, c1)`` (base axis 1) that ``view`` (an :class:`~.indexing.View`) shows, if they are
    fewer than all of them: the hull of a sliced axis 1 (any step; with ``items``, ``(first, last)`` positions
    along it, of those items only), the one column of an integer; None for a base of fewer than 2 axes, every
    column, or none (an empty view stays "all columns"). Local, cheap; called by the lowerings that build a
    unit's accesses."""
    bs = view.base_shape
    if len(bs) < 2:
        return None
    j = -1
    for e in view.entries:
        if e[0] != "n":
            j += 1
            if j == 1:
                break
    if e[0] == "i":
        return (e[1], e[1] + 1)
    _, start, step, count = e
    if count <= 0:
        return None
    first, last = (0, count - 1) if items is None else items
    a, b = start + step * first, start + step * last
    c0, c1 = (a, b + 1) if a <= b else (b, a + 1)
    return None if c0 <= 0 and c1 >= bs[1] else (c0, c1)


def access_of(serial: int, lo: int, hi: int, mode: str, cols: Optional[Tuple[int, int]]) -> Access:
    """The :data:`Access` of local rows ``[lo, hi)`` of base ``serial`` in ``mode``, on base columns ``cols``
    (``(c0, c1)`` from :func:`columns_of`) or every column (None)."""
    return (serial, lo, hi, mode) if cols is None else (serial, lo, hi, mode, cols[0], cols[1])


class Label:
    """A label built when it is first shown (``str``, ``format``, ``repr``): ``Label(fn)`` is the text ``fn()``.

    A unit's label is only read for an error message (a timeout, a flush that cannot finish), while the
    text of an operation costs more to build than scheduling it; a lowering passes a Label so that it is
    never built on the fast path. ``fn`` takes no argument and must not refer to the unit (no cycle)."""

    __slots__ = ("_fn", "_text")

    def __init__(self, fn: Callable[[], str]):
        self._fn: Optional[Callable[[], str]] = fn
        self._text: Optional[str] = None

    def __str__(self) -> str:
        if self._text is None:
            self._text = str(self._fn())
            self._fn = None
        return self._text

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return repr(str(self))


class Waitable:
    """A started request and the units that wait for it."""

    __slots__ = ("req", "kind", "peer", "tag", "nbytes", "seq", "units", "label", "inst", "done", "cancellable")

    def __init__(self, req, kind: str, peer: int, tag: int, nbytes: int, seq: int, label: Any, inst=None):
        """``kind``: 'recv', 'send', 'coll' (a reduction's allgather) or 'check' (the agreement); ``label``: text
        or a :class:`Label` (shown only in a timeout's message)."""
        self.req, self.kind, self.peer, self.tag, self.nbytes, self.seq = req, kind, peer, tag, nbytes, seq
        self.units: List["Unit"] = []
        self.label = label
        self.inst = inst
        self.done = False
        self.cancellable = kind == "recv"


class Unit:
    """A piece of work of a flush: ``kind`` 'send' or 'coll' (communication), 'compute' (everything else).
    ``owner``: the :class:`GroupRun` it belongs to, set by the scheduler when it runs the units out of order."""

    __slots__ = ("kind", "fn", "ndeps", "dependents", "label", "done", "access", "owner")

    def __init__(self, kind: str, fn: Callable[[], None], label: str, access: Tuple[Access, ...] = ()):
        self.kind, self.fn, self.label = kind, fn, label
        self.ndeps = 0
        self.dependents: List["Unit"] = []
        self.done = False
        self.access = access
        self.owner: Optional["GroupRun"] = None


def after(u: Unit, prereq: Unit) -> None:
    """Make ``u`` wait until ``prereq`` has run."""
    prereq.dependents.append(u)
    u.ndeps += 1


class GroupRun:
    """The units of one group in one flush: receives (started at once), sends, computations, and for
    a reduction its allgather (``coll``) and the unit that combines the ranks' partials (``finish``).
    ``group``, ``order`` (its position in the flush's segment) and ``pending`` (units not run yet) are set
    and used by the scheduler."""

    __slots__ = ("recvs", "sends", "computes", "coll", "finish", "label", "inst", "group", "order", "pending")

    def __init__(self, label: str):
        self.recvs: List[Waitable] = []
        self.sends: List[Unit] = []
        self.computes: List[Unit] = []
        self.coll: Optional[Unit] = None
        self.finish: Optional[Unit] = None
        self.label = label
        self.inst = None
        self.group: Any = None
        self.order = 0
        self.pending = 0

    def units(self) -> List[Unit]:
        """Every unit of the group: sends, computations, then the allgather and the finish, if any."""
        out = self.sends + self.computes
        if self.coll is not None:
            out.append(self.coll)
        if self.finish is not None:
            out.append(self.finish)
        return out


class Lowering(Protocol):
    """What an operation's lowering may use of the flush it is lowered into (the scheduler's ``_Flush``).

    Called only while the flush builds its units, on every rank in the same order; nothing here blocks."""

    ctx: Any            #: the context (communicator, plan cache, settings, stats)
    rank: int
    size: int
    MPI: Any            #: the mpi4py MPI module
    blocks: int         #: kernel blocks run (a block unit adds 1 when it runs)

    def group_run(self, plan: Any, flush_no: int, label: str) -> Tuple[Any, GroupRun]:
        """``plan``'s instance for flush ``flush_no`` (its use counted) and a new GroupRun with its receives."""

    def receives(self, run: GroupRun, plan: Any, inst: Any, label: str) -> None:
        """Add a waitable per incoming message of ``plan`` (its instance's persistent receives) to ``run``."""

    def send_unit(self, plan: Any, inst: Any, k: int, local_of: Optional[Callable[[int], Any]], serial_of: Any,
                  label: str, pack: Optional[Callable[[], None]] = None) -> Unit:
        """The unit packing and starting outgoing message ``k`` of ``plan``."""

    def sent(self, req: Any, peer: int, nbytes: int, inst: Any, t0: int, label: Any) -> Waitable:
        """Count, trace and start the waitable of a send just started on ``inst``'s tag."""

    def start(self, w: Waitable) -> None:
        """Register a started request: polled with the others, its units released when it completes."""
