#!/usr/bin/env bash
# Train examples.train_lm with MPI (mpiexec from MPICH or Open MPI).
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [-n NPROC] [-p PORT] CONFIG [train_lm args...]

  -n NPROC  MPI processes (ranks) (default: \$NPROC or 2)
  -p PORT   port of the torch.distributed rendezvous on rank 0 (default: \$MASTER_PORT or 29500)
  CONFIG    DeepSpeed config, e.g. ds_configs/dpu.json
  the rest  goes to train_lm (--steps, --model-size, --save-dir, ...; see its --help)
  \$TRAIN_MODULE  run another training module with the same arguments
                 (default: examples.train_lm)

Runs: mpiexec -n NPROC python -m examples.train_lm --deepspeed_config CONFIG \\
        --distributed-port PORT [args...]
RANK/WORLD_SIZE are not set by mpiexec, so deepspeed.init_distributed discovers the ranks
through mpi4py (rank 0's first 'hostname -I' address becomes MASTER_ADDR). Needs
'pip install mpi4py mpich' (or a system MPI that mpi4py was built against). Extra mpiexec
options (hostfile, binding) go in \$MPIEXEC_ARGS. Exits non-zero if any rank fails.

example: $(basename "$0") -n 2 ds_configs/dpu.json --steps 50
USAGE
}

NPROC="${NPROC:-2}"
PORT="${MASTER_PORT:-29500}"
# shellcheck source=launchers/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PYTHON="${PYTHON:-python}"

exec mpiexec "${EXTRA[@]}" -n "$NPROC" "$PYTHON" -m "${TRAIN_MODULE:-examples.train_lm}" \
  --deepspeed_config "$CONFIG" --distributed-port "$PORT" "$@"
