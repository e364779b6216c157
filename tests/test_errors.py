"""Bad config fails before training; a failed or stalled round raises in the training thread."""

from __future__ import annotations

import pytest

from ds_acco import AccoConfigError, parse_acco_config
from ds_acco.config import AccoConfig
from tests import fault_workers as F
from tests.dist_harness import run_distributed


@pytest.mark.parametrize(
    "block, needles",
    [
        ({"mode": "zero"}, ["acco.mode", "'zero'", "'sync'", "'dpu'", "'acco'"]),
        ({"policy": "greedy"}, ["acco.policy", "'greedy'", "'fixed'", "'adaptive'"]),
        ({"warmup_steps": -1}, ["acco.warmup_steps", "-1", "greater than or equal to 0"]),
        ({"polcy": "fixed"}, ["acco.polcy", "unknown key", "policy"]),
        ({"timeout_s": 0}, ["acco.timeout_s", "got 0", "1 <= timeout_s <= 604800"]),
        ({"timeout_s": 1e15}, ["acco.timeout_s", "1000000000000000.0", "1 <= timeout_s <= 604800"]),
        ({"timeout_s": 1e-4}, ["acco.timeout_s", "0.0001", "1 <= timeout_s <= 604800"]),
        ({"telemetry": {"jsonl_path": "/proc/no/such/dir/r.jsonl"}},
         ["acco.telemetry.jsonl_path", "/proc/no/such/dir", "cannot be created", "writable folder"]),
        ({"checkpoint": {"salvage": "yes"}}, ["acco.checkpoint.salvage", "'yes'"]),
        ({"telemetry": {"log_every": "often"}}, ["acco.telemetry.log_every", "'often'"]),
        ({"telemetry": {"colour": 1}}, ["acco.telemetry.colour", "unknown key", "log_every"]),
        ({"max_micro_batches_per_round": 3}, ["max_micro_batches_per_round", "'adaptive'"]),
        ("acco", ["acco: got str", "JSON object"]),
    ],
)
def test_bad_config_names_field_value_and_allowed(block, needles):
    with pytest.raises(AccoConfigError) as info:
        parse_acco_config(block)
    assert isinstance(info.value, ValueError)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_odd_accumulation_rejected_for_acco_only():
    with pytest.raises(AccoConfigError, match="gradient_accumulation_steps: got 3.*even"):
        AccoConfig(mode="acco").check_accumulation(3)
    AccoConfig(mode="dpu").check_accumulation(3)


def test_defaults_and_disabled_block():
    assert parse_acco_config(None).enabled is False
    cfg = parse_acco_config({})
    assert (cfg.mode, cfg.policy, cfg.warmup_steps) == ("acco", "fixed", 0)


def test_mismatched_configs_across_ranks_fail_at_startup():
    results = run_distributed(F.start_with_config, 2, configs=[{"mode": "acco"}, {"mode": "dpu"}], timeout=60)
    for r in results:
        assert r["error"] == "AccoConfigError"
        assert "differ across ranks" in r["message"]


TIMEOUT_S = 2  # the tests prove that the time-out fires, not how long it is


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_round_exception_reraised_in_training_thread(policy):
    cfg = {"mode": "acco", "policy": policy, "timeout_s": TIMEOUT_S}
    results = run_distributed(F.train_until_error, 2, config=cfg, fail_rank=1, fail_at=3, timeout=90,
                              max_micro_batches=1_000_000)
    failing, peer = results[1], results[0]
    assert failing["error"] == "AccoRoundError"
    assert "injected optimizer failure" in failing["message"] and "shard step" in failing["message"]
    # The peer's round blocks in the all-gather the failing rank never joins: it must surface
    # as an error within the configured timeout (plus slack), not hang.
    assert peer["error"] in ("AccoRoundError", "AccoTimeoutError"), peer
    assert "round" in peer["message"]
    assert peer["raised_at"] - failing["raised_at"] < TIMEOUT_S + 6
    for r in results:
        assert r["threads_after_close"] == []


def test_stalled_peer_times_out(tmp_path):
    """Rank 1 stalls for up to 8 s, past the bound below, and goes on once rank 0 has raised."""
    cfg = {"mode": "dpu", "policy": "fixed", "timeout_s": TIMEOUT_S}
    results = run_distributed(F.train_until_error, 2, config=cfg, stall_rank=1, stall_after=9, stall_s=8,
                              raised_flag=str(tmp_path / "raised"), max_micro_batches=40, timeout=90)
    peer = results[0]
    assert peer["error"] in ("AccoTimeoutError", "AccoRoundError"), peer
    assert "acco.timeout_s" in peer["message"] or "timed out" in peer["message"].lower() or "Timeout" in peer["message"]
    assert peer["seconds_to_raise"] < TIMEOUT_S + 5


def test_close_leaves_no_threads():
    results = run_distributed(F.train_until_error, 2, config={"mode": "acco"}, max_micro_batches=10, timeout=60)
    for r in results:
        assert r["error"] is None and r["commits"] >= 1
        assert r["threads_after_close"] == []
