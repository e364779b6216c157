"""Soak: thousands of rounds with memory, threads and file descriptors sampled over time.

    python -m benchmarks.soak --rounds 4000                     # 2 local processes, loopback
    torchrun --nproc_per_node 2 -m benchmarks.soak --rounds 4000
    python launchers/local_cluster.py --hosts 2 --rate 200mbit -- python -m benchmarks.soak --rounds 4000

A leak in the round machinery (a buffer allocated per round, a thread or a
process group not released, a growing telemetry list) shows as a slope in one
of the sampled series. Every rank samples its own RSS (``/proc/self/status``
VmRSS), live threads and open file descriptors every ``--sample-every``
rounds; rank 0 writes them to JSON (and a PNG when matplotlib is installed) and
prints the growth from the first sample after warm-up to the last one.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import torch
import torch.distributed as dist


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _sample(rounds: int, t0: float) -> dict:
    return {"rounds": rounds, "seconds": round(time.perf_counter() - t0, 3), "rss_mib": round(_rss_mib(), 2),
            "threads": threading.active_count(), "fds": len(os.listdir("/proc/self/fd"))}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4000, help="rounds to run (two per acco step)")
    p.add_argument("--mode", default="acco", choices=["sync", "dpu", "acco"])
    p.add_argument("--policy", default="adaptive", choices=["fixed", "adaptive"])
    p.add_argument("--width", type=int, default=256, help="MLP width")
    p.add_argument("--sample-every", type=int, default=100)
    p.add_argument("--warmup-fraction", type=float, default=0.1, help="samples before this are not judged")
    p.add_argument("--out", default="bench_results/soak.json")
    p.add_argument("--nproc", type=int, default=2, help="processes to spawn when not started by a launcher")
    args = p.parse_args(argv)
    if args.rounds < 2 * args.sample_every:
        p.error(f"--rounds must be at least twice --sample-every, got {args.rounds} and {args.sample_every}")
    return args


def soak(args) -> None:
    from ds_acco import plain
    from examples.core_demo import demo_model

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = demo_model(args.width)
    engine = plain.build(model.parameters(), torch.optim.AdamW, {"lr": 1e-4},
                         config={"mode": args.mode, "policy": args.policy, "telemetry": {"keep_last": 100}},
                         gradient_accumulation_steps=4)
    gen = torch.Generator().manual_seed(rank)
    samples, t0, next_sample = [], time.perf_counter(), 0
    progress = None
    if rank == 0:
        try:
            from tqdm import tqdm

            progress = tqdm(total=args.rounds, unit="round", desc="soak")
        except ImportError:
            pass
    while engine.telemetry.rounds < args.rounds:
        x = torch.randn(16, 32, generator=gen)
        ((model(x) - x.sum(1, keepdim=True).sin()) ** 2).mean().backward()
        engine.after_micro_batch()
        if progress is not None and engine.telemetry.rounds != progress.n:
            progress.update(engine.telemetry.rounds - progress.n)
        if engine.telemetry.rounds >= next_sample:
            samples.append(_sample(engine.telemetry.rounds, t0))
            next_sample += args.sample_every
    engine.finish()
    summary = engine.telemetry.summary()
    engine.close()
    if progress is not None:
        progress.close()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, samples)
    if rank == 0:
        _report(args, everyone, summary)


def _report(args, per_rank: list, summary: dict) -> None:
    verdict = []
    for r, samples in enumerate(per_rank):
        start = samples[int(len(samples) * args.warmup_fraction)]
        end = samples[-1]
        verdict.append({
            "rank": r, "rounds": end["rounds"],
            "rss_growth_mib": round(end["rss_mib"] - start["rss_mib"], 2),
            "threads": sorted({s["threads"] for s in samples[int(len(samples) * args.warmup_fraction):]}),
            "fds": sorted({s["fds"] for s in samples[int(len(samples) * args.warmup_fraction):]}),
            "rss_mib_start_end": [start["rss_mib"], end["rss_mib"]],
        })
    result = {"args": vars(args), "telemetry": summary, "verdict": verdict, "samples": per_rank,
              "loadavg": open("/proc/loadavg", encoding="utf-8").read().split()[:3]}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    for v in verdict:
        print(f"[soak] rank {v['rank']}: {v['rounds']} rounds, RSS {v['rss_mib_start_end'][0]:.1f} -> "
              f"{v['rss_mib_start_end'][1]:.1f} MiB (growth {v['rss_growth_mib']:+.2f} MiB after warm-up), "
              f"threads {v['threads']}, fds {v['fds']}", flush=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        for r, samples in enumerate(per_rank):
            ax.plot([s["rounds"] for s in samples], [s["rss_mib"] for s in samples], label=f"rank {r}")
        ax.set_xlabel("rounds")
        ax.set_ylabel("RSS (MiB)")
        ax.set_title(f"ds_acco soak: {args.mode}/{args.policy}, {summary['rounds']} rounds")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.splitext(args.out)[0] + ".png", dpi=100)
    except ImportError:
        pass


def main(argv=None):
    from examples.local_launch import run_ranks

    args = parse_args(argv)
    run_ranks(soak, args, args.nproc)


if __name__ == "__main__":
    main()
