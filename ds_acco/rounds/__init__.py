"""Layer 3, rounds: the ACCO round engine (sync, dpu, acco, auto; fixed, adaptive and auto policies).

Owns when rounds launch (the schedules), what they compute, the swap, where the all-gather lands, the ranks'
agreement on rounds launched, the round state's parts, the committed parameters exports see, and auto's decisions
(ARCHITECTURE.md, "Layers"). May import: layers 0-2 and torch; never DeepSpeed, FSDP or ``ds_acco.streaming`` (a
front end hands it the streaming phase's factory).
"""
