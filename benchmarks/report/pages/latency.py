"""What a link's latency costs each config: the long runs' real bed at one rate with and without a one-way latency
(``python -m benchmarks.protocol --delay 25ms``), on the same machine and seeds.

Why a table of its own: real links between sites have tens of milliseconds, and the beds had none until the
delaying switch (:mod:`benchmarks.cluster.delay_switch`). Every collective pays a round trip per piece and per
handshake. A mode that waits for its rounds (sync) pays them in every step; a mode whose rounds run behind compute
(acco, streaming) pays them only where a round outlasts the compute beside it. The seconds tables show which config
is fastest with latency; this one shows how much of the latency each config hides, seed for seed (the same seeds
train the same losses, so a seed's ratio carries the link's cost and not the loss curve's noise).
"""

from __future__ import annotations

import re
import statistics
from typing import Callable, Optional

from .. import long_runs as lr
from .cells import md_table, span

LATENCY = re.compile(r"-lat(\d+(?:\.\d+)?)ms$")
"""The suffix :func:`benchmarks.report.repeats.bed_of` gives a bed whose links have a one-way latency."""
AT = 0.75
"""The loss (fraction of the baseline's budget) the seconds are taken to: the issue's overlap target's."""


def latency_ms(bed: str) -> Optional[str]:
    """A bed's one-way latency in ms as its name writes it (None: none)."""
    m = LATENCY.search(bed)
    return m.group(1) if m else None


def without_latency(bed: str) -> str:
    return LATENCY.sub("", bed)


def pairs(summary: dict) -> list[tuple[tuple, tuple]]:
    """(bed with latency, the same bed and rate without) for every such bed whose twin ran too."""
    return [(key, (without_latency(key[0]), key[1])) for key in summary
            if latency_ms(key[0]) and (without_latency(key[0]), key[1]) in summary]


def _each(row: dict, what: str) -> dict:
    return {seed: fig[what] for seed, fig in row["each_seed"].items() if fig.get(what)}


def seed_ratios(late: dict, plain: dict, what: str) -> list[float]:
    """Seed for seed, ``what`` (``seconds`` to the 75% loss or ``train_s``) with latency over without."""
    a, b = _each(late, what), _each(plain, what)
    return [a[s] / b[s] for s in sorted(set(a) & set(b))]


def _cell(ratios: list[float]) -> str:
    return "-" if not ratios else f"{statistics.median(ratios):.2f}x ({span(ratios, '.2f')})"


CAPTION = ("What the link's latency costs each config, on this machine and the same seeds: seconds to the fair "
           "baseline's 75% loss with the latency and without it (median; spread; how many reached it where not all "
           "did), and each seed's seconds with it over "
           "its seconds without it (median, range), to that loss and for a whole run's training (the same tokens: no "
           "loss curve's noise); a config that hides the latency behind its compute reads near 1x")


def table(summary: dict, bed_name: Callable[[str, str], str], seconds: Callable[[dict], str]) -> str:
    """One row per config that ran on both beds of each pair (:func:`pairs`); empty where no pair ran. ``seconds``
    writes a figure as the seconds tables do."""
    rows = []
    for late_key, plain_key in pairs(summary):
        late, plain = summary[late_key]["rows"], summary[plain_key]["rows"]
        first = True
        for config in [c for c in late if c in plain]:
            vs = late[config]["vs_sync"][AT]
            rows.append([bed_name(*late_key) if first else "", lr.SHORT.get(config, config),
                         seconds(late[config]["seconds"][AT]), "-" if vs is None else f"{vs:.2f}x",
                         seconds(plain[config]["seconds"][AT]),
                         _cell(seed_ratios(late[config], plain[config], "seconds")),
                         _cell(seed_ratios(late[config], plain[config], "train_s"))])
            first = False
    if not rows:
        return ""
    return md_table(["bed", "config", f"s to the {AT:.0%} loss, with", "over sync fp32's, with", "without",
                     "with over without, to that loss", "a whole run"], rows)


COMMAND = ("python -m benchmarks.protocol --beds real --seeds 4,5,6 --rates 100mbit --delay 25ms --configs "
           "sync,sync_lowbit_half,acco_lowbit_int4_fixed_half,auto_lowbit_int4,auto_lowbit_int4_streaming,"
           "streaming_int8_half,torchft_diloco_half --out bench_results/long_runs_machine2")
"""How the bed with latency ran (as root): one folder per seed, ``real_lat25ms_seed*``, beside the same machine's
runs without latency."""


def block(summary: dict, bed_name: Callable[[str, str], str], seconds: Callable[[dict], str]) -> str:
    """The table with how it ran, for the latency section of docs/lowbit-and-streaming.md; one line where no bed
    with latency ran beside its twin."""
    found = table(summary, bed_name, seconds)
    if not found:
        return "**No runs yet** of a long-run bed with latency beside the same bed without it."
    return (f"{CAPTION}:\n\n{found}\n\n`{COMMAND}`; the runs without latency: [long runs](long-runs.md), second "
            "machine; raw files: [bench_results/long_runs_machine2/](../bench_results/long_runs_machine2/)")
