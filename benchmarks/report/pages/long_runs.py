"""The long-run tables (:mod:`benchmarks.report.long_runs` over the ``protocol`` sets of
``bench_results/sets.json``), or one line saying that no run exists yet: every table on docs/long-runs.md, the
issue's targets and what ran in BENCHMARKS.md (:func:`long_runs_summary`).

Why two blocks: each bed adds a dozen rows (seconds to three losses, the delay penalty); BENCHMARKS.md keeps to
what a reader decides with, its own page keeps every figure.

Why a set that may match nothing: the protocol takes hours on a quiet machine and runs after the code that
reports it; until its folders exist the page says so instead of showing numbers nobody measured. Its sets live
under ``protocol``, not ``sets``, because every folder a ``sets`` entry names must exist.
"""

from __future__ import annotations

import glob
import json
import os
import re

from benchmarks import results_file
from benchmarks.protocol import plans as plans_long
from benchmarks.sweep.configs import LR_SCALED

from .. import long_runs as lr
from ..curves import UNSHAPED
from ..long_runs import ceiling
from . import latency, rate_check
from . import sets as rs
from .cells import md_table
from .cells import x as times

SET = "long_runs"
SHORT = lr.SHORT
HALF = "sync_lowbit_half"
BEDS = {"long-real": "real compute", "long-real-host1@50%": "real compute, one host at half speed",
        "long-real-delay": "real compute, host 1 slowed by a sleep", "long-sleep": "sleep bed",
        "long-workers": "light sleep bed"}
NO_RUNS = ("**No runs yet**: `python -m benchmarks.protocol` runs it into `bench_results/long_runs/` (one "
           "folder per bed and seed); this block then shows each config's seconds to the fair baseline's loss at 50, "
           "75 and 100% of its budget, the delay penalty along the run, the link's cost, 2 to 8 workers and the "
           "issue's targets.")


def describe() -> str:
    """What the protocol runs, from its plan's own constants (so the page cannot drift from the code)."""
    return (f"The protocol (`benchmarks/protocol/plans.py`): the learning rate warms up, then decays to 0 at the end "
            f"of the budget (WarmupDecayLR; by committed tokens under the adaptive and auto policies, so every config "
            f"ends it at the same token count); {plans_long.REAL_STEPS} nominal steps on real compute, "
            f"{plans_long.SLEEP_STEPS} on the sleep bed; every config of the tables above, stock ZeRO-1 with and "
            "without `overlap_comm`, sync low-bit and streaming at half the batch and torchft's DiLoCo (at the bed's "
            "batch and at half of it) and Streaming DiLoCo; each "
            "bed also on an unshaped link (the link's cost: how much of the link a config hides); 2, 4 and 8 hosts "
            f"(each keeps its batch) and 4 with one at half speed on a light sleep bed ({plans_long.WORKERS_DELAY_MS} "
            "ms sleep per micro-batch of 2 x 64 tokens, so that 8 hosts' CPU work fits 2 cores: a target checks it); "
            "3 seeds or more.")


def folders(root: str = rs.ROOT, name: str = SET) -> list[str]:
    """The sweep folders of the protocol set ``name`` that hold a results file (none until it has run)."""
    with open(os.path.join(root, rs.INDEX), encoding="utf-8") as f:
        patterns = json.load(f).get("protocol", {}).get(name, {}).get("folders", [])
    found = []
    for pattern in patterns:
        for hit in sorted(glob.glob(os.path.join(root, "bench_results", pattern)), key=rs._natural):
            if results_file.exists(hit) and hit not in found:
                found.append(hit)
    return found


def bed_name(bed: str, rate: str) -> str:
    late, bed = latency.latency_ms(bed), latency.without_latency(bed)
    hosts = re.search(r"-(\d+)h(-slow)?$", bed)
    base = BEDS.get(lr.HOSTS_SUFFIX.sub("", bed), bed)
    if hosts:
        base += f", {hosts.group(1)} hosts" + (", one at half speed" if hosts.group(2) else "")
    return f"{base}, {'unshaped' if rate == UNSHAPED else rate.replace('mbit', ' Mbit/s')}" + (
        f", {late} ms one way" if late else "")


def _seconds(fig: dict) -> str:
    """``median (spread; reached/of)``, ``never`` where no seed reached the loss, ``-`` where the config did not run."""
    if not fig["of"]:
        return "-"
    if not fig["reached"]:
        return "never"
    notes = [f"{fig['spread']:.1f}"] if fig["spread"] is not None else []
    notes += [f"{fig['reached']}/{fig['of']}"] if fig["reached"] < fig["of"] else []
    return f"{fig['median']:.1f}" + (f" ({'; '.join(notes)})" if notes else "")


def _ratio(fig: dict) -> str:
    return "-" if fig["median"] is None else f"{fig['median']:.2f}x"


def _configs(blocks: list[dict]) -> list[str]:
    seen = {c for b in blocks for c in b["rows"]} - set(LR_SCALED)  # (the learning-rate check's own table)
    return [c for c in lr.ORDER if c in seen] + sorted(seen - set(lr.ORDER))


def seconds_table(summary: dict) -> str:
    keys = lr.two_host_beds(summary)
    configs = _configs([summary[k] for k in keys])
    rows = []
    for key in keys:
        block = summary[key]
        for f in lr.FRACTIONS:
            loss = block["targets"][f]
            cells = [bed_name(*key) if f == lr.FRACTIONS[0] else "",
                     f"{f:.0%}: {loss:.3f}" if loss is not None else f"{f:.0%}: -"]
            cells += [_seconds(block["rows"][c]["seconds"][f]) if c in block["rows"] and loss is not None else "-"
                      for c in configs]  # no baseline in the folders: no target
            rows.append(cells)
    return md_table(["bed", "the baseline's loss at"] + [SHORT.get(c, c) for c in configs], rows)


def penalty_table(summary: dict) -> str:
    keys = lr.two_host_beds(summary)
    configs = [c for c in _configs([summary[k] for k in keys]) if c != lr.REFERENCE]
    rows = []
    for key in keys:
        block = summary[key]
        rows.append([bed_name(*key)] + [", ".join("-" if (m := block["rows"][c]["penalty"][p]["median"]) is None
                                                  else f"{m:.3f}" for p in lr.SHOWN)
                                        if c in block["rows"] else "-" for c in configs])
    return md_table(["bed"] + [SHORT.get(c, c) for c in configs], rows)


def _models(summary: dict, name: str):
    """``(bed, model, cells)`` for each two-host bed whose block holds the model ``name``; ``cells(field, spec)``
    formats the field at the checkpoints the tables show."""
    for key in lr.two_host_beds(summary):
        m = summary[key].get(name)
        if not m:
            continue
        at = {r["checkpoint"]: r for r in m["rows"]}

        def cells(field: str, spec: str = ".3f", at: dict = at) -> str:
            return ", ".join(format(at[c][field], spec) if c in at else "-" for c in lr.SHOWN)

        yield bed_name(*key), m, cells


def model_table(summary: dict) -> str:
    """Auto's lr-scaled delay penalty against acco fixed's measured one, per bed
    (:mod:`benchmarks.report.long_runs.penalty_model`)."""
    rows = [[bed, cells("measured"), f"{m['p_rate_scaled']:.3f} ({m['rms_rate_scaled']:.3f})",
             f"{m['p_constant']:.3f} ({m['rms_constant']:.3f})", cells("rate_scaled"),
             f"{m['preset']:g}: {cells('preset')}", "lr-scaled (auto's)" if m["holds"] else "**constant** (not auto's)"]
            for bed, m, cells in _models(summary, "penalty_model")]
    return md_table(["bed", "acco fixed's penalty at 25, 50, 75, 100%", "lr-scaled fit: p (rms)",
                     "constant fit: p (rms)", "the lr-scaled fit at 25 .. 100%",
                     "the preset's p, lr-scaled, at 25 .. 100%",
                     "fits better"], rows)


def batch_table(summary: dict) -> str:
    """Auto's price of a batch against half-batch sync's measured ratio, per bed where auto's runs logged the noise
    scale (:mod:`benchmarks.report.long_runs.batch_model`)."""
    rows = [[bed, cells("noise", ".2g"), cells("measured"), f"{cells('fixed_rate')} ({m['rms_fixed_rate']:.3f})",
             f"{cells('best_rate')} ({m['rms_best_rate']:.3f})",
             "fixed rate (auto's)" if m["holds"] else "**best rate** (not auto's)"]
            for bed, m, cells in _models(summary, "batch_model")]
    return md_table(["bed", "noise scale auto measured (micro-batches)", "measured", "at a fixed rate (rms)",
                     "at each batch's best rate (rms)", "fits better"], rows)


def link_table(summary: dict) -> str:
    """Only the beds and configs that ran unshaped too: a row of dashes says nothing the "not run yet" line does
    not."""
    keys = lr.shaped(summary)
    cost = {(k, c): r["link_cost"][0.75] for k in keys for c, r in summary[k]["rows"].items()
            if r["link_cost"][0.75]["median"] is not None}
    configs = [c for c in _configs([summary[k] for k in keys]) if any(kc[1] == c for kc in cost)]
    rows = [[bed_name(*key)] + [_ratio(cost[key, c]) if (key, c) in cost else "-" for c in configs]
            for key in keys if any(kc[0] == key for kc in cost)]
    return md_table(["bed"] + [SHORT.get(c, c) for c in configs], rows)


HOST_CONFIGS = (lr.REFERENCE, HALF, "acco_lowbit_int4_fixed", "acco_lowbit_int4_fixed_half",
                "acco_lowbit_int4_adaptive", "auto_lowbit_int4")


HOST_CAPTION = ("What a round costs the compute beside it: compute per micro-batch with a round in flight over in "
                "sync steps (in brackets, what that adds to a step); the training thread switched out a step; the "
                "kernel's network time on the host's core a step; the CPU a step of the round's own thread and of "
                "gloo's threads (recorded in runs since commit a2b48fb) (medians over ranks and seeds; real compute "
                "has one core per host, and the overlap hides a round's wire time, not these: the network time and "
                "the threads take the core from compute)")


def host_table(summary: dict) -> str:
    """Per two-host bed, each config's compute tax and what it adds to a step, the training thread's switches, the
    network stack's time and the round's thread's CPU a step (:func:`benchmarks.report.long_runs.summary.host_cost`):
    what the overlap cannot hide on these hosts, and how much of it the round's work on the core accounts for."""
    def ms(v) -> str:
        return "-" if v is None else f"{1e3 * v:.0f} ms"

    def cell(row: dict | None) -> str:
        c = (row or {}).get("host_cost") or {}
        if c.get("switches") is None:
            return "-"
        tax = "-" if c["tax"] is None else f"{c['tax']:.2f}x" + ("" if c.get("extra_s") is None
                                                                  else f" ({round(1e3 * c['extra_s']):+d} ms)")
        return f"{tax}; {c['switches']:.0f}; {ms(c['network_s'])}; {ms(c.get('round_cpu_s'))}; {ms(c.get('gloo_s'))}"
    keys = [k for k in lr.two_host_beds(summary) if any(cell(summary[k]["rows"].get(c)) != "-" for c in HOST_CONFIGS)]
    rows = [[bed_name(*k)] + [cell(summary[k]["rows"].get(c)) for c in HOST_CONFIGS] for k in keys]
    return md_table(["bed"] + [SHORT.get(c, c) for c in HOST_CONFIGS], rows)


CEILING = ("The overlap's ceiling, and what keeps ACCO from it (acco against sync low-bit at the same batch; the "
           "slowest rank's figures; medians over seeds of each seed's figure): sync's wait, its share of a step spent "
           "waiting for rounds; the ceiling, a perfect overlap's share of sync's time (the longer of its compute and "
           "that wait); acco's compute per micro-batch over sync's (the tax) and its own wait; a whole run's seconds "
           "over sync's, modelled as tax x (1 - sync's wait) / (1 - acco's wait), and measured; acco's tokens to the "
           "75% loss over sync's (the delay); a perfect overlap to that loss (the ceiling times those tokens), and "
           "acco measured")


def ceiling_table(summary: dict) -> str:
    """Per bed, each equal-batch pair's figures of :mod:`benchmarks.report.long_runs.ceiling`, medians over seeds."""
    def r(v):  # a ratio that may be unknown (a seed that never reached the loss)
        return "-" if v is None else f"{v:.2f}"
    rows = [[bed_name(*c["bed"]), f"{SHORT[c['acco']]} / {SHORT[c['sync']]}", f"{100 * c['sync_wait']:.0f}%",
             r(c["ceiling"]), times(c["tax"]), f"{100 * c['acco_wait']:.0f}%",
             f"{r(c['modelled'])}; {r(c['whole_run'])}", r(c["tokens"]), r(c["perfect"]), r(c["seconds"])]
            for c in ceiling.ceilings(summary)]
    return md_table(["bed", "acco / sync at its batch", "sync's wait", "the ceiling", "acco's compute tax",
                     "acco's wait", "whole run: modelled; measured", "tokens to the 75% loss",
                     "a perfect overlap to the 75% loss", "measured to the 75% loss"], rows)


def workers_table(summary: dict) -> str:
    """Seconds to the 75% loss per workers bed; half-batch sync and the gain against the better sync where a bed
    ran it (the batch control of a bed where acco adaptive commits smaller batches)."""
    found = lr.workers(summary)
    half = any(HALF in w["block"]["rows"] for w in found)
    configs = [c for c in plans_long.WORKERS] if not half else [
        c for pair in ((c, HALF) if c == lr.REFERENCE else (c,) for c in plans_long.WORKERS) for c in pair]
    gains = ("gain_fixed", "gain_best") + (("gain_vs_better_sync",) if half else ())
    rows = []
    for w in found:
        rows.append([f"{w['hosts']}" + (", one at half speed" if w["slow"] else "")
                     + ("" if w["sleep"] else ", real compute"), w["rate"]]
                    + [_seconds(w["block"]["rows"][c]["seconds"][0.75])
                       if c in w["block"]["rows"] and w["block"]["targets"][0.75] is not None else "-"
                       for c in configs]
                    + ["-" if w[g] is None else f"{w[g]:.2f}x" for g in gains]
                    + ["-" if w["step_compute"] is None else f"{w['step_compute']:.2f} s"])
    return md_table(["workers", "link"] + [SHORT[c] for c in configs]
                    + ["the overlap's gain: sync low-bit / acco fixed", "sync low-bit / the faster acco"]
                    + (["the better sync low-bit / the faster acco"] if half else []) + ["a step's compute"], rows)


def targets_table(summary: dict, issue_only: bool = False) -> str:
    """Every target row; ``issue_only`` (BENCHMARKS.md) leaves out the checks of a bed and the issue's targets
    asked again on a bed it did not set them on (the long-runs page shows both)."""
    mark = {True: "met", False: "**not met**", None: "unknown"}
    rows = [[t["target"], "-" if t["value"] is None else f"{t['value']:.2f}", f"{t['op']} {t['threshold']:g}",
             mark[t["met"]], t["detail"]] for t in lr.targets(summary) if not (issue_only and t.get("about"))]
    return md_table(["target", "measured", "limit", "", "detail"], rows)


def long_runs(root: str = rs.ROOT) -> str:
    """Every long-run table, or :data:`NO_RUNS`."""
    summary = _summary(root)
    if not summary:
        return f"{describe()}\n\n{NO_RUNS}"
    seconds = seconds_caption({k: summary[k] for k in lr.two_host_beds(summary)})
    penalty = ("The delay penalty: tokens to the baseline's loss at 25, 50, 75 and 100% of its budget over sync "
               "low-bit's (above 1: less loss per token)")
    model = ("Auto's model of the delay penalty (`acco_step_penalty` times the rate over its peak) against acco "
             "fixed's measured one: each model's one parameter fitted by least squares (rms: the residual)")
    batch = ("Auto's price of a batch: half-batch sync's tokens to the baseline's loss at 25, 50, 75 and 100% of "
             "its budget over sync low-bit's, measured and as each model predicts it from the noise scale auto's runs "
             "of the bed measured along the run (no parameter fitted; rms: the residual)")
    link = ("The link's cost: seconds to the 75% loss on the shaped link over seconds to it unshaped (1: the link is "
            "hidden; left out where the two runs may have run on machines not alike: the machines line below)")
    host = HOST_CAPTION
    parts = [(seconds, seconds_table(summary)), (penalty, penalty_table(summary)), (model, model_table(summary)),
             (batch, batch_table(summary)), (link, link_table(summary)), (host, host_table(summary)),
             (CEILING, ceiling_table(summary)),
             ("More workers (the light sleep bed unless said; each keeps its batch): seconds to the 75% loss",
              workers_table(summary)),
             (rate_check.CAPTION, rate_check.table(summary, _seconds, bed_name)),
             ("The issue's targets", targets_table(summary))]
    shown = [f"**{caption}**:\n\n{table}" for caption, table in parts if not _empty(table)]
    if os.path.isfile(os.path.join(root, "bench_results", "long_runs", lr.PLOT)) and not _empty(parts[1][1]):
        shown.insert(2, f"![The delay penalty along the run and the seconds to each loss, per bed]"
                        f"(../bench_results/long_runs/{lr.PLOT})")  # python -m benchmarks.report.long_runs draws it
    missing = [caption.split(":")[0] for caption, table in parts if _empty(table)
               and caption not in (batch, host, rate_check.CAPTION)]
    tail = [f"**Not run yet** (no runs of their beds): {'; '.join(missing)}."] if missing else []
    return "\n\n".join([describe()] + shown + [machines_note(summary)] + tail)


def machines_note(summary: dict) -> str:
    """How many runs were timed on :mod:`benchmarks.cluster.cpu_probe`, and where probed runs' machines differ."""
    ms = [block["machines"] for block in summary.values()]
    runs, probed = sum(m["runs"] for m in ms), sum(m["probed"] for m in ms)
    text = (f"**Machines**: {probed} of {runs} runs were timed on a fixed CPU workload just before they ran "
            "(`benchmarks/cluster/cpu_probe.py`; `python -m benchmarks.report.long_runs` prints each table's verdict)")
    if probed < runs:
        text += ("; the others predate it, and a table's rows may come from different sessions' machines, which "
                 "were not all equally fast: a ratio between rows of different sessions carries that")
    unlike = [bed_name(*key) for key, block in summary.items() if block["machines"]["alike"] is False]
    if unlike:
        text += f"; rows' median probes differ by more than {lr.MACHINE_SPREAD}x on: {', '.join(unlike)}"
    return text + "."


SECOND = "long_runs_machine2"
"""The protocol set of a bed re-run on another machine, every config together, reported apart: a target's verdict
may move with the machine, and a median pooled over two machines would sit between them and hide it, while
ratios between one machine's own rows compare configs alone."""
NO_SECOND = (f"**No runs yet** on a second machine (the protocol set `{SECOND}` of `bench_results/sets.json`).")


def second_machine(root: str = rs.ROOT) -> str:
    """The bed re-run on a second machine: its seconds and the issue's targets from its runs alone (its own
    fair baseline: the losses to reach are its sync fp32's), or :data:`NO_SECOND`."""
    summary = _summary(root, SECOND)
    if not summary:
        return NO_SECOND
    fewer = {}  # a config that ran in fewer seeds: its median would read as over the caption's seeds
    for block in summary.values():
        seeds = _seeds(block)
        for config in [c for c, r in block["rows"].items() if set(r["seeds"]) < seeds]:
            fewer[config] = sorted(block["rows"].pop(config)["seeds"])
    seconds = seconds_caption(summary, "this machine's fair baseline's")
    left = "; ".join(f"{SHORT.get(c, c)} (seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))})"
                     for c, s in fewer.items())
    slower = ("A whole run here over the same config's on the first machine: training seconds for the same tokens "
              "(no loss curve's noise in it), medians over each machine's seeds")
    parts = [(seconds, seconds_table(summary)), (rate_check.CAPTION, rate_check.table(summary, _seconds, bed_name)),
             (slower, machine_table(summary, _summary(root))),
             (latency.CAPTION, latency.table(summary, bed_name, _seconds)),
             (HOST_CAPTION, host_table(summary)), (CEILING, ceiling_table(summary)),
             ("The issue's targets, from this machine's runs alone", targets_table(summary))]
    return "\n\n".join([f"**{caption}**:\n\n{table}" for caption, table in parts if not _empty(table)]
                        + [machines_note(summary)] + ([f"Left out, run in fewer seeds: {left}."] if fewer else []))


def latency_block(root: str = rs.ROOT) -> str:
    """The second machine's bed with latency against the same bed without (:func:`latency.block`)."""
    return latency.block(_summary(root, SECOND), bed_name, _seconds)


def machine_table(summary: dict, first: dict) -> str:
    """Per bed, each config's median training seconds here over its median on the first machine (``first``):
    how alike the two machines slowed the configs."""
    keys = [k for k in lr.two_host_beds(summary) if k in first]
    configs = [c for c in _configs([summary[k] for k in keys]) if any(c in first[k]["rows"] for k in keys)]

    def cell(key, config) -> str:
        here, there = (s[key]["rows"].get(config, {}).get("train_s") for s in (summary, first))
        return f"{here / there:.2f}x" if here and there else "-"
    return md_table(["bed"] + [SHORT.get(c, c) for c in configs],
                    [[bed_name(*k)] + [cell(k, c) for c in configs] for k in keys])


PAGE = "docs/long-runs.md"
"""Where :func:`long_runs` goes; the summary links to it."""


def long_runs_summary(root: str = rs.ROOT) -> str:
    """The targets and which beds ran, for BENCHMARKS.md; :data:`NO_RUNS` until a folder exists."""
    summary = _summary(root)
    if not summary:
        return NO_RUNS

    def what(found: dict) -> str:
        def configs(rows: dict) -> str:
            rates = sum(c in rows for c in LR_SCALED)  # (not more configs: the learning-rate check's variants)
            return f"{len(rows) - rates} configs" + (f" and {rates} at other learning rates" if rates else "")
        return "; ".join(f"{bed_name(*key)} ({len(_seeds(found[key]))} seeds, {configs(found[key]['rows'])})"
                         for key in lr.shaped(found))
    ran, second = what(summary), _summary(root, SECOND)
    if second:
        ran += f"; on a second machine, reported apart with its own targets: {what(second)}"
    return (f"What ran: {ran}. Every table (seconds to three losses, the delay penalty along the run, the link's "
            f"cost, 2 to 8 workers): [long runs]({PAGE}).\n\n**The issue's targets**:\n\n"
            + targets_table(summary, issue_only=True))


def loss_rows(root: str = rs.ROOT) -> list[list[str]]:
    """BENCHMARKS.md's "where ds_acco loses" rows from the long runs: each target not met, and where auto's
    preset charges acco's delay less than acco fixed's measured penalty by more than the fit's residual."""
    summary = _summary(root)
    rows, by_name = [], {}
    for t in lr.targets(summary):
        if t["met"] is not False or t.get("about") in ("bed", "modes"):  # the issue's own target row says it
            continue
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        measured = f"{value} (limit {t['op']} {t['threshold']:g}; {t['detail']})"
        name, _, where = t["target"].rpartition(" (")
        if t.get("about") and name in by_name:  # the same target on another bed: one row, both beds
            by_name[name][1] += f"; {where.rstrip(')')}: {measured}"
            continue
        rows.append([f"long runs: {t['target']}", measured])
        by_name.setdefault(name, rows[-1])
    for key in lr.two_host_beds(summary):
        m = summary[key].get("penalty_model")
        if m and m["p_rate_scaled"] - m["preset"] > m["rms_rate_scaled"]:  # the preset outside the fit's residual
            rows.append([f"long runs: auto's preset charges acco's delay less than measured ({bed_name(*key)})",
                         f"{100 * m['preset']:.0f}% against {100 * m['p_rate_scaled']:.0f}% fitted to acco fixed's "
                         f"penalty (auto's model, rms {m['rms_rate_scaled']:.3f}; a constant fit: "
                         f"{100 * m['p_constant']:.0f}%, rms {m['rms_constant']:.3f})"])
    return rows + rate_check.loss_rows(_summary(root, SECOND), bed_name, "second machine")


def _summary(root: str, name: str = SET) -> dict:
    """:func:`benchmarks.report.long_runs.summarize` over the set's folders; empty before any has run."""
    found = folders(root, name)
    return lr.summarize(lr.collect(found)) if found else {}


def _seeds(block: dict) -> set:
    return {s for r in block["rows"].values() for s in r["seeds"]}


def seeds_phrase(summary: dict) -> str:
    """The seeds a table's medians are over (``summary``: its beds): the set most beds ran, and each bed that ran
    others by name (a bed may have run more seeds to settle a close comparison)."""
    by_bed = {key: tuple(sorted(_seeds(block))) for key, block in summary.items()}
    sets = [s for s in by_bed.values() if s]
    if not sets:
        return "seeds"
    common = max(set(sets), key=lambda s: (sets.count(s), -len(s)))
    others = "; ".join(f"{bed_name(*key)}: {', '.join(map(str, s))}" for key, s in by_bed.items()
                       if s and s != common)
    return f"seeds {', '.join(map(str, common))}" + (f" ({others})" if others else "")


def seconds_caption(summary: dict, whose: str = "the fair baseline's") -> str:
    """The seconds table's caption: whose losses, and the seeds its medians are over."""
    return (f"Seconds to {whose} loss at 50, 75 and 100% of its budget: median over {seeds_phrase(summary)} (spread; "
            "how many reached it where not all did)")


def _empty(table: str) -> bool:
    """A table without a row, or whose every figure is ``-`` (e.g. the link's cost without unshaped runs)."""
    rows = table.splitlines()[2:]
    return not rows or all(set(cell.strip() for cell in row.strip("|").split("|")[1:]) <= {"-", ""} for row in rows)
