"""The operations a round's optimizer step issues on an accelerator: the elementwise Adam rule against torch's
fused kernel (ds_acco/optim/fused_adam.py), for the shard sizes users run.

Why count operations: on a GPU a round costs compute by host time, not arithmetic; each operation its thread
issues holds the Python interpreter for a moment the training thread needs to launch its own kernels
(docs/gpu.md). The count is what a change to the round should move, and it can be taken on any machine:
``FunctionalAdam.accelerator = True`` makes the lookahead and the commit choose as on a GPU (its chunk size,
the kernel or not, the whole-shard rule where it issues fewer), and torch's profiler counts the operations
they issue from Python (those with no parent: one trip through the interpreter each). The tensors are real,
on whatever device runs this; the counts do not depend on it, the seconds (also printed) do.

    python -m benchmarks.round_launches --out bench_results/round_launches
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

import torch

SHARDS = {  # name: elements of one rank's shard
    "medium GPT (examples), 1 rank": None,  # counted from the model
    "1B model over 8 ranks": 1_000_000_000 // 8,
    "7B model over 64 ranks": 7_000_000_000 // 64,
}


def medium_params() -> int:
    from examples.models import build_gpt, count_parameters

    return count_parameters(build_gpt("medium"))


def count(fn) -> tuple[int, float]:
    """Operations ``fn`` issues from Python (profiler events without a parent) and its seconds."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
    return sum(1 for e in prof.events() if e.cpu_parent is None), seconds


def measure(n: int, kernel: bool, scratch: bool, device: str = "cpu", chunk: Optional[int] = None) -> dict:
    """One shard of ``n`` elements under AdamW after one step (moments present): the lookahead's and the
    commit's operations, with the kernel or the elementwise rule, with or without a shard-sized scratch."""
    import ds_acco.optim.adam_lookahead as A
    from ds_acco.optim.shard_optimizer import ShardOptimizer

    saved = A.CUDA_CHUNK_ELEMS
    if chunk is not None:
        A.CUDA_CHUNK_ELEMS = chunk
    try:
        master = torch.randn(n, device=device)
        opt = torch.optim.AdamW([master], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        so = ShardOptimizer(opt, [master])
        so._functional.accelerator, so._functional.fused = True, kernel
        grad, out = torch.randn(n, device=device), torch.empty(n, device=device)
        spare = [torch.empty(n, device=device)] if scratch else None
        so.commit([grad], scratch=spare)  # the moments exist from here on, as in a run
        so.lookahead([grad], [out], scratch=spare)  # and the scratch and the cached views of a round
        so.commit([grad], scratch=spare)
        look, look_s = count(lambda: so.lookahead([grad], [out], scratch=spare))
        commit, commit_s = count(lambda: so.commit([grad], scratch=spare))
    finally:
        A.CUDA_CHUNK_ELEMS = saved
    return {"elements": n, "kernel": kernel, "shard_scratch": scratch, "chunk_elements": chunk or saved,
            "lookahead_ops": look, "commit_ops": commit, "lookahead_s": round(look_s, 4),
            "commit_s": round(commit_s, 4), "device": device}


def table(rows: list[dict]) -> str:
    lines = ["| shard | elements | shard-sized scratch | lookahead ops: elementwise | fused kernel "
             "| commit ops: elementwise | fused kernel |", "|---|---|---|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault((r["shard"], r["shard_scratch"]), {})[r["kernel"]] = r
    for (shard, scratch), pair in by.items():
        e, k = pair[False], pair[True]
        lines.append(f"| {shard} | {e['elements'] / 1e6:.1f} M | {'yes' if scratch else 'no'} | "
                     f"{e['lookahead_ops']} | {k['lookahead_ops']} | {e['commit_ops']} | {k['commit_ops']} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true", help="a 4321-element shard in 1000-element chunks (a smoke run)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    shards = {"small shard (smoke)": 4321} if args.small else \
        {name: n if n is not None else medium_params() for name, n in SHARDS.items()}
    rows = []
    for name, n in shards.items():
        for scratch in (False, True):
            for kernel in (False, True):
                row = measure(n, kernel, scratch, chunk=1000 if args.small else None)
                rows.append({"shard": name, **row})
                print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    result = {"torch": torch.__version__, "command": "python -m benchmarks.round_launches" +
              (" --small" if args.small else ""), "rows": rows}
    with open(os.path.join(args.out, "round_launches.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
