"""The issue's targets from :func:`~benchmarks.report.long_runs.summary.summarize`'s figures: the overlap's two
targets on each bed that sets them, auto against every config and sync low-bit on every bed, ds_acco against
torchft at 25 Mbit/s, and the workers beds' checks. Each row says the ratio of medians the verdict is on and,
where seeds pair, each seed's ratio (:func:`by_seed`).
"""

from __future__ import annotations

from typing import Optional

from benchmarks.protocol.plans import TORCHFT
from benchmarks.sweep.configs import LR_SCALED, lr_scaled

from ..curves import target
from .ceiling import EQUAL_BATCH, sync_ceiling
from .summary import ACCO, AUTO, REFERENCE, SHORT, SYNC_LOWBIT, _ratio, best, seconds, shaped, workers


def by_seed(block: dict, config: str, against: str, fraction: float = 0.75) -> str:
    """``; by seed (seeds): ratios``: the config's seconds over ``against``'s, seed for seed ("-" where either never
    got there), or "" where fewer than two seeds pair. A ratio of medians can pass a target that one seed in three
    misses by far, or the reverse: the seeds say which."""
    rows = [block["rows"].get(c) for c in (config, against)]
    if not all(rows):
        return ""
    each = [dict(zip(r["seeds"], r["seconds"][fraction]["each"])) for r in rows]
    common = sorted(set(each[0]) & set(each[1]))
    if len(common) < 2:
        return ""
    cells = ["-" if (r := _ratio(each[0][s], each[1][s])) is None else f"{r:.2f}" for s in common]
    return f"; by seed ({', '.join(map(str, common))}): {', '.join(cells)}"


OVERLAP_BEDS = ((("long-real", "100mbit"), "(real compute, 100 Mbit/s)", None),
                (("long-real-host1@50%", "100mbit"), "(real compute, one host at half speed, 100 Mbit/s)",
                 "another bed"),
                (("long-sleep", "100mbit"), "(sleep bed, 100 Mbit/s)", "another bed"),
                (("long-real-lat25ms", "100mbit"), "(real compute, 100 Mbit/s, 25 ms one way)", "another bed"))
"""Where the overlap's two targets are checked, and the rows' ``about``: the issue sets them on real compute; the
same is asked with one host at half speed (mixed hardware, where the adaptive policy is built to pay) and on the
sleep bed (compute off the CPU, as on a GPU), where the round's host work does not compete with the compute; and on
real compute with 25 ms one way on the link (a link between sites), where a round's pieces each pay a round trip."""


def _overlap_targets(block: dict, where: str, about: Optional[str]) -> list[dict]:
    """The better ACCO against the better sync low-bit to the 75% loss, and acco fixed against sync low-bit at
    equal batch to the final loss, on one bed and link."""
    acco, acco_s = best(block, ACCO)
    low, low_s = best(block, SYNC_LOWBIT)
    ceiling = sync_ceiling(block, low) if low else None
    limit = "" if ceiling is None else (f"; a perfect overlap of {low}'s rounds would take {ceiling:.2f} of its "
                                        "time at its tokens (the overlap's ceiling)")
    found = [target(f"the better ACCO vs the better sync low-bit to the baseline's 75% loss {where}",
                    _ratio(acco_s, low_s), 0.85, "<=", f"{acco} against {low}" + by_seed(block, acco, low) + limit)]
    if any(c in block["rows"] for c in LR_SCALED):  # the learning-rate check ran on this bed
        acco, acco_s = best(block, ACCO + tuple(c for c in LR_SCALED if lr_scaled(c)[0] in ACCO))
        low, low_s = best(block, SYNC_LOWBIT + tuple(c for c in LR_SCALED if lr_scaled(c)[0] in SYNC_LOWBIT))
        found.append(target(f"the same, each at the best of the learning rates it ran at {where}",
                            _ratio(acco_s, low_s), 0.85, "<=", f"{acco} against {low}" + by_seed(block, acco, low)))
        found[-1]["about"] = "rate"  # a question of the baseline's tuning, asked where the check ran
    for fixed, sync, batch in EQUAL_BATCH:
        if (batch != "equal batch" or about) and not (fixed in block["rows"] and sync in block["rows"]):
            continue  # a pair where both ran; the issue's own pair on the issue's own bed always
        short = [f"{SHORT[c]} reached it in {fig['reached']} of {fig['of']} seeds" for c in (fixed, sync)
                 if c in block["rows"] and (fig := block["rows"][c]["seconds"][1.0])["reached"] < fig["of"]]
        found.append(target(f"acco fixed vs sync low-bit at {batch} to the baseline's final loss {where}",
                            None if short else _ratio(seconds(block, fixed, 1.0), seconds(block, sync, 1.0)), 0.90,
                            "<=", "; ".join(short) or "ratio of medians; none where either did not run"
                            + by_seed(block, fixed, sync, 1.0)))
        if short:  # a seed that never gets there loses the race: no median of the others stands for it
            found[-1]["met"] = False
    for t in found if about else ():
        t["about"] = about
    return found


def targets(summary: dict) -> list[dict]:
    """The issue's targets, from :func:`summarize`; auto's on every bed as one row each, its worst bed's ratio."""
    found = []
    for key, where, about in OVERLAP_BEDS:
        if summary.get(key):
            found += _overlap_targets(summary[key], where, about)
    for auto in AUTO:
        of_all, of_low, of_own = {}, {}, {}
        for key in shaped(summary):
            b = summary[key]
            if seconds(b, auto) is not None:
                everything, all_s = best(b, list(b["rows"]))
                of_all[key] = (_ratio(seconds(b, auto), all_s), everything)
                if REFERENCE in b["rows"]:  # (a bed that ran a few configs may leave it out)
                    of_low[key] = (_ratio(seconds(b, auto), seconds(b, REFERENCE)), REFERENCE)
                if "streaming" not in auto:  # what it may run: gradient rounds, no streaming, no peer
                    own, own_s = best(b, [c for c in b["rows"] if "streaming" not in c and c not in TORCHFT])
                    of_own[key] = (_ratio(seconds(b, auto), own_s), own)
        for ratios, what, limit in ((of_all, "within 1.05x of the best config of all", 1.05),
                                    (of_own, "within 1.05x of the best config that does not stream (what it may "
                                     "run)", 1.05),
                                    (of_low, "never worse than sync low-bit", 1.0)):
            known = {k: v for k, v in ratios.items() if v[0] is not None}
            if ratios:
                worst = max(known, key=lambda k: known[k][0]) if len(known) == len(ratios) else None
                found.append(target(f"{auto} {what}, on every bed", known[worst][0] if worst else None, limit, "<=",
                                    f"worst bed: {worst[0]} {worst[1]}; against {known[worst][1]}"
                                    + by_seed(summary[worst], auto, known[worst][1]) if worst else
                                    "a bed where the ratio is unknown (a config never reached the loss)"))
                if ratios is of_own:  # a reading of the target, not the target: off BENCHMARKS.md's table
                    found[-1]["about"] = "modes"
    block = summary.get(("long-real", "25mbit"))
    peer, peer_s = best(block, TORCHFT)
    if peer:
        mine, mine_s = best(block, [c for c in block["rows"] if c not in TORCHFT + ("zero1", "zero1_overlap")])
        found.append(target("ds_acco's best vs torchft's best to the baseline's 75% loss (real compute, 25 Mbit/s)",
                            _ratio(mine_s, peer_s), 0.9, "<=", f"{mine} against {peer}" + by_seed(block, mine, peer)))
    light = [w for w in workers(summary) if w["sleep"] and not w["slow"]]
    gains = {w["hosts"]: w["gain_fixed"] for w in light}
    compute = {w["hosts"]: w["step_compute"] for w in light}
    if 8 in compute and 2 in compute:
        found.append(target("a step's compute at 8 workers within 1.10x of at 2 (light sleep bed: the cores are not "
                            "what the workers comparison measures)", _ratio(compute[8], compute[2]), 1.10, "<=",
                            "each rank's compute per sync step, medians"))
        found[-1]["about"] = "bed"  # a check of the bed, not of ds_acco
    if 8 in gains and 2 in gains:
        found.append(target("the overlap's gain over sync low-bit at 8 workers at least its gain at 2 (light sleep "
                            "bed)",
                            _ratio(gains[8], gains[2]), 1.0, ">=", "gain: sync low-bit's seconds over acco fixed's"))
    return found
