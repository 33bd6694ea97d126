"""Aggregation of fine-grained items into per-destination buffers:
:class:`~nbmpi.workers.aggregation.aggregator.Aggregator`."""
