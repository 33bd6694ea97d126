"""SPMD divergence diagnosis: which pending step differed between the ranks.

Runs only on error paths (signatures differ, a size board shows a mismatch, a
timeout or an MPI error in a force point): every rank sends its decoded
sequence log over the fuser's diagnosis communicator (:func:`exchange_logs`,
two collectives there) and :func:`_compare` names the first difference with
the same text on every rank.
"""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from ..core import spmd
from ..core.errors import CommTimeout
from .wire import _F8_NUM, _FN_NAMES, _LOG_CAP, _NAN_KEY, _UNIFORM_TAGS, CREATED, OP_NAMES


def _decode_log(log: list, kmap: dict) -> list:
    """The batch's signature log as readable steps: an int is the key of a contribution
    (``kmap``; a float64 scalar one is ``id << 3 | op``), the tag ``-16 - code`` of a
    uniform operand, followed by the operand's key (read as ``(-7, code, key)``), or
    ``id << 3 | CREATED`` followed by a creation value (read as ``(-8, id, value)``, as
    are the floats right after it: the creations of the next ids, ``_Batch.note_created``);
    tuples are steps already."""
    steps = []
    it = iter(log)
    created = None   # id of the creation a bare float continues
    for k in it:
        if type(k) is float and created is not None:
            created += 1
            steps.append((-8, created, k))
            continue
        created = None
        if type(k) is not int:
            steps.append(k)
        elif k in kmap:
            steps.append(kmap[k])
        elif k in _UNIFORM_TAGS:
            steps.append((-7, -16 - k, next(it, None)))
        elif k >= 0 and k & 7 == CREATED:
            created = k >> 3
            steps.append((-8, created, next(it, None)))
        else:
            steps.append((k >> 3, k & 7, _F8_NUM, ()))
    return steps


def exchange_logs(comm, rank: int, size: int, steps: list, folded: int, words: int,
                  timeout: Optional[float]) -> Optional[list]:
    """Every rank's ``(steps, folded, words)`` over the diagnosis communicator ``comm``
    (collective on it; error paths only; pickled); None if that exchange timed out."""
    try:
        return spmd.gather(comm, (steps, folded, words), timeout=timeout, rank=rank,
                           op="SPMD divergence diagnosis (logs)")
    except CommTimeout:
        return None


def _size_note(logs: list) -> str:
    """Suffix of the divergence text when the ranks' fused buffers differed in size."""
    if all(w == logs[0][2] for _, _, w in logs):
        return ""
    return ("; the ranks' pending data differed in size, so MPI could not match the collective and shared "
            "variables are unusable now (restart the program)")


def _compare(logs: list) -> Optional[str]:
    """The first difference of the ranks' ``(steps, folded, words)``; None if they agree."""
    folds = [f for _, f, _ in logs]
    if any(f != folds[0] for f in folds):
        return (f"the sequences differ within the first {max(folds) * _LOG_CAP} pending steps (not kept); "
                "force more often (flush()) to locate the difference")
    steps = [lg for lg, _, _ in logs]
    if any(lg != steps[0] for lg in steps[1:]):
        return _first_difference(steps, folds[0] > 0)
    words = [w for _, _, w in logs]
    if any(w != words[0] for w in words):
        return "pending sizes differ: " + ", ".join(f"rank {r}: {w} words" for r, w in enumerate(words))
    return None


def _describe(key: Optional[tuple]) -> str:
    if key is None:
        return "nothing (its sequence ended here)"
    tag = key[0]
    if tag == -7:
        return f"uniform operand {_show(key[2])} of {_FN_NAMES.get(key[1], 'an operation')}"
    if tag == -8:
        return f"shared variable #{key[1]} created/reset with value {_show(key[2])}"
    if tag == -9:
        return f"consume with floor {_show(key[1])}"
    vid, op, num, shape = key
    shp = "scalar" if shape == () else f"shape {shape}"
    return f"{OP_NAMES[op]} contribution to shared variable #{vid} ({_dtype_name(num)}, {shp})"


def _show(vkey: Any) -> str:
    if isinstance(vkey, tuple):
        if len(vkey) == 4 and vkey[0] == -2:
            return f"<array shape {vkey[2]} {_dtype_name(vkey[3])}, crc32 {vkey[1]:#x}>"
        if vkey == _NAN_KEY:
            return "nan"
        return repr(complex(*vkey))
    return repr(vkey)


def _dtype_name(num: int) -> str:
    for t in np.sctypeDict.values():
        try:
            if np.dtype(t).num == num:
                return str(np.dtype(t))
        except TypeError:
            continue
    return f"dtype#{num}"


def _first_difference(logs: List[List[tuple]], truncated: bool) -> str:
    d = spmd.first_difference(logs)
    if d is not None:
        parts = "; ".join(f"rank {r}: {_describe(it)}" for r, it in enumerate(d.items))
        hint = ""
        if any(it is not None and it[0] == -7 for it in d.items):
            hint = (". A uniform operand (c in x * c, x / c, ...) scales every rank's copy and must be the "
                    "same on every rank; for the product of every rank's a write x *= a, for local "
                    "arithmetic read the value first (float(x) * a)")
        return f"first difference at pending step {d.index}: {parts}{hint}"
    if truncated:
        return (f"the sequences differ within earlier pending steps that were folded away (more than "
                f"{_LOG_CAP} steps without a force point); force more often (flush()) to locate it")
    return "the sequences differ in a way the logs do not show (e.g. NaN creation values)"
