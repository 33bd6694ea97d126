"""NumPy's keyword names for the native implementations (``numpy.flip(m=a)``, ``numpy.tile(A=a, reps=2)``,
``numpy.empty_like(prototype=a)``).

A native implementation may name a parameter otherwise than NumPy does (``a`` for NumPy's ``m``, ``A`` or
``prototype``). :func:`renamed` maps the keywords of a call made with NumPy's names to the implementation's,
parameter by parameter in order, from the two signatures (read once per function). A keyword the two name
alike, or that NumPy's signature does not have, is passed as it is.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional

__all__ = ["renamed"]

_MAPS: Dict[Any, Optional[Dict[str, str]]] = {}
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def renamed(func: Any, impl: Callable, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``kwargs`` of a call of NumPy's ``func`` with NumPy's parameter names replaced by ``impl``'s (see the
    module doc); ``kwargs`` itself when nothing needs renaming. Local."""
    m = _MAPS.get(func, _MAPS)
    if m is _MAPS:
        m = _MAPS[func] = _name_map(func, impl)
    if not m or not any(k in m for k in kwargs):
        return kwargs
    return {m.get(k, k): v for k, v in kwargs.items()}


def _name_map(func: Any, impl: Callable) -> Optional[Dict[str, str]]:
    """NumPy's name -> the implementation's, for the parameters at the same position whose names differ and that
    the other signature does not have; None when there are none (or a signature cannot be read)."""
    try:
        theirs = list(inspect.signature(func).parameters.values())
        ours = list(inspect.signature(impl).parameters.values())
    except (TypeError, ValueError):
        return None
    their_names = {p.name for p in theirs}
    our_names = {p.name for p in ours}
    out = {}
    for p, q in zip(theirs, ours):
        if p.kind in _NAMED and q.kind in _NAMED and p.name != q.name and p.name not in our_names \
                and q.name not in their_names:
            out[p.name] = q.name
    return out or None
