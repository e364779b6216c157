"""Leaves a round in flight on two engines, a dpu round engine and a streaming engine, and ends without close():
ds_acco's exit hook must finish both on every rank.

Run under torchrun with 2 ranks; prints one ``EXIT <json>`` line per rank and engine from an atexit hook
registered *before* the engines (atexit runs hooks last-in first-out, so it runs after theirs). The hook closes
the newest engine first, the same order on every rank, so the two drains' collectives (each engine's own
group) meet.
"""

import atexit
import json

import torch
import torch.distributed as dist
from torch import nn

from ds_acco import plain, streaming

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
state: dict = {}


def report() -> None:
    for mode, (engine, in_flight) in state.items():
        print("EXIT " + json.dumps({"rank": rank, "mode": mode, "closed": engine._closed,
                                    "in_flight_before": in_flight, "rounds": engine.telemetry.rounds}), flush=True)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


atexit.register(report)
x, y = torch.randn(2, 4), torch.randn(2, 1)
net = model()
engine = plain.build(net.parameters(), torch.optim.SGD, {"lr": 0.1}, config={"mode": "dpu"},
                     gradient_accumulation_steps=2)
for _ in range(3):  # rounds launch after micro-batches 2 (dpu: overlapped, so still in flight)
    nn.functional.mse_loss(net(x), y).backward()
    engine.after_micro_batch()
state["acco"] = (engine, engine._inflight is not None)
net = model()
engine = streaming.build(net, torch.optim.SGD, {"lr": 0.1},
                         config={"mode": "streaming", "streaming": {"fragments": 1, "sync_every": 2,
                                                                    "overlap_steps": 1}})
for _ in range(2):  # the fragment launches at inner step 2 and is due at step 3
    nn.functional.mse_loss(net(x), y).backward()
    engine.inner_optimizer.step()
    engine.inner_optimizer.zero_grad()
    engine.after_inner_step()
state["streaming"] = (engine, engine.in_flight)
