"""Leaves a round in flight and ends without close(): ds_acco's exit hook must finish it on every rank.

Run under torchrun with 2 ranks; prints one ``EXIT <json>`` line per rank from an atexit hook
registered *before* the engines (atexit runs hooks last-in first-out, so it runs after theirs).
"""

import atexit
import json
import sys

import torch
import torch.distributed as dist
from torch import nn

from ds_acco import plain, streaming

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
state: dict = {}


def report() -> None:
    engine = state["engine"]
    print("EXIT " + json.dumps({"rank": rank, "closed": engine._closed, "in_flight_before": state["in_flight"],
                                "rounds": engine.telemetry.rounds}), flush=True)


atexit.register(report)
x, y = torch.randn(2, 4), torch.randn(2, 1)
if mode == "acco":
    engine = plain.build(model.parameters(), torch.optim.SGD, {"lr": 0.1}, config={"mode": "dpu"},
                         gradient_accumulation_steps=2)
    for _ in range(3):  # rounds launch after micro-batches 2 (dpu: overlapped, so still in flight)
        nn.functional.mse_loss(model(x), y).backward()
        engine.after_micro_batch()
    state["in_flight"] = engine._inflight is not None
else:
    engine = streaming.build(model, torch.optim.SGD, {"lr": 0.1},
                             config={"mode": "streaming", "streaming": {"fragments": 1, "sync_every": 2,
                                                                        "overlap_steps": 1}})
    for _ in range(2):  # the fragment launches at inner step 2 and is due at step 3
        nn.functional.mse_loss(model(x), y).backward()
        engine.inner_optimizer.step()
        engine.inner_optimizer.zero_grad()
        engine.after_inner_step()
    state["in_flight"] = engine.in_flight
state["engine"] = engine
