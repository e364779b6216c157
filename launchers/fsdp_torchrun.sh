#!/usr/bin/env bash
# Train examples.train_lm_fsdp (PyTorch FSDP2 + ACCO) on one machine with torchrun.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [-n NPROC] [-p PORT] CONFIG [train_lm_fsdp args...]

  -n NPROC  processes (ranks) on this machine (default: \$NPROC or 2)
  -p PORT   rendezvous port (default: \$MASTER_PORT; unset: torchrun --standalone picks a free one)
  CONFIG    JSON config with an "acco" block saying "backend": "fsdp", e.g. ds_configs/fsdp_acco.json,
            or ds_configs/fsdp_auto_lowbit.json (mode auto with every low-bit switch)
  the rest  goes to train_lm_fsdp (--steps, --model-size, --save-dir, --resume, ...; see its --help)

Runs: torchrun --standalone --nproc_per_node NPROC -m examples.train_lm_fsdp \\
        --config CONFIG [args...]
torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and MASTER_* for every rank. Each rank uses
gloo on CPU, or NCCL on GPU LOCAL_RANK when CUDA is available. OMP_NUM_THREADS
defaults to (cores / NPROC), at least 1. If a rank fails torchrun stops the others and
this script exits non-zero.

example: $(basename "$0") -n 2 ds_configs/fsdp_acco.json --steps 50
         $(basename "$0") -n 2 ds_configs/fsdp_auto_lowbit.json --steps 50
USAGE
}

NPROC="${NPROC:-2}"
PORT="${MASTER_PORT:-}"
# shellcheck source=launchers/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
exec torchrun "${RDZV[@]}" --nproc_per_node "$NPROC" \
  -m examples.train_lm_fsdp --config "$CONFIG" "$@"
