"""The ``time_to_loss`` part of a sweep: seconds to reach stock ZeRO-1's final validation loss.

What a user of a slow link asks is not tokens/s but "does training finish sooner
at the same loss". Every run of the part trains the same model on the same data
for the same *token budget* (``train_lm --max-tokens``: the adaptive policy
commits more tokens per optimizer step, so a step count would not be equal data),
validating on the same held-out batches every ``eval_every_tokens`` committed
tokens. Per link rate:

* ``target``: stock ZeRO-1's validation loss at the end of its run at that rate;
* ``seconds``: training seconds (evaluation excluded) until a run's validation
  loss first comes within :data:`TOLERANCE` (0.1%) of the target, linearly
  interpolated between the two validation points around the crossing; ``None``
  if it never does. The tolerance is far below the validation set's own noise; it
  keeps a run whose loss per token equals ZeRO-1's (sync low-bit ends 0.01% above
  it) from counting as "never" on a tie. ZeRO-1's own seconds are measured the
  same way (a little before its last point);
* ``vs ZeRO-1``: that over ZeRO-1's seconds; ``vs sync low-bit``: over the seconds of
  ds_acco ``sync`` with the same low-bit rounds (ZeRO-1 steps at ACCO's bytes:
  what overlap adds once the bytes are cut);
* ``iface MB/step``: veth bytes sent per optimizer step per worker (measured);
* ``val at equal tokens``: validation loss at ZeRO-1's final token count,
  relative to ZeRO-1's (a run that ends a commit past the budget is interpolated);
* ``round at link rate``: :func:`round_link_share`, whether ds_acco's rounds move
  their bytes at the link's speed while training runs beside them.

The plot is :func:`benchmarks.report.plots.time_to_loss_plot` (validation loss
against training seconds, one panel per link rate).
"""

from __future__ import annotations

from typing import Callable, Optional

from benchmarks.sweep.configs import TIME_TO_LOSS

from .curves import interp, rates_in_order, target, val_points

SCENARIO = "time_to_loss"
TOLERANCE = 0.001
"""A run has reached the target once its validation loss is at most ``target * (1 + TOLERANCE)``."""


def _runs(result_or_runs) -> list[dict]:
    runs = result_or_runs["runs"] if isinstance(result_or_runs, dict) else result_or_runs
    return [r for r in runs if r.get("ok") and r["scenario"] == SCENARIO]


def val_time_points(r: dict) -> list[tuple[float, float]]:
    """``(training seconds, validation loss)`` at every validation of a run, the final one included.

    A validation scores every rank's model at its step, so its time is the slowest rank's training clock there
    (``val_train_s``, which ``examples/train_lm.py`` records; runs from before it carry rank 0's ``train_s``); the
    final one's is the summary's, the slowest rank's at the end. Rank 0's clock is earlier wherever ranks do not run
    in lockstep (streaming with a slow host: by over a minute at the end)."""
    curve = r.get("curve") or []
    pts = [(c.get("val_train_s") or c["train_s"], c["val_loss"]) for c in curve
           if c.get("val_loss") is not None and c.get("train_s")]
    end = r.get("train_s") or (curve[-1].get("train_s") if curve else None)
    if end and r.get("val_loss") is not None:
        pts.append((end, r["val_loss"]))
    return pts


def seconds_to(points: list[tuple[float, float]], target: float) -> Optional[float]:
    """First time the validation loss is at or below ``target`` (interpolated), or None."""
    prev = None
    for t, v in points:
        if v <= target:
            if prev is None or prev[1] == v:
                return t
            t0, v0 = prev
            return t0 + (t - t0) * (v0 - target) / (v0 - v)
        prev = (t, v)
    return None


def round_link_share(r: dict) -> Optional[float]:
    """How close a run's overlapped rounds came to the link's rate, from rank 0's round telemetry.

    Bytes a round sent (ring-model payload) over the seconds its communication thread
    spent in the reduce-scatter and all-gather stages, divided by the link rate; the
    median over the overlapped rounds. ``None`` on an unshaped link or without telemetry.
    """
    rate = r.get("rate_bit_s")
    if not rate:
        return None
    rounds = (r.get("timeline") or [[]])[0]
    shares = []
    for x in rounds:
        stages = x.get("stage_s") or {}
        busy = stages.get("reduce-scatter", 0.0) + stages.get("all-gather", 0.0)
        if x.get("mode") != "sync" and busy > 0 and x.get("bytes_sent"):
            shares.append(x["bytes_sent"] * 8 / busy / rate)
    if not shares:
        return None
    shares.sort()
    return shares[len(shares) // 2]


def table(runs) -> dict:
    """``{rate: [entry per config]}`` in :data:`TIME_TO_LOSS` order."""
    rows = _runs(runs)
    out = {}
    for rate in rates_in_order([dict(r, scenario="bandwidth") for r in rows]):
        at = sorted((r for r in rows if r["rate"] == rate),
                    key=lambda r: TIME_TO_LOSS.index(r["config"]) if r["config"] in TIME_TO_LOSS else 99)
        # ds_acco sync reproduces ZeRO-1 step for step: its final loss is the target where ZeRO-1 did not run
        zero1 = next((r for r in at if r["config"] == "zero1"), None) or next(
            (r for r in at if r["config"] == "sync"), None)
        target = zero1.get("val_loss") if zero1 else None
        reach = target * (1 + TOLERANCE) if target is not None else None
        zero1_s = seconds_to(val_time_points(zero1), reach) if zero1 and reach is not None else None
        ref_tokens = val_points(zero1) if zero1 else []
        sync_lb = next((r for r in at if r["config"] == "sync_lowbit"), None)
        sync_lb_s = seconds_to(val_time_points(sync_lb), reach) if sync_lb and reach is not None else None
        sync = next((r for r in at if r["config"] == "sync"), None)
        sync_s = seconds_to(val_time_points(sync), reach) if sync and reach is not None else None
        entries = []
        for r in at:
            e = {k: r.get(k) for k in ("config", "tokens_per_s", "steps_per_s", "iface_tx_bytes_per_step",
                                        "ring_bytes_sent_per_step", "comm_hidden_pct", "val_loss", "steps",
                                        "mean_counts_per_commit", "tokens_last_step")}
            pts = val_time_points(r)
            e["train_s"] = pts[-1][0] if pts else None
            e["round_link_share"] = round_link_share(r)
            e["seconds_to_target"] = seconds_to(pts, reach) if reach is not None else None
            e["vs_zero1"] = e["seconds_to_target"] / zero1_s if e["seconds_to_target"] and zero1_s else None
            e["vs_sync_lowbit"] = (e["seconds_to_target"] / sync_lb_s
                                   if e["seconds_to_target"] and sync_lb_s else None)
            e["vs_sync"] = e["seconds_to_target"] / sync_s if e["seconds_to_target"] and sync_s else None
            z_bytes = zero1.get("iface_tx_bytes_per_step") if zero1 else None
            e["bytes_vs_zero1"] = (r["iface_tx_bytes_per_step"] / z_bytes
                                   if r.get("iface_tx_bytes_per_step") and z_bytes else None)
            tok = val_points(r)
            if tok and ref_tokens:
                at_tokens = min(tok[-1][0], ref_tokens[-1][0])
                mine, ref = interp(tok, at_tokens), interp(ref_tokens, at_tokens)
                e["val_equal_tokens"] = mine
                e["val_rel_vs_zero1"] = (mine - ref) / ref if mine is not None and ref else None
                e["equal_tokens"] = at_tokens
            entries.append(e)
        out[rate] = {"target": target, "zero1_s": zero1_s, "sync_s": sync_s, "entries": entries,
                     "target_from": zero1["config"] if zero1 else None}
    return out


SLOW = ("25mbit", "10mbit")
LOWBIT = ("acco_lowbit_fixed", "acco_lowbit_adaptive")
ACCO = ("acco_fixed", "acco_adaptive") + LOWBIT


def targets(t: dict) -> list[dict]:
    """The issue's targets, from :func:`table`."""
    out = []
    for rate, block in t.items():
        by = {e["config"]: e for e in block["entries"]}
        for cfg in LOWBIT:
            if cfg in by and by[cfg].get("bytes_vs_zero1") is not None:
                out.append(target(f"{cfg} interface bytes per optimizer step vs ZeRO-1 fp32 at {rate}",
                                   by[cfg]["bytes_vs_zero1"], 0.5, "<=", "veth tx bytes per step, per worker"))
        ratios = {c: by[c]["vs_zero1"] for c in ACCO if c in by and by[c].get("vs_zero1") is not None}
        best = min(ratios, key=ratios.get) if ratios else None
        limit = 0.5 if rate in SLOW else 1.0
        out.append(target(f"best ACCO setting reaches ZeRO-1's final validation loss at {rate}, time vs ZeRO-1",
                           ratios.get(best), limit, "<=",
                           f"best: {best}; ZeRO-1 {block['zero1_s'] and round(block['zero1_s'], 1)} s, target val "
                           f"{block['target'] and round(block['target'], 4)}"))
        lowbit = {c: by[c]["vs_sync_lowbit"] for c in LOWBIT if c in by and by[c].get("vs_sync_lowbit")}
        if lowbit:
            fastest = min(lowbit, key=lowbit.get)
            out.append(target(f"best low-bit ACCO setting vs ds_acco sync with the same low-bit rounds at {rate}, "
                               "time to ZeRO-1's final validation loss", lowbit[fastest], 1.0, "<=",
                               f"best: {fastest}"))
        if "acco_lowbit_fixed" in by and by["acco_lowbit_fixed"].get("val_rel_vs_zero1") is not None:
            rel = by["acco_lowbit_fixed"]["val_rel_vs_zero1"]
            out.append(target(f"acco_lowbit_fixed validation loss vs ZeRO-1 at equal tokens at {rate}", abs(rel),
                               0.01, "<=", f"relative difference {100 * rel:+.2f}%"))
    return out


def print_table(t: dict, p: Callable[..., None]) -> None:
    if not t:
        return
    f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    p(f"\n## seconds to stock ZeRO-1's final validation loss (within {100 * TOLERANCE:g}%; training seconds, "
      "evaluation excluded)")
    p("| rate | config | seconds to target | vs ZeRO-1 | vs sync low-bit | iface MB/step | bytes vs ZeRO-1 | tokens/s "
      "| steps | mb/commit | val loss at equal tokens | vs ZeRO-1 | round at link rate |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rate, block in t.items():
        for e in block["entries"]:
            reached = f(e["seconds_to_target"], ".1f") if e["seconds_to_target"] is not None else (
                f"not in {f(e['train_s'], '.0f')}")
            rel = e.get("val_rel_vs_zero1")
            p(f"| {rate} | {e['config']} | {reached} | {f(e['vs_zero1'], '.2f')}x | {f(e['vs_sync_lowbit'], '.2f')}x "
              f"| {f(e['iface_tx_bytes_per_step'] and e['iface_tx_bytes_per_step'] / 1e6, '.3f')} "
              f"| {f(e['bytes_vs_zero1'], '.3f')}x | {f(e['tokens_per_s'], '.0f')} | {f(e['steps'], 'd')} "
              f"| {f(e['mean_counts_per_commit'], '.1f')} | {f(e.get('val_equal_tokens'), '.4f')} "
              f"| {'-' if rel is None else format(100 * rel, '+.2f') + '%'} "
              f"| {'-' if e.get('round_link_share') is None else format(100 * e['round_link_share'], '.0f') + '%'} |")
        p(f"| {rate} | target | val loss {f(block['target'], '.4f')} | ZeRO-1 {f(block['zero1_s'], '.1f')} s "
          "| | | | | | | | | |")
