"""NumPy's own ufunc on each rank's block: the task, its cache key and its lowering (no communication).

:mod:`~..ufuncs` records a :class:`BlockUfunc` for every ufunc call the fused kernels do not
compile (``sinh``, ``hypot``, ``frexp``, ...) or that needs ``where=``, ``dtype=`` or another
``casting=``. By then every distributed operand and output is a whole base laid out alike (same
distribution, same rows), so this rank's block of the result depends only on this rank's blocks of
the operands; replicated operands (broadcast along the rows) and scalars are passed as they are.
The lowering is one compute unit calling ``ufunc(*blocks, out=..., where=..., dtype=...,
casting=...)``: NumPy's loops, so results are NumPy's bit for bit.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..graph import Const, Leaf, Task, _name_code, node_desc, node_sig
from ..units import FULL, GroupRun, Lowering, Unit

__all__ = ["BlockUfunc", "lower", "LOWERINGS"]


def _operand_sig(x: Any) -> Tuple:
    return node_sig(x) if isinstance(x, Leaf) else node_sig(Const(x))


def _operand_desc(x: Any) -> str:
    return node_desc(x) if isinstance(x, Leaf) else repr(x)


class BlockUfunc(Task):
    """``outs = ufunc(*args, where=where, dtype=dtype, casting=casting)`` computed block by block; with
    ``method`` ``'reduce'`` or ``'accumulate'``: ``ufunc.<method>(arg, out=outs, dtype=dtype, **extra)``
    along axes other than the rows (``extra``: ``axis``, ``keepdims``, ``initial``).

    ``args``: Leaves (whole distributed bases laid out like the outputs, or views of replicated
    bases broadcast against the block) and scalars (Python scalars stay weakly typed, as in NumPy);
    ``outs``: whole bases, all laid out alike; ``where``: a Leaf, a bool or None (everywhere)."""

    __slots__ = ("ufunc", "args", "outs", "where", "dtype", "casting", "method", "extra")
    kind = "block_ufunc"

    def __init__(self, ufunc: np.ufunc, args: Sequence[Any], outs: Sequence[Leaf], where: Any,
                 dtype: Optional[np.dtype], casting: str, method: str = "__call__",
                 extra: Tuple[Tuple[str, Any], ...] = ()):
        self.ufunc, self.args, self.outs = ufunc, tuple(args), tuple(outs)
        self.where, self.dtype, self.casting = where, dtype, casting
        self.method, self.extra = method, tuple(extra)
        self._init_text(self._text)

    def _text(self) -> str:
        extra = "" if self.where is None else f", where={_operand_desc(self.where)}"
        extra += "".join(f", {k}={v!r}" for k, v in self.extra)
        outs = ", ".join(node_desc(o) for o in self.outs)
        name = self.ufunc.__name__ + ("" if self.method == "__call__" else "." + self.method)
        return (f"{outs} = {name}(" + ", ".join(_operand_desc(a) for a in self.args)
                + f"{extra}) (NumPy's ufunc on each block)")

    def _make_sig(self) -> Tuple:
        where = (-1,) if self.where is None else _operand_sig(self.where)
        dt = -1 if self.dtype is None else np.dtype(self.dtype).num
        extra = tuple((_name_code(k),) + _value_sig(v) for k, v in self.extra)
        return ((16, _name_code(self.ufunc.__name__), _name_code(self.method), _name_code(self.casting), dt, where)
                + extra
                + tuple(node_sig(o) for o in self.outs) + tuple(_operand_sig(a) for a in self.args))

    def reads(self) -> List[Leaf]:
        rd = [a for a in self.args if isinstance(a, Leaf)]
        if isinstance(self.where, Leaf):
            rd.append(self.where)
        if self.where is not None:        # where False the outputs keep their values: they are read too
            rd.extend(self.outs)
        return rd

    def writes(self) -> List[Leaf]:
        return list(self.outs)


def _value_sig(v: Any) -> Tuple:
    """A static keyword's value as numbers (an axis tuple, a bool, a scalar ``initial``)."""
    if isinstance(v, tuple):
        return (len(v),) + tuple(int(a) for a in v)
    return node_sig(Const(v))


def _block(x: Any) -> Any:
    """This rank's block of operand ``x`` (a scalar as it is)."""
    if not isinstance(x, Leaf):
        return x
    b = x.base
    loc = b.ensure()
    return loc[x.view.numpy_index()] if b.replicated else loc


def lower(fl: Lowering, g: Any, flush_no: int) -> GroupRun:
    """The one compute unit of ``g.task`` (a :class:`BlockUfunc`): NumPy's ufunc on the local blocks."""
    t: BlockUfunc = g.task

    def fn() -> None:
        outs = tuple(o.base.ensure() for o in t.outs)
        if t.method != "__call__":
            getattr(t.ufunc, t.method)(*(_block(a) for a in t.args), out=outs, dtype=t.dtype, **dict(t.extra))
            return
        kw = {} if t.where is None else {"where": _block(t.where)}     # generalized ufuncs take no where=
        t.ufunc(*(_block(a) for a in t.args), out=outs, dtype=t.dtype, casting=t.casting, **kw)

    access = tuple((l.base.serial, 0, FULL, "R") for l in t.reads() if all(l.base is not o.base for o in t.outs))
    access += tuple((o.base.serial, 0, FULL, "W") for o in t.outs)
    run = GroupRun(t.desc)
    run.computes.append(Unit("compute", fn, t.desc, access))
    return run


LOWERINGS = {"block_ufunc": lower}
