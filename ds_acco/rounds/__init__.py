"""Layer 3, rounds: the ACCO round engine (sync, dpu, acco, auto; fixed, adaptive and auto policies).

Owns when rounds launch (the schedules, and the ``Schedule`` protocol the streaming phase implements), what
they compute (reduce-scatter, shard step, all-gather, by collective plans chosen at build), the swap that makes a
round's result the compute parameters, where the all-gather lands, the ranks' agreement on rounds launched, the
round state a checkpoint keeps (composed of parts that save and load their own), the committed parameters every
export sees, and ``mode: "auto"``'s decisions (with ``acco.auto.streaming``, when to switch to streaming).

May import: layers 0-2 and torch. It knows nothing of DeepSpeed or FSDP: a front end
hands it :class:`~ds_acco.layout.sharded_group.ShardedGroup` buffers, a
:class:`~ds_acco.optim.shard_optimizer.ShardOptimizer` and a process group (and, for the
switch, a factory of the streaming phase: ``ds_acco.streaming`` is its peer, never imported).
"""
