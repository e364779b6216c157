"""Layer 2, comm: the communication thread and the collectives a round issues.

Owns the background thread (and, on GPUs, the one CUDA stream) rounds run on, the
round handle that re-raises a round's error in the training thread, the lifecycle
every engine that runs rounds shares (its private process group, peer agreement,
the round in flight, the drain at exit, the close order), the collectives with
their byte counts (the gloo reduce-scatter through all-to-all, pieces paced to the
link), and the int8 and chunked-cast variants.

May import: layers 0-1 (errors, numerics, config, telemetry) and torch. It knows no
optimizer and no framework.
"""
