"""Build of the optional compiled hot path (everything else is configured in pyproject.toml).

``nbmpi.workers._fused_core`` speeds up float64 scalar shared variables
(:mod:`nbmpi.workers.fused_reductions`). It is optional: without a C compiler
the install still succeeds and the pure-Python implementation, with the same
semantics, is used (``nbmpi.workers.fused_reductions.IMPLEMENTATION`` says which).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("nbmpi.workers._fused_core", sources=["workers/_fused_core.c"],
                             extra_compile_args=["-O2"], optional=True)])
