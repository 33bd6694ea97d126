# The part of the compiled core other compiled modules build on: how the force
# point starts and tests its persistent request (see _core.pyx, _direct_mpi.pyx).

cdef class Runner:
    cdef int start(self, object req) except -1
    cdef int test(self, object req) except -1
