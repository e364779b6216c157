"""Layer 3, rounds: the ACCO round engine (sync, dpu, acco, auto; fixed, adaptive and auto policies).

Owns when rounds launch, what they compute (reduce-scatter, shard step, all-gather),
the swap that makes a round's result the compute parameters, where the all-gather
lands, the ranks' agreement on rounds launched, the round state a checkpoint keeps,
and the committed parameters every export sees; with ``acco.auto.streaming``, when to switch a
job to streaming and what the engine does after it.

May import: layers 0-2 and torch. It knows nothing of DeepSpeed or FSDP: a front end
hands it :class:`~ds_acco.layout.sharded_group.ShardedGroup` buffers, a
:class:`~ds_acco.optim.shard_optimizer.ShardOptimizer` and a process group (and, for the
switch, a factory of the streaming phase: ``ds_acco.streaming`` is its peer, never imported).
"""
