"""The CUDA paths: the comm stream, its events and NCCL, against the reference rules.

CI has no GPU, so this file skips there; run it on a GPU machine with
``python -m pytest -q tests/test_cuda.py``. One GPU takes one NCCL rank, so the
process group here has world size 1: the collectives are trivial, but every
round still runs on the side stream (``CommThread.comm_stream``) and hands its
buffers back through CUDA events. A missing wait shows up as a trajectory that
differs from the reference, which is why the large-buffer case uses tensors big
enough for the kernels on the two streams to overlap in time.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from ds_acco import plain
from ds_acco.reference import ReferenceRun, reference_trajectory
from tests import workloads as W
from tests.dist_harness import free_port
from tests.helpers import BF16_ATOL, assert_follows_rules, assert_trajectories_equal, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; CI has none")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", autouse=True)
def nccl_world_of_one():
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    assert dist.get_backend() == "nccl"
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["sync", "dpu", "acco"])
def test_fixed_policy_on_cuda_matches_reference(mode):
    got = W.train_with_engine(0, 1, config={"mode": mode, "policy": "fixed"}, G=4, steps=10, device="cuda")
    assert_trajectories_equal(got["trajectory"], reference(mode, 1, 4, steps=10), atol=1e-5, rtol=1e-5)


def test_adaptive_policy_on_cuda_matches_reference_with_its_counts():
    got = W.train_with_engine(0, 1, config={"mode": "acco", "policy": "adaptive", "warmup_steps": 1}, G=4,
                              steps=8, slow_rank=0, slow_s=0.002, device="cuda")
    assert all(sum(c) >= 1 for c in got["counts"])
    want = reference("acco", 1, 4, steps=8, counts=got["counts"], warmup=1)
    assert_trajectories_equal(got["trajectory"], want, atol=1e-5, rtol=1e-5)


def test_bf16_parameters_on_cuda_track_the_fp32_reference():
    cfg = {"mode": "acco", "grad_accum_dtype": "bf16", "comm_dtype": "bf16"}
    got = W.train_with_engine(0, 1, config=cfg, G=4, steps=8, dtype=torch.bfloat16, device="cuda")
    assert_follows_rules(got["trajectory"], "acco", 1, 4, 8, atol=BF16_ATOL)


def test_auto_mode_on_cuda_switches_to_acco_on_a_slow_link_and_follows_the_rules():
    from ds_acco.reference import reference_schedule
    from tests.auto_workers import train_auto

    got = train_auto(0, 1, G=4, compute_s=0.05, link=[(5, 0.1)], steps=14, device="cuda",
                     config={"mode": "auto", "auto": {"measure_steps": 3, "check_every": 2}})
    assert got["modes"][:3] == ["sync"] * 3 and "acco" in got["modes"], got["lines"]
    model = W.make_model()
    ref = ReferenceRun(W.ordered_params(model), W.reference_grad_fn(model), W.make_reference_optimizer, 1)
    assert_trajectories_equal(got["trajectory"], reference_schedule(ref, got["modes"], 4))


def test_auto_switches_to_streaming_on_cuda_and_follows_the_rules():
    """The switch's optimizer state gathered on the comm stream (fp32: exact) and the phase stepping on the GPU."""
    from tests import auto_streaming_workers as S
    from tests.auto_workers import train_auto

    steps = S.SWITCH + 7
    got = train_auto(0, 1, G=S.G, compute_s=S.COMPUTE_S, link=[(0, 0.5)], steps=steps, device="cuda", config=S.CONFIG)
    assert [c["runs"] for c in got["choices"]] == ["streaming"], got["lines"]
    sync, trace = S.reference(steps, world=1)
    assert_trajectories_equal(got["trajectory"][:S.SWITCH], sync)
    assert_trajectories_equal(got["trajectory"][S.SWITCH:], [workers[0] for workers in trace.workers])


def test_the_switch_sends_the_optimizer_state_at_one_byte_on_cuda():
    from tests import auto_streaming_workers as S

    exact = S.phase_state(0, 1, all_gather_dtype="fp32", piece=512, device="cuda")
    assert all(torch.equal(exact["got"][k], exact["want"][k]) for k in exact["want"])
    small = S.phase_state(0, 1, all_gather_dtype="bf16", piece=512, device="cuda")
    S.assert_state_within_one_byte_bounds(small, world=1)


def test_low_bit_rounds_on_cuda_stay_close_to_exact():
    exact = W.train_with_engine(0, 1, config={"mode": "acco"}, G=4, steps=10, device="cuda")
    lowbit = W.train_with_engine(0, 1, config={"mode": "acco", "comm_quantization": "int8", "error_feedback": True,
                                               "all_gather_quantization": "int8", "quantization_block_size": 8},
                                 G=4, steps=10, device="cuda")
    for a, b in zip(exact["trajectory"][-1], lowbit["trajectory"][-1]):
        assert torch.isfinite(b).all()
        # lr 0.02 per step; int8 blocks of 8 keep the drift a small fraction of one step
        assert (a - b).abs().max().item() < 0.02, (a - b).abs().max()


def test_the_round_steps_adam_with_torchs_fused_kernel_on_cuda(monkeypatch):
    """On a GPU the lookahead and the commit run torch's fused kernel by default (ds_acco/optim/fused_adam.py):
    bit for bit ``AdamW(fused=True)``'s step, over several chunks and a short last one, the masters and moments
    untouched by the lookahead; and each in a handful of launches, not eight per chunk."""
    import copy

    import ds_acco.optim.adam_lookahead as A
    from ds_acco.optim.shard_optimizer import ShardOptimizer

    monkeypatch.setattr(A, "CUDA_CHUNK_ELEMS", 1000)
    torch.manual_seed(0)
    n = 4321
    masters = [torch.randn(n, device="cuda")]
    twin_p = torch.nn.Parameter(masters[0].clone())
    opt = torch.optim.AdamW(masters, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    twin = torch.optim.AdamW([twin_p], lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    so = ShardOptimizer(opt, masters)
    for step in range(3):
        grad = torch.randn(n, device="cuda")
        probe = copy.deepcopy(twin)
        probe_p = probe.param_groups[0]["params"][0]
        probe_p.grad = grad.clone()
        probe.step()
        out, before = torch.full((n + 3,), 7.0, device="cuda"), masters[0].clone()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            so.lookahead([grad], [out])
        ops = [e for e in prof.events() if e.name.startswith("aten::_fused_adamw_")]
        assert len(ops) == 5, [e.name for e in prof.events()]  # ceil(4321 / 1000) chunks, a launch each
        assert torch.equal(out[:n], probe_p.detach()) and torch.equal(masters[0], before), step
        so.commit([grad])
        twin_p.grad = grad.clone()
        twin.step()
        assert torch.equal(masters[0], twin_p.detach()), step
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[masters[0]][key], twin.state[twin_p][key]), key


class _Wide(nn.Module):
    def __init__(self, width: int = 1024):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _wide_batch(k: int, width: int = 1024):
    g = torch.Generator().manual_seed(1000 + k)
    return torch.randn(64, width, generator=g).cuda(), torch.randn(64, width, generator=g).cuda()


def test_large_buffers_on_the_comm_stream_match_reference():
    """2.1 M parameters: a round's kernels on the comm stream run long enough to overlap the next
    micro-batch's forward; a missing event wait would read a half-written buffer."""
    model = _Wide().cuda()
    names = [n for n, _ in model.named_parameters()]
    engine = plain.build(list(model.parameters()), torch.optim.AdamW, W.OPT_KWARGS, config={"mode": "acco"},
                         gradient_accumulation_steps=4)
    assert engine._comm.comm_stream is not None
    got, k = [], 0
    try:
        while engine.commits < 6:
            x, y = _wide_batch(k)
            k += 1
            nn.functional.mse_loss(model(x), y).backward()
            before = engine.commits
            engine.after_micro_batch()
            if engine.commits > before:
                got.append([p.detach().cpu().clone() for p in model.parameters()])
    finally:
        engine.close()

    ref_model = _Wide().cuda()

    def grad_fn(worker, i, params):
        x, y = _wide_batch(i)
        ps = [p.detach().requires_grad_(True) for p in params]
        loss = nn.functional.mse_loss(functional_call(ref_model, dict(zip(names, ps)), (x,)), y)
        return torch.autograd.grad(loss, ps)

    run = ReferenceRun(list(ref_model.parameters()), grad_fn, lambda ps: torch.optim.AdamW(ps, **W.OPT_KWARGS), 1)
    want = [[t.cpu() for t in step] for step in reference_trajectory("acco", run, 6, 4)]
    assert_trajectories_equal(got, want, atol=1e-5, rtol=1e-4)


def test_deepspeed_front_end_on_cuda_trains_and_sync_equals_zero1(tmp_path):
    """The real DeepSpeed engine on the GPU (world size 1, NCCL): ds_acco sync's parameters after 6 steps equal
    stock ZeRO-1's within 1e-6, as on the CPU (tests/test_deepspeed_engine.py), and so do its losses."""
    losses, params = {}, {}
    for name in ("zero1", "sync", "acco_fixed"):
        losses[name], params[name] = train_lm_alone(tmp_path, name, steps=6)
    assert len(losses["zero1"]) == 6
    torch.testing.assert_close(torch.tensor(losses["sync"]), torch.tensor(losses["zero1"]), atol=2e-6, rtol=1e-6)
    assert params["sync"].keys() == params["zero1"].keys() and len(params["zero1"]) > 4
    for key, want in params["zero1"].items():
        torch.testing.assert_close(params["sync"][key], want, atol=1e-6, rtol=1e-5, msg=lambda m: f"{key}: {m}")
    # acco's one-step delay moves the parameters: the comparison above can tell modes apart
    assert any(not torch.allclose(params["acco_fixed"][k], w, atol=1e-6, rtol=1e-5) for k, w in params["zero1"].items())
    assert all(l == l and l < 10 for l in losses["acco_fixed"])


def train_lm_alone(tmp_path, name: str, steps: int):
    """``examples.train_lm`` at world size 1 (a process of its own: DeepSpeed initialises its own process group)
    with the benchmark config ``name``; returns its per-step losses and the module's parameters it saved."""
    import json

    from benchmarks.sweep.configs import make_config

    cfg_path = tmp_path / f"{name}.json"
    cfg = make_config(name, micro_batch=2, grad_accum=4)
    cfg_path.write_text(json.dumps(cfg))
    log, save = tmp_path / f"{name}.jsonl", tmp_path / f"{name}_ckpt"
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "examples.train_lm", "--model-size", "tiny", "--steps", str(steps),
                           "--seq-len", "64", "--no-progress", "--log-jsonl", str(log), "--save-dir", str(save),
                           "--eval-every", "0", "--deepspeed_config", str(cfg_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    states = torch.load(save / f"global_step{steps}" / "mp_rank_00_model_states.pt", map_location="cpu",
                        weights_only=False)
    module = {k: v.float() for k, v in states["module"].items() if v.is_floating_point()}
    return [r["loss"] for r in recs if "step" in r and "event" not in r], module
