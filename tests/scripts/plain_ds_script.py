"""A plain DeepSpeed training script that calls deepspeed.initialize (knows nothing of ds_acco)."""

import argparse
import json

import deepspeed
import torch

from examples.models import build_gpt
from examples.shakespeare import micro_batch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--local_rank", type=int, default=-1)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

torch.set_num_threads(1)
model = build_gpt("tiny", seq_len=32)
engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
rank, k, losses = engine.global_rank, 0, []
while engine.global_steps < args.steps:
    batch = micro_batch("train", engine.global_rank, k, engine.train_micro_batch_size_per_gpu(), 32, seed=0)
    k += 1
    loss = engine(**batch).loss
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
acco = getattr(engine, "acco", None)
if rank == 0:
    print("RESULT " + json.dumps({"engine": type(engine).__name__, "world": engine.world_size,
                                  "global_steps": engine.global_steps, "first_loss": losses[0],
                                  "last_loss": losses[-1], "micro_batches": k,
                                  "telemetry": acco.telemetry.summary() if acco else None}), flush=True)
