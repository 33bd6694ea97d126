"""Coordinate grids that are not stored: ``mgrid`` / ``meshgrid`` arrays read from their coordinate vector.

Every element of a dense coordinate array (``y, x = mgrid[...]``, ``meshgrid(...)``) is one entry of a
1-D coordinate vector, chosen by the element's index along one axis (``axis``). Such an array's base is
made *lazy* (:func:`make_lazy`): it gets no local buffer; instead it keeps ``coords``, a small base whose
shape is the grid's with every axis but ``axis`` of length 1, holding this rank's coordinates (its rows,
distributed like the grid, when ``axis`` is 0; the whole vector, replicated, otherwise).

* Reading: a recorded elementwise task (``Assign`` / ``Reduce``) reading the grid reads ``coords`` instead,
  broadcast by the fused kernel (:func:`substitute_reads`, called by ``ArrayContext.record``): no buffer of
  the grid's size is touched. The values are the coordinate vector's, so they equal the stored grid's bit for
  bit.
* Anything else that needs memory (another kind of task, ``.local``, a message, ``to_numpy``, a copy-on-write
  view) calls ``Base.ensure()``, which *materialises* the grid: allocates its local buffer and fills it from
  ``coords`` (``Base.ensure``). From then on the base is an ordinary one.
* Writing: recording a task that writes the grid materialises it at once, so every read recorded later reads
  the buffer (and sees the write); the reads recorded before keep reading ``coords`` (the values before the
  write, as NumPy's order says).

Local, not blocking. All ranks record the same tasks (SPMD), so they substitute alike.
"""
from __future__ import annotations

from typing import Any, Optional

from .graph import Base, Leaf, Op, Task, substitute
from .indexing import View

__all__ = ["make_lazy", "substitute_reads"]


def make_lazy(grid: Base, coords: Base) -> None:
    """Make ``grid`` (new, never allocated) a lazy coordinate grid whose values are ``coords`` broadcast to its
    shape (``coords``: same dtype, ndim and, along its one long axis, length; every other axis of length 1;
    distributed like ``grid`` if that axis is 0, else replicated; its local buffer set). Local. Called by the
    grid constructors only."""
    grid.grid = coords
    grid.context.lazy_grids += 1


def _coords_view(leaf: Leaf) -> View:
    """The view of the grid's ``coords`` base selecting what ``leaf`` (a view of the grid) reads: the same
    entries along the long axis, the first element along the others (broadcast there by the kernel)."""
    coords = leaf.base.grid
    cshape = coords.shape
    ents = []
    j = 0
    for e in leaf.view.entries:
        if e[0] == "n":
            ents.append(e)
            continue
        if cshape[j] == 1 and leaf.base.shape[j] != 1:
            ents.append(("s", 0, 1, 1) if e[0] == "s" else ("i", 0))
        else:
            ents.append(e)
        j += 1
    return View._of(cshape, tuple(ents))


def _reading(leaf: Leaf) -> Optional[Any]:
    """The node reading ``leaf`` (a view of a lazy grid) from the grid's ``coords``: a same-dtype cast of the
    broadcast coordinates, of ``leaf``'s shape; None for a leaf of an ordinary base."""
    if leaf.base.grid is None:
        return None
    dt = leaf.base.dtype
    return Op("cast", (Leaf(leaf.base.grid, _coords_view(leaf)),), dt, (dt,), leaf.shape)


def substitute_reads(task: Task) -> None:
    """Prepare ``task`` (being recorded) for the lazy grids: a grid it writes is materialised now; in an
    elementwise task (``Assign`` / ``Reduce``: it has ``expr``) every read of a lazy grid reads its ``coords``.
    Local. Called by ``ArrayContext.record`` while some lazy grid exists."""
    for w in task.writes():
        if w.base.grid is not None:
            w.base.ensure()
    expr = getattr(task, "expr", None)
    if expr is None:
        return
    if any(l.base.grid is not None for l in task.reads()):
        task.expr = substitute(expr, _reading)
