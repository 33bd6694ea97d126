"""Aggregation of fine-grained items into per-destination buffers:
:class:`~nbmpi.workers.aggregation.aggregator.Aggregator` (the public API, ``aggregator``), its
buffer pool, bucketing and sends (``buffers``), its progress engine (``progress``), flush's
termination detection (``termination``) and its numba kernels (``bucketing``)."""
