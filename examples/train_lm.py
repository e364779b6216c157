"""Train a GPT-2-style byte-level LM on Shakespeare with DeepSpeed ZeRO-1, optionally with ACCO.

One process per data-parallel rank. The ``"acco"`` block of the DeepSpeed config
decides whether gradient communication runs in the background (ACCO / DPU) or
the engine is stock DeepSpeed (no block, or ``"enabled": false``). The loop is the
usual DeepSpeed one, once per micro-batch::

    loss = engine(**batch).loss; engine.backward(loss); engine.step()

Launch (from the repository root; every launcher forwards extra args to this script):

    # one process, no launcher
    python -m examples.train_lm --deepspeed_config ds_configs/zero1_baseline.json --steps 50

    # 2 processes with the DeepSpeed launcher (the CPU "accelerator" needs --num_gpus)
    OMP_NUM_THREADS=1 deepspeed --num_gpus 2 --master_port 29500 examples/train_lm.py \
        --deepspeed --deepspeed_config ds_configs/acco_fixed.json --steps 50
    launchers/deepspeed_local.sh -n 2 ds_configs/acco_fixed.json --steps 50          # same thing

    # 2 processes with torchrun
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m examples.train_lm \
        --deepspeed_config ds_configs/acco_adaptive.json --steps 50
    launchers/torchrun.sh -n 2 ds_configs/acco_adaptive.json --steps 50

    # 2 processes with MPI (DeepSpeed finds ranks through mpi4py)
    OMP_NUM_THREADS=1 mpiexec -n 2 python -m examples.train_lm \
        --deepspeed_config ds_configs/dpu.json --steps 50
    launchers/mpirun.sh -n 2 ds_configs/dpu.json --steps 50

    # mixed hardware: rank 1 is 3x slower per micro-batch; the adaptive policy lets rank 0
    # contribute more micro-batches instead of waiting
    launchers/torchrun.sh -n 2 ds_configs/acco_adaptive.json --compute-delay-ms 10,30

    # checkpoint every 20 steps, then resume where the data stream left off
    launchers/torchrun.sh -n 2 ds_configs/acco_fixed.json --steps 40 --save-dir runs/ck --save-every 20
    launchers/torchrun.sh -n 2 ds_configs/acco_fixed.json --steps 80 --save-dir runs/ck --resume

Micro-batch size and gradient accumulation come from the config
(``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``); the global batch
is their product times the number of ranks. Data are a pure function of
(rank, micro-batch index, seed), so a resumed run sees exactly the micro-batches an
uninterrupted one would. The run ends when ``engine.global_steps >= --steps``; rank 0
then prints one line::

    [train_lm] done: steps 40 | ranks 2 | final train loss 2.9311 | val loss 2.9876 | tokens/s 51234 | comm hidden 97.4%

``final train loss`` is the mean over the last optimizer step's micro-batches on all
ranks; ``tokens/s`` counts input tokens of every rank over training time (evaluation
and checkpointing excluded); ``comm hidden`` is ``n/a`` for a stock DeepSpeed engine.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time

if __package__ in (None, ""):  # run as a file by a launcher: import the package, not its siblings
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

# DeepSpeed (torch with it), the model, data and metrics modules are imported in main(), after the
# arguments are parsed: they take seconds to import on every rank, and a typo should fail at once.
MODEL_SIZES = ("tiny", "small", "medium")  # = examples.models.SIZES (a test checks)

CLIENT_KEY = "train_lm"  # our entry in the checkpoint's client_state


# --------------------------------------------------------------------------- arguments


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _delays(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds such as 5 or 0,20; got {text!r}") from None
    if any(v < 0 or not math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"delays must be finite and >= 0, got {text!r}")
    return values


def _window(text: str) -> tuple[int, int]:
    from examples.step_profile import parse_window

    try:
        return parse_window(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_deepspeed_arguments(p: argparse.ArgumentParser) -> None:
    """``deepspeed.add_config_arguments``, written out so that parsing imports neither DeepSpeed nor torch (a test
    compares the two)."""
    group = p.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true",
                       help="Deprecated enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)")
    group.add_argument("--deepscale_config", default=None, type=str,
                       help="Deprecated DeepSpeed json configuration file.")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Launch examples are in the module docstring "
               "(python -c 'import examples.train_lm as m; print(m.__doc__)').",
    )
    p.add_argument("--model-size", default="tiny", choices=MODEL_SIZES, help="see examples/models.py")
    p.add_argument("--seq-len", type=_int_at_least(2), default=None,
                   help="tokens per window (default: the model size's context length)")
    p.add_argument("--steps", type=_int_at_least(1), default=100, help="optimizer steps to reach")
    p.add_argument("--eval-every", type=_int_at_least(0), default=50,
                   help="validation loss every N optimizer steps (0: only at the end)")
    p.add_argument("--max-tokens", type=_int_at_least(0), default=0,
                   help="also stop after the optimizer step at which the committed tokens (all ranks) reach this "
                        "(0: off); under the adaptive policy a commit holds more tokens than a nominal step, so a "
                        "token budget compares runs at equal data")
    p.add_argument("--eval-every-tokens", type=_int_at_least(0), default=0,
                   help="validate after the first optimizer step past every multiple of this many committed "
                        "tokens (0: off; beside --eval-every)")
    p.add_argument("--eval-batches", type=_int_at_least(1), default=8,
                   help="validation micro-batches (split over ranks)")
    p.add_argument("--seed", type=_int_at_least(0), default=0, help="model init and data stream seed")
    p.add_argument("--save-dir", default=None, help="DeepSpeed checkpoint folder")
    p.add_argument("--save-every", type=_int_at_least(0), default=0,
                   help="checkpoint every N optimizer steps (0: only at the end); needs --save-dir")
    p.add_argument("--resume", action="store_true",
                   help="load the latest checkpoint in --save-dir (start fresh if there is none)")
    p.add_argument("--log-jsonl", default=None, help="append per-step metrics (rank 0) to this file")
    p.add_argument("--compute-delay-ms", type=_delays, default=[0.0],
                   help="sleep per micro-batch to emulate slower hardware; a list '0,20' gives rank r "
                        "the (r mod len)-th value")
    p.add_argument("--distributed-port", type=_int_at_least(1), default=int(os.environ.get("MASTER_PORT", 29500)),
                   help="rendezvous port when ranks come from MPI (default: $MASTER_PORT or 29500)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None,
                   help="set by the deepspeed launcher; the value in $LOCAL_RANK wins")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument("--profile-steps", type=_window, default=None, metavar="A:B",
                   help="torch profile of optimizer steps A+1 to B, every thread (examples/step_profile.py)")
    p.add_argument("--profile-out", default="profile", help="trace path without .json.gz (rank r > 0 adds .rank<r>)")
    add_deepspeed_arguments(p)  # --deepspeed, --deepspeed_config
    args = p.parse_args(argv)
    if not args.deepspeed_config:
        p.error("--deepspeed_config PATH is required (see ds_configs/)")
    if not os.path.isfile(args.deepspeed_config):
        p.error(f"--deepspeed_config: no such file: {args.deepspeed_config}")
    if (args.save_every or args.resume) and not args.save_dir:
        p.error("--save-every and --resume need --save-dir")
    if args.profile_steps and args.profile_steps[1] > args.steps:
        p.error(f"--profile-steps: the window ends at step {args.profile_steps[1]}, after --steps {args.steps}")
    return args


def _single_process_env() -> None:
    """``python -m examples.train_lm`` with no launcher: a world of one on a free port.

    Without this DeepSpeed would fall back to MPI discovery through mpi4py. Under mpiexec
    the PMI variables are set and DeepSpeed's own MPI discovery runs.
    """
    launcher_vars = ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK", "PMI_SIZE")
    if any(v in os.environ for v in launcher_vars):
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", str(port)))


# --------------------------------------------------------------------------- training


def main(argv=None) -> int:
    args = parse_args(argv)

    import torch
    from tqdm import tqdm

    import ds_acco
    from examples.models import SIZES, build_gpt, count_parameters
    from examples.shakespeare import micro_batch, validation_batches
    from examples.step_profile import StepProfile
    from examples.train_metrics import (JsonlLog, StepMeter, all_gather_ints, all_reduce_max, all_reduce_sum,
                                        comm_hidden_pct, distributed_validation_loss, format_pct)

    if args.seq_len is None:
        args.seq_len = SIZES[args.model_size].n_positions
    _single_process_env()
    torch.manual_seed(args.seed)

    model = build_gpt(args.model_size, seq_len=args.seq_len, seed=args.seed)
    # Same signature and return value as deepspeed.initialize; with no "acco" block it IS that. It creates the
    # process group too, waiting acco.timeout_s for every rank (a rank that died before start-up ends the job)
    engine, _, _, _ = ds_acco.initialize(args=args, model=model, model_parameters=model.parameters(),
                                         distributed_port=args.distributed_port)
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    micro_bs, grad_accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    delay_s = args.compute_delay_ms[rank % len(args.compute_delay_ms)] / 1e3
    val_batches = validation_batches(args.eval_batches, micro_bs, args.seq_len)

    # ---- resume: DeepSpeed restores weights, optimizer, scheduler and global_steps;
    # the data stream restarts at this rank's next micro-batch index.
    index = 0
    if args.resume:
        path, client = engine.load_checkpoint(args.save_dir)
        if path is None:
            if rank == 0:
                print(f"[train_lm] no checkpoint in {args.save_dir}; starting from scratch", flush=True)
        else:
            saved = (client or {}).get(CLIENT_KEY)
            if saved is None:
                raise SystemExit(f"[train_lm] checkpoint {path} has no '{CLIENT_KEY}' client state; "
                                 "it was not written by this script")
            if saved["world_size"] != world:
                raise SystemExit(f"[train_lm] checkpoint {path} was written by {saved['world_size']} ranks; "
                                 f"this job has {world}. Resume with the same number of ranks.")
            index = saved["micro_batch_index"][rank]
            if rank == 0:
                print(f"[train_lm] resumed {path} at step {engine.global_steps}, micro-batch {index}", flush=True)

    def save() -> None:
        indices = all_gather_ints(index)  # ranks may differ under the adaptive policy
        engine.save_checkpoint(args.save_dir, client_state={
            CLIENT_KEY: {"micro_batch_index": indices, "world_size": world, "seed": args.seed}})

    def evaluate() -> float:
        return distributed_validation_loss(engine.module, val_batches, rank, world)

    if rank == 0:
        mode = _describe_mode(engine)
        print(f"[train_lm] {args.model_size} GPT ({count_parameters(model) / 1e6:.2f}M params), {world} ranks, "
              f"micro-batch {micro_bs} x accum {grad_accum} x seq {args.seq_len}, {mode}", flush=True)

    log = JsonlLog(args.log_jsonl, enabled=rank == 0)
    profile = StepProfile(args.profile_steps, args.profile_out, rank)
    meter = StepMeter(micro_bs * args.seq_len, world)
    bar = tqdm(total=args.steps, initial=min(engine.global_steps, args.steps), unit="step",
               disable=rank != 0 or args.no_progress, dynamic_ncols=True, file=sys.stderr)
    val_loss = float("nan")
    step = engine.global_steps

    def committed_tokens() -> int:
        # DeepSpeed's sample counter advances at each commit by the micro-batches every rank
        # contributed (all-gathered counts), so it is the same number on every rank
        return int(engine.global_samples) * args.seq_len

    next_eval_tokens = args.eval_every_tokens
    while engine.global_steps < args.steps and not (args.max_tokens and committed_tokens() >= args.max_tokens):
        batch = micro_batch("train", rank, index, micro_bs, args.seq_len, args.seed)
        loss = engine(**{k: v.to(engine.device, non_blocking=True) for k, v in batch.items()}).loss
        engine.backward(loss)
        if delay_s:
            time.sleep(delay_s)  # stands in for a slower accelerator's forward/backward
        engine.step()
        index += 1
        meter.add_micro_batch(loss)
        if engine.global_steps == step:
            continue

        # ---- an optimizer step (commit) happened
        step = engine.global_steps
        profile.after_step(step)
        step_loss = meter.end_step()
        hidden = comm_hidden_pct(engine)
        record = dict(step=step, loss=step_loss, lr=engine.get_lr()[0], micro_batches=len(meter.last_step_losses),
                      micro_batch_index=index, tokens_per_s=meter.tokens_per_s_estimate(),
                      train_s=meter.train_s, comm_hidden_pct=hidden, tokens=committed_tokens())
        last = engine.acco.telemetry.last() if getattr(engine, "acco", None) is not None else None
        if last is not None:
            record.update(round_kind=last.kind, round_counts=list(last.counts), round_s=last.round_s,
                          waited_s=last.waited_s, compute_s=last.compute_s)
        by_tokens = bool(next_eval_tokens) and committed_tokens() >= next_eval_tokens
        while next_eval_tokens and committed_tokens() >= next_eval_tokens:
            next_eval_tokens += args.eval_every_tokens
        last_step = step >= args.steps or bool(args.max_tokens and committed_tokens() >= args.max_tokens)
        if (by_tokens or (args.eval_every and step % args.eval_every == 0)) and not last_step:
            with meter.pause():
                val_loss = record["val_loss"] = evaluate()
                # the loss scored is every rank's model at this step, which exists once the slowest rank is here:
                # in streaming a faster rank runs ahead and waits in this collective, outside its training clock
                # (train_s stays rank 0's, one clock for the per-step curve)
                record["val_train_s"] = all_reduce_max(meter.train_s)
            if rank == 0:
                bar.write(f"[train_lm] step {step}: train loss {step_loss:.4f} | val loss {val_loss:.4f}")
        if args.save_every and step % args.save_every == 0 and not last_step:
            with meter.pause():
                save()
        log.write(**record)
        bar.set_postfix(loss=f"{step_loss:.3f}", tok_s=f"{record['tokens_per_s']:.0f}",
                        hidden=format_pct(hidden), refresh=False)
        bar.update(min(step, args.steps) - bar.n)
    bar.close()

    # ---- end of run: final numbers over all ranks (collectives: every rank gets here)
    val_loss = evaluate()
    loss_sum, loss_count, tokens = all_reduce_sum(
        [sum(meter.last_step_losses), len(meter.last_step_losses), meter.local_tokens])
    train_s = all_reduce_max(meter.train_s)
    train_loss = loss_sum / loss_count if loss_count else float("nan")
    tokens_per_s = tokens / train_s if tokens else 0.0
    hidden = comm_hidden_pct(engine)
    if args.save_dir:
        save()
    if rank == 0:
        summary = dict(steps=engine.global_steps, ranks=world, final_train_loss=train_loss, val_loss=val_loss,
                       tokens_per_s=tokens_per_s, comm_hidden_pct=hidden, tokens=int(tokens), train_s=train_s)
        if getattr(engine, "acco", None) is not None:
            summary["acco"] = engine.acco.telemetry.summary()
            summary["acco"]["bytes_sent_per_step"] = summary["acco"]["bytes_sent"] / max(engine.global_steps, 1)
        log.write(event="summary", **summary)
        print(f"[train_lm] done: steps {engine.global_steps} | ranks {world} | final train loss {train_loss:.4f} | "
              f"val loss {val_loss:.4f} | tokens/s {tokens_per_s:.0f} | comm hidden {format_pct(hidden)}",
              flush=True)
    log.close()
    torch.distributed.barrier()
    return 0


def _describe_mode(engine) -> str:
    acco = getattr(engine, "acco", None)
    if acco is None:
        return "stock DeepSpeed"
    c = acco.config
    if c.mode == "streaming":
        s = c.streaming
        return (f"acco mode=streaming fragments={s.fragments} sync_every={s.sync_every} "
                f"overlap_steps={s.overlap_steps} quantize={s.quantize}")
    return f"acco mode={c.mode} policy={c.policy}"


def _abort_mpi_peers(exc: BaseException) -> None:
    """Under mpiexec, a rank that dies must take the job down with it.

    torchrun and the deepspeed launcher kill the other ranks when one exits non-zero;
    MPICH's mpiexec does not while the dying rank sits in MPI_Finalize (mpi4py calls it at
    exit), so its peers would wait in their next collective until the 30-minute timeout.
    """
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return
    mpi = sys.modules.get("mpi4py.MPI")  # imported by DeepSpeed's MPI discovery, if at all
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() == 1:
        return
    import traceback

    # the cause in one line first: Abort ends every process at once, and mpiexec's forwarding of
    # output still in flight (a traceback's later lines) was seen to lose it on a loaded machine
    rank = mpi.COMM_WORLD.Get_rank()
    print(f"[train_lm] rank {rank} failed, aborting the MPI job: {type(exc).__name__}: {exc}", file=sys.stderr,
          flush=True)
    traceback.print_exception(exc)
    sys.stderr.flush()
    time.sleep(0.5)  # time for mpiexec to forward the traceback before Abort kills the job
    mpi.COMM_WORLD.Abort(1)


def cli(argv=None) -> int:
    """Entry point: :func:`main`, aborting an MPI job if this rank fails."""
    try:
        return main(argv)
    except BaseException as exc:
        _abort_mpi_peers(exc)
        raise


if __name__ == "__main__":
    sys.exit(cli())
