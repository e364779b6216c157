"""What a profile (``examples/train_lm.py --profile-steps``) says about a round's cost to compute.

A round runs on ds_acco's communication thread, found here as the thread that issues the ``c10d::``
collectives, and :mod:`ds_acco.rounds.round_work` marks each round on it (``ds_acco round acco estimate``,
``... acco commit``, ``... sync commit``): a round's operations are those inside its mark, and its host work
the bursts of activity inside it (gaps under 5 ms joined), not the waits for its peers between them. A
trace without marks falls back on bursts alone, right only where nothing waits (one rank): on a CPU with
two ranks a round stops at each collective until its peer gets there, often for longer than 5 ms, and the
bursts had cut one round into several, each counted as a round (the small GPT's int4 rounds read 72-94
operations "per round" that way, 438-554 per mark). Two figures say whether the round takes compute's
time: the operations and kernel launches a round issues (each holds the Python interpreter the training
thread needs between its own), and, on a GPU, how busy the compute stream is while a round's thread is
active against the rest of the time. On an H100 this read 9% against 68%, on an H200 0% against 49%. Read
with care: a round's host work starts at a swap, where the training thread launches nothing for a while of
its own (the swap itself, then the next micro-batch's data; bench_results/gpu_overlap/
h200_world1_fused_kernel_ab/README.md), so the share says when rounds run more than what they cost. On a CPU
there are no streams; the training threads' share of the wall time covered by their operations stands in.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter
from typing import Optional

JOIN_US = 5000
"""Gaps in the round thread's activity shorter than this belong to one round (traces without round marks)."""
MARK = "ds_acco round "
"""The name of a round's mark starts with this, then says the round's kind."""


def _load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]


def _marked(events: list[dict], t1: float) -> list[dict]:
    """The round marks among ``events`` (recorded as operations or as user annotations, by torch version), but
    for a round still running when the profiler stopped: its mark is cut off at the trace's end ``t1`` and
    holds only the operations the round had issued by then."""
    return sorted((e for e in events if e["name"].startswith(MARK) and e["ts"] + e["dur"] < t1 - 1.0),
                  key=lambda e: e["ts"])


def _top_level(events: list[dict]) -> list[dict]:
    """Operations not nested in another of the same thread (an ``aten::to`` holds its ``copy_``)."""
    out, end = [], float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _bursts(events: list[dict], shortest_us: float = 500) -> list[tuple[float, float]]:
    spans: list[list[float]] = []
    for e in sorted(events, key=lambda e: e["ts"]):
        if spans and e["ts"] - spans[-1][1] < JOIN_US:
            spans[-1][1] = max(spans[-1][1], e["ts"] + e["dur"])
        else:
            spans.append([e["ts"], e["ts"] + e["dur"]])
    return [(a, b) for a, b in spans if b - a > shortest_us]


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
    ops = [e for e in ev if e.get("cat") == "cpu_op" and not e["name"].startswith(MARK)]
    comms = Counter(e["tid"] for e in ops if e["name"].startswith("c10d::"))
    out: dict = {"span_ms": (t1 - t0) / 1e3, "threads": len({e["tid"] for e in ops}), "rounds": 0,
                 "round_ms": None, "ops_per_round": None, "launches_per_round": None,
                 "compute_stream_busy": None, "training_ops_busy": None, "marked": False, "ops_by_kind": {}}
    if not comms:
        return out
    round_tid = comms.most_common(1)[0][0]
    mine = [e for e in ev if e["tid"] == round_tid and e.get("cat") in ("cpu_op", "cuda_runtime")
            and not e["name"].startswith(MARK)]
    marks = _marked([e for e in ev if e["tid"] == round_tid], t1)
    rounds = [(e["ts"], e["ts"] + e["dur"]) for e in marks] or _bursts(mine)
    if not rounds:
        return out
    # a marked round's host work: its bursts (the waits for its peers between them are not)
    active = [_bursts([e for e in mine if a <= e["ts"] <= b], 0) for a, b in rounds] if marks else \
        [[span] for span in rounds]
    spans = [span for bursts in active for span in bursts]
    top = _top_level([e for e in mine if e.get("cat") == "cpu_op"])
    launches = [e for e in mine if e["name"] in ("cudaLaunchKernel", "cuLaunchKernel")]
    count = lambda xs, a, b: sum(1 for e in xs if a <= e["ts"] <= b)  # noqa: E731
    out.update(rounds=len(rounds), round_ms=statistics.median(sum(b - a for a, b in bursts) / 1e3 for bursts in active),
               ops_per_round=statistics.median(count(top, a, b) for a, b in rounds),
               launches_per_round=statistics.median(count(launches, a, b) for a, b in rounds) if launches else None,
               marked=bool(marks))
    for kind in sorted({e["name"][len(MARK):] for e in marks}):
        out["ops_by_kind"][kind] = statistics.median(count(top, e["ts"], e["ts"] + e["dur"]) for e in marks
                                                     if e["name"] == MARK + kind)
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
    kinds = "".join(f", {k} {n:.0f}" for k, n in s.get("ops_by_kind", {}).items())
    return (f"{s['rounds']} rounds of host work in {s['span_ms']:.0f} ms (median {s['round_ms']:.1f} ms, "
            f"{s['ops_per_round']:.0f} operations{launches} each{kinds}); compute stream busy: "
            f"{pair(s['compute_stream_busy'])}; training threads' operations: {pair(s['training_ops_busy'])}")
