"""The ``time_to_loss`` part of a sweep: seconds to reach stock ZeRO-1's final validation loss.

What a user of a slow link asks is not tokens/s but "does training finish sooner
at the same loss". Every run of the part trains the same model on the same data
for the same *token budget* (``train_lm --max-tokens``: the adaptive policy
commits more tokens per optimizer step, so a step count would not be equal data),
validating on the same held-out batches every ``eval_every_tokens`` committed
tokens. Per link rate:

* ``target``: stock ZeRO-1's validation loss at the end of its run at that rate;
* ``seconds``: training seconds (evaluation excluded) until a run's validation
  loss first reaches the target, linearly interpolated between the two
  validation points around the crossing; ``None`` if it never does;
* ``vs ZeRO-1``: that over ZeRO-1's own training seconds (its last point);
* ``iface MB/step``: veth bytes sent per optimizer step per worker (measured);
* ``val at equal tokens``: validation loss at ZeRO-1's final token count,
  relative to ZeRO-1's (a run that ends a commit past the budget is interpolated).

The plot is :func:`ds_acco.bench.plots.time_to_loss_plot` (validation loss
against training seconds, one panel per link rate).
"""

from __future__ import annotations

from typing import Callable, Optional

from .analysis import _interp, _target, rates_in_order, val_points
from .configs import TIME_TO_LOSS

SCENARIO = "time_to_loss"


def _runs(result_or_runs) -> list[dict]:
    runs = result_or_runs["runs"] if isinstance(result_or_runs, dict) else result_or_runs
    return [r for r in runs if r.get("ok") and r["scenario"] == SCENARIO]


def val_time_points(r: dict) -> list[tuple[float, float]]:
    """``(training seconds, validation loss)`` at every validation of a run, the final one included."""
    curve = r.get("curve") or []
    pts = [(c["train_s"], c["val_loss"]) for c in curve if c.get("val_loss") is not None and c.get("train_s")]
    if curve and r.get("val_loss") is not None and curve[-1].get("train_s"):
        pts.append((curve[-1]["train_s"], r["val_loss"]))
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


def table(runs) -> dict:
    """``{rate: [entry per config]}`` in :data:`TIME_TO_LOSS` order."""
    rows = _runs(runs)
    out = {}
    for rate in rates_in_order([dict(r, scenario="bandwidth") for r in rows]):
        at = sorted((r for r in rows if r["rate"] == rate),
                    key=lambda r: TIME_TO_LOSS.index(r["config"]) if r["config"] in TIME_TO_LOSS else 99)
        zero1 = next((r for r in at if r["config"] == "zero1"), None)
        target = zero1.get("val_loss") if zero1 else None
        zero1_s = (val_time_points(zero1) or [(None, None)])[-1][0] if zero1 else None
        ref_tokens = val_points(zero1) if zero1 else []
        entries = []
        for r in at:
            e = {k: r.get(k) for k in ("config", "tokens_per_s", "steps_per_s", "iface_tx_bytes_per_step",
                                        "ring_bytes_sent_per_step", "comm_hidden_pct", "val_loss", "steps",
                                        "mean_counts_per_commit", "tokens_last_step")}
            pts = val_time_points(r)
            e["train_s"] = pts[-1][0] if pts else None
            e["seconds_to_target"] = seconds_to(pts, target) if target is not None else None
            e["vs_zero1"] = e["seconds_to_target"] / zero1_s if e["seconds_to_target"] and zero1_s else None
            z_bytes = zero1.get("iface_tx_bytes_per_step") if zero1 else None
            e["bytes_vs_zero1"] = (r["iface_tx_bytes_per_step"] / z_bytes
                                   if r.get("iface_tx_bytes_per_step") and z_bytes else None)
            tok = val_points(r)
            if tok and ref_tokens:
                at_tokens = min(tok[-1][0], ref_tokens[-1][0])
                mine, ref = _interp(tok, at_tokens), _interp(ref_tokens, at_tokens)
                e["val_equal_tokens"] = mine
                e["val_rel_vs_zero1"] = (mine - ref) / ref if mine is not None and ref else None
                e["equal_tokens"] = at_tokens
            entries.append(e)
        out[rate] = {"target": target, "zero1_s": zero1_s, "entries": entries}
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
                out.append(_target(f"{cfg} interface bytes per optimizer step vs ZeRO-1 fp32 at {rate}",
                                   by[cfg]["bytes_vs_zero1"], 0.5, "<=", "veth tx bytes per step, per worker"))
        ratios = {c: by[c]["vs_zero1"] for c in ACCO if c in by and by[c].get("vs_zero1") is not None}
        best = min(ratios, key=ratios.get) if ratios else None
        limit = 0.5 if rate in SLOW else 1.0
        out.append(_target(f"best ACCO setting reaches ZeRO-1's final validation loss at {rate}, time vs ZeRO-1",
                           ratios.get(best), limit, "<=",
                           f"best: {best}; ZeRO-1 {block['zero1_s'] and round(block['zero1_s'], 1)} s, target val "
                           f"{block['target'] and round(block['target'], 4)}"))
        if "acco_lowbit_fixed" in by and by["acco_lowbit_fixed"].get("val_rel_vs_zero1") is not None:
            rel = by["acco_lowbit_fixed"]["val_rel_vs_zero1"]
            out.append(_target(f"acco_lowbit_fixed validation loss vs ZeRO-1 at equal tokens at {rate}", abs(rel),
                               0.01, "<=", f"relative difference {100 * rel:+.2f}%"))
    return out


def print_table(t: dict, p: Callable[..., None]) -> None:
    if not t:
        return
    f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    p("\n## seconds to stock ZeRO-1's final validation loss (training seconds, evaluation excluded)")
    p("| rate | config | seconds to target | vs ZeRO-1 | iface MB/step | bytes vs ZeRO-1 | tokens/s | steps "
      "| mb/commit | val loss at equal tokens | vs ZeRO-1 |")
    p("|---|---|---|---|---|---|---|---|---|---|---|")
    for rate, block in t.items():
        for e in block["entries"]:
            reached = f(e["seconds_to_target"], ".1f") if e["seconds_to_target"] is not None else (
                f"not in {f(e['train_s'], '.0f')}")
            rel = e.get("val_rel_vs_zero1")
            p(f"| {rate} | {e['config']} | {reached} | {f(e['vs_zero1'], '.2f')}x "
              f"| {f(e['iface_tx_bytes_per_step'] and e['iface_tx_bytes_per_step'] / 1e6, '.3f')} "
              f"| {f(e['bytes_vs_zero1'], '.3f')}x | {f(e['tokens_per_s'], '.0f')} | {f(e['steps'], 'd')} "
              f"| {f(e['mean_counts_per_commit'], '.1f')} | {f(e.get('val_equal_tokens'), '.4f')} "
              f"| {'-' if rel is None else format(100 * rel, '+.2f') + '%'} |")
        p(f"| {rate} | target | val loss {f(block['target'], '.4f')} | ZeRO-1 {f(block['zero1_s'], '.1f')} s "
          "| | | | | | | |")
