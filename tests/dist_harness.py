"""Run a function on N real processes joined by a gloo process group, with a hard timeout.

Two ways, same results:

* **pooled** (default): N long-lived worker processes per world size, started
  once per test module (tests/conftest.py closes them after each) with a default
  gloo group that stays up, run one job at a time. Starting a process that imports
  torch, DeepSpeed and transformers costs seconds of CPU, far more than the tiny
  jobs themselves, so reuse keeps the suite inside its time budget; and every worker
  is forked from one *forkserver* that imported them once (:data:`PRELOAD`), so even
  a new pool or a fresh job starts in a fraction of a second. A worker gets the
  parent's environment as it is when the worker starts, as a spawned one would. Every job builds
  its own engines and process groups; a job that fails or overruns its timeout kills
  the pool, and the next job starts a fresh one. Pools once lived for the whole
  session: a worker that had run the jobs of a dozen modules before test_fsdp.py's
  died there once with SIGABRT in a full suite run, never in 40 runs of the same job
  on a fresh pool. A worker that dies leaves its ``faulthandler`` report (every
  thread's Python stack) in the error this harness raises.
* **fresh** (``fresh=True``, and always with ``expect_dead``): new processes for
  one job, for tests that kill or stop workers. Each worker writes its return
  value or traceback to a temporary folder; the parent joins them within
  ``timeout`` seconds and kills the rest.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.cluster.system import free_port  # noqa: F401 (the tests take it from here)

PRELOAD = ["torch", "torch.distributed", "deepspeed", "ds_acco", "ds_acco.plain", "ds_acco.deepspeed",
           "ds_acco.fsdp", "transformers", "tests.workloads", "tests.forkserver_preload"]
"""What the forkserver imports once, so that each worker forked from it starts without importing them. The
forkserver is a single-threaded process; these imports start no thread (torch's pools start on first use)."""
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(PRELOAD)


def _worker(rank, world_size, port, outdir, fn, args, kwargs, pg_timeout, env):
    os.environ.clear()
    os.environ.update(env)
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


def _crash_path(pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"ds_acco_test_worker_{pid}.crash")


def _crash_report(pid) -> str:
    """What ``faulthandler`` wrote for a worker that died of a signal (empty if nothing)."""
    try:
        with open(_crash_path(pid), encoding="utf-8", errors="replace") as f:
            text = f.read()
        os.remove(_crash_path(pid))
    except (OSError, TypeError):
        return ""
    return f"\n--- its faulthandler report ---\n{text[-8000:]}" if text.strip() else ""


def _pool_worker(rank, world_size, port, conn, pg_timeout, env):
    crash = open(_crash_path(os.getpid()), "w", encoding="utf-8")  # noqa: SIM115 - open while the worker lives
    faulthandler.enable(file=crash, all_threads=True)
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout))
    while True:
        job = conn.recv()
        if job is None:
            break
        fn, args, kwargs = job
        try:
            conn.send(("ok", fn(rank, world_size, *args, **kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    dist.destroy_process_group()
    faulthandler.disable()
    crash.close()
    os.remove(crash.name)


class _Pool:
    def __init__(self, world_size: int, pg_timeout: float):
        ctx = _CTX
        port = free_port()
        self.world_size = world_size
        self.conns, self.procs = [], []
        for r in range(world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_pool_worker, args=(r, world_size, port, child, pg_timeout, dict(os.environ)),
                               daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self, fn, args, kwargs, timeout: float):
        for c in self.conns:
            c.send((fn, args, kwargs))
        t0 = time.monotonic()
        results, errors, hung = [None] * self.world_size, [], []
        for r, c in enumerate(self.conns):
            if not c.poll(max(0.0, timeout - (time.monotonic() - t0))):
                hung.append(r)
                continue
            try:
                status, payload = c.recv()
            except EOFError:
                self.procs[r].join(5)
                errors.append(f"--- rank {r} --- died (exit code {self.procs[r].exitcode})" +
                              _crash_report(self.procs[r].pid))
                continue
            if status == "ok":
                results[r] = payload
            else:
                errors.append(f"--- rank {r} ---\n{payload}")
        if hung or errors:
            self.close(kill=True)
            raise RuntimeError(f"distributed run failed (hung ranks: {hung})\n" + "\n".join(errors))
        return results

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def close(self, kill: bool = False) -> None:
        for c, p in zip(self.conns, self.procs):
            if not kill and p.is_alive():
                try:
                    c.send(None)
                except (BrokenPipeError, OSError):
                    pass
        for p in self.procs:
            p.join(0 if kill else 5)
            if p.is_alive():
                p.kill()
                p.join()
            if os.path.exists(_crash_path(p.pid)):
                os.remove(_crash_path(p.pid))


_POOLS: dict[int, _Pool] = {}


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def run_distributed(fn, world_size: int, *args, timeout: float = 120.0, pg_timeout: float = 60.0,
                    expect_dead=(), fresh: bool = False, **kwargs):
    if not fresh and not expect_dead:
        pool = _POOLS.get(world_size)
        if pool is None or not pool.alive():
            pool = _POOLS[world_size] = _Pool(world_size, pg_timeout=600.0)
        try:
            return pool.run(fn, args, kwargs, timeout)
        except RuntimeError:
            _POOLS.pop(world_size, None)
            raise
    return _run_fresh(fn, world_size, *args, timeout=timeout, pg_timeout=pg_timeout, expect_dead=expect_dead,
                      **kwargs)


def _run_fresh(fn, world_size: int, *args, timeout: float = 120.0, pg_timeout: float = 60.0,
               expect_dead=(), **kwargs):
    """Return the list of per-rank results of ``fn(rank, world_size, *args, **kwargs)``.

    Ranks in ``expect_dead`` are allowed to die or hang (fault-injection tests); their
    result is ``None`` and, if still alive at the deadline, they are killed.
    """
    ctx = _CTX
    port = free_port()
    with tempfile.TemporaryDirectory() as outdir:
        procs = [ctx.Process(target=_worker, args=(r, world_size, port, outdir, fn, args, kwargs, pg_timeout,
                                                        dict(os.environ)))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        t0 = time.monotonic()
        for r, p in enumerate(procs):  # the ranks that must finish, within the deadline
            if r not in expect_dead:
                p.join(max(0.0, timeout - (time.monotonic() - t0)))
        for r in expect_dead:
            # With survivors, a victim that is still there once they are done is stopped (SIGSTOP):
            # kill it now. When every rank is a victim, each must get to its own death.
            grace = max(0.0, timeout - (time.monotonic() - t0)) if len(expect_dead) == world_size else 1.0
            procs[r].join(grace)
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


def forked(target, *args) -> "mp.Process":
    """``target(*args)`` in a started process of its own, forked from the forkserver (no process group, nothing
    joined): for tests of what happens before a process group exists."""
    proc = _CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc
