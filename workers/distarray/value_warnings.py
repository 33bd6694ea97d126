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

The floating-point errors that NumPy's ``mean``, ``var`` and ``std`` raise in their own divisions (``invalid value
encountered in divide`` for ``0 / 0`` over an empty slice or ``ddof`` reaching the count, ``divide by zero`` for a
positive sum of squares divided by 0) are handled the same way, but as NumPy's error state says for the kind
(``numpy.errstate``: ignore, warn, raise, print, log, call; :func:`signal_if`, :func:`signal_now`); they run as
library steps whose own flags are not reported (:func:`~.fp_errors.library_steps`).
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .fallback import user_frame
from .fp_errors import message, signal, warn_under, warning_action

__all__ = ["warn_if", "signal_if", "signal_now", "issue"]

#: A check: ``(flag, text, filters, fp)``; ``fp`` None for a warning, else ``(kind, names, error state)``.
Check = Tuple[Any, str, List[Any], Optional[Tuple[str, str, Dict[str, str]]]]


def warn_if(flag: Any, text: str) -> None:
    """Warn ``RuntimeWarning(text)`` after the next force point if ``flag`` (a recorded 0-d boolean DistArray, the
    same on every rank) is true. Called by the recording operation, on every rank (SPMD); not blocking, except under
    ``warnings`` filters that make RuntimeWarnings errors: then a force point (collective) that raises the
    RuntimeWarning on every rank if ``flag`` is true."""
    _add(flag, (flag, text, warnings.filters, None), warning_action(warnings.filters, text) == "error")


def signal_if(flag: Any, kind: str, names: str) -> None:
    """Handle NumPy's floating-point error ``kind`` (``'invalid'``, ``'divide'``, ...) in the operation ``names``
    (``'divide'``) after the next force point if ``flag`` (a recorded 0-d boolean DistArray, the same on every rank)
    is true, as NumPy's error state now says (``numpy.geterr()``, read past :func:`~.fp_errors.library_steps`).
    Called by the recording operation on every rank (SPMD); not blocking, except when the error state raises for
    ``kind`` or the warnings filters make its warning an error: then a force point (collective), after which every
    rank raises if ``flag`` is true."""
    state = np.geterr()
    mode, text = state.get(kind, "ignore"), message(kind, names)
    if mode == "ignore":
        return
    error = mode == "raise" or (mode == "warn" and warning_action(warnings.filters, text) == "error")
    _add(flag, (flag, text, warnings.filters, (kind, names, state)), error)


def signal_now(kind: str, names: str) -> None:
    """Handle NumPy's floating-point error ``kind`` in ``names`` at once, at the user's line, as NumPy's error
    state now says (warn, raise ``FloatingPointError``, print, log, call, or nothing): an error the shapes alone
    decide (the mean of an empty slice divides 0 by 0). Local; called on every rank alike."""
    signal(kind, names, np.geterr(), user_frame(), warnings.filters)


def _add(flag: Any, check: Check, error: bool) -> None:
    """Keep ``check`` for the next force point of ``flag``'s context; an ``error`` one forces it now (or is issued
    now if nothing is pending: its flag is computed)."""
    ctx = flag.context
    ctx.value_warnings.append(check)
    if error and not ctx.in_flush and not ctx.hold_flush:
        if ctx.pending:
            ctx.flush("a warning that is an error")
        else:       # computed already (each operation under these filters is a force point of its own)
            ctx.value_warnings.remove(check)
            issue([check])


def issue(checks: List[Check]) -> None:
    """Issue the warning or floating-point error of each check of ``checks`` (of :func:`warn_if`,
    :func:`signal_if`, recorded before the force point that has just run) whose flag is true, in their order.
    Called by :meth:`~.context.ArrayContext.flush` after a force point that completed, on every rank with the same
    checks; collective only for a flag that is not replicated (read by an allgather)."""
    frame = user_frame()
    for flag, text, filters, fp in checks:
        if not bool(flag.to_numpy(_reason="a value warning")):
            continue
        if fp is None:
            warn_under(text, frame, filters)
        else:
            signal(fp[0], fp[1], fp[2], frame, filters)
