"""Derived figures and the issue's targets, computed from the result rows of a sweep.

Communication share of a stock DeepSpeed step: DeepSpeed reports no per-step
split, so it is ``1 - compute / step``, where ``compute`` is the median training-
thread time of one optimizer step's micro-batches measured by ds_acco's ``sync``
mode on the same workers and link (its telemetry separates compute from the
round it waits for) and ``step`` is ZeRO-1's steady-state step time. For the
ds_acco modes the exposed share is measured directly: training-thread wait
divided by training time.
"""

from __future__ import annotations

from typing import Optional

from benchmarks.memory import model as memory

from . import time_to_loss
from .curves import UNSHAPED, interp, rates_in_order, target, val_points
from .streaming import streaming_table


def _ok(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r.get("ok")]


def _find(runs: list[dict], scenario: str, config: str, rate: Optional[str] = None, note: Optional[str] = None):
    for r in runs:
        if r["scenario"] == scenario and r["config"] == config and (rate is None or r["rate"] == rate) and (
                note is None or r.get("note") == note):
            return r
    return None


def _ratio(a, b) -> Optional[float]:
    return a / b if a is not None and b not in (None, 0) else None


def _step_s(r: dict) -> Optional[float]:
    if r.get("steady_step_s"):
        return r["steady_step_s"]
    return r["train_s"] / r["steps"] if r.get("train_s") and r.get("steps") else None


def comm_fractions(runs: list[dict]) -> dict:
    """``{rate: {config: share of the step spent communicating, exposed}}`` for the bandwidth scenario."""
    out: dict = {}
    for rate in rates_in_order(runs):
        ref = _find(runs, "bandwidth", "sync", rate)
        compute = None
        if ref:
            vals = [d["sync_compute_s_per_step"] for d in ref.get("ranks", []) if d.get("sync_compute_s_per_step")]
            compute = max(vals) if vals else None  # a sync step waits for the slower rank
        row = {}
        for r in runs:
            if r["scenario"] != "bandwidth" or r["rate"] != rate:
                continue
            if r["config"] in memory.STOCK_CONFIGS:
                step = _step_s(r)
                row[r["config"]] = None if not (compute and step) else max(0.0, min(1.0, 1 - compute / step))
            else:
                row[r["config"]] = r.get("wait_frac")
            r["comm_frac"] = row[r["config"]]
        out[rate] = {"compute_s_per_step": compute, **row}
    return out


def bandwidth_targets(runs: list[dict], fractions: dict) -> list[dict]:
    out = []
    if not any(r["scenario"] == "bandwidth" for r in runs):
        return out
    base_adaptive = _find(runs, "bandwidth", "acco_adaptive", UNSHAPED)
    heavy = [rate for rate, row in fractions.items() if rate != UNSHAPED and (row.get("zero1") or 0) >= 0.5]
    if not heavy:
        out.append(target("a bandwidth where stock ZeRO-1 communicates >= 50% of its step", None, 0.5, ">=",
                           "no rate in the sweep reached it (see comm_frac per rate)"))
    for rate in heavy:
        z = _find(runs, "bandwidth", "zero1", rate)
        a = _find(runs, "bandwidth", "acco_adaptive", rate)
        f = _find(runs, "bandwidth", "acco_fixed", rate)
        zt = z and z.get("tokens_per_s")
        frac = fractions[rate].get("zero1")
        tag = f"{rate} (ZeRO-1 communicates {100 * frac:.0f}% of its step)"
        out.append(target(f"acco adaptive / ZeRO-1 tokens/s at {rate}", _ratio(a and a.get("tokens_per_s"), zt),
                           1.8, ">=", tag))
        out.append(target(f"acco adaptive at {rate} / acco adaptive unshaped", _ratio(
            a and a.get("tokens_per_s"), base_adaptive and base_adaptive.get("tokens_per_s")), 0.95, ">=", tag))
        out.append(target(f"acco fixed / ZeRO-1 tokens/s at {rate}", _ratio(f and f.get("tokens_per_s"), zt),
                           1.3, ">=", tag))
    return out


def slow_host_targets(runs: list[dict], part: str = "slow_host", suffix: str = "") -> tuple[list[dict], dict]:
    h0 = _find(runs, "alone" + suffix, "zero1", note="-".join(filter(None, [suffix, "host0"])))
    h1 = _find(runs, "alone" + suffix, "zero1", note="-".join(filter(None, [suffix, "host1"])))
    alone = [x and x.get("tokens_per_s") for x in (h0, h1)]
    table = {"alone_host0_tokens_per_s": alone[0], "alone_host1_tokens_per_s": alone[1]}
    for r in runs:
        if r["scenario"] == part:
            table[r["config"]] = {"tokens_per_s": r.get("tokens_per_s"),
                                  "local_tokens_per_s": [d.get("steady_tokens_per_s") or d.get("local_tokens_per_s")
                                                         for d in r.get("ranks", [])],
                                  "micro_batches": [d.get("micro_batches") for d in r.get("ranks", [])]}
    both = sum(alone) if all(alone) else None
    a = next((r for r in runs if r["scenario"] == part and r["config"] == "acco_adaptive"), None)
    z = next((r for r in runs if r["scenario"] == part and r["config"] == "zero1"), None)
    if not (a or z):
        return [], {}
    model = (a or z)["workload"]["model_size"]
    out = [
        target(f"slow host ({model}): acco adaptive / (host0 alone + host1 alone)",
                _ratio(a and a.get("tokens_per_s"), both), 0.9, ">=", "host1 at 50% CPU"),
        target(f"slow host ({model}): ZeRO-1 / (2 x slow host alone)",
                _ratio(z and z.get("tokens_per_s"), alone[1] and 2 * alone[1]), 1.0, "<=",
                "stock ZeRO-1 is bounded by twice the slow host"),
    ]
    return out, table


def convergence_targets(runs: list[dict]) -> tuple[list[dict], dict]:
    scen = "convergence" if any(r["scenario"] == "convergence" for r in runs) else "bandwidth"
    rate = None if scen == "convergence" else UNSHAPED
    z = _find(runs, scen, "zero1", rate)
    table, out = {}, []
    if not z:
        return out, table
    zc = val_points(z)
    for cfg in ("zero1", "acco_fixed", "acco_adaptive", "dpu", "sync", "zero1_overlap"):
        r = _find(runs, scen, cfg, rate)
        if not r:
            continue
        pts = val_points(r)
        if not pts:
            continue
        tokens, val = pts[-1]
        ref = interp(zc, tokens)
        if ref is None:  # adaptive may end past ZeRO-1's last point: compare at ZeRO-1's last tokens
            tokens = min(tokens, zc[-1][0]) if zc else tokens
            val, ref = interp(pts, tokens), interp(zc, tokens)
        rel = None if val is None or not ref else (val - ref) / ref
        table[cfg] = {"tokens": tokens, "val_loss": val, "zero1_val_loss": ref, "rel_diff": rel,
                      "final_train_loss": r.get("final_train_loss")}
        if cfg.startswith("acco"):
            out.append(target(f"{cfg} validation loss vs ZeRO-1 at equal tokens ({scen})",
                               None if rel is None else abs(rel), 0.01, "<=",
                               f"relative difference {'' if rel is None else f'{100 * rel:+.2f}%'} at {tokens:.0f} tokens"))
    return out, table


def memory_table(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """Measured peak RSS against the analytic model; each ds_acco config against the stock ZeRO-1
    run of its parameter dtype (``zero1`` or ``zero1_bf16``)."""
    scen = "memory" if any(r["scenario"] == "memory" for r in runs) else "bandwidth"
    rows = [r for r in runs if r["scenario"] == scen and (scen == "memory" or r["rate"] == UNSHAPED)
            and r["config"] in memory.DTYPE_BYTES]
    stock = {r["config"]: r for r in rows if r["config"] in memory.STOCK}
    table, targets = [], []
    for r in rows:
        P, N = r.get("params"), r["hosts"]
        if not P:
            continue
        analytic = memory.total(r["config"], N, P)
        base_name = memory.baseline(r["config"])
        z = stock.get(base_name)
        entry = {"config": r["config"], "params": P, "world_size": N, "peak_rss_mb": r.get("peak_rss_mb"),
                 "train_rss_mb": r.get("train_rss_mb"), "analytic_mb": analytic / 2 ** 20,
                 "formula": memory.formula(r["config"]), "baseline": base_name,
                 "components_mb": {k: v / 2 ** 20 for k, v in memory.components(r["config"], N, P).items()}}
        if z and z.get("peak_rss_mb") is not None and r.get("peak_rss_mb") is not None:
            entry["measured_delta_vs_zero1_mb"] = r["peak_rss_mb"] - z["peak_rss_mb"]
            entry["analytic_delta_vs_zero1_mb"] = (analytic - memory.total(base_name, N, P)) / 2 ** 20
            if r["config"].startswith("acco"):
                # the bounds: fp32 <= 4 P/N; bf16 accumulation <= 2 P + 4 P/N; chunked scratch on top
                full = {"acco_bf16": 2.0, "acco_bf16_fp32acc": 4.0}.get(r["config"], 0.0)
                bound = (full * P + 4 * P / N + memory.constant_bytes(r["config"], N, P)) / 2 ** 20
                targets.append(target(
                    f"memory: {r['config']} peak - {base_name} peak (MB) <= {full:g}P + 4P/N + chunked scratch",
                    entry["measured_delta_vs_zero1_mb"], round(bound, 1), "<=", f"P={P}, N={N} ({scen} runs)"))
        table.append(entry)
    return table, targets


def analyse(runs: list[dict]) -> dict:
    ok = _ok(runs)
    fractions = comm_fractions(ok)
    slow_t, slow_table = slow_host_targets(ok)
    small_t, small_table = slow_host_targets(ok, "slow_host_small", "small")
    slow_t += small_t
    conv_t, conv_table = convergence_targets(ok)
    mem_table, mem_t = memory_table(ok)
    ttl = time_to_loss.table(ok)
    return {
        "time_to_loss": ttl,
        "comm_frac": fractions,
        "targets": bandwidth_targets(ok, fractions) + slow_t + conv_t + mem_t + time_to_loss.targets(ttl),
        "slow_host": slow_table,
        "slow_host_small": small_table,
        "convergence": conv_table,
        "memory": mem_table,
        "streaming": streaming_table(runs),
        "failed_runs": [r["id"] for r in runs if not r.get("ok")],
    }
