"""Training on a link with latency, this tree's pacing against a baseline tree's: seconds per step of the long runs'
real-compute bed, each config run in both trees in turn.

Why a second tree: what pacing costs or saves a training run shows in its steps, and the only fair baseline is the
same job under the rule before, on the same machine in the same hour. The baseline is any checkout (a ``git
worktree`` of an earlier commit); its workers import its own ``ds_acco``. Both trees' runs use this tree's emulated
cluster (``--delay`` needs the user-space switch where the kernel has no netem). The runs are short (``--steps``
nominal steps of the bed's workload, its decayed rate over the bed's budget) and timed from step 8 on: the warm-up
sync steps and the probe are behind them. Pieces change how bytes travel, not one value, so a config's seconds per
step are its time to any loss in the same proportion.

    git worktree add /tmp/baseline f21eff9
    python -m benchmarks.pacing_latency_training --baseline-tree /tmp/baseline --links 100mbit@0ms,100mbit@25ms --reps 3 \
        --out bench_results/pacing_latency/training_ab

As root. Writes ``seconds_per_step.json`` (every run's seconds per step), ``README.md`` (the table) and each run's
``runs/<config>-<link>-<tree>-<rep>/`` (``train.jsonl``, ``config.json``, ``command.txt``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys

from benchmarks.cluster.two_hosts import LAUNCHER, REPO, write_readme

CONFIGS = "sync_lowbit_half,acco_lowbit_int4_fixed_half,streaming_int8_half"
FROM_STEP = 8
KEEP = ("train.jsonl", "config.json")


def seconds_per_step(train_jsonl: str) -> float:
    """Training seconds from step :data:`FROM_STEP` to the last, per step."""
    with open(train_jsonl, encoding="utf-8") as f:
        steps = [r for r in map(json.loads, f) if "train_s" in r and "step" in r]
    first, last = next(r for r in steps if r["step"] >= FROM_STEP), steps[-1]
    return (last["train_s"] - first["train_s"]) / (last["step"] - first["step"])


def one_run(tree: str, config: str, link: str, steps: int, run_dir: str) -> float:
    from benchmarks.protocol.plans import real_workload
    from benchmarks.sweep import configs as cfgs
    from benchmarks.sweep.commands import train_args

    wl = dataclasses.replace(real_workload(), steps=steps, max_tokens=0, eval_every_tokens=0, seed=4)
    scratch = os.path.join(run_dir, "scratch")
    os.makedirs(scratch, exist_ok=True)
    cfg = cfgs.make_config(config, micro_batch=wl.micro_batch, grad_accum=wl.grad_accum, warmup_steps=wl.warmup_steps,
                           telemetry_jsonl=os.path.join(scratch, "telemetry.jsonl"),
                           max_micro_batches_per_round=wl.max_micro_batches_per_round,
                           lr_schedule=wl.lr_schedule, lr_total_steps=wl.lr_total_steps)
    with open(os.path.join(scratch, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    rate, delay = link.split("@")
    cmd = [sys.executable, LAUNCHER, "--hosts", "2", "--quiet", "--log-dir", scratch, "--timeout", "1200",
           "--rate", rate, "--delay", delay, "--cpus", "host0=0", "--cpus", "host1=1", "--",
           sys.executable, "-m", "benchmarks.sweep.worker", "--out", scratch, "--",
           *train_args(wl, os.path.join(scratch, "config.json"), scratch)]
    with open(os.path.join(run_dir, "command.txt"), "w", encoding="utf-8") as f:
        f.write(f"(cd {tree} && {' '.join(cmd)})\n")
    subprocess.run(cmd, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    for name in KEEP:
        shutil.copy(os.path.join(scratch, name), run_dir)
    shutil.rmtree(scratch)
    return seconds_per_step(os.path.join(run_dir, "train.jsonl"))


def table(rows: list[dict]) -> str:
    """Per link and config: each tree's median seconds per step (and range), and this tree's over the baseline's."""
    lines = ["| link | config | baseline: s per step, median (range) | this tree | this tree / baseline |",
             "|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["link"], r["config"]) for r in rows))
    for link, config in keys:
        got = {t: sorted(r["seconds_per_step"] for r in rows if (r["link"], r["config"], r["tree"]) ==
                         (link, config, t)) for t in ("baseline", "this")}
        cell = lambda v: f"{statistics.median(v):.3f} ({v[0]:.3f}-{v[-1]:.3f})"  # noqa: E731
        lines.append(f"| {link.replace('@', ', ')} one way | {config} | {cell(got['baseline'])} | {cell(got['this'])} "
                     f"| {statistics.median(got['this']) / statistics.median(got['baseline']):.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline-tree", required=True, help="a checkout of the commit to compare against")
    p.add_argument("--configs", default=CONFIGS)
    p.add_argument("--links", default="100mbit@0ms,100mbit@25ms", help="RATE@ONE_WAY_DELAY, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="runs of each config in each tree (their order alternates)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", default="bench_results/pacing_latency/training_ab")
    p.add_argument("--resume", action="store_true", help="keep the runs --out's table has and add the missing ones")
    args = p.parse_args(argv)
    trees = {"baseline": os.path.abspath(args.baseline_tree), "this": REPO}
    table_path = os.path.join(args.out, "seconds_per_step.json")
    rows = []
    if args.resume and os.path.exists(table_path):
        with open(table_path, encoding="utf-8") as f:
            rows = json.load(f)["rows"]
    done = {(r["config"], r["link"], r["tree"], r["rep"]) for r in rows}
    for rep in range(args.reps):
        for link in args.links.split(","):
            for config in args.configs.split(","):
                for tree in (("baseline", "this") if rep % 2 == 0 else ("this", "baseline")):
                    if (config, link, tree, rep) in done:
                        continue
                    run_dir = os.path.abspath(os.path.join(args.out, "runs", f"{config}-{link}-{tree}-{rep}"))
                    os.makedirs(run_dir, exist_ok=True)
                    s = one_run(trees[tree], config, link, args.steps, run_dir)
                    rows.append({"config": config, "link": link, "tree": tree, "rep": rep, "seconds_per_step": s})
                    print(json.dumps(rows[-1]), flush=True)
    commit = subprocess.run(["git", "-C", trees["baseline"], "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    with open(table_path, "w", encoding="utf-8") as f:
        json.dump({"baseline_commit": commit, "steps": args.steps, "from_step": FROM_STEP, "rows": rows}, f, indent=1)
    text = table(rows)
    write_readme(args.out, f"Training on a link with latency: this tree's pacing against {commit}'s",
                 "benchmarks.pacing_latency_training", argv, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
