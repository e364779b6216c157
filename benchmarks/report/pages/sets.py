"""The result sets behind README.md's and BENCHMARKS.md's tables: ``bench_results/sets.json``, read and summarised.

Why an index: a table that names its folders in code, or a number typed into a page, goes stale when a
sweep is re-run or a folder renamed. ``sets.json`` names each *set* (the sweep folders of one measurement,
as globs under ``bench_results/``) and each *role* a headline column stands for (the fair baseline, the
best-tuned sync, ds_acco, an external peer) as bench config names; the tables
(:mod:`benchmarks.report.pages.tables`) take every figure from :func:`summary` of a set. A new measurement
plugs in as a new set, or a new folder matching a set's glob, plus a role where a headline column should
read it; a role no run holds shows as "not measured yet".
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics
from functools import lru_cache
from typing import Optional

from benchmarks import results_file

from ..repeats import bed_of, collect, summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
INDEX = os.path.join("bench_results", "sets.json")


def _natural(path: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


@lru_cache(maxsize=None)
def index(root: str = ROOT) -> dict:
    with open(os.path.join(root, INDEX), encoding="utf-8") as f:
        return json.load(f)


def folders(name: str, root: str = ROOT) -> list[str]:
    """A set's sweep folders (each holds a results file: :mod:`benchmarks.results_file`), in seed order."""
    found = []
    for pattern in index(root)["sets"][name]["folders"]:
        hits = sorted(glob.glob(os.path.join(root, "bench_results", pattern)), key=_natural)
        if not hits:
            raise FileNotFoundError(f"{INDEX}: set {name!r}: nothing matches bench_results/{pattern}")
        found += [h for h in hits if h not in found]
    return found


@lru_cache(maxsize=None)
def _runs(folder: str) -> list[dict]:
    return results_file.load(folder)["runs"]


@lru_cache(maxsize=None)
def summary(name: str, root: str = ROOT) -> dict:
    """``{(bed, rate): block}``: :func:`benchmarks.report.repeats.summarize` of the set's folders (every run's
    seconds to the baseline's loss at 75% of its budget, medians, spreads, ratios), each row also holding
    ``final_loss`` (each run's validation loss at the end of the budget), ``round_share`` (per run, the
    smallest over ranks of a round's seconds over a step's compute in sync: the rank that waited least for
    its peer) and ``step_compute`` (per run, each rank's compute seconds per step in sync)."""
    outs = folders(name, root)
    runs = {(out, r["id"]): r for out in outs for r in _runs(out)}
    out = {}
    for key, block in summarize(collect(outs)).items():
        for row in block["rows"]:
            samples = [runs[(o, rid)] for o, rid in (_split(outs, x) for x in row["runs"])]
            row["final_loss"] = [r.get("val_loss") for r in samples]
            row["round_share"] = [_round_share(r) for r in samples]
            row["step_compute"] = [[d.get("sync_compute_s_per_step") for d in r.get("ranks") or []] for r in samples]
        out[(block["bed"], block["rate"])] = block
    return out


def _split(outs: list[str], label: str) -> tuple[str, str]:
    """``(folder, run id)`` of a repeats row's ``"<folder basename>/<run id>"`` label."""
    base, rid = label.split("/", 1)
    return next(o for o in outs if os.path.basename(o.rstrip("/")) == base), rid


def _round_share(run: dict) -> Optional[float]:
    shares = [d["round_s"] / d["rounds"] / d["sync_compute_s_per_step"] for d in run.get("ranks") or []
              if d.get("rounds") and d.get("round_s") and d.get("sync_compute_s_per_step")]
    return min(shares) if shares else None


def row(name: str, bed: str, rate: str, config: str) -> Optional[dict]:
    """One config's row of a set on one bed and link, or None where it did not run."""
    block = summary(name).get((bed, rate))
    return next((r for r in block["rows"] if r["config"] == config), None) if block else None


def median(xs) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def role(name: str) -> list[str]:
    """The bench configs that stand for a headline role (``sets.json`` ``roles``)."""
    return list(index()["roles"].get(name) or [])


def beds_of(name: str) -> list[tuple[str, str]]:
    """``(bed, rate)`` of every bed and link a set measured, in the order the index lists its folders."""
    seen = []
    for out in folders(name):
        for r in _runs(out):
            key = (bed_of(r), r["rate"])
            if r.get("scenario") == "time_to_loss" and key not in seen:
                seen.append(key)
    return seen
