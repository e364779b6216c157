"""Train the GPT of examples/train_lm.py with torchft's DiLoCo or Streaming DiLoCo: the external peer.

A user with a slow link who does not pick ds_acco would pick torchft (``pip install torchft``;
it runs on gloo). This script trains what ``examples.train_lm`` trains, on the same data, so the
benchmark can compare the two on the same emulated links:

* the model of ``examples/models.py`` (same sizes and seed), rank ``r``'s micro-batch ``i`` is
  ``examples.shakespeare.micro_batch("train", r, i, ...)``, ``G`` micro-batches an inner step;
* the inner optimizer, learning-rate schedule and clipping of the DeepSpeed config given with
  ``--config`` (``optimizer``, ``scheduler`` built with DeepSpeed's own scheduler class,
  ``gradient_clipping``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``);
* its ``"torchft"`` block: the algorithm's settings (``benchmarks.sweep.configs.make_torchft_config``
  writes them, ``settings.json`` in ``--metrics-out`` says where each comes from).

Every process is a torchft replica group of one (one per emulated host): its own TCPStore and
torchft Manager, ``ProcessGroupGloo`` between the groups, the lighthouse in rank 0's process.
A plain gloo process group over the same ranks (``MASTER_ADDR``/``MASTER_PORT``) serves only the
validation loss and the final sums, off the training clock, exactly as in train_lm.

    python launchers/local_cluster.py --hosts 2 --rate 25mbit -- python -m examples.train_lm_torchft \\
        --config run/config.json --steps 100 --log-jsonl run/train.jsonl --metrics-out run
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m examples.train_lm_torchft --config cfg.json
    # as the benchmark runs it: the config written, one launch per run, the run folder parsed into a row
    python -m benchmarks run --sweep full --only time_to_loss --rates 25mbit \
        --configs torchft_diloco,torchft_streaming_diloco --out /tmp/peer

Rank 0 writes train_lm's per-step JSONL (``--log-jsonl``) and its summary line; every rank writes
``torchft_rank<r>.json`` (per-step wall clock, interface bytes, outer syncs and their payload).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import time

if __package__ in (None, ""):  # run as a file: import the package, not its siblings
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

from examples.train_lm import MODEL_SIZES, _delays, _int_at_least  # noqa: E402 - argparse helpers only, no torch

ALGORITHMS = ("diloco", "streaming_diloco")


def _torchft_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchft")
    except PackageNotFoundError:
        return "not installed"


TORCHFT_VERSION = _torchft_version()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="DeepSpeed JSON with a \"torchft\" block")
    p.add_argument("--model-size", default="tiny", choices=MODEL_SIZES)
    p.add_argument("--seq-len", type=_int_at_least(2), default=None, help="default: the size's context length")
    p.add_argument("--steps", type=_int_at_least(1), default=100, help="inner optimizer steps")
    p.add_argument("--eval-every", type=_int_at_least(0), default=50, help="validation every N steps (0: at the end)")
    p.add_argument("--max-tokens", type=_int_at_least(0), default=0,
                   help="also stop after the step at which the tokens of every replica reach this (0: off)")
    p.add_argument("--eval-every-tokens", type=_int_at_least(0), default=0,
                   help="validate after the first step past every multiple of this many tokens (0: off)")
    p.add_argument("--eval-batches", type=_int_at_least(1), default=8,
                   help="validation micro-batches (split over ranks)")
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    p.add_argument("--compute-delay-ms", type=_delays, default=[0.0],
                   help="sleep per micro-batch; a list '0,20' gives rank r the (r mod len)-th value")
    p.add_argument("--log-jsonl", default=None, help="per-step metrics of rank 0 (train_lm's format)")
    p.add_argument("--metrics-out", default=None, help="folder for torchft_rank<r>.json and settings.json")
    p.add_argument("--no-progress", action="store_true", help="accepted for train_lm's command lines; no bar here")
    args = p.parse_args(argv)
    if not os.path.isfile(args.config):
        p.error(f"--config: no such file: {args.config}")
    with open(args.config, encoding="utf-8") as f:
        args.job = json.load(f)
    block = args.job.get("torchft")
    if not isinstance(block, dict) or block.get("algorithm") not in ALGORITHMS:
        p.error(f"--config: needs a \"torchft\" block with \"algorithm\" one of {', '.join(ALGORITHMS)}")
    return args


def _own_address(master: str) -> str:
    """The address the other hosts reach this one at: the source address of a route to the master."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, 9))  # no packet is sent
        return s.getsockname()[0]


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next((int(line.split()[1]) for line in f if line.startswith(field + ":")), -1)


def inner_optimizer(job: dict, params):
    """DeepSpeed's optimizer for the config's ``optimizer`` block with ``torch_adam`` (Adam in AdamW mode unless
    ``adam_w_mode`` is false, as DeepSpeed decides)."""
    import torch

    spec = job.get("optimizer") or {}
    kind = spec.get("type", "")
    kw = {k: v for k, v in (spec.get("params") or {}).items() if k not in ("torch_adam", "adam_w_mode")}
    if "betas" in kw:
        kw["betas"] = tuple(kw["betas"])
    if kind.lower() == "adamw" or (kind.lower() == "adam" and (spec.get("params") or {}).get("adam_w_mode", True)):
        return torch.optim.AdamW(params, **kw)
    if kind.lower() == "adam":
        return torch.optim.Adam(params, **kw)
    raise SystemExit(f"[train_lm_torchft] optimizer: got {kind!r}; allowed: Adam, AdamW")


def lr_scheduler(job: dict, optimizer):
    """The config's ``scheduler``, built as DeepSpeed's engine builds it (its class, stepped after each step)."""
    spec = job.get("scheduler")
    if not spec:
        return None
    import torch
    from deepspeed.runtime import lr_schedules

    kind = getattr(lr_schedules, spec["type"], None) or getattr(torch.optim.lr_scheduler, spec["type"])
    return kind(optimizer, **spec.get("params", {}))


def gpt_fragments(model, fragments: int) -> list:
    """The model's blocks cut into ``fragments`` runs of consecutive blocks, embeddings with the first and the
    final norm with the last: ds_acco's default split (ds_acco.layout.fragments; a test checks they agree)."""
    from torch import nn

    blocks = list(model.transformer.h)
    cuts = [len(blocks) * i // fragments for i in range(fragments + 1)]
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    first = True
    before, after = [], []
    for p in model.parameters():  # registration order, the tied head once
        if id(p) in in_blocks:
            first = False
        elif p.requires_grad:
            (before if first else after).append(p)
    groups = [[p for b in blocks[a:b] for p in b.parameters()] for a, b in zip(cuts, cuts[1:])]
    groups[0] = before + groups[0]
    groups[-1] = groups[-1] + after
    return [nn.ParameterList(g) for g in groups]  # the same Parameter objects, as modules torchft can walk


class SyncCounter:
    """Counts what the outer syncs put on the wire: torchft's ``Manager.allreduce`` calls and their bytes."""

    def __init__(self, manager):
        self.calls, self.bytes = 0, 0
        self._allreduce = manager.allreduce
        manager.allreduce = self

    def __call__(self, tensor, *args, **kwargs):
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()
        return self._allreduce(tensor, *args, **kwargs)


def start_torchft(rank: int, world: int, block: dict, model, inner):
    """This rank's replica group (store, Manager on ProcessGroupGloo) and, on rank 0, the lighthouse.

    The model and inner optimizer are what a replica that falls behind would heal from, as torchft asks of every
    job; these runs start alike (``init_sync=False``: the same seed) and lose no replica, so none heals."""
    from datetime import timedelta

    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo
    from torchft.coordination import LighthouseServer

    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    me = _own_address(master)
    lighthouse = None
    addr = [None]
    if rank == 0:
        lighthouse = LighthouseServer(bind="[::]:0", min_replicas=world, join_timeout_ms=block["join_timeout_ms"],
                                      quorum_tick_ms=block["quorum_tick_ms"])
        addr = [f"http://{master}:{lighthouse.address().rsplit(':', 1)[1]}"]
    dist.broadcast_object_list(addr, src=0)
    store = dist.TCPStore(me, 0, is_master=True, wait_for_workers=False)  # this replica group's own store
    timeout = timedelta(seconds=block["timeout_s"])
    def load(state: dict) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=load,
                      state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
                      min_replica_size=world, use_async_quorum=False, timeout=timeout,
                      quorum_timeout=timedelta(seconds=block["quorum_timeout_s"]), connect_timeout=timeout,
                      rank=0, world_size=1, store_addr=me, store_port=store.port, lighthouse_addr=addr[0],
                      replica_id=f"train_lm_torchft_{rank}", hostname=me, init_sync=False)
    return manager, lighthouse, store


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()

    os.environ.setdefault("RUST_LOG", "warn")  # torchft's lighthouse and managers log every quorum at info
    import torch
    import torch.distributed as dist
    from torchft.local_sgd import DiLoCo

    from examples.models import SIZES, build_gpt, count_parameters
    from examples.run_record import iface_bytes
    from examples.shakespeare import micro_batch, validation_batches
    from examples.train_metrics import JsonlLog, StepMeter, all_reduce_max, all_reduce_sum, distributed_validation_loss

    t_imported = time.time()
    job, block = args.job, args.job["torchft"]
    seq_len = args.seq_len or SIZES[args.model_size].n_positions
    own_group = not dist.is_initialized()
    if own_group:
        if "RANK" not in os.environ:
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = build_gpt(args.model_size, seq_len=seq_len, seed=args.seed)
    micro_bs, accum = int(job["train_micro_batch_size_per_gpu"]), int(job["gradient_accumulation_steps"])
    clip = float(job.get("gradient_clipping") or 0.0)
    inner = inner_optimizer(job, model.parameters())
    scheduler = lr_scheduler(job, inner)
    fragments = gpt_fragments(model, block["fragments"])
    outer_spec = dict(block["outer_optimizer"])
    if outer_spec.pop("type") != "SGD":
        raise SystemExit("[train_lm_torchft] outer_optimizer: only SGD (torchft's documented choice)")
    outer = [torch.optim.SGD(f.parameters(), **outer_spec) for f in fragments]
    delay_s = args.compute_delay_ms[rank % len(args.compute_delay_ms)] / 1e3
    val_batches = validation_batches(args.eval_batches, micro_bs, seq_len)
    tokens_per_step = micro_bs * accum * seq_len * world
    iface = os.environ.get("DS_ACCO_CLUSTER_IFACE", "lo")
    if rank == 0:
        print(f"[train_lm_torchft] {args.model_size} GPT ({count_parameters(model) / 1e6:.2f}M params), {world} "
              f"replica groups, micro-batch {micro_bs} x accum {accum} x seq {seq_len}, torchft {TORCHFT_VERSION} "
              f"{block['algorithm']} H={block['sync_every']} fragments={block['fragments']} "
              f"delay={block['fragment_sync_delay']} alpha={block['fragment_update_alpha']}", flush=True)
        if args.metrics_out:
            _write_json(os.path.join(args.metrics_out, "settings.json"), settings(job, model, fragments))

    manager, lighthouse, store = start_torchft(rank, world, block, model, inner)
    counter = SyncCounter(manager)
    t_ready = time.time()
    baseline_kb = _status_kb("VmRSS")
    log = JsonlLog(args.log_jsonl, enabled=rank == 0)
    records: list[dict] = []
    evals: list[dict] = []
    step = index = 0
    next_eval = args.eval_every_tokens
    with DiLoCo(manager, fragments, inner, outer, sync_every=block["sync_every"],
                fragment_sync_delay=block["fragment_sync_delay"],
                fragment_update_alpha=block["fragment_update_alpha"], use_bucketization=block["use_bucketization"],
                bucket_cap_mb=block["bucket_cap_mb"], should_quantize=block["should_quantize"]) as diloco:
        meter = StepMeter(micro_bs * seq_len, world)  # the clock starts with the loop, as train_lm's
        while step < args.steps and not (args.max_tokens and step * tokens_per_step >= args.max_tokens):
            for _ in range(accum):
                loss = model(**micro_batch("train", rank, index, micro_bs, seq_len, args.seed)).loss
                (loss / accum).backward()  # DeepSpeed scales by the accumulation steps the same way
                if delay_s:
                    time.sleep(delay_s)  # stands in for a slower accelerator's forward/backward
                index += 1
                meter.add_micro_batch(loss)
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)  # this replica's own norm
            t0 = time.perf_counter()
            inner.step()  # DiLoCo's hook: a fragment's pseudo-gradient all-reduce starts or ends here
            opt_s = time.perf_counter() - t0
            if scheduler is not None:
                scheduler.step()
            inner.zero_grad(set_to_none=True)
            step += 1
            step_loss = meter.end_step()
            tokens = step * tokens_per_step
            record = dict(step=step, loss=step_loss, lr=inner.param_groups[0]["lr"], micro_batches=accum,
                          micro_batch_index=index, tokens_per_s=meter.tokens_per_s_estimate(), train_s=meter.train_s,
                          comm_hidden_pct=None, tokens=tokens, outer_step=manager.current_step(), opt_s=opt_s)
            by_tokens = bool(next_eval) and tokens >= next_eval
            while next_eval and tokens >= next_eval:
                next_eval += args.eval_every_tokens
            last = step >= args.steps or bool(args.max_tokens and tokens >= args.max_tokens)
            if (by_tokens or (args.eval_every and step % args.eval_every == 0)) and not last:
                with meter.pause():  # every replica scores its own model, as train_lm's streaming ranks do
                    record["val_loss"] = distributed_validation_loss(model, val_batches, rank, world)
                    record["val_train_s"] = all_reduce_max(meter.train_s)
                evals.append({"step": step, "val_loss": record["val_loss"], "val_train_s": record["val_train_s"]})
            tx, rx = iface_bytes(iface)
            records.append({"t": time.time(), "step": step, "micro_batch_index": index, "train_s": record["train_s"],
                            "loss": step_loss, "tx_bytes": tx, "rx_bytes": rx, "opt_s": opt_s,
                            "outer_step": record["outer_step"], "sync_calls": counter.calls,
                            "sync_bytes": counter.bytes})
            log.write(**record)
        # a run that stops between a fragment's launch and its merge leaves that all-reduce in flight: let it end
        # on every replica before the processes go (torchft's own wait() waits only on an accelerator's stream)
        for work in [w for f in getattr(diloco, "_fragments", ()) for w in getattr(f, "_allreduce_work", ())]:
            work.wait()

    val_loss = distributed_validation_loss(model, val_batches, rank, world)
    digest = hashlib.sha1(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    loss_sum, loss_count, tokens = all_reduce_sum(
        [sum(meter.last_step_losses), len(meter.last_step_losses), meter.local_tokens])
    train_s = all_reduce_max(meter.train_s)
    train_loss = loss_sum / loss_count if loss_count else float("nan")
    synced = {"outer_syncs": manager.current_step(), "batches_committed": manager.batches_committed(),
              "allreduce_calls": counter.calls, "payload_bytes": counter.bytes}
    summary = dict(steps=step, ranks=world, final_train_loss=train_loss, val_loss=val_loss,
                   tokens_per_s=tokens / train_s if tokens else 0.0, comm_hidden_pct=None, tokens=int(tokens),
                   train_s=train_s, torchft=synced)
    if rank == 0:
        log.write(event="summary", **summary)
        print(f"[train_lm_torchft] done: steps {step} | ranks {world} | final train loss {train_loss:.4f} | val loss "
              f"{val_loss:.4f} | tokens/s {summary['tokens_per_s']:.0f} | outer syncs {synced['outer_syncs']}",
              flush=True)
    log.close()
    if args.metrics_out:
        _write_json(os.path.join(args.metrics_out, f"torchft_rank{rank}.json"), {
            "rank": rank, "host": os.environ.get("DS_ACCO_CLUSTER_HOST"), "iface": iface, "steps": records,
            "evals": evals, "summary": summary, "baseline_rss_kb": baseline_kb, "peak_rss_kb": _status_kb("VmHWM"),
            "params_sha1": digest, "import_s": t_imported - t_start, "setup_s": t_ready - t_imported,
            "run_s": time.time() - t_start})
    dist.barrier()  # every replica is done with the lighthouse before it goes
    manager.shutdown(wait=False)
    if lighthouse is not None:
        lighthouse.shutdown()
    del store
    if own_group:
        dist.destroy_process_group()
    return 0


def settings(job: dict, model, fragments: list) -> dict:
    """What the run used and where each setting comes from (the docs cite this file)."""
    block = job["torchft"]
    return {"torchft_version": TORCHFT_VERSION, "torchft": block, "inner_optimizer": job.get("optimizer"),
            "scheduler": job.get("scheduler"), "gradient_clipping": job.get("gradient_clipping"),
            "micro_batch": job["train_micro_batch_size_per_gpu"], "grad_accum": job["gradient_accumulation_steps"],
            "params": sum(p.numel() for p in model.parameters()),
            "fragment_params": [sum(p.numel() for p in f.parameters()) for f in fragments],
            "replica_groups": "one per host (one process each), ProcessGroupGloo, lighthouse in rank 0's process"}


def _write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
