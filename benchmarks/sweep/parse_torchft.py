"""One result row of a torchft run (``examples/train_lm_torchft.py``): the external peer beside ds_acco's rows.

The row has :func:`benchmarks.sweep.parse.parse_run`'s identifying keys and the ones the reports read
(``curve``, ``train_s``, ``val_loss``, ``tokens_last_step``, ``tokens_per_s``, ``steady_step_s``,
``iface_tx_bytes_per_step``, ``peak_rss_mb``, ``wait_frac``), from what the run left behind: rank 0's
``train.jsonl`` (train_lm's format), every rank's ``torchft_rank<r>.json`` and ``settings.json``.

Two figures differ on purpose from a ds_acco row's:

* ``tokens_per_s`` is the rate over the whole window from step 2 on, without parse_run's stall filter:
  a DiLoCo sync blocks for a whole-model all-reduce, a step many times the median, and that step is the
  algorithm's cost, not another process taking the CPU (the filtered rate is ``steady_tokens_per_s``).
* ``wait_s`` is the time the optimizer step took beyond its median (torchft's hook starts or ends an
  outer sync inside ``optimizer.step()``), as no round telemetry exists; ``wait_frac`` is it over training.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from typing import Optional

from benchmarks.cluster.units import format_rate, parse_rate

from . import configs as cfgs
from .parse import _finite, _tail_text, read_json, read_jsonl
from .specs import RunSpec

FIRST_STEP = 2
"""The window starts here: step 1 holds the start-up (the first forward, the allocator's first pages)."""


def _rank_figures(rec: dict, tokens_per_mb: int, netns: bool) -> dict:
    steps = rec.get("steps") or []
    d: dict = {"rank": rec.get("rank")}
    if rec.get("peak_rss_kb", -1) > 0:
        d.update(peak_rss_mb=rec["peak_rss_kb"] / 1024, baseline_rss_mb=rec["baseline_rss_kb"] / 1024,
                 train_rss_mb=(rec["peak_rss_kb"] - rec["baseline_rss_kb"]) / 1024)
    if not steps:
        return d
    last = steps[-1]
    d.update(micro_batches=last["micro_batch_index"], outer_syncs=last["outer_step"],
             allreduce_calls=last["sync_calls"], payload_bytes=last["sync_bytes"])
    opt = [s["opt_s"] for s in steps]
    med = statistics.median(opt)
    d["waited_s"] = sum(max(0.0, x - med) for x in opt)
    d["wait_frac"] = d["waited_s"] / last["train_s"] if last["train_s"] > 0 else None
    window = [s for s in steps if s["step"] >= FIRST_STEP]
    if len(window) >= 2 and window[-1]["t"] > window[0]["t"]:
        a, b = window[0], window[-1]
        n = b["step"] - a["step"]
        d["steady_from_step"] = a["step"]
        d["window_tokens_per_s"] = (b["micro_batch_index"] - a["micro_batch_index"]) * tokens_per_mb / (b["t"] - a["t"])
        d["steady_step_s"] = (b["t"] - a["t"]) / n
        deltas = [(y["t"] - x["t"], y["micro_batch_index"] - x["micro_batch_index"])
                  for x, y in zip(window, window[1:])]
        cut = 3 * statistics.median(dt for dt, _ in deltas)
        kept = [(dt, mb) for dt, mb in deltas if dt <= cut]
        d["stalled_steps"] = len(deltas) - len(kept)
        d["steady_tokens_per_s"] = sum(mb for _, mb in kept) * tokens_per_mb / sum(dt for dt, _ in kept)
        if netns and a["tx_bytes"] >= 0:
            d["iface_tx_bytes_per_step"] = (b["tx_bytes"] - a["tx_bytes"]) / n
            d["iface_rx_bytes_per_step"] = (b["rx_bytes"] - a["rx_bytes"]) / n
            d["iface_tx_peak_bytes_per_step"] = max(y["tx_bytes"] - x["tx_bytes"] for x, y in zip(window, window[1:]))
        syncs = [y["sync_bytes"] - x["sync_bytes"] for x, y in zip(steps, steps[1:])
                 if y["sync_bytes"] > x["sync_bytes"]]
        if steps[0]["sync_bytes"]:
            syncs.insert(0, steps[0]["sync_bytes"])
        d["peak_sync_payload_bytes"] = max(syncs, default=None)
    return d


def parse_torchft_run(spec: RunSpec, run_dir: str, rc: int, wall_s: float, load: Optional[dict] = None) -> dict:
    """The row of one torchft run; missing pieces become None, and a failed run says how far it got."""
    wl = spec.workload
    tokens_per_mb = wl.micro_batch * wl.seq_len
    cluster = read_json(os.path.join(run_dir, "cluster.json")) or {}
    recs = [read_json(os.path.join(run_dir, f"torchft_rank{r}.json")) for r in range(spec.hosts)]
    log = read_jsonl(os.path.join(run_dir, "train.jsonl"))
    summary = next((x for x in reversed(log) if x.get("event") == "summary"), {})
    settings = read_json(os.path.join(run_dir, "settings.json")) or {}
    row: dict = {
        "id": spec.run_id, "scenario": spec.scenario, "config": spec.config, "label": cfgs.LABELS[spec.config],
        "hosts": spec.hosts, "rate": format_rate(parse_rate(spec.rate)), "rate_bit_s": parse_rate(spec.rate),
        "cpu_quota": {f"host{i}": q for i, q in spec.cpu_quota}, "pinned": bool(spec.cpus), "note": spec.note,
        "mtu": spec.mtu or 1500, "delay": spec.delay, "workload": dataclasses.asdict(wl),
        "nominal_tokens_per_step": tokens_per_mb * wl.grad_accum * spec.hosts,
        "exit_code": rc, "wall_s": round(wall_s, 2), "load": load, "netns": cluster.get("netns"),
        "ok": rc == 0 and bool(summary) and all(recs), "frontend": "torchft", "params": settings.get("params"),
        "torchft": {k: (settings.get("torchft") or {}).get(k) for k in (
            "algorithm", "sync_every", "fragments", "fragment_sync_delay", "fragment_update_alpha",
            "outer_optimizer", "use_bucketization", "should_quantize")},
        "torchft_version": settings.get("torchft_version"),
    }
    if not row["ok"]:
        logs = [os.path.join(run_dir, f"host{i}.log") for i in range(spec.hosts)]
        logs.append(os.path.join(run_dir, "launcher.log"))
        row["error_tail"] = "\n".join(f"== {os.path.basename(p)}\n{_tail_text(p)}" for p in logs)
    steps, train_s = summary.get("steps"), _finite(summary.get("train_s"))
    row.update(steps=steps, train_s=train_s, tokens=summary.get("tokens"),
               summary_tokens_per_s=_finite(summary.get("tokens_per_s")),
               final_train_loss=_finite(summary.get("final_train_loss")), val_loss=_finite(summary.get("val_loss")),
               comm_hidden_pct=None, outer_syncs=(summary.get("torchft") or {}).get("outer_syncs"))
    ranks = [_rank_figures(r, tokens_per_mb, bool(row["netns"])) for r in recs if r]
    row["ranks"] = ranks

    def mean(key):
        vals = [d[key] for d in ranks if d.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    def total(key):
        vals = [d.get(key) for d in ranks]
        return sum(vals) if vals and len(vals) == spec.hosts and all(v is not None for v in vals) else None

    row["window_tokens_per_s"] = total("window_tokens_per_s")
    row["steady_tokens_per_s"] = total("steady_tokens_per_s")
    row["tokens_per_s"] = row["window_tokens_per_s"] or row["summary_tokens_per_s"]
    row["steady_step_s"] = mean("steady_step_s")
    row["steps_per_s"] = 1.0 / row["steady_step_s"] if row["steady_step_s"] else None
    row["stalled_steps"] = max((d.get("stalled_steps", 0) for d in ranks), default=0)
    row["wait_s"], row["wait_frac"] = mean("waited_s"), mean("wait_frac")
    for key in ("iface_tx_bytes_per_step", "iface_tx_peak_bytes_per_step"):
        row[key] = mean(key)
    row["peak_sync_payload_bytes"] = max((d["peak_sync_payload_bytes"] for d in ranks
                                          if d.get("peak_sync_payload_bytes")), default=None)
    row["payload_bytes_per_step"] = (mean("payload_bytes") / steps) if steps and mean("payload_bytes") else None
    row["peak_rss_mb"] = max((d["peak_rss_mb"] for d in ranks if "peak_rss_mb" in d), default=None)
    row["train_rss_mb"] = max((d["train_rss_mb"] for d in ranks if "train_rss_mb" in d), default=None)
    h = cluster.get("hosts") or []
    row["iface_total_tx_bytes"] = [x.get("delta", {}).get("tx_bytes") for x in h] if row["netns"] else None
    row["qdisc_drops"] = sum(x.get("delta", {}).get("qdisc_drops", 0) for x in h) if row["netns"] else None

    curve = [{"step": x["step"], "tokens": x["tokens"], "train_s": x.get("train_s"), "loss": _finite(x.get("loss")),
              "val_loss": _finite(x.get("val_loss")), "val_train_s": x.get("val_train_s"),
              "outer_step": x.get("outer_step")} for x in log if "step" in x and x.get("event") is None]
    if curve and row["val_loss"] is not None:
        curve[-1]["final_val_loss"] = row["val_loss"]
    row["curve"] = curve
    row["tokens_last_step"] = curve[-1]["tokens"] if curve else None
    row["timeline"] = []
    return row
