"""``acco.auto.streaming``'s look before the first round: the link probed behind step 1's compute.

On a real shaped link (two network namespaces joined at 10 Mbit/s by ``tc tbf``, ``launchers/local_cluster.py``),
a wide version of the tiny exactness job (hidden width 32768: a commit round sends about 1 MB from each rank,
0.84 s at the link rate, against 0.2 s of compute per step, a sleep per micro-batch, in real time: auto's one
end-to-end test). Auto prices step 1's round from the probe before sending it and starts streaming with step 1's
gradients as the first inner step: no gradient round is ever sent, and each replica follows the streaming reference
from the initial parameters with a fresh inner optimizer, as ``mode: "streaming"`` would. The same through DeepSpeed
(ZeRO-1), whose step counters count that first inner step, runs on loopback with the probe reporting that link's
rate (what the probe measures there is the first test's). On loopback the look itself starts nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.cluster import system
from ds_acco.reference.streaming import streaming_reference
from tests import workloads as W
from tests.auto_streaming_workers import FRAGMENTS, STREAM
from tests.auto_workers import train_auto
from tests.dist_harness import run_distributed
from tests.helpers import assert_trajectories_equal

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "launchers", "local_cluster.py")
G, COMPUTE_S, HID, RATE = 4, 0.05, 32768, 10e6
CONFIG = {"mode": "auto", "auto": {"measure_steps": 2, "check_every": 2, "streaming": True}, "streaming": STREAM}


def reference(steps: int, world: int = 2):
    """Streaming from ``θ_0`` with a fresh inner optimizer, inner step ``j`` the mean of micro-batches ``jG...``."""
    model = W.make_model(hid=HID)
    grad = W.reference_grad_fn(model)

    def mean_grad(worker, j, params):
        total = [torch.zeros_like(p) for p in params]
        for i in range(G):
            for t, g in zip(total, grad(worker, j * G + i, params)):
                t.add_(g)
        return [t.mul_(1.0 / G) for t in total]

    return streaming_reference([p.detach().clone() for p in W.ordered_params(model)], mean_grad,
                               W.make_reference_optimizer, world, FRAGMENTS, steps,
                               sync_every=STREAM["sync_every"], overlap_steps=STREAM["overlap_steps"])


needs_netns = pytest.mark.skipif(not system.netns_available(), reason="needs root and iproute2 (ip, tc)")


def on_slow_link(tmp_path, kwargs: dict) -> list[dict]:
    """Both ranks' results of ``tests/netns_auto_job.py`` on two hosts joined at ``RATE``."""
    proc = subprocess.run([sys.executable, LAUNCHER, "--hosts", "2", "--rate", f"{int(RATE)}bit", "--quiet",
                           "--log-dir", str(tmp_path), "--timeout", "240", "--", sys.executable, "-m",
                           "tests.netns_auto_job", str(tmp_path), json.dumps(kwargs)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    logs = "".join((tmp_path / f"host{r}.log").read_text() for r in (0, 1) if (tmp_path / f"host{r}.log").exists())
    assert proc.returncode == 0, proc.stderr[-3000:] + logs[-5000:]
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@needs_netns
@pytest.mark.alone  # prices the shaped link from a probe's times: another test's load would read as the link's
def test_a_slow_link_starts_streaming_before_the_first_round_and_each_replica_follows_the_reference(tmp_path):
    """Processes on two network namespaces: a pooled job has no shaped link for the probe to measure."""
    steps = 8
    got = on_slow_link(tmp_path, dict(G=G, compute_s=COMPUTE_S, link=[], steps=steps, hid=HID, config=CONFIG,
                                      real_time=True))
    first = got[0]["choices"][0]
    assert first["step"] == 0 and first["runs"] == "streaming", first
    # the round priced from the probe: a commit round's bytes at about the link's rate (tbf lets nothing faster
    # through; the probe times payload in pieces, headers and per-call costs in: 1.12x measured)
    at_rate = got[0]["commit_bytes"] / (RATE / 8)
    assert 1.0 * at_rate <= first["round_ms"] / 1e3 <= 1.3 * at_rate, (first["round_ms"], at_rate)
    assert 0.6 <= at_rate <= 1.1 and first["streaming_ratio"] > 3, first
    line = got[0]["lines"][0]
    assert line.startswith("ds_acco auto before the first round: compute") and \
        "predicted from a probe of the link" in line and "sync" in line and "(predicted)" in line, line
    # the probe agreed a piece size for the link (tens of milliseconds of it), which the phase's rounds use
    assert got[0]["piece_bytes"] == got[1]["piece_bytes"] and 16 << 10 <= got[0]["piece_bytes"] <= 256 << 10
    trace = reference(steps)
    for rank in (0, 1):
        assert got[rank]["modes"] == []  # no gradient round was ever sent
        assert len(got[rank]["choices"]) == 1  # one-way
        assert_trajectories_equal(got[rank]["trajectory"], [w[rank] for w in trace.workers])
    assert got[0]["fragments"][:len(trace.syncs)] == list(trace.syncs) and len(trace.syncs) >= 2


def _ds_on_the_probed_link(rank, world, **kw):
    """``D.train_ds`` where the link probe (its collectives run, on loopback) reports the namespace link's rate."""
    from ds_acco.comm.collectives import RoundCollectives
    from tests import ds_workloads as D

    probe = RoundCollectives.probe_link

    def at_link_rate(self):
        probe(self)  # the probe's own collectives, on loopback (too fast to time there)
        return RATE / 8

    RoundCollectives.probe_link = at_link_rate
    try:
        return D.train_ds(rank, world, **kw)
    finally:
        RoundCollectives.probe_link = probe


def test_deepspeed_starts_streaming_before_the_first_round_counts_every_step_and_follows_the_reference():
    """The same through ``ds_acco.initialize`` (ZeRO-1): DeepSpeed's step counters advance at the first inner step
    as at a commit, and the module's parameters follow the same reference."""
    from tests import ds_workloads as D

    steps = 6
    got = run_distributed(_ds_on_the_probed_link, 2, timeout=240, config=D.ds_config(G, CONFIG), steps=steps, hid=HID)
    trace = reference(steps)
    for rank in (0, 1):
        first = got[rank]["choices"][0]
        assert first["step"] == 0 and first["runs"] == "streaming" and len(got[rank]["choices"]) == 1, first
        assert got[rank]["modes"] == []  # no gradient round
        assert got[rank]["global_samples"] == steps * 2 * G * W.BATCH  # DeepSpeed counted every step
        assert_trajectories_equal(got[rank]["trajectory"], [w[rank] for w in trace.workers])


def test_on_loopback_the_look_before_the_first_round_starts_nothing():
    """The probe finds a link that hides any round (or one too fast to time): the job runs its sync steps and
    chooses after ``measure_steps`` as before, never from a prediction."""
    both = run_distributed(train_auto, 2, timeout=240, G=G, compute_s=COMPUTE_S, link=[], steps=3, hid=HID,
                           config=CONFIG)
    got = both[0]
    assert got["piece_bytes"] == both[1]["piece_bytes"]  # the probe's pieces, agreed (None: too fast to cut)
    assert got["modes"][:2] == ["sync", "sync"], got["modes"]
    assert [c["step"] for c in got["choices"]] == [2] and got["choices"][0]["runs"] != "streaming", got["choices"]
    assert all("before the first round" not in line for line in got["lines"])
