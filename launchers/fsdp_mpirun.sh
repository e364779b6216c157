#!/usr/bin/env bash
# Train examples.train_lm_fsdp (FSDP2 + ACCO) with MPI (mpiexec from MPICH or Open MPI).
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [-n NPROC] [-p PORT] CONFIG [train_lm_fsdp args...]

  -n NPROC  MPI processes (ranks) (default: \$NPROC or 2)
  -p PORT   port of the torch.distributed rendezvous on rank 0 (default: \$MASTER_PORT or 29500)
  CONFIG    job config with an "acco" block whose backend is "fsdp", e.g. ds_configs/fsdp_acco.json,
            or ds_configs/fsdp_auto_lowbit.json (mode auto with every low-bit switch)
  the rest  goes to train_lm_fsdp (--steps, --model-size, --save-dir, ...; see its --help)

Runs: mpiexec -n NPROC python -m examples.train_lm_fsdp --config CONFIG \\
        --distributed-port PORT [args...]
Ranks are discovered through mpi4py (DeepSpeed's mpi_discovery); needs 'pip install mpi4py
mpich'. Extra mpiexec options go in \$MPIEXEC_ARGS. Exits non-zero if any rank fails.

example: $(basename "$0") -n 2 ds_configs/fsdp_auto_lowbit.json --steps 20
USAGE
}

NPROC="${NPROC:-2}"
PORT="${MASTER_PORT:-29500}"
# shellcheck source=launchers/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PYTHON="${PYTHON:-python}"
exec mpiexec "${EXTRA[@]}" -n "$NPROC" "$PYTHON" -m examples.train_lm_fsdp \
  --config "$CONFIG" --distributed-port "$PORT" "$@"
