"""Every table of README.md and BENCHMARKS.md, computed from the committed raw files (``python -m benchmarks report``).

Why: numbers typed into a page drift from the runs they came from (a re-run, a renamed folder, a ratio
computed against the older preset). Each table here is a function of :mod:`benchmarks.report.pages.sets`
(the sets of ``bench_results/sets.json``) and the library's own step model; :mod:`benchmarks.report.pages.write`
writes them between ``<!-- generated:NAME -->`` and ``<!-- /generated -->`` in the pages, and
``tests/test_docs.py`` regenerates them and fails on any difference.

Every time is *seconds to a loss*: training seconds (evaluation excluded) until a run's validation loss
reaches the loss the fair baseline of its own sweep (sync fp32; sync low-bit where it did not run) had at
75% of its token budget (:mod:`benchmarks.report.repeats`). Medians over seeds; ratios are of medians.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from benchmarks import results_file

from . import sets as rs
from .cells import BEDS, HAND, SET_OF, bed_name, label, md_table, ratio_of, s, span, x
from .gpu import in_flight, in_flight_rows, in_flight_summary, round_launches
from .long_runs import latency_block, long_runs, long_runs_summary, second_machine
from .long_runs import loss_rows as long_loss_rows
from .pacing import loss_row as pacing_loss_row
from .pacing import pacing_latency, pacing_training
from .projection import projection_rows


def _reached(r: dict) -> str:
    seen = [v for v in r["seconds"] if v is not None]
    return f"{len(seen)}/{len(r['seconds'])}"


def _first(set_name: str, key, configs) -> Optional[dict]:
    """The fastest row among ``configs`` on a bed (by median), or None."""
    rows = [r for c in configs if (r := rs.row(set_name, *key, c)) and r["median_s"] is not None]
    return min(rows, key=lambda r: r["median_s"]) if rows else None


def bed_table(key: tuple[str, str], set_name: str = "five_beds") -> str:
    """One bed: every config's seconds to the loss, seed by seed, against the fair baseline and sync low-bit."""
    block = rs.summary(set_name)[tuple(key)]
    rows = []
    for r in block["rows"]:
        each = ", ".join("never" if v is None else f"{v:.1f}" for v in r["seconds"])
        finals = [v for v in r["seconds_final"]]
        rows.append([label(r["config"]), each, s(r["median_s"]), s(r["spread_s"]), x(r["vs_sync"]),
                     x(r["vs_sync_lowbit"]), f"{r['s_per_step']:.2f}" if r["s_per_step"] else "-",
                     f"{r['mb_per_commit']:.1f}" if r["mb_per_commit"] else "-",
                     x(r["compute_ratio"]) if r["compute_ratio"] else "-",
                     f"{rs.median(r['final_loss']):.4f}",
                     "-" if block["final_target"] is None else
                     f"{sum(v is not None for v in finals)}/{len(finals)}"])
    table = md_table(["config", "seconds to the loss, seed by seed", "median", "spread", "vs sync fp32",
                    "vs sync low-bit", "s/step", "micro-batches per commit", "compute with a round in flight",
                    "final loss", "reached the baseline's final loss"], rows)
    early = ", ".join(f"{v:.4f}" for v in block["early_target"])
    seeds = ", ".join(str(v) for v in block["seeds"])
    final = "" if block["final_target"] is None else (
        "; the last column counts the runs that came within 0.1% of its loss at the end of its own budget")
    return (f"{table}\n\nTarget: the validation loss {label(block['early_from'])} reached at 75% of its token budget, "
            f"{early} (seeds {seeds}){final}. Final loss: the median at the end of the budget.")


def beds(set_name: str = "five_beds") -> str:
    """What each bed is: model, compute per step, how long a low-bit round is against it, raw folders."""
    rows = []
    for key in rs.beds_of(set_name):
        low = rs.row(set_name, *key, "sync_lowbit")
        share = rs.median(low["round_share"]) if low else None
        first = next(f for f in rs.folders(set_name) if _has(f, key))
        run = next(r for r in rs._runs(first) if r["config"] == "sync_lowbit")
        w = run["workload"]
        per_rank = [rs.median(v) for v in zip(*low["step_compute"])] if low else []
        compute = " / ".join(f"{v:.2f} s" for v in per_rank) if per_rank and max(per_rank) > 1.2 * min(per_rank) \
            else f"{rs.median(per_rank):.2f} s" if per_rank else "-"
        model = f"{run['params'] / 1e6:.2f} M-parameter GPT, {w['micro_batch']} x {w['grad_accum']} micro-batches of " \
                f"{w['seq_len']} tokens per host" + (f", {w['compute_delay_ms']} ms sleep each" if w["compute_delay_ms"] != "0" else "")
        rows.append([bed_name(key), model, compute, f"{share:.2f}" if share else "-",
                     str(len(low["seconds"])) if low else "-",
                     f"`{os.path.relpath(os.path.dirname(first), rs.ROOT)}/{_glob_of(first)}`"])
    return md_table(["bed", "model and batch", "a step's compute (sync; per host where they differ)",
                     "a low-bit round / a step's compute", "seeds", "raw files"], rows) + (
        "\n\nA round: sync low-bit's round time over a step's compute, on the rank that waited least for its peer "
        "(medians over the runs).")


def _has(folder: str, key) -> bool:
    from ..repeats import bed_of

    return any((bed_of(r), r["rate"]) == tuple(key) for r in rs._runs(folder))


def _glob_of(folder: str) -> str:
    base = os.path.basename(folder)
    return base.rstrip("0123456789") + "*" if base[-1:].isdigit() else base


def headline(set_name: str = "five_beds") -> str:
    """Seconds to the loss: ds_acco against the fair baseline, the best-tuned sync and an external peer."""
    rows = []
    peers = rs.role("external_peer")
    for key in rs.beds_of(set_name):
        fair = _first(set_name, key, rs.role("fair_baseline"))
        tuned = _first(set_name, key, rs.role("tuned_sync"))
        peer = _first(set_name, key, peers) if peers else None
        cells = [bed_name(key), s(fair["median_s"]) if fair else "not run",
                 f"{s(tuned['median_s'])} ({label(tuned['config'])})" if tuned else "not run"]
        for role in ("ds_acco", "ds_acco_streaming"):
            mine = _first(set_name, key, rs.role(role))
            if not mine:
                cells.append("not run")
                continue
            vs = [v for v in (ratio_of(mine, fair), ratio_of(mine, tuned), ratio_of(mine, peer)) if v is not None]
            cells.append(f"**{s(mine['median_s'])}**: " + ", ".join(x(v) for v in vs))
        cells.append(f"{s(peer['median_s'])} ({label(peer['config'])})" if peer else "not measured yet")
        rows.append(cells)
    return md_table(["bed (2 emulated hosts, CPU)", "sync fp32: the fair baseline", "best-tuned sync",
                   "ds_acco: auto", "ds_acco: auto with `auto.streaming`", "external peer: torchft's best"], rows) + \
        ("\n\nMedians of seeds 1-4; ratios: against the fair baseline, the best-tuned sync and torchft's best "
         "(where the fair baseline did not run, the last two).")


def _versus_peer(set_name: str, key) -> tuple[Optional[dict], Optional[dict]]:
    """``(ds_acco's fastest row, torchft's fastest row)`` on a bed; stock DeepSpeed is neither."""
    from ..repeats import NOT_DS_ACCO

    configs = [r["config"] for r in rs.summary(set_name)[tuple(key)]["rows"] if r["config"] not in NOT_DS_ACCO]
    return _first(set_name, key, configs), _first(set_name, key, rs.role("external_peer"))


def _seconds(r: dict) -> str:
    """Median seconds, the spread over seeds and how many runs reached the loss."""
    spread = f"spread {s(r['spread_s'])}, " if r["spread_s"] is not None else ""
    return f"{s(r['median_s'])} ({spread}{_reached(r)})"


def peer(set_name: str = "five_beds") -> str:
    """ds_acco's best config against torchft's DiLoCo and Streaming DiLoCo on the same bed, model, data and link."""
    rows = []
    peers = rs.role("external_peer")
    for key in rs.beds_of(set_name):
        mine, theirs = _versus_peer(set_name, key)
        if not theirs:
            continue
        cells = [bed_name(key)]
        for c in peers:
            r = rs.row(set_name, *key, c)
            cells.append(_seconds(r) if r else "not run")
        cells += [f"{_seconds(mine)}: {label(mine['config'])}", x(ratio_of(mine, theirs), True),
                  f"{rs.median(theirs['final_loss']):.4f} / {rs.median(mine['final_loss']):.4f}"]
        rows.append(cells)
    return md_table(["bed", *(f"{label(c)}: median (spread, runs that reached the loss)" for c in peers),
                     "ds_acco's best", "ds_acco's best / torchft's best",
                     "final loss: torchft's best / ds_acco's best"], rows)


def which_mode(set_name: str = "five_beds") -> str:
    """Which mode for which job, each row with the time to a loss measured where that situation was emulated."""
    def cell(key, config, name: str = set_name) -> str:
        r = rs.row(name, *key, config)
        if not r or r["median_s"] is None:
            return "-"
        fair = _first(name, key, rs.role("fair_baseline"))
        low = rs.row(name, *key, "sync_lowbit")
        peer = _first(name, key, rs.role("external_peer"))
        vs = [f"{x(ratio_of(r, b))} {n}" for b, n in ((fair, "sync fp32"), (low, "sync low-bit"), (peer, "torchft"))
              if ratio_of(r, b)]
        return f"{s(r['median_s'])} ({', '.join(vs)}; {bed_name(key)})"
    rows = [
        ["a round shorter than a step's compute, equal hosts", "`mode: auto` (`ds_configs/auto_lowbit.json`); it "
         "runs acco adaptive", cell(("real", "100mbit"), "auto_lowbit_int4")],
        ["compute off the CPU (as on a GPU node)", "`mode: auto`", cell(("sleep", "100mbit"), "auto_lowbit_int4")],
        ["mixed hardware (a slower worker)", "`mode: auto`, or `mode: acco` with `policy: adaptive`",
         cell(("real-host1@50%", "100mbit"), "auto_lowbit_int4")],
        ["a slow link: a round about as long as a step's compute", "`auto.streaming` "
         "(`ds_configs/auto_lowbit_streaming.json`), or `mode: streaming`",
         cell(("real", "25mbit"), "auto_lowbit_int4_streaming")],
        ["memory tight: no room for a second optimizer state per rank", "`mode: auto` without `auto.streaming` "
         "(ZeRO-1's memory plus 4 P/N)", cell(("real", "25mbit"), "auto_lowbit_int4")],
        ["a fast link: rounds tiny next to compute", "`mode: auto`; not acco with `policy: fixed` (slower than sync "
         "there: [more beds](docs/benchmarks-more.md#real-compute-on-an-unshaped-link))",
         cell(("real", "unshaped"), "auto_lowbit_int4", "fast_link") if "fast_link" in rs.index()["sets"]
         else "not measured on the current beds"],
        ["exact steps (tests, a reference run)", "`mode: sync` (stock ZeRO-1, step for step), or `policy: fixed`",
         cell(("real", "100mbit"), "sync")],
    ]
    return md_table(["your job", "pick", "measured: seconds to the loss (ratios; bed)"], rows)


def decomposition(set_name: str = "five_beds") -> str:
    """Where the speed-up comes from: low-bit rounds, overlap at sync's batch, smaller commits, auto's choice."""
    steps = [("sync", None), ("sync_lowbit", "low-bit rounds"), ("acco_lowbit_int4_fixed", "+ overlap at sync's batch"),
             ("acco_lowbit_int4_adaptive", "+ smaller commits (adaptive)"), ("auto_lowbit_int4", "auto's choice")]
    rows = []
    for key in rs.beds_of(set_name):
        if not rs.row(set_name, *key, "sync"):
            continue
        cells, before = [bed_name(key)], None
        for config, _ in steps:
            r = rs.row(set_name, *key, config)
            if r is None or r["median_s"] is None:
                cells.append(f"never ({_reached(r)} runs)" if r else "-")
                continue
            step = f" ({x(ratio_of(r, before))})" if before else ""
            cells.append(f"{s(r['median_s'])}{step}")
            if config != "auto_lowbit_int4":
                before = r
        rows.append(cells)
    head = ["bed", "sync fp32"] + [f"{what}: {label(c)}" for c, what in steps[1:]]
    return md_table(head, rows) + ("\n\nEach ratio is against the column before it that reached the loss (auto: against "
                                 "the last of them); medians of seeds 1-4, same sweeps.")


def batch_control(set_name: str = "batch_control") -> str:
    """Sync at half the batch against acco adaptive, whose commits are smaller than sync's."""
    rows = []
    for key in rs.beds_of(set_name):
        low = rs.row(set_name, *key, "sync_lowbit")
        cells = [bed_name(key), s(low["median_s"])]
        for c in ("sync_lowbit_half", "acco_lowbit_int4_adaptive"):
            r = rs.row(set_name, *key, c)
            cells.append(f"{s(r['median_s'])} ({x(ratio_of(r, low))}), {r['mb_per_commit']:.1f} micro-batches a commit"
                         if r else "-")
        rows.append(cells)
    return md_table(["bed (seed 0, two runs each)", "sync low-bit (8 micro-batches a commit)",
                   "sync low-bit, half the batch", "acco adaptive"], rows)


def probe(set_name: str = "auto_probe") -> str:
    """The auto preset as it ships (it probes the link behind step 1) against the best mode by hand, same sweeps."""
    rows = []
    for key in rs.beds_of(set_name):
        low = rs.row(set_name, *key, "sync_lowbit")
        auto = rs.row(set_name, *key, "auto_lowbit_int4_streaming")
        best = _first(set_name, key, [c for c in HAND if c != "sync_lowbit"])
        ran = ["streaming" if v is None else f"acco {v:.0%}" for v in (auto["acco_share"] or [])]
        rows.append([bed_name(key), str(len(auto["seconds"])), s(low["median_s"]),
                     f"{s(best['median_s'])} ({label(best['config'])})", f"**{s(auto['median_s'])}**",
                     x(ratio_of(auto, best), True), x(ratio_of(auto, low)), ", ".join(sorted(set(ran)))])
    return md_table(["bed", "seeds", "sync low-bit", "best mode by hand", "auto with `auto.streaming`",
                   "vs the best by hand", "vs sync low-bit", "what auto ran (share of commits in acco)"], rows)


def losses() -> str:
    """Where ds_acco loses, each line computed from the sets."""
    out = []
    fb = lambda c, key: rs.row("five_beds", *key, c)  # noqa: E731
    r100, r25 = ("real", "100mbit"), ("real", "25mbit")
    half = rs.row("batch_control", *r100, "sync_lowbit_half")
    ad = rs.row("batch_control", *r100, "acco_lowbit_int4_adaptive")
    out.append(["sync at half the batch against acco adaptive (real compute, 100 Mbit/s, seed 0)",
                f"{s(half['median_s'])} against {s(ad['median_s'])}: acco adaptive took {x(ratio_of(ad, half))} sync's "
                "time"])
    fix, low = fb("acco_lowbit_int4_fixed", r100), fb("sync_lowbit", r100)
    out.append(["ACCO's overlap alone, at sync's batch (acco fixed, real compute, 100 Mbit/s)",
                f"{x(ratio_of(fix, low))} sync low-bit; the low-bit rounds alone: {x(ratio_of(low, fb('sync', r100)))} "
                "sync fp32"])
    fin = ", ".join(f"{label(c)} {sum(v is not None for v in fb(c, r100)['seconds_final'])}/4"
                    for c in ("sync_lowbit", "acco_lowbit_int4_fixed", "streaming_int8"))
    out.append(["runs reaching the fair baseline's *final* loss within the budget (real compute, 100 Mbit/s)", fin])
    a25 = fb("acco_lowbit_int4_adaptive", r25)
    out.append(["acco adaptive at 25 Mbit/s", f"never reaches the loss ({_reached(a25)} runs): commits of "
                f"{a25['mb_per_commit']:.1f} micro-batches, against sync's 8"])
    auto25, st25 = fb("auto_lowbit_int4", r25), fb("streaming_int8", r25)
    out.append(["auto without `auto.streaming` at 25 Mbit/s", f"{x(ratio_of(auto25, st25))} streaming by hand's time"])
    probe100 = rs.row("auto_probe", *r100, "auto_lowbit_int4_streaming")
    hand100 = rs.row("auto_probe", *r100, "acco_lowbit_int4_adaptive")
    out.append(["auto (as shipped) against acco adaptive by hand at 100 Mbit/s", f"{x(ratio_of(probe100, hand100))} "
                "(its two measured sync steps; seeds 1-4)"])
    gaps = []
    for set_name, key in (("five_beds", r25), ("auto_probe", r25)):
        st, lo = rs.row(set_name, *key, "streaming_int8"), rs.row(set_name, *key, "sync_lowbit")
        gaps.append(f"{100 * (rs.median(st['final_loss']) / rs.median(lo['final_loss']) - 1):+.2f}% "
                    f"({len(st['final_loss'])} seeds)")
    out.append(["streaming's validation loss at the end of the budget against sync low-bit's (25 Mbit/s)",
                " and ".join(gaps)])
    ratios = ", ".join(f"{x(fb('acco_lowbit_int4_fixed', k)['compute_ratio'])} ({bed_name(k)})"
                       for k in rs.beds_of("five_beds") if fb("acco_lowbit_int4_fixed", k)["compute_ratio"])
    gpu = in_flight_summary(in_flight_rows())  # counted whole: docs/gpu.md
    device_paced, host_paced = max(k for k in gpu if k != "kernel"), min(k for k in gpu if k != "kernel")
    ratios += (f"; on a GPU (H200, one rank, counted whole, at 7c254e7): {span(gpu[device_paced]['in_flight_ratio'])}x "
               f"where the device paces the step, {span(gpu[host_paced]['in_flight_ratio'])}x where the host does "
               "(docs/gpu.md: one later run with a swap's views cut once)")
    out.append(["compute per micro-batch with a round in flight, acco fixed (target: within 1.03x)", ratios])
    if "fast_link" in rs.index()["sets"]:
        fast = ("real", "unshaped")
        fix, low = rs.row("fast_link", *fast, "acco_lowbit_int4_fixed"), rs.row("fast_link", *fast, "sync_lowbit")
        out.append(["acco fixed on an unshaped link: a round's CPU work with no link to hide",
                    f"{x(ratio_of(fix, low))} sync low-bit's time ({len(fix['seconds'])} seeds)"])
    vs_peer = []
    for k in rs.beds_of("five_beds"):
        if (ratio := ratio_of(*_versus_peer("five_beds", k))) and ratio > 0.9:
            vs_peer.append(f"{x(ratio)} ({bed_name(k)})")
    if vs_peer:
        out.append(["ds_acco's best against torchft's best, where above the 0.9x target", ", ".join(vs_peer)])
    out.append(pacing_loss_row())
    out += long_loss_rows()
    return md_table(["where", "measured"], out)


def fsdp() -> str:
    """ds_acco-FSDP against stock FSDP2: seconds to stock's loss per link, medians over seeds
    (:func:`benchmarks.report.fsdp.ttl_table`; the folders are sets.json's ``fsdp``)."""
    import glob

    from ..fsdp import ttl_collect, ttl_summary, ttl_table

    results = []
    for pattern in rs.index()["fsdp"]["folders"]:
        for folder in sorted(glob.glob(os.path.join(rs.ROOT, "bench_results", pattern))):
            results.append(results_file.load(folder))
    if not results:
        raise FileNotFoundError(f"{rs.INDEX}: fsdp: nothing matches {rs.index()['fsdp']['folders']}")
    return ttl_table(ttl_summary(ttl_collect(results)))


TABLES: dict[str, Callable[[], str]] = {
    "headline": headline, "which_mode": which_mode, "beds": beds, "decomposition": decomposition,
    "batch_control": batch_control, "probe": probe, "peer": peer, "losses": losses, "fsdp": fsdp,
    "projection": projection_rows,
    "long_runs": long_runs, "long_runs_summary": long_runs_summary, "long_runs_machine2": second_machine,
    "round_launches": round_launches,
    "gpu_in_flight": in_flight,
    "pacing_latency": pacing_latency, "pacing_training": pacing_training, "long_runs_latency": latency_block,
    **{f"bed:{k[0]}:{k[1]}": (lambda k=k: bed_table(k, SET_OF.get(k, "five_beds"))) for k in BEDS},
}
"""Every generated table, by the name its markers carry."""
