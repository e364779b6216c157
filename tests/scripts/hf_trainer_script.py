"""An ordinary HF Transformers Trainer script with a DeepSpeed config; nothing ACCO-specific in it.

Run it through ``python -m ds_acco.run`` (or with ds_acco.patch_deepspeed() called first) to
get ACCO from the config's "acco" block.
"""

import argparse
import json
import os

import torch
from safetensors.torch import load_file
from transformers import Trainer, TrainingArguments

from examples.models import build_gpt
from examples.shakespeare import ShakespeareWindows
from tests.ds_workloads import full_masters

parser = argparse.ArgumentParser()
parser.add_argument("--deepspeed-config", required=True)
parser.add_argument("--output-dir", required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--fp32", action="store_true", help="no bf16 (streaming trains fp32 replicas)")
parser.add_argument("--check-export", action="store_true",
                    help="save_model() after train() and compare it with the gathered fp32 master parameters")
parser.add_argument("--force-streaming", action="store_true",
                    help="mode auto with auto.streaming switches at its first choice, whatever this machine measures")
args = parser.parse_args()
if args.force_streaming:
    from ds_acco.rounds import auto_mode

    auto_mode.STREAMING_HINT = 0.0  # (at the first choice after measure_steps: not before the first round, where
    auto_mode.AutoMode.look_first = lambda self: False  # it would hang on whether loopback's probe gave a rate)

model = build_gpt("tiny", seq_len=64)
train = ShakespeareWindows("train", seq_len=64)
training_args = TrainingArguments(
    output_dir=args.output_dir, deepspeed=args.deepspeed_config, use_cpu=True, bf16=not args.fp32,
    per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=args.steps, learning_rate=2e-3,
    logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0, seed=0,
)
trainer = Trainer(model=model, args=training_args, train_dataset=train)
result = trainer.train()
engine = trainer.model_wrapped
acco = getattr(engine, "acco", None)
export = None
if args.check_export:
    final = os.path.join(args.output_dir, "final")
    trainer.save_model(final)  # every rank, as HF requires; rank 0 writes
    masters = full_masters(engine)  # collective
    first = {id(p): n for n, p in engine.module.named_parameters()}
    for alias, p in engine.module.named_parameters(remove_duplicate=False):  # tied weights: HF saves one name
        masters[alias] = masters[first[id(p)]]
    if trainer.args.process_index == 0:
        saved = load_file(os.path.join(final, "model.safetensors"))
        export = {"compared": len(saved), "dtype": str(next(iter(saved.values())).dtype),
                  "equal_to_cast_masters": all(torch.equal(v, masters[k].to(v.dtype)) for k, v in saved.items()),
                  "scheduler_steps": engine.lr_scheduler.last_epoch, "final_lr": engine.lr_scheduler.get_last_lr()[0],
                  "commits": engine.global_steps}
if trainer.args.process_index == 0:
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print("RESULT " + json.dumps({
        "engine": type(engine).__name__,
        "global_steps": engine.global_steps,
        "losses": losses,
        "telemetry": acco.telemetry.summary() if acco is not None else None,
        "mode": acco.config.mode if acco is not None else None,
        "running": getattr(acco, "mode", None),  # what auto runs now (the streaming engine has no choice)
        "export": export,
    }), flush=True)
