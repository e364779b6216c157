"""Layer 2, layout: where parameters and gradients live, and how they are sharded.

Owns the flat-buffer index vocabulary (param / flat / shard space, :mod:`~ds_acco.layout.flat_buffer`), the sharded
group a front end hands the round engine (:mod:`~ds_acco.layout.sharded_group`), FSDP2's rank-major packing of
dim-0 chunks, the double-buffered gradient accumulators, and the split of a model into Streaming DiLoCo fragments.

May import: layers 0-1 and torch. Nothing here communicates.
"""
