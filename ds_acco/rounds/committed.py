"""Exports see the committed parameters; the round schedule never notices.

With ACCO a round is nearly always in flight, so the module a training script holds is rarely the committed model:
between an estimate swap and the commit swap it holds the lookahead estimate, and while a commit is in flight the
committed result sits in the buffer the round engine's all-gather landed in. A script that exports after its loop
(``model.state_dict()``, ``save_16bit_model``, HF ``Trainer.save_model``) must get the committed parameters anyway, and
an export in the middle of training must not change what training does next.

Both come from :meth:`RoundEngine.committed_buffers`: it waits for the round in flight without swapping it in (the swap
still happens at the quota, so under the fixed policy the trajectory is bit-for-bit the one without exports), then
points at whichever buffer holds the committed parameters, cast to the compute dtype: the landing buffer while a commit
was in flight, the compute buffers otherwise. No communication is needed, so an export called on one rank only
(``if rank == 0: torch.save(model.state_dict(), ...)``) cannot hang under the fixed policy. The export all-gathers the
master shards instead, which every rank must then call, after an explicit ``wait()`` that swapped an estimate in, and
with ``all_gather_quantization: "int8"`` (every gathered buffer trails the masters by an int8 delta's rounding). Under
the adaptive policy the ranks first agree on the rounds launched (:mod:`ds_acco.rounds.alignment`), also a collective.

:class:`CommittedStateDict` substitutes those tensors into ``module.state_dict()`` (a state-dict post-hook), so every
export built on it is covered; :func:`committed_parameters` binds them as the compute parameters for the duration of a
``with`` block (evaluation on the committed model).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from .engine import RoundEngine


def gather_committed(engine: RoundEngine) -> list[torch.Tensor]:
    """All-gather the master shards into fresh compute-dtype buffers (collective: every rank)."""
    engine.quiesce()
    out = []
    for i, g in enumerate(engine.groups):
        full = g.layout.new_buffer(g.flat)
        engine.work.all_gather_masters(i, full)
        out.append(full)
    return out


def committed_buffers(engine: RoundEngine) -> list[torch.Tensor]:
    """Full buffers (one per group) holding the committed parameters; see the module docstring."""
    found = engine.committed_buffers()
    return found if found is not None else gather_committed(engine)


@contextlib.contextmanager
def committed_parameters(engine: RoundEngine) -> Iterator[None]:
    """Inside the block the model computes with the committed parameters (e.g. for evaluation).

    No backward inside the block. The compute parameters the rounds own are bound back on exit, so training continues
    exactly as without the block (in a streaming phase: the replica, and the block sees ``θ_g``; collective there).
    """
    rebound = []
    for g, buf in zip(engine.groups, committed_buffers(engine)):
        if buf is not g.flat:
            rebound.append((g, g.flat))
            g.bind(buf)
    try:
        yield
    finally:
        for g, own in rebound:
            g.bind(own)
        engine.schedule.rebind()  # in a streaming phase the replica lives in the fragment buffers, not the groups'


class CommittedStateDict:
    """A state-dict post-hook on ``module``: trained parameters come out as committed values.

    Entries are views of the engine's buffers, like stock ``state_dict()`` entries are views of the live parameters;
    ``keep_vars=True`` calls (which ask for the ``nn.Parameter`` objects themselves) are left alone. :meth:`suspended`
    turns the substitution off, for a checkpoint that must hold the compute parameters to resume exactly.
    """

    def __init__(self, module: nn.Module, engine: RoundEngine):
        self.engine = engine
        self._suspended = 0
        names = {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}
        self._entries = [
            [(names[id(p)], j) for j, p in enumerate(g.params) if id(p) in names] for g in engine.groups
        ]
        # a plain function: torch marks the hook object, which a bound method does not allow
        self._handle = module.register_state_dict_post_hook(lambda *args: self._hook(*args))

    def _hook(self, module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        if self._suspended or self.engine.closed:
            return
        buffers = committed_buffers(self.engine)
        for g, buf, entries in zip(self.engine.groups, buffers, self._entries):
            # Even where ``buf`` is the compute buffer: the entries were taken before this hook ran, and a rank that
            # was a round behind swapped that round in above (the adaptive policy's catch-up, rounds/alignment.py),
            # so they may still view the buffer it replaced (zeroed by the swap and reused as an accumulator).
            views = g.layout.views(buf)
            for name, j in entries:
                key = prefix + name
                if key in state_dict and not isinstance(state_dict[key], nn.Parameter):
                    state_dict[key] = views[j].detach()

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    def remove(self) -> None:
        self._handle.remove()
