"""Run :mod:`examples.train_lm` in this process and record what the benchmark needs.

    python -m benchmarks.sweep.worker --out DIR -- <train_lm arguments>

train_lm itself logs per-step metrics on rank 0 and a summary; it does not log
memory, interface counters or per-rank timing. This wrapper adds them without
changing the training script:

* ``baseline_rss_kb``: resident memory after importing torch, transformers,
  DeepSpeed and the example modules, before the model exists;
* ``peak_rss_kb``: ``VmHWM`` from ``/proc/self/status`` at exit (the peak
  resident set of the whole process), and ``ru_maxrss`` for comparison;
* one record per optimizer step on *every* rank (wall time, step, local loss,
  micro-batch index, interface tx/rx bytes of ``$DS_ACCO_CLUSTER_IFACE``,
  current RSS, and on a GPU ``torch.cuda.memory_allocated``), taken by wrapping
  ``JsonlLog.write``, which train_lm calls once per optimizer step on every rank
  (the log file itself is written by rank 0 only);
* on a GPU, ``cuda_peak_allocated`` / ``cuda_peak_reserved``: the caching
  allocator's high-water marks, which count tensors exactly where RSS counts pages.

Everything goes to ``DIR/worker_rank<r>.json``, written in a ``finally`` so a
failed run still leaves its peak memory and the steps it reached.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
import traceback

from examples.run_record import iface_bytes


def _status_kb(field: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def _cuda_stat(name: str) -> int:
    """A ``torch.cuda`` memory counter of this process's device, or -1 where CUDA is not in use."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return -1
    return int(getattr(torch.cuda, name)())


def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of every live thread of this process, keyed ``name/tid``.

    Why: on a CPU host the communication thread and gloo's I/O threads share the cores with
    compute, so what a round costs the step is their CPU time, not the round's wall time."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended between listdir and open
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}/{tid}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _cpu_ticks() -> dict[str, list[int]]:
    """Per-CPU tick counters from /proc/stat (user nice system idle iowait irq softirq ...): the
    host's pinned core also runs the kernel's network stack for its link, which no thread is charged."""
    with open("/proc/stat", encoding="utf-8") as f:
        return {line.split()[0]: [int(v) for v in line.split()[1:8]] for line in f if line.startswith("cpu")}


def _preemptions() -> int:
    """How often this (the training) thread was switched out while it could have run."""
    with open(f"/proc/self/task/{threading.get_native_id()}/status", encoding="utf-8") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt_switches"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--out" or argv[2] != "--":
        print("usage: python -m benchmarks.sweep.worker --out DIR -- <train_lm arguments>", file=sys.stderr)
        return 2
    out_dir, train_argv = argv[1], argv[3:]
    rank = int(os.environ.get("RANK", "0"))
    iface = os.environ.get("DS_ACCO_CLUSTER_IFACE", "lo")
    t_start = time.time()

    # Import everything train_lm imports first, so the baseline holds the libraries only.
    import deepspeed  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import ds_acco.deepspeed.engine  # noqa: F401
    from examples import models, shakespeare, train_lm, train_metrics  # noqa: F401

    baseline_kb = _status_kb("VmRSS")
    steps: list[dict] = []
    summary: dict = {}
    thread_cpu: dict[str, float] = {}
    original_write = train_metrics.JsonlLog.write

    def write(self, **record):
        if "step" in record and "event" not in record:
            tx, rx = iface_bytes(iface)
            steps.append({"t": time.time(), "step": record["step"], "loss": record.get("loss"),
                          "val_loss": record.get("val_loss"), "micro_batch_index": record.get("micro_batch_index"),
                          "train_s": record.get("train_s"), "val_train_s": record.get("val_train_s"),
                          "tx_bytes": tx, "rx_bytes": rx,
                          "rss_kb": _status_kb("VmRSS"), "cuda_allocated": _cuda_stat("memory_allocated"),
                          "main_cpu_s": time.thread_time(), "main_preempted": _preemptions()})
            thread_cpu.update(_thread_cpu_s())  # threads that end before the summary keep their last reading
        elif record.get("event") == "summary":
            summary.update(record)
        return original_write(self, **record)

    train_metrics.JsonlLog.write = write
    exit_code, error = 1, None
    t_train0 = time.time()
    tx0, rx0 = iface_bytes(iface)
    ticks0, preempted0 = _cpu_ticks(), _preemptions()
    try:
        exit_code = train_lm.main(train_argv) or 0
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - record, then re-raise
        error = traceback.format_exc()
        raise
    finally:
        train_metrics.JsonlLog.write = original_write
        tx1, rx1 = iface_bytes(iface)
        record = {
            "rank": rank,
            "host": os.environ.get("DS_ACCO_CLUSTER_HOST"),
            "iface": iface,
            "exit_code": exit_code if error is None else 1,
            "error": error,
            "baseline_rss_kb": baseline_kb,
            "peak_rss_kb": _status_kb("VmHWM"),
            "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "cuda_peak_allocated": _cuda_stat("max_memory_allocated"),
            "cuda_peak_reserved": _cuda_stat("max_memory_reserved"),
            "import_s": t_train0 - t_start,
            "run_s": time.time() - t_train0,
            "iface_start": [tx0, rx0],
            "iface_end": [tx1, rx1],
            "steps": steps,
            "summary": summary,
            "thread_cpu_s": thread_cpu,
            "process_cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2]),
            "main_preempted": _preemptions() - preempted0,
            "cpu_ticks": {cpu: [b - a for a, b in zip(ticks0[cpu], t)] for cpu, t in _cpu_ticks().items()},
            "clock_ticks_per_s": os.sysconf("SC_CLK_TCK"),
            "pinned_cpu": next(iter(os.sched_getaffinity(0))) if len(os.sched_getaffinity(0)) == 1 else None,
        }
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"worker_rank{rank}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
