"""The FSDP2 comparison: tokens/s against stock FSDP2 per link, seconds to a validation loss, collectives.

Reads the rows of the sweep part ``fsdp`` (``results.json``'s ``runs``), and also the older
``fsdp_results.json`` files (``rows``) that ``bench_results/`` keeps beside earlier figures.
"""

from __future__ import annotations

import statistics
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
    ttl = ttl_summary(ttl_collect([result]))
    if ttl:  # the part fsdp_time_to_loss: seconds to stock's losses first
        print(ttl_table(ttl) + "\n", file=out)
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


# ---- time to a loss over seeds: the sweep part ``fsdp_time_to_loss``, one results.json per seed and link

TTL_SCENARIO = "fsdp_time_to_loss"
AT = 0.75
"""The early target: stock FSDP2's validation loss at this fraction of its budget (a validation point)."""
TOLERANCE = 0.001
"""As :data:`benchmarks.report.time_to_loss.TOLERANCE`: reached at ``target * (1 + TOLERANCE)``."""
TARGETS = {"25mbit": 0.5, "100mbit": 0.8}
"""The issue's targets: the best ds_acco-FSDP config's seconds to the loss over stock FSDP2's, at most this."""


def val_time_points(row: dict) -> list[tuple[float, float]]:
    """``(training seconds, validation loss)`` at every validation, the final one included (rank 0's clock:
    validations are collectives, so every rank is at the same step)."""
    return [(e["train_s"], e["val_loss"]) for e in row["evals"]]


def ttl_seconds_to(points: list[tuple[float, float]], target: float) -> Optional[float]:
    """First training second the validation loss is at or below ``target``, interpolated; None if never."""
    prev = None
    for t, v in points:
        if v <= target:
            return t if prev is None or prev[1] == v else prev[0] + (t - prev[0]) * (prev[1] - target) / (prev[1] - v)
        prev = (t, v)
    return None


def ttl_collect(results: list[dict]) -> dict:
    """``{rate: {config: [sample per seed]}}``; each sample's targets come from the stock run of its own sweep."""
    groups: dict = {}
    for result in results:
        rows = [r for r in fsdp_rows(result) if r["scenario"] == TTL_SCENARIO and r.get("evals")]
        for rate in sorted({r["rate"] for r in rows}, key=lambda x: parse_rate(x) or 1e30, reverse=True):
            here = {r["config"]: r for r in rows if r["rate"] == rate}
            stock = here.get("fsdp_stock")
            if stock is None:
                continue
            curve = [(e["step"], e["val_loss"]) for e in stock["evals"]]  # stock: a step is a fixed token count
            early = _interp(curve, AT * curve[-1][0])
            final = curve[-1][1]
            for c, r in here.items():
                pts = val_time_points(r)
                groups.setdefault(rate, {}).setdefault(c, []).append({
                    "id": r["id"], "seed": r["workload"]["seed"], "early_target": early, "final_target": final,
                    "seconds": ttl_seconds_to(pts, early * (1 + TOLERANCE)),
                    "seconds_final": ttl_seconds_to(pts, final * (1 + TOLERANCE)), "final_loss": pts[-1][1],
                    "train_s": pts[-1][0], "steps": r["steps"], "mb_per_round": r.get("micro_batches_per_round")})
    return groups


def _interp(curve: list[tuple[float, float]], x: float) -> float:
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


def ttl_summary(groups: dict) -> dict:
    """Per link and config: every seed's seconds, their median and spread, the ratio of medians to stock FSDP2's;
    per link the best ds_acco config against the issue's target."""
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    out = {}
    for rate, by_config in groups.items():
        rows = {}
        for c in [c for c in FSDP_CONFIGS if c in by_config]:
            samples = sorted(by_config[c], key=lambda s: s["seed"])
            row = {"seeds": [s["seed"] for s in samples], "ids": [s["id"] for s in samples],
                   "final_loss": [s["final_loss"] for s in samples], "steps": [s["steps"] for s in samples]}
            for key in ("seconds", "seconds_final"):
                xs = [s[key] for s in samples]
                got = [x for x in xs if x is not None]
                row[key] = xs
                row[key + "_median"] = med(got) if len(got) == len(xs) else None  # a seed that never got there
                row[key + "_reached"] = f"{len(got)}/{len(xs)}"
            row["early_target"] = [s["early_target"] for s in samples]
            rows[c] = row
        stock = rows.get("fsdp_stock", {})
        for row in rows.values():
            for key in ("seconds", "seconds_final"):
                a, b = row[key + "_median"], stock.get(key + "_median")
                row[key + "_vs_stock"] = a / b if a and b else None
        mine = [(row["seconds_vs_stock"], c) for c, row in rows.items()
                if c != "fsdp_stock" and row["seconds_vs_stock"]]
        best = min(mine) if mine else (None, None)
        out[rate] = {"configs": rows, "best": best[1], "best_vs_stock": best[0], "target": TARGETS.get(rate),
                     "met": None if best[0] is None or rate not in TARGETS else best[0] <= TARGETS[rate]}
    return out


def _spread(xs: list) -> str:
    got = [x for x in xs if x is not None]
    return f"{min(got):.1f}-{max(got):.1f}" if got else "-"


def ttl_table(summary: dict) -> str:
    """BENCHMARKS.md's FSDP2 table: per config and link, seconds to stock's loss at 75% of its budget (median over
    seeds, min-max) and to its final loss (seeds that reached it), each with the ratio of medians to stock FSDP2;
    the final validation losses. Each link's heading holds the issue's target and its verdict; streaming has no
    row: the FSDP2 front end refuses it (ds_acco.config.front_ends), which the first heading says."""
    rates = list(summary)
    ratio = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    head = ["config (streaming: refused on FSDP2 at start-up, not run)"]
    for rate, b in summary.items():
        verdict = "" if b["target"] is None else (
            f"; target: the best at most {b['target']:.1f}x stock's: {'met' if b['met'] else 'not met'} "
            f"({FSDP_LABELS_SHORT.get(b['best'], b['best'])}, {ratio(b['best_vs_stock'])})")
        head.append(f"{rate}: s to stock's loss at {AT:.0%} of its budget (min-max) / to its final loss{verdict}")
    head.append("final val loss (" + ", ".join(rates) + ")")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in [c for c in FSDP_CONFIGS if any(c in b["configs"] for b in summary.values())]:
        cells, finals = [], []
        for rate in rates:
            r = summary[rate]["configs"].get(c)
            if r is None:
                cells.append("-")
                continue
            early = "never" if r["seconds_median"] is None else f"{r['seconds_median']:.1f} s"
            final = "not every seed" if r["seconds_final_median"] is None else f"{r['seconds_final_median']:.1f} s"
            cells.append(f"{early} ({_spread(r['seconds'])}) {ratio(r['seconds_vs_stock'])} / {final} "
                         f"({r['seconds_final_reached']}) {ratio(r['seconds_final_vs_stock'])}")
            finals.append(f"{statistics.median(r['final_loss']):.3f}")
        lines.append(f"| {FSDP_LABELS_SHORT.get(c, LABELS[c])} | " + " | ".join(cells) + f" | {', '.join(finals)} |")
    return "\n".join(lines)


FSDP_LABELS_SHORT = {"fsdp_stock": "stock FSDP2", "fsdp_sync": "sync fp32", "fsdp_sync_lowbit": "sync low-bit",
                     "fsdp_acco_fixed_lowbit": "acco fixed low-bit",
                     "fsdp_acco_adaptive_lowbit": "acco adaptive low-bit",
                     "fsdp_auto": "auto (`fsdp_auto_lowbit.json`)", "fsdp_dpu": "dpu", "fsdp_acco_fixed": "acco fixed",
                     "fsdp_acco_adaptive": "acco adaptive"}
