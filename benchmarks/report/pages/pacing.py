"""docs/lowbit-and-streaming.md's table: a round's paced all-to-all on links with latency, pieces sized with the
latency counted against the rule before and one whole call (``python -m benchmarks.pacing_latency``; its raw files
under bench_results/pacing_latency/)."""

from __future__ import annotations

import glob
import json
import os

from . import sets as rs

RAW = os.path.join("bench_results", "pacing_latency")


def _link(name: str) -> tuple[float, float]:
    """``"100mbit_25ms"`` -> (bits/s, one-way delay in seconds)."""
    from benchmarks.cluster.units import parse_delay, parse_rate

    rate, delay = name.split("_")
    return parse_rate(rate), parse_delay(delay) or 0.0


def _order(path: str) -> tuple:
    rate, delay = _link(os.path.basename(path)[:-len(".json")])
    return -rate, delay


def _load() -> tuple[dict, set]:
    """Every ``<rate>_<delay>`` result, fastest link and shortest delay first, and how the delays were made."""
    paths = sorted((p for p in glob.glob(os.path.join(rs.ROOT, RAW, "*.json")) if not p.endswith(".cluster.json")),
                   key=_order)
    if not paths:
        raise FileNotFoundError(f"{RAW}: no results")
    results, via = {}, set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            results[os.path.basename(path)[:-len(".json")]] = json.load(f)
        with open(path[:-len(".json")] + ".cluster.json", encoding="utf-8") as f:
            via.add(json.load(f).get("delay_via"))
    via.discard(None)
    return results, via


def _command(folder: str) -> str:
    """The command line its README says wrote ``folder``."""
    with open(os.path.join(rs.ROOT, folder, "README.md"), encoding="utf-8") as f:
        return next(line.strip() for line in f if line.startswith("`python -m"))


def pacing_latency() -> str:
    from benchmarks.pacing_latency import table

    results, via = _load()
    return (table(results) + f"\n{_command(RAW)}; the delay: {', '.join(sorted(via))}; raw files: "
            f"[{RAW}/](../{RAW}/)")


def loss_row() -> list[str]:
    """BENCHMARKS.md's "where ds_acco loses" row: the paced collective's worst time against one whole call on a
    link with latency, and the rule before's."""
    from benchmarks.pacing_latency import over_whole

    results, _ = _load()
    delayed = {key: res for key, res in results.items() if _link(key)[1] > 0}

    def worst(way: str) -> str:
        key = max(delayed, key=lambda k: over_whole(delayed[k], way))
        rate, delay = key.split("_")
        return f"{over_whole(delayed[key], way):.2f}x ({rate}, {delay} one way)"
    delays = [key.split("_")[1] for key in sorted(delayed, key=lambda k: _link(k)[1])]
    return [f"a round's paced all-to-all on a link with latency against one whole gloo call (2 hosts, {delays[0]} to "
            f"{delays[-1]} one way; [paced collectives](docs/lowbit-and-streaming.md#paced-collectives))",
            f"up to {worst('latency counted')} its time; pieces sized from the rate alone, as before: up to "
            f"{worst('rate alone')}"]


TRAINING = os.path.join(RAW, "training_ab")


def pacing_training() -> str:
    """The training A/B beside the collectives (``python -m benchmarks.pacing_latency_training``)."""
    from benchmarks.pacing_latency_training import table

    with open(os.path.join(rs.ROOT, TRAINING, "seconds_per_step.json"), encoding="utf-8") as f:
        result = json.load(f)
    return (table(result["rows"]) + f"\n{_command(TRAINING)}; the baseline tree: commit {result['baseline_commit']}; seconds "
            f"per step from step {result['from_step']} to {result['steps']}; raw files: [{TRAINING}/](../{TRAINING}/)")
