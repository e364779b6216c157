"""``acco.auto.streaming``: auto switches a job to Streaming DiLoCo where no gradient round hides, losing nothing.

Real 2-rank gloo runs of the tiny exactness job (tests/auto_workers.py: 50 ms of compute per micro-batch, the
link's time added as each gradient round starts its reduce-scatter, on a simulated clock: tests/sim_clock.py).
With ``G = 4`` and a 500 ms round a sync step costs 700 ms against 200 ms of compute (3.5x, above
``STREAMING_HINT``), so the first choice, after step 6, switches to streaming. From there each rank's
trajectory is the streaming reference's (:mod:`ds_acco.reference.streaming`) started from the sync
reference's parameters and optimizer state at step 6, every inner step one mean of ``G`` micro-batches:
the switch loses no moment and no step.
"""

from __future__ import annotations

import pytest
import torch

from ds_acco.config import parse_acco_config
from ds_acco.errors import AccoConfigError
from ds_acco.reference import ReferenceRun, reference_schedule
from ds_acco.rounds.auto.choice import STREAMING_HINT
from tests import workloads as W
from tests.auto_streaming_workers import (COMPUTE_S, CONFIG, G, STREAM, SWITCH,
                                          assert_state_within_one_byte_bounds, phase_state, reference)
from tests.auto_workers import train_auto
from tests.dist_harness import run_distributed
from tests.helpers import assert_trajectories_equal
from tests.sim_clock import SimBed

POLICY_AUTO = dict(CONFIG, policy="auto", max_micro_batches_per_round=16, warmup_steps=2,
                   auto=dict(CONFIG["auto"], measure_steps=1))
"""A policy that may change the batch, and a look after step 1 (inside the warm-up: streaming or nothing)."""


@pytest.mark.parametrize("warmup", [0, 10])
def test_a_slow_link_switches_auto_to_streaming_and_each_replica_follows_the_reference(warmup):
    """With a warm-up longer than ``measure_steps`` (10 against 6) auto looks once after ``measure_steps`` all the
    same: streaming has no delay for the warm-up to keep away."""
    steps = SWITCH + 13
    got = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[(0, 0.5)], steps=steps,
                          config=dict(CONFIG, warmup_steps=warmup))
    first = got[0]["choices"][0]
    assert first["step"] == SWITCH and first["runs"] == "streaming", first
    assert first["streaming_ratio"] >= STREAMING_HINT and first["round_ms"] == pytest.approx(500), first
    assert first["streaming_ratio"] == pytest.approx(700 / 200), first  # a sync step against its bare compute
    assert not first["streaming_half"], first  # the policy keeps the batch: inner steps of G
    assert 0 < first["switch_s"] < 30, first  # what the switch itself cost, in real time (logged on rank 0)
    line = got[0]["lines"][0]
    assert "runs streaming (was sync; sync is the best gradient mode)" in line and "auto does not choose again" \
        in line, line
    assert len(got[0]["choices"]) == 1  # one-way
    sync, trace = reference(steps)
    for rank in (0, 1):
        traj = got[rank]["trajectory"]
        assert len(traj) == steps
        assert_trajectories_equal(traj[:SWITCH], sync)
        assert_trajectories_equal(traj[SWITCH:], [workers[rank] for workers in trace.workers])
    # the replicas differ between syncs: a streaming phase, not sync in disguise
    assert not torch.equal(got[0]["trajectory"][-2][0], got[1]["trajectory"][-2][0])
    # the fragment rounds were recorded as this job's rounds, with the syncs of the reference
    # (close() merged a round still in flight at the end: one more than the reference applied)
    assert got[0]["fragments"][:len(trace.syncs)] == [(s + SWITCH, f, a + SWITCH) for s, f, a in trace.syncs]
    assert len(trace.syncs) >= 3


def test_a_look_inside_the_warm_up_starts_nothing_but_streaming():
    """A 100 ms round against 200 ms of compute favours acco; the look after step 1 (``measure_steps``) falls
    inside a 4-step warm-up, so the job stays in sync and the first choice, after step 4, starts acco."""
    config = dict(CONFIG, warmup_steps=4, auto=dict(CONFIG["auto"], measure_steps=1))
    got = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[(0, 0.1)], steps=7,
                          config=config)[0]
    first = got["choices"][0]
    assert first["step"] == 4 and first["runs"] == "acco", first
    assert got["modes"][:4] == ["sync"] * 4 and set(got["modes"][4:]) == {"acco"}, got["modes"]
    assert len(got["lines"]) == len(got["choices"])  # the look inside the warm-up logged nothing at INFO


def test_a_look_after_step_one_prices_unmeasured_noise_small_and_streams_at_half_the_batch():
    """``policy: "auto"``: the noise scale needs two rounds, so the look after step 1 takes it as small (a committed
    step of any batch buys the same loss) rather than pricing the adaptive policy's up-to-16-micro-batch commits per
    sample, which on a link no round hides would look free; so a 500 ms round against 200 ms of compute starts
    streaming after step 1, and the line says how the noise scale was taken. Priced so, a half batch is cheaper, and
    this policy may change the batch: streaming's inner steps take ``G/2`` micro-batches, and from the sync reference's
    state after step 1 each replica follows the streaming reference at that batch (the first test, whose policy keeps
    the batch, streams at ``G``)."""
    steps = 1 + 13
    got = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[(0, 0.5)], steps=steps,
                          config=POLICY_AUTO)
    first, line = got[0]["choices"][0], got[0]["lines"][0]
    assert first["step"] == 1 and first["runs"] == "streaming" and first["noise_measured"] is False, first
    assert first["candidates"]["acco adaptive"]["batch"] > 8, first  # it would commit more than sync's 8
    assert "gradient noise scale not measured yet, taken as small" in line, line
    assert got[0]["modes"] == ["sync"], got[0]["modes"]  # commits after step 1 are streaming's fragment syncs
    assert first["streaming_half"] and f"runs streaming at half the batch ({G // 2} micro-batches an inner step)" \
        in line, line
    sync, trace = reference(steps, switch=1, inner_G=G // 2)
    for rank in (0, 1):
        traj = got[rank]["trajectory"]
        assert len(traj) == steps
        assert_trajectories_equal(traj[:1], sync)
        assert_trajectories_equal(traj[1:], [workers[rank] for workers in trace.workers])
    assert len(trace.syncs) >= 3


def test_auto_streaming_is_refused_where_it_cannot_run():
    """Before training, naming the field: no model to cut, parameters the inner optimizer cannot step, a cut the
    model does not allow."""
    def refused(**kw):
        return run_distributed(_build, 2, timeout=60, **kw)[0]

    assert "acco.auto.streaming: got true, but this front end cannot switch" in refused(model=False)
    assert "acco.auto.streaming: got true with torch.bfloat16" in refused(dtype=torch.bfloat16)
    assert "acco.streaming.fragments: got 3; the model has 2 top-level child" in refused(fragments=3)
    assert refused() == "built"
    assert parse_acco_config(CONFIG).auto.streaming and not parse_acco_config({"mode": "auto"}).auto.streaming


def _build(rank, world, *, model=True, dtype=torch.float32, fragments=2):
    from ds_acco import plain

    net = W.make_model().to(dtype)
    config = dict(CONFIG, streaming=dict(STREAM, fragments=fragments))
    try:
        engine = plain.build(W.param_groups(net), torch.optim.AdamW, W.OPT_KWARGS, config=config,
                             gradient_accumulation_steps=G, model=net if model else None)
    except AccoConfigError as exc:
        return str(exc)
    engine.close()
    return "built"


def _train(engine, model, rank, k, steps, bed, on_step=None):
    """Train up to ``steps`` commits from micro-batch ``k``; the compute parameters after each step."""
    trajectory = []
    while engine.commits < steps:
        x, y = W.batch(rank, k)
        k += 1
        bed.compute(COMPUTE_S)
        W.loss_fn(model(x), y).backward()
        before = engine.commits
        engine.after_micro_batch()
        if engine.commits > before:
            trajectory.append([p.detach().clone() for p in W.ordered_params(model)])
            if on_step is not None:
                on_step(engine.commits)
    return trajectory, k


def _resume_job(rank, world, *, save_at, steps, config=CONFIG):
    """Train to ``steps`` saving at ``save_at`` (in the phase), then a fresh engine resumes that save to ``steps``."""
    import io

    from ds_acco import plain
    from ds_acco.rounds.committed import committed_buffers, committed_parameters, gather_committed

    def build():
        model, bed = W.make_model(), SimBed(link=[(0, 0.5)])
        engine = plain.build(W.param_groups(model), torch.optim.AdamW, W.OPT_KWARGS, config=config,
                             gradient_accumulation_steps=G, on_stage=bed.on_stage, model=model, clock=bed.clock)
        bed.attach(engine)
        return model, engine, bed

    model, engine, bed = build()
    saved = {}

    def save(step):
        if step == save_at:
            buf = io.BytesIO()
            torch.save(plain.state_dict(engine), buf)
            saved["bytes"], saved["mode"] = buf.getvalue(), engine.mode
            saved["global"] = [t.clone() for t in committed_buffers(engine)]  # θ_g, in the groups' layout
            with committed_parameters(engine):  # evaluation on θ_g; training goes on on the replica
                saved["inside"] = [p.detach().clone() for p in W.ordered_params(model)]

    whole, _ = _train(engine, model, rank, 0, steps, bed, on_step=save)
    engine.finish()
    finished = [p.detach().clone() for p in W.ordered_params(model)]
    final_global = [t.clone() for t in committed_buffers(engine)]
    final_masters = gather_committed(engine)  # the masters, all-gathered: θ_g too after finish()
    engine.close()
    state = torch.load(io.BytesIO(saved["bytes"]), weights_only=False)
    model, engine, bed = build()
    plain.load_state_dict(engine, state)
    mode, inner_G = engine.mode, engine.phase.G
    resumed, _ = _train(engine, model, rank, engine.micro_batches, steps, bed)
    engine.close()
    groups = W.param_groups(W.make_model())
    return {"whole": whole, "resumed": resumed, "saved_mode": saved["mode"], "mode": mode, "inner_G": inner_G,
            "finished": finished,
            "final_global": final_global, "saved_global": saved["global"], "inside": saved["inside"],
            "final_masters": final_masters,
            "saved_masters": state["masters"], "sizes": [sum(p.numel() for p in g["params"]) for g in groups]}


@pytest.mark.parametrize("half", [False, True])
def test_a_checkpoint_in_the_phase_resumes_exactly_and_its_masters_hold_the_global_model(half):
    """``half``: the phase entered at half the batch after step 1 (see above) resumes with inner steps of ``G/2``."""
    switch = 1 if half else SWITCH
    config = POLICY_AUTO if half else CONFIG
    save_at, steps = switch + 4, switch + 10
    got = run_distributed(_resume_job, 2, timeout=240, save_at=save_at, steps=steps, config=config)
    for r in got:
        assert r["saved_mode"] == "streaming" and r["mode"] == "streaming"
        assert r["inner_G"] == (G // 2 if half else G)
        assert_trajectories_equal(r["resumed"], r["whole"][save_at:], atol=0, rtol=0)
        # the front end's masters were written from θ_g: the rank-major concatenation of both ranks' shards
        for g, size, full in zip(range(2), r["sizes"], r["saved_global"]):
            masters = torch.cat([got[0]["saved_masters"][g], got[1]["saved_masters"][g]])
            assert torch.equal(masters[:size], full[:size]), g
        inside = torch.cat([p.reshape(-1) for p in r["inside"]])  # (w1, w2 | b1, b2): the groups' order
        sizes = r["sizes"]
        assert torch.equal(inside, torch.cat([r["saved_global"][0][:sizes[0]], r["saved_global"][1][:sizes[1]]]))
    # finish() made every replica θ_g: both ranks end with one model, the one the exports give
    assert_trajectories_equal([got[0]["finished"]], [got[1]["finished"]], atol=0, rtol=0)
    assert not torch.equal(got[0]["whole"][-1][0], got[1]["whole"][-1][0])  # before it, the replicas differed
    for r in got:
        assert all(torch.equal(a, b) for a, b in zip(r["final_masters"], r["final_global"]))
    flat = torch.cat([got[0]["final_global"][0][:got[0]["sizes"][0]], got[0]["final_global"][1][:got[0]["sizes"][1]]])
    assert torch.equal(flat, torch.cat([p.reshape(-1) for p in got[0]["finished"]]))


def _ds_job(rank, world, **kw):
    """``D.train_ds`` with auto always preferring streaming (the tiny model's ratio sits near the threshold), from
    the first choice after ``measure_steps`` (the look before the first round, which would take any probed rate,
    has its own test)."""
    from tests import ds_workloads as D
    from tests.forced_streaming import forced_streaming

    with forced_streaming():
        return D.train_ds(rank, world, **kw)


def test_deepspeed_switches_to_streaming_follows_the_reference_and_resumes(tmp_path):
    from tests import ds_workloads as D

    steps, save_at = SWITCH + 8, (SWITCH + 3) * G  # saved after step 9, three steps into the phase
    config = D.ds_config(G, dict(CONFIG, auto=dict(CONFIG["auto"], check_every=1)))
    whole = run_distributed(_ds_job, 2, config=config, steps=steps, timeout=300)
    sync, trace = reference(steps)
    for rank in (0, 1):
        assert whole[rank]["modes"] == ["sync"] * SWITCH  # commit rounds; the phase's steps are not rounds
        assert_trajectories_equal(whole[rank]["trajectory"][:SWITCH], sync)
        assert_trajectories_equal(whole[rank]["trajectory"][SWITCH:], [w[rank] for w in trace.workers])
    assert whole[0]["global_samples"] == steps * 2 * G * W.BATCH  # DeepSpeed counted every step

    ckpt = str(tmp_path / "ckpt")
    saved = run_distributed(_ds_job, 2, config=config, steps=steps, save_at=save_at, ckpt_dir=ckpt, timeout=300)
    resumed = run_distributed(_ds_job, 2, config=config, steps=steps, ckpt_dir=ckpt, resume=True, timeout=300)
    for rank in (0, 1):
        assert resumed[rank]["loaded_steps"] == SWITCH + 3
        # (the steps before the save come from the client state, which DeepSpeed keeps from rank 0 only)
        assert_trajectories_equal(resumed[rank]["trajectory"][SWITCH + 3:], whole[rank]["trajectory"][SWITCH + 3:],
                                  atol=0, rtol=0)
    # DeepSpeed's own files hold θ_g and the mean moments: a job without the phase loads the global model
    plain_auto = D.ds_config(G, {"mode": "auto", "auto": {"measure_steps": 3}})
    other = run_distributed(D.train_ds, 2, config=plain_auto, steps=SWITCH + 4, ckpt_dir=ckpt, resume=True,
                            timeout=300)[0]
    # ...and so does a job on another number of ranks (DeepSpeed's universal-checkpoint path)
    alone = run_distributed(D.train_ds, 1, config=plain_auto, steps=SWITCH + 4, ckpt_dir=ckpt, resume=True,
                            timeout=300)[0]
    for loaded in (other["loaded_masters"], alone["loaded_masters"]):
        assert loaded.keys() == saved[0]["masters"].keys()
        for name, value in saved[0]["masters"].items():
            assert torch.equal(loaded[name], value), name
    theta_g = trace.global_params[2]  # after the third inner step
    for got, want in zip(sorted(saved[0]["masters"].items()), sorted(zip(_names(), theta_g))):
        torch.testing.assert_close(got[1].reshape(want[1].shape), want[1], atol=2e-6, rtol=1e-5)


def _names():
    model = W.make_model()
    ids = {id(p): n for n, p in model.named_parameters()}
    return [ids[id(p)] for p in W.ordered_params(model)]


LOWBIT = dict(CONFIG, comm_quantization="int8", error_feedback=True, all_gather_quantization="int8",
              streaming=dict(STREAM, quantize="int8", all_gather_dtype="bf16"))


def test_the_low_bit_preset_switches_too_and_stays_near_the_exact_run():
    """The shipped preset's path: int8 gradient rounds and parameter all-gathers before the switch (the replicas
    then trail the masters by an int8 step and start the phase from there), the optimizer state gathered at one
    byte an element, int8 pseudo-gradients after it. Not exact: within 1% of the fp32 run (0.1-0.4% measured), and
    the ranks agree on θ_g while their replicas differ."""
    steps = SWITCH + 13
    exact = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[(0, 0.5)], steps=steps,
                            config=CONFIG)
    lowbit = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[(0, 0.5)], steps=steps,
                             config=LOWBIT)
    assert [c["runs"] for c in lowbit[0]["choices"]] == ["streaming"]
    assert len(lowbit[0]["fragments"]) >= 3
    for rank in (0, 1):
        last, want = lowbit[rank]["trajectory"][-1], exact[rank]["trajectory"][-1]
        for g, w in zip(last, want):
            assert torch.isfinite(g).all()
            assert float((g - w).abs().max()) < 0.01 * float(w.abs().max()), (rank, float((g - w).abs().max()))
        assert any(not torch.equal(g, w) for g, w in zip(last, want))  # it did run the low-bit path
    assert all(torch.equal(a, b) for a, b in zip(lowbit[0]["global"], lowbit[1]["global"]))
    assert any(not torch.equal(a, b) for a, b in zip(lowbit[0]["trajectory"][-1], lowbit[1]["trajectory"][-1]))


def _short_of_memory_on_rank1(rank, world, **kw):
    from ds_acco.streaming import phase as streaming_switch  # where the switch checks the memory free

    free = streaming_switch.free_bytes
    if rank == 1:
        streaming_switch.free_bytes = lambda device: 1024
    try:
        return train_auto(rank, world, **kw)
    finally:
        streaming_switch.free_bytes = free


def test_a_rank_without_the_memory_keeps_every_rank_in_the_gradient_modes():
    steps = SWITCH + 5
    got = run_distributed(_short_of_memory_on_rank1, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[(0, 0.5)],
                          steps=steps, config=CONFIG)
    for r in got:
        assert r["modes"] == ["sync"] * steps and r["fragments"] == []  # both ranks stayed, in lockstep
        assert [c["runs"] for c in r["choices"]] == ["streaming", "sync", "sync"]  # not offered again
    assert "set acco.auto.streaming to let auto switch" in got[0]["lines"][-1]
    assert_trajectories_equal(got[0]["trajectory"], _sync_reference(steps))


def _sync_reference(steps):
    model = W.make_model()
    run = ReferenceRun(W.ordered_params(model), W.reference_grad_fn(model), W.make_reference_optimizer, 2)
    return reference_schedule(run, ["sync"] * steps, G)


def test_the_optimizer_state_arrives_exact_in_fp32_and_within_its_bounds_at_one_byte():
    """The switch's state exchange: fp32 bit for bit; otherwise the second moment on a per-block log scale (each
    value within its block's factor, zeros kept, no positive value lost) and the first as blockwise int8, in
    about a third of fp32's bytes, in pieces of whole blocks (a short last block and piece included)."""
    exact = run_distributed(phase_state, 2, timeout=120, all_gather_dtype="fp32", piece=512)
    for r in exact:
        assert all(torch.equal(r["got"][k], r["want"][k]) for k in r["want"])
    small = run_distributed(phase_state, 2, timeout=120, all_gather_dtype="bf16", piece=512)
    assert all(n > 2 * 512 and n % 256 for n in small[0]["shard_numel"])  # several pieces, a short last block
    assert small[0]["bytes"] < 0.3 * exact[0]["bytes"]
    for r in small:
        assert_state_within_one_byte_bounds(r, world=2)
        assert torch.equal(small[0]["got"][0, "exp_avg_sq"], r["got"][0, "exp_avg_sq"])  # every rank the same
