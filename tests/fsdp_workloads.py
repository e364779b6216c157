"""Worker functions for tests/test_fsdp.py: the tiny job of tests/workloads.py under FSDP2.

Each function runs on every rank of a gloo job started by ``run_distributed``.
Trajectories are the full (unsharded) parameters after every commit, in
``workloads.ordered_params`` order, so they compare directly with the reference.
Starting processes dominates the test time on a small machine, so one job runs
several scenarios in turn (each builds a fresh model, engine and process group).
"""

from __future__ import annotations

import time

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from tests import workloads as W

MODES = ("sync", "dpu", "acco")
RESUME = dict(config={"backend": "fsdp", "mode": "acco", "warmup_steps": 1}, G=4, clip=0.5, schedule=True)


def _full(model) -> list[torch.Tensor]:
    """Full parameters: the compute parameters while ACCO holds the model unsharded."""
    return [p.detach().float().clone() for p in W.ordered_params(model)]


def _full_sharded(model) -> list[torch.Tensor]:
    """Full parameters of a sharded FSDP2 model, gathered from its DTensors (collective)."""
    return [_gather(p).float() for p in W.ordered_params(model)]


def build(world, config, G, clip=0.0, schedule=False, mp_policy=None, nested=False, frozen=(), **kwargs):
    from ds_acco.fsdp import acco_fully_shard

    model = W.make_model()
    for name in frozen:
        model.get_parameter(name).requires_grad_(False)
    mesh = init_device_mesh("cpu", (world,))
    if nested:  # sharded by the caller: the first layer is its own FSDP2 group, the root holds the rest
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
        mesh = None
    acco = acco_fully_shard(
        model, mesh=mesh, mp_policy=mp_policy, acco_config=config, gradient_accumulation_steps=G,
        optimizer_kwargs=W.OPT_KWARGS, param_groups=W.param_groups, clip_grad_norm=clip,
        lr_scheduler=W.decay_schedule if schedule else None, **kwargs,
    )
    return model, acco


def train(rank, model, acco, steps, k=0, trajectory=None, save_at=None, ckpt=None, state_dict_every=0,
          slow_rank=None, slow_s=0.0):
    """Run micro-batches ``k, k+1, ...`` until ``steps`` commits, or until micro-batch ``save_at``:
    then checkpoint (with ``k`` and the trajectory so far) and stop. ``state_dict_every``: call
    ``model.state_dict()`` (which reshards FSDP2) every that many micro-batches."""
    trajectory = [] if trajectory is None else trajectory
    while acco.commits < steps:
        if save_at is not None and k == save_at:
            acco.save_checkpoint(ckpt, extra={"k": k, "trajectory": trajectory})
            return trajectory, k
        if state_dict_every and k % state_dict_every == 1:
            assert all(hasattr(v, "full_tensor") for v in model.state_dict().values())
        x, y = W.batch(rank, k)
        k += 1
        if rank == slow_rank:
            time.sleep(slow_s)
        W.loss_fn(model(x), y).backward()
        if acco.after_micro_batch() and acco.commits > len(trajectory):
            trajectory.append(_full(model))
    return trajectory, k


def _exports_with_commit_in_flight(rank, model, acco, k) -> dict:
    """Half a step more, so the estimate is swapped in and the next commit is in flight; then what
    ``committed_parameters()``, the compute parameters and ``model.state_dict()`` hold."""
    for k in range(k, k + acco.engine.G // 2):
        x, y = W.batch(rank, k)
        W.loss_fn(model(x), y).backward()
        acco.after_micro_batch()
    with acco.committed_parameters():
        committed = _full(model)
    compute = _full(model)
    names = {id(p): n for n, p in model.named_parameters()}
    keys = [names[id(p)] for p in W.ordered_params(model)]
    state = model.state_dict()  # reshards FSDP2: its sharded parameters, the master shards
    return {"committed": committed, "compute": compute, "state_dict": [_gather(state[n]).float() for n in keys]}


def _gather(t) -> torch.Tensor:
    """A DTensor's full value, detached (results cross a process boundary)."""
    return t.full_tensor().detach().clone()


def _masters_and_moments(acco) -> dict:
    masters = acco.engine.shard_optimizer.masters
    return {
        "masters": [_gather(p) for p in masters],
        "exp_avg": [_gather(acco.optimizer.state[p]["exp_avg"]) for p in masters],
        "exp_avg_sq": [_gather(acco.optimizer.state[p]["exp_avg_sq"]) for p in masters],
        "lr": acco.optimizer.param_groups[0]["lr"],
    }


def stock_fsdp(rank, world, G, steps, keep=False):
    """Plain FSDP2 gradient accumulation: no sync until the G-th backward, loss / G, AdamW step.
    ``keep``: also return the model and the optimizer."""
    model = W.make_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(W.param_groups(model), **W.OPT_KWARGS)
    trajectory, k = [], 0
    for _ in range(steps):
        for i in range(G):
            model.set_requires_gradient_sync(i == G - 1)
            x, y = W.batch(rank, k)
            k += 1
            (W.loss_fn(model(x), y) / G).backward()
        opt.step()
        opt.zero_grad()
        trajectory.append(_full_sharded(model))
    return (trajectory, model, opt) if keep else trajectory


def modes(rank, world, *, G, steps) -> dict:
    """sync, dpu and acco (fixed policy) with ACCO; stock FSDP2 + AdamW; ``"enabled": false``."""
    out = {}
    for mode in MODES:
        model, acco = build(world, {"backend": "fsdp", "mode": mode, "policy": "fixed"}, G)
        out[mode], _ = train(rank, model, acco, steps, state_dict_every=5 if mode == "acco" else 0)
        out[mode + "_kinds"] = [r.kind for r in acco.telemetry.records]
        out[mode + "_counts"] = [r.counts for r in acco.telemetry.records]
        out[mode + "_grads_bound"] = [p.grad is not None for p in W.ordered_params(model)]
        acco.close()  # drains the round in flight (a dpu round is always one), then hands back to FSDP2
        out[mode + "_closed"] = {"sharded": all(hasattr(p, "full_tensor") for p in model.parameters()),
                                 "params": _full_sharded(model)}
        W.loss_fn(model(W.batch(rank, 0)[0]), W.batch(rank, 0)[1]).backward()  # stock FSDP2 works again
    out["stock"] = stock_fsdp(rank, world, G, steps)
    model, stock = build(world, {"backend": "fsdp", "enabled": False}, G)
    out["disabled"] = []
    while stock.commits < steps:
        x, y = W.batch(rank, stock.micro_batches)
        W.loss_fn(model(x), y).backward()
        if stock.after_micro_batch():
            out["disabled"].append(_full_sharded(model))
    return out


def variants(rank, world, *, G, steps) -> dict:
    """acco on a model the caller sharded layer by layer; with bf16 compute and fp32 reduce; with the
    adaptive policy and a slow rank; with a frozen parameter."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    out = {}
    model, acco = build(world, {"backend": "fsdp", "mode": "acco"}, G, nested=True)
    out["nested"], k = train(rank, model, acco, steps)
    out["nested_groups"] = len(acco.fsdp.groups)
    out["exports"] = _exports_with_commit_in_flight(rank, model, acco, k)
    acco.close()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model, acco = build(world, {"backend": "fsdp", "mode": "acco"}, G, mp_policy=policy)
    out["bf16"], _ = train(rank, model, acco, steps)
    out["bf16_dtypes"] = {"compute": {str(p.dtype) for p in model.parameters()},
                          "master": {str(p.sharded.dtype) for p in acco.params},
                          "accumulator": str(acco.engine.grads.dtypes[0]),
                          "grads_bound": any(p.grad is not None for p in model.parameters())}
    acco.close()
    model, acco = build(world, {"backend": "fsdp", "mode": "acco", "policy": "adaptive"}, G)
    out["adaptive"], _ = train(rank, model, acco, 4, slow_rank=1, slow_s=0.03)
    acco.close()  # drains, so the counts of every round are recorded
    out["adaptive_counts"] = [r.counts for r in acco.telemetry.records]
    model, acco = build(world, {"backend": "fsdp", "mode": "acco"}, G, frozen=["0.bias"])
    before = _full(model)
    train(rank, model, acco, 3)
    out["frozen"] = {"groups": len(acco.engine.groups),
                     "changed": [not torch.equal(a, b) for a, b in zip(before, _full(model))]}
    acco.close()
    return out


COLLECTIVES = ("all_gather_small", "all_reduce_sum", "reduce_scatter_sum", "all_gather", "all_to_all")


def count_collectives(engine) -> dict:
    """Count the collectives the engine's rounds really issue, by name (each call still runs)."""
    calls = dict.fromkeys(COLLECTIVES, 0)
    for name in COLLECTIVES:
        real = getattr(engine.coll, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(engine.coll, name, counted)
    return calls


def collectives_per_round(rank, world, *, G) -> dict:
    """acco with clipping on a model sharded in two ``fully_shard`` units of two parameters each: one
    bucket per unit (``bucket_cap_mb=0``, FSDP2's own batching), and both units in one bucket (the default)."""
    out = {}
    for cap in (0, None):
        model, acco = build(world, {"backend": "fsdp", "mode": "acco"}, G, clip=0.5, nested=True,
                            **({} if cap is None else {"bucket_cap_mb": cap}))
        calls = count_collectives(acco.engine)
        train(rank, model, acco, 3)
        acco.close()
        out["per_unit" if cap == 0 else "default"] = {
            "calls": calls, "rounds": acco.telemetry.rounds, "units": len(acco.fsdp.groups),
            "buckets": len(acco.engine.groups), "params": len(acco.params), "wire_calls": acco.engine.coll.wire.calls,
            "wire_pieces": acco.engine.coll.wire.pieces,
            "rs_via_all_to_all": acco.engine.coll.reduce_scatter_via_all_to_all}
    return out


def _optimizer_values(opt) -> list[torch.Tensor]:
    """Local master shards and every optimizer state tensor, in a fixed order (views, not copies)."""
    out = []
    for p in opt.masters:
        out.append(p.to_local())
        for key in sorted(opt.optimizer.state[p]):
            value = opt.optimizer.state[p][key]
            out.append(value.to_local() if hasattr(value, "to_local") else value)
    return out


def local_adam_step(rank, world, *, G) -> dict:
    """The commit on the DTensors' local tensors (``ShardOptimizer.commit``'s functional step, see
    ds_acco/fsdp/shard_optimizer.py) against ``optimizer.step()`` on DTensor gradients, from the
    same state: single-tensor and foreach AdamW."""
    out = {}
    for foreach in (False, True):
        model, acco = build(world, {"backend": "fsdp", "mode": "sync"}, G, clip=0.5)
        for group in acco.optimizer.param_groups:
            group["foreach"] = foreach
        train(rank, model, acco, 2)
        opt = acco.engine.shard_optimizer
        gen = torch.Generator().manual_seed(rank)
        grads = [torch.randn(s.numel(), generator=gen) for s in (b.shard32 for b in acco.engine.buffers)]
        before = [t.clone() for t in _optimizer_values(opt)]
        opt.commit(grads)
        local = [t.clone() for t in _optimizer_values(opt)]
        with torch.no_grad():
            for t, b in zip(_optimizer_values(opt), before):
                t.copy_(b)
        opt._set_grads(grads)  # DTensor gradients
        opt.optimizer.step()
        opt._clear_grads()
        out[foreach] = {"functional": opt._functional.steps_in_place(opt.masters),
                        "equal": all(torch.equal(a, b) for a, b in zip(local, _optimizer_values(opt))),
                        "changed": sum(not torch.equal(a, b) for a, b in zip(local, before))}
        acco.close()
    return out

def lookahead_paths(rank, world, *, G) -> dict:
    """The functional lookahead on FSDP2's packed units against the snapshot lookahead.

    Before the first commit (no optimizer state; bias correction at step 1) and after two
    commits: the same gradients, published as a round publishes (the masters first, so
    padding after a local shard is the masters'), bit for bit; masters and moments untouched.
    sync mode, so no round is in flight while the test steps the shard optimizer itself.
    """
    from ds_acco.optim.adam_lookahead import local_flat

    model, acco = build(world, {"backend": "fsdp", "mode": "sync"}, G, nested=True)
    so, groups = acco.engine.shard_optimizer, acco.engine.groups
    gen = torch.Generator().manual_seed(100 + rank)
    out = {"functional": so.lookahead_is_functional, "equal": [], "untouched": [], "moved": []}
    for commits in (0, 2):
        train(rank, model, acco, commits)
        grads = [torch.randn(g.layout.shard_numel, generator=gen) for g in groups]
        masters = _packed_masters(groups)
        moments = [local_flat(v).clone() for s in so.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        published = {}
        for path in ("functional", "snapshot"):
            functional, so._functional = so._functional, (None if path == "snapshot" else so._functional)
            try:
                published[path] = _packed_masters(groups)
                so.lookahead(grads, published[path])
            finally:
                so._functional = functional
        out["equal"].append(all(torch.equal(a, b) for a, b in zip(published["functional"], published["snapshot"])))
        out["moved"].append(any(not torch.equal(a, b) for a, b in zip(published["functional"], masters)))
        after = [local_flat(v) for s in so.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        out["untouched"].append(all(torch.equal(a, b) for a, b in zip(masters, _packed_masters(groups)))
                                and all(torch.equal(a, b) for a, b in zip(moments, after)))
    acco.close()
    return out


def _packed_masters(groups) -> list[torch.Tensor]:
    """Each group's packed master shard, as a round publishes it before the lookahead."""
    outs = [torch.empty(g.layout.shard_numel) for g in groups]
    for g, o in zip(groups, outs):
        g.read_master(o)
    return outs


def resume_job(rank, world, *, steps, save_at=None, ckpt=None, resume=False) -> dict:
    """``RESUME``'s job: uninterrupted; or stopped at micro-batch ``save_at`` with a checkpoint; or resumed."""
    model, acco = build(world, RESUME["config"], RESUME["G"], RESUME["clip"], RESUME["schedule"])
    k, trajectory, saved = 0, [], None
    try:
        if resume:
            extra = acco.load_checkpoint(ckpt)
            k, trajectory = extra["k"], extra["trajectory"]
        trajectory, k = train(rank, model, acco, steps, k, trajectory, save_at, ckpt)
        if save_at is not None:
            saved = dict(_masters_and_moments(acco), commits=acco.commits, in_flight=acco.engine.in_flight)
    finally:
        acco.close()
    return {"trajectory": trajectory, "saved": saved}


def first_job(rank, world, *, G, steps, resume_steps, save_at, ckpt) -> dict:
    """Two ranks: every mode; the resume job uninterrupted, stopped with a checkpoint, and resumed.

    The resumed run shares nothing with the stopped one but the checkpoint: a new
    model, FSDP2 state, optimizer, scheduler, round engine and process group.
    """
    return {"modes": modes(rank, world, G=G, steps=steps),
            "variants": variants(rank, world, G=G, steps=steps),
            "collectives": collectives_per_round(rank, world, G=G),
            "local_adam": local_adam_step(rank, world, G=G),
            "lookahead": lookahead_paths(rank, world, G=G),
            "full": resume_job(rank, world, steps=resume_steps)["trajectory"],
            "saved": resume_job(rank, world, steps=resume_steps, save_at=save_at, ckpt=ckpt)["saved"],
            "resumed": resume_job(rank, world, steps=resume_steps, ckpt=ckpt, resume=True)["trajectory"]}


def resharded_load(rank, world, *, ckpt, more_steps) -> dict:
    """Load a checkpoint written by another world size; report what was loaded, then train on."""
    model, acco = build(world, RESUME["config"], RESUME["G"], RESUME["clip"], RESUME["schedule"])
    extra = acco.load_checkpoint(ckpt)
    compute = [p.unsharded.detach().clone() for p in acco.params]  # same order as the masters
    loaded = dict(_masters_and_moments(acco), commits=acco.commits, compute=compute, extra_k=extra["k"])
    train(rank, model, acco, acco.commits + more_steps, k=extra["k"])
    loaded["continued"] = acco.commits - loaded["commits"]
    loaded["hidden_pct"] = acco.telemetry.summary()["comm_hidden_pct"]
    acco.close()
    return loaded


def one_rank_job(rank, world, *, ckpt, ckpt2) -> dict:
    """One rank: ACCO loads the two-rank checkpoint; so does stock FSDP2 (``"enabled": false``),
    which trains a step and saves; ACCO loads that stock checkpoint."""
    out = {"resharded": resharded_load(rank, world, ckpt=ckpt, more_steps=2)}
    model, stock = build(world, dict(RESUME["config"], enabled=False), RESUME["G"], RESUME["clip"],
                         RESUME["schedule"])
    extra = stock.load_checkpoint(ckpt)
    out["stock_loaded"] = {"masters": [_gather(p) for p in stock.optimizer.param_groups[0]["params"]],
                           "commits": stock.commits}
    k = extra["k"]
    while stock.commits == out["stock_loaded"]["commits"]:
        x, y = W.batch(rank, k)
        k += 1
        W.loss_fn(model(x), y).backward()
        stock.after_micro_batch()
    stock.save_checkpoint(ckpt2, extra={"k": k})
    out["stock_saved"] = {"commits": stock.commits, "full": _full_sharded(model)}
    model, acco = build(world, RESUME["config"], RESUME["G"], RESUME["clip"], RESUME["schedule"])
    acco.load_checkpoint(ckpt2)
    out["acco_from_stock"] = {"commits": acco.commits, "full": _full(model)}
    acco.close()
    out["refused"] = refused(rank, world)
    return out


def refused(rank, world) -> dict:
    """The start-up errors of unsupported FSDP2 set-ups, by name."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    from ds_acco.fsdp import acco_fully_shard

    cfg = {"backend": "fsdp", "mode": "acco"}
    cases = {
        "2d_mesh": lambda: acco_fully_shard(W.make_model(), mesh=init_device_mesh("cpu", (1, world)),
                                            acco_config=cfg, gradient_accumulation_steps=2),
        "offload": lambda: acco_fully_shard(
            fully_shard(W.make_model(), offload_policy=CPUOffloadPolicy(pin_memory=False)),
            acco_config=cfg, gradient_accumulation_steps=2),
        "reduce_dtype": lambda: acco_fully_shard(
            fully_shard(W.make_model(), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                       reduce_dtype=torch.float32)),
            acco_config=cfg, gradient_accumulation_steps=2),
        "unsharded_params": lambda: acco_fully_shard(W.make_model(), acco_config=cfg, gradient_accumulation_steps=2,
                                                     param_groups=list(W.make_model().parameters())),
        "odd_G": lambda: acco_fully_shard(W.make_model(), acco_config=cfg, gradient_accumulation_steps=3),
        "bucket_cap": lambda: acco_fully_shard(W.make_model(), acco_config=cfg, gradient_accumulation_steps=2,
                                               bucket_cap_mb=-1),
    }
    out = {}
    for name, case in cases.items():
        try:
            case()
            out[name] = "no error"
        except Exception as exc:  # noqa: BLE001 - the message is the result
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def third_job(rank, world, *, G, steps, ckpt) -> dict:
    """Three ranks: every mode, then a resharded load of the two-rank checkpoint."""
    return {"modes": modes(rank, world, G=G, steps=steps), "lookahead": lookahead_paths(rank, world, G=G),
            "resharded": resharded_load(rank, world, ckpt=ckpt, more_steps=2)}


def auto_job(rank, world, *, G, steps) -> dict:
    """``mode: "auto"`` on the FSDP2 front end; the modes it ran, per commit, for the reference."""
    model, acco = build(world, {"backend": "fsdp", "mode": "auto", "auto": {
        "measure_steps": 3, "check_every": 1, "acco_step_penalty": 0.0, "switch_margin": 0.0}}, G)
    trajectory, _ = train(rank, model, acco, steps)
    modes = [r.mode for r in acco.telemetry.records if r.kind == "commit"]
    acco.close()
    return {"trajectory": trajectory, "modes": modes}
