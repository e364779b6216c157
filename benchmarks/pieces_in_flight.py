"""A paced gloo all-to-all with its pieces one at a time against two on the wire at once, on the emulated cluster.

Why: on a shaped link a round's collectives go in pieces of a few tens of milliseconds of link time
(ds_acco/comm/link_pacing.py says why). Sent one at a time, every piece waits for each rank's communication
thread to wake, launch the next and meet its peers again, and the link idles meanwhile; on a CPU host that
thread shares its core with forward and backward. This measures the same collective as a round issues it
(``RoundCollectives.all_to_all``: a commit's int8 reduce-scatter, 1.65 MB from each rank on the real-compute
bed) with the link measured by the job's own probe, pieces of 25 and 12.5 ms of link time, one or two in
flight, with the host's core idle and with the bed's model training on it (GPT "small", 8 x 128 tokens).

    python -m benchmarks.pieces_in_flight --rates 100mbit,25mbit,10mbit --out bench_results/pieces_in_flight

As root (namespaces, tc). Each rate writes ``<rate>.json`` (every repetition's seconds) beside a table
(``README.md``); a few minutes in all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

from benchmarks.cluster.two_hosts import run_worker, write_readme

PIECE_SECONDS = (0.025, 0.0125)
IN_FLIGHT = (1, 2)


def _train_forever(stop: threading.Event, busy: threading.Event) -> None:
    """The real-compute bed's load: forward and backward of GPT "small" on 8 x 128 tokens, while ``busy``."""
    import torch

    from examples.models import build_gpt

    model = build_gpt("small", seq_len=128)
    x = torch.randint(0, model.config.vocab_size, (8, 128))
    while not stop.is_set():
        if not busy.wait(0.01):
            continue
        model(input_ids=x, labels=x).loss.backward()


def worker(out_path: str, send_bytes: int, reps: int) -> None:
    """One host: every setting ``reps`` times, barrier-started; rank 0 writes the seconds."""
    import torch
    import torch.distributed as dist

    import ds_acco.comm.link_pacing as pacing
    from ds_acco.comm.collectives import RoundCollectives

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    coll = RoundCollectives(None, 300)
    probed = coll.probe_link()
    N = coll.world_size
    inp = torch.randint(-100, 100, (N * send_bytes // (N - 1),), dtype=torch.int8)
    out = torch.empty_like(inp)
    stop, busy = threading.Event(), threading.Event()
    load_thread = threading.Thread(target=_train_forever, args=(stop, busy), daemon=True)
    load_thread.start()
    rows = []
    for load in ("idle", "training"):
        (busy.set if load == "training" else busy.clear)()
        time.sleep(1.0)  # the model is built and running (or has stopped)
        for piece_seconds in PIECE_SECONDS:
            coll.pacer.piece_seconds = piece_seconds
            everyone = coll.all_gather_small(torch.tensor([coll.pacing_vote()], dtype=torch.int64))
            coll.adopt_pacing(everyone.view(-1).tolist())
            for in_flight in IN_FLIGHT:
                pacing.IN_FLIGHT = in_flight
                seconds = []
                for _ in range(reps):
                    coll.barrier()
                    t0 = time.perf_counter()
                    coll.all_to_all(out, inp)
                    seconds.append(time.perf_counter() - t0)
                rows.append({"load": load, "piece_ms": piece_seconds * 1e3, "piece_bytes": coll.piece_bytes,
                             "in_flight": in_flight, "seconds": seconds})
    stop.set()
    load_thread.join()  # not mid-backward while the interpreter exits
    if coll.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"send_bytes": send_bytes, "probed_bytes_per_s": probed, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def table(results: dict[str, dict]) -> str:
    """Median MB/s (and the range over repetitions) per rate, load, piece size and pieces in flight."""
    lines = ["| link | compute on the host | piece (ms of link) | piece bytes | in flight | MB/s, median (range) |",
             "|---|---|---|---|---|---|"]
    for rate, res in results.items():
        mb = res["send_bytes"] / 1e6
        for r in res["rows"]:
            speeds = sorted(mb / s for s in r["seconds"])
            lines.append(f"| {rate} | {r['load']} | {r['piece_ms']:g} | {r['piece_bytes']} | {r['in_flight']} | "
                         f"{statistics.median(speeds):.2f} ({speeds[0]:.2f}-{speeds[-1]:.2f}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="100mbit,25mbit,10mbit")
    p.add_argument("--out", default="bench_results/pieces_in_flight")
    p.add_argument("--send-bytes", type=int, default=1_650_000, help="bytes each rank sends (1.65 MB: a commit's "
                   "int8 reduce-scatter on the real-compute bed)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.send_bytes, args.reps)
        return 0
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for rate in args.rates.split(","):
        path = os.path.abspath(os.path.join(args.out, f"{rate}.json"))
        results[rate] = run_worker("benchmarks.pieces_in_flight", path, ["--rate", rate],
                                   ["--send-bytes", str(args.send_bytes), "--reps", str(args.reps)])
        if results[rate] is None:
            return 1
    text = table(results)
    write_readme(args.out, "Pieces in flight", "benchmarks.pieces_in_flight", argv, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
