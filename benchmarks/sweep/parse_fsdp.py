"""One result row of an FSDP2 run, from the ``fsdp_rank<r>.json`` each host's ``examples.train_lm_fsdp`` writes.

The records are :class:`examples.run_record.RunRecorder`'s: per optimizer step the wall and training
time, the micro-batch index and the interface byte counters; the validation points; the round
telemetry (ds_acco) or the counted FSDP2 collectives (stock).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Optional

from benchmarks.cluster.units import format_rate, parse_rate

from . import configs as cfgs
from .parse import read_json
from .specs import RunSpec

FIRST_STEP = 4
"""Steady-state window starts at this step: after ds_acco's 2 sync warmup steps and the round bootstrap."""


def parse_fsdp_run(spec: RunSpec, run_dir: str, rc: int, wall_s: float, load: Optional[dict] = None) -> dict:
    """The row of one FSDP2 run (the same identifying keys as :func:`benchmarks.sweep.parse.parse_run`'s)."""
    wl = spec.workload
    ranks = [read_json(os.path.join(run_dir, f"fsdp_rank{r}.json")) for r in range(spec.hosts)]
    row = {"id": spec.run_id, "scenario": spec.scenario, "config": spec.config, "label": cfgs.LABELS[spec.config],
           "hosts": spec.hosts, "rate": format_rate(parse_rate(spec.rate)), "rate_bit_s": parse_rate(spec.rate),
           "cpu_quota": {f"host{i}": q for i, q in spec.cpu_quota}, "note": spec.note,
           "workload": dataclasses.asdict(wl), "exit_code": rc, "wall_s": round(wall_s, 2), "load": load,
           "ok": rc == 0 and all(ranks)}
    if row["ok"]:
        row.update(figures(ranks, tokens_per_micro_batch=wl.micro_batch * wl.seq_len))
    return row


def figures(ranks: list[dict], tokens_per_micro_batch: int) -> dict:
    """Steady-state tokens/s and steps/s, bytes and collectives per step, the validation curve."""
    tokens_s, steps_s, tx, step_s = 0.0, [], [], []
    for rec in ranks:
        steps = [s for s in rec["steps"] if s["step"] >= FIRST_STEP]
        steps = steps if len(steps) >= 2 else rec["steps"]  # an adaptive run's few large commits
        a, b = steps[0], steps[-1]
        dt = b["train_s"] - a["train_s"]
        tokens_s += (b["micro_batch_index"] - a["micro_batch_index"]) * tokens_per_micro_batch / dt
        steps_s.append((b["step"] - a["step"]) / dt)
        step_s.append(dt / (b["step"] - a["step"]))
        tx.append((b["tx_bytes"] - a["tx_bytes"]) / (b["step"] - a["step"]))
    r0 = ranks[0]
    steps_done = r0["steps"][-1]["step"]
    out = {"tokens_per_s": tokens_s, "steps_per_s": statistics.mean(steps_s), "step_s": statistics.mean(step_s),
           "iface_tx_bytes_per_step": statistics.mean(tx), "units": r0["fsdp_units"], "params": r0["fsdp_params"],
           "evals": r0["evals"], "steps": steps_done}
    if r0["stock"]:
        calls = r0["torch_calls"]
        # FSDP2's own: all-gathers and reduce-scatters per optimizer step (its clip norm is a DTensor reduction)
        out["collectives_per_step"] = (calls["all_gather_single"] + calls["reduce_scatter_single"]) / steps_done
    else:
        out["collectives_per_round"] = r0["round_calls"] / r0["rounds"]
        out["gloo_calls_per_round"] = r0.get("round_pieces", r0["round_calls"]) / r0["rounds"]  # paced pieces
        out["piece_bytes"] = r0.get("piece_bytes")
        out["rounds_per_step"] = r0["rounds"] / steps_done
        out["ring_bytes_per_step"] = r0["ring_bytes_sent"] / steps_done
        out["hidden_pct"] = r0["summary"].get("comm_hidden_pct")
        commits = [c for c in r0["counts"]]
        out["micro_batches_per_round"] = statistics.mean(sum(c) for c in commits) if commits else None
        # median training-thread compute between two swaps (the first rounds include start-up)
        out["compute_s_per_round"] = statistics.median(r0["compute_s"][2:] or r0["compute_s"])
    return out


