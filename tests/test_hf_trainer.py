"""HF Trainer run as users run it: one ``torchrun`` launch under ``ds_acco.run`` builds and tears down four Trainers
(fixed, adaptive, streaming, auto into streaming), each from its DeepSpeed config alone, while a busy loop takes a
core; the tests read what each Trainer wrote."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tests.clean_exit_checks import busy_loop, finished_cleanly, launch
from tests.dist_harness import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


HF_STEPS = {"fixed": 5, "adaptive": 5, "streaming": 6, "auto_streaming": 10}


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory):
    """One ``torchrun`` launch of tests/scripts/hf_trainer_script.py: the four Trainers below, one after another,
    each torn down before the next; the process, and the folder where each wrote ``<name>/result.json``."""
    tmp = tmp_path_factory.mktemp("hf")
    acco = json.load(open(os.path.join(ROOT, "ds_configs", "hf_trainer_acco.json")))
    # adaptive: a fast link, made deterministic: one micro-batch per rank per round
    adaptive = dict(acco, acco=dict(acco["acco"], policy="adaptive", max_micro_batches_per_round=1))
    auto = dict(acco, acco={"mode": "fastest", "warmup_steps": 1, "auto": {"measure_steps": 3, "streaming": True},
                            "streaming": {"fragments": 2, "sync_every": 4, "overlap_steps": 1}})
    for name, block in (("adaptive", adaptive), ("auto_streaming", auto)):
        (tmp / f"{name}.json").write_text(json.dumps(block))
    plan = [{"name": "fixed", "deepspeed_config": os.path.join(ROOT, "ds_configs", "hf_trainer_acco.json"),
             "check_export": True},
            {"name": "adaptive", "deepspeed_config": str(tmp / "adaptive.json"), "check_export": True},
            {"name": "streaming", "deepspeed_config": os.path.join(ROOT, "ds_configs", "hf_trainer_streaming.json"),
             "fp32": True},
            {"name": "auto_streaming", "deepspeed_config": str(tmp / "auto_streaming.json"), "fp32": True,
             "check_export": True, "force_streaming": True}]
    (tmp / "plan.json").write_text(json.dumps([dict(case, steps=HF_STEPS[case["name"]]) for case in plan]))
    with busy_loop():  # as the clean-exit benchmark's DeepSpeed and HF cases: teardown under a contended CPU exits 0
        proc = launch(["torchrun", "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "ds_acco.run",
                        "tests/scripts/hf_trainer_script.py", "--plan", str(tmp / "plan.json"), "--output-dir",
                        str(tmp)], timeout=400)
    return proc, tmp


def _hf_result(hf_runs, name: str) -> dict:
    proc, tmp = hf_runs
    finished_cleanly(proc)
    res = json.loads((tmp / name / "result.json").read_text())
    # its teardown closed every ds_acco engine it started, on every rank, before the next Trainer
    assert res["engines_started"] >= 2 and res["engines_left_open"] == 0, res
    return res


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_hf_trainer_gets_acco_from_its_deepspeed_config_and_saves_the_committed_model(hf_runs, policy):
    """A launch (shared): HF Trainer run as users run it, under ``torchrun`` and ``ds_acco.run``, to exit 0."""
    res = _hf_result(hf_runs, policy)
    steps = HF_STEPS[policy]
    assert res["engine"] == "AccoDeepSpeedEngine"
    assert res["telemetry"]["rounds"] >= 8
    losses = res["losses"]
    assert len(losses) == steps and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.2
    export = res["export"]
    # save_model() after train(): the saved bf16 weights are the committed fp32 masters, cast
    assert export["compared"] > 0 and export["dtype"] == "torch.bfloat16" and export["equal_to_cast_masters"]
    # HF's linear schedule for `steps` steps ran exactly to its end, however many commits it took
    assert export["scheduler_steps"] == steps and export["final_lr"] == 0.0
    assert res["telemetry"]["nominal_steps"] == steps
    # warmup: one sync commit; then two commits per nominal step under the adaptive policy
    assert export["commits"] == (steps if policy == "fixed" else 2 * steps - 1)


def test_hf_trainer_runs_streaming_from_its_deepspeed_config(hf_runs):
    """A launch (shared): HF Trainer run as users run it, under ``torchrun`` and ``ds_acco.run``, to exit 0."""
    res = _hf_result(hf_runs, "streaming")
    assert res["engine"] == "StreamingDeepSpeedEngine" and res["mode"] == "streaming"
    assert res["global_steps"] == 6
    # fragments launch at inner steps 2, 4, 6 (H = 4, P = 2) and merge one step later; the end of train()
    # merges the one launched at step 6 (and consolidates the replicas into the global model)
    assert res["telemetry"]["rounds"] == 3 and res["telemetry"]["bytes_sent"] > 0
    losses = res["losses"]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 0.2


def test_hf_trainer_runs_auto_into_streaming_and_saves_the_global_model(hf_runs):
    """``mode: auto`` with ``auto.streaming`` under HF Trainer: the switch happens inside train(), HF's schedule runs
    to its end, and save_model() writes the global model, which the masters also hold after train(). A launch
    (shared): HF Trainer run as users run it, under ``torchrun`` and ``ds_acco.run``, to exit 0."""
    res = _hf_result(hf_runs, "auto_streaming")
    steps = HF_STEPS["auto_streaming"]
    assert res["engine"] == "AccoDeepSpeedEngine" and res["mode"] == "auto" and res["running"] == "streaming"
    assert res["global_steps"] == steps
    losses = res["losses"]
    assert len(losses) == steps and all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.2
    export = res["export"]
    assert export["equal_to_cast_masters"] and export["compared"] > 0
    assert export["scheduler_steps"] == steps and export["final_lr"] == 0.0
