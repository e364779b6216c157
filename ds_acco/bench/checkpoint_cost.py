"""What checkpoint verification costs: save and load of a >= 50 M-parameter model, with and without it.

Run on 2 ranks through the ``deepspeed`` launcher (figures in BENCHMARKS.md,
"Checkpoint verification")::

    flock /tmp/ds_acco_bench.lock deepspeed --num_gpus 2 --module ds_acco.bench.checkpoint_cost --dir /tmp/ckpt_cost

A GPT-2 of 16 layers x 512 (50.4 M parameters, fp32, ZeRO-1 ACCO engine) trains one
optimizer step so the optimizer holds its moments, then saves and loads ``--repeats``
times. The time spent hashing for the manifest on save (``write_manifest``) and
verifying on load (``verify_tag`` plus the finite check) is taken inside the same
calls, so each ratio is measured within one run.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import time

import torch
import torch.distributed as dist


def _timed(module, name: str, spent: dict) -> None:
    """Wrap ``module.name`` so the seconds it takes add up in ``spent[name]``."""
    real = getattr(module, name)

    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t0

    setattr(module, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()

    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel

    import ds_acco
    from ds_acco import deepspeed_atomic, deepspeed_engine
    from ds_acco.checkpoint_manifest import HASH

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=8, n_positions=64,
                                       vocab_size=257))
    n_params = sum(p.numel() for p in model.parameters())
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 1}, "steps_per_print": 10**6,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
              "acco": {"mode": "acco", "policy": "fixed"}}
    engine = ds_acco.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
    x = torch.randint(0, 257, (1, 16))
    while engine.global_steps < 1:
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()

    spent: dict = {}
    _timed(deepspeed_atomic, "write_manifest", spent)
    _timed(deepspeed_engine, "verify_tag", spent)
    _timed(deepspeed_engine, "refuse_non_finite", spent)
    rank = dist.get_rank()
    rows = []
    for i in range(args.repeats):
        if rank == 0:
            shutil.rmtree(args.dir, ignore_errors=True)
        dist.barrier()
        spent.clear()
        t0 = time.perf_counter()
        engine.save_checkpoint(args.dir)
        save_s = time.perf_counter() - t0
        hash_s = spent.get("write_manifest", 0.0)
        spent.clear()
        t0 = time.perf_counter()
        engine.load_checkpoint(args.dir)
        load_s = time.perf_counter() - t0
        verify_s = spent.get("verify_tag", 0.0) + spent.get("refuse_non_finite", 0.0)
        rows.append((save_s, hash_s, load_s, verify_s))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        tag = open(os.path.join(args.dir, "latest")).read().strip()
        folder = os.path.join(args.dir, tag)
        mb = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 2**20
        print(f"[checkpoint_cost] {n_params / 1e6:.1f} M parameters, {dist.get_world_size()} ranks, "
              f"checkpoint {mb:.0f} MiB, hash {HASH}, load average {os.getloadavg()[0]:.2f}")
        for r, rank_rows in enumerate(gathered):
            for i, (save_s, hash_s, load_s, verify_s) in enumerate(rank_rows):
                print(f"[checkpoint_cost] rank {r} repeat {i}: save {save_s:.2f} s, of which manifest "
                      f"{hash_s:.3f} s ({100 * hash_s / save_s:.1f}%); load {load_s:.2f} s, of which verification "
                      f"{verify_s:.3f} s ({100 * verify_s / load_s:.1f}%)")
        shutil.rmtree(args.dir, ignore_errors=True)
    engine.destroy()


if __name__ == "__main__":
    main()
