"""Workers for the ``mode: "auto"`` tests: the tiny exactness job with a link whose speed a test changes.

Compute and the link take the times a test sets (tests/sim_clock.py): on a simulated clock by default, so
auto's figures are exact and its choices the same on a busy machine; on real time (sleeps) for the
end-to-end test on a real link. The link's time is added where a round really waits, as it enters its
reduce-scatter (the engine's ``on_stage`` hook). Both ranks read the same schedule, indexed by the
optimizer step at the round's launch.
"""

from __future__ import annotations

import logging

import torch

from ds_acco.reference import ReferenceRun, reference_schedule
from tests import workloads as W
from tests.sim_clock import SimBed, WallBed


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        if "ds_acco auto" in record.getMessage():
            self.lines.append(record.getMessage())


def train_auto(rank, world, *, G, compute_s, link, steps, config, device="cpu", roundtrip=False, startup_s=0.0,
               hid=W.HID, real_time=False):
    """Train ``steps`` optimizer steps; ``link`` is ``[(from_step, seconds per round), ...]``; ``compute_s``
    is the compute per micro-batch (one per rank, or one for all), ``startup_s`` more in the first (start-up);
    ``roundtrip``: save the round state at the end
    and load it back into the engine, returning the saved mode and policy and what the load restored; ``hid``: the
    model's hidden width; ``real_time``: sleeps on the wall clock instead of the simulated clock."""
    from ds_acco import plain

    bed = (WallBed if real_time else SimBed)(link)
    handler = _Lines()
    log = logging.getLogger("ds_acco")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    model = W.make_model(hid=hid).to(device)
    engine = plain.build(W.param_groups(model), torch.optim.AdamW, W.OPT_KWARGS, config=config,
                         gradient_accumulation_steps=G, on_stage=bed.on_stage, model=model, clock=bed.clock)
    bed.attach(engine)
    trajectory, k, global_params = [], 0, None
    try:
        while engine.commits < steps:
            x, y = (t.to(device) for t in W.batch(rank, k))
            k += 1
            bed.compute((compute_s[rank] if isinstance(compute_s, (list, tuple)) else compute_s) +
                        (startup_s if k == 1 else 0))
            W.loss_fn(model(x), y).backward()
            before = engine.commits
            engine.after_micro_batch()
            if engine.commits > before:
                trajectory.append([p.detach().float().cpu().clone() for p in W.ordered_params(model)])
        if engine.phase is not None:  # θ_g in the groups' layout (collective: every rank)
            from ds_acco.rounds.committed import committed_buffers

            global_params = [t.clone() for t in committed_buffers(engine)]
        if roundtrip:
            saved = engine.state_dict()
            engine.wait()  # a resume starts from an idle engine
            engine.state.mode, engine.state.policy, engine.state.step_quota = "sync", "fixed", 0
            engine.load_state_dict(saved)
            roundtrip = {"saved": (saved["mode"], saved["policy"]), "loaded": (engine.mode, engine.state.policy),
                         "step_quota": (saved["step_quota"], engine.state.step_quota)}
    finally:
        engine.close()
        log.removeHandler(handler)
    commits = [r for r in engine.telemetry.records if r.kind == "commit"]
    return {"trajectory": trajectory, "modes": [r.mode for r in commits],
            "counts": [r.counts for r in engine.telemetry.records], "choices": engine.auto.choices,
            "lines": handler.lines, "roundtrip": roundtrip, "global": global_params,
            "commit_bytes": engine.auto.commit_bytes, "piece_bytes": engine.coll.piece_bytes,
            "per_round": engine.startup_fields()["micro_batches_per_round"],
            "fragments": [(r.step, r.fragment, r.applied_step)
                          for r in engine.telemetry.records if r.kind == "fragment"]}


def auto_reference(modes, counts=None, G=4):
    """The reference for the modes a run chose, step by step (2 workers, ``G`` micro-batches each)."""
    model = W.make_model()
    ref = ReferenceRun(W.ordered_params(model), W.reference_grad_fn(model), W.make_reference_optimizer, 2)
    return reference_schedule(ref, modes, G, counts=counts)


def figures(c_ms, round_ms, step_ms, c_acco_ms=0.0, wire=0.0):
    """Auto's figures (``ds_acco.rounds.auto.choice.FIGURES``), one row per rank: ``c_ms`` each rank's compute per
    micro-batch in sync, in acco (0: not measured), a round and a nominal step measured in the running mode, all in
    ms, and the wire factor (0: not measured)."""
    return [[int(c * 1e3), int(c_acco_ms * 1e3), int(round_ms * 1e3), int(step_ms * 1e3), int(wire * 1e3)]
            for c in c_ms]
