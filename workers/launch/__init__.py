"""Launching and supervising ranks: ``nbmpi run`` (``cli``, ``launcher``), what each rank runs
(``rank_entry``) under its guard (``rank_guard``), where a rank is (``rank_location``), ending
the processes and shared memory nbmpi starts (``processes``), and pools of ipyparallel engines
on MPI ranks (``engine_pool`` on the client with ``pool_health``, ``engine_side`` on each rank)."""
