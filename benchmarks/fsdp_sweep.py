"""``python -m benchmarks.fsdp_sweep``: the FSDP front end against stock FSDP2 on the emulated cluster.

    python -m benchmarks.fsdp_sweep run --out /tmp/dsb/fsdp      # root: namespaces, tc, cgroups
    python -m benchmarks.fsdp_sweep report /tmp/dsb/fsdp/fsdp_results.json [--plot bench_results/fsdp.png]

Every run is ``examples.train_lm_fsdp --shard-blocks`` (one ``fully_shard``
unit per transformer block plus the root, FSDP2's usual wrapping) on two
emulated hosts (``launchers/local_cluster.py --pin``), the same tiny GPT, data,
optimizer, clipping and schedule in every config; only the gradient path
differs: stock FSDP2 (``--stock``: FSDP2's own prefetching all-gathers and
backward reduce-scatters, parameters kept unsharded between the micro-batches of a
step) or ds_acco's rounds in sync, dpu, acco fixed and acco adaptive. Each host
writes ``fsdp_rank<r>.json`` (:mod:`benchmarks.fsdp_record`); this module reads
them into one row per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Optional

from .cluster_units import parse_rate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(REPO, "ds_configs", "fsdp_acco.json")
CONFIGS = ("stock", "sync", "dpu", "acco_fixed", "acco_adaptive")
LABELS = {"stock": "stock FSDP2", "sync": "ds_acco-FSDP sync", "dpu": "ds_acco-FSDP dpu",
          "acco_fixed": "ds_acco-FSDP acco fixed", "acco_adaptive": "ds_acco-FSDP acco adaptive"}
RATES = ("unshaped", "100mbit", "25mbit", "10mbit")
FIRST_STEP = 4
"""Steady-state window starts at this step: after ds_acco's 2 sync warmup steps and the round bootstrap."""


def acco_block(config: str) -> dict:
    block = {"backend": "fsdp", "warmup_steps": 2, "telemetry": {"log_every": 0}}
    if config == "stock":
        return dict(block, enabled=False)
    if config in ("sync", "dpu"):
        return dict(block, mode=config)
    if config == "acco_fixed":
        return dict(block, mode="acco", policy="fixed")
    if config == "acco_adaptive":
        return dict(block, mode="acco", policy="adaptive", max_micro_batches_per_round=16)
    raise ValueError(f"config: got {config!r}; allowed: {', '.join(CONFIGS)}")


def run_one(out_dir: str, config: str, rate: str, *, steps: int, delay_ms: float, eval_every: int,
            quota: Optional[str] = None, timeout_s: int = 240) -> dict:
    """One run; returns its row (figures from both ranks' records)."""
    name = f"{config}-{rate}" + (f"-{quota.replace('=', '')}" if quota else "")
    run_dir = os.path.join(os.path.abspath(out_dir), "runs", name)
    os.makedirs(run_dir, exist_ok=True)
    for f in os.listdir(run_dir):
        os.remove(os.path.join(run_dir, f))
    with open(TEMPLATE, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["acco"] = acco_block(config)
    config_path = os.path.join(run_dir, "config.json")
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    cmd = [sys.executable, os.path.join(REPO, "launchers", "local_cluster.py"), "--hosts", "2", "--pin", "--quiet",
           "--log-dir", run_dir, "--timeout", str(timeout_s)]
    if parse_rate(rate) is not None:
        cmd += ["--rate", rate]
    if quota:
        cmd += ["--cpu-quota", quota]
    cmd += ["--", sys.executable, "-m", "examples.train_lm_fsdp", "--config", config_path, "--shard-blocks",
            "--steps", str(steps), "--seq-len", "128", "--eval-every", str(eval_every), "--eval-batches", "4",
            "--compute-delay-ms", str(delay_ms), "--log-every", "0", "--metrics-out", run_dir]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    row = {"id": name, "config": config, "rate": rate, "quota": quota, "rc": proc.returncode,
           "wall_s": time.monotonic() - t0, "load1_before": load0, "load1_after": os.getloadavg()[0]}
    ranks = []
    for r in range(2):
        path = os.path.join(run_dir, f"fsdp_rank{r}.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                ranks.append(json.load(f))
    if proc.returncode != 0 or len(ranks) != 2:
        row["error"] = (proc.stdout[-1500:] + proc.stderr[-1500:])
        return row
    row.update(figures(ranks, tokens_per_micro_batch=cfg["train_micro_batch_size_per_gpu"] * 128))
    return row


def figures(ranks: list[dict], tokens_per_micro_batch: int) -> dict:
    """Steady-state tokens/s and steps/s, bytes and collectives per step, the validation curve."""
    tokens_s, steps_s, tx, step_s = 0.0, [], [], []
    for rec in ranks:
        steps = [s for s in rec["steps"] if s["step"] >= FIRST_STEP]
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


def seconds_to(evals: list[dict], target: float) -> Optional[float]:
    return next((e["train_s"] for e in evals if e["val_loss"] <= target), None)


def analyse(rows: list[dict]) -> dict:
    """Per link: the target loss (the highest final validation loss of the configs, so all reach it), seconds
    to it, stock FSDP2's communication share, and the ratios the targets ask about."""
    out = {}
    for rate in sorted({r["rate"] for r in rows if "tokens_per_s" in r}, key=lambda x: parse_rate(x) or 1e30,
                       reverse=True):
        here = {r["config"]: r for r in rows if r["rate"] == rate and not r.get("quota") and "tokens_per_s" in r}
        if "stock" not in here:
            continue
        target = max(r["evals"][-1]["val_loss"] for r in here.values())
        stock = here["stock"]
        a = {"target_val_loss": target, "seconds_to_target": {c: seconds_to(r["evals"], target) for c, r in here.items()},
             "tokens_vs_stock": {c: r["tokens_per_s"] / stock["tokens_per_s"] for c, r in here.items()}}
        sync = here.get("sync")
        if sync and sync.get("compute_s_per_round"):
            a["stock_comm_frac"] = max(0.0, 1 - sync["compute_s_per_round"] / stock["step_s"])
        out[rate] = a
    return out


def report(result: dict, out=sys.stdout) -> None:
    rows, analysis = result["rows"], result["analysis"]
    p = lambda *s: print(*s, file=out)  # noqa: E731
    rates = [r for r in RATES if any(x["rate"] == r for x in rows)]
    p("| config | " + " | ".join(rates) + " |")
    p("|---|" + "---|" * len(rates))
    for c in CONFIGS:
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
          f"| {t.get('sync', float('nan')):.3f} | {t.get('acco_adaptive', float('nan')):.2f} |")


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "tokens_per_s" in r and not r.get("quota")]
    rates = [r for r in RATES if any(x["rate"] == r for x in rows)]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for c in CONFIGS:
        ys = [next((x["tokens_per_s"] for x in rows if x["config"] == c and x["rate"] == rate), None) for rate in rates]
        ax.plot(range(len(rates)), ys, marker="o", label=LABELS[c], linestyle="--" if c == "stock" else "-")
        ev = next((x for x in rows if x["config"] == c and x["rate"] == rates[-1]), None)
        if ev:
            bx.plot([e["train_s"] for e in ev["evals"]], [e["val_loss"] for e in ev["evals"]], marker=".",
                    label=LABELS[c], linestyle="--" if c == "stock" else "-")
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


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fsdp_sweep", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--out", required=True)
    run.add_argument("--configs", default=",".join(CONFIGS))
    run.add_argument("--rates", default=",".join(RATES))
    run.add_argument("--steps", type=int, default=20)
    run.add_argument("--eval-every", type=int, default=4)
    run.add_argument("--compute-delay-ms", type=float, default=30.0)
    run.add_argument("--slow-host", action="store_true", help="also: host1 at 50%% CPU, unshaped, no sleep")
    rep = sub.add_parser("report")
    rep.add_argument("results")
    rep.add_argument("--plot", default=None)
    args = ap.parse_args(argv)
    if args.cmd == "report":
        with open(args.results, encoding="utf-8") as f:
            result = json.load(f)
        result["analysis"] = analyse(result["rows"])
        report(result)
        if args.plot:
            plot(result, args.plot)
        return 0
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "fsdp_results.json")
    result = {"rows": [], "settings": vars(args), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    plan = [(c, r, args.compute_delay_ms, None) for r in args.rates.split(",") for c in args.configs.split(",")]
    if args.slow_host:
        plan += [(c, "unshaped", 0.0, "host1=50") for c in args.configs.split(",")]
    for config, rate, delay, quota in plan:
        row = run_one(args.out, config, rate, steps=args.steps, delay_ms=delay, eval_every=args.eval_every,
                      quota=quota)
        print(f"[fsdp_sweep] {row['id']}: rc {row['rc']} {row.get('tokens_per_s', 0):.0f} tokens/s "
              f"{row['wall_s']:.0f} s load {row['load1_before']:.1f}/{row['load1_after']:.1f}", flush=True)
        result["rows"].append(row)
        result["analysis"] = analyse(result["rows"])
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
