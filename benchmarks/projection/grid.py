"""The scenario past this machine and its table: 64 to 512 GPUs in 8-GPU nodes, 1 to 100 Gbit/s node links, a 1B
and a 7B model; each method's seconds per step and projected time to a loss, relative to sync fp32.

Why these assumptions and where each comes from is in :data:`ASSUMPTIONS` (the page prints them): the compute
is assumed (an H100 at a stated MFU), the round's GPU costs and the link's efficiency are fitted (:mod:`.fit`), the
latency per algorithm step is assumed (the beds' figure is gloo on one core per host, not a fabric's), and the
convergence penalties are the 2-worker beds' tokens to a loss, an assumption at scale.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from . import model as m

GPUS = (64, 128, 256, 512)
LINKS_GBIT = (1, 10, 25, 100)
MODELS = {"1B": 1e9, "7B": 7e9}
GPUS_PER_NODE = 8
PEAK_FLOPS = 989e12
"""H100 SXM dense bf16."""
MFU = 0.4
TOKENS_PER_MICRO_BATCH = 8 * 2048
GRAD_ACCUM = 4
HOP_S = 50e-6
"""Latency per algorithm step on a fabric (an inter-node NCCL step, order of magnitude; not measured here)."""
GPU_MEMORY = 80e9
DS_ACCO = ("sync_lowbit", "acco_fixed", "acco_adaptive", "streaming")
"""ds_acco's own modes; sync fp32 stands for stock ZeRO-1 (its reference), torchft's rows for the peer."""
PRESET = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ds_configs",
                      "auto_lowbit_streaming.json")


def micro_batch_s(params: float) -> float:
    """``6 P`` FLOPs per token (forward and backward), at ``MFU`` of the peak."""
    return 6 * params * TOKENS_PER_MICRO_BATCH / (PEAK_FLOPS * MFU)


def preset_schedule(path: str = PRESET) -> m.Schedule:
    with open(path, encoding="utf-8") as f:
        return m.Schedule.from_preset(json.load(f)["acco"])


@dataclass(frozen=True)
class Cell:
    model: str
    gpus: int
    gbit: int
    steps: dict
    """``{method: model.Step}``."""
    penalty: dict
    fits: dict
    """``{method: state fits in GPU_MEMORY}`` (activations left out: optimistic)."""

    def time_to_loss(self, method: str) -> float:
        """Seconds per micro-batch times the tokens the method needs over sync fp32's (the same tokens per
        micro-batch everywhere, so a micro-batch is a fixed number of tokens)."""
        return self.steps[method].per_micro_batch * self.penalty_of(method)

    def penalty_of(self, method: str) -> float:
        """The method's measured penalty, but acco adaptive's no lower than acco fixed's where its commits are sync's
        batch or larger: its tokens were measured at commits smaller than sync's (a smaller batch needs fewer
        tokens to a loss, which its penalty below 1 is), and a larger batch never needs fewer, so at the batches it
        takes here acco fixed's (the same delay at sync's batch) is a lower bound."""
        p = self.penalty.get(method, 1.0)
        if method == "acco_adaptive" and self.adaptive_batch() >= 1.0:
            p = max(p, self.penalty.get("acco_fixed", 1.0))
        return p

    def adaptive_batch(self) -> float:
        """Acco adaptive's micro-batches per commit over sync's."""
        return self.steps["acco_adaptive"].micro_batches / self.steps["sync_fp32"].micro_batches

    def ratio(self, method: str, loss: bool) -> float:
        """Over sync fp32's: seconds per micro-batch (a step's, whatever its batch), or time to the loss."""
        f = self.time_to_loss if loss else (lambda x: self.steps[x].per_micro_batch)
        return f(method) / f("sync_fp32")

    def winner(self, methods=m.METHODS) -> str:
        return min((x for x in methods if self.fits[x]), key=self.time_to_loss)


def penalties(fitted: dict) -> dict:
    """The measured 2-worker penalties; a torchft row that did not run takes ds_acco streaming's."""
    p = dict(fitted["penalties"])
    for peer in ("torchft_diloco", "torchft_streaming"):
        p.setdefault(peer, p.get("streaming", 1.0))
    return p


def gpu_costs(fitted: dict) -> m.Costs:
    g = fitted["gpu"]
    return m.Costs(g["round_host_s"], g["round_s_per_elem"], g["inner_s_per_elem"], g["slowdown"])


def cell(fitted: dict, model: str, gpus: int, gbit: int, topology: str = m.FLAT,
         schedule: m.Schedule = None) -> Cell:
    params = MODELS[model]
    job = m.Job(params, gpus, (micro_batch_s(params),), GRAD_ACCUM)
    link = m.Link(gbit * 1e9, fitted["cpu"]["efficiency"], HOP_S, GPUS_PER_NODE, topology)
    steps = m.steps(job, link, gpu_costs(fitted), schedule or preset_schedule())
    fits = {x: m.state_bytes(x, params, gpus, GPUS_PER_NODE) <= GPU_MEMORY for x in m.METHODS}
    return Cell(model, gpus, gbit, steps, penalties(fitted), fits)


def table(fitted: dict, topology: str = m.FLAT) -> list[Cell]:
    sched = preset_schedule()
    return [cell(fitted, mod, n, g, topology, sched) for mod in MODELS for n in GPUS for g in LINKS_GBIT]


def ASSUMPTIONS(fitted: dict) -> list[str]:  # noqa: N802 - a table of stated assumptions, named as one
    g, c = fitted["gpu"], fitted["cpu"]
    sched = preset_schedule()
    return [
        f"Compute: an H100 at {MFU:.0%} MFU of {PEAK_FLOPS / 1e12:.0f} TFLOP/s (bf16 dense), 6 P FLOPs per token, "
        f"{TOKENS_PER_MICRO_BATCH:,} tokens per micro-batch, {GRAD_ACCUM} micro-batches per GPU per step (sync's "
        f"batch): {micro_batch_s(1e9):.3f} s (1B) and {micro_batch_s(7e9):.3f} s (7B) per micro-batch. Assumed.",
        f"Nodes of {GPUS_PER_NODE} GPUs; the link is each node's, each direction; collectives as ds_acco runs them "
        "today: one flat group over every rank (a low-bit reduce-scatter is an all-to-all: 8 times a ring's bytes "
        "on a node's link). Assumed (the code's).",
        f"Link efficiency {c['efficiency']:.3f} of the line rate: fitted on the CPU beds (TCP over shaped links).",
        f"Latency {HOP_S * 1e6:.0f} us per algorithm step (flat rings: N-1 steps). Assumed: the beds' "
        f"{c['hop_s'] * 1e3:.1f} ms is gloo on one core per host, not a fabric's.",
        f"A round's GPU cost: h = {g['round_host_s'] * 1e3:.1f} ms, e = {g['round_s_per_elem'] * 1e12:.0f} ps per "
        f"element, inner optimizer {g['inner_s_per_elem'] * 1e12:.0f} ps per element, compute {g['slowdown']:.2f}x "
        f"slower with a round in flight: fitted on an H200 session at world size 1 and {g['params'] / 1e6:.1f} M "
        f"parameters; h and e at the bed's micro-batch (launch-bound kernels: e is an upper bound for a 7B model), k "
        f"counted whole at {g['slowdown_micro_batch']} sequences a micro-batch, where the device paces the step as "
        f"it does at 1B and 7B (docs/gpu.md).",
        f"Streaming and the adaptive cap as the shipped preset: {sched.fragments} fragments, H = {sched.sync_every}, "
        f"tau = {sched.overlap_steps}, at most {sched.max_micro_batches_per_round} micro-batches per round.",
        convergence(fitted),
        f"Memory: a method whose training state (activations left out) exceeds {GPU_MEMORY / 1e9:.0f} GB per GPU is "
        "marked and cannot win (ds_acco streaming keeps a full fp32 replica and its inner Adam on every GPU: 20 P).",
    ]


def convergence(fitted: dict) -> str:
    """The penalties' assumption: where they were measured, at what batch, and what the short runs said."""
    def listed(p: dict) -> str:
        return ", ".join(f"{m.LABELS[k]} {v:.2f}" for k, v in p.items())
    long = fitted.get("penalties_long") or {}
    head = ("Convergence: tokens to the fair baseline's loss at 75% of its budget over sync fp32's, measured at 2 "
            "workers on a 3.3 M-parameter GPT")
    tail = ("An assumption at 64-512 GPUs and 1-7B parameters: the penalty of a delayed or infrequent update is known "
            "to grow with the number of workers.")
    if not long:
        return f"{head} on the short runs ({listed(fitted['penalties'])}; torchft's in the same sweeps). {tail}"
    b = long["batches"]
    ratio = [b["acco_adaptive"][k] / b["sync_fp32"][k] for k in b.get("acco_adaptive", {})
             if b["acco_adaptive"][k] and b["sync_fp32"].get(k)]
    adaptive = (f"Acco adaptive's tokens were measured at commits of {min(ratio):.2f}-{max(ratio):.2f}x sync's batch; "
                "where its commits here are sync's batch or larger it is charged acco fixed's penalty instead, a lower "
                "bound (a larger batch never needs fewer tokens). " if ratio else "")
    return (f"{head} on the long runs (the rate warmed up and decayed to 0; 100 steps on real compute, 300 on the "
            "sleep bed; at 100 Mbit/s, each bed's median over its seeds, the two beds averaged): "
            f"{listed(fitted['penalties'])}; torchft's in the same sweeps. The short runs, at a constant rate, gave "
            f"{listed(fitted['penalties_short'])}. {adaptive}{tail}")
