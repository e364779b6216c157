"""torch's fused Adam kernel as a round's lookahead and commit (ds_acco/optim/fused_adam.py).

On an accelerator it is the default; here, on a CPU, ``FunctionalAdam.fused = True`` runs the same calls on
torch's CPU fused kernel, so each result can be compared bit for bit with torch's own ``fused=True`` step."""

from __future__ import annotations

import copy

import pytest
import torch

from ds_acco.optim.adam_lookahead import FunctionalAdam
from ds_acco.optim.shard_optimizer import ShardOptimizer

CASES = {  # (optimizer kind, keyword arguments)
    "adamw_wd": (torch.optim.AdamW, {"weight_decay": 0.1}),
    "adam_l2": (torch.optim.Adam, {"weight_decay": 0.05}),
    "adam_amsgrad_l2": (torch.optim.Adam, {"amsgrad": True, "weight_decay": 0.05}),
    "adamw_amsgrad_maximize": (torch.optim.AdamW, {"amsgrad": True, "maximize": True, "weight_decay": 0.1}),
}
SIZES = (203, 70)


def _masters_and_twin(kind, kwargs):
    """ds_acco's optimizer (single-tensor, its steps made by the kernel) and a ``fused=True`` twin."""
    torch.manual_seed(1)
    init = [torch.randn(n) for n in SIZES]
    built = []
    for fused in (False, True):
        masters = [t.clone() for t in init]
        groups = [{"params": [masters[0]]}, {"params": [masters[1]], "lr": 0.03, "betas": (0.8, 0.99)}]
        built.append(kind(groups, lr=0.1, betas=(0.9, 0.95), fused=fused, **kwargs))
    return built


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kernels_lookahead_and_commit_are_torchs_fused_step_bit_for_bit(case, monkeypatch):
    """Steps 1 to 4 (no state at the first), several chunks and a short last one, into fp32 (stepped in place)
    and bf16 (through scratch), with and without the whole-shard scratch; the masters and state untouched by a
    lookahead; the commit's masters and moments equal to the twin's."""
    import ds_acco.optim.adam_lookahead as A

    monkeypatch.setattr(A, "CHUNK_ELEMS", 64)
    opt, twin = _masters_and_twin(*CASES[case])
    so = ShardOptimizer(opt, [g["params"][0] for g in opt.param_groups])
    so._functional.fused = True
    masters = so.masters
    tw = [g["params"][0] for g in twin.param_groups]
    gen = torch.Generator().manual_seed(2)
    for step in range(4):
        grads = [torch.randn(n, generator=gen) for n in SIZES]
        probe = copy.deepcopy(twin)  # the twin stepped once on a copy: the lookahead's target
        probe_params = [g["params"][0] for g in probe.param_groups]
        for p, g in zip(probe_params, grads):
            p.grad = g.clone()
        probe.step()
        before = [m.clone() for m in masters]
        for dtype in (torch.float32, torch.bfloat16):
            for scratch in (None, [torch.empty(n + 3) for n in SIZES]):
                got = [torch.full((n + 5,), 7.0, dtype=dtype) for n in SIZES]
                so.lookahead(grads, got, scratch=scratch)
                for o, want, n in zip(got, probe_params, SIZES):
                    assert torch.equal(o[:n], want.detach().to(dtype)), (step, dtype, scratch is None)
                    assert torch.equal(o[n:], torch.full((5,), 7.0, dtype=dtype))
        assert all(torch.equal(m, b) for m, b in zip(masters, before))
        commit = [torch.randn(n, generator=gen) for n in SIZES]
        so.commit(commit)
        for p, g in zip(tw, commit):
            p.grad = g.clone()
        twin.step()
        for a, b in zip(masters, tw):
            assert torch.equal(a, b.detach())
            for key in twin.state[b]:
                assert torch.equal(opt.state[a][key].float().cpu(), twin.state[b][key].float().cpu()), key


def test_an_optimizer_built_fused_gets_a_lookahead_as_exact_as_its_step():
    """On a CPU the kernel runs only for ``fused=True`` (its commit is torch's own step): the estimate then
    rounds as that step will, where the elementwise rule was ulps away."""
    opt, fused_opt = _masters_and_twin(torch.optim.AdamW, {"weight_decay": 0.1})
    fa, fa_fused = FunctionalAdam.for_optimizer(opt), FunctionalAdam.for_optimizer(fused_opt)
    dev = torch.device("cpu")
    assert not fa._uses_kernel(_hyper(fa, opt), opt.param_groups[0], dev)
    assert fa_fused._uses_kernel(_hyper(fa_fused, fused_opt), fused_opt.param_groups[0], dev)


def _hyper(fa, opt):
    return fa._hyper_reader(opt, opt.param_groups[0])


def test_deepspeeds_adam_takes_the_kernel_with_its_own_hyper_parameters():
    """DeepSpeed's FusedAdam on a GPU: its lookahead is torch's kernel with its hyper-parameters (AdamW mode:
    decoupled weight decay; L2 mode: coupled), here stepped on a CPU against torch's fused AdamW/Adam; without
    bias correction (the kernel always corrects) it keeps the elementwise rule."""
    from deepspeed.ops.adam import FusedAdam

    for adam_w_mode, torch_kind in ((True, torch.optim.AdamW), (False, torch.optim.Adam)):
        torch.manual_seed(3)
        init = torch.randn(150)
        ds_master, twin_master = init.clone(), torch.nn.Parameter(init.clone())
        ds = FusedAdam([ds_master], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, adam_w_mode=adam_w_mode)
        twin = torch_kind([twin_master], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
        fa = FunctionalAdam.for_optimizer(ds)
        fa.fused = True
        grad = torch.randn(150)
        got = torch.empty(150)
        fa.lookahead([ds_master], [grad], [got])
        twin_master.grad = grad
        twin.step()
        assert torch.equal(got, twin_master.detach())
        plain = FusedAdam([torch.zeros(4)], lr=0.01, bias_correction=False)
        fa_plain = FunctionalAdam.for_optimizer(plain)
        fa_plain.fused = True
        assert not fa_plain._uses_kernel(_hyper(fa_plain, plain), plain.param_groups[0], torch.device("cpu"))


def test_the_kernel_issues_a_few_operations_a_chunk_and_the_commit_four():
    """benchmarks/round_launches.py's counts, as on an accelerator: 5 chunks; the lookahead three operations a
    chunk (the elementwise rule eight or more), the commit four whatever the shard; with a shard-sized scratch the
    lookahead keeps the whole-shard rule (fewer operations than 5 chunks' kernel), the commit the kernel."""
    from benchmarks.round_launches import measure

    chunks = 5
    rows = {(k, s): measure(4321, k, s, chunk=1000) for k in (False, True) for s in (False, True)}
    assert rows[(False, False)]["lookahead_ops"] >= 8 * chunks and rows[(False, False)]["commit_ops"] >= 8 * chunks
    assert rows[(True, False)]["lookahead_ops"] <= 3 * chunks + 6
    assert rows[(True, False)]["commit_ops"] == rows[(True, True)]["commit_ops"] == 4
    assert rows[(True, True)]["lookahead_ops"] == rows[(False, True)]["lookahead_ops"] <= 12


def test_docs_gpu_counts_are_what_the_benchmark_counts_now():
    """docs/gpu.md's table comes from bench_results/round_launches/; its first shard (the medium GPT, no
    scratch) is counted again here, both rules."""
    import json
    import os

    from benchmarks.report.pages import gpu, sets
    from benchmarks.round_launches import measure

    with open(os.path.join(sets.ROOT, gpu.RAW), encoding="utf-8") as f:
        rows = [r for r in json.load(f)["rows"] if not r["shard_scratch"]][:2]
    for row in rows:
        now = measure(row["elements"], row["kernel"], False)
        assert (now["lookahead_ops"], now["commit_ops"]) == (row["lookahead_ops"], row["commit_ops"]), row
