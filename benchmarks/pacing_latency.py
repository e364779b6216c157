"""A round's paced all-to-all on a link with latency: pieces sized with the latency counted, as ds_acco sizes them,
against pieces sized from the rate alone (the rule before) and against one whole gloo call.

Why: a piece costs a fixed time its bytes do not shorten (gloo's handshake is a round trip), and two are on the wire
at once, so pieces sized from the rate a collective reached shrink on a long link round after round
(``ds_acco/comm/link_pacing.py`` says how). This times the collective a round issues (``RoundCollectives.all_to_all``,
1.65 MB from each rank: a commit's int8 reduce-scatter on the real-compute bed) on two emulated hosts, at each link
rate and one-way delay, the three ways in turn, each way with its own probe and its own pacer carried from round to
round; between collectives the hosts idle for ``--gap`` seconds, as they compute between rounds (TCP restarts its
window after an idle link, as it would in training). Where the kernel has no netem, the delay comes from a user-space
switch (:mod:`benchmarks.cluster.delay_switch`), which takes CPU beside the hosts.

    python -m benchmarks.pacing_latency --rates 100mbit,25mbit --delays 0ms,10ms,25ms,50ms \
        --out bench_results/pacing_latency

As root (namespaces, tc). Each rate and delay writes ``<rate>_<delay>.json`` (every repetition's seconds and pieces)
beside a table (``README.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks.cluster.two_hosts import run_worker, write_readme
from benchmarks.cluster.units import parse_delay

WAYS = ("latency counted", "rate alone", "whole")
"""How each collective is sent: ds_acco's pacing, the pacing before (the probe's latency set to zero), one call."""


def worker(out_path: str, send_bytes: int, reps: int, gap: float) -> None:
    """One host: the three ways in turn, ``reps`` times, barrier-started; rank 0 writes the seconds."""
    import torch
    import torch.distributed as dist

    from ds_acco.comm.collectives import RoundCollectives

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    paced = {way: RoundCollectives(None, 300) for way in WAYS[:2]}
    probed = {}
    for way, coll in paced.items():
        probed[way] = {"bytes_per_s": coll.probe_link(), "latency_s": coll.pacer.latency}
        if way == "rate alone":
            coll.pacer.latency = 0.0
    N = dist.get_world_size()
    inp = torch.randint(-100, 100, (N * send_bytes // (N - 1),), dtype=torch.int8)
    out = torch.empty_like(inp)
    rows = {way: [] for way in WAYS}
    for _ in range(reps):
        for way in WAYS:
            coll = paced.get(way)
            if coll is not None:  # a round agrees the piece size with its counts
                votes = coll.all_gather_small(torch.tensor([coll.pacing_vote()], dtype=torch.int64))
                coll.adopt_pacing(votes.view(-1).tolist())
            time.sleep(gap)
            dist.barrier()
            pieces0 = coll.wire.pieces if coll is not None else 0
            t0 = time.perf_counter()
            if coll is not None:
                coll.all_to_all(out, inp)
            else:
                dist.all_to_all_single(out, inp)
            seconds = time.perf_counter() - t0
            rows[way].append({"seconds": seconds, "piece_bytes": coll.piece_bytes if coll is not None else None,
                              "pieces": coll.wire.pieces - pieces0 if coll is not None else 1})
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({"send_bytes": send_bytes, "gap_s": gap, "probe": probed, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def over_whole(res: dict, way: str) -> float:
    """A way's median seconds over one whole call's, repetitions after the first (which the pacers spend
    measuring)."""
    median = lambda w: statistics.median(r["seconds"] for r in res["rows"][w][1:])  # noqa: E731
    return median(way) / median("whole")


def table(results: dict[str, dict]) -> str:
    """Per link and delay, each way's MB/s (median and range over repetitions after the first, which the
    pacers spend measuring), its last piece size and its seconds over the whole call's."""
    lines = ["| link | one-way delay | sent as | pieces (last) | MB/s, median (range) "
             "| seconds over one whole call's |",
             "|---|---|---|---|---|---|"]
    for key, res in results.items():
        rate, delay = key.split("_")
        mb = res["send_bytes"] / 1e6
        for way in WAYS:
            rows = res["rows"][way][1:]
            speeds = sorted(mb / r["seconds"] for r in rows)
            last = rows[-1]
            piece = "one call" if last["piece_bytes"] is None else f"{last['pieces']} of {last['piece_bytes']} B"
            lines.append(f"| {rate} | {delay} | {way} | {piece} | {statistics.median(speeds):.2f} "
                         f"({speeds[0]:.2f}-{speeds[-1]:.2f}) | "
                         f"{over_whole(res, way):.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="100mbit,25mbit")
    p.add_argument("--delays", default="0ms,10ms,25ms,50ms", help="one-way, host to switch")
    p.add_argument("--out", default="bench_results/pacing_latency")
    p.add_argument("--send-bytes", type=int, default=1_650_000, help="bytes each rank sends (1.65 MB: a commit's "
                   "int8 reduce-scatter on the real-compute bed)")
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--gap", type=float, default=0.5, help="seconds the hosts idle before each collective")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.send_bytes, args.reps, args.gap)
        return 0
    os.makedirs(args.out, exist_ok=True)
    results, via = {}, set()
    for rate in args.rates.split(","):
        for delay in args.delays.split(","):
            key = f"{rate}_{delay}"
            path = os.path.abspath(os.path.join(args.out, f"{key}.json"))
            link = ["--rate", rate] + (["--delay", delay] if parse_delay(delay) else [])
            results[key] = run_worker("benchmarks.pacing_latency", path, link,
                                      ["--send-bytes", str(args.send_bytes), "--reps", str(args.reps),
                                       "--gap", str(args.gap)])
            if results[key] is None:
                return 1
            with open(path.replace(".json", ".cluster.json")) as f:
                via.add(json.load(f).get("delay_via"))
    via.discard(None)
    text = table(results) + (f"\nThe delay: {', '.join(sorted(via))} (`delay_via` in each `*.cluster.json`).\n"
                             if via else "")
    write_readme(args.out, "Paced collectives on a link with latency", "benchmarks.pacing_latency", argv, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
