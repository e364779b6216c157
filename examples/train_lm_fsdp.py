"""Train a GPT-2-style byte-level LM on Shakespeare with PyTorch FSDP2, its gradient rounds run by ACCO.

One process per data-parallel rank. The model is sharded with ``fully_shard``;
:func:`ds_acco.fsdp.acco_fully_shard` moves gradient communication out of the
backward pass into background rounds. The config is a DeepSpeed-style JSON file
(``ds_configs/fsdp_acco.json``) whose ``"acco"`` block says ``"backend": "fsdp"``;
``"enabled": false`` in that block trains with stock FSDP2 instead. The loop is
the plain one, once per micro-batch::

    loss = model(**batch).loss; loss.backward(); acco.after_micro_batch()

Launch (from the repository root):

    # 2 processes with torchrun (gloo on CPU, NCCL with one GPU per process)
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m examples.train_lm_fsdp \
        --config ds_configs/fsdp_acco.json --steps 50
    launchers/fsdp_torchrun.sh -n 2 ds_configs/fsdp_acco.json --steps 50          # same thing

    # one process, no launcher
    python -m examples.train_lm_fsdp --config ds_configs/fsdp_acco.json --steps 20

    # checkpoint every 20 steps with torch.distributed.checkpoint, then resume (also on another
    # number of ranks: model and optimizer reshard, ACCO's rounds start afresh)
    launchers/fsdp_torchrun.sh -n 2 ds_configs/fsdp_acco.json --steps 40 --save-dir runs/fsdp --save-every 20
    launchers/fsdp_torchrun.sh -n 2 ds_configs/fsdp_acco.json --steps 80 --save-dir runs/fsdp --resume

Data are a pure function of (rank, micro-batch index, seed), so a resumed run sees the
micro-batches an uninterrupted one would. The run ends when ``acco.commits >= --steps`` (or, with
``--max-tokens``, at the step whose committed tokens reach it: the benchmark's budget, equal data for
configs whose steps hold different numbers of micro-batches); rank 0 then prints one line::

    [train_lm_fsdp] done: steps 51 | ranks 2 | final train loss 2.93 | val loss 2.98 | tokens/s 5123 | comm hidden 97.4%

``comm hidden`` is the share of round time the training thread did not wait for
(``n/a`` for stock FSDP2). ``steps`` can exceed ``--steps`` by one: in acco mode the
final ``finish()`` commits the estimate that was in flight.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

if __package__ in (None, ""):  # run as a file: import the package, not its siblings
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

MODEL_SIZES = ("tiny", "small", "medium")  # = examples.models.SIZES
LATEST = "latest"  # file in --save-dir naming the newest checkpoint folder


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True,
                   help="DeepSpeed-style JSON with an \"acco\" block, e.g. ds_configs/fsdp_acco.json")
    p.add_argument("--model-size", default="tiny", choices=MODEL_SIZES)
    p.add_argument("--seq-len", type=int, default=None, help="tokens per window (default: the size's context)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps (commits) to reach")
    p.add_argument("--eval-batches", type=int, default=8, help="validation micro-batches at the end (split over ranks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-dir", default=None, help="checkpoint folder (torch.distributed.checkpoint)")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: only at the end)")
    p.add_argument("--resume", action="store_true", help="load the newest checkpoint in --save-dir, if any")
    p.add_argument("--log-every", type=int, default=10, help="rank 0 prints the loss every N steps")
    p.add_argument("--eval-every", type=int, default=0, help="validation loss every N steps (0: only at the end)")
    p.add_argument("--max-tokens", type=int, default=0,
                   help="also stop after the optimizer step at which the committed tokens (all ranks) reach this "
                        "many (0: at --steps); the adaptive policy commits more micro-batches per step, so a token "
                        "budget is the same data for every config")
    p.add_argument("--eval-every-tokens", type=int, default=0,
                   help="validate after the first optimizer step past every multiple of this many committed tokens")
    p.add_argument("--stock", action="store_true",
                   help="train with stock FSDP2 (as \"enabled\": false in the acco block): same model, data, optimizer")
    p.add_argument("--shard-blocks", action="store_true",
                   help="fully_shard every transformer block, then the root (FSDP2's usual wrapping): one "
                        "all-gather / reduce-scatter unit per block; default: the whole model is one unit")
    p.add_argument("--reshard-after-forward", action="store_true",
                   help="the blocks' fully_shard(reshard_after_forward=True) (FSDP2's default; only stock FSDP2 "
                        "all-gathers again in backward: ACCO holds the model unsharded)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="pack consecutive fully_shard units into one round collective up to this many MiB "
                        "(default: ds_acco.fsdp's 25; 0: one reduce-scatter and all-gather per unit)")
    p.add_argument("--compute-delay-ms", type=float, default=0.0,
                   help="sleep per micro-batch, standing in for a slower accelerator's forward/backward")
    p.add_argument("--metrics-out", default=None,
                   help="folder for per-rank timing, interface bytes and collective counts (examples.run_record)")
    p.add_argument("--distributed-port", type=int, default=int(os.environ.get("MASTER_PORT", 29500)),
                   help="rendezvous port when ranks come from mpiexec (default: $MASTER_PORT or 29500)")
    args = p.parse_args(argv)
    if not os.path.isfile(args.config):
        p.error(f"--config: no such file: {args.config}")
    if args.steps < 1 or min(args.save_every, args.eval_every, args.compute_delay_ms, args.max_tokens,
                             args.eval_every_tokens) < 0 or (args.seq_len is not None and args.seq_len < 2):
        p.error("--steps must be >= 1, --save-every, --eval-every, --max-tokens, --eval-every-tokens and "
                "--compute-delay-ms >= 0, --seq-len >= 2")
    if (args.save_every or args.resume) and not args.save_dir:
        p.error("--save-every and --resume need --save-dir")
    return args


def _init_distributed(distributed_port: int = 29500):
    """torchrun's environment, or a world of one on a free port; returns the device."""
    import torch
    import torch.distributed as dist

    mpi_launched = any(v in os.environ for v in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"))
    if "RANK" not in os.environ and mpi_launched:
        # mpiexec sets only its own variables: map them to RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*
        # with DeepSpeed's mpi4py discovery (the same code its launcher path uses).
        from deepspeed.comm.comm import mpi_discovery

        mpi_discovery(distributed_port=distributed_port, verbose=False)
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device


def _token_counter(acco, tokens_per_step: int, needed: bool):
    """Committed tokens (all ranks) as the learning-rate schedule counts them: its nominal steps (one per commit,
    or under the adaptive policy the committed micro-batches over G x world: ds_acco.optim.lr_schedule), read from
    the swap's telemetry record, which the training thread writes, so every rank reads the same number."""
    if needed and acco.telemetry is not None and not acco.config.telemetry.enabled:
        raise SystemExit("--max-tokens and --eval-every-tokens read the round telemetry: acco.telemetry.enabled "
                         "must not be false")
    if acco.telemetry is None:  # stock FSDP2: a step is G micro-batches on every rank
        return lambda: acco.commits * tokens_per_step
    return lambda: acco.telemetry.nominal_steps * tokens_per_step


def main(argv=None) -> int:
    args = parse_args(argv)

    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ds_acco.fsdp import acco_fully_shard, load_job_config
    from examples.models import SIZES, build_gpt, count_parameters
    from examples.shakespeare import micro_batch, validation_batches
    from examples.train_metrics import (StepMeter, all_gather_ints, all_reduce_max, all_reduce_sum,
                                        distributed_validation_loss)

    job = load_job_config(args.config)  # a wrong config fails before any process group exists
    if args.stock:
        job.acco = dict(job.acco or {"backend": "fsdp"}, enabled=False)
    seq_len = args.seq_len or SIZES[args.model_size].n_positions
    device = _init_distributed(args.distributed_port)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    model = build_gpt(args.model_size, seq_len=seq_len, seed=args.seed).to(device)
    n_params = count_parameters(model)
    mesh = init_device_mesh(device.type, (world,))
    kwargs = job.acco_kwargs()
    if args.bucket_cap_mb is not None and not args.stock:
        kwargs["bucket_cap_mb"] = args.bucket_cap_mb
    recorder = None
    if args.metrics_out:
        from examples.run_record import RunRecorder

        recorder = RunRecorder(args.metrics_out, rank)  # before FSDP2 exists: it counts FSDP2's collectives too
    if args.shard_blocks:  # the caller shards; acco_fully_shard then takes the model as it is
        policy = kwargs.pop("mp_policy") or MixedPrecisionPolicy()
        for block in model.transformer.h:
            fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=args.reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
        acco = acco_fully_shard(model, **kwargs)
    else:
        acco = acco_fully_shard(model, mesh=mesh, **kwargs)
    micro_bs = job.micro_batch_size
    if rank == 0:
        what = "stock FSDP2" if acco.telemetry is None else f"acco mode={acco.config.mode} policy={acco.config.policy}"
        print(f"[train_lm_fsdp] {args.model_size} GPT ({n_params / 1e6:.2f}M params), {world} ranks, micro-batch "
              f"{micro_bs} x accum {job.gradient_accumulation_steps} x seq {seq_len}, {what}", flush=True)
        if job.ignored:
            print(f"[train_lm_fsdp] config keys only DeepSpeed reads, ignored: {', '.join(job.ignored)}", flush=True)

    def to_device(batch):
        return {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    # ---- resume: model, optimizer, scheduler and round state; the data stream restarts at this rank's cursor
    index = 0
    latest = os.path.join(args.save_dir, LATEST) if args.save_dir else None
    if args.resume and os.path.isfile(latest):
        with open(latest, encoding="utf-8") as f:
            path = os.path.join(args.save_dir, f.read().strip())
        extra = acco.load_checkpoint(path)
        cursors = extra["micro_batch_index"]
        index = cursors[rank] if len(cursors) == world else max(cursors)  # another world: fresh, unseen data
        if rank == 0:
            print(f"[train_lm_fsdp] resumed {path} at step {acco.commits}", flush=True)

    def save() -> None:
        name = f"step{acco.commits}"
        saved = acco.save_checkpoint(os.path.join(args.save_dir, name),
                                     extra={"micro_batch_index": all_gather_ints(index)})
        if saved and rank == 0:  # False: a failed save that on_save_error "continue" let training outlive
            with open(latest + ".tmp", "w", encoding="utf-8") as f:
                f.write(name)
            os.replace(latest + ".tmp", latest)

    def hidden() -> str:
        return "n/a" if acco.telemetry is None else f"{acco.telemetry.summary()['comm_hidden_pct']:.1f}%"

    val_batches = [to_device(b) for b in validation_batches(args.eval_batches, micro_bs, seq_len)]
    meter = StepMeter(micro_bs * seq_len, world)
    step = acco.commits
    committed_tokens = _token_counter(acco, micro_bs * seq_len * job.gradient_accumulation_steps * world,
                                      args.max_tokens or args.eval_every_tokens)
    next_eval_tokens = args.eval_every_tokens
    while acco.commits < args.steps and not (args.max_tokens and committed_tokens() >= args.max_tokens):
        loss = model(**to_device(micro_batch("train", rank, index, micro_bs, seq_len, args.seed))).loss
        loss.backward()
        if args.compute_delay_ms:
            time.sleep(args.compute_delay_ms / 1e3)
        acco.after_micro_batch()
        index += 1
        meter.add_micro_batch(loss)
        if acco.commits == step:
            continue
        step = acco.commits  # an optimizer step (commit) was applied
        step_loss = meter.end_step()
        if recorder is not None:
            recorder.step(step, index, meter.train_s, step_loss)
        by_tokens = bool(next_eval_tokens) and committed_tokens() >= next_eval_tokens
        while next_eval_tokens and committed_tokens() >= next_eval_tokens:
            next_eval_tokens += args.eval_every_tokens
        last_step = step >= args.steps or bool(args.max_tokens and committed_tokens() >= args.max_tokens)
        if (by_tokens or (args.eval_every and step % args.eval_every == 0)) and not last_step:
            with meter.pause():  # what the compute parameters give now (in acco: the latest estimate or commit)
                val = distributed_validation_loss(model, val_batches, rank, world, lockstep=True)
            if recorder is not None:
                recorder.eval(step, meter.train_s, val)
        if rank == 0 and args.log_every and step % args.log_every == 0:
            print(f"[train_lm_fsdp] step {step}: train loss {step_loss:.4f} | comm hidden {hidden()}", flush=True)
        if args.save_every and step % args.save_every == 0 and step < args.steps:
            with meter.pause():
                save()

    # ---- end of run: committed parameters, final numbers over all ranks (collectives)
    acco.finish()
    val_loss = distributed_validation_loss(model, val_batches, rank, world, lockstep=True)
    loss_sum, loss_count, tokens = all_reduce_sum(
        [sum(meter.last_step_losses), len(meter.last_step_losses), meter.local_tokens])
    train_s = all_reduce_max(meter.train_s)
    if args.save_dir:
        save()
    if rank == 0:
        print(f"[train_lm_fsdp] done: steps {acco.commits} | ranks {world} | final train loss "
              f"{loss_sum / max(loss_count, 1):.4f} | val loss {val_loss:.4f} | tokens/s {tokens / train_s:.0f} | "
              f"comm hidden {hidden()}", flush=True)
    if recorder is not None:
        recorder.eval(acco.commits, meter.train_s, val_loss)
        recorder.finish(acco, index, world)
    acco.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
