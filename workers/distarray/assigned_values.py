"""NumPy's conversion of an assigned Python value to the array's dtype (``a[k] = value``).

NumPy converts a Python scalar, a list or a tuple stored into an array strictly: an integer out of the
dtype's range raises ``OverflowError`` ("Python integer 300 out of bounds for int8"), a NaN or an infinity
stored into integers raises ``ValueError``/``OverflowError``, a complex number into floats ``TypeError``;
``None`` becomes NaN and a numeric string its number in a float array. A NumPy scalar (``np.int64(300)``,
``np.float32(nan)``) is converted as NumPy converts it, which depends on the target and the index: under an
index array or a mask it is cast unsafely, as an array value is (it wraps around: 44 in ``uint8``; a NaN becomes
the integer NumPy's cast makes); under an integer or a slice it wraps into unsigned integers but raises NumPy's
``OverflowError``/``ValueError`` for signed ones. It is converted by NumPy's own assignment into a one-element
array, with NumPy's warnings (issued on rank 0 only). :func:`assigned_value` applies those rules before the
assignment is recorded, so every rank raises the same error at the user's line, before anything runs.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

__all__ = ["assigned_value"]

_PLAIN = (int, float, bool, complex, str, type(None))


def assigned_value(value: Any, dtype: np.dtype, rank: int = 0, fancy: bool = False) -> Any:
    """``value`` as NumPy would store it into an array of ``dtype`` (``fancy``: under an index array or a mask,
    else under integers and slices): raises NumPy's error for a value the dtype cannot hold (see the module doc);
    returns a Python scalar unchanged when it converts (so a Python number stays weakly typed), a numeric NumPy
    scalar converted to ``dtype`` (NumPy's warnings on ``rank`` 0 only), ``None`` or a string as the converted
    scalar, a list or tuple as a NumPy array of ``dtype``; anything else (arrays, DistArrays) unchanged. Local, no
    communication."""
    t = type(value)
    if t in (list, tuple):
        if dtype.kind not in "biuf" or any(not isinstance(v, (_PLAIN, np.generic, list, tuple)) for v in value):
            return value
        return np.asarray(value, dtype=dtype)
    if isinstance(value, np.generic) and value.dtype.kind in "biufc" and dtype.kind in "biuf":
        probe = np.zeros(1, dtype=dtype)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with np.errstate(invalid="warn", over="warn"):
                probe[[0] if fancy else 0] = value       # NumPy's conversion, and its errors
        for w in seen if rank == 0 else ():
            warnings.warn(w.message, w.category, stacklevel=3)     # at the user's a[k] = value line
        return probe[0]
    if t in _PLAIN or isinstance(value, np.generic):
        if dtype.kind not in "biuf":
            return value
        plain = value.item() if isinstance(value, np.generic) else value
        converted = np.asarray(plain, dtype=dtype)      # NumPy's errors
        return converted[()] if t is str or value is None else value
    return value
