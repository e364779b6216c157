# Sourced by the launch scripts (not run on its own): parses [-n NPROC] [-p PORT] CONFIG
# into NPROC, PORT and CONFIG, leaves the training arguments in "$@", sets REPO,
# OMP_NUM_THREADS (cores / NPROC unless set), PYTHONPATH, RDZV (torchrun's rendezvous
# flags) and EXTRA (mpiexec flags from $MPIEXEC_ARGS), and unsets leftover launcher
# variables. The caller defines usage() and the defaults of NPROC and PORT first.
while getopts ":hn:p:" opt; do
  case "$opt" in
    h) usage; exit 0 ;;
    n) NPROC="$OPTARG" ;;
    p) PORT="$OPTARG" ;;
    :) echo "error: -$OPTARG needs a value" >&2; usage >&2; exit 2 ;;
    *) echo "error: unknown option -$OPTARG" >&2; usage >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ $# -lt 1 ]]; then usage >&2; exit 2; fi
CONFIG="$1"; shift

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / NPROC > 0 ? $(nproc) / NPROC : 1 ))}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# Leftover launcher variables would make DeepSpeed skip MPI discovery, or point torchrun's
# ranks at another job (PORT has already been read from MASTER_PORT).
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
# torchrun: a fixed rendezvous port when one was given, else --standalone picks a free one.
if [[ -n "${PORT:-}" ]]; then
  RDZV=(--nnodes 1 --master_addr 127.0.0.1 --master_port "$PORT")
else
  RDZV=(--standalone)
fi
read -r -a EXTRA <<< "${MPIEXEC_ARGS:-}"
