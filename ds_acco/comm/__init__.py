"""Layer 2, comm: the communication thread and the collectives a round issues.

Owns the background thread (and, on GPUs, the one CUDA stream) rounds run on, the lifecycle every engine that runs
rounds shares (private process group, peer agreement, drain at exit, close order), the collectives with their byte
counts (on gloo, paced to the link), and the int8 and chunked-cast variants.

May import: layers 0-1 (errors, numerics, config, telemetry) and torch. It knows no optimizer and no framework.
"""
