"""Synthetic result rows of the long-run protocol, for the report's tests: every loss a straight line in tokens,
every config a constant speed, so each figure the report computes has a closed form the tests can write down.
"""

from __future__ import annotations

import json

from benchmarks.report import long_runs as lr
from benchmarks.report.pages import long_runs as page


def row(config, rate, seed, loss, secs, note="long-real", hosts=2, tokens=range(100, 1001, 100), compute=None):
    """A result row whose validation loss at ``t`` tokens is ``loss(t)``, reached at ``secs(t)`` training seconds;
    ``compute``: each rank's compute seconds per sync step."""
    curve = [{"step": i, "tokens": t, "val_loss": loss(t), "train_s": secs(t), "val_train_s": secs(t)}
             for i, t in enumerate(tokens, 1)]
    return {"id": f"time_to_loss-{config}-{rate}-{hosts}h-{note}", "scenario": "time_to_loss", "config": config,
            "rate": rate, "hosts": hosts, "note": note, "ok": True, "cpu_quota": {},
            "workload": {"seed": seed, "max_tokens": 1000, "lr_total_steps": 100},
            "curve": curve, "val_loss": curve[-1]["val_loss"], "tokens_last_step": curve[-1]["tokens"],
            "train_s": curve[-1]["train_s"], "mean_counts_per_commit": 8.0,
            "ranks": [{"sync_compute_s_per_step": compute} for _ in range(hosts)] if compute else []}


def base_loss(t):
    return 5 - 0.002 * t


def lag_loss(t):  # 50 tokens behind the baseline: ACCO's delay in this story
    return 5 - 0.002 * (t - 50)


ACCO = 26  # acco fixed's tokens per second on the real bed: sync low-bit's are 20


def tokens_to(loss_value, lag=0.0):
    return (5 - loss_value * (1 + lr.TOLERANCE)) / 0.002 + lag


def protocol(root, seeds=(1, 2, 3)):
    """Folders of a synthetic protocol: real compute at 100 Mbit/s and unshaped; the light sleep bed at 2 and 8
    hosts."""
    for seed in seeds:
        k = 1 + 0.1 * (seed - 1)  # seed 2 is the median
        real = [row("sync", "100mbit", seed, base_loss, lambda t, k=k: k * t / 10),
                row("sync_lowbit", "100mbit", seed, base_loss, lambda t, k=k: k * t / 20),
                row("sync_lowbit", "unshaped", seed, base_loss, lambda t, k=k: k * t / 40),
                row("acco_lowbit_int4_fixed", "100mbit", seed, lag_loss, lambda t, k=k: k * t / ACCO),
                row("acco_lowbit_int4_fixed", "unshaped", seed, lag_loss, lambda t, k=k: k * t / 40),
                row("auto_lowbit_int4", "100mbit", seed, lag_loss, lambda t, k=k: k * t / 30)]
        if seed != 3:  # one seed of adaptive never gets there
            real.append(row("acco_lowbit_int4_adaptive", "100mbit", seed, base_loss, lambda t, k=k: k * t / 22))
        else:
            real.append(row("acco_lowbit_int4_adaptive", "100mbit", seed, lambda t: 6.0, lambda t: t / 22))
        sleep = []
        for hosts, acco in ((2, 25), (8, 30)):
            note = f"long-workers-{hosts}h"
            sleep += [row("sync", "100mbit", seed, base_loss, lambda t, k=k: k * t / 10, note, hosts,
                           compute=0.4 if hosts == 2 else 0.42),
                      row("sync_lowbit", "100mbit", seed, base_loss, lambda t, k=k: k * t / 20, note, hosts),
                      row("acco_lowbit_int4_fixed", "100mbit", seed, base_loss, lambda t, a=acco, k=k: k * t / a,
                           note, hosts)]
        for bed, rows in (("real", real), ("sleep", sleep)):
            folder = root / "bench_results" / "long_runs" / f"{bed}_seed{seed}"
            folder.mkdir(parents=True)
            (folder / "results.json").write_text(json.dumps({"runs": rows}))
    (root / "bench_results" / "sets.json").write_text(json.dumps({"protocol": {page.SET: {
        "folders": ["long_runs/*_seed*"]}}}))
    return sorted(str(p) for p in (root / "bench_results" / "long_runs").iterdir())


def write_second_machine(root, runs_by_folder: dict) -> None:
    """Each folder's rows under bench_results/long_runs_machine2/ (after :func:`protocol`), and that protocol set
    in sets.json."""
    for name, rows in runs_by_folder.items():
        folder = root / "bench_results" / "long_runs_machine2" / name
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps({"runs": rows}))
    index = root / "bench_results" / "sets.json"
    sets = json.loads(index.read_text())
    sets["protocol"][page.SECOND] = {"folders": ["long_runs_machine2/*_seed*"]}
    index.write_text(json.dumps(sets))


def set_ranks(folders, ranks_of):
    """Give the real bed's runs of each folder the rank figures ``ranks_of(config, seed)`` returns (None: leave the
    run as it is), written back into its results.json."""
    for folder in folders:
        path = f"{folder}/results.json"
        with open(path, encoding="utf-8") as f:
            runs = json.load(f)
        for r in runs["runs"]:
            ranks = ranks_of(r["config"], r["workload"]["seed"]) if r["note"] == "long-real" else None
            if ranks is not None:
                r["ranks"] = ranks
        with open(path, "w", encoding="utf-8") as f:
            json.dump(runs, f)
