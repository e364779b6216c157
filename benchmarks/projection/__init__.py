"""A projection past this machine: an analytic model of a data-parallel step, fitted on the CPU beds and the GPU
sessions' raw files, predicting seconds per step and time to a loss for 64 to 512 GPUs.

Why a model and not a measurement: the beds are 2 (later 4 and 8) emulated hosts on one 2-core machine; the
question users ask first is what happens on a cluster of 8-GPU nodes on a 1-100 Gbit/s link. The model says it
from the few things that decide it (compute, bytes on each node's link, latency, a round's host and device cost,
the compute lost while a round is in flight, each method's convergence penalty), and is checked against every bed
that measured a step.

Modules: :mod:`.model` (the equations: bytes as ds_acco sends them, a collective's time on a node's link, each
method's step), :mod:`.fit` (the constants from ``bench_results/`` with their spread, and the check of the model
against the beds), :mod:`.grid` (the scenario: GPUs, models, batch; the table over model size, GPUs and link).
``benchmarks.report.pages.cluster_projection`` writes its blocks in BENCHMARKS.md and docs/projection.md.
Imports ``ds_acco`` (read-only: the wire formats) and ``benchmarks.report``/``benchmarks.sweep`` (the raw files).
"""
