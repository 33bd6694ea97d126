"""NumPy's conversion of an assigned Python value to the array's dtype (``a[k] = value``).

NumPy converts a Python scalar, a NumPy scalar, a list or a tuple stored into an array strictly: an integer
out of the dtype's range raises ``OverflowError`` ("Python integer 300 out of bounds for int8"), a NaN or an
infinity stored into integers raises ``ValueError``/``OverflowError``, a complex number into floats
``TypeError``; ``None`` becomes NaN and a numeric string its number in a float array. (An array value is cast
unsafely, wrapping around: that path is not this module's.) :func:`assigned_value` applies those rules before
the assignment is recorded, so every rank raises the same error at the user's line, before anything runs.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["assigned_value"]

_PLAIN = (int, float, bool, complex, str, type(None))


def assigned_value(value: Any, dtype: np.dtype) -> Any:
    """``value`` as NumPy would store it into an array of ``dtype``: raises NumPy's error for a value the dtype
    cannot hold (see the module doc); returns a Python or NumPy scalar unchanged when it converts (so a Python
    number stays weakly typed), ``None`` or a string as the converted scalar, a list or tuple as a NumPy array
    of ``dtype``; anything else (arrays, DistArrays) unchanged. Local, no communication."""
    t = type(value)
    if t in (list, tuple):
        if dtype.kind not in "biuf" or any(not isinstance(v, (_PLAIN, np.generic, list, tuple)) for v in value):
            return value
        return np.asarray(value, dtype=dtype)
    if t in _PLAIN or isinstance(value, np.generic):
        if dtype.kind not in "biuf":
            return value
        plain = value.item() if isinstance(value, np.generic) else value
        converted = np.asarray(plain, dtype=dtype)      # NumPy's errors
        return converted[()] if t is str or value is None else value
    return value
