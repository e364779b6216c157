"""``python -m benchmarks``: ACCO against stock DeepSpeed ZeRO-1 and stock FSDP2 on an emulated cluster.

    # the CI-sized smoke sweep (tiny model, 2 hosts, 3 steps; loopback when namespaces are unavailable)
    python -m benchmarks run --sweep smoke --out /tmp/bench_smoke

    # the real sweep (root: network namespaces, tc shaping, cgroup CPU quota), then plots and tables
    python -m benchmarks run --sweep full --out bench_results
    python -m benchmarks plot bench_results/results.json
    python -m benchmarks report bench_results/results.json

    # every table of README.md and BENCHMARKS.md, from the raw files bench_results/sets.json names
    python -m benchmarks report            # rewrite them;  --check: exit 1 if a page differs
    python -m benchmarks memory --params 25.6e6 --world-size 2

    # time to loss over repeated sweeps (one out folder per repeat): medians, spread, ratios, targets
    python -m benchmarks repeats /tmp/dsb/real100_a /tmp/dsb/real100_b --dest bench_results/ttl_real

    # before committing a sweep folder under bench_results/: its results.json becomes results.json.gz
    python -m benchmarks pack bench_results/ttl_real/real_100mbit_seed*

Every run goes through ``launchers/local_cluster.py``; see benchmarks/sweep/runner.py for
what one run records and benchmarks/report/analysis.py for how the targets are computed.
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks import results_file
from benchmarks.report.tables import print_memory_model, report
from benchmarks.sweep import configs as cfgs
from benchmarks.sweep.plans import DEFAULT_PARTS, PARTS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a sweep, write results.json/results.csv and the plots")
    r.add_argument("--sweep", default="smoke", help="smoke or full")
    r.add_argument("--out", default="bench_results", help="output folder (runs/ holds per-run logs)")
    r.add_argument("--only", default=None, help=f"comma list of parts, from {','.join(PARTS)} (default: "
                   f"{','.join(DEFAULT_PARTS)}; the smoke sweep adds fsdp_time_to_loss)")
    r.add_argument("--configs", default=None, help=f"comma list of configs, from {','.join(cfgs.CONFIGS)} (default: "
                   f"{','.join(cfgs.DEFAULT_CONFIGS)}; part streaming: {','.join(cfgs.STREAMING_COMPARISON)}; parts "
                   f"fsdp*: {','.join(cfgs.FSDP_CONFIGS)})")
    r.add_argument("--rates", default=None, help="comma list of link rates, e.g. unshaped,100mbit,10mbit")
    r.add_argument("--mtu", type=int, default=None,
                   help="every link's MTU in bytes (default 1500; 9000 emulates jumbo frames: fewer packets, less "
                        "network-stack CPU per byte)")
    r.add_argument("--delay", default=None,
                   help="every link's one-way latency, e.g. 25ms (default none; netem, or a delaying switch where "
                        "the kernel has no netem)")
    r.add_argument("--steps", type=int, default=None, help="override optimizer steps of the runs")
    r.add_argument("--seed", type=int, default=None,
                   help="model init and data seed of every run (default 0); repeats with different seeds "
                        "put the loss path's own variation into the spread")
    r.add_argument("--no-netns", action="store_true", help="loopback: no namespaces (unshaped runs only)")
    r.add_argument("--no-pin", action="store_true", help="do not pin host i to CPU i")
    r.add_argument("--max-load", type=float, default=None,
                   help="before each run wait until the 1-minute load is below this (default: 1.5 for 'full', "
                        "off for 'smoke')")
    r.add_argument("--load-wait-budget-s", type=float, default=1200.0, help="total waiting allowed (default 1200)")
    r.add_argument("--resume", action="store_true", help="keep successful runs already in OUT/results.json(.gz)")
    r.add_argument("--rerun", default=None, metavar="REGEX",
                   help="with --resume: run again the kept runs whose id matches REGEX")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--jobs", type=int, default=None,
                   help="launches at once (default: 2 for 'smoke', whose numbers are not measurements; 1 otherwise)")
    r.add_argument("--dry-run", action="store_true", help="print the runs' commands and exit")
    pl = sub.add_parser("plot", help="write the PNG plots of a results.json (or .json.gz; next to it unless --out)")
    pl.add_argument("results")
    pl.add_argument("--out", default=None)
    rp = sub.add_parser("report", help="print the tables and targets of a results.json; without one, rewrite the "
                        "tables of README.md and BENCHMARKS.md from bench_results/ (sets.json)")
    rp.add_argument("results", nargs="?", default=None)
    rp.add_argument("--check", action="store_true", help="without RESULTS: exit 1 when a page's tables differ")
    rr = sub.add_parser("reparse", help="re-read OUT/runs/* with the current parsing code; rewrite results.*")
    rr.add_argument("out")
    rep = sub.add_parser("repeats", help="time to loss over repeated sweeps: median, spread, ratios, targets")
    rep.add_argument("outs", nargs="+", help="the out folders of the repeats")
    rep.add_argument("--dest", default=None, help="where repeats.json/.png go (default: the first out folder)")
    pk = sub.add_parser("pack", help="gzip each folder's results.json, as committed under bench_results/ "
                        "(benchmarks/results_file.py)")
    pk.add_argument("folders", nargs="+")
    mm = sub.add_parser("memory", help="print the analytic memory model")
    mm.add_argument("--params", type=float, required=True)
    mm.add_argument("--world-size", type=int, default=2)
    mm.add_argument("--fsdp", action="store_true", help="the FSDP2 front end (rank-major packed units)")
    args = p.parse_args(argv)

    if args.cmd == "repeats":
        from benchmarks.report.repeats import main as repeats

        repeats(args.outs, args.dest)
        return 0
    if args.cmd == "report" and args.results is None:
        from benchmarks.report.pages.write import main as pages

        return pages(check=args.check)
    if args.cmd == "pack":
        for folder in args.folders:
            print(results_file.pack(folder))
        return 0
    if args.cmd == "memory":
        print_memory_model(args.params, args.world_size, args.fsdp)
        return 0
    if args.cmd == "reparse":
        from benchmarks.report.plots import plot_all
        from benchmarks.sweep.runner import reparse

        result = reparse(args.out)
        plot_all(result, args.out)
        report(result)
        return 0
    if args.cmd in ("plot", "report"):
        result = results_file.load_file(args.results)
        from benchmarks.report.analysis import analyse

        result.setdefault("runs", [])  # an fsdp_results.json of the former FSDP sweep has "rows" instead
        result["analysis"] = analyse(result["runs"])  # with the current analysis code
        if args.cmd == "report":
            report(result)
            return 0
        from benchmarks.report.plots import plot_all

        for path in plot_all(result, args.out or os.path.dirname(os.path.abspath(args.results))):
            print(path)
        return 0

    from benchmarks.cluster.system import missing_requirements
    from benchmarks.report.plots import plot_all
    from benchmarks.sweep.commands import launch_command, prepare_run
    from benchmarks.sweep.load_gate import LoadGate
    from benchmarks.sweep.plans import build_sweep
    from benchmarks.sweep.runner import run_sweep

    netns = not args.no_netns
    if netns and missing_requirements(netns=True):
        print("[bench] network namespaces unavailable (" + "; ".join(missing_requirements(netns=True))
              + "): running on loopback, unshaped links only", file=sys.stderr)
        netns = False
    root = os.geteuid() == 0 and not missing_requirements(netns=False, need_cgroup=True)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()] if s else None  # noqa: E731
    try:
        sweep = build_sweep(args.sweep, netns=netns, root=root, pin=False if args.no_pin else None,
                            configs=split(args.configs), rates=split(args.rates), only=split(args.only),
                            steps=args.steps, mtu=args.mtu, seed=args.seed, delay=args.delay)
    except ValueError as exc:
        print(f"python -m benchmarks run: {exc}", file=sys.stderr)
        return 2
    print(f"[bench] {sweep.description}", file=sys.stderr)
    if args.dry_run:
        if sweep.shared_launches:
            from benchmarks.sweep.shared_launch import groups, prepare_group

            for group in groups(sweep.runs):
                print(" ".join(prepare_group(group, args.out, netns=netns, timeout_s=sweep.timeout_s)[1]))
            return 0
        for spec in sweep.runs:
            run_dir, cfg = prepare_run(spec, args.out)
            print(" ".join(launch_command(spec, run_dir, cfg, netns=netns, timeout_s=sweep.timeout_s)))
        return 0
    max_load = args.max_load if args.max_load is not None else (1.5 if args.sweep != "smoke" else None)
    gate = LoadGate(max_load, budget_s=args.load_wait_budget_s, log=lambda m: print(m, file=sys.stderr, flush=True))
    previous = None
    if args.resume and results_file.exists(args.out):
        previous = results_file.load(args.out)
        if args.rerun:
            import re

            previous["runs"] = [x for x in previous["runs"] if not re.search(args.rerun, x["id"])]
    jobs = args.jobs if args.jobs is not None else (2 if args.sweep == "smoke" else 1)
    if jobs > 1 and max_load is not None:
        print("[bench] --jobs > 1 runs launches side by side: the load gate is off and the figures are "
              "not measurements", file=sys.stderr)
    result = run_sweep(sweep, args.out, netns=netns, gate=gate, progress=not args.no_progress,
                       log=lambda m: print(m, file=sys.stderr), previous=previous, jobs=max(1, jobs))
    plots = plot_all(result, args.out)
    params = next((r["params"] for r in result["runs"] if r.get("params") and r["scenario"] == "memory"),
                  next((r["params"] for r in result["runs"] if r.get("params")), None))
    if params:
        print_memory_model(params, 2)
    report(result)
    print(f"\n[bench] results: {results_file.path_of(args.out)}, results.csv; plots: "
          f"{', '.join(os.path.basename(p) for p in plots)}; {result['sweep_wall_s']:.0f}s "
          f"(load waits {result['load_wait_s']:.0f}s)")
    failed = (result.get("analysis") or {}).get("failed_runs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
