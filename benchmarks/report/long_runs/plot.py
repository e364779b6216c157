"""The long runs in one picture (``delay_penalty.png`` beside ``long_runs.json``): per two-host bed, each config's
delay penalty along the run and its seconds to the fair baseline's three losses.

Why a picture: the question the long runs answer is a trend (does ACCO's one-step delay stop costing loss per
token as the rate decays?), which a row of four numbers hides and a line shows; the seconds beside it say what the
penalty costs in time, where the faster rounds pay it back.
"""

from __future__ import annotations

from typing import Optional

from benchmarks.sweep.configs import LR_SCALED

from .summary import REFERENCE, two_host_beds

NAME = "delay_penalty.png"


def plot(summary: dict, path: str, labels: Optional[dict] = None) -> Optional[str]:
    """Writes the figure to ``path``; None (and no file) where no two-host shaped bed has runs."""
    beds = two_host_beds(summary)
    if not beds:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or {}
    fig, axes = plt.subplots(len(beds), 2, figsize=(12, 4.2 * len(beds)), squeeze=False)
    for (left, right), key in zip(axes, beds):
        rows = summary[key]["rows"]
        configs = [c for c in rows if c not in LR_SCALED]  # (the learning-rate check: a table of its own)
        for config in configs:
            pen = rows[config]["penalty"]
            xs = [c for c in sorted(pen) if pen[c]["median"] is not None]
            if config != REFERENCE and xs:  # whose penalty is 1 by definition
                left.plot([100 * c for c in xs], [pen[c]["median"] for c in xs], marker="o",
                          label=labels.get(config, config))
        left.axhline(1.0, color="grey", lw=0.8, ls="--")
        left.set(xlabel="% of the fair baseline's token budget", ylabel="tokens to its loss / sync low-bit's")
        left.set_title(f"{key[0]}, {key[1]}: the delay penalty (medians over seeds)", fontsize=9)
        left.legend(fontsize=7)
        fractions = sorted(rows[configs[0]]["seconds"])
        width = 0.8 / len(fractions)
        for i, f in enumerate(fractions):
            figs = [rows[c]["seconds"][f] for c in configs]
            where = [j + (i - (len(fractions) - 1) / 2) * width for j in range(len(configs))]
            bars = right.bar(where, [g["median"] or 0.0 for g in figs], width, capsize=2,
                             yerr=[(g["spread"] or 0.0) / 2 for g in figs], label=f"to its loss at {f:.0%}")
            for bar, g in zip(bars, figs):
                if g["reached"] < g["of"]:  # a median of the seeds that got there: not a time to the loss
                    bar.set_hatch("//")
        right.set_xticks(range(len(configs)), [labels.get(c, c) for c in configs], rotation=30, ha="right",
                         fontsize=7)
        right.set_ylabel("training seconds (median; bar: spread)")
        right.set_title(f"{key[0]}, {key[1]}: seconds to the baseline's loss (0: never; hatched: not every seed)",
                            fontsize=9)
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
