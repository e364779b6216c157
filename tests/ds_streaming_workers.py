"""DeepSpeed stage-0 engines running ``acco.mode: "streaming"`` on the tiny job (real DeepSpeed, gloo on CPU)."""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from tests import int8_workers as I
from tests import workloads as W

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "reduce_scatter", "all_to_all_single", "reduce", "barrier", "all_gather_object")


def ds_streaming_config(block: dict, *, G: int = 1, clip: float = 0.0, scheduler: bool = False,
                        acco_extra: dict | None = None) -> dict:
    """Stage 0 with the inner optimizer of tests/int8_workers.py (AdamW, lr INNER_LR)."""
    cfg = {
        "train_micro_batch_size_per_gpu": W.BATCH,
        "gradient_accumulation_steps": G,
        "gradient_clipping": clip,
        "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": I.INNER_LR, "torch_adam": True}},
        "steps_per_print": 10_000,
    }
    if scheduler:
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": I.INNER_LR,
                                                           "warmup_num_steps": 3, "warmup_type": "linear"}}
    if block is not None:
        cfg["acco"] = {"mode": "streaming", "streaming": dict(block), **(acco_extra or {})}
    return cfg


class _CollectiveCounter:
    """Counts torch.distributed collectives issued by the training thread (they still run)."""

    def __init__(self):
        self.calls: list[str] = []
        self.active = False
        self._saved = {}

    def __enter__(self):
        main = threading.current_thread()
        for name in COLLECTIVES:
            real = getattr(dist, name)
            self._saved[name] = real

            def counted(*a, _real=real, _name=name, **kw):
                if self.active and threading.current_thread() is main:
                    self.calls.append(_name)
                return _real(*a, **kw)

            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        for name, real in self._saved.items():
            setattr(dist, name, real)


def train_ds_streaming(rank, world, *, config, steps, save_at_step=None, ckpt_dir=None, resume=False,
                       count_collectives=False, use_ds_acco=True, consolidate=False):
    """Inner steps of the tiny job; the replica after each inner step (``model.parameters()`` order);
    ``out["warnings"]``: ds_acco's WARNING lines of the run."""
    import deepspeed

    import ds_acco
    from tests.log_capture import ds_acco_lines

    with ds_acco_lines() as lines:
        out = _train_ds_streaming(deepspeed, ds_acco, rank, config, steps, save_at_step, ckpt_dir, resume,
                                  count_collectives, use_ds_acco, consolidate)
    return dict(out, warnings=lines)


def _train_ds_streaming(deepspeed, ds_acco, rank, config, steps, save_at_step, ckpt_dir, resume, count_collectives,
                        use_ds_acco, consolidate):
    torch.manual_seed(rank)
    model = W.make_model(seed=rank)  # replicas start different: rank 0's θ_0 must reach every rank
    init = ds_acco.initialize if use_ds_acco else deepspeed.initialize
    engine, _, _, _ = init(model=model, model_parameters=model.parameters(), config=config)
    G = engine.gradient_accumulation_steps()
    trajectory, k, out = [], 0, {}
    if resume:
        _, client = engine.load_checkpoint(ckpt_dir)
        k, trajectory = client["k"], list(client["trajectory"])
        out["loaded_steps"] = engine.global_steps
        out["loaded_global"] = global_state(engine.acco)
        out["loaded_replica"] = [p.detach().clone() for p in engine.module.parameters()]
    counter = _CollectiveCounter()
    with counter:
        while engine.global_steps < steps:
            if save_at_step is not None and engine.global_steps == save_at_step and k % G == 0:
                out["in_flight_at_save"] = bool(getattr(engine.acco, "in_flight", False))
                engine.save_checkpoint(ckpt_dir, client_state={"k": k, "trajectory": trajectory})
                out["saved_global"] = global_state(engine.acco)
                break
            x, y = W.batch(rank, k)
            k += 1
            counter.active = count_collectives
            engine.backward(W.loss_fn(engine(x), y))
            before = engine.global_steps
            engine.step()
            counter.active = False
            if engine.global_steps > before:
                trajectory.append([p.detach().clone() for p in engine.module.parameters()])
    if consolidate:
        engine.consolidate()
        out["consolidated"] = [p.detach().clone() for p in engine.module.parameters()]
        out["global_after"] = global_state(engine.acco)
    out.update(trajectory=trajectory, collectives=list(counter.calls), global_steps=engine.global_steps,
               lr=engine.get_lr()[0])
    acco = getattr(engine, "acco", None)
    if acco is not None:
        index = {id(p): i for i, p in enumerate(engine.module.parameters())}
        out["fragments"] = [[index[id(p)] for p in f.params] for f in acco.fragments]
        out["records"] = [(r.step, r.fragment, r.applied_step, r.bytes_sent) for r in acco.telemetry.records]
        out["summary"] = acco.summary()
    engine.destroy()
    return out


def global_state(streaming) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per fragment: the full θ_g and outer momentum, gathered from every rank's shard."""
    out = []
    for frag in streaming.fragments:
        n, world = frag.layout.numel, streaming.world_size
        parts = []
        for shard in (frag.master.detach(), frag.outer.state.get(frag.master, {}).get("momentum_buffer")):
            if shard is None:
                parts.append(None)
                continue
            full = torch.empty(shard.numel() * world, dtype=shard.dtype)
            dist.all_gather_into_tensor(full, shard.contiguous())
            parts.append(full[:n].clone())
        out.append(tuple(parts))
    return out
