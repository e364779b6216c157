"""Layer 2, optim: the optimizer step on this rank's fp32 master shards.

Owns the commit and the lookahead (``Opt_lookahead``) of any torch optimizer, the functional chunked Adam/AdamW that
needs no snapshot and no shard-sized temporaries, and the clock that says how many scheduler steps a commit earns.

May import: layers 0-1 and torch. DeepSpeed's optimizer classes are recognised by name in ``sys.modules``, never
imported.
"""
