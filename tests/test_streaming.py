"""Streaming DiLoCo: equals the single-process reference, syncs the right fragment at the
right inner step, measures its bytes; config and fragment errors name the field."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ds_acco import AccoConfigError, parse_acco_config
from ds_acco.config import AccoConfig
from ds_acco.layout.fragments import default_fragments, find_block_stack
from ds_acco.reference.streaming import streaming_reference
from ds_acco.streaming import sync_fragment
from tests import int8_workers as I
from tests import workloads as W

WORLD, STEPS = I.WORLD, I.STREAM_STEPS


@pytest.fixture(scope="module")
def runs():
    return [r["streaming"] for r in I.shared_run()]


def _reference(name: str, fragments):
    block = I.STREAM_CONFIGS[name]["streaming"]
    model = W.make_model(seed=0)  # rank 0's replica is broadcast to every rank
    return streaming_reference(
        list(model.parameters()), I.streaming_grad_fn(model), I.make_inner_optimizer, WORLD, fragments, STEPS,
        sync_every=block["sync_every"], overlap_steps=block["overlap_steps"], alpha=block["alpha"],
    )


def _assert_matches(runs, name, atol, rtol):
    fragments = runs[0][name]["fragments"]
    want = _reference(name, fragments)
    for rank in range(WORLD):
        got = runs[rank][name]["trajectory"]
        assert len(got) == STEPS
        for step, (g_step, w_step) in enumerate(zip(got, want.workers), start=1):
            for g, w in zip(g_step, w_step[rank]):
                torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m: f"rank {rank} step {step}: {m}")
    return want


def test_p1_tau0_fp32_equals_plain_diloco(runs):
    want = _assert_matches(runs, "diloco", atol=1e-6, rtol=1e-5)
    assert runs[0]["diloco"]["fragments"] == [[0, 1, 2, 3]]
    assert want.syncs == [(3, 0, 3), (6, 0, 6), (9, 0, 9), (12, 0, 12)]
    # alpha = 0: right after a sync every replica holds θ_g exactly
    for step in (3, 6, 9, 12):
        for rank in range(1, WORLD):
            for a, b in zip(runs[rank]["diloco"]["trajectory"][step - 1], runs[0]["diloco"]["trajectory"][step - 1]):
                assert torch.equal(a, b)
    # and between syncs the replicas drift apart (they train on different data)
    assert not torch.equal(runs[0]["diloco"]["trajectory"][3][0], runs[1]["diloco"]["trajectory"][3][0])


def test_fragments_sync_at_their_offsets_and_match_reference(runs):
    got = runs[0]["fragments"]
    # the tiny model's two Linear layers are the two fragments
    assert got["fragments"] == [[0, 1], [2, 3]]
    # P = 2, H = 4: fragment 0 at t ≡ 0, fragment 1 at t ≡ 2 (mod 4)
    assert got["schedule"] == [None, 1, None, 0] * 3
    # tau = 1: each merge one inner step after its launch; the last is drained by finish()
    launched_fragment_applied = [r[:3] for r in got["records"]]
    assert launched_fragment_applied == [(2, 1, 3), (4, 0, 5), (6, 1, 7), (8, 0, 9), (10, 1, 11), (12, 0, 12)]
    want = _assert_matches(runs, "fragments", atol=1e-6, rtol=1e-5)
    assert want.syncs == launched_fragment_applied[:-1]
    # a merge touches only its fragment: up to step 3 fragment 0 has only trained locally, so it
    # equals a run whose first sync comes later (one fragment, first merge at step 5), fragment 1 does not
    local = _reference("fragments", [[0, 1, 2, 3]])
    for rank in range(WORLD):
        got3, local3 = runs[rank]["fragments"]["trajectory"][2], local.workers[2][rank]
        assert all(torch.allclose(got3[i], local3[i], atol=1e-6) for i in (0, 1))
        assert not any(torch.allclose(got3[i], local3[i], atol=1e-4) for i in (2, 3))


def test_int8_streaming_bytes_peak_and_accuracy(runs):
    fp32, int8, p1 = (runs[0][n] for n in ("fragments", "int8", "diloco"))
    per_fragment = {}
    for name, run in (("fp32", fp32), ("int8", int8)):
        per_fragment[name] = {frag: nbytes for _, frag, _, nbytes in run["records"]}
    # exact bytes for the tiny model on 3 ranks: fragment 0 has 25 elements (padded 27, chunk 9),
    # fragment 1 has 18 (chunk 6). fp32: reduce-scatter and all-gather of 4-byte elements, 2/3 of them.
    # Every round also all-gathers two int64s (the stop flag and the pacing vote): 16 bytes to 2 peers.
    stop = 16 * 2
    assert per_fragment["fp32"] == {0: 2 * 27 * 4 * 2 // 3 + stop, 1: 2 * 18 * 4 * 2 // 3 + stop}
    # int8: 2 wire rows of [one 4-byte scale | payload padded to 4]; bf16 all-gather 2/3 of 2-byte elements
    assert per_fragment["int8"] == {0: 2 * (4 + 12) + 27 * 2 * 2 // 3 + stop, 1: 2 * (4 + 8) + 18 * 2 * 2 // 3 + stop}
    # the pacing votes travel with the flag: every rank cuts its collectives with the same agreed piece size
    assert len({runs[r]["int8"]["piece_bytes"] for r in range(WORLD)}) == 1 and int8["piece_bytes"] >= 64 << 10
    payload = {name: sum(v - stop for v in per_fragment[name].values()) for name in per_fragment}
    assert payload["int8"] / payload["fp32"] < 0.5  # on this tiny model; the flag is 16 bytes of any size
    # peak bytes per round: one fragment in flight instead of the whole model
    assert p1["summary"]["peak_round_bytes"] == 2 * 45 * 4 * 2 // 3 + stop
    assert fp32["summary"]["peak_round_bytes"] / p1["summary"]["peak_round_bytes"] < 0.65
    # int8 + bf16 stays close to the fp32 reference of the same schedule: the pseudo-gradient
    # error per element is <= Σ_r absmax_r / 254 / N, the outer step scales it by lr·(1 + momentum)
    # = 1.33, and the bf16 all-gather adds 2^-9 relative; replicas merge with α = 0.5.
    want = _reference("fragments", fp32["fragments"])
    dev = max(float((g - w).abs().max()) for rank in range(WORLD)
              for g_step, w_step in zip(runs[rank]["int8"]["trajectory"], want.workers)
              for g, w in zip(g_step, w_step[rank]))
    assert 0 < dev < 5e-3, dev


# ------------------------------------------------------------------ schedule, fragments, config (no processes)
@pytest.mark.parametrize("P, H", [(1, 5), (2, 4), (3, 7), (4, 4)])
def test_every_fragment_syncs_once_per_window(P, H):
    window = [sync_fragment(t, P, H) for t in range(1, 3 * H + 1)]
    for w in range(3):
        part = window[w * H:(w + 1) * H]
        assert sorted(p for p in part if p is not None) == list(range(P))
    assert sync_fragment(0, P, H) is None
    assert [t for t in range(1, H + 1) if sync_fragment(t, P, H) == 0] == [H]


class _Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(d), nn.Linear(d, d)


class _GPTLike(nn.Module):
    """GPT-2's layout: transformer.{wte, wpe, h[i], ln_f} and an lm_head tied to wte."""

    def __init__(self, layers=4, d=8, vocab=11):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte, self.transformer.wpe = nn.Embedding(vocab, d), nn.Embedding(6, d)
        self.transformer.h = nn.ModuleList(_Block(d) for _ in range(layers))
        self.transformer.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight


def test_default_fragments_group_blocks_with_embeddings_first_and_head_last():
    model = _GPTLike(layers=5)
    assert find_block_stack(model)[0] == "transformer.h"
    names = {id(p): n for n, p in model.named_parameters()}
    frags = [[names[id(p)] for p in f] for f in default_fragments(model, 2)]
    assert frags[0][:2] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert {n.split(".")[2] for n in frags[0][2:]} == {"0", "1", "2"}  # 5 blocks: 3 + 2
    assert {n.split(".")[2] for n in frags[1] if n.startswith("transformer.h")} == {"3", "4"}
    assert frags[1][-2:] == ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    flat = [n for f in frags for n in f]
    assert sorted(flat) == sorted(names.values())  # every parameter once; the tied head is wte


def test_more_fragments_than_layers_names_the_field():
    from ds_acco import streaming

    cfg = {"mode": "streaming", "streaming": {"fragments": 3, "sync_every": 6}}
    with pytest.raises(AccoConfigError) as info:
        streaming.build(W.make_model(), config=cfg)
    for needle in ("acco.streaming.fragments", "got 3", "2 top-level child modules", "from 1 to 2"):
        assert needle in str(info.value), str(info.value)
    with pytest.raises(AccoConfigError, match="acco.mode: got 'acco'.*'streaming'"):
        streaming.build(W.make_model(), config={"mode": "acco"})


@pytest.mark.parametrize(
    "block, needles",
    [
        ({"mode": "streaming", "streaming": {"fragments": 4, "sync_every": 3}},
         ["acco.streaming.sync_every", "got 3", ">= acco.streaming.fragments (4)"]),
        ({"mode": "streaming", "streaming": {"fragments": 2, "sync_every": 8, "overlap_steps": 4}},
         ["acco.streaming.overlap_steps", "got 4", "0 <= overlap_steps < sync_every / fragments", "= 4"]),
        ({"streaming": {"overlap_steps": -1}}, ["acco.streaming.overlap_steps", "-1", "greater than or equal to 0"]),
        ({"streaming": {"alpha": 1.5}}, ["acco.streaming.alpha", "1.5", "less than or equal to 1"]),
        ({"streaming": {"fragments": 0}}, ["acco.streaming.fragments", "0", "greater than or equal to 1"]),
        ({"streaming": {"quantize": "fp8"}}, ["acco.streaming.quantize", "'fp8'", "'int8'", "'none'"]),
        ({"streaming": {"all_gather_dtype": "fp16"}},
         ["acco.streaming.all_gather_dtype", "'fp16'", "'bf16'", "'int8'", "'fp32'"]),
        ({"streaming": {"outer_lr": 0}}, ["acco.streaming.outer_lr", "greater than 0"]),
        ({"streaming": {"fragmnets": 2}}, ["acco.streaming.fragmnets", "unknown key", "fragments"]),
        ({"comm_quantization": "int4"}, ["acco.comm_quantization", "'int4'", "'none'", "'int8'"]),
        ({"quantization_block_size": 0}, ["acco.quantization_block_size", "greater than or equal to 1"]),
        ({"error_feedback": True}, ["acco.error_feedback", "acco.comm_quantization", "'int8'"]),
        ({"mode": "streaming", "streaming": {"quantize": "none"}, "error_feedback": True},
         ["acco.error_feedback", "acco.streaming.quantize"]),
        ({"comm_quantization": "int8", "comm_dtype": "bf16"}, ["acco.comm_dtype", "'bf16'", "'auto' or 'fp32'"]),
        ({"mode": "streaming", "comm_quantization": "int8"}, ["acco.comm_quantization", "acco.streaming.quantize"]),
    ],
)
def test_bad_streaming_and_int8_config_names_field_value_and_allowed(block, needles):
    with pytest.raises(AccoConfigError) as info:
        parse_acco_config(block)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_round_engine_front_ends_reject_streaming_mode():
    with pytest.raises(AccoConfigError, match="acco.mode: got 'streaming'.*ds_acco.streaming.build"):
        AccoConfig(mode="streaming").check_accumulation(4)


def test_new_fields_leave_old_fingerprints_unchanged():
    old = parse_acco_config({"mode": "acco"})
    assert old.fingerprint() == parse_acco_config({"mode": "acco", "comm_quantization": "none"}).fingerprint()
    assert old.fingerprint() != parse_acco_config({"mode": "acco", "comm_quantization": "int8"}).fingerprint()
