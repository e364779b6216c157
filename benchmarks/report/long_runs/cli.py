"""``python -m benchmarks.report.long_runs FOLDER ... [--dest D]``: every long-run table and target, printed, and
``long_runs.json`` (every figure, with the runs it comes from) and ``delay_penalty.png`` written beside the folders.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Optional

from .ceiling import ceilings
from .plot import NAME as PLOT, plot
from .summary import FRACTIONS, SHORT, SHOWN, collect, summarize, workers
from .targets import targets


def _fmt(x: Optional[float], spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_report(summary: dict, p=print) -> None:
    for (bed, rate), block in summary.items():
        t = block["targets"]
        losses = ", ".join(f"{f:.0%} {_fmt(t[f], '.4f')}" for f in FRACTIONS)
        p(f"\n## {bed}, {rate}: the baseline's loss at {losses}")
        p("| config | s to 50% | s to 75% | s to 100% | spread 75% | vs sync fp32 75% | vs sync low-bit 75% "
          "| link cost 75% | penalty at 25/50/75/100% | final loss |")
        p("|---|---|---|---|---|---|---|---|---|---|")
        for config, r in block["rows"].items():
            sec = " | ".join(f"{_fmt(r['seconds'][f]['median'])} ({r['seconds'][f]['reached']}/{r['seconds'][f]['of']})"
                             for f in FRACTIONS)
            pen = ", ".join(_fmt(r["penalty"][c]["median"], ".2f") for c in SHOWN)
            p(f"| {config} | {sec} | {_fmt(r['seconds'][0.75]['spread'])} | {_fmt(r['vs_sync'][0.75], '.2f')} "
              f"| {_fmt(r['vs_sync_lowbit'][0.75], '.2f')} | {_fmt(r['link_cost'][0.75]['median'], '.2f')} | {pen} "
              f"| {_fmt(r['final_loss'], '.4f')} |")
        m = block["machines"]
        speed = f", {_fmt(m['fastest_ms'], '.1f')}-{_fmt(m['slowest_ms'], '.1f')} ms" if m["probed"] else ""
        if m.get("rows_ms"):
            speed += f" (rows' medians {_fmt(m['rows_ms'][0], '.1f')}-{_fmt(m['rows_ms'][1], '.1f')})"
        verdict = {True: "alike", False: "NOT alike: ratios between rows mix machine speeds",
                   None: "not all probed: machines unknown"}[m["alike"]]
        p(f"machines: {m['probed']} of {m['runs']} runs probed{speed} ({verdict})")
    for w in workers(summary):
        p(f"workers {w['hosts']}{' (one slow)' if w['slow'] else ''}, {w['rate']}: overlap gain "
          f"{_fmt(w['gain_fixed'], '.2f')}x (acco fixed), {_fmt(w['gain_best'], '.2f')}x (the faster acco)")
    for c in ceilings(summary):
        p(f"ceiling {c['bed'][0]} {c['bed'][1]}, {c['acco']} / {c['sync']}: {_fmt(c['ceiling'], '.2f')} (sync waits "
          f"{_fmt(c['sync_wait'], '.2f')}); tax {_fmt(c['tax'], '.2f')}x, acco waits {_fmt(c['acco_wait'], '.2f')}; "
          f"whole run {_fmt(c['modelled'], '.2f')} modelled, {_fmt(c['whole_run'], '.2f')} measured")
    p("\ntargets:")
    for t in targets(summary):
        mark = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        p(f"- [{mark}] {t['target']}: {t['value']} "
          f"({t['op']} {t['threshold']}; {t['detail']})")


def to_json(summary: dict) -> dict:
    """JSON keys for the tuple keys and float fractions."""
    def fix(x):
        if isinstance(x, dict):
            return {(str(k) if not isinstance(k, str) else k): fix(v) for k, v in x.items()}
        return [fix(v) for v in x] if isinstance(x, list) else x
    return {f"{bed} {rate}": fix(block) for (bed, rate), block in summary.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report.long_runs",
                                description="Every long-run table and target, printed; long_runs.json and "
                                            "delay_penalty.png written beside the folders (or in --dest).")
    p.add_argument("folders", nargs="+", help="sweep folders of the long parts (one bed and seed each)")
    p.add_argument("--dest", default=None, help="where long_runs.json goes (default: the first folder's parent)")
    args = p.parse_args(argv)
    summary = summarize(collect(args.folders))
    print_report(summary)
    dest = args.dest or os.path.dirname(os.path.abspath(args.folders[0]))
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "long_runs.json"), "w", encoding="utf-8") as f:
        json.dump({"folders": args.folders, "summary": to_json(summary), "targets": targets(summary),
                   "ceilings": [dict(c, bed=" ".join(c["bed"])) for c in ceilings(summary)]}, f, indent=1)
    drawn = plot(summary, os.path.join(dest, PLOT), SHORT)
    print(f"\nwrote {os.path.join(dest, 'long_runs.json')}" + (f" and {drawn}" if drawn else ""))
    return 0

