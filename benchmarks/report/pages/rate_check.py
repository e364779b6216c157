"""The learning-rate check on the long-runs page: sync low-bit and acco fixed at half the batch (the best-tuned sync
and the overlap at its batch) and at the bed's, each at 0.5, 1, 2 and 4 times the peak learning rate every config
shares (``benchmarks.sweep.configs.LR_SCALED``).

Why it has a table of its own: "best-tuned sync" tunes the batch (half of it); a skeptical reader asks whether the
rate, set once for the configured batch, is the one either config at half the batch would pick, and whether the
overlap would prefer another rate than sync. Its columns are the seeds' seconds to the same three losses as the
seconds table, so a row here compares with that table's rows of the same machine.
"""

from __future__ import annotations

import statistics
from typing import Optional

from benchmarks.sweep import configs as cfgs

from .. import long_runs as lr
from .cells import md_table

CAPTION = ("Is the learning rate every config shares tuned? Sync low-bit and acco fixed, at half the batch (the "
           "best-tuned sync and the overlap at its batch) and at the bed's, at 0.5 to 4 times the peak rate (warm-up "
           "and decay unchanged): seconds to the fair baseline's losses (median; spread; seeds that got there, where "
           "not all), the fastest rate to each loss in bold, the final validation loss (median), and acco's delay at "
           "each rate: its tokens to the 75% loss over sync's at the same batch and rate (median of the seeds' "
           "ratios)")


SYNC_OF = {"acco_lowbit_int4_fixed_half": "sync_lowbit_half", "acco_lowbit_int4_fixed": "sync_lowbit"}
"""Each acco base config's sync at the same batch: at the same rate, their tokens to a loss differ by acco's delay."""
DELAY_AT = 0.75
"""The loss (fraction of the baseline's budget) the delay column is taken at: the issue's overlap target's."""


def _sync_of(config: str) -> Optional[str]:
    """An acco config's sync at the same batch and rate (None for a sync config)."""
    base, _ = cfgs.lr_scaled(config) or (config, 1.0)
    return SYNC_OF[base] + config[len(base):] if base in SYNC_OF else None


def delay(block: dict, config: str) -> str:
    """Acco's tokens to the 75% loss over its sync's at the same batch and rate, the median of the seeds' ratios
    ("-" for a sync row, or where some seed's pair did not both get there): the one-step delay's cost at that rate."""
    rows = [block["rows"].get(c) for c in (config, _sync_of(config))]
    if not all(rows):
        return "-"
    mine, sync = (dict(zip(r["seeds"], r["penalty"][DELAY_AT]["each"])) for r in rows)
    if set(mine) != set(sync) or not all(mine.values()) or not all(sync.values()):
        return "-"
    return f"{statistics.median(mine[s] / sync[s] for s in mine):.3f}"


def final_gap(block: dict, config: str) -> str:
    """Acco's median final validation loss over its sync's at the same batch and rate, as a signed percentage."""
    sync = block["rows"].get(_sync_of(config))
    mine = block["rows"][config].get("final_loss")
    if not sync or not mine or not sync.get("final_loss"):
        return "-"
    return f"{100 * (mine / sync['final_loss'] - 1):+.2f}%"


def _rates() -> dict[str, list[tuple[float, str]]]:
    """Per base config, ``(scale, config)`` from the lowest rate up, the base itself at 1."""
    out: dict = {}
    for c in cfgs.LR_SCALED:
        base, scale = cfgs.lr_scaled(c)
        out.setdefault(base, [(1.0, base)]).append((scale, c))
    return {base: sorted(v) for base, v in out.items()}


def table(summary: dict, seconds_cell, bed_name) -> str:
    """One row per bed, base config and rate, where the check ran on the bed (an empty table elsewhere);
    ``seconds_cell`` and ``bed_name`` format a seconds figure and a bed as the seconds table does."""
    rows = []
    for key in lr.two_host_beds(summary):
        block = summary[key]
        if not any(c in block["rows"] for c in cfgs.LR_SCALED):
            continue
        first = True
        for base, rates in _rates().items():
            ran = [(scale, c) for scale, c in rates if c in block["rows"]]
            if len(ran) < 2:  # (the base alone: no other rate ran at that batch)
                continue
            fastest = {f: lr.best(block, [c for _, c in ran], f)[0] for f in lr.FRACTIONS}
            for scale, c in ran:
                row = block["rows"][c]
                cells = [seconds_cell(row["seconds"][f]) if block["targets"][f] is not None else "-"
                         for f in lr.FRACTIONS]
                cells = [f"**{cell}**" if fastest[f] == c and cell not in ("-", "never") else cell
                         for f, cell in zip(lr.FRACTIONS, cells)]
                loss = row.get("final_loss")
                rows.append([bed_name(*key) if first else "", lr.SHORT.get(base, base), f"{scale:g}x"] + cells
                            + ["-" if loss is None else f"{loss:.4f}", delay(block, c)])
                first = False
    return md_table(["bed", "config", "peak rate"] + [f"{f:.0%} loss" for f in lr.FRACTIONS]
                    + ["final val loss", f"acco's tokens to the {DELAY_AT:.0%} loss over sync's"], rows)


def loss_rows(summary: dict, bed_name, where: str) -> list[list[str]]:
    """BENCHMARKS.md's "where ds_acco loses" rows of the check, on each bed it ran on (``where``: whose runs, e.g.
    "second machine"): acco's delay at each rate it ran at, and the better ACCO against the better sync each at its
    best rate, where that misses the issue's 0.85."""
    rows = []
    for key in lr.two_host_beds(summary):
        block = summary[key]
        if not any(c in block["rows"] for c in cfgs.LR_SCALED):
            continue
        for base in SYNC_OF:
            cells = [f"{scale:g}x: {final_gap(block, c)} final loss, {d}x the tokens"
                     for scale, c in _rates().get(base, []) if c in block["rows"] and (d := delay(block, c)) != "-"]
            if len(cells) > 1:
                rows.append([f"{lr.SHORT[base]} against sync at the same batch, by peak learning rate ({where}, "
                             f"{bed_name(*key)}): its final validation loss, its tokens to the {DELAY_AT:.0%} loss",
                             "; ".join(cells)])
        for t in lr.targets({key: block}):
            if t.get("about") == "rate" and t["met"] is False:
                rows.append([f"long runs ({where}): the better ACCO vs the better sync low-bit to the 75% loss, each "
                             "at its best learning rate", f"{t['value']:.2f} (limit <= 0.85; {t['detail']})"])
    return rows
