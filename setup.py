"""Build of the optional compiled parts (everything else is configured in pyproject.toml).

* ``nbmpi.workers._fused_core`` speeds up float64 scalar shared variables
  (:mod:`nbmpi.workers.fused_reductions`); without it the pure-Python
  implementation, with the same semantics, is used
  (``nbmpi.workers.fused_reductions.IMPLEMENTATION`` says which).
* ``nbmpi.workers._node_copy`` (Cython) is the same-node put/take of
  :class:`~nbmpi.workers.channels.ArrayChannel`; without it channels move every
  message with MPI (``nbmpi.workers.channels.SAME_NODE_COPY`` says which).

Both are optional: without a C compiler the install still succeeds.
"""
from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # Cython is a build requirement (pyproject.toml); a plain `setup.py` run may lack it
    cythonize = None

extensions = [Extension("nbmpi.workers._fused_core", sources=["workers/_fused_core.c"],
                        extra_compile_args=["-O2"], optional=True)]
if cythonize is not None:
    extensions += cythonize([Extension("nbmpi.workers._node_copy", sources=["workers/_node_copy.pyx"],
                                       extra_compile_args=["-O2"], optional=True)],
                            compiler_directives={"language_level": 3}, quiet=True)

setup(ext_modules=extensions)
