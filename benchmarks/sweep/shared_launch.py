"""Several runs in one cluster launch: the smoke sweep's way to pay the imports once per host, not once per run.

A run of a sweep is one ``launchers/local_cluster.py`` launch, and each of its processes spends most
of a smoke run importing torch, transformers and DeepSpeed (about 7 CPU-seconds on this machine,
against half a second of engine start and training). The smoke sweep's figures are not measurements,
so there the runs that want the same links (rate, MTU, CPU quotas and pins) share one launch of as
many hosts as the largest needs: each host imports the libraries once, loads DeepSpeed's JIT ops
once, then forks one child per run, in the sweep's order; a run of fewer hosts runs on the first
ones (a world of its own size) while the others go on to the next run. A child is the run: a fresh
process (its own process group on a port of its own, its own threads, RSS high-water mark, CPU
counters and logs), running what a launch of its own runs (:mod:`benchmarks.sweep.worker` around
``examples.train_lm``, or ``examples.train_lm_fsdp``) and writing to its own run folder. One run at a
time, so a host's interface counters are that run's. What it cannot give is what belongs to a whole
launch: the launcher's counters, so a run's ``cluster.json`` takes its interface bytes from the
worker's own counters (no qdisc drops: the smoke sweep's links are unshaped). ``full`` sweeps keep
one launch per run.

Each host writes ``exit_rank<r>.json`` (exit code, seconds) into a run's folder when its child ends,
and stops at the first failed run (exit code: the child's), so the launcher tears the cluster down
and the remaining runs report that they did not run.

    python -m benchmarks.sweep.shared_launch BATCH_JSON     # on every host, under the launcher
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback

BATCH = "batch.json"


def launch_key(spec) -> tuple:
    """What a run needs of its links: runs with equal keys can share a launch."""
    return spec.rate or None, spec.cpu_quota, spec.cpus, spec.mtu, spec.delay


def groups(specs: list) -> list[list]:
    """The runs by :func:`launch_key`, each group in the sweep's order, groups by their first run."""
    out: dict = {}
    for spec in specs:
        out.setdefault(launch_key(spec), []).append(spec)
    return list(out.values())


def _child(run: dict, rank: int, port: int) -> None:
    """The run, in a forked child; never returns."""
    code, t0 = 1, time.time()
    try:
        # a fresh rendezvous (the last run's store may still be closing), in a world of the run's size
        os.environ.update(MASTER_PORT=str(port), WORLD_SIZE=str(run["hosts"]))
        fd = os.open(os.path.join(run["run_dir"], f"host{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        if run["frontend"] == "fsdp":
            from examples import train_lm_fsdp

            code = train_lm_fsdp.main(run["argv"]) or 0
        else:
            from benchmarks.sweep import worker

            code = worker.main(["--out", run["run_dir"], "--"] + run["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the run failed: say why in its log, exit non-zero
        traceback.print_exc()
        code = 1
    finally:
        t1 = time.time()
        try:
            import atexit

            atexit._run_exitfuncs()  # ds_acco's exit order: engines closed, its process group destroyed
            print(f"[shared_launch] run {t1 - t0:.2f}s, exit hooks {time.time() - t1:.2f}s", flush=True)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _preload() -> None:
    """Everything a run imports and loads before it trains, once (one thread: safe to fork after)."""
    import deepspeed  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from deepspeed.accelerator import get_accelerator

    import ds_acco.deepspeed.engine  # noqa: F401
    import ds_acco.fsdp  # noqa: F401
    from benchmarks.sweep import worker  # noqa: F401
    from examples import models, shakespeare, train_lm, train_lm_fsdp, train_metrics  # noqa: F401

    import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401  (imported by every engine's start: inductor)

    for op in ("FusedAdamBuilder", "ShareMemCommBuilder"):  # JIT ops: a ninja check and a load per process
        builder = get_accelerator().create_op_builder(op)
        if builder is not None and builder.is_compatible():
            builder.load(verbose=False)
    gc.freeze()  # the libraries' objects are permanent: a child's collections (ds_acco's exit runs one) skip them


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m benchmarks.sweep.shared_launch BATCH_JSON", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    rank, base_port = int(os.environ.get("RANK", "0")), int(os.environ.get("MASTER_PORT", "29500"))
    _preload()
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # a fork copies only the calling thread
        print(f"[shared_launch] {threads} threads after the imports; cannot fork", file=sys.stderr)
        return 1
    for i, run in enumerate(runs):
        if rank >= run["hosts"]:
            continue  # a run on fewer hosts: the others go on to the next run's rendezvous
        sys.stdout.flush()
        sys.stderr.flush()
        t0 = time.time()
        pid = os.fork()
        if pid == 0:
            _child(run, rank, base_port + 1 + i)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        with open(os.path.join(run["run_dir"], f"exit_rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump({"exit_code": code, "wall_s": time.time() - t0}, f)
        print(f"[shared_launch] rank {rank}: {os.path.basename(run['run_dir'])} exit {code}, "
              f"{time.time() - t0:.1f}s", flush=True)
        if code != 0:
            return code if 0 < code < 256 else 1
    return 0


# --------------------------------------------------------------------------- the runner's side


def prepare_group(specs: list, out_dir: str, *, netns: bool, timeout_s: float) -> tuple[str, list[str], list[dict]]:
    """The run folders, ``launches/<first run>/batch.json`` and the launch command of ``specs`` (one
    :func:`launch_key`): ``(launch dir, command, batch entries)``."""
    from .commands import fsdp_args, launcher_args, prepare_run, train_args

    entries = []
    for spec in specs:
        run_dir, config_path = prepare_run(spec, out_dir)
        fsdp = spec.workload.frontend == "fsdp"
        argv = (fsdp_args if fsdp else train_args)(spec.workload, config_path, run_dir)
        entries.append({"id": spec.run_id, "run_dir": run_dir, "hosts": spec.hosts,
                        "frontend": spec.workload.frontend, "argv": argv})
    launch_dir = os.path.join(os.path.abspath(out_dir), "launches", specs[0].run_id)
    os.makedirs(launch_dir, exist_ok=True)
    batch = os.path.join(launch_dir, BATCH)
    with open(batch, "w", encoding="utf-8") as f:
        json.dump({"runs": entries}, f, indent=1)
    widest = max(specs, key=lambda s: s.hosts)
    cmd = launcher_args(widest, launch_dir, netns=netns, timeout_s=timeout_s) + [
        sys.executable, "-m", "benchmarks.sweep.shared_launch", batch]
    return launch_dir, cmd, entries


def execute_group(specs: list, out_dir: str, *, netns: bool, timeout_s: float) -> list[tuple[str, int, float]]:
    """Run ``specs`` (one :func:`launch_key`) in one launch; ``(run dir, exit code, seconds)`` per run."""
    import subprocess

    from .commands import REPO

    launch_dir, cmd, entries = prepare_group(specs, out_dir, netns=netns, timeout_s=timeout_s)
    with open(os.path.join(launch_dir, "command.txt"), "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.monotonic()
    with open(os.path.join(launch_dir, "launcher.log"), "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout_s + 60)
        except subprocess.TimeoutExpired:  # the launcher's own --timeout should have fired first
            proc.terminate()  # it tears its cluster down on SIGTERM
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            rc = 124
    wall = time.monotonic() - t0
    launch = _read(os.path.join(launch_dir, "cluster.json")) or {}
    return [_finish_run(spec, e["run_dir"], specs[0].run_id, launch, rc, wall) for spec, e in zip(specs, entries)]


def _read(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _finish_run(spec, run_dir: str, launch_id: str, launch: dict, launch_rc: int,
                launch_wall: float) -> tuple[str, int, float]:
    """A run's exit code and seconds from its hosts' ``exit_rank<r>.json``; its ``cluster.json`` from the launch's
    (its own hosts, their interface bytes from the worker's counters)."""
    exits = [_read(os.path.join(run_dir, f"exit_rank{r}.json")) for r in range(spec.hosts)]
    codes = [e["exit_code"] for e in exits if e]
    rc = next((c for c in codes if c != 0), 0) if len(codes) == spec.hosts else (launch_rc or 1)
    wall = max((e["wall_s"] for e in exits if e), default=launch_wall)
    hosts = []
    for r, host in enumerate((launch.get("hosts") or [])[:spec.hosts]):
        w = _read(os.path.join(run_dir, f"worker_rank{r}.json")) or {}
        start, end = w.get("iface_start"), w.get("iface_end")
        delta = ({"tx_bytes": end[0] - start[0], "rx_bytes": end[1] - start[1]}
                 if start and end and min(start + end) >= 0 else {})
        mine = {k: v for k, v in host.items() if k not in ("counters_start", "counters_end", "delta", "exit_code")}
        hosts.append(dict(mine, log_path=os.path.join(run_dir, f"host{r}.log"), delta=delta,
                          exit_code=(exits[r] or {}).get("exit_code")))
    with open(os.path.join(run_dir, "cluster.json"), "w", encoding="utf-8") as f:
        json.dump({"netns": launch.get("netns"), "shared_launch": launch_id, "launch_exit_code": launch_rc,
                   "hosts": hosts}, f, indent=1)
    return run_dir, rc, wall


if __name__ == "__main__":
    sys.exit(main())
