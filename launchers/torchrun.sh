#!/usr/bin/env bash
# Train examples.train_lm on one machine with torchrun.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [-n NPROC] [-p PORT] CONFIG [train_lm args...]

  -n NPROC  processes (ranks) on this machine (default: \$NPROC or 2)
  -p PORT   rendezvous port (default: \$MASTER_PORT; unset: torchrun --standalone picks a free one)
  CONFIG    DeepSpeed config, e.g. ds_configs/acco_adaptive.json
  the rest  goes to train_lm (--steps, --model-size, --save-dir, ...; see its --help)
  \$TRAIN_MODULE  run another training module with the same arguments
                 (default: examples.train_lm)

Runs: torchrun --standalone --nproc_per_node NPROC -m examples.train_lm \\
        --deepspeed_config CONFIG [args...]
torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and MASTER_* for every rank; DeepSpeed reads
them. OMP_NUM_THREADS defaults to (cores / NPROC), at least 1. If a rank fails torchrun
stops the others and this script exits non-zero.

example: $(basename "$0") -n 2 ds_configs/acco_adaptive.json --steps 50 --compute-delay-ms 10,30
USAGE
}

NPROC="${NPROC:-2}"
PORT="${MASTER_PORT:-}"
# shellcheck source=launchers/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
exec torchrun "${RDZV[@]}" --nproc_per_node "$NPROC" \
  -m "${TRAIN_MODULE:-examples.train_lm}" --deepspeed_config "$CONFIG" "$@"
