"""NumPy functions that write a file, run through the fallback: each file written by one rank.

``numpy.save(path, a)``, ``savez``, ``savez_compressed``, ``savetxt``, ``a.tofile(path)`` and ``a.dump(path)`` run on
every rank (SPMD) with the gathered array. If every rank wrote the same path, one rank could truncate the file while
another reads it back (``numpy.load`` right after ``numpy.save`` raised ``EOFError`` on one rank, or read an empty
array on another, and the other ranks then waited for it). :func:`write_once` makes the lowest rank naming a path
its only writer, and returns on no rank before every writer has finished: a later ``numpy.load`` reads the whole
file on every rank. Ranks naming different paths (``f"out{rank}.npy"``) each write their own; a file object (not a
path) is written by its own rank.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from ..core import spmd
from .errors import DistArrayTimeout

__all__ = ["written_path", "write_once"]

#: NumPy's file writers: function -> (position, keyword) of the file argument.
_WRITERS: Dict[Any, Tuple[int, str]] = {np.save: (0, "file"), np.savez: (0, "file"), np.savez_compressed: (0, "file"),
                                        np.savetxt: (0, "fname"), np.ndarray.tofile: (1, "fid"),
                                        np.ndarray.dump: (1, "file")}


def written_path(func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[str]:
    """The absolute path ``func(*args, **kwargs)`` writes, or None (not a file writer, or a file object). Local."""
    where = _WRITERS.get(func)
    if where is None:
        return None
    pos, key = where
    target = args[pos] if pos < len(args) else kwargs.get(key)
    if isinstance(target, (str, bytes, os.PathLike)):
        return os.path.abspath(os.fsdecode(target))
    return None


def write_once(func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any], path: str, context: Any,
               name: str) -> Any:
    """``func(*args, **kwargs)`` on the lowest rank naming ``path`` only (see the module doc); NumPy's result on
    that rank, None on the others. Collective over the array's communicator, blocking (a gather of the paths and an
    agreement, each waited for at most the context's timeout). The writer's exception is raised on the writer; the
    other ranks raise OSError naming the path."""
    context.ensure_comm()
    how = dict(timeout=context.timeout, rank=context.rank, error=DistArrayTimeout)
    paths = spmd.gather(context.dcomm, path, op=f"numpy fallback: {name}: the paths the ranks write", **how)
    result, err = None, None
    if paths.index(path) == context.rank:
        try:
            result = func(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - raised below, after every rank knows
            err = e
    ok = spmd.all_ok(context.dcomm, err is None, op=f"numpy fallback: {name}: waiting for the writers", **how)
    if err is not None:
        raise err
    if not ok:
        raise OSError(f"{name}: the rank writing {path} failed (see its error)")
    return result
