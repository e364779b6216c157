"""An ordinary HF Transformers ``Trainer`` script: nothing in it knows about ACCO.

ACCO comes from the DeepSpeed config's ``"acco"`` block when the script runs under
``ds_acco.run``, with any launcher::

    deepspeed --num_gpus 2 --module ds_acco.run examples/train_hf.py --deepspeed ds_configs/hf_trainer_streaming.json
    torchrun --nproc_per_node 2 -m ds_acco.run examples/train_hf.py --deepspeed ds_configs/hf_trainer_acco.json
    mpiexec -n 2 python -m ds_acco.run examples/train_hf.py --deepspeed ds_configs/hf_trainer_acco.json

A tiny GPT (random init, byte vocabulary) on the Shakespeare windows of
examples/shakespeare.py; fp32 on CPU (streaming trains fp32 replicas).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from transformers import Trainer, TrainingArguments

from examples.models import build_gpt
from examples.shakespeare import ShakespeareWindows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--deepspeed", required=True, help="DeepSpeed JSON config (its 'acco' block switches ACCO on)")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps (Trainer's max_steps)")
    p.add_argument("--output-dir", default=None, help="Trainer output folder (default: a temporary one)")
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    out = args.output_dir or tempfile.mkdtemp(prefix="train_hf_")
    training_args = TrainingArguments(
        output_dir=out, deepspeed=args.deepspeed, use_cpu=True, per_device_train_batch_size=2,
        gradient_accumulation_steps=4, max_steps=args.steps, learning_rate=2e-3, max_grad_norm=1.0,
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0, seed=0)
    trainer = Trainer(model=build_gpt("tiny", seq_len=64), args=training_args,
                      train_dataset=ShakespeareWindows("train", seq_len=64))
    result = trainer.train()
    if trainer.args.process_index == 0:
        print(f"[train_hf] done: steps {result.global_step} | train loss {result.training_loss:.4f} | "
              f"engine {type(trainer.model_wrapped).__name__} | pid {os.getpid()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
