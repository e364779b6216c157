"""docs/gpu.md's table: the operations a round's optimizer step issues on an accelerator, elementwise against
torch's fused kernel (``python -m benchmarks.round_launches``; its raw file under bench_results/round_launches/)."""

from __future__ import annotations

import json
import os

from . import sets as rs
from .cells import span

RAW = os.path.join("bench_results", "round_launches", "round_launches.json")


def round_launches() -> str:
    from benchmarks.round_launches import table

    with open(os.path.join(rs.ROOT, RAW), encoding="utf-8") as f:
        result = json.load(f)
    return (table(result["rows"]) + f"\n\n`{result['command']}` (torch {result['torch']}; raw file: "
            f"[{os.path.basename(RAW)}](../{RAW}))")


IN_FLIGHT = os.path.join("bench_results", "gpu_overlap", "h200_world1_fused_kernel_ab")
"""One H200 call (world size 1) at 7c254e7: the fused kernel against the elementwise rule at the bed's micro-batch
(``ab/``: the baseline tree is this one with ``nokernel.patch``), and this tree at four times the micro-batch
(``mb32/``)."""
SWAP_VIEWS = os.path.join("bench_results", "gpu_overlap", "h200_world1_swap_views")
"""A later call of the same session at 51afdb2 (the swap's views cut once per buffer, the round's gradients-ready
stage): one run of acco fixed at each micro-batch."""
TREES = ((IN_FLIGHT, "7c254e7"), (SWAP_VIEWS, "51afdb2"))


def in_flight_rows(folder: str = IN_FLIGHT) -> list[dict]:
    """Every run's figures, recomputed from its round records and step log (:func:`benchmarks.gpu_overlap.figures`)."""
    from benchmarks.gpu_overlap import figures, run_tag
    from benchmarks.sweep.parse import read_jsonl

    rows = []
    for sub in sorted(os.listdir(os.path.join(rs.ROOT, folder))):
        path = os.path.join(rs.ROOT, folder, sub)
        if not os.path.isfile(os.path.join(path, "gpu_overlap.json")):
            continue
        with open(os.path.join(path, "gpu_overlap.json"), encoding="utf-8") as f:
            result = json.load(f)
        for r in result["rows"]:
            tag = os.path.join(path, run_tag(r["config"], r["repeat"], baseline=r["tree"] == "baseline"))
            row = {"config": r["config"], "repeat": r["repeat"], "micro_batch": result["args"]["micro_batch"],
                   "adam": "elementwise" if r["tree"] == "baseline" else "fused kernel", "device": result["device"]}
            row.update(figures(r["config"], read_jsonl(tag + ".telemetry.jsonl.rank0"),
                               read_jsonl(tag + ".steps.jsonl"), result["args"]["warmup"]))
            row["step_ratio"] = row["s_per_step_late"] / row["s_per_step_sync"]
            rows.append(row)
    return rows


def in_flight_summary(rows: list[dict]) -> dict:
    """The page's claims, as numbers: the ratios by micro-batch (this tree), and the kernel's paired differences."""
    out: dict = {}
    for mb in sorted({r["micro_batch"] for r in rows}):
        mine = [r for r in rows if r["micro_batch"] == mb and r["adam"] == "fused kernel"]
        out[mb] = {k: [r[k] for r in mine] for k in ("in_flight_ratio", "in_flight_ratio_host", "step_ratio")}
    pairs = [(a, b) for a in rows for b in rows if a["adam"] == "fused kernel" and b["adam"] == "elementwise"
             and (a["config"], a["repeat"], a["micro_batch"]) == (b["config"], b["repeat"], b["micro_batch"])]
    out["kernel"] = {k: [a[k] / b[k] for a, b in pairs] for k in ("s_per_step_sync", "s_per_step_late")}
    return out


def in_flight() -> str:
    """docs/gpu.md's table of what a round in flight costs compute on a GPU, and its summary line."""
    rows, later = in_flight_rows(), in_flight_rows(SWAP_VIEWS)
    lines = ["| tree | micro-batch | config | Adam in the round | run | compute ms/mb, sync | with a round in flight "
             "| ratio | from the host's time alone | s/step, sync | overlapped | overlapped over sync |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for tree, r in [(TREES[0][1], r) for r in rows] + [(TREES[1][1], r) for r in later]:
        lines.append(f"| {tree} | {r['micro_batch']} | {r['config']} | {r['adam']} | {r['repeat']} | "
                     f"{r['compute_ms_per_mb_sync']:.2f} | {r['compute_ms_per_mb_overlapped']:.2f} | "
                     f"{r['in_flight_ratio']:.3f} | {r['in_flight_ratio_host']:.3f} | {r['s_per_step_sync']:.4f} | "
                     f"{r['s_per_step_late']:.4f} | {r['step_ratio']:.3f} |")
    s = in_flight_summary(rows)
    small, large = min(k for k in s if k != "kernel"), max(k for k in s if k != "kernel")
    lines += ["", f"{rows[0]['device']}, medium GPT (sequences of 512), world size 1. With the fused kernel, a round "
              f"in flight cost compute per micro-batch **{span(s[large]['in_flight_ratio'])}x** at {large} sequences "
              f"a micro-batch (the device the bottleneck; {span(s[large]['in_flight_ratio_host'])}x from the host's "
              f"time alone) and {span(s[small]['in_flight_ratio'])}x at {small} (the host the bottleneck). An "
              f"overlapped step took {span(s[large]['step_ratio'])} of a sync step's time at {large} and "
              f"{span(s[small]['step_ratio'])} at {small}. The fused kernel against the elementwise rule, run for "
              f"run: sync steps {span(s['kernel']['s_per_step_sync'], '.2f')} of the time, overlapped steps "
              f"{span(s['kernel']['s_per_step_late'], '.2f')}.",
              "", f"At {TREES[1][1]} (a swap's views cut once per buffer; the round's `gradients ready` stage read "
              f"directly), one run of acco fixed at each micro-batch: counted whole "
              + ", ".join(f"{r['in_flight_ratio']:.3f}x at {r['micro_batch']}" for r in later)
              + "; an overlapped step "
              + ", ".join(f"{r['step_ratio']:.3f} of a sync step at {r['micro_batch']}" for r in later) + ".",
              "", "`python -m benchmarks report` (raw files: "
              + ", ".join(f"[{os.path.basename(f)}/](../{f}/)" for f, _ in TREES) + ")"]
    return "\n".join(lines)
