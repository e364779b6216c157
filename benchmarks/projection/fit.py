"""The constants of :mod:`.model`, fitted on the raw files under ``bench_results/``, with their residuals.

Why these sources and this split: the CPU beds are the only runs that put rounds on a shaped link, so they give
the link's efficiency, the latency per algorithm step and (for the check) a CPU round's host and per-element cost;
the GPU sessions ran at world size 1, so they give what a round costs a GPU besides the wire (its host cost ``h``
and per-element cost ``e``) and the compute slowdown ``k`` with a round in flight. Nothing here is tuned by hand:
every constant is a median or a least-squares fit of figures the runs recorded.

* latency per step ``a``: the median of the count all-gather stage (a few bytes, one algorithm step at 2 ranks);
* ``h``, ``e`` and the efficiency: least squares of each run's median round (sync fp32, sync low-bit, acco's int4
  estimates and int8 commits, streaming's fragments) on ``1``, the elements the round carries and its wire time
  at the line rate, after ``a`` per algorithm step is taken off; ``1 / coefficient`` is the efficiency;
* the inner optimizer per element: the shard step stage over the shard's elements (an Adam step);
* ``k``: compute per micro-batch with a round in flight over without, acco fixed's, per bed (a compute property,
  like the compute per micro-batch itself).
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
from dataclasses import asdict, dataclass
from typing import Iterable, Optional

from benchmarks import results_file
from benchmarks.report.curves import interp, val_points
from benchmarks.report.long_runs import collect
from benchmarks.report.pages.sets import ROOT, folders
from benchmarks.report.repeats import bed_of
from benchmarks.report.time_to_loss import TOLERANCE
from ds_acco.telemetry.records import DRAIN_STAGE

from . import model as m

CONFIG_METHOD = {"sync": "sync_fp32", "sync_lowbit": "sync_lowbit", "acco_lowbit_int4_fixed": "acco_fixed",
                 "acco_lowbit_int4_adaptive": "acco_adaptive", "streaming_int8": "streaming"}
"""The bench configs the model has an equation for (the auto configs pick one of these)."""
PENALTY_METHOD = {**CONFIG_METHOD, "torchft_diloco": "torchft_diloco", "torchft_streaming_diloco": "torchft_streaming"}
"""Whose tokens to the loss are measured: the model's methods and the external peer (torchft, in the same sweeps)."""
ROUND_KIND = {("sync_fp32", "commit"): "fp32", ("sync_lowbit", "commit"): "int8", ("acco_fixed", "estimate"): "int4",
              ("acco_fixed", "commit"): "int8", ("acco_adaptive", "estimate"): "int4",
              ("acco_adaptive", "commit"): "int8", ("streaming", "fragment"): "fragment"}
BED_SCHEDULE = m.Schedule(fragments=4, sync_every=40, overlap_steps=2, max_micro_batches_per_round=8)
"""The beds' streaming and adaptive settings (``benchmarks.sweep.configs.STREAMING_BLOCK``, the workload's cap)."""
EQUAL_HOSTS = (("real", "100mbit"), ("real-mtu9000", "100mbit"), ("real", "25mbit"), ("sleep", "100mbit"))
"""The beds the link constants are fitted on: every host at a full core (the slow-host bed is checked, not fitted)."""
GPU_FOLDERS = ("gpu_overlap/h200_world1_fused_kernel_ab/ab",)
"""The GPU session at the current round code (the H200 call with the fused kernel; its runs of this tree, not the
baseline's): a round's costs."""
GPU_SLOWDOWN = "bench_results/gpu_overlap/h200_world1_fused_kernel_ab"
"""Where ``k`` comes from: that call's runs at the micro-batch where the device paces the step, as it does for the
table's 1B and 7B models (at the bed's own micro-batch the host does; docs/gpu.md), counted whole."""
GPU_CONFIG = "acco_lowbit_int4_fixed"
LONG_RUNS = "bench_results/long_runs/workers_*"
PENALTY_RUNS = ("bench_results/long_runs/real_seed*", "bench_results/long_runs/sleep_seed*")
PENALTY_BEDS = (("long-real", "100mbit"), ("long-sleep", "100mbit"))
"""Where the table's convergence penalties are measured: the long runs' two kinds of compute at one link (a
fixed-batch config's tokens to a loss do not depend on the link), with the rate warmed up and decayed as users train."""
WARMUP_ROUNDS = 2


@dataclass(frozen=True)
class Observation:
    """One run's median round of one kind: what the least squares sees."""

    bed: str
    rate: str
    rate_bit_s: float
    seed: int
    method: str
    kind: str
    elements: float
    bytes_measured: float
    round_s: float

    def wire_s(self) -> float:
        """The round's wire time at the full line rate, by the model's bytes (2 ranks, one per host)."""
        return m.round_node_bytes(self.kind, self.elements, 2, m.Link(self.rate_bit_s)) / (self.rate_bit_s / 8)


@dataclass(frozen=True)
class Constants:
    efficiency: float
    hop_s: float
    round_host_s: float
    round_s_per_elem: float
    inner_s_per_elem: float


def _median(xs: Iterable[Optional[float]]) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def load_runs(paths: Iterable[str]) -> list[dict]:
    runs = []
    for folder in paths:
        for run in results_file.load(folder)["runs"]:
            if run.get("ok") and run.get("scenario") == "time_to_loss":
                runs.append(dict(run, folder=os.path.relpath(folder, ROOT)))
    return runs


def bed_runs(set_name: str = "five_beds") -> list[dict]:
    return load_runs(folders(set_name))


def key(run: dict) -> tuple[str, str]:
    return bed_of(run), run["rate"]


def _rounds(run: dict, kind: str, method: str) -> list[dict]:
    """A run's rounds of ``kind`` past the warm-up; acco's sync warm-up rounds are not acco's."""
    return [x for tl in run.get("timeline") or [] for x in tl if x.get("kind") == kind
            and x.get("index", 0) >= WARMUP_ROUNDS and (x.get("mode") == "sync") == method.startswith("sync")]


def observations(runs: Iterable[dict]) -> list[Observation]:
    """Each run's median round per kind the model knows (warm-up rounds and acco's sync warm-up left out)."""
    out = []
    for run in runs:
        method = CONFIG_METHOD.get(run["config"])
        for (meth, kind), wire_kind in ROUND_KIND.items():
            rounds = _rounds(run, kind, method) if meth == method else []
            if not rounds:
                continue
            elements = run["params"] / (BED_SCHEDULE.fragments if wire_kind == "fragment" else 1)
            out.append(Observation(bed_of(run), run["rate"], run["rate_bit_s"], (run.get("workload") or {}).get("seed", 0),
                                   method, wire_kind, elements, _median(x.get("bytes_sent") for x in rounds),
                                   _median(x["round_s"] for x in rounds)))
    return out


def hop_latency(runs: Iterable[dict]) -> float:
    """The median count all-gather of the sync modes' rounds: a few bytes, one algorithm step at 2 ranks (in acco's
    rounds it also holds one rank's wait for the other, which launched later)."""
    return _median(x["stage_s"]["count all-gather"] for r in runs if r["config"] in ("sync", "sync_lowbit")
                   for tl in r.get("timeline") or [] for x in tl
                   if (x.get("stage_s") or {}).get("count all-gather") is not None) or 0.0


def inner_per_elem(runs: Iterable[dict]) -> float:
    """The shard step over its elements (an Adam step over ``P / N``), sync fp32's rounds."""
    return _median(x["stage_s"]["shard step"] / (r["params"] / r["hosts"]) for r in runs if r["config"] == "sync"
                   for tl in r.get("timeline") or [] for x in tl if (x.get("stage_s") or {}).get("shard step")) or 0.0


def solve(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares by the normal equations (Gauss-Jordan with partial pivoting): three unknowns at most."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys))]
         for i in range(n)]
    for col in range(n):
        piv = max(range(col, n), key=lambda i: abs(a[i][col]))
        a[col], a[piv] = a[piv], a[col]
        if abs(a[col][col]) < 1e-300:
            raise ValueError("the fit is singular: the observations do not separate the constants")
        for i in range(n):
            if i != col:
                f = a[i][col] / a[col][col]
                a[i] = [v - f * w for v, w in zip(a[i], a[col])]
    return [a[i][n] / a[i][i] for i in range(n)]


def fit_link(obs: list[Observation], hop_s: float, inner: float) -> Constants:
    """``round_s - steps x a = h + e x elements + wire_s / efficiency``, least squares over ``obs``."""
    rows = [[1.0, o.elements, o.wire_s()] for o in obs]
    ys = [o.round_s - sum(m.algorithm_steps(p, 2, m.Link(o.rate_bit_s)) for p, _ in m.ROUNDS[o.kind]) * hop_s
          for o in obs]
    h, e, inv = solve(rows, ys)
    return Constants(1 / inv, hop_s, h, e, inner)


def predicted_round(o: Observation, c: Constants) -> float:
    link = m.Link(o.rate_bit_s, c.efficiency, c.hop_s)
    return m.round_s(o.kind, o.elements, 2, link, m.Costs(c.round_host_s, c.round_s_per_elem))


def fit_beds(runs: list[dict], beds: Iterable[tuple[str, str]] = EQUAL_HOSTS) -> Constants:
    beds = set(beds)
    mine = [r for r in runs if key(r) in beds]
    return fit_link(observations(mine), hop_latency(mine), inner_per_elem(mine))


def compute_figures(run: dict, runs: list[dict]) -> tuple[tuple, float]:
    """``(compute per micro-batch per rank, k)`` of a run's bed: its own sync rounds' compute (streaming, which
    has none, takes sync fp32's of the same sweep) and acco fixed's slowdown in that sweep (1 where none)."""
    same = [r for r in runs if r["folder"] == run["folder"] and key(r) == key(run)]
    src = run if all(d.get("compute_s_per_mb_sync") for d in run.get("ranks") or [{}]) else next(
        (r for r in same if r["config"] in ("sync", "sync_lowbit", "acco_lowbit_int4_fixed")), run)
    c = tuple(d["compute_s_per_mb_sync"] for d in src["ranks"])
    fixed = next((r for r in same if r["config"] == "acco_lowbit_int4_fixed"), None)
    k = _median(d["compute_s_per_mb_overlapped"] / d["compute_s_per_mb_sync"] for d in (fixed or {}).get("ranks", [])
                if d.get("compute_s_per_mb_overlapped") and d.get("compute_s_per_mb_sync"))
    return c, k or 1.0


def predict_run(run: dict, runs: list[dict], c: Constants) -> Optional[m.Step]:
    method = CONFIG_METHOD.get(run["config"])
    if method is None:
        return None
    mb, k = compute_figures(run, runs)
    job = m.Job(run["params"], run["hosts"], mb, run["workload"]["grad_accum"])
    link = m.Link(run["rate_bit_s"], c.efficiency, c.hop_s)
    cap = run["workload"].get("max_micro_batches_per_round") or BED_SCHEDULE.max_micro_batches_per_round
    sched = m.Schedule(BED_SCHEDULE.fragments, BED_SCHEDULE.sync_every, BED_SCHEDULE.overlap_steps, cap)
    costs = m.Costs(c.round_host_s, c.round_s_per_elem, c.inner_s_per_elem, k)
    return m.steps(job, link, costs, sched, (method,))[method]


def check(runs: list[dict], c: Constants, population: Optional[list[dict]] = None) -> list[dict]:
    """Predicted against measured seconds per step (and micro-batches per commit, adaptive's ``m``), per run."""
    population = runs if population is None else population
    out = []
    for run in runs:
        step = predict_run(run, population, c)
        if step is None or not run.get("steady_step_s"):
            continue
        mb = run.get("mean_counts_per_commit") if step.method == "acco_adaptive" else None
        out.append({"bed": bed_of(run), "rate": run["rate"], "hosts": run["hosts"], "method": step.method,
                    "folder": run["folder"], "predicted_s": step.seconds, "measured_s": run["steady_step_s"],
                    "predicted_mb": step.micro_batches if mb else None, "measured_mb": mb})
    return out


def summarise_check(rows: list[dict]) -> list[dict]:
    """Per bed and method: medians over seeds of predicted and measured, and the error."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["bed"], r["rate"], r["hosts"], r["method"]), []).append(r)
    out = []
    for (bed, rate, hosts, method), rs in groups.items():
        p, s = _median(r["predicted_s"] for r in rs), _median(r["measured_s"] for r in rs)
        out.append({"bed": bed, "rate": rate, "hosts": hosts, "method": method, "runs": len(rs), "predicted_s": p,
                    "measured_s": s, "error": p / s - 1, "predicted_mb": _median(r["predicted_mb"] for r in rs),
                    "measured_mb": _median(r["measured_mb"] for r in rs)})
    return out


def leave_one_bed_out(runs: list[dict]) -> list[dict]:
    """Each equal-host bed predicted by constants fitted on the other three; the slow-host bed by all four."""
    rows = []
    for bed in EQUAL_HOSTS:
        held = fit_beds(runs, [b for b in EQUAL_HOSTS if b != bed])
        rows += [dict(r, fitted_on="the other beds") for r in summarise_check(check([x for x in runs if key(x) == bed], held, runs))]
    whole = fit_beds(runs)
    rows += [dict(r, fitted_on="the four beds") for r in summarise_check(
        check([x for x in runs if key(x) not in EQUAL_HOSTS], whole, runs))]
    return rows


def long_run_check(c: Constants, pattern: str = LONG_RUNS) -> list[dict]:
    """The 4- and 8-worker runs of the long-run protocol, when they exist: predicted against measured."""
    found = sorted(p for p in glob.glob(os.path.join(ROOT, pattern)) if results_file.exists(p))
    runs = load_runs(found)
    return summarise_check(check(runs, c)) if runs else []


def tokens_to(points: list[tuple[float, float]], target: float) -> Optional[float]:
    prev = None
    for t, v in sorted(points):
        if v <= target:
            return t if prev is None or prev[1] == v else prev[0] + (t - prev[0]) * (prev[1] - target) / (prev[1] - v)
        prev = (t, v)
    return None


def penalties(runs: list[dict]) -> dict[str, float]:
    """Tokens to the fair baseline's loss at 75% of its budget, over sync fp32's in the same sweep: the median over
    the equal-host beds and seeds (2 workers, a 3.3 M-parameter GPT) of the short runs, whose rate stays constant
    after warm-up; the table takes the long runs' (:func:`long_run_penalties`) where they exist."""
    ratios: dict = {}
    for run in runs:
        method = PENALTY_METHOD.get(run["config"])
        base = next((r for r in runs if r["folder"] == run["folder"] and key(r) == key(run) and r["config"] == "sync"), None)
        if method is None or base is None or key(run) not in EQUAL_HOSTS:
            continue
        curve = val_points(base)
        target = interp(curve, 0.75 * curve[-1][0]) * (1 + TOLERANCE)
        mine, theirs = tokens_to(val_points(run), target), tokens_to(curve, target)
        if mine and theirs:
            ratios.setdefault(method, []).append(mine / theirs)
    return {k: _median(v) for k, v in ratios.items()}


def long_run_penalties(patterns: Iterable[str] = PENALTY_RUNS) -> dict:
    """Tokens to the fair baseline's loss at 75% of its budget over sync fp32's, paired by seed, on the long runs
    (:data:`PENALTY_BEDS`): ``each`` the median over a bed's seeds, ``penalties`` the mean of the beds' medians (a
    bed that ran more seeds to settle a close comparison, the sleep bed's five against real compute's three, would
    otherwise outweigh the other: pooled, adaptive's half-size commits on the sleep bed moved its penalty from 0.63
    to 0.53), and ``batches`` the micro-batches per commit of sync and acco adaptive there (adaptive's tokens depend
    on its batch: :mod:`.grid`). Empty where the long runs have not run."""
    found = sorted(p for pat in patterns for p in glob.glob(os.path.join(ROOT, pat))
                   if results_file.exists(p))
    groups = collect(found) if found else {}
    each: dict = {}
    batches: dict = {}
    for bed in PENALTY_BEDS:
        by = groups.get(bed, {})
        base = {s["seed"]: s["penalty"].get(0.75) for s in by.get("sync", [])}
        for config, method in PENALTY_METHOD.items():
            mine = [s["penalty"].get(0.75) / base[s["seed"]] for s in by.get(config, [])
                    if s["penalty"].get(0.75) and base.get(s["seed"])]
            if mine:
                each.setdefault(method, {})[" ".join(bed)] = _median(mine)
            if method in ("sync_fp32", "acco_adaptive"):
                batches.setdefault(method, {})[" ".join(bed)] = _median(s["mb_per_commit"] for s in by.get(config, []))
    penalties = {k: statistics.fmean(v.values()) for k, v in each.items()}
    return {"penalties": penalties, "each": each,
            "batches": batches, "inputs": [os.path.relpath(p, ROOT) for p in found]} if penalties else {}


def _gpu_params(folder: str) -> float:
    for log in sorted(glob.glob(os.path.join(ROOT, "bench_results", folder, f"{GPU_CONFIG}_r*.log"))):
        with open(log, encoding="utf-8") as f:
            found = re.search(r"\(([\d.]+)M params\)", f.read())
        if found:
            return float(found.group(1)) * 1e6
    raise FileNotFoundError(f"bench_results/{folder}: no {GPU_CONFIG} log naming the parameter count")


def gpu_costs(folders_: Iterable[str] = GPU_FOLDERS) -> dict:
    """A GPU round's costs at world size 1 (no wire): the stages that pass over every element (quantise and
    reduce-scatter, shard step, all-gather) over the elements are ``e``; the round's other stages are ``h``, not
    the wait for the gradients before them (the device finishing compute the host queued: compute, not the round;
    :func:`benchmarks.gpu_overlap.device_compute_s`); the shard step alone over its elements is the inner optimizer;
    ``k`` is the in-flight ratio counted whole where the device paces the step (:data:`GPU_SLOWDOWN`)."""
    from benchmarks.report.pages.gpu import in_flight_rows

    per_elem, host, inner, inputs = [], [], [], []
    for folder in folders_:
        base = os.path.join(ROOT, "bench_results", folder)
        params = _gpu_params(folder)
        for tel in sorted(glob.glob(os.path.join(base, f"{GPU_CONFIG}_r*.telemetry.jsonl.rank0"))):
            if re.search(r"_(baseline|profiled)\.", os.path.basename(tel)):
                continue  # another tree, or the profiler's own cost
            inputs.append(os.path.relpath(tel, ROOT))
            with open(tel, encoding="utf-8") as f:
                rounds = [json.loads(line) for line in f if line.strip()]
            for x in (x for x in rounds if x.get("mode") == "acco" and x.get("stage_s")):
                st = x["stage_s"]
                passes = st["reduce-scatter"] + st["shard step"] + st["all-gather"]
                per_elem.append(passes / params)
                host.append(sum(v for k, v in st.items() if k != DRAIN_STAGE) - passes)
                inner.append(st["shard step"] / params)
    device_paced = [r for r in in_flight_rows(GPU_SLOWDOWN) if r["adam"] == "fused kernel"]
    top = max(r["micro_batch"] for r in device_paced)
    ks = [r["in_flight_ratio"] for r in device_paced if r["micro_batch"] == top]
    inputs.append(GPU_SLOWDOWN)
    return {"round_host_s": _median(host), "round_s_per_elem": _median(per_elem), "inner_s_per_elem": _median(inner),
            "slowdown": _median(ks), "slowdown_range": [min(ks), max(ks)], "slowdown_micro_batch": top,
            "params": params, "inputs": inputs}


def fit_all(set_name: str = "five_beds") -> dict:
    """Everything :mod:`.grid` and the page need, and the inputs it read (the JSON under bench_results/projection)."""
    runs = bed_runs(set_name)
    c = fit_beds(runs)
    obs = observations([r for r in runs if key(r) in EQUAL_HOSTS])
    residuals = [dict(asdict(o), predicted_s=predicted_round(o, c), model_bytes=m.rank_bytes(o.kind, o.elements, 2))
                 for o in obs]
    long, short = long_run_penalties(), penalties(runs)
    cross = summarise_check(check([r for r in runs if key(r) == ("real", "25mbit")],
                                  fit_beds(runs, [("real", "100mbit")]), runs))
    return {"cpu": asdict(c), "gpu": gpu_costs(), "residuals": residuals, "leave_one_bed_out": leave_one_bed_out(runs),
            "fit_100_predict_25": cross, "long_runs": long_run_check(c), "penalties_short": short,
            "penalties": long.get("penalties") or short, "penalties_long": long,
            "inputs": sorted({r["folder"] for r in runs})}
