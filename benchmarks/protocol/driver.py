"""``python -m benchmarks.protocol``: the whole long-run protocol, every bed x seed, resumable.

    python -m benchmarks.protocol --dry-run          # the plan and its time estimate, nothing run
    python -m benchmarks.protocol                     # every bed, seeds 1,2,3, into bench_results/long_runs/
    python -m benchmarks.protocol --beds sleep,workers_8 --seeds 1 --steps 6 --out /tmp/long   # a smoke

Why a driver: the protocol is about 120 runs per seed on a machine that must stay quiet, hours in all; it must
say how long before it starts and pick up where it stopped. Each bed and seed is one sweep folder
``OUT/<bed>_seed<S>`` (``<bed>_lat<D>_seed<S>`` with ``--delay D``) run by
``python -m benchmarks run --sweep full --only <part> --seed S --resume`` (the runner
writes results.json after every run and ``--resume`` keeps the runs that finished, so an interrupted protocol
re-run with the same command redoes only the runs missing or failed). Seeds run one after another over every bed,
so that the first seed's figures cover every bed early. Afterwards::

    python -m benchmarks.report.long_runs bench_results/long_runs/*_seed*   # every table and target, printed
    python -m benchmarks report                                              # BENCHMARKS.md's long-run block
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from benchmarks import results_file
from benchmarks.cluster.units import parse_delay
from benchmarks.sweep import configs as cfgs
from benchmarks.sweep.commands import REPO
from benchmarks.sweep.plans import build_sweep
from benchmarks.sweep.specs import RunSpec

BEDS = {"real": "long_real", "real_slow": "long_real_slow_host", "sleep": "long_sleep", "workers_2": "workers_sleep_2",
        "workers_4": "workers_sleep_4", "workers_8": "workers_sleep_8", "workers_4_slow": "workers_sleep_4_slow",
        "real_4h": "workers_real_4"}
"""Protocol bed name (its folders' prefix) -> sweep part (:mod:`benchmarks.protocol.plans`)."""
DEFAULT_BEDS = ("real", "real_slow", "sleep", "workers_2", "workers_4", "workers_8", "workers_4_slow")
"""``real_4h`` needs a core per host: add it with ``--beds`` on a machine with 4 or more."""

S_PER_STEP = {("real", "unshaped"): 1.5, ("real", "100mbit"): 1.9, ("real", "25mbit"): 2.6,
              ("real-slow", "unshaped"): 2.9, ("real-slow", "100mbit"): 3.3,
              ("sleep", "unshaped"): 0.25, ("sleep", "100mbit"): 0.3, ("light", "unshaped"): 0.37,
              ("light", "100mbit"): 0.4}
"""Seconds per nominal step of a low-bit ds_acco config, by bed and link: the medians of the 45-step (real) and
100-step (sleep) five-bed sweeps of BENCHMARKS.md, adaptive's per commit scaled to a nominal step's tokens; the
unshaped links from a step's compute (1.26 s real, 2.8 s on the half-speed host, 0.24 s sleep; the light bed's
4 x (80 ms + 9 ms of CPU))."""
FP32 = {"unshaped": 1.1, "100mbit": 1.6, "25mbit": 2.4}
"""How much longer sync fp32 and stock ZeRO-1 take per step (fp32 rounds: 4x the bytes of low-bit ones)."""
HALF_BATCH = 1.3
"""Sync low-bit at half the batch: twice the rounds per nominal step."""
PER_EXTRA_HOST = 0.05
"""On the light sleep bed, each host past 2 adds this share of a step (8 hosts use most of a core on their own)."""
LATENCY_TRIPS = 14
"""One-way latencies a real-bed step pays with a link's latency (``--delay``): sync low-bit at half the batch took
0.37 s more a step at 25 ms than at none (``bench_results/pacing_latency/training_ab``)."""
START_S, START_PER_HOST_S, EVAL_S = 15.0, 4.0, {"real": 1.0, "sleep": 0.3, "light": 0.3}
"""A launch's start-up and tear-down (imports on a shared core), and one validation."""


def estimate_s(spec: RunSpec) -> float:
    """Rough seconds one run of the protocol takes on a quiet 2-core machine (see the constants above)."""
    wl = spec.workload
    kind = "real" if wl.model_size != "tiny" else "light" if wl.seq_len == 64 else "sleep"
    per_step = wl.micro_batch * wl.grad_accum * wl.seq_len * spec.hosts
    steps = wl.max_tokens / per_step if wl.max_tokens else wl.steps
    rate = spec.rate or "unshaped"
    bed = "real-slow" if kind == "real" and (spec.cpu_quota or "," in wl.compute_delay_ms) else kind
    s = S_PER_STEP.get((bed, rate), S_PER_STEP[(bed, "100mbit")])
    if spec.config in ("sync", "zero1", "zero1_overlap"):
        s *= FP32.get(rate, FP32["25mbit"])
    elif spec.config in cfgs.HALF_BATCH:
        s *= HALF_BATCH
    if kind == "light":
        s *= 1 + PER_EXTRA_HOST * (spec.hosts - 2)
    s += LATENCY_TRIPS * (parse_delay(spec.delay) or 0.0)
    evals = wl.max_tokens / wl.eval_every_tokens if wl.eval_every_tokens else 1
    return START_S + START_PER_HOST_S * spec.hosts + steps * s + evals * EVAL_S[kind]


def done_ids(out: str) -> set:
    """Run ids that finished in ``out`` (what ``--resume`` keeps)."""
    try:
        return {r["id"] for r in results_file.load(out).get("runs", []) if r.get("ok")}
    except (OSError, ValueError):
        return set()


def plan(beds, seeds, out: str, *, netns: bool, root: bool, steps=None, configs=None, rates=None,
         delay=None) -> list[dict]:
    """One entry per (seed, bed): its folder, part, runs, the runs already done, and the seconds left."""
    entries = []
    for seed in seeds:
        for bed in beds:
            sweep = build_sweep("full", netns=netns, root=root, only=[BEDS[bed]], seed=seed, steps=steps,
                                configs=configs, rates=rates, delay=delay)
            folder = os.path.join(out, f"{bed}_lat{delay}_seed{seed}" if delay else f"{bed}_seed{seed}")
            done = done_ids(folder)
            left = [r for r in sweep.runs if r.run_id not in done]
            entries.append({"bed": bed, "seed": seed, "part": BEDS[bed], "folder": folder, "runs": len(sweep.runs),
                            "done": len(sweep.runs) - len(left), "left_s": sum(estimate_s(r) for r in left),
                            "note": sweep.description.partition("; ")[2]})
    return entries


def command(entry: dict, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "benchmarks", "run", "--sweep", "full", "--only", entry["part"], "--seed",
           str(entry["seed"]), "--out", entry["folder"], "--resume"]
    for flag, value in (("--steps", args.steps), ("--configs", args.configs), ("--rates", args.rates),
                        ("--delay", args.delay),
                        ("--max-load", args.max_load), ("--load-wait-budget-s", args.load_wait_budget_s)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd + (["--no-netns"] if args.no_netns else [])


def _hours(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.protocol", description=__doc__.split("\n\n")[0])
    p.add_argument("--beds", default=",".join(DEFAULT_BEDS), help=f"comma list from {','.join(BEDS)}")
    p.add_argument("--seeds", default="1,2,3", help="comma list of seeds (at least 3 for a published figure)")
    p.add_argument("--out", default=os.path.join(REPO, "bench_results", "long_runs"))
    p.add_argument("--steps", type=int, default=None, help="nominal steps of every budget (default 100 real, 300 "
                   "sleep; a few for a smoke run)")
    p.add_argument("--configs", default=None, help="comma list replacing every bed's configs")
    p.add_argument("--rates", default=None, help="comma list replacing every bed's links (unshaped,100mbit,...)")
    p.add_argument("--delay", default=None, help="every link's one-way latency (25ms): a bed of its own in the "
                   "report, in folders <bed>_lat<D>_seed<S>")
    p.add_argument("--max-load", type=float, default=None, help="passed to python -m benchmarks run")
    p.add_argument("--load-wait-budget-s", type=float, default=None, help="passed to python -m benchmarks run")
    p.add_argument("--no-netns", action="store_true", help="loopback only (unshaped runs): not the protocol")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the estimate, run nothing")
    args = p.parse_args(argv)
    beds = [b.strip() for b in args.beds.split(",") if b.strip()]
    unknown = [b for b in beds if b not in BEDS]
    if unknown:
        p.error(f"--beds: unknown {unknown}; allowed: {', '.join(BEDS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds: got {args.seeds!r}; allowed: a comma list of integers")
    from benchmarks.cluster.system import missing_requirements

    netns = not args.no_netns and not missing_requirements(netns=True)
    root = os.geteuid() == 0 and not missing_requirements(netns=False, need_cgroup=True)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()] if s else None  # noqa: E731
    try:
        entries = plan(beds, seeds, args.out, netns=netns, root=root, steps=args.steps, configs=split(args.configs),
                       rates=split(args.rates), delay=args.delay)
    except ValueError as exc:
        p.error(str(exc))
    print(f"long-run protocol: {len(beds)} bed(s) x {len(seeds)} seed(s) into {args.out}"
          + ("" if netns else " (NO network namespaces: unshaped runs only)"))
    print("| bed | seed | part | runs | done | estimate left |\n|---|---|---|---|---|---|")
    for e in entries:
        print(f"| {e['bed']} | {e['seed']} | {e['part']} | {e['runs']} | {e['done']} | {_hours(e['left_s'])} |"
              + (f" {e['note']}" if e["note"] else ""))
    total = sum(e["left_s"] for e in entries)
    print(f"estimate: {_hours(total)} of runs left on a quiet 2-core machine (load waits and re-measured runs "
          "come on top); interrupt at will, the same command resumes")
    if args.dry_run:
        return 0
    failed = []
    for e in entries:
        if e["done"] == e["runs"]:
            continue
        t0 = time.monotonic()
        print(f"\n[protocol] {e['bed']} seed {e['seed']}: {e['runs'] - e['done']} run(s), about "
              f"{_hours(e['left_s'])}", flush=True)
        rc = subprocess.call(command(e, args), cwd=REPO)
        print(f"[protocol] {e['bed']} seed {e['seed']}: exit {rc} after {_hours(time.monotonic() - t0)}", flush=True)
        if rc:
            failed.append(f"{e['bed']}_seed{e['seed']}")
    again = f"; failed runs in {', '.join(failed)} (run the same command again)" if failed else ""
    print(f"\n[protocol] done{again}\n  python -m benchmarks.report.long_runs {os.path.join(args.out, '*_seed*')}"
          "\n  python -m benchmarks report")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
