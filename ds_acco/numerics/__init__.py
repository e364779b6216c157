"""Layer 1, numerics: dtypes by name, blockwise int8 quantisation, the finite check, views made once.

Owns arithmetic on single tensors that every other layer shares: the one map between the config's dtype names and torch
dtypes, the int8 block format the quantised collectives put on the wire (a whole buffer in a few operations), the one
test for inf/NaN (min and max carry them, so no model-sized bool tensor is built), and the cache of a buffer's views
that keeps a round's thread from cutting them every round.

May import: ``ds_acco.errors`` and torch. Nothing here communicates or knows a framework.
"""
