"""One result row from a finished run's folder (see :mod:`benchmarks.sweep.runner` for what a row means).

Reads what the run left behind: ``cluster.json`` (interfaces, qdisc drops),
``worker_rank<r>.json`` (:mod:`benchmarks.sweep.worker`: memory, per-step wall
time and interface counters on every rank), ``telemetry.jsonl.rank<r>`` (one
ds_acco round record per round) and the host logs. Missing pieces become None,
so a failed run still yields a row that says how far it got.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
from typing import TYPE_CHECKING, Optional

from benchmarks.cluster.units import format_rate, parse_rate

from . import configs as cfgs

if TYPE_CHECKING:
    from .specs import RunSpec


def read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_jsonl(path: str) -> list[dict]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def _finite(x) -> Optional[float]:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _tail_text(path: str, n: int = 1500) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def tokens_by_step(rounds: list[dict], tokens_per_micro_batch: int) -> dict[int, int]:
    """Global tokens consumed by the updates up to each commit, from one rank's round records.

    Only gradient rounds count: after auto switches to streaming, the phase's fragment records follow in the same
    file with indices of their own from 1 and counts that are inner steps since a fragment's last sync, so sorted in
    with the gradient rounds they once gave an auto run's first commits up to 1.2 times the run's whole budget."""
    out, cum, commits = {}, 0, 0
    for r in sorted((r for r in rounds if r["kind"] != "fragment"), key=lambda r: r["index"]):
        cum += sum(r["counts"])
        if r["kind"] == "commit":
            commits += 1
            out[commits] = cum * tokens_per_micro_batch
    return out


GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")
"""Names (``/proc`` comm) of the threads gloo starts: its TCP event loop and torch's work threads for its
collectives."""


def _cpu_share(rr: list[dict], r: int, w: dict, last_step: int) -> dict:
    """Where a host's one core went: compute per micro-batch with and without a round in flight,
    the communication thread's CPU per round, gloo's own threads' CPU a step (its socket loop and
    work threads, which no round's stage counts), how often the training thread was switched out,
    and the kernel's softirq time (the emulated link's network stack) on the host's core."""
    out: dict = {}
    for key, rounds in (("compute_s_per_mb_sync", [x for x in rr if x["mode"] == "sync"]),
                        ("compute_s_per_mb_overlapped", [x for x in rr if x["mode"] != "sync"])):
        per_mb = [x["compute_s"] / x["counts"][r] for x in rounds if x["counts"][r]]
        if per_mb:
            out[key] = statistics.median(per_mb)
    cpu = [sum(x["stage_cpu_s"].values()) for x in rr if x.get("stage_cpu_s")]
    if cpu:
        out["comm_thread_cpu_s_per_round"] = statistics.median(cpu)
    threads = w.get("thread_cpu_s") or {}
    if threads and last_step:
        out["gloo_cpu_s_per_step"] = sum(v for k, v in threads.items() if k.startswith(GLOO_THREADS)) / last_step
    if w.get("main_preempted") is not None and last_step:
        out["preempted_per_step"] = w["main_preempted"] / last_step
    pinned = w.get("pinned_cpu")  # an unpinned host shares every core's softirq time with the others
    ticks = (w.get("cpu_ticks") or {}).get(f"cpu{pinned}") if pinned is not None else None
    if ticks and last_step:
        out["softirq_s_per_step"] = ticks[6] / w["clock_ticks_per_s"] / last_step
    return out


def parse_run(spec: "RunSpec", run_dir: str, rc: int, wall_s: float, load: Optional[dict] = None) -> dict:
    """One result row (plus curves) from a finished run's folder; missing pieces become None."""
    wl = spec.workload
    tokens_per_mb = wl.micro_batch * wl.seq_len
    nominal_tokens_per_step = tokens_per_mb * wl.grad_accum * spec.hosts
    cluster = read_json(os.path.join(run_dir, "cluster.json")) or {}
    workers = [read_json(os.path.join(run_dir, f"worker_rank{r}.json")) for r in range(spec.hosts)]
    rounds = [read_jsonl(os.path.join(run_dir, f"telemetry.jsonl.rank{r}")) for r in range(spec.hosts)]
    summary = (workers[0] or {}).get("summary") or {}
    row: dict = {
        "id": spec.run_id, "scenario": spec.scenario, "config": spec.config, "label": cfgs.LABELS[spec.config],
        "hosts": spec.hosts, "rate": format_rate(parse_rate(spec.rate)), "rate_bit_s": parse_rate(spec.rate),
        "cpu_quota": {f"host{i}": q for i, q in spec.cpu_quota}, "pinned": bool(spec.cpus), "note": spec.note,
        "mtu": spec.mtu or 1500, "delay": spec.delay,
        "workload": dataclasses.asdict(wl), "nominal_tokens_per_step": nominal_tokens_per_step,
        "exit_code": rc, "wall_s": round(wall_s, 2), "load": load, "netns": cluster.get("netns"),
        "ok": rc == 0 and bool(summary),
    }
    if not row["ok"]:
        logs = [os.path.join(run_dir, f"host{i}.log") for i in range(spec.hosts)] + [os.path.join(run_dir, "launcher.log")]
        row["error_tail"] = "\n".join(f"== {os.path.basename(p)}\n{_tail_text(p)}" for p in logs)

    m = re.search(r"GPT \(([\d.]+)M params\)", _tail_text(os.path.join(run_dir, "host0.log"), 10 ** 6))
    row["params"] = int(float(m.group(1)) * 1e6) if m else None
    steps = summary.get("steps")
    train_s = _finite(summary.get("train_s"))
    row.update(
        steps=steps, train_s=train_s, tokens=summary.get("tokens"),
        tokens_per_s=_finite(summary.get("tokens_per_s")),
        steps_per_s=(steps / train_s) if steps and train_s else None,
        final_train_loss=_finite(summary.get("final_train_loss")), val_loss=_finite(summary.get("val_loss")),
        comm_hidden_pct=_finite(summary.get("comm_hidden_pct")),
    )

    # ---- per rank: memory, local throughput, waits, interface bytes
    ranks = []
    for r, (w, rr) in enumerate(zip(workers, rounds)):
        w = w or {}
        recs = w.get("steps") or []
        d: dict = {"rank": r}
        if w:
            d.update(peak_rss_mb=w["peak_rss_kb"] / 1024, baseline_rss_mb=w["baseline_rss_kb"] / 1024,
                     train_rss_mb=(w["peak_rss_kb"] - w["baseline_rss_kb"]) / 1024, import_s=w.get("import_s"))
        if recs:
            last = recs[-1]
            d["micro_batches"] = last.get("micro_batch_index")
            if train_s and d["micro_batches"]:
                d["local_tokens_per_s"] = d["micro_batches"] * tokens_per_mb / train_s
            # steady state: from the step after warmup and bootstrap to the last one
            k0 = max(1, min(wl.warmup_steps + 2, last["step"] - 1))
            first = next((x for x in recs if x["step"] >= k0), None)
            if first is not None and last["step"] > first["step"] and last["t"] > first["t"]:
                window = [x for x in recs if x["step"] >= first["step"]]
                n = last["step"] - first["step"]
                d["steady_from_step"] = first["step"]
                d["window_tokens_per_s"] = ((last["micro_batch_index"] - first["micro_batch_index"]) * tokens_per_mb
                                            / (last["t"] - first["t"]))
                # Steps more than 3x the median step are stalls (another process took the CPU, a
                # page-fault storm): left out of the steady rate, and counted.
                deltas = [(b["t"] - a["t"], b["micro_batch_index"] - a["micro_batch_index"])
                          for a, b in zip(window, window[1:])]
                med = statistics.median(dt for dt, _ in deltas)
                kept = [(dt, mb) for dt, mb in deltas if dt <= 3 * med]
                d["stalled_steps"] = len(deltas) - len(kept)
                d["steady_step_s"] = sum(dt for dt, _ in kept) / len(kept)
                d["steady_tokens_per_s"] = sum(mb for _, mb in kept) * tokens_per_mb / sum(dt for dt, _ in kept)
                if first["tx_bytes"] >= 0 and row["netns"]:
                    d["iface_tx_bytes_per_step"] = (last["tx_bytes"] - first["tx_bytes"]) / n
                    d["iface_rx_bytes_per_step"] = (last["rx_bytes"] - first["rx_bytes"]) / n
                    # the busiest optimizer step on the wire (a fragment round, or a whole ZeRO-1 step)
                    d["iface_tx_peak_bytes_per_step"] = max(
                        (b["tx_bytes"] - a["tx_bytes"]) / max(1, b["step"] - a["step"]) for a, b in zip(window, window[1:]))
        if rr and any(x["mode"] == "streaming" for x in rr):
            # fragment rounds (after auto's switch: a few sync commits first): bytes over the run's steps, peak =
            # the largest round; no micro-batches per commit (a step is this rank's own)
            waited, round_s = sum(x["waited_s"] for x in rr), sum(x["round_s"] for x in rr)
            d.update(rounds=len(rr), waited_s=waited, round_s=round_s, compute_s=sum(x["compute_s"] for x in rr),
                     hidden_pct=100.0 * max(0.0, 1 - waited / round_s) if round_s > 0 else None,
                     ring_bytes_sent_per_step=sum(x["bytes_sent"] for x in rr) / steps if steps else None,
                     peak_round_bytes=max(x["bytes_sent"] for x in rr))
            busy = waited + d["compute_s"]
            d["wait_frac"] = waited / busy if busy > 0 else None
        elif rr:
            waited = sum(x["waited_s"] for x in rr)
            round_s = sum(x["round_s"] for x in rr)
            # steady state: the overlapped rounds (warmup's sync steps left out), all rounds for sync
            steady_rounds = [x for x in rr if x["mode"] != "sync"] or rr
            steady_rounds = steady_rounds[1:] or steady_rounds  # the first holds start-up/bootstrap time
            st_wait = sum(x["waited_s"] for x in steady_rounds)
            st_busy = st_wait + sum(x["compute_s"] for x in steady_rounds)
            d.update(rounds=len(rr), waited_s=waited, round_s=round_s,
                     compute_s=sum(x["compute_s"] for x in rr), steady_waited_s=st_wait,
                     wait_frac=st_wait / st_busy if st_busy > 0 else None,
                     hidden_pct=100.0 * max(0.0, 1 - waited / round_s) if round_s > 0 else None)
            commits = [x for x in rr if x["kind"] == "commit"]
            overlapped = [x for x in rr if x["mode"] != "sync"]
            steady = overlapped or rr
            n_commits = sum(1 for x in steady if x["kind"] == "commit") or 1
            d["ring_bytes_sent_per_step"] = sum(x["bytes_sent"] for x in steady) / n_commits
            d["mean_counts_per_commit"] = sum(sum(x["counts"]) for x in steady) / n_commits
            sync_commits = [x for x in commits if x["mode"] == "sync"]
            if len(sync_commits) > 1:  # the first one also holds the time from engine start-up to the loop
                d["sync_compute_s_per_step"] = statistics.median(x["compute_s"] for x in sync_commits[1:])
            d.update(_cpu_share(rr[1:], r, w, last_step=recs[-1]["step"] if recs else 0))
        ranks.append(d)
    row["ranks"] = ranks
    h = (cluster.get("hosts") or [])
    row["iface_total_tx_bytes"] = [x.get("delta", {}).get("tx_bytes") for x in h] if row["netns"] else None
    row["qdisc_drops"] = sum(x.get("delta", {}).get("qdisc_drops", 0) for x in h) if row["netns"] else None

    def mean(key):
        vals = [d[key] for d in ranks if d.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    steady = [d.get("steady_tokens_per_s") for d in ranks]
    row["steady_tokens_per_s"] = sum(steady) if steady and all(v is not None for v in steady) else None
    row["summary_tokens_per_s"] = row["tokens_per_s"]
    if row["steady_tokens_per_s"] is not None:
        row["tokens_per_s"] = row["steady_tokens_per_s"]  # the headline figure; see module docstring
    row["peak_rss_mb"] = max((d["peak_rss_mb"] for d in ranks if "peak_rss_mb" in d), default=None)
    row["train_rss_mb"] = max((d["train_rss_mb"] for d in ranks if "train_rss_mb" in d), default=None)
    row["wait_s"] = mean("waited_s")
    row["wait_frac"] = mean("wait_frac")
    row["iface_tx_bytes_per_step"] = mean("iface_tx_bytes_per_step")
    row["iface_tx_peak_bytes_per_step"] = mean("iface_tx_peak_bytes_per_step")
    row["peak_round_bytes"] = max((d["peak_round_bytes"] for d in ranks if d.get("peak_round_bytes")), default=None)
    row["ring_bytes_sent_per_step"] = mean("ring_bytes_sent_per_step")
    row["steady_step_s"] = mean("steady_step_s")
    row["stalled_steps"] = max((d.get("stalled_steps", 0) for d in ranks), default=0)
    window = [d.get("window_tokens_per_s") for d in ranks]
    row["window_tokens_per_s"] = sum(window) if window and all(v is not None for v in window) else None
    if row["steady_step_s"]:
        row["steps_per_s"] = 1.0 / row["steady_step_s"]
    row["mean_counts_per_commit"] = mean("mean_counts_per_commit")

    # ---- curves (rank 0): loss vs step/tokens/time, validation points, round timeline
    # a step's tokens: the commits' round records, else the script's own count (DeepSpeed's sample counter: a
    # streaming phase's inner steps have no gradient round, and auto may run them at half the batch), else nominal
    tok = tokens_by_step(rounds[0], tokens_per_mb) if rounds and rounds[0] else {}
    script = {x["step"]: x.get("tokens") for x in read_jsonl(os.path.join(run_dir, "train.jsonl"))
              if "micro_batch_index" in x}  # the training script's per-step records (rank 0)
    curve = []
    for x in (workers[0] or {}).get("steps") or []:
        s = x["step"]
        tokens = tok.get(s) or script.get(s) or s * nominal_tokens_per_step
        curve.append({"step": s, "tokens": tokens, "train_s": x.get("train_s"),
                      "loss": _finite(x.get("loss")), "val_loss": _finite(x.get("val_loss")),
                      "val_train_s": x.get("val_train_s")})
    if curve and row["val_loss"] is not None:
        curve[-1]["final_val_loss"] = row["val_loss"]
    row["curve"] = curve
    row["tokens_last_step"] = curve[-1]["tokens"] if curve else None
    row["timeline"] = [[{k: x.get(k) for k in ("index", "kind", "mode", "counts", "compute_s", "round_s", "waited_s",
                                               "bytes_sent", "stage_s")}
                        for x in rr] for rr in rounds]
    return row
