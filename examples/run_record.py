"""What one rank of ``train_lm_fsdp --metrics-out DIR`` records for the FSDP benchmark (``benchmarks`` part ``fsdp``).

Per optimizer step: wall time, training time (evaluation excluded), micro-batch
index and the ``$DS_ACCO_CLUSTER_IFACE`` byte counters; per evaluation: the
validation loss and the training time it was reached at; at the end: the round
telemetry (ds_acco) and how many collectives ran. Stock FSDP2 reports no
collective count, so the recorder counts the calls FSDP2 makes through
``torch.distributed.all_gather_single`` / ``reduce_scatter_single`` /
``all_reduce`` (each call still runs; FSDP2 looks these up on the module at call
time). ds_acco's rounds use their own bindings, counted by
``RoundCollectives.wire.calls``.

Written to ``DIR/fsdp_rank<r>.json`` at :meth:`RunRecorder.finish`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch.distributed as dist


def iface_bytes(iface: str) -> tuple[int, int]:
    """``(tx, rx)`` byte counters of a network interface (``(-1, -1)`` where it has none)."""
    base = f"/sys/class/net/{iface}/statistics"
    try:
        with open(f"{base}/tx_bytes") as tx, open(f"{base}/rx_bytes") as rx:
            return int(tx.read()), int(rx.read())
    except (OSError, ValueError):
        return -1, -1


_COUNTED = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor",
            "all_reduce")


class RunRecorder:
    def __init__(self, out_dir: str, rank: int):
        self.out_dir, self.rank = out_dir, rank
        self.iface = os.environ.get("DS_ACCO_CLUSTER_IFACE", "lo")
        self.t0 = time.time()
        self.iface0 = iface_bytes(self.iface)
        self.steps: list[dict] = []
        self.evals: list[dict] = []
        self.calls = dict.fromkeys(_COUNTED, 0)
        for name in _COUNTED:
            real = getattr(dist, name, None)
            if real is None:
                continue

            def counted(*args, _real=real, _name=name, **kwargs):
                self.calls[_name] += 1
                return _real(*args, **kwargs)

            setattr(dist, name, counted)

    def step(self, step: int, micro_batch_index: int, train_s: float, loss: float) -> None:
        tx, rx = iface_bytes(self.iface)
        self.steps.append({"t": time.time(), "step": step, "micro_batch_index": micro_batch_index,
                           "train_s": train_s, "loss": loss, "tx_bytes": tx, "rx_bytes": rx})

    def eval(self, step: int, train_s: float, val_loss: float) -> None:
        self.evals.append({"step": step, "train_s": train_s, "val_loss": val_loss})

    def finish(self, trainer: Any, micro_batches: int, world: int) -> None:
        engine = getattr(trainer, "engine", None)
        record = {
            "rank": self.rank, "world": world, "micro_batches": micro_batches, "steps": self.steps,
            "evals": self.evals, "iface_start": self.iface0, "iface_end": iface_bytes(self.iface),
            "stock": engine is None, "fsdp_units": len(trainer.fsdp.groups), "fsdp_params": len(trainer.fsdp.params),
            "torch_calls": self.calls,
        }
        if engine is not None:
            tel = engine.telemetry
            record.update(rounds=tel.rounds, round_calls=engine.coll.wire.calls,
                          round_pieces=engine.coll.wire.pieces, piece_bytes=engine.coll.piece_bytes,
                          groups=len(engine.groups),
                          ring_bytes_sent=tel.total_bytes_sent, summary=tel.summary(),
                          counts=[r.counts for r in tel.records], compute_s=[r.compute_s for r in tel.records],
                          kinds=[r.kind for r in tel.records], stage_s=[r.stage_s for r in tel.records],
                          waited_s=[r.waited_s for r in tel.records])
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(self.out_dir, f"fsdp_rank{self.rank}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
