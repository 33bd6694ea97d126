"""The layout of one trace record and the registry of event kinds (what the tracer writes and the
trace analysis reads).

A record is one row of :data:`NF` ``int64`` columns named by :data:`FIELDS`;
``dir`` is one of :data:`DIR_NONE` (a collective step, or no direction),
:data:`DIR_SEND`, :data:`DIR_RECV`. Event kinds are small integers registered
by name with :func:`register_kind` (components do it at import time, so the
codes agree on all ranks; a gathered trace carries rank 0's name table anyway).

This module imports nothing from nbmpi: the tracer
(:mod:`~nbmpi.workers.tracing.tracer`) and the analysis
(:mod:`~nbmpi.workers.tracing.analysis`) both build on it, in that direction only.
"""
from __future__ import annotations

import threading
from typing import Dict, List

__all__ = ["FIELDS", "NF", "DIR_NONE", "DIR_SEND", "DIR_RECV", "register_kind", "kind_names"]

#: Columns of one record, in order. All int64.
FIELDS = ("kind", "dir", "peer", "tag", "nbytes", "t_start", "t_end", "wait", "seq", "chan", "count")
NF = len(FIELDS)
#: ``dir`` values: a collective step (or no direction), a send, a receive.
DIR_NONE, DIR_SEND, DIR_RECV = 0, 1, 2

_KINDS: List[str] = []
_KIND_CODES: Dict[str, int] = {}
_kinds_lock = threading.Lock()


def register_kind(name: str) -> int:
    """Return the integer code of event kind ``name``, registering it if new. Local, thread-safe.

    Components register their kinds at import time so codes agree on all ranks;
    the gathered trace carries rank 0's name table regardless.
    """
    with _kinds_lock:
        code = _KIND_CODES.get(name)
        if code is None:
            code = len(_KINDS)
            _KINDS.append(name)
            _KIND_CODES[name] = code
        return code


def kind_names() -> List[str]:
    """Names of all registered kinds, indexed by code (a copy)."""
    return list(_KINDS)


for _k in ("put", "take", "reduce", "allreduce", "bcast", "scatter", "gather", "barrier"):
    register_kind(_k)
