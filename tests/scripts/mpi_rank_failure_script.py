"""examples.train_lm under mpiexec with rank 1 failing, as ``$MPI_RANK_FAILURE`` says (launchers/mpirun.sh runs it as
``$TRAIN_MODULE``): ``mid_run`` raises in rank 1's 7th micro-batch, after distributed init, while rank 0 is inside
a collective; ``before_init`` exits before MPI_Init, having imported nothing.

For ``before_init`` rank 1 waits, asleep, until rank 0 starts DeepSpeed's MPI discovery (rank 0 says so by creating
the file ``$MPI_RANK_FAILURE_FLAG``): MPICH's proxy spins on a core from the moment one of its ranks has exited,
which would otherwise slow rank 0's imports twofold on a small machine."""

import os
import sys
import time

FAILURE = os.environ["MPI_RANK_FAILURE"]
FLAG = os.environ.get("MPI_RANK_FAILURE_FLAG", "")
if FAILURE == "before_init" and os.environ.get("PMI_RANK") == "1":
    deadline = time.monotonic() + 120
    while FLAG and not os.path.exists(FLAG) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(3)

import examples.shakespeare as data  # noqa: E402
from examples import train_lm  # noqa: E402

if FAILURE == "before_init" and FLAG:
    from ds_acco.deepspeed import _internals

    _discovery = _internals.mpi_discovery_within_acco_timeout_s

    def discovery_after_saying_so(*args, **kwargs):
        open(FLAG, "a").close()  # noqa: SIM115 - the file's existence is the message
        return _discovery(*args, **kwargs)

    _internals.mpi_discovery_within_acco_timeout_s = discovery_after_saying_so

_micro_batch = data.micro_batch


def micro_batch(split, rank, index, *args, **kwargs):
    if FAILURE == "mid_run" and rank == 1 and index == 6:
        raise RuntimeError("injected failure on rank 1")
    return _micro_batch(split, rank, index, *args, **kwargs)


data.micro_batch = micro_batch
sys.exit(train_lm.cli())
