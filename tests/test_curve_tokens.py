"""A run's loss curve places each step at the tokens its commits consumed (benchmarks/sweep/parse.py). An auto run
that switches to streaming writes the phase's fragment records into the same telemetry file, with indices of their
own: they must not count, and every published curve must agree with its own round records."""

from __future__ import annotations

import subprocess
from pathlib import Path

from benchmarks import results_file
from benchmarks.sweep.parse import tokens_by_step

ROOT = Path(__file__).resolve().parents[1]
TOKENS_PER_MB = 1024


def _round(index: int, kind: str, mode: str, counts: list[int]) -> dict:
    return {"index": index, "kind": kind, "mode": mode, "counts": counts}


def test_the_streaming_phases_fragment_records_do_not_count_as_tokens_of_the_first_commits():
    # what auto wrote at 100 Mbit/s on the long runs: two sync commits, then acco fixed at half the batch (estimate,
    # commit) for five commits, then streaming, whose fragment records restart at index 1 and count inner steps
    rounds = [_round(2, "commit", "sync", [4, 4]), _round(4, "commit", "sync", [4, 4])]
    for i in range(5):
        rounds += [_round(6 + 2 * i, "estimate", "acco", [1, 1]), _round(7 + 2 * i, "commit", "acco", [1, 1])]
    rounds += [_round(i, "fragment", "streaming", [min(3 + 10 * (i - 1), 40)] * 2) for i in range(1, 20)]
    tokens = tokens_by_step(rounds, TOKENS_PER_MB)
    assert tokens == {1: 8 * 1024, 2: 16 * 1024, 3: 20 * 1024, 4: 24 * 1024, 5: 28 * 1024, 6: 32 * 1024,
                      7: 36 * 1024}
    # an estimate's micro-batches belong to the commit after it, whatever order the records were read in
    assert tokens_by_step(list(reversed(rounds)), TOKENS_PER_MB) == tokens


def _published_folders() -> list[str]:
    out = subprocess.run(["git", "ls-files", "bench_results"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return sorted({str(ROOT / Path(p).parent) for p in out if Path(p).name in (results_file.PLAIN,
                                                                               results_file.PACKED)})


def test_every_published_curve_places_its_gradient_commits_where_its_own_round_records_do():
    checked = 0
    for folder in _published_folders():
        for run in results_file.load(folder).get("runs", []):
            timeline, curve = run.get("timeline") or [], run.get("curve") or []
            if not timeline or not timeline[0] or not curve:
                continue
            wl = run["workload"]
            tokens = tokens_by_step(timeline[0], wl["micro_batch"] * wl["seq_len"])
            wrong = [(p["step"], p["tokens"], tokens[p["step"]]) for p in curve
                     if p["step"] in tokens and p["tokens"] != tokens[p["step"]]]
            assert not wrong, f"{folder}: {run['id']} (step, curve's tokens, its rounds'): {wrong[:3]}"
            if any(r["kind"] == "fragment" for r in timeline[0]) and tokens:
                checked += 1
    assert checked >= 30  # the auto runs that switched to streaming, among them
