"""The overlap's ceiling: the most any overlap of a sync config's rounds could save, and what keeps ACCO from it.

Why: the issue's overlap targets ask ACCO for at most 0.85x the better sync's seconds to a loss. An overlap hides
the time sync's training thread waits for its rounds, and nothing else. At sync's batch (the same micro-batches per
commit: the same tokens to a loss, but for the one-step delay) a perfect overlap takes the longer of sync's compute
and its wait, ``max(1 - w_sync, w_sync)`` of sync's time, where ``w_sync`` is the slowest rank's waited share of its
steady steps (the other ranks wait for it as well as for the link: :func:`~.summary.slowest_rank`; the wait holds the
round's CPU work as well as the wire's time). No overlap goes below this ceiling; a target under it asks for more than
the bed's communication holds, and a bed's communication share is the bed's, not ds_acco's.

What keeps ACCO above it, from the slowest rank of each run, seed by seed:

* the **compute tax**: ACCO's compute per micro-batch over sync's, where a round's CPU work and the link's network
  stack share the host's core with compute (on a GPU host they would not: the compute is not on the core);
* ACCO's own **exposed wait** ``w_acco``: a round that outlasts the compute beside it;

so a whole run (the same tokens) takes ``tax x (1 - w_sync) / (1 - w_acco)`` of sync's training seconds, which each
row checks against the measured ratio; times the delay's tokens to the 75% loss over sync's, that gives the seconds
to it, the target's ratio.
"""

from __future__ import annotations

from typing import Optional

from .summary import ACCO, REFERENCE, SYNC_LOWBIT, _median, _ratio, two_host_beds

EQUAL_BATCH = ((ACCO[0], REFERENCE, "equal batch"), (ACCO[2], SYNC_LOWBIT[1], "equal batch, half the bed's"))
"""The overlap at equal batch: the issue's pair at the bed's batch, and the same at half of it where both ran."""
FIGURES = ("sync_wait", "ceiling", "tax", "acco_wait", "modelled", "whole_run", "tokens", "perfect", "seconds")
"""One pair's figures (:func:`seed_figures`), medians over its seeds in :func:`ceilings`."""


def seed_figures(acco: dict, sync: dict) -> Optional[dict]:
    """One seed's figures of an acco run against a sync run at its batch (their ``each_seed`` entries of
    :func:`~.summary.summarize`); None where either recorded no rank figures."""
    a, s = acco["slowest"], sync["slowest"]
    if not a or not s:
        return None
    ceiling, tax = _ceiling(s["wait"]), a["compute_s"] / s["compute_s"]
    tokens = _ratio(acco["tokens"], sync["tokens"])
    return {"sync_wait": s["wait"], "ceiling": ceiling, "tax": tax, "acco_wait": a["wait"],
            "modelled": tax * (1.0 - s["wait"]) / (1.0 - a["wait"]),
            "whole_run": _ratio(acco["train_s"], sync["train_s"]), "tokens": tokens,
            "perfect": None if tokens is None else ceiling * tokens,
            "seconds": _ratio(acco["seconds"], sync["seconds"])}


def pair(block: dict, acco: str, sync: str) -> Optional[dict]:
    """Medians over the seeds both configs ran (each figure over the seeds it is known in), and the seeds; None
    where no seed pairs."""
    rows = [block["rows"].get(c) for c in (acco, sync)]
    if not all(rows):
        return None
    seeds = sorted(set(rows[0]["each_seed"]) & set(rows[1]["each_seed"]))
    each = [f for f in (seed_figures(rows[0]["each_seed"][s], rows[1]["each_seed"][s]) for s in seeds) if f]
    if not each:
        return None
    return {k: _median([f[k] for f in each]) for k in FIGURES} | {"seeds": len(each)}


def ceilings(summary: dict) -> list[dict]:
    """Per shaped two-host bed, each equal-batch pair that ran: :func:`pair`'s figures, with the bed and pair."""
    found = []
    for key in two_host_beds(summary):
        for acco, sync, batch in EQUAL_BATCH:
            figures = pair(summary[key], acco, sync)
            if figures:
                found.append({"bed": key, "acco": acco, "sync": sync, "batch": batch, **figures})
    return found


def sync_ceiling(block: dict, sync: str) -> Optional[float]:
    """The ceiling of any overlap of ``sync``'s rounds (:func:`_ceiling`), median over seeds."""
    row = block["rows"].get(sync)
    return _median([_ceiling(e["slowest"]["wait"]) for e in row["each_seed"].values() if e["slowest"]]) if row else None


def _ceiling(wait: float) -> float:
    """A perfect overlap's share of a sync step whose slowest rank waits ``wait`` of it: the longer of the compute
    and the wait, which it runs side by side."""
    return max(1.0 - wait, wait)

