"""What a profile (``examples/train_lm.py --profile-steps``) says about a round's cost to compute.

A round runs on ds_acco's communication thread, found here as the thread that issues the ``c10d::``
collectives; each burst of its activity (gaps under 5 ms joined) is one round's host work. Two figures
say whether the round takes compute's time: the operations and kernel launches a round issues (each
holds the Python interpreter the training thread needs between its own), and, on a GPU, how busy the
compute stream is while a round's thread is active against the rest of the time. On an H100 this
read 9% against 68% (BENCHMARKS.md, "On an H100"): the number to watch when a change claims to make
rounds cheaper for compute. On a CPU there are no streams; the training threads' share of the wall
time covered by their operations stands in.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter
from typing import Optional

JOIN_US = 5000
"""Gaps in the round thread's activity shorter than this belong to one round."""


def _load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]


def _top_level(events: list[dict]) -> list[dict]:
    """Operations not nested in another of the same thread (an ``aten::to`` holds its ``copy_``)."""
    out, end = [], float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _bursts(events: list[dict]) -> list[tuple[float, float]]:
    spans: list[list[float]] = []
    for e in sorted(events, key=lambda e: e["ts"]):
        if spans and e["ts"] - spans[-1][1] < JOIN_US:
            spans[-1][1] = max(spans[-1][1], e["ts"] + e["dur"])
        else:
            spans.append([e["ts"], e["ts"] + e["dur"]])
    return [(a, b) for a, b in spans if b - a > 500]


def _busy(events: list[dict], spans: list[tuple[float, float]], t0: float, t1: float) -> tuple[float, float]:
    """Fraction of the time inside ``spans`` and outside them that ``events`` cover (by their start)."""
    inside = sum(b - a for a, b in spans)
    within = lambda ts: any(a <= ts <= b for a, b in spans)  # noqa: E731
    busy_in = sum(e["dur"] for e in events if within(e["ts"]))
    busy_out = sum(e["dur"] for e in events) - busy_in
    return busy_in / inside if inside else 0.0, busy_out / (t1 - t0 - inside) if t1 - t0 > inside else 0.0


def summarize(path: str) -> dict:
    """The figures above for one trace; ``None`` where the trace cannot give them (no GPU, no round thread)."""
    ev = _load(path)
    t0, t1 = min(e["ts"] for e in ev), max(e["ts"] + e["dur"] for e in ev)
    ops = [e for e in ev if e.get("cat") == "cpu_op"]
    comms = Counter(e["tid"] for e in ops if e["name"].startswith("c10d::"))
    out: dict = {"span_ms": (t1 - t0) / 1e3, "threads": len({e["tid"] for e in ops}), "rounds": 0,
                 "round_ms": None, "ops_per_round": None, "launches_per_round": None,
                 "compute_stream_busy": None, "training_ops_busy": None}
    if not comms:
        return out
    round_tid = comms.most_common(1)[0][0]
    mine = [e for e in ev if e["tid"] == round_tid and e.get("cat") in ("cpu_op", "cuda_runtime")]
    spans = _bursts(mine)
    if not spans:
        return out
    top = _top_level([e for e in mine if e.get("cat") == "cpu_op"])
    launches = [e for e in mine if e["name"] in ("cudaLaunchKernel", "cuLaunchKernel")]
    count = lambda xs, a, b: sum(1 for e in xs if a <= e["ts"] <= b)  # noqa: E731
    out.update(rounds=len(spans), round_ms=statistics.median((b - a) / 1e3 for a, b in spans),
               ops_per_round=statistics.median(count(top, a, b) for a, b in spans),
               launches_per_round=statistics.median(count(launches, a, b) for a, b in spans) if launches else None)
    training = [e for tid in {e["tid"] for e in ops} - {round_tid} for e in _top_level(
        [o for o in ops if o["tid"] == tid])]
    out["training_ops_busy"] = _busy(training, spans, t0, t1)
    kernels = Counter(e["tid"] for e in ev if e.get("cat") == "kernel")
    if kernels:  # the compute stream runs the most kernels; the round's stream is another
        compute = kernels.most_common(1)[0][0]
        out["compute_stream_busy"] = _busy([e for e in ev if e.get("cat") == "kernel" and e["tid"] == compute],
                                           spans, t0, t1)
    return out


def describe(s: dict) -> str:
    """One line for a summary."""
    def pair(x: Optional[tuple]) -> str:
        return "n/a" if x is None else f"{x[0]:.0%} while a round's thread is active, {x[1]:.0%} otherwise"

    if not s["rounds"]:
        return f"no round thread in {s['span_ms']:.0f} ms of trace"
    launches = "" if s["launches_per_round"] is None else f", {s['launches_per_round']:.0f} kernel launches"
    return (f"{s['rounds']} rounds of host work in {s['span_ms']:.0f} ms (median {s['round_ms']:.1f} ms, "
            f"{s['ops_per_round']:.0f} operations{launches} each); compute stream busy: "
            f"{pair(s['compute_stream_busy'])}; training threads' operations: {pair(s['training_ops_busy'])}")
