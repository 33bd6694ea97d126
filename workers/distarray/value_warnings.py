"""NumPy's warnings that depend on a result's values, for recorded operations.

``numpy.nanmax`` warns "All-NaN slice encountered" when some slice holds only NaN, ``numpy.nanmean`` "Mean of empty
slice" when some slice holds no number, ``numpy.nanvar``/``nanstd`` "Degrees of freedom <= 0 for slice." when some
slice holds at most ``ddof`` numbers; ``numpy.mean`` and ``numpy.var`` with a ``where=`` mask leaving a slice empty
warn the same. NumPy decides from the values; a distributed array's operation is recorded and runs later. So the
operation records a 0-d boolean, whether some slice is bad (:func:`warn_if`), evaluated with it at the next force
point; when that force point has run, each such flag that is true issues its RuntimeWarning (:func:`issue`), at the
user's line of the force point (as the floating-point warnings of :mod:`.fp_errors`), under the ``warnings``
filters in effect when the operation was recorded. The flags are reductions over all elements, the same on every
rank, so every rank warns. Under filters that make the warning an error (``warnings.simplefilter('error')``) the
operation is a force point of its own: every rank raises the RuntimeWarning at the operation's line, as NumPy does.
"""
from __future__ import annotations

import warnings
from typing import Any, List, Tuple

from .fallback import user_frame
from .fp_errors import warn_under, warning_action

__all__ = ["warn_if", "issue"]


def warn_if(flag: Any, text: str) -> None:
    """Warn ``RuntimeWarning(text)`` after the next force point if ``flag`` (a recorded 0-d boolean DistArray, the
    same on every rank) is true. Called by the recording operation, on every rank (SPMD); not blocking, except under
    ``warnings`` filters that make RuntimeWarnings errors: then a force point (collective) that raises the
    RuntimeWarning on every rank if ``flag`` is true."""
    ctx = flag.context
    filters = warnings.filters
    check = (flag, text, filters)
    ctx.value_warnings.append(check)
    if warning_action(filters, text) == "error" and not ctx.in_flush and not ctx.hold_flush:
        if ctx.pending:
            ctx.flush("a warning that is an error")
        else:       # computed already (each operation under these filters is a force point of its own)
            ctx.value_warnings.remove(check)
            issue([check])


def issue(checks: List[Tuple[Any, str, List[Any]]]) -> None:
    """Issue the warning of each check of ``checks`` (``(flag, text, filters)`` of :func:`warn_if`, recorded
    before the force point that has just run) whose flag is true. Called by
    :meth:`~.context.ArrayContext.flush` after a force point that completed, on every rank with the same checks;
    collective only for a flag that is not replicated (read by an allgather)."""
    frame = user_frame()
    for flag, text, filters in checks:
        if bool(flag.to_numpy(_reason="a value warning")):
            warn_under(text, frame, filters)
