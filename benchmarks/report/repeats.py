"""Time to loss over repeated sweeps: the median of each config's seconds and their spread, per bed and link.

One sweep is one sample: a run's seconds to the target move by several percent between two
launches on a shared 2-core machine, as much as some of the differences the table is about.
``python -m benchmarks repeats OUT_A OUT_B ...`` reads the ``results.json`` of sweeps that ran the
same parts (one repeat each), computes every run's seconds to two targets of its own sweep, and
reports per *bed* (the run's note and CPU quota: ``real``, ``real``
with host 1 at 50%, or the sleep bed) and link: every repeat's seconds, their median and spread,
the ratios of medians against the fair baseline (ds_acco ``sync`` fp32, a real reduce-scatter), sync
low-bit and ZeRO-1, and for ``auto`` the share of its steps that ran acco. It writes
``repeats.json`` (every figure, with the run ids they come from) and ``repeats.png``.

The two targets come from the baseline run of the same sweep, bed and link (ZeRO-1, or ds_acco
sync where ZeRO-1 did not run: it reproduces ZeRO-1 step for step; for a sweep of low-bit configs
only, sync low-bit, the mode ACCO is compared with):

* **the loss at 3/4 of the budget**: the baseline's validation loss at 75% of its tokens. Every
  config that trains at all reaches it before its budget ends, so the seconds compare speed;
* **the final loss**: the baseline's validation loss at the end (what
  :mod:`benchmarks.report.time_to_loss` uses). A config reaches it only if its loss per token is
  as good at the very end; within 0.1% decides, so "never" can mean 0.01% worse.
"""

from __future__ import annotations

import json
import os
import statistics
from typing import Callable, Optional

from benchmarks import results_file
from benchmarks.cluster.units import parse_delay
from benchmarks.sweep.configs import TIME_TO_LOSS
from benchmarks.sweep.configs import TORCHFT_CONFIGS as TORCHFT

from .curves import interp, target, val_points
from .time_to_loss import SCENARIO, TOLERANCE, seconds_to, table, val_time_points

AT = 0.75
"""The early target: the baseline's validation loss at this fraction of its token budget."""

AUTO = ("auto_lowbit", "auto_lowbit_adaptive", "auto_lowbit_policy", "auto_lowbit_policy_early", "auto_lowbit_int4",
        "auto_lowbit_int4_streaming")
"""The configs that choose their mode (``mode: auto``, the fixed or the adaptive policy when acco runs)."""
ACCO_LOWBIT = ("acco_lowbit_fixed", "acco_lowbit_adaptive", "acco_lowbit_lrwarm", "acco_lowbit_int4_fixed",
               "acco_lowbit_int4_adaptive")
"""ACCO's own configs with sync low-bit's communication, for the "ACCO vs its own sync mode" target (the int4
ones cheapen only the estimate round)."""
NOT_DS_ACCO = TORCHFT + ("zero1", "zero1_overlap")
"""Configs that are not ds_acco's: the external peer and stock DeepSpeed (never "ds_acco's best")."""
PEER_RATE = "25mbit"
"""Where the issue sets ds_acco's best against torchft's best (at most 0.9x): the slow link both are built for."""
HAND_PICKED = ("sync", "sync_lowbit", "acco_lowbit_fixed", "acco_lowbit_adaptive", "acco_lowbit_lrwarm",
               "acco_lowbit_int4_fixed", "acco_lowbit_int4_adaptive", "streaming_int8")
"""The modes a user could pick by hand instead of ``auto`` at the same batch (stock ZeRO-1 aside; the half-batch
sync control changes the batch, which no mode does)."""


def bed_of(run: dict) -> str:
    quota = ",".join(f"{h}@{q:g}%" for h, q in sorted((run.get("cpu_quota") or {}).items()))
    mtu = f"mtu{run['mtu']}" if run.get("mtu", 1500) != 1500 else ""
    late = parse_delay(run.get("delay"))  # in ms whatever the unit it was given in (the pages read ``-lat<ms>ms``)
    lat = f"lat{late * 1e3:g}ms" if late else ""
    return "-".join(filter(None, [run.get("note") or "sleep", quota, mtu, lat]))


def acco_share(run: dict) -> Optional[float]:
    """The share of commits auto ran in acco (None after a switch to streaming, whose steps are not rounds)."""
    timeline = (run.get("timeline") or [[]])[0]
    if any(x.get("mode") == "streaming" for x in timeline):
        return None
    commits = [x for x in timeline if x.get("kind") == "commit"]
    return sum(x.get("mode") == "acco" for x in commits) / len(commits) if commits else None


def compute_ratio(run: dict) -> Optional[float]:
    """Compute per micro-batch with a round in flight over compute without one (the sync rounds of the
    same run), the mean over ranks: what the communication thread and the network stack take from
    compute (:func:`benchmarks.sweep.parse._cpu_share`)."""
    ratios = [d["compute_s_per_mb_overlapped"] / d["compute_s_per_mb_sync"] for d in run.get("ranks") or []
              if d.get("compute_s_per_mb_overlapped") and d.get("compute_s_per_mb_sync")]
    return sum(ratios) / len(ratios) if ratios else None


def collect(out_dirs: list[str]) -> dict:
    """``{(bed, rate): {config: [sample per repeat]}}``; a sample holds a run's figures and its id."""
    groups: dict = {}
    for out in out_dirs:
        runs = [r for r in results_file.load(out)["runs"] if r.get("scenario") == SCENARIO]
        for bed in sorted({bed_of(r) for r in runs}):
            mine = [r for r in runs if bed_of(r) == bed]
            by_id = {(r["rate"], r["config"]): r for r in mine}
            for rate, block in table(mine).items():
                base = by_id.get((rate, "zero1")) or by_id.get((rate, "sync")) or by_id.get((rate, "sync_lowbit"))
                curve = val_points(base) if base else []
                early = interp(curve, AT * curve[-1][0]) if curve else None
                for e in block["entries"]:
                    run = by_id[(rate, e["config"])]
                    seconds = seconds_to(val_time_points(run), early * (1 + TOLERANCE)) if early else None
                    groups.setdefault((bed, rate), {}).setdefault(e["config"], []).append({
                        "out": out, "id": run["id"], "seconds": seconds, "early_target": early,
                        "seconds_final": e["seconds_to_target"], "train_s": e["train_s"],
                        "s_per_step": 1 / e["steps_per_s"] if e.get("steps_per_s") else None, "steps": e["steps"],
                        "mb_per_commit": e["mean_counts_per_commit"], "val_equal_tokens": e.get("val_equal_tokens"),
                        "target": block["target"], "target_from": block["target_from"], "acco_share": acco_share(run),
                        "early_from": base["config"] if base else None, "compute_ratio": compute_ratio(run),
                        "seed": (run.get("workload") or {}).get("seed", 0),
                    })
    return groups


def _median(xs: list) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(groups: dict) -> dict:
    """Per (bed, rate): each config's median seconds, spread and ratios of medians; then the issue's targets."""
    out = {}
    for (bed, rate), by_config in groups.items():
        med = {c: _median([s["seconds"] for s in samples]) for c, samples in by_config.items()}
        rows = []
        for c in sorted(by_config, key=lambda c: TIME_TO_LOSS.index(c) if c in TIME_TO_LOSS else 99):
            samples = by_config[c]
            secs = [s["seconds"] for s in samples]
            reached = [x for x in secs if x is not None]
            ratio = lambda base: med[c] / med[base] if med.get(c) and med.get(base) else None  # noqa: E731
            final = [s["seconds_final"] for s in samples]
            rows.append({
                "config": c, "seconds": secs, "median_s": med[c], "seconds_final": final,
                "median_final_s": _median(final) if all(x is not None for x in final) else None,
                "spread_s": (max(reached) - min(reached)) if len(reached) > 1 else None,
                "vs_sync": ratio("sync"), "vs_sync_lowbit": ratio("sync_lowbit"), "vs_zero1": ratio("zero1"),
                "s_per_step": _median([s["s_per_step"] for s in samples]), "steps": _median([s["steps"] for s in samples]),
                "mb_per_commit": _median([s["mb_per_commit"] for s in samples]),
                "acco_share": [s["acco_share"] for s in samples] if c in AUTO else None,
                "compute_ratio": _median([s["compute_ratio"] for s in samples]),
                "runs": [f"{os.path.basename(s['out'].rstrip('/'))}/{s['id']}" for s in samples],
            })
        some_config = next(iter(by_config))
        some = by_config[some_config][0]
        ratios = {r["config"]: r["compute_ratio"] for r in rows if r["compute_ratio"]}
        out[f"{bed} {rate}"] = {"bed": bed, "rate": rate, "rows": rows, "targets": _targets(bed, rate, med, ratios),
                                "early_target": [s["early_target"] for s in next(iter(by_config.values()))],
                                "final_target": some["target"], "target_from": some["target_from"],
                                "early_from": some["early_from"], "seeds": [s["seed"] for s in by_config[some_config]]}
    return out


def _targets(bed: str, rate: str, med: dict, compute_ratios: Optional[dict] = None) -> list[dict]:
    found = []
    for c in ACCO_LOWBIT[:2] + ACCO_LOWBIT[3:]:
        if (compute_ratios or {}).get(c):
            found.append(target(f"compute per micro-batch with a round in flight within 3% of without, {c} "
                                f"({bed}, {rate})", compute_ratios[c], 1.03, "<=", "median over runs of the ranks' mean"))
    hand = {c: med[c] for c in HAND_PICKED if med.get(c)}
    for auto in (c for c in AUTO if med.get(c)):
        name = {"auto_lowbit": "auto", "auto_lowbit_adaptive": "auto (policy adaptive)",
                "auto_lowbit_policy_early": "auto (policy auto, no sync LR warm-up)",
                "auto_lowbit_int4": "auto (policy auto, int4 estimates)",
                "auto_lowbit_int4_streaming": "auto (policy auto, int4 estimates, streaming allowed)"}.get(
                    auto, "auto (policy auto)")
        if hand:
            best = min(hand, key=hand.get)
            found.append(target(f"{name} within 1.05x of the best hand-picked mode ({bed}, {rate})",
                                med[auto] / hand[best], 1.05, "<=", f"best: {best} {hand[best]:.1f} s"))
        if med.get("sync_lowbit"):
            found.append(target(f"{name} never worse than sync low-bit ({bed}, {rate})",
                                med[auto] / med["sync_lowbit"], 1.0, "<=", "ratio of medians"))
    peer = {c: med[c] for c in TORCHFT if med.get(c)}
    mine = {c: v for c, v in med.items() if v and c not in NOT_DS_ACCO}
    if peer and mine and rate == PEER_RATE:
        best, theirs = min(mine, key=mine.get), min(peer, key=peer.get)
        found.append(target(f"ds_acco's best vs torchft's best, time to loss ({bed}, {rate})",
                            mine[best] / peer[theirs], 0.9, "<=", f"{best} {mine[best]:.1f} s against {theirs} "
                            f"{peer[theirs]:.1f} s"))
    acco = {c: med[c] for c in ACCO_LOWBIT if med.get(c)}
    if acco and med.get("sync_lowbit") and bed.startswith("real"):
        best = min(acco, key=acco.get)
        limit = 0.75 if "%" in bed else 0.85
        found.append(target(f"ACCO low-bit vs sync low-bit, time to loss ({bed}, {rate})",
                            acco[best] / med["sync_lowbit"], limit, "<=", f"best: {best}"))
    return found


def print_summary(summary: dict, p: Callable[..., None] = print) -> None:
    f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    p(f"| bed | rate | config | seconds to the loss at {AT:.0%} of the budget, each run | median | spread "
      "| vs sync fp32 | vs sync low-bit | vs ZeRO-1 | s/step | steps | mb/commit | seconds to the final loss, each run "
      "| auto: steps in acco |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for block in summary.values():
        for r in block["rows"]:
            each = ", ".join("never" if s is None else f"{s:.1f}" for s in r["seconds"])
            final = "-" if block["final_target"] is None else ", ".join(  # no ZeRO-1 or sync fp32 run: no final target
                "never" if s is None else f"{s:.1f}" for s in r["seconds_final"])
            share = "-" if not r["acco_share"] else ", ".join(f(s, ".0%") for s in r["acco_share"])
            p(f"| {block['bed']} | {block['rate']} | {r['config']} | {each} | {f(r['median_s'], '.1f')} "
              f"| {f(r['spread_s'], '.1f')} | {f(r['vs_sync'], '.2f')}x | {f(r['vs_sync_lowbit'], '.2f')}x "
              f"| {f(r['vs_zero1'], '.2f')}x | {f(r['s_per_step'], '.2f')} | {f(r['steps'], '.0f')} "
              f"| {f(r['mb_per_commit'], '.1f')} | {final} | {share} |")
        early = ", ".join(f(x, ".4f") for x in block["early_target"])
        seeds = ", ".join(str(x) for x in block.get("seeds") or [])
        p(f"| {block['bed']} | {block['rate']} | target | val loss {early} (from {block['early_from']} at {AT:.0%}; "
          f"seed of each run {seeds}) "
          f"| | | | | | | | | final {f(block['final_target'], '.4f')} | |")
    p("\ntargets:")
    for block in summary.values():
        for t in block["targets"]:
            mark = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
            p(f"- [{mark}] {t['target']}: {t['value']} ({t['op']} {t['threshold']}; {t['detail']})")


def plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = list(summary.values())
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4.2), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        rows = [r for r in block["rows"] if r["median_s"] is not None]
        reached = [[s for s in r["seconds"] if s is not None] for r in rows]
        lo = [r["median_s"] - min(s) for r, s in zip(rows, reached)]
        hi = [max(s) - r["median_s"] for r, s in zip(rows, reached)]
        ax.barh([r["config"] for r in rows], [r["median_s"] for r in rows], xerr=[lo, hi], capsize=3,
                color=["tab:orange" if r["config"].startswith(("acco", "auto")) else "tab:gray" for r in rows])
        ax.invert_yaxis()
        ax.set_title(f"{block['bed']}, {block['rate']}", fontsize=10)
        ax.set_xlabel("seconds to target loss (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(out_dirs: list[str], dest: Optional[str] = None) -> dict:
    summary = summarize(collect(out_dirs))
    dest = dest or out_dirs[0]
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "repeats.json"), "w", encoding="utf-8") as f:
        json.dump({"sweeps": out_dirs, "summary": summary}, f, indent=1)
    print_summary(summary)
    plot(summary, os.path.join(dest, "repeats.png"))
    return summary
