"""The runtime's core: MPI start-up and the world communicator (``runtime``, ``startup``), the
exceptions every component raises (``errors``), completion of requests with a timeout path
(``waiting``), the SPMD agreement check (``spmd``) and the numba combining kernels (``kernels``)."""
