# Sourced by the launch scripts (not run on its own): parses [-n NPROC] [-p PORT] CONFIG
# into NPROC, PORT and CONFIG, leaves the training arguments in "$@", and sets REPO,
# OMP_NUM_THREADS (cores / NPROC unless set) and PYTHONPATH. The caller defines usage()
# and the defaults of NPROC and PORT first.
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
