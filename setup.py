"""Build of the optional compiled parts (everything else is configured in pyproject.toml).

* ``nbmpi.workers.fused_reductions._core`` (Cython): the hot paths of shared variables
  (no MPI headers needed), and ``_direct_mpi``: ``MPI_Start``/``MPI_Test`` and a compiled
  MPI operation through mpi4py's public C API (``from mpi4py cimport MPI, libmpi``),
  compiled against the MPI headers of the ``mpich`` wheel (or of ``$MPICC``/``mpicc``).
  Without them the pure-Python implementation, with the same semantics, is used
  (``nbmpi.workers.fused_reductions.IMPLEMENTATION`` says which).
* ``nbmpi.workers.tracing._tracer_core`` (Cython): the tracer's record buffer (``Tracer.record``
  in C, and its C entry for the fused-reductions core, which needs it).
* ``nbmpi.workers.channels._node_copy`` (Cython) is the same-node put/take of
  :class:`~nbmpi.workers.channels.channel.ArrayChannel`; without it channels move every
  message with MPI (``nbmpi.workers.channels.channel.SAME_NODE_COPY`` says which).

All are optional: without a C compiler (or Cython) the install still succeeds.
"""
import os
import shlex
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from setuptools import Extension, setup

PKG = "workers/fused_reductions"


def mpi_build_paths():
    """(include dirs, library dirs) of the MPI to compile ``_direct_mpi`` against: the
    ``mpich`` wheel's headers and ``libmpi.so`` (the MPI mpi4py loads in this install),
    else what ``$MPICC`` (default ``mpicc``) reports; None if neither is found."""
    try:
        dist = metadata.distribution("mpich")
        inc = lib = None
        for f in dist.files or ():
            if f.name == "mpi.h":
                inc = Path(dist.locate_file(f)).resolve().parent
            elif f.name == "libmpi.so":
                lib = Path(dist.locate_file(f)).resolve().parent
        if inc and lib and (inc / "mpi.h").exists():
            return [str(inc)], [str(lib)]
    except metadata.PackageNotFoundError:
        pass
    mpicc = shutil.which(os.environ.get("MPICC", "mpicc"))
    if not mpicc:
        return None
    try:
        flags = shlex.split(subprocess.run([mpicc, "-show"], capture_output=True, text=True, check=True).stdout)
    except (OSError, subprocess.CalledProcessError):
        return None
    incs = [f[2:] for f in flags if f.startswith("-I")]
    libs = [f[2:] for f in flags if f.startswith("-L")]
    return (incs, libs) if incs else None


def cython_include() -> str:
    """A directory where ``cimport`` finds the package's ``.pxd`` files under their
    installed names (``nbmpi/workers/<subpackage>/``; the source tree maps ``workers/``
    to ``nbmpi.workers``, so Cython would not find ``from ..tracing._tracer_core cimport ...``
    there)."""
    root = Path("build/cython-include")
    base = root / "nbmpi" / "workers"
    for pxd in Path("workers").rglob("*.pxd"):
        dest = base / pxd.relative_to("workers")
        dest.parent.mkdir(parents=True, exist_ok=True)
        d = dest.parent
        while d != root:   # every package on the way is a Cython package
            (d / "__init__.pxd").touch()
            d = d.parent
        shutil.copyfile(pxd, dest)
    return str(root)


def extensions():
    try:
        from Cython.Build import cythonize
    except ImportError:   # no Cython: pure Python
        return []
    exts = [Extension("nbmpi.workers.tracing._tracer_core", ["workers/tracing/_tracer_core.pyx"], extra_compile_args=["-O2"],
                      optional=True),
            Extension("nbmpi.workers.fused_reductions._core", [f"{PKG}/_core.pyx"], extra_compile_args=["-O2"],
                      optional=True),
            Extension("nbmpi.workers.channels._node_copy", ["workers/channels/_node_copy.pyx"], extra_compile_args=["-O2"],
                      optional=True)]
    paths = mpi_build_paths()
    if paths is not None:
        inc, lib = paths
        exts.append(Extension("nbmpi.workers.fused_reductions._direct_mpi", [f"{PKG}/_direct_mpi.pyx"],
                              include_dirs=inc, library_dirs=lib, libraries=["mpi"],
                              extra_compile_args=["-O2"], optional=True))
    out = cythonize(exts, build_dir="build/cython", include_path=[cython_include()], quiet=True,
                    compiler_directives={"language_level": "3"})
    for ext in out:   # cythonize makes new Extension objects without the flag: a failed compile is skipped
        ext.optional = True
    return out


setup(ext_modules=extensions())
