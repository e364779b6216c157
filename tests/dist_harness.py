"""Run a function on N real processes joined by a gloo process group, with a hard timeout.

Each worker writes its return value (``torch.save``) or its traceback to a
temporary folder; the parent joins every process within ``timeout`` seconds,
kills the rest, and raises with the workers' tracebacks if any failed.
"""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, outdir, fn, args, kwargs, pg_timeout):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=pg_timeout))
        result = fn(rank, world_size, *args, **kwargs)
        torch.save(result, os.path.join(outdir, f"rank{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(outdir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)


def run_distributed(fn, world_size: int, *args, timeout: float = 120.0, pg_timeout: float = 60.0,
                    expect_dead=(), **kwargs):
    """Return the list of per-rank results of ``fn(rank, world_size, *args, **kwargs)``.

    Ranks in ``expect_dead`` are allowed to die or hang (fault-injection tests); their
    result is ``None`` and, if still alive at the deadline, they are killed.
    """
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as outdir:
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, outdir, fn, args, kwargs, pg_timeout))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        deadline = timeout
        import time
        t0 = time.monotonic()
        for p in procs:
            p.join(max(0.0, deadline - (time.monotonic() - t0)))
        hung = [r for r, p in enumerate(procs) if p.is_alive() and r not in expect_dead]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        errors = []
        for r in range(world_size):
            err = os.path.join(outdir, f"rank{r}.err")
            if os.path.exists(err):
                errors.append(f"--- rank {r} ---\n" + open(err).read())
        missing = [r for r in range(world_size)
                   if r not in expect_dead and not os.path.exists(os.path.join(outdir, f"rank{r}.pt"))]
        if hung or errors or missing:
            raise RuntimeError(f"distributed run failed (hung ranks: {hung}, ranks without a result: {missing}, exit codes "
                               f"{[p.exitcode for p in procs]})\n" + "\n".join(errors))
        results = []
        for r in range(world_size):
            path = os.path.join(outdir, f"rank{r}.pt")
            results.append(torch.load(path, weights_only=False) if os.path.exists(path) else None)
        return results
