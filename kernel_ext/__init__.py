"""nbmpi IPython extension: ``%load_ext nbmpi.kernel_ext`` adds ``%distributed`` / ``%%distributed``.

See :mod:`nbmpi.kernel_ext.magics` for the magics and :mod:`nbmpi.kernel_ext.output`
for how per-rank output is grouped; the pools themselves are
:mod:`nbmpi.workers.launch.engine_pool` (shared with the controller).
Unloading the extension (or the kernel exiting) stops every pool it started.
"""
from __future__ import annotations

_magics = None


def load_ipython_extension(ipython) -> None:
    """Register the ``distributed`` magics on ``ipython`` (idempotent)."""
    global _magics
    from .magics import DistributedMagics

    if _magics is not None and _magics.shell is ipython:
        return
    _magics = DistributedMagics(ipython)
    ipython.register_magics(_magics)


def unload_ipython_extension(ipython) -> None:  # noqa: ARG001
    """Stop every pool started (disconnect every pool attached) in this kernel."""
    global _magics
    if _magics is not None:
        _magics.stop_all()
        _magics = None
