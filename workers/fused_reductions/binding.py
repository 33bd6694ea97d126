"""The binding of the compiled core: what it falls back to and creates, handed over once.

The compiled core (:mod:`._core`) does the common float64-scalar cases itself
and calls the pure-Python reference for everything else. :func:`bind` builds
the one typed interface between them, a ``_core.Bindings`` (declared in
``_core.pxd``: the reference's functions, the types the core creates such as
``SharedVar``, ``_LazyF8``, ``_Batch``, and the constants both share), and
hands it to the core, once, when the package is imported (its ``__init__``
calls it); without the compiled core it does nothing. Local.
"""
from __future__ import annotations

import operator

from ..tracing.tracer import get_tracer
from .fusion import _SPIN, K_FUSED, fuser
from .grants import Grant
from .implementation import core as _core
from .lazy import _eval, _force
from .pending import _EMPTY, _NOD, _NOL, _Batch, _Snap
from .values import _CASTERS, _REAL_FAST, _WORK_DTYPE, SharedVar, _LazyF8, _PyVarBase
from .wire import _F8, _LOG_CAP, _NAN_KEY, W_C16, W_F8, W_I8, _same_signature


def bind() -> None:
    """Hand the pure-Python reference to the compiled core as one ``_core.Bindings`` (no-op
    for the pure-Python implementation). Called once, by the package's ``__init__``."""
    if _core is None:
        return
    ref = _PyVarBase
    _core.bind(_core.Bindings(
        reset=ref.reset, iadd=ref.__iadd__, isub=ref.__isub__, imul=ref.__imul__, min_with=ref.min_with,
        max_with=ref.max_with, float_=ref.__float__,
        ops=(ref.__add__, ref.__radd__, ref.__sub__, ref.__rsub__, ref.__mul__, ref.__rmul__,
             ref.__truediv__, ref.__rtruediv__),
        force=_force, eval_=_eval, new_var=SharedVar, make_fuser=fuser, get_tracer=get_tracer,
        same_signature=_same_signature,
        add=operator.add, sub=operator.sub, mul=operator.mul, div=operator.truediv,
        shared_type=SharedVar, lazy_type=_LazyF8, batch_type=_Batch, snap_type=_Snap, grant_type=Grant,
        fast_types=tuple(_REAL_FAST), work=(_WORK_DTYPE[W_F8], _WORK_DTYPE[W_I8], _WORK_DTYPE[W_C16]),
        casters=_CASTERS, f8=_F8, nan_key=_NAN_KEY, nod=_NOD, nol=_NOL, empty=_EMPTY, log_cap=_LOG_CAP,
        kind_fused=K_FUSED, spin=_SPIN))
