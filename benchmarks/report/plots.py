"""PNG plots of a results document (matplotlib, Agg backend: no display needed).

* ``tokens_vs_bandwidth.png``: tokens/s per config against link rate, and the
  exposed communication share of the step;
* ``loss_vs_tokens.png``: training loss (smoothed) and held-out validation loss
  against global tokens;
* ``loss_vs_wallclock.png``: training loss against training time, at the slowest
  link and (convergence runs) unshaped;
* ``timeline.png``: per-round compute / wait / communication timeline of rank 0
  and rank 1, reconstructed from the round telemetry, for ds_acco ``sync`` and
  ``acco adaptive`` on the same link;
* ``memory.png``: measured peak-RSS growth per worker against the analytic model;
* ``time_to_loss.png``: validation loss against training seconds per link rate, the
  ``time_to_loss`` part (:mod:`benchmarks.report.time_to_loss`);
* ``streaming_loss_vs_tokens.png`` / ``streaming_bytes.png``: the ``streaming`` part
  (Streaming DiLoCo against ZeRO-1 and acco on one slow link), see
  :mod:`benchmarks.report.streaming`.
"""

from __future__ import annotations

import os
from typing import Optional

from benchmarks.sweep.configs import CONFIGS, LABELS

from . import fsdp, time_to_loss
from .curves import UNSHAPED, rates_in_order, val_points
from .streaming import streaming_table

COLORS = {"zero1": "#444444", "zero1_overlap": "#999999", "sync": "#1f77b4", "dpu": "#2ca02c",
          "acco_fixed": "#ff7f0e", "acco_adaptive": "#d62728", "zero1_bf16": "#8c564b", "streaming_int8": "#9467bd",
          "streaming_fp32": "#17becf", "sync_lowbit": "#aec7e8", "acco_lowbit_fixed": "#e377c2",
          "acco_lowbit_adaptive": "#bcbd22", "acco_lowbit_int4_fixed": "#f7b6d2",
          "acco_lowbit_int4_adaptive": "#dbdb8d"}
MARKERS = {"zero1": "s", "zero1_overlap": "D", "sync": "^", "dpu": "v", "acco_fixed": "o", "acco_adaptive": "*",
           "zero1_bf16": "P", "streaming_int8": "X", "streaming_fp32": "x", "sync_lowbit": "<",
           "acco_lowbit_fixed": "h", "acco_lowbit_adaptive": "p", "acco_lowbit_int4_fixed": "H",
           "acco_lowbit_int4_adaptive": "d"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ok(result: dict, scenario: str) -> list[dict]:
    return [r for r in result["runs"] if r.get("ok") and r["scenario"] == scenario]


def _smooth(ys: list[float], alpha: float = 0.3) -> list[float]:
    out, s = [], None
    for y in ys:
        s = y if s is None else alpha * y + (1 - alpha) * s
        out.append(s)
    return out


def _title(result: dict, text: str) -> str:
    m = result.get("machine", {})
    return f"{text}\n({m.get('cpus', '?')} CPUs, {'netns' if result.get('netns') else 'loopback'}, sweep {result.get('sweep')})"


def tokens_vs_bandwidth(result: dict, path: str) -> Optional[str]:
    runs = _ok(result, "bandwidth")
    if not runs:
        return None
    plt = _plt()
    rates = rates_in_order(runs)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for cfg in CONFIGS:
        pts = [(i, r) for i, rate in enumerate(rates) for r in runs if r["config"] == cfg and r["rate"] == rate]
        if not pts:
            continue
        kw = dict(color=COLORS[cfg], marker=MARKERS[cfg], label=LABELS[cfg])
        ax.plot([i for i, _ in pts], [r["tokens_per_s"] for _, r in pts], **kw)
        share = [(i, r.get("comm_frac")) for i, r in pts if r.get("comm_frac") is not None]
        if share:
            ax2.plot([i for i, _ in share], [100 * v for _, v in share], **kw)
    for a in (ax, ax2):
        a.set_xticks(range(len(rates)))
        a.set_xticklabels(rates)
        a.set_xlabel("link rate per host (each direction)")
        a.grid(alpha=0.3)
    ax.set_ylabel("tokens/s (all workers)")
    ax.set_ylim(bottom=0)
    ax.set_title("throughput")
    ax2.set_ylabel("% of step (train_s)")
    ax2.set_ylim(-2, 102)
    ax2.set_title("exposed communication\n(ZeRO-1: 1 - compute/step; ds_acco: training-thread wait)", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(_title(result, "tokens/s vs link bandwidth"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _curve_runs(result: dict) -> list[dict]:
    runs = _ok(result, "convergence")
    return runs or [r for r in _ok(result, "bandwidth") if r["rate"] == UNSHAPED]


def loss_vs_tokens(result: dict, path: str) -> Optional[str]:
    return _loss_vs_tokens(result, _curve_runs(result), path)


def streaming_loss_vs_tokens(result: dict, path: str) -> Optional[str]:
    """The ``streaming`` part: Streaming DiLoCo against ZeRO-1 and acco on one slow link."""
    return _loss_vs_tokens(result, _ok(result, "streaming"), path, wallclock=True)


def _loss_vs_tokens(result: dict, runs: list[dict], path: str, wallclock: bool = False) -> Optional[str]:
    """Training and validation loss against tokens (and, with ``wallclock``, against training time)."""
    if not runs:
        return None
    plt = _plt()
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, 3 if wallclock else 2, figsize=(16 if wallclock else 11, 4.2))
    ax, ax2 = axes[0], axes[1]
    for r in runs:
        cfg = r["config"]
        c = [p for p in r["curve"] if p.get("loss") is not None]
        if c:
            ax.plot([p["tokens"] for p in c], _smooth([p["loss"] for p in c]), color=COLORS[cfg], label=LABELS[cfg])
        v = val_points(r)
        if v:
            ax2.plot([t for t, _ in v], [y for _, y in v], color=COLORS[cfg], marker=MARKERS[cfg], label=LABELS[cfg])
    ax.set_title("training loss (rank 0, smoothed)")
    ax2.set_title("held-out validation loss")
    ref = next((r for r in runs if r["config"] == "zero1"), runs[0])
    ref_vals = [y for _, y in val_points(ref)] + [p["loss"] for p in ref["curve"] if p.get("loss") is not None][:1]
    if ref_vals:  # keep a diverging run from squashing the others
        ax.set_ylim(top=1.1 * max(ref_vals))
        ax2.set_ylim(top=1.3 * max(y for _, y in val_points(ref)) if val_points(ref) else None)
    for a in (ax, ax2):
        a.set_xlabel("tokens (all workers)")
        a.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1e3:.0f}k"))
    if wallclock:
        ax3 = axes[2]
        for r in runs:
            c = [p for p in r["curve"] if p.get("loss") is not None and p.get("train_s") is not None]
            if c:
                ax3.plot([p["train_s"] for p in c], _smooth([p["loss"] for p in c]), color=COLORS[r["config"]],
                         label=LABELS[r["config"]])
        ax3.set_title("training loss against training time (rank 0)")
        ax3.set_xlabel("seconds of training (evaluation excluded)")
        if ref_vals:
            ax3.set_ylim(top=1.1 * max(ref_vals))
    for a in axes:
        a.set_ylabel("loss (nats/byte)")
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    scen = runs[0]["scenario"]
    wl = runs[0]["workload"]
    link = f", {runs[0]['rate']}" if scen == "streaming" else ""
    fig.suptitle(_title(result, f"loss vs tokens: {wl['model_size']} model, seq {wl['seq_len']}, {scen} runs{link}"),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def loss_vs_wallclock(result: dict, path: str) -> Optional[str]:
    bw = _ok(result, "bandwidth")
    rates = rates_in_order(bw)
    panels = []
    if rates:
        panels.append((f"bandwidth runs at {rates[-1]}", [r for r in bw if r["rate"] == rates[-1]]))
    conv = _ok(result, "convergence")
    if conv:
        panels.append(("convergence runs (unshaped)", conv))
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (title, runs) in zip(axes[0], panels):
        for r in runs:
            c = [p for p in r["curve"] if p.get("loss") is not None and p.get("train_s") is not None]
            if c:
                ax.plot([p["train_s"] for p in c], _smooth([p["loss"] for p in c]), color=COLORS[r["config"]],
                        label=LABELS[r["config"]])
        ax.set_title(title)
        ax.set_xlabel("training time, s (rank 0, evaluation excluded)")
        ax.set_ylabel("training loss (smoothed)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(_title(result, "loss vs wall-clock"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def reconstruct(records: list[dict]) -> list[dict]:
    """Absolute intervals (s, rank-local clock) of each round from its telemetry record.

    The training thread alternates compute (``compute_s``) and wait (``waited_s``)
    between swaps. An overlapped round is launched at the previous swap (the engine
    swaps and launches in one call); a sync round when its wait starts. The first
    overlapped round after warmup was launched mid-compute at a time the telemetry
    does not record: it is drawn ending at its swap.
    """
    out, t, prev_swap, prev_mode = [], 0.0, None, None
    for rec in sorted(records, key=lambda r: r["index"]):
        c0, c1 = t, t + rec["compute_s"]
        swap = c1 + rec["waited_s"]
        if rec["mode"] == "sync":
            comm0 = c1
        elif prev_swap is not None and prev_mode != "sync":
            comm0 = prev_swap
        else:
            comm0 = max(c0, swap - rec["round_s"])
        out.append({"index": rec["index"], "kind": rec["kind"], "mode": rec["mode"], "counts": rec["counts"],
                    "compute": (c0, c1), "wait": (c1, swap), "comm": (comm0, comm0 + rec["round_s"])})
        t, prev_swap, prev_mode = swap, swap, rec["mode"]
    return out


def timeline(result: dict, path: str, max_rounds: int = 14) -> Optional[str]:
    bw = _ok(result, "bandwidth")
    rates = rates_in_order(bw)
    chosen = []
    for rate in reversed(rates):  # the slowest link where both runs exist
        pair = [next((r for r in bw if r["rate"] == rate and r["config"] == c and any(r.get("timeline") or [])), None)
                for c in ("sync", "acco_adaptive")]
        pair = [p for p in pair if p]
        if pair:
            chosen = pair
            break
    if not chosen:
        pool = [r for r in result["runs"] if r.get("ok") and any(r.get("timeline") or [])]
        chosen = pool[:1]
    if not chosen:
        return None
    plt = _plt()
    fig, axes = plt.subplots(len(chosen), 1, figsize=(11, 2.3 + 1.6 * len(chosen)), squeeze=False)
    colors = {"compute": "#4c9be8", "wait": "#e84c4c", "estimate": "#f5a623", "commit": "#7b5ea7", "sync": "#7b5ea7",
              "fragment": "#3aa655"}  # (auto's streaming phase: its fragment rounds after the switch)
    for ax, r in zip(axes[:, 0], chosen):
        rows, labels = [], []
        for rank, recs in enumerate(r["timeline"]):
            iv = reconstruct(recs)
            overlapped = [x for x in iv if x["mode"] != "sync"]
            sel = (overlapped or iv)[:max_rounds]
            if not sel:
                continue
            t0 = sel[0]["compute"][0]
            y = len(rows)
            for x in sel:
                ax.broken_barh([(x["compute"][0] - t0, x["compute"][1] - x["compute"][0])], (y * 2 + 1, 0.8),
                               color=colors["compute"])
                if x["wait"][1] > x["wait"][0]:
                    ax.broken_barh([(x["wait"][0] - t0, x["wait"][1] - x["wait"][0])], (y * 2 + 1, 0.8),
                                   color=colors["wait"])
                ax.plot([x["wait"][1] - t0] * 2, [y * 2 + 0.95, y * 2 + 1.85], color="black", lw=0.8)  # swap
                kind = "sync" if x["mode"] == "sync" else x["kind"]
                ax.broken_barh([(x["comm"][0] - t0, x["comm"][1] - x["comm"][0])], (y * 2 + 0.1, 0.8),
                               color=colors[kind], edgecolor="white")
                ax.text(x["comm"][0] - t0 + 0.005, y * 2 + 0.5, str(sum(x["counts"])), fontsize=6, va="center",
                        color="white")
            rows.append(rank)
            labels += [f"rank {rank} comm thread", f"rank {rank} training thread"]
        ax.set_yticks([i + 0.5 for i in range(2 * len(rows))])
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xlabel("seconds (each rank's own clock, from its first drawn round)")
        ax.set_title(f"{LABELS[r['config']]} at {r['rate']}: blue compute, red wait, black tick swap; "
                     f"rounds: orange estimate / purple commit / green fragment (number = micro-batches in the round)",
                     fontsize=8)
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(_title(result, "per-round compute / communication timeline (from round telemetry)"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def memory_plot(result: dict, path: str) -> Optional[str]:
    table = (result.get("analysis") or {}).get("memory") or []
    rows = [t for t in table if t.get("measured_delta_vs_zero1_mb") is not None]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [t["measured_delta_vs_zero1_mb"] for t in rows], width=0.4,
           label="measured peak RSS - ZeRO-1's", color="#4c9be8")
    ax.bar([x + 0.2 for x in xs], [t["analytic_delta_vs_zero1_mb"] for t in rows], width=0.4,
           label="analytic model - ZeRO-1's", color="#f5a623")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([t["config"] for t in rows], fontsize=8)
    ax.set_ylabel("MB per worker vs ZeRO-1 (same dtype)")
    ax.axhline(0, color="black", lw=0.8)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    P = rows[0]["params"]
    ax.set_title(f"peak memory per worker relative to stock ZeRO-1 (P = {P / 1e6:.1f}M params, "
                 f"N = {rows[0]['world_size']}; 4P = {4 * P / 2 ** 20:.0f} MB)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def streaming_bytes(result: dict, path: str) -> Optional[str]:
    """Mean and peak bytes per optimizer step per worker, log scale, one bar pair per config."""
    table = streaming_table(result["runs"])
    measured = any(e.get("iface_tx_bytes_per_step") for e in table)
    # without namespaces (loopback) only ds_acco's own accounting exists: stock ZeRO-1 drops out
    mean_key, peak_key = (("iface_tx_bytes_per_step", "iface_tx_peak_bytes_per_step") if measured
                          else ("ring_bytes_sent_per_step", "peak_round_bytes"))
    table = [e for e in table if e.get(mean_key)]
    if not table:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(table))
    mean = [e[mean_key] / 1e6 for e in table]
    peak = [(e[peak_key] or 0) / 1e6 for e in table]
    colors = [COLORS.get(e["config"], "#777777") for e in table]
    ax.bar([x - 0.2 for x in xs], mean, width=0.4, color=colors, label="mean per step")
    ax.bar([x + 0.2 for x in xs], peak, width=0.4, color=colors, alpha=0.45, hatch="//", label="busiest step")
    for x, m in zip(xs, mean):
        ax.text(x - 0.2, m, f"{m:.3g}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [LABELS[e["config"]].replace("ds_acco ", "").replace("DeepSpeed ", "") for e in table],
                  fontsize=8, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("MB sent per optimizer step per worker " + ("(veth tx)" if measured else "(ds_acco accounting)"))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    how = "measured on the interface" if measured else "loopback run: ds_acco's payload accounting only"
    ax.set_title(f"bytes on the wire per optimizer step, {table[0]['rate']} link ({how})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def time_to_loss_plot(result: dict, path: str) -> Optional[str]:
    """Validation loss against training seconds, one panel per link rate, the target dashed."""
    t = time_to_loss.table(result)
    if not t:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(t), figsize=(4.6 * len(t), 4.4), squeeze=False)
    runs = time_to_loss._runs(result)
    for ax, (rate, block) in zip(axes[0], t.items()):
        for r in (x for x in runs if x["rate"] == rate):
            pts = time_to_loss.val_time_points(r)
            if pts:
                cfg = r["config"]
                ax.plot([a for a, _ in pts], [b for _, b in pts], color=COLORS.get(cfg), marker=MARKERS.get(cfg),
                        markersize=4, label=LABELS.get(cfg, cfg))
        if block["target"] is not None:
            ax.axhline(block["target"], color="k", linestyle="--", linewidth=0.8, label="ZeRO-1 final")
            ax.set_ylim(block["target"] - 0.15, block["target"] + 0.9)
        ax.set_title(f"{rate}")
        ax.set_xlabel("training seconds (evaluation excluded)")
        ax.set_ylabel("validation loss (nats/byte)")
        ax.grid(alpha=0.3)
    max(axes[0], key=lambda a: len(a.get_lines())).legend(fontsize=6)  # the panel with every config
    wl = runs[0]["workload"]
    fig.suptitle(_title(result, f"time to loss: {wl['model_size']} model, {wl.get('max_tokens')} tokens per run, "
                                "2 emulated hosts"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def fsdp_plot(result: dict, path: str) -> Optional[str]:
    if not fsdp.fsdp_rows(result):
        return None
    fsdp.plot(result, path)
    return path


PLOTS = {
    "tokens_vs_bandwidth.png": tokens_vs_bandwidth,
    "loss_vs_tokens.png": loss_vs_tokens,
    "loss_vs_wallclock.png": loss_vs_wallclock,
    "timeline.png": timeline,
    "memory.png": memory_plot,
    "streaming_loss_vs_tokens.png": streaming_loss_vs_tokens,
    "streaming_bytes.png": streaming_bytes,
    "time_to_loss.png": time_to_loss_plot,
    "fsdp_tokens_vs_bandwidth.png": fsdp_plot,
}


def plot_all(result: dict, out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for name, fn in PLOTS.items():
        p = fn(result, os.path.join(out_dir, name))
        if p:
            written.append(p)
    return written
