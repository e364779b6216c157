"""The ``streaming`` part of a sweep: bytes per optimizer step, peak bytes, loss at equal tokens.

Every run of the part trains the same model on the same tokens per optimizer
step (an inner step for Streaming DiLoCo) over the same shaped link, so the
rows compare directly:

* ``iface MB/step``: bytes this worker put on its veth per optimizer step in the
  steady window (measured; includes gloo framing and TCP/IP headers);
* ``iface peak MB/step``: the busiest single step of that window: a whole
  ZeRO-1 step, or one fragment round for streaming. What a link must carry in
  one step to keep up;
* ``ring MB/step`` and ``peak round MB``: ds_acco's own accounting of payload
  bytes sent per step and by its largest round (streaming: one fragment);
* ``vs ZeRO-1``: each figure over ZeRO-1's fp32 one (bytes of fp32 DDP);
  ``zero1_bf16`` shows what bf16 DDP would send.

The bar chart of these figures is :func:`benchmarks.report.plots.streaming_bytes`.
"""

from __future__ import annotations

from typing import Callable

from benchmarks.sweep.configs import STREAMING_COMPARISON

from .curves import interp, val_points

SCENARIO = "streaming"


def _runs(result_or_runs) -> list[dict]:
    runs = result_or_runs["runs"] if isinstance(result_or_runs, dict) else result_or_runs
    return [r for r in runs if r.get("ok") and r["scenario"] == SCENARIO]


def streaming_table(runs: list[dict]) -> list[dict]:
    """One entry per config of the part, in :data:`STREAMING_COMPARISON` order."""
    rows = sorted(_runs(runs), key=lambda r: STREAMING_COMPARISON.index(r["config"])
                  if r["config"] in STREAMING_COMPARISON else 99)
    zero1 = next((r for r in rows if r["config"] == "zero1"), None)
    ref_curve = val_points(zero1) if zero1 else []
    out = []
    for r in rows:
        entry = {k: r.get(k) for k in ("config", "rate", "steps", "tokens_per_s", "iface_tx_bytes_per_step",
                                        "iface_tx_peak_bytes_per_step", "ring_bytes_sent_per_step",
                                        "peak_round_bytes", "comm_hidden_pct", "val_loss", "final_train_loss")}
        if zero1 is not None:
            for key in ("iface_tx_bytes_per_step", "iface_tx_peak_bytes_per_step", "tokens_per_s"):
                a, b = r.get(key), zero1.get(key)
                entry[f"{key}_vs_zero1"] = a / b if a is not None and b else None
        pts = val_points(r)
        if pts and ref_curve:
            tokens, val = pts[-1]
            ref = interp(ref_curve, tokens)
            entry["val_tokens"] = tokens
            entry["val_rel_diff_vs_zero1"] = (val - ref) / ref if ref else None
        out.append(entry)
    return out


def print_streaming(table: list[dict], p: Callable[..., None]) -> None:
    if not table:
        return
    mb = lambda x, spec=".3f": "-" if x is None else format(x / 1e6, spec)  # noqa: E731
    ratio = lambda x: "-" if x is None else f"{x:.3f}x"  # noqa: E731
    p(f"\n## streaming vs ZeRO-1 and acco at {table[0]['rate']} (per worker; ratios vs fp32 ZeRO-1 = fp32 DDP bytes)")
    p("| config | iface MB/step | vs ZeRO-1 | iface peak MB/step | vs ZeRO-1 | ring MB/step | peak round MB "
      "| tokens/s | vs ZeRO-1 | hidden % | val loss | vs ZeRO-1 at equal tokens |")
    p("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for e in table:
        rel = e.get("val_rel_diff_vs_zero1")
        p(f"| {e['config']} | {mb(e['iface_tx_bytes_per_step'])} | {ratio(e.get('iface_tx_bytes_per_step_vs_zero1'))} "
          f"| {mb(e['iface_tx_peak_bytes_per_step'])} | {ratio(e.get('iface_tx_peak_bytes_per_step_vs_zero1'))} "
          f"| {mb(e['ring_bytes_sent_per_step'])} | {mb(e['peak_round_bytes'])} "
          f"| {'-' if e['tokens_per_s'] is None else format(e['tokens_per_s'], '.0f')} "
          f"| {ratio(e.get('tokens_per_s_vs_zero1'))} "
          f"| {'-' if e['comm_hidden_pct'] is None else format(e['comm_hidden_pct'], '.1f')} "
          f"| {'-' if e['val_loss'] is None else format(e['val_loss'], '.4f')} "
          f"| {'-' if rel is None else format(100 * rel, '+.2f') + '%'} |")
