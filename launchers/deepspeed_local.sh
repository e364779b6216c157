#!/usr/bin/env bash
# Train examples.train_lm on one machine with the DeepSpeed launcher.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [-n NPROC] [-p PORT] CONFIG [train_lm args...]

  -n NPROC  processes (ranks) on this machine (default: \$NPROC or 2)
  -p PORT   rendezvous port (default: \$MASTER_PORT or 29500)
  CONFIG    DeepSpeed config, e.g. ds_configs/acco_fixed.json
  the rest  goes to train_lm (--steps, --model-size, --save-dir, ...; see its --help)
  \$TRAIN_MODULE  run another training module with the same arguments
                 (default: examples.train_lm)

Runs: deepspeed --num_gpus NPROC --master_port PORT examples/train_lm.py \\
        --deepspeed --deepspeed_config CONFIG [args...]
On a CPU-only machine DeepSpeed's accelerator reports 1 device, so --num_gpus is what
asks for NPROC processes. OMP_NUM_THREADS defaults to (cores / NPROC), at least 1, so
ranks do not oversubscribe the CPU. Exits with the first failing rank's status.

example: $(basename "$0") -n 2 ds_configs/acco_fixed.json --steps 50
USAGE
}

NPROC="${NPROC:-2}"
PORT="${MASTER_PORT:-29500}"
# shellcheck source=launchers/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [[ -n "${TRAIN_MODULE:-}" ]]; then
  ENTRY=(--module "$TRAIN_MODULE")
else
  ENTRY=("$REPO/examples/train_lm.py")  # a script path, as most DeepSpeed jobs are started
fi
exec deepspeed --num_gpus "$NPROC" --master_port "$PORT" \
  "${ENTRY[@]}" --deepspeed --deepspeed_config "$CONFIG" "$@"
