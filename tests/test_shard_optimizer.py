"""The estimate's lookahead leaves master shards and optimizer state bit-identical."""

from __future__ import annotations

import pytest
import torch

from ds_acco.shard_optimizer import ShardOptimizer


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
    published = []
    so.lookahead(grads, lambda: published.append([m.clone() for m in masters]))
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
