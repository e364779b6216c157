"""Do collectives, and a whole low-bit round, run at the link's speed?

Run on every host of the emulated cluster::

    python launchers/local_cluster.py --hosts 2 --rate 25mbit --pin -- python -m benchmarks.cluster.linkcheck

Each rank times, for a payload of ``--mib`` MiB per rank and direction, the
collectives a round is made of (one-way send as the reference, gloo's
all-gather, all-to-all and reduce-scatter, ds_acco's all-to-all reduce-scatter),
then one low-bit round's collectives (int8 reduce-scatter plus int8 delta
all-gather of a ``--params`` buffer) on a background thread, first with the
training thread idle and then while it runs matrix products (compute on the same
core, as in training); then the reduce-scatter and the idle round again with the
pieces paced to the link as training paces them (``paced_*``, ds_acco.comm.link_pacing). It prints seconds and the payload rate each direction
carried, next to the link's rate, as one JSON line per rank (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import torch
import torch.distributed as dist


def _timed(fn, reps: int) -> float:
    dist.barrier()
    fn()  # warm-up (connections, allocations)
    best = float("inf")
    for _ in range(reps):
        dist.barrier()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _busy(stop: threading.Event) -> None:
    a = torch.randn(256, 256)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def _round(coll, rs, ag, grads, out, base, staging, new) -> None:
    rs(coll, out, grads)
    ag(coll, staging, base, new)


def main(argv=None) -> int:
    from ds_acco.comm.collectives import RoundCollectives
    from ds_acco.comm.int8_collectives import Int8DeltaAllGather, Int8ReduceScatter

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=4.0, help="payload per rank and direction for the collectives")
    p.add_argument("--params", type=int, default=3_300_000, help="elements of the low-bit round's buffer")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default=None, help="append one JSON line per rank here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    per_rank = int(args.mib * 2**20 // 4)
    shard, full = torch.randn(per_rank), torch.empty(per_rank * n)
    big = torch.randn(per_rank * n)
    coll = RoundCollectives(None, 600.0)
    moved = per_rank * 4 * (n - 1)  # bytes each rank sends (and receives) in the symmetric collectives
    res = {"rank": rank, "world": n, "payload_bytes_per_direction": moved}
    if n == 2:
        res["send_one_way_s"] = _timed(lambda: dist.send(shard, 1) if rank == 0 else dist.recv(shard, 0), args.reps)
    res["all_gather_s"] = _timed(lambda: dist.all_gather_into_tensor(full, shard), args.reps)
    res["all_to_all_s"] = _timed(lambda: dist.all_to_all_single(full, big), args.reps)
    res["gloo_reduce_scatter_s"] = _timed(lambda: dist.reduce_scatter_tensor(shard, big), args.reps)
    res["ds_acco_reduce_scatter_s"] = _timed(lambda: coll.reduce_scatter_sum(shard, big), args.reps)

    P = -(-args.params // n) * n
    rs, ag = Int8ReduceScatter(P, n), Int8DeltaAllGather(P // n, n)
    grads, out = torch.randn(P), torch.empty(P // n)
    base, staging = torch.randn(P), torch.empty(P)
    dist.broadcast(base, 0)
    new = base.view(n, -1)[rank] + 1e-3 * torch.randn(P // n)
    sent0 = coll.wire.sent
    _round(coll, rs, ag, grads, out, base, staging, new)
    res["round_bytes_per_direction"] = coll.wire.sent - sent0
    for name, load in (("round_idle_s", False), ("round_busy_s", True)):
        stop = threading.Event()
        worker = threading.Thread(target=_busy, args=(stop,), daemon=True) if load else None
        if worker:
            worker.start()
        res[name] = _timed(lambda: _round(coll, rs, ag, grads, out, base, staging, new), args.reps)
        stop.set()
        if worker:
            worker.join()
    # the same with the pieces paced to the link (ds_acco.comm.link_pacing), as the round engine agrees them
    votes = [None] * n
    dist.all_gather_object(votes, coll.pacing_vote())
    coll.adopt_pacing(votes)
    res["paced_piece_bytes"] = coll.piece_bytes
    res["paced_ds_acco_reduce_scatter_s"] = _timed(lambda: coll.reduce_scatter_sum(shard, big), args.reps)
    res["paced_round_idle_s"] = _timed(lambda: _round(coll, rs, ag, grads, out, base, staging, new), args.reps)
    for key in [k for k in res if k.endswith("_s")]:
        nbytes = res["round_bytes_per_direction"] if "round_" in key and "reduce" not in key else moved
        res[key[:-2] + "_mbit_s"] = round(nbytes * 8 / res[key] / 1e6, 2)
        res[key] = round(res[key], 3)
    line = json.dumps(res)
    print(line, flush=True)
    if args.json:
        with open(f"{args.json}.rank{rank}", "a", encoding="utf-8") as f:
            f.write(line + "\n")
    coll.destroy()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
