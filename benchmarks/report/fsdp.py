"""The FSDP2 comparison: tokens/s against stock FSDP2 per link, seconds to a validation loss, collectives.

Reads the rows of the sweep part ``fsdp`` (``results.json``'s ``runs``), and also the older
``fsdp_results.json`` files (``rows``) that ``bench_results/`` keeps beside earlier figures.
"""

from __future__ import annotations

import sys
from typing import Optional

from benchmarks.cluster.units import parse_rate
from benchmarks.sweep.configs import FSDP_CONFIGS, LABELS

RATES = ("unshaped", "100mbit", "25mbit", "10mbit")


def fsdp_rows(result: dict) -> list[dict]:
    """The FSDP rows of a result document, each with ``config`` in :data:`FSDP_CONFIGS` and ``quota``."""
    if "rows" in result:  # an fsdp_results.json of the former FSDP sweep: configs without the prefix
        return [dict(r, config=f"fsdp_{r['config']}") for r in result["rows"]]
    rows = []
    for r in result.get("runs", []):
        if r.get("scenario", "").startswith("fsdp") and r.get("ok"):
            quota = ",".join(f"{k}={v:g}" for k, v in (r.get("cpu_quota") or {}).items())
            rows.append(dict(r, quota=quota or None, rc=r["exit_code"],
                             load1_before=(r.get("load") or {}).get("loadavg", [float("nan")])[0],
                             load1_after=(r.get("load") or {}).get("after", [float("nan")])[0]))
    return rows


def seconds_to(evals: list[dict], target: float) -> Optional[float]:
    return next((e["train_s"] for e in evals if e["val_loss"] <= target), None)


def analyse(rows: list[dict]) -> dict:
    """Per link: the target loss (the highest final validation loss of the configs, so all reach it), seconds
    to it, stock FSDP2's communication share, and the ratios the targets ask about."""
    out = {}
    for rate in sorted({r["rate"] for r in rows if "tokens_per_s" in r}, key=lambda x: parse_rate(x) or 1e30,
                       reverse=True):
        here = {r["config"]: r for r in rows if r["rate"] == rate and not r.get("quota") and "tokens_per_s" in r}
        if "fsdp_stock" not in here:
            continue
        target = max(r["evals"][-1]["val_loss"] for r in here.values())
        stock = here["fsdp_stock"]
        a = {"target_val_loss": target, "seconds_to_target": {c: seconds_to(r["evals"], target) for c, r in here.items()},
             "tokens_vs_stock": {c: r["tokens_per_s"] / stock["tokens_per_s"] for c, r in here.items()}}
        sync = here.get("fsdp_sync")
        if sync and sync.get("compute_s_per_round"):
            a["stock_comm_frac"] = max(0.0, 1 - sync["compute_s_per_round"] / stock["step_s"])
        out[rate] = a
    return out


def report(result: dict, out=sys.stdout) -> None:
    rows = fsdp_rows(result)
    analysis = analyse(rows)
    p = lambda *s: print(*s, file=out)  # noqa: E731
    rates = [r for r in RATES if any(x["rate"] == r for x in rows)]
    p("| config | " + " | ".join(rates) + " |")
    p("|---|" + "---|" * len(rates))
    for c in FSDP_CONFIGS:
        cells = []
        for rate in rates:
            r = next((x for x in rows if x["config"] == c and x["rate"] == rate and not x.get("quota")), None)
            if r is None or "tokens_per_s" not in r:
                cells.append("failed" if r else "-")
                continue
            ratio = analysis.get(rate, {}).get("tokens_vs_stock", {}).get(c)
            cells.append(f"{r['tokens_per_s']:.0f} ({ratio:.2f}x)" if ratio else f"{r['tokens_per_s']:.0f}")
        p(f"| {LABELS[c]} | " + " | ".join(cells) + " |")
    p("\n| config | link | steps/s | collectives / round (step) | iface tx MB/step | ring MB/step | hidden % "
      "| mb/round | s to target val loss | load before/after |")
    p("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "tokens_per_s" not in r:
            p(f"| {LABELS[r['config']]} | {r['rate']} {r.get('quota') or ''} | failed (rc {r['rc']}) |||||||")
            continue
        coll = (f"{r['collectives_per_round']:.0f} per round ({r.get('gloo_calls_per_round', 0):.1f} gloo calls), "
                f"{r['rounds_per_step']:.1f} rounds/step"
                if "collectives_per_round" in r else f"{r['collectives_per_step']:.1f} per step")
        tgt = analysis.get(r["rate"], {}).get("seconds_to_target", {}).get(r["config"]) if not r.get("quota") else None
        p(f"| {LABELS[r['config']]} | {r['rate']}{' ' + r['quota'] if r.get('quota') else ''} | {r['steps_per_s']:.2f} "
          f"| {coll} | {r['iface_tx_bytes_per_step'] / 1e6:.2f} "
          f"| {'-' if 'ring_bytes_per_step' not in r else format(r['ring_bytes_per_step'] / 1e6, '.2f')} "
          f"| {'-' if r.get('hidden_pct') is None else format(r['hidden_pct'], '.0f')} "
          f"| {'-' if r.get('micro_batches_per_round') is None else format(r['micro_batches_per_round'], '.1f')} "
          f"| {'-' if tgt is None else format(tgt, '.1f')} | {r['load1_before']:.1f} / {r['load1_after']:.1f} |")
    p("\n| link | target val loss | stock FSDP2 comm share | sync / stock | acco adaptive / stock |")
    p("|---|---|---|---|---|")
    for rate, a in analysis.items():
        frac = a.get("stock_comm_frac")
        t = a["tokens_vs_stock"]
        p(f"| {rate} | {a['target_val_loss']:.3f} | {'-' if frac is None else format(100 * frac, '.0f') + '%'} "
          f"| {t.get('fsdp_sync', float('nan')):.3f} | {t.get('fsdp_acco_adaptive', float('nan')):.2f} |")


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in fsdp_rows(result) if "tokens_per_s" in r and not r.get("quota")]
    rates = [r for r in RATES if any(x["rate"] == r for x in rows)]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for c in FSDP_CONFIGS:
        ys = [next((x["tokens_per_s"] for x in rows if x["config"] == c and x["rate"] == rate), None) for rate in rates]
        ax.plot(range(len(rates)), ys, marker="o", label=LABELS[c], linestyle="--" if c == "fsdp_stock" else "-")
        ev = next((x for x in rows if x["config"] == c and x["rate"] == rates[-1]), None)
        if ev:
            bx.plot([e["train_s"] for e in ev["evals"]], [e["val_loss"] for e in ev["evals"]], marker=".",
                    label=LABELS[c], linestyle="--" if c == "fsdp_stock" else "-")
    ax.set_xticks(range(len(rates)), rates)
    ax.set_xlabel("link")
    ax.set_ylabel("tokens/s (2 hosts, steady state)")
    ax.set_title("FSDP2: tokens/s against link rate")
    ax.legend(fontsize=8)
    bx.set_xlabel("training seconds")
    bx.set_ylabel("validation loss")
    bx.set_title(f"validation loss against time at {rates[-1]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
