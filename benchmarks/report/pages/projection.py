"""The projection table: what the step model ``mode: auto`` uses predicts, against a round's length.

Why the library's own model (:func:`ds_acco.rounds.auto.choice.choose`) and not a formula written here: the
table then says what auto would do, and a change to the model changes the table (and fails the docs test
until the page is regenerated). Inputs, per row: a step's compute ``C`` (1), a commit round's time ``x·C``
on the wire, an estimate round at int4's share of a commit's bytes, and the compute slowdown ``k`` while a
round is in flight. Two slowdowns: 1 (compute untouched by the round, as with a GPU's copy engine) and the
median the CPU beds measured for acco fixed. Beside each measured bed: what it measured, acco fixed's
seconds per step over sync low-bit's. The model leaves out the adaptive policy and the gradient noise
scale; it is the fixed policy's step, delay penalty and streaming threshold as the shipped preset sets them.
"""

from __future__ import annotations

import json
import os

from ds_acco.config import AccoConfig
from ds_acco.rounds.auto.choice import STREAMING_HINT, choose

from . import sets as rs
from .cells import bed_name, md_table

G = 4
"""Micro-batches per worker per step, as on the beds (the model's ratios do not depend on it)."""
MODEL_ONLY = (0.5, 1.5, 2.0, 3.0)
"""Round lengths (in steps of compute) no bed measured, shown from the model alone."""


def preset() -> AccoConfig:
    """The shipped preset's block (``ds_configs/auto_lowbit_streaming.json``), with the fixed policy."""
    with open(os.path.join(rs.ROOT, "ds_configs", "auto_lowbit_streaming.json"), encoding="utf-8") as f:
        block = json.load(f)["acco"]
    block.update(mode="auto", policy="fixed")
    block.pop("max_micro_batches_per_round", None)
    return AccoConfig(**{k: v for k, v in block.items() if k != "telemetry"})


def estimate_fraction(config: AccoConfig) -> float:
    """An int4 estimate's bytes over an int8 commit's: half the payload, the same fp32 scale per block."""
    scale = 4 / config.quantization_block_size
    return (0.5 + scale) / (1 + scale)


def predict(x: float, k: float, config: AccoConfig) -> tuple[float, float, str]:
    """``(sync step, acco fixed step, what auto runs)`` in steps of compute, from auto's own model."""
    c_us = 1e6 / G
    R_us = x * 1e6
    figures = [[round(c_us), round(k * c_us), round(R_us), round(G * c_us + R_us), 1000]] * 2
    choice = choose(figures, "sync", config, G, step=2, estimate_fraction=estimate_fraction(config), streaming=True)
    figs = choice.figures
    return figs["sync_step_ms"] / 1e3, figs["acco_step_ms"] / 1e3, choice.mode


def _measured_k(set_name: str) -> float:
    ratios = [r["compute_ratio"] for key in rs.beds_of(set_name) if key[0].startswith("real") and "%" not in key[0]
              if (r := rs.row(set_name, *key, "acco_lowbit_int4_fixed")) and r["compute_ratio"]]
    return rs.median(ratios) or 1.0


def projection_rows(set_name: str = "five_beds") -> str:
    config = preset()
    k_cpu = _measured_k(set_name)
    points = []
    for key in rs.beds_of(set_name):
        if "%" in key[0]:
            continue  # a slow host is not a round-length question
        low, fix = rs.row(set_name, *key, "sync_lowbit"), rs.row(set_name, *key, "acco_lowbit_int4_fixed")
        share = rs.median(low["round_share"]) if low else None
        if share and fix and fix["s_per_step"] and low["s_per_step"]:
            points.append((share, f"{fix['s_per_step'] / low['s_per_step']:.2f} ({bed_name(key)})"))
    points += [(v, "not measured") for v in MODEL_ONLY]
    rows = []
    for share, measured in sorted(points):
        sync1, acco1, runs1 = predict(share, 1.0, config)
        syncc, accoc, runsc = predict(share, k_cpu, config)
        rows.append([f"{share:.2f}", f"{acco1 / sync1:.2f}", runs1, f"{accoc / syncc:.2f}", runsc, measured])
    head = ["a round / a step's compute", "acco fixed / sync, per step (compute untouched)", "auto runs",
            f"the same, compute {k_cpu:.2f}x slower with a round in flight (the CPU beds)", "auto runs",
            "measured: acco fixed / sync low-bit, per step (bed)"]
    return md_table(head, rows) + (
        f"\n\nauto runs: the mode auto's model picks with the preset's {config.auto.acco_step_penalty:.0%} delay "
        f"penalty and {config.auto.switch_margin:.0%} switch margin; `streaming` where the best gradient mode costs "
        f"{STREAMING_HINT}x a step's compute or more (with `auto.streaming`). Estimate rounds at "
        f"{estimate_fraction(config):.2f} of a commit's bytes (int4).")
