"""Memory per worker on a GPU: ``torch.cuda`` counters against the analytic model.

    python -m benchmarks.memory.gpu --out /tmp/gpu_memory [--model-size medium] [--configs zero1,sync,...]

Peak RSS on the CPU cluster counts pages, so the allocator's slack and gloo's
scratch blur it (see BENCHMARKS.md, "Memory per worker"). The CUDA caching
allocator counts tensors exactly, so on a GPU the same runs give two clean
figures per config:

* **steady**: ``torch.cuda.memory_allocated`` at the end of an optimizer step
  (the least over the steps after the first two, when no activations are alive):
  the persistent buffers the analytic model (:mod:`benchmarks.memory.model`) counts;
* **peak**: ``torch.cuda.max_memory_allocated`` over the run: persistent buffers
  plus activations, the optimizer step's temporaries and a round's working memory.

One GPU takes one NCCL rank, so every run has world size 1 (``P/N = P``). Each
config runs in its own process (the counters are per process), started the way
the ``deepspeed`` launcher starts a rank (``RANK``/``WORLD_SIZE``/``MASTER_*``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Optional

from benchmarks.cluster.system import free_port
from benchmarks.sweep.configs import make_config
from ds_acco.optim.adam_lookahead import CUDA_CHUNK_ELEMS

from . import model as memory

DEFAULT = ("zero1", "sync", "dpu", "acco_fixed", "acco_adaptive", "zero1_bf16", "acco_bf16", "acco_bf16_fp32acc")
MB = 1e6


def run_one(name: str, out: str, *, model_size: str, seq_len: int, micro_batch: int, grad_accum: int,
            steps: int) -> dict:
    """Train ``steps`` optimizer steps of config ``name`` on GPU 0; return the worker's record."""
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    cfg_path = os.path.join(folder, "ds_config.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(make_config(name, micro_batch=micro_batch, grad_accum=grad_accum), f)
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    cmd = [sys.executable, "-m", "benchmarks.sweep.worker", "--out", folder, "--",
           "--model-size", model_size, "--seq-len", str(seq_len), "--steps", str(steps), "--no-progress",
           "--deepspeed_config", cfg_path]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    with open(os.path.join(folder, "log.txt"), "w", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    with open(os.path.join(folder, "worker_rank0.json"), encoding="utf-8") as f:
        return json.load(f)


def summarise(name: str, record: dict, params: int) -> dict:
    steps = record["steps"]
    if record.get("cuda_peak_allocated", -1) < 0:
        raise RuntimeError(f"{name}: no CUDA counters (did it run on the GPU?)")
    late = [s["cuda_allocated"] for s in steps[2:]] or [s["cuda_allocated"] for s in steps]
    return {
        "config": name,
        "params": params,
        "analytic_bytes": memory.total(name, 1, params, adam_chunk=CUDA_CHUNK_ELEMS),
        "steady_bytes": min(late),
        "peak_bytes": record["cuda_peak_allocated"],
        "reserved_peak_bytes": record["cuda_peak_reserved"],
        "losses": [s["loss"] for s in steps],
    }


def table(rows: list[dict]) -> str:
    by = {r["config"]: r for r in rows}
    lines = ["| config | analytic MB | steady MB | peak MB | steady − ZeRO-1 | analytic − ZeRO-1 | peak − ZeRO-1 |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        base = by.get(memory.baseline(r["config"])) if r["config"] in memory.DTYPE_BYTES else None

        def diff(key):
            return f"{(r[key] - base[key]) / MB:+.1f}" if base else "-"

        lines.append(f"| {r['config']} | {r['analytic_bytes'] / MB:.1f} | {r['steady_bytes'] / MB:.1f} | "
                     f"{r['peak_bytes'] / MB:.1f} | {diff('steady_bytes')} | {diff('analytic_bytes')} | "
                     f"{diff('peak_bytes')} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default=",".join(DEFAULT))
    ap.add_argument("--model-size", default="medium")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_memory: no CUDA device here; this benchmark measures torch.cuda counters", file=sys.stderr)
        return 2
    from examples.models import build_gpt, count_parameters

    params = count_parameters(build_gpt(args.model_size, seq_len=args.seq_len))
    rows = []
    for name in [c for c in args.configs.split(",") if c]:
        record = run_one(name, args.out, model_size=args.model_size, seq_len=args.seq_len,
                         micro_batch=args.micro_batch, grad_accum=args.grad_accum, steps=args.steps)
        rows.append(summarise(name, record, params))
        print(f"[gpu_memory] {name}: steady {rows[-1]['steady_bytes'] / MB:.1f} MB, "
              f"peak {rows[-1]['peak_bytes'] / MB:.1f} MB", flush=True)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "world_size": 1,
              "model_size": args.model_size, "params": params, "seq_len": args.seq_len,
              "micro_batch": args.micro_batch, "grad_accum": args.grad_accum, "rows": rows}
    with open(os.path.join(args.out, "gpu_memory.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"{result['device']}, torch {result['torch']}, {args.model_size} GPT, P = {params:,}, N = 1")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
