"""The long-run protocol's figures (:mod:`benchmarks.protocol.plans`): seconds to three losses, the delay penalty
as training goes on, the link's cost, and what more workers change.

Why its own report: the time-to-loss tables compare seconds to one loss near the end of a short run. A long run
with a decayed rate asks more: whether ACCO's one-step delay costs loss per token early and stops costing it
late, how much of the link each config hides, and whether the overlap's gain holds at 4 and 8 workers.

It reads sweep folders (one bed and seed each, as :mod:`benchmarks.protocol.driver` writes them; the command:
:mod:`benchmarks.report.long_runs.cli`). Per bed (:func:`benchmarks.report.repeats.bed_of`) and link, in each
folder (one seed):

* **targets**: the fair baseline's (``sync``, fp32) validation loss at 50%, 75% and 100% of its token budget,
  interpolated on its validation curve (tokens); a config's **seconds** to each are measured as
  :mod:`benchmarks.report.time_to_loss` measures them: training seconds to the first validation within 0.1% of
  the loss, interpolated between validations;
* **delay penalty**: at every tenth of the budget, the tokens a config needed to reach the baseline's loss there
  over the tokens sync low-bit needed (above 1: it learns less per token); paired by seed; and auto's model of
  it checked against acco fixed's (:mod:`benchmarks.report.long_runs.penalty_model`);
* **link cost**: a config's seconds to a target on the shaped link over the same config's seconds to the same
  loss on the unshaped link of the same bed and seed (1: the config hides the whole link), where both ran on
  machines alike (:func:`same_machine`);
* **workers**: on the light sleep bed at 2, 4 and 8 hosts (and 4 with one at half speed), each config's seconds
  to the 75% target and the overlap's gain, sync low-bit's seconds over acco fixed's (ACCO at sync's batch) and
  over the faster acco policy's; and a step's compute per bed, which says whether 8 hosts on this machine's cores
  still measure the link (a target: within 1.10x of the 2-host bed's).

Across seeds: medians, spreads (max - min) and how many seeds reached; ratios of seconds are ratios of medians,
the penalty and the link cost medians of per-seed ratios.
"""

from __future__ import annotations

import copy
import math
import os
import re
import statistics
from typing import Optional

from benchmarks import results_file
from benchmarks.protocol.plans import LONG, TORCHFT
from benchmarks.sweep import configs as cfgs

from ..curves import UNSHAPED, interp, val_points
from ..repeats import bed_of
from ..time_to_loss import SCENARIO, TOLERANCE, seconds_to, val_time_points
from . import batch_model as bm
from . import penalty_model as pm

FRACTIONS = (0.5, 0.75, 1.0)
"""The targets: the baseline's loss at these fractions of its token budget."""
CHECKPOINTS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0)
"""Where the delay penalty is measured along the run (fractions of the baseline's budget)."""
SHOWN = (0.25, 0.5, 0.75, 1.0)
"""The checkpoints the tables show."""
BASELINE, REFERENCE = "sync", "sync_lowbit"
ACCO = ("acco_lowbit_int4_fixed", "acco_lowbit_int4_adaptive", "acco_lowbit_int4_fixed_half")
SYNC_LOWBIT = ("sync_lowbit", "sync_lowbit_half")
AUTO = ("auto_lowbit_int4", "auto_lowbit_int4_streaming")
ORDER = LONG + TORCHFT
"""The tables' config order."""
SHORT = {"zero1": "ZeRO-1", "zero1_overlap": "ZeRO-1 overlap_comm", "sync": "sync fp32", "sync_lowbit": "sync low-bit",
         "sync_lowbit_half": "sync low-bit, half batch", "acco_lowbit_int4_fixed": "acco fixed",
         "acco_lowbit_int4_adaptive": "acco adaptive", "acco_lowbit_int4_fixed_half": "acco fixed, half batch",
         "streaming_int8": "streaming", "streaming_int8_half": "streaming, half batch", "auto_lowbit_int4": "auto",
         "auto_lowbit_int4_streaming": "auto + streaming", "torchft_diloco": "torchft DiLoCo",
         "torchft_streaming_diloco": "torchft Streaming DiLoCo", "torchft_diloco_half": "torchft DiLoCo, half batch"}
SHORT.update({c: f"{SHORT[base]}, {scale:g}x the rate" for c in cfgs.LR_SCALED for base, scale in [cfgs.lr_scaled(c)]})
"""Short names for the tables and the plot."""
WORKERS_BED = "long-workers"
"""The light sleep bed's runs (:func:`benchmarks.protocol.plans.sleep_workload` ``light``) have notes starting so."""
HOSTS_SUFFIX = re.compile(r"-\d+h(-slow)?$")
"""A bed past 2 hosts carries its host count (and ``-slow``) at the end of its name: ``long-workers-4h-slow``."""
NOTE = "long-"
"""Run notes of :mod:`benchmarks.protocol.plans` start with it; other rows in a folder are left out."""


def long_rows(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r.get("ok") and r.get("scenario") == SCENARIO and (r.get("note") or "").startswith(NOTE)]


def loss_at(base: dict, fraction: float) -> Optional[float]:
    """The baseline's validation loss at ``fraction`` of its token budget (its last validated token count)."""
    curve = val_points(base)
    return interp(curve, fraction * max(t for t, _ in curve)) if curve else None


def _reach(points: list, loss: Optional[float]) -> Optional[float]:
    return seconds_to(points, loss * (1 + TOLERANCE)) if loss is not None and points else None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def baseline_elsewhere(by: dict, bed: str) -> Optional[dict]:
    """The baseline's run on another link of the same bed and seed, for a link where it did not run: sync fp32's
    validation losses do not depend on the link (the five-bed sweeps' sync runs of a seed had the same losses to
    the last digit at 100 and 25 Mbit/s and MTU 9000), so its targets hold there; its seconds stay unmeasured."""
    return next((r for (b, _, config), r in sorted(by.items(), key=lambda kv: str(kv[0]))
                 if b == bed and config == BASELINE), None)


def folder_samples(folder: str, runs: list[dict]) -> dict:
    """``{(bed, rate): {config: sample}}`` of one sweep folder (one seed); shaped links and the unshaped one."""
    rows = long_rows(runs)
    by = {(bed_of(r), r["rate"], r["config"]): r for r in rows}
    out: dict = {}
    for bed, rate in sorted({(bed_of(r), r["rate"]) for r in rows}):
        base = by.get((bed, rate, BASELINE)) or baseline_elsewhere(by, bed)
        losses = {f: loss_at(base, f) for f in FRACTIONS} if base else {f: None for f in FRACTIONS}
        marks = {c: loss_at(base, c) for c in CHECKPOINTS} if base else {}
        mixed = any(_probe(r) for r in rows if bed_of(r) == bed)  # some of this bed's runs are from the probe's time
        block = {}
        for (b, rt, config), run in by.items():
            if (b, rt) != (bed, rate):
                continue
            open_link = by.get((bed, UNSHAPED, config)) if rate != UNSHAPED else None
            if open_link and not same_machine(run, open_link, mixed):
                open_link = None  # a ratio of two machines' speeds, not the link's cost
            seconds = {f: _reach(val_time_points(run), losses[f]) for f in FRACTIONS}
            unshaped = {f: _reach(val_time_points(open_link), losses[f]) for f in FRACTIONS} if open_link else {}
            block[config] = {
                "folder": folder, "id": run["id"], "seed": (run.get("workload") or {}).get("seed", 0),
                "hosts": run.get("hosts", 2), "seconds": seconds, "targets": losses,
                "unshaped_seconds": unshaped, "link_cost": {f: _ratio(seconds[f], unshaped.get(f)) for f in FRACTIONS},
                "tokens_to": {c: _reach(val_points(run), loss) for c, loss in marks.items()},
                "budget": (run.get("workload") or {}).get("max_tokens"),
                "lr_steps": (run.get("workload") or {}).get("lr_total_steps"),
                "final_loss": run.get("val_loss"), "train_s": run.get("train_s"),
                "mb_per_commit": run.get("mean_counts_per_commit"),
                "cpu_probe_ms": (run.get("load") or {}).get("cpu_probe_ms"),
                "step_compute": _median([d.get("sync_compute_s_per_step") for d in run.get("ranks") or []]),
                "host_cost": host_cost(run), "slowest": slowest_rank(run),
                "unshaped_id": open_link["id"] if open_link else None,
                "noise_curve": bm.noise_curve(os.path.join(folder, "runs", run["id"], "host0.log"), run.get("curve"),
                                              (run.get("workload") or {}).get("max_tokens")) if config in AUTO else []}
        ref = block.get(REFERENCE)
        for sample in block.values():
            sample["penalty"] = {c: _ratio(t, ref["tokens_to"].get(c)) if ref else None
                                 for c, t in sample["tokens_to"].items()}
        out[(bed, rate)] = block
    return out


def slowest_rank(run: dict) -> Optional[dict]:
    """The rank with the most compute per micro-batch: its compute per micro-batch (``compute_s``) and the share
    of its steady steps it waited for rounds (``wait``); None where the run recorded neither (torchft, streaming).
    Why the slowest: the others wait for it as well as for the link, so its wait alone is what an overlap could
    hide (:mod:`benchmarks.report.long_runs.ceiling`)."""
    ranks = [d for d in run.get("ranks") or [] if d.get("compute_s") and d.get("micro_batches")
             and d.get("wait_frac") is not None]
    if not ranks:
        return None
    d = max(ranks, key=lambda d: d["compute_s"] / d["micro_batches"])
    return {"compute_s": d["compute_s"] / d["micro_batches"], "wait": d["wait_frac"]}


HOST_COST = ("tax", "extra_s", "switches", "network_s", "round_cpu_s", "gloo_s")
"""What a round costs the compute beside it (:func:`host_cost`)."""


def host_cost(run: dict) -> dict:
    """Medians over the ranks: compute per micro-batch with a round in flight over that in sync steps (``tax``; None
    where no round overlapped) and the seconds it adds to a step (``extra_s``), the training thread's involuntary
    switches a step (``switches``), the kernel's network time on the host's core a step (``network_s``), the
    round's own thread's CPU a step (``round_cpu_s``) and gloo's threads' (``gloo_s``; None in runs that predate
    the figure). Why: on one core per host a round's threads and the link's network stack take the core from
    compute; the overlap hides a round's wire time, not this. The last three say how much of the extra compute they
    account for."""
    ranks, steps = run.get("ranks") or [], run.get("steps")
    overlapped = [d for d in ranks if d.get("compute_s_per_mb_overlapped") and d.get("compute_s_per_mb_sync")]
    tax = [d["compute_s_per_mb_overlapped"] / d["compute_s_per_mb_sync"] for d in overlapped]
    extra = [(d["compute_s_per_mb_overlapped"] - d["compute_s_per_mb_sync"]) * d["micro_batches"] / steps
             for d in overlapped if steps and d.get("micro_batches")]
    thread = [d["comm_thread_cpu_s_per_round"] * d["rounds"] / steps for d in ranks
              if steps and d.get("comm_thread_cpu_s_per_round") is not None and d.get("rounds")]
    return {"tax": _median(tax), "extra_s": _median(extra),
            "switches": _median([d.get("preempted_per_step") for d in ranks]),
            "network_s": _median([d.get("softirq_s_per_step") for d in ranks]), "round_cpu_s": _median(thread),
            "gloo_s": _median([d.get("gloo_cpu_s_per_step") for d in ranks])}


_READ: dict = {}
"""``(the results file, its mtime and size) -> folder_samples``: the page, BENCHMARKS.md's summary and its loss rows
each summarize the same folders, whose results run to megabytes unpacked (a sleep-bed folder's: 7 MB)."""


def _samples_of(folder: str) -> dict:
    path = results_file.path_of(folder)
    if path is None:
        raise FileNotFoundError(f"{folder}: no results file")
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    if key not in _READ:
        _READ[key] = folder_samples(folder, results_file.load_file(path)["runs"])
    return copy.deepcopy(_READ[key])


def collect(folders: list[str]) -> dict:
    """``{(bed, rate): {config: [sample per folder]}}`` over the folders (one seed each)."""
    groups: dict = {}
    for folder in folders:
        for key, block in _samples_of(folder).items():
            for config, sample in block.items():
                groups.setdefault(key, {}).setdefault(config, []).append(sample)
    return groups


def _median(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _spread(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return max(xs) - min(xs) if len(xs) > 1 else None


def _figure(xs: list) -> dict:
    return {"each": xs, "median": _median(xs), "spread": _spread(xs), "reached": sum(x is not None for x in xs),
            "of": len(xs)}


def summarize(groups: dict) -> dict:
    """Per (bed, rate): per config the figures of :func:`_figure` for the seconds to each target, the link cost and
    the penalty at each checkpoint, and the ratios of median seconds against sync fp32 and sync low-bit."""
    out = {}
    for (bed, rate), by_config in sorted(groups.items()):
        rows = {}
        for config in sorted(by_config, key=lambda c: ORDER.index(c) if c in ORDER else len(ORDER)):
            samples = by_config[config]
            rows[config] = {
                "seconds": {f: _figure([s["seconds"][f] for s in samples]) for f in FRACTIONS},
                "link_cost": {f: _figure([s["link_cost"][f] for s in samples]) for f in FRACTIONS},
                "penalty": {c: _figure([s["penalty"].get(c) for s in samples]) for c in CHECKPOINTS},
                "seeds": [s["seed"] for s in samples], "hosts": samples[0]["hosts"],
                "final_loss": _median([s["final_loss"] for s in samples]),
                "train_s": _median([s["train_s"] for s in samples]),
                "mb_per_commit": _median([s["mb_per_commit"] for s in samples]),
                "step_compute": _median([s["step_compute"] for s in samples]),
                "host_cost": {k: _median([s["host_cost"][k] for s in samples]) for k in HOST_COST},
                "each_seed": {s["seed"]: {"slowest": s["slowest"], "train_s": s["train_s"],
                                          "tokens": s["tokens_to"].get(0.75), "seconds": s["seconds"][0.75]}
                              for s in samples},
                "cpu_probe_ms": [s["cpu_probe_ms"] for s in samples],
                "runs": [f"{os.path.basename(s['folder'].rstrip('/'))}/{s['id']}" for s in samples]}
        for row in rows.values():
            for name, ref in (("vs_sync", BASELINE), ("vs_sync_lowbit", REFERENCE)):
                row[name] = {f: _ratio(row["seconds"][f]["median"], rows[ref]["seconds"][f]["median"])
                             if ref in rows else None for f in FRACTIONS}
        out[(bed, rate)] = {"bed": bed, "rate": rate, "rows": rows,
                            "targets": {f: _median([s["targets"][f] for s in next(iter(by_config.values()))])
                                        for f in FRACTIONS},
                            "penalty_model": _penalty_model(by_config, rows),
                            "batch_model": _batch_model(by_config, rows),
                            "machines": machines(by_config)}
    return out


MACHINE_SPREAD = 1.08
"""How far apart (slowest over fastest) a table's rows may have been timed before its ratios need a caveat: rows are
medians over seeds, so each row's median probe. One machine in one session read 30.7-33.4 ms over 36 runs of the sleep
bed (1.09, the probe's own noise), its twelve configs' medians 31.1-32.7 (1.05); machines of different sessions ran
the same configs 1.11-1.28x apart."""


def _probe(run: dict) -> Optional[float]:
    return (run.get("load") or {}).get("cpu_probe_ms")


def same_machine(a: dict, b: dict, mixed: bool = True) -> bool:
    """Whether two runs were timed on machines alike (:mod:`benchmarks.cluster.cpu_probe`): both probed within
    :data:`MACHINE_SPREAD`. A run without a probe predates it and its machine is unknown; where none of a bed's runs
    in a folder was probed (``mixed`` False) the folder holds what earlier sessions ran and the pair is shown as the
    tables always showed it, but once some run of the bed was re-run with the probe, an unprobed one may be from
    another session: on real compute at 100 Mbit/s, configs re-run on a faster machine came out faster shaped than
    their unshaped runs of an earlier session."""
    pa, pb = _probe(a), _probe(b)
    if not pa or not pb:
        return not mixed and not pa and not pb
    return max(pa, pb) <= min(pa, pb) * MACHINE_SPREAD


def machines(by_config: dict) -> dict:
    """How alike the machines of one table's runs were, by :mod:`benchmarks.cluster.cpu_probe` (timed before each
    run): ``probed`` of ``runs``, the fastest and slowest probe, the fastest and slowest row's median probe
    (``rows_ms``), and ``alike`` (every run probed, rows within :data:`MACHINE_SPREAD`; None where some run was not
    probed: from before the probe, machine unknown)."""
    probes = [s["cpu_probe_ms"] for samples in by_config.values() for s in samples]
    known = [p for p in probes if p]
    low, high = (min(known), max(known)) if known else (None, None)
    rows = [_median([s["cpu_probe_ms"] for s in samples]) for samples in by_config.values() if samples]
    alike = None if len(known) < len(probes) else max(rows) <= min(rows) * MACHINE_SPREAD
    return {"runs": len(probes), "probed": len(known), "fastest_ms": low, "slowest_ms": high,
            "rows_ms": (min(rows), max(rows)) if alike is not None else None, "alike": alike}


def _penalty_model(by_config: dict, rows: dict) -> Optional[dict]:
    """Auto's lr-scaled penalty against acco fixed's measured one (:mod:`benchmarks.report.penalty_model`); None
    without both runs, a token budget or a decayed rate."""
    ref, who = by_config.get(REFERENCE), rows.get(pm.WHO)
    lr_steps = _median([s["lr_steps"] for s in ref or []])
    if not ref or not who or not lr_steps:
        return None
    shares = _shares(ref)
    return pm.check([(c, shares[c], who["penalty"][c]["median"]) for c in CHECKPOINTS], _warmup(int(lr_steps)),
                    _preset_penalty())


def _batch_model(by_config: dict, rows: dict) -> Optional[dict]:
    """Auto's price of a batch against half-batch sync's measured ratio, with the noise scale auto's runs of the bed
    logged (:mod:`benchmarks.report.long_runs.batch_model`); None without those runs or a decayed rate."""
    ref, half = by_config.get(REFERENCE), rows.get(bm.HALF)
    lr_steps = _median([s["lr_steps"] for s in ref or []])
    curves = [s["noise_curve"] for c in AUTO for s in by_config.get(c, []) if s["noise_curve"]]
    if not ref or not half or not lr_steps or not curves:
        return None
    shares = _shares(ref)
    return bm.check([(c, shares[c], half["penalty"][c]["median"]) for c in CHECKPOINTS], curves,
                    half["mb_per_commit"], rows[REFERENCE]["mb_per_commit"], _warmup(int(lr_steps)))


def _shares(ref: list) -> dict:
    """Sync low-bit's share of its budget to the loss at each checkpoint, median over seeds."""
    return {c: _median([s["tokens_to"].get(c) / s["budget"] if s["tokens_to"].get(c) and s["budget"] else None
                        for s in ref]) for c in CHECKPOINTS}


def _warmup(lr_steps: int) -> float:
    """The protocol's warm-up as a share of its decayed schedule (the templates' ``warmup_num_steps``)."""
    params = cfgs.make_config(REFERENCE, micro_batch=1, grad_accum=2, lr_schedule="decay",
                              lr_total_steps=lr_steps)["scheduler"]["params"]
    return params["warmup_num_steps"] / params["total_num_steps"]


def _preset_penalty() -> float:
    """The shipped auto preset's ``acco.auto.acco_step_penalty``, as the sweep's auto config runs it."""
    return cfgs.make_config(AUTO[0], micro_batch=1, grad_accum=2)["acco"]["auto"]["acco_step_penalty"]


def seconds(block: Optional[dict], config: str, fraction: float = 0.75) -> Optional[float]:
    """The config's seconds to the target as every comparison ranks them: the median over all its seeds, a seed that
    never reached the target counting as never (None where that median is never). The tables show the median of the
    seeds that reached it, with how many did; a config that got there in one seed of three must not rank as the
    fastest on that one seed (the final-loss target's rule: a seed that never gets there loses the race)."""
    row = (block or {}).get("rows", {}).get(config)
    if not row:
        return None
    ranked = statistics.median([math.inf if x is None else x for x in row["seconds"][fraction]["each"]])
    return None if math.isinf(ranked) else ranked


def best(block: Optional[dict], configs, fraction: float = 0.75) -> tuple[Optional[str], Optional[float]]:
    """The config among ``configs`` with the fewest median seconds to the target, and its seconds."""
    found = [(s, c) for c in configs if (s := seconds(block, c, fraction)) is not None]
    return (min(found)[1], min(found)[0]) if found else (None, None)


def shaped(summary: dict) -> list[tuple[str, str]]:
    """The (bed, rate) keys of shaped links: the beds the tables compare on."""
    return [k for k in summary if k[1] != UNSHAPED]


def two_host_beds(summary: dict) -> list[tuple[str, str]]:
    """The shaped two-host beds: the seconds, penalty and plot compare on them (the workers' beds on their own)."""
    return [k for k in shaped(summary) if not HOSTS_SUFFIX.search(k[0])]


def workers(summary: dict) -> list[dict]:
    """The light sleep bed at 2, 4 and 8 hosts (and 4 with a slow one), and real compute past 2 hosts, on their
    shaped links: seconds and the overlap's gain."""
    out = []
    for (bed, rate), block in summary.items():
        hosts = next(iter(block["rows"].values()))["hosts"]
        sleep = bed.startswith(WORKERS_BED)
        if rate == UNSHAPED or not (sleep or hosts > 2):
            continue
        low = seconds(block, REFERENCE)
        fixed = seconds(block, ACCO[0])
        _, fastest = best(block, ACCO)
        _, better_sync = best(block, SYNC_LOWBIT)
        out.append({"bed": bed, "rate": rate, "hosts": hosts, "slow": bed.endswith("-slow"), "sleep": sleep,
                    "block": block, "gain_fixed": _ratio(low, fixed), "gain_best": _ratio(low, fastest),
                    "gain_vs_better_sync": _ratio(better_sync, fastest),
                    "step_compute": _median([r["step_compute"] for r in block["rows"].values()])})
    return sorted(out, key=lambda w: (not w["sleep"], w["slow"], w["hosts"], w["rate"]))
