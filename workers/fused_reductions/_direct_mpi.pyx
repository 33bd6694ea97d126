# cython: language_level=3
"""Compiled MPI glue of fused reductions, on mpi4py's public C API (``from mpi4py cimport MPI, libmpi``).

* :class:`DirectRunner`: the compiled force point's ``MPI_Start``/``MPI_Test``
  on the persistent request's handle (``Request.ob_mpi``), no Python call per
  poll; an error code becomes ``mpi4py.MPI.Exception``, as mpi4py raises it.
* :func:`op_create`: an ``MPI.Op`` whose combining function is a C function
  (the numba ``cfunc`` of :func:`nbmpi.workers.core.kernels.combine_words`), so a
  general fusion combines without entering Python.

Built against the MPI headers of the ``mpich`` wheel; importing it imports
``mpi4py.MPI`` (so MPI is initialised) and checks mpi4py's types, hence the
fuser imports it only at its first force point. Importing it fails (and the
force point goes through mpi4py: ``Fuser.direct_mpi`` is False) when
mpi4py runs on another MPI library than the one it was linked against.
"""
from mpi4py cimport MPI, libmpi

from mpi4py.MPI import Exception as MPIException
from mpi4py.MPI import Get_library_version

from ._core cimport Runner


cdef char _version[libmpi.MPI_MAX_LIBRARY_VERSION_STRING]
cdef int _vlen = 0
if (libmpi.MPI_Get_library_version(_version, &_vlen) != libmpi.MPI_SUCCESS
        or _version[:_vlen].decode(errors="replace").strip() != Get_library_version().strip()):
    # the MPI library this module was linked against is not the one mpi4py runs on
    raise ImportError("nbmpi.workers.fused_reductions._direct_mpi was compiled against another MPI library "
                      "than the one mpi4py uses; the force point goes through mpi4py instead")


cdef class DirectRunner(Runner):
    """Start/test a persistent request by calling the MPI library on its handle."""

    cdef int start(self, object req) except -1:
        cdef int ierr = libmpi.MPI_Start(&(<MPI.Request?>req).ob_mpi)
        if ierr != libmpi.MPI_SUCCESS:
            raise MPIException(ierr)
        return 0

    cdef int test(self, object req) except -1:
        cdef int flag = 0
        cdef int ierr = libmpi.MPI_Test(&(<MPI.Request?>req).ob_mpi, &flag, libmpi.MPI_STATUS_IGNORE)
        if ierr != libmpi.MPI_SUCCESS:
            raise MPIException(ierr)
        return flag


def op_create(size_t function, bint commute) -> MPI.Op:
    """A new ``MPI.Op`` whose combining function is the C ``MPI_User_function`` at address
    ``function`` (it must stay valid while the operation is used). Local."""
    cdef MPI.Op op = MPI.Op()
    cdef int ierr = libmpi.MPI_Op_create(<libmpi.MPI_User_function *>function, commute, &op.ob_mpi)
    if ierr != libmpi.MPI_SUCCESS:
        raise MPIException(ierr)
    return op
