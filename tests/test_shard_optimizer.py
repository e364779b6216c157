"""The estimate's lookahead leaves master shards and optimizer state bit-identical."""

from __future__ import annotations

import warnings

import pytest
import torch

from ds_acco.optim.shard_optimizer import ShardOptimizer


def _state_copy(opt):
    return {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()} for p, s in opt.state.items()}


def _assert_same_state(opt, saved):
    assert set(saved) == {id(p) for p in opt.state if opt.state[p]}
    for p, s in opt.state.items():
        for k, v in s.items():
            if torch.is_tensor(v):
                assert torch.equal(v, saved[id(p)][k]), k
            else:
                assert v == saved[id(p)][k], k


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("commits_before", [0, 3])
def test_lookahead_is_bit_identical_and_equals_next_commit(name, commits_before):
    torch.manual_seed(0)
    masters = [torch.randn(7), torch.randn(3)]
    opt = OPTIMIZERS[name]([{"params": [masters[0]]}, {"params": [masters[1]], "weight_decay": 0.0}])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    so = ShardOptimizer(opt, masters, sched)
    for _ in range(commits_before):
        so.commit([torch.randn(7), torch.randn(3)])
    grads = [torch.randn(7), torch.randn(3)]
    before = [m.clone() for m in masters]
    state = _state_copy(opt)
    lr = so.lr
    published = [[torch.empty_like(m) for m in masters]]
    so.lookahead(grads, published[0])
    for m, b in zip(masters, before):
        assert torch.equal(m, b)
    _assert_same_state(opt, state)
    assert so.lr == lr  # the scheduler did not move
    assert not torch.equal(published[0][0], before[0])
    so.commit(grads)  # the commit that follows, on the same gradients, lands where the lookahead did
    for m, p in zip(masters, published[0]):
        assert torch.equal(m, p)
    assert so.lr == lr * 0.5


def test_optimizer_over_model_params_is_rejected():
    masters = [torch.zeros(3)]
    opt = torch.optim.AdamW([torch.zeros(3, requires_grad=True)])
    with pytest.raises(ValueError, match="does not own master shard"):
        ShardOptimizer(opt, masters)


class _SnapshotAdamW(torch.optim.AdamW):
    """A subclass: ShardOptimizer does not trust its step to be AdamW's and snapshots."""


class _SnapshotAdam(torch.optim.Adam):
    pass


# (optimizer kind, keyword arguments, exact?): the functional rule is torch's single-tensor
# arithmetic, so it is bit-identical to the single-tensor and foreach paths; fused rounds differently.
ADAM_CASES = {
    "adamw_wd": (torch.optim.AdamW, _SnapshotAdamW, {"weight_decay": 0.1}, True),
    "adam_l2": (torch.optim.Adam, _SnapshotAdam, {"weight_decay": 0.05}, True),
    "adam_amsgrad_l2": (torch.optim.Adam, _SnapshotAdam, {"amsgrad": True, "weight_decay": 0.05}, True),
    "adamw_amsgrad_maximize": (torch.optim.AdamW, _SnapshotAdamW, {"amsgrad": True, "maximize": True}, True),
    "adamw_foreach": (torch.optim.AdamW, _SnapshotAdamW, {"weight_decay": 0.1, "foreach": True}, True),
    "adamw_fused": (torch.optim.AdamW, _SnapshotAdamW, {"weight_decay": 0.1, "fused": True}, True),
}


def _adam_pair(case, sizes):
    """The same masters and groups under the functional and the snapshot lookahead."""
    functional_kind, snapshot_kind, kwargs, exact = ADAM_CASES[case]
    torch.manual_seed(1)
    init = [torch.randn(n) for n in sizes]
    built = []
    for kind in (functional_kind, snapshot_kind):
        masters = [t.clone() for t in init]
        groups = [  # per-group lr, betas, eps and weight decay
            {"params": [masters[0]]},
            {"params": [masters[1]], "lr": 0.03, "betas": (0.8, 0.99), "eps": 1e-6,
             "weight_decay": 0.0 if "weight_decay" not in kwargs else 0.2},
        ]
        opt = kind(groups, lr=0.1, betas=(0.9, 0.95), **kwargs)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
        built.append(ShardOptimizer(opt, masters, sched))
    return built[0], built[1], exact


def test_chunks_are_larger_on_a_gpu_where_launches_not_scratch_are_scarce():
    """The chunk follows the tensors' device (the CUDA figure is what the H200 measurement chose);
    the tests above force small chunks on the CPU, so both sizes meet the same arithmetic."""
    from ds_acco.optim import adam_lookahead

    assert adam_lookahead.chunk_elems(torch.device("cpu")) == adam_lookahead.CHUNK_ELEMS == 1 << 18
    assert adam_lookahead.chunk_elems(torch.device("cuda", 0)) == adam_lookahead.CUDA_CHUNK_ELEMS == 1 << 22


@pytest.mark.parametrize("case", sorted(ADAM_CASES))
def test_functional_adam_lookahead_equals_snapshot_lookahead(case, monkeypatch):
    """Step 1 (no state yet, bias correction at its largest) and later steps, chunked, into fp32 and bf16."""
    import ds_acco.optim.adam_lookahead as adam_lookahead

    monkeypatch.setattr(adam_lookahead, "CHUNK_ELEMS", 64)  # several chunks and a ragged last one
    sizes = (203, 70)
    functional, snapshot, exact = _adam_pair(case, sizes)
    kwargs = ADAM_CASES[case][2]
    assert functional.lookahead_is_functional and not snapshot.lookahead_is_functional
    gen = torch.Generator().manual_seed(2)
    for step in range(4):
        grads = [torch.randn(n, generator=gen) for n in sizes]
        before = [m.clone() for m in functional.masters]
        state = _state_copy(functional.optimizer)
        for dtype in (torch.float32, torch.bfloat16):
            got = [torch.full((n + 5,), 7.0, dtype=dtype) for n in sizes]  # longer than the shard: tail untouched
            want = [torch.full((n + 5,), 7.0, dtype=dtype) for n in sizes]
            functional.lookahead(grads, got)
            snapshot.lookahead(grads, want)
            for g, w in zip(got, want):
                if exact:
                    assert torch.equal(g, w), f"step {step} {dtype}: max diff {(g.float() - w.float()).abs().max()}"
                else:
                    torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
                assert torch.equal(g[-5:], torch.full((5,), 7.0, dtype=dtype))
        for m, b in zip(functional.masters, before):
            assert torch.equal(m, b)
        _assert_same_state(functional.optimizer, state)
        commit_grads = [torch.randn(n, generator=gen) for n in sizes]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # e.g. the scheduler's "lr_scheduler.step() before optimizer.step()"
            functional.commit(commit_grads)  # chunked in place, except fused: torch's own step
        snapshot.commit(commit_grads)
        for a, b in zip(functional.masters, snapshot.masters):
            assert torch.equal(a, b)
        for a, b in zip(functional.masters, snapshot.masters):  # the state the chunked commit wrote
            sa, sb = functional.optimizer.state[a], snapshot.optimizer.state[b]
            assert sorted(sa) == sorted(sb)
            for key in sa:
                assert torch.equal(sa[key], sb[key]) and sa[key].dtype == sb[key].dtype, key
    assert functional._functional.steps_in_place(functional.masters) == (not kwargs.get("fused"))


def test_functional_lookahead_is_not_used_where_it_has_no_rule():
    masters = [torch.zeros(4)]
    assert not ShardOptimizer(torch.optim.SGD(masters, lr=0.1), masters).lookahead_is_functional
    capturable = [torch.zeros(4)]
    opt = torch.optim.AdamW(capturable, lr=0.1, capturable=True)
    assert not ShardOptimizer(opt, capturable).lookahead_is_functional


def _fused_adam_pair(sizes, *, same_betas, **kwargs):
    """DeepSpeed's FusedAdam (on CPU: its C++ Adam kernel) under the functional and the snapshot lookahead."""
    from deepspeed.ops.adam import FusedAdam

    class _SnapshotFusedAdam(FusedAdam):
        pass

    torch.manual_seed(1)
    init = [torch.randn(n) for n in sizes]
    built = []
    for kind in (FusedAdam, _SnapshotFusedAdam):
        masters = [t.clone() for t in init]
        second = {"params": [masters[1]], "lr": 0.03, "eps": 1e-6, "weight_decay": 0.0}
        if not same_betas:
            second["betas"] = (0.8, 0.99)
        opt = kind([{"params": [masters[0]]}, second], lr=0.1, betas=(0.9, 0.95), **kwargs)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
        built.append(ShardOptimizer(opt, masters, sched))
    return built


# (same betas in every group, FusedAdam keyword arguments)
FUSED_ADAM_CASES = {
    "adamw": (True, {"weight_decay": 0.1, "adam_w_mode": True}),
    "adam_l2": (True, {"weight_decay": 0.05, "adam_w_mode": False}),
    "adamw_group_betas": (False, {"weight_decay": 0.1, "adam_w_mode": True}),
    "no_bias_correction": (True, {"weight_decay": 0.1, "bias_correction": False}),
}


SIMD_TAIL = 16
"""DeepSpeed's kernel steps a tensor in SIMD blocks (8 fp32 lanes with AVX2, 16 with AVX-512) and the last
``numel % lanes`` elements in scalar C++, whose multiply-adds the compiler contracts into FMAs as it
chooses (GCC 12 -O3 -march=native: ``fma(m, beta1, g * (1 - beta1))``, the SIMD blocks
``fma(g, 1 - beta1, m * beta1)``). Those elements may differ by an ulp of a moment, so about two of the
result (:data:`TAIL_TOL`); every other element is compared bit for bit."""
TAIL_TOL = {torch.float32: dict(rtol=2.5e-7, atol=1e-7), torch.bfloat16: dict(rtol=2 ** -7, atol=1e-7)}


def _assert_kernel_equal(got: torch.Tensor, want: torch.Tensor, n: int, what: str) -> None:
    body = n - n % SIMD_TAIL
    assert torch.equal(got[:body], want[:body]), f"{what}: max diff {(got - want).float().abs().max()}"
    torch.testing.assert_close(got[body:], want[body:], **TAIL_TOL[got.dtype], msg=what)


@pytest.mark.parametrize("case", sorted(FUSED_ADAM_CASES))
def test_functional_lookahead_equals_deepspeed_cpu_adam_kernel(case, monkeypatch):
    """DeepSpeed's Adam on CPU (FusedAdam; DeepSpeedCPUAdam runs the same kernel): steps 1 to 6,
    chunked, into fp32 and bf16; bit for bit but for the scalar tail (:data:`SIMD_TAIL`).

    The functional rule evaluates the kernel's own formula with its fp32 scalars and
    FMAs (ds_acco/optim/adam_lookahead.py). The one input it reconstructs is the kernel's
    ``beta ** step`` (multiplied up in fp32 when all groups share betas, ``pow`` when they
    do not); a resumed run is where it can be ulps off (the next test).
    """
    import ds_acco.optim.adam_lookahead as adam_lookahead

    monkeypatch.setattr(adam_lookahead, "CHUNK_ELEMS", 64)
    monkeypatch.setattr(adam_lookahead, "SQRT_PIECE", 24)  # several fp64 pieces per chunk, a ragged last one
    same_betas, kwargs = FUSED_ADAM_CASES[case]
    sizes = (203, 70)  # 11 and 6 tail elements
    functional, snapshot = _fused_adam_pair(sizes, same_betas=same_betas, **kwargs)
    assert functional.lookahead_is_functional and not snapshot.lookahead_is_functional
    gen = torch.Generator().manual_seed(2)
    for step in range(6):
        grads = [torch.randn(n, generator=gen) * 10.0 ** -step for n in sizes]  # v spans several scales
        before = [m.clone() for m in functional.masters]
        state = _state_copy(functional.optimizer)
        for dtype in (torch.float32, torch.bfloat16):
            got = [torch.full((n + 5,), 7.0, dtype=dtype) for n in sizes]
            want = [torch.full((n + 5,), 7.0, dtype=dtype) for n in sizes]
            functional.lookahead(grads, got)
            snapshot.lookahead(grads, want)
            for g, w, n in zip(got, want, sizes):
                _assert_kernel_equal(g[:n], w[:n], n, f"step {step} {dtype}")
                assert torch.equal(g[n:], w[n:])
        for m, b in zip(functional.masters, before):
            assert torch.equal(m, b)
        _assert_same_state(functional.optimizer, state)
        commit_grads = [torch.randn(n, generator=gen) for n in sizes]
        functional.commit(commit_grads)
        snapshot.commit(commit_grads)
        for a, b in zip(functional.masters, snapshot.masters):
            assert torch.equal(a, b)


def test_functional_lookahead_after_resume_is_within_ulps_of_deepspeed_cpu_adam():
    """A resumed FusedAdam: the kernel recomputes ``beta ** step`` with ``pow`` at its first
    step, the functional rule multiplies it up from step 1; within :data:`TAIL_TOL` at step 101
    (measured: the SIMD body still bit-identical, one tail element an ulp apart)."""
    sizes = (203, 70)
    functional, snapshot = _fused_adam_pair(sizes, same_betas=True, weight_decay=0.1)
    gen = torch.Generator().manual_seed(3)
    moments = [(torch.randn(n, generator=gen) * 0.1, torch.rand(n, generator=gen) * 0.01) for n in sizes]
    for so in (functional, snapshot):
        for p, (m, v) in zip(so.masters, moments):
            so.optimizer.state[p] = {"step": 100, "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    grads = [torch.randn(n, generator=gen) for n in sizes]
    got, want = [torch.empty(n) for n in sizes], [torch.empty(n) for n in sizes]
    functional.lookahead(grads, got)
    snapshot.lookahead(grads, want)
    for g, w, n in zip(got, want, sizes):
        torch.testing.assert_close(g, w, **TAIL_TOL[torch.float32])
