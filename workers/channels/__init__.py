"""In-place array channels: :class:`~nbmpi.workers.channels.channel.ArrayChannel` (``channel``),
its reductions (``collectives``) and scatter/gather (``regions``), the same-node shared-memory segments behind its buffers (``shared_memory``) and the compiled
same-node copy (``_node_copy``)."""
