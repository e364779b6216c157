"""Ordinary HF Transformers Trainer runs with a DeepSpeed config, one after another in one process; nothing
ACCO-specific in how they train.

Run it through ``python -m ds_acco.run`` (or with ds_acco.patch_deepspeed() called first) to get ACCO from each
config's "acco" block. ``--plan`` is a JSON list of runs: ``{"name", "deepspeed_config", "steps", "fp32",
"check_export", "force_streaming"}``. Each trains a fresh model, writes ``<output-dir>/<name>/result.json`` (rank 0)
and is then torn down as a script that trains several models in turn must (Accelerate's ``free_memory``, which
destroys the engine; Accelerate's and HF's DeepSpeed state reset); the result counts the ds_acco engines it
started and those still open after that.
"""

import argparse
import gc
import json
import os

import torch
import torch.distributed as dist
from accelerate.state import AcceleratorState
from safetensors.torch import load_file
from transformers import Trainer, TrainingArguments
from transformers.integrations.deepspeed import unset_hf_deepspeed_config

from ds_acco.comm.engine_lifecycle import EXIT_ORDER
from examples.models import build_gpt
from examples.shakespeare import ShakespeareWindows
from tests.ds_workloads import full_masters
from tests.forced_streaming import forced_streaming


def check_export(trainer, engine, output_dir: str):
    """save_model() after train(), compared with the gathered fp32 master parameters (rank 0's verdict)."""
    final = os.path.join(output_dir, "final")
    trainer.save_model(final)  # every rank, as HF requires; rank 0 writes
    masters = full_masters(engine)  # collective
    first = {id(p): n for n, p in engine.module.named_parameters()}
    for alias, p in engine.module.named_parameters(remove_duplicate=False):  # tied weights: HF saves one name
        masters[alias] = masters[first[id(p)]]
    if trainer.args.process_index != 0:
        return None
    saved = load_file(os.path.join(final, "model.safetensors"))
    return {"compared": len(saved), "dtype": str(next(iter(saved.values())).dtype),
            "equal_to_cast_masters": all(torch.equal(v, masters[k].to(v.dtype)) for k, v in saved.items()),
            "scheduler_steps": engine.lr_scheduler.last_epoch, "final_lr": engine.lr_scheduler.get_last_lr()[0],
            "commits": engine.global_steps}


def run(case: dict, output_dir: str) -> dict:
    model = build_gpt("tiny", seq_len=64)
    train = ShakespeareWindows("train", seq_len=64)
    training_args = TrainingArguments(
        output_dir=output_dir, deepspeed=case["deepspeed_config"], use_cpu=True, bf16=not case.get("fp32"),
        per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=case["steps"], learning_rate=2e-3,
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train)
    trainer.train()
    engine = trainer.model_wrapped
    acco = getattr(engine, "acco", None)
    export = check_export(trainer, engine, output_dir) if case.get("check_export") else None
    result = {
        "engine": type(engine).__name__,
        "global_steps": engine.global_steps,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "telemetry": acco.telemetry.summary() if acco is not None else None,
        "mode": acco.config.mode if acco is not None else None,
        "running": getattr(acco, "mode", None),  # what auto runs now (the streaming engine has no choice)
        "export": export,
    }
    started = [e for e in EXIT_ORDER.engines.values() if not e.closed]  # held here, so none can just vanish
    trainer.accelerator.free_memory()  # Accelerate's teardown between trainings: it destroys the DeepSpeed engine
    del trainer, engine, acco, model
    AcceleratorState._reset_state(reset_partial_state=True)
    unset_hf_deepspeed_config()
    gc.collect()
    counts = torch.tensor([len(started), sum(not e.closed for e in started)])
    dist.all_reduce(counts)
    return dict(result, engines_started=int(counts[0]), engines_left_open=int(counts[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    for case in plan:
        out = os.path.join(args.output_dir, case["name"])
        with forced_streaming(case.get("force_streaming", False)):
            result = run(case, out)
        if dist.get_rank() == 0:
            with open(os.path.join(out, "result.json"), "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
