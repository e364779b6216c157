"""Low-bit rounds: the int8 delta all-gather, the gloo reduce-scatter from all-to-all, and
training with ``acco.all_gather_quantization`` (3 real gloo ranks, one job for the file)."""

from __future__ import annotations

import math

import pytest
import torch

from ds_acco.config import parse_acco_config
from ds_acco.errors import AccoConfigError
from ds_acco.numerics.quantization import block_absmax
from tests import lowbit_workers as L


def _ceil4(n: int) -> int:
    return -(-n // 4) * 4


def _per_element(scales: torch.Tensor, numel: int, block: int) -> torch.Tensor:
    return scales.repeat_interleave(block, dim=-1)[..., :numel]


def _delta_bound(delta_rows: torch.Tensor, block: int) -> torch.Tensor:
    """Half an int8 step of each element's block, for ``(ranks, shard)`` deltas, flattened."""
    scales = block_absmax(delta_rows, block)
    return (_per_element(scales, delta_rows.shape[1], block) / 254 * (1 + 1e-5)).reshape(-1) + 1e-7


@pytest.fixture(scope="module")
def results():
    return L.shared_run()


# ------------------------------------------------------------------ the delta all-gather
def test_delta_all_gather_is_identical_on_every_rank_and_within_half_a_step(results):
    N, S = L.WORLD, L.SHARD
    checks = [r["delta"] for r in results]
    base = checks[0]["base"]
    want = torch.cat([c["new"] for c in checks])
    delta = (want - base).view(N, S)
    for block in (1, L.BLOCK, 256):
        fulls = [c["by_block"][block]["full"] for c in checks]
        for f in fulls[1:]:
            assert torch.equal(f, fulls[0]), "replicas differ"
        err = (fulls[0] - want).abs()
        assert (err <= _delta_bound(delta, block) + 1e-6 * want.abs()).all(), (block, float(err.max()))
        if block == 1:
            assert float(err.max()) < 1e-6  # one element per block is its own scale
        else:
            assert float(err.max()) > 0, "nothing was quantised"
        info = checks[0]["by_block"][block]
        row = 4 * math.ceil(S / block) + _ceil4(S)
        assert info["bytes"] == info["expected"] == (N - 1) * row
    # one byte per element, one fp32 scale per 16 and 3 bytes of row alignment: 0.35x fp32
    assert checks[0]["by_block"][L.BLOCK]["bytes"] / ((N - 1) * S * 4) == 104 / 296


def test_delta_all_gather_in_pieces_equals_one_piece(results):
    for r in results:
        pieces = r["delta"]["by_block"]["pieces"]
        assert pieces[16]["count"] == 3 and pieces[10 ** 6]["count"] == 1
        assert torch.equal(pieces[16]["full"], pieces[10 ** 6]["full"])  # blocks never straddle pieces
        # each piece's last block may be short: 5 blocks of 8 either way, payload padded per piece
        assert pieces[16]["bytes"] == (L.WORLD - 1) * (2 * (4 * 2 + 16) + (4 * 1 + 8))
        assert pieces[10 ** 6]["bytes"] == (L.WORLD - 1) * (4 * 5 + 40)


def test_delta_all_gather_edge_values(results):
    checks = [r["delta"] for r in results]
    base = checks[0]["base"]
    for c in checks:
        assert torch.equal(c["zero"], base), "a zero delta must leave the parameters exactly as they were"
        assert torch.equal(c["bf16"], checks[0]["bf16"]) and c["bf16"].dtype == torch.bfloat16
        assert "out must not alias base" in c["errors"]["alias"]
    want = torch.cat([c["new"] for c in checks])
    torch.testing.assert_close(checks[0]["bf16"].float(), want, rtol=2 ** -7, atol=1e-3)
    msg = checks[0]["errors"]["nonfinite"]
    assert "2 of 37 elements" in msg and "inf/NaN" in msg and "acco.all_gather_quantization" in msg
    assert "nonfinite" not in checks[1]["errors"]


# ------------------------------------------------------------------ the gloo reduce-scatter
def _contributions(N: int) -> list[torch.Tensor]:
    """Each rank's ``full`` in the reduce-scatter checks of tests/lowbit_workers.py."""
    return [torch.arange(N * 40, dtype=torch.float32) * (r + 1) + r for r in range(N)]


def test_gloo_reduce_scatter_sums_through_all_to_all_and_moves_n_minus_1_over_n(results):
    N = L.WORLD
    total = sum(_contributions(N)).view(N, 40)
    for rank, r in enumerate(results):
        rs = r["rs"]
        assert rs["via_all_to_all"] is True
        for name in ("one_piece", "pieces"):
            assert torch.equal(rs[name]["out"], total[rank]), name
            assert rs[name]["bytes"] == N * 40 * 4 * (N - 1) // N  # not the whole payload


def test_paced_collectives_cut_in_the_agreed_pieces_give_the_same_results(results):
    N = L.WORLD
    fulls = _contributions(N)
    total = sum(fulls).view(N, 40)
    for rank, r in enumerate(results):
        p = r["paced"]
        assert p["piece_bytes"] == 100  # the smallest positive vote, on every rank
        assert torch.equal(p["rs"], total[rank])
        assert torch.equal(p["all_gather"], torch.cat([torch.arange(40) + 1000.0 * s for s in range(N)]))
        assert torch.equal(p["a2a"], torch.cat([fulls[s].view(N, 40)[rank] for s in range(N)]))
        # 100 bytes / ((N - 1) x 4 bytes) = 12 elements per piece: 4 pieces of 40 each, 3 collectives
        assert p["calls"] == 3 and p["pieces"] == 3 * 4
        assert p["measured"] and p["vote"] >= 64 << 10  # timed on the pieces; never below the floor


def test_the_first_large_collective_probes_the_link_and_agrees_its_pieces(results):
    """The head of a group's first large collective goes in small and 4x pieces, one tiny all-gather agrees the
    piece size, the rest follows in it (ds_acco/comm/link_pacing.py); the sum is the one of whole collectives."""
    N = L.WORLD
    n = results[0]["probe"]["n"]
    total = sum(torch.arange(N * n, dtype=torch.float32) * (r + 1) + r for r in range(N)).view(N, n)
    agreed = {r["probe"]["probe"]["piece_bytes"] for r in results}
    assert len(agreed) == 1  # every rank cuts the rest the same way
    for rank, r in enumerate(results):
        probe, after = r["probe"]["probe"], r["probe"]["after"]
        assert torch.equal(probe["rs"], total[rank]) and torch.equal(after["rs"], total[rank])
        assert probe["calls"] == 2 and probe["pieces"] >= 1 + 2 * 3 + 1 + 1, probe  # the vote's all-gather counts
        # loopback is fast: the probe does not cut it into small pieces (64 KiB) from then on
        assert probe["piece_bytes"] is None or probe["piece_bytes"] > 4 * (64 << 10), probe
        assert after["calls"] == 1, after  # once per group


def test_the_probe_times_the_link_without_a_calls_fixed_cost():
    """A link of 4 MB/s whose calls each cost 4 ms more: timed on small pieces alone it reads 2.4 MB/s, the probe
    fits the rate from the extra bytes of its large pieces; calls that cost only their fixed time leave the link
    unmeasured (whole collectives next)."""
    from ds_acco.comm.link_pacing import LinkPacer
    from tests.sim_clock import SimClock, link

    clock = SimClock()
    pacer = LinkPacer(clock=clock)
    covered = pacer.probe(16 << 10, 1, link(clock, 4e6, 0.004))
    assert covered == LinkPacer.probe_numel(16 << 10)
    assert 3.4e6 < pacer.rate < 4.6e6, pacer.rate
    pacer.probe(256 << 10, 1, link(clock, float("inf"), 0.004))
    assert pacer.piece_bytes(1 << 40) > 1 << 20, pacer.rate  # the largest pieces, or pieces over a megabyte


@pytest.mark.parametrize("name", ["acco_fp32", "acco_lowbit"])
def test_training_paced_into_tiny_pieces_is_bit_identical_to_whole_collectives(results, name):
    """The round engine agrees the piece size through its count all-gather; pieces change how bytes
    travel, not one value or byte count."""
    for r in results:
        paced, whole = r["train_paced"][name], r["train"][name]
        assert paced["wire"]["piece_bytes"] == 8  # rank 1's vote, adopted by every rank
        assert paced["wire"]["pieces"] > 2 * paced["wire"]["calls"]
        assert whole["wire"]["pieces"] == whole["wire"]["calls"]
        assert paced["summary"]["bytes_sent"] == whole["summary"]["bytes_sent"]
        for key in ("flat", "master"):
            assert all(torch.equal(a, b) for a, b in zip(paced["final"][key], whole["final"][key])), key


def test_link_pacer_sizes_pieces_from_the_best_recent_rate():
    from ds_acco.comm.link_pacing import MIN_PIECE_BYTES, PIECE_SECONDS, LinkPacer

    pacer = LinkPacer()
    assert pacer.piece_bytes(4 << 20) == 4 << 20  # unmeasured: the caller's bound, as before pacing
    pacer.observe(1_250_000, 1.0)  # 10 Mbit/s
    assert pacer.piece_bytes(4 << 20) == max(MIN_PIECE_BYTES, int(1_250_000 * PIECE_SECONDS))
    pacer.observe(12_500_000, 1.0)  # a faster piece raises the estimate at once
    assert pacer.rate == 12_500_000
    pacer.observe(1_000, 1.0)  # a slow one (a late rank) only halves it
    assert pacer.rate == 6_250_000
    pacer.observe(1e12, 1.0)
    assert pacer.piece_bytes(4 << 20) == 4 << 20
    seen = []

    def launch(start, n, slot):
        seen.append(("launch", start, n, slot))
        return lambda: seen.append(("done", start))

    assert pacer.run(10, 3, 8, launch) == 4
    # two pieces on the wire at once, in alternating scratch slots: a slot's piece completes before it is reused
    assert seen == [("launch", 0, 3, 0), ("launch", 3, 3, 1), ("done", 0), ("launch", 6, 3, 0), ("done", 3),
                    ("launch", 9, 1, 1), ("done", 6), ("done", 9)]
    assert pacer.run(2, 4, 8, lambda start, n, slot: None) == 1  # a piece that ran whole has nothing to complete


# ------------------------------------------------------------------ training with low-bit all-gathers
INT8_AG_RUNS = ("acco_int8_ag", "acco_lowbit", "dpu_int8_ag", "sync_int8_ag")


def _full_master(result_ranks: list, swap: int) -> list[torch.Tensor]:
    groups = len(result_ranks[0]["swaps"][swap]["master"])
    return [torch.cat([r["swaps"][swap]["master"][g] for r in result_ranks]) for g in range(groups)]


@pytest.mark.parametrize("name", INT8_AG_RUNS + ("acco_int8_estimate", "acco_int4_estimate", "acco_lowbit_int4"))
def test_replicas_are_bit_identical_after_every_swap(results, name):
    runs = [r["train"][name] for r in results]
    assert len(runs[0]["swaps"]) >= L.STEPS
    for i, swap in enumerate(runs[0]["swaps"]):
        for other in runs[1:]:
            assert all(torch.equal(a, b) for a, b in zip(other["swaps"][i]["flat"], swap["flat"])), (name, i)


@pytest.mark.parametrize("name", INT8_AG_RUNS)
def test_replicas_stay_within_half_an_int8_step_of_the_masters(results, name):
    """After a commit the replicas hold ``base + dequant(int8(θ - base))``: each element within
    half a quantisation step of its block of the delta ``θ - base`` (base: the parameters the
    round started from), which the next round's delta carries, so the error never adds up.
    Stated bound, whatever the step: below lr / 50 (lr = 0.02; measured about lr / 2000)."""
    runs = [r["train"][name] for r in results]
    N, block = L.WORLD, L.LOWBIT_RUNS[name]["quantization_block_size"]
    worst = 0.0
    for i, swap in enumerate(runs[0]["swaps"]):
        if swap["kind"] != "commit":
            continue
        for g, (flat, base, master) in enumerate(zip(swap["flat"], swap["base"], _full_master(runs, i))):
            delta = (master - base).view(N, -1)
            err = (flat - master).abs()
            assert (err <= _delta_bound(delta, block) + 1e-7 * master.abs()).all(), (name, i, g)
            worst = max(worst, float(err.max()))
    assert 0 < worst < 0.02 / 50, worst
    final = runs[0]["final"]  # finish() makes the exported parameters exactly the masters
    for g, (flat, master) in enumerate(zip(final["flat"], [torch.cat([r["final"]["master"][g] for r in runs])
                                                            for g in range(len(final["flat"]))])):
        assert torch.equal(flat, master), g


def test_int8_estimate_keeps_commits_exact(results):
    runs = [r["train"]["acco_int8_estimate"] for r in results]
    kinds = [s["kind"] for s in runs[0]["swaps"]]
    assert kinds.count("estimate") >= L.STEPS - 1
    for i, swap in enumerate(runs[0]["swaps"]):
        if swap["kind"] == "commit":
            assert all(torch.equal(f, m) for f, m in zip(swap["flat"], _full_master(runs, i))), i


def _landed_estimates(run: dict) -> list:
    return [swap["params"] for swap in run["swaps"] if swap["kind"] == "estimate"]


def test_int4_estimate_commits_follow_the_rules_from_where_estimates_landed(results):
    """``estimate_quantization: "int4"`` changes only where the micro-batches after an estimate are computed (at
    the int4-landed lookahead): given those points, every commit equals the reference rules to fp32 rounding,
    because the commit sends on what the int4 reduce-scatter lost. Without the residual the commits would step
    on a gradient off by an int4 step of the estimate's half, which this tolerance would not pass."""
    from ds_acco.reference import ReferenceRun, reference_schedule
    from tests import workloads as W

    run = results[0]["train"]["acco_int4_estimate"]
    model = W.make_model()
    ref = ReferenceRun(W.ordered_params(model), W.reference_grad_fn(model), W.make_reference_optimizer, L.WORLD,
                       make_scheduler=W.decay_schedule)
    want = reference_schedule(ref, ["acco"] * L.STEPS, L.G, estimate_at=_landed_estimates(run))
    got = [swap["params"] for swap in run["swaps"] if swap["kind"] == "commit"]
    assert len(got) == L.STEPS
    for t, (a, b) in enumerate(zip(got, want)):
        assert max(float((x - y).abs().max()) for x, y in zip(a, b)) < 2e-6, t
    # the estimates landed off the fp32 lookahead (the commit path is what is exact, not the estimate)
    fp32 = results[0]["train"]["acco_fp32"]
    off = max(float((x - y).abs().max()) for a, b in zip(_landed_estimates(run), _landed_estimates(fp32))
              for x, y in zip(a, b))
    assert off > 1e-5, off


def test_the_start_up_line_names_each_round_kinds_wire_format(results):
    wire = {name: (results[0]["train"][name]["startup"]["reduce_scatter"],
                   results[0]["train"][name]["startup"]["param_all_gather"])
            for name in ("acco_fp32", "acco_int8_estimate", "acco_int4_estimate", "acco_lowbit_int4")}
    assert wire == {
        "acco_fp32": ("fp32", "fp32"),
        "acco_int8_estimate": ("fp32", "int8 delta (estimates), fp32 (commits)"),
        "acco_int4_estimate": ("int4 (estimates), fp32 (commits)", "int4 delta (estimates), fp32 (commits)"),
        "acco_lowbit_int4": ("int4 (estimates), int8(block 8) (commits)", "int4 delta (estimates), int8 delta (commits)"),
    }


@pytest.mark.parametrize("name", ["acco_int8_ag", "acco_int8_estimate", "acco_lowbit", "acco_int4_estimate",
                                  "acco_lowbit_int4"])
def test_low_bit_trains_close_to_fp32(results, name):
    """Same data and rules as the fp32 acco run; the masters differ by the int8 rounding only."""
    runs = [r["train"] for r in results]
    for rank in range(L.WORLD):
        got, want = runs[rank][name]["final"]["master"], runs[rank]["acco_fp32"]["final"]["master"]
        dev = max(float((a - b).abs().max()) for a, b in zip(got, want))
        assert 0 < dev < 0.02 * 0.5, (name, dev)  # within half an lr step per element over 8 steps


def test_low_bit_round_bytes_counted_exactly(results):
    """Per round on the tiny job (groups padded to 36 and 9, shards 12 and 3, 3 ranks, block 8)."""
    N, shards, block = L.WORLD, (12, 3), 8
    s = {name: results[0]["train"][name]["summary"] for name in L.LOWBIT_RUNS}
    per_round = {name: v["bytes_sent"] / v["rounds"] for name, v in s.items()}
    counts = N * 3 * 8 * (N - 1) // N  # (count, nonfinite, pacing vote) int64
    fp32 = sum(n * 4 * N for n in shards) * (N - 1) // N  # one fp32 reduce-scatter or all-gather
    int8 = (N - 1) * sum(4 * math.ceil(n / block) + _ceil4(n) for n in shards)
    assert per_round["acco_fp32"] == counts + fp32 + fp32 == 288
    assert per_round["acco_int8_ag"] == per_round["sync_int8_ag"] == counts + fp32 + int8 == 224
    assert per_round["acco_lowbit"] == counts + int8 + int8 == 160
    est = s["acco_int8_estimate"]  # estimates send int8, commits fp32: between the two
    assert 224 < per_round["acco_int8_estimate"] < 288 and est["bytes_sent"] == est["bytes_received"]
    # int4 estimates: half a byte per element plus a scale per block, in both collectives
    int4 = (N - 1) * sum(4 * math.ceil(n / block) + _ceil4(math.ceil(n / 2)) for n in shards)
    assert int4 == 48 < int8 == 56
    assert per_round["acco_int4_estimate"] == ((counts + int4 + int4) + (counts + fp32 + fp32)) / 2 == 216
    assert per_round["acco_lowbit_int4"] == ((counts + int4 + int4) + (counts + int8 + int8)) / 2 == 152


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("block, message", [
    ({"mode": "sync", "all_gather_quantization": "int8_estimate"}, "acco.all_gather_quantization: got 'int8_estimate'"),
    ({"mode": "dpu", "all_gather_quantization": "int8_estimate"}, "allowed with sync/dpu: 'none' or 'int8'"),
    ({"mode": "streaming", "all_gather_quantization": "int8"}, "acco.streaming.all_gather_dtype"),
    ({"all_gather_quantization": "int4"}, "acco.all_gather_quantization: got 'int4'"),
    ({"all_gather_quantization": True}, "acco.all_gather_quantization: got True"),
    ({"mode": "sync", "estimate_quantization": "int4"}, "acco.estimate_quantization: got 'int4' with mode 'sync'"),
    ({"mode": "acco", "estimate_quantization": "int2"}, "acco.estimate_quantization: got 'int2'"),
])
def test_bad_low_bit_config_names_field_value_and_allowed(block, message):
    with pytest.raises(AccoConfigError) as exc:
        parse_acco_config(block)
    assert message in str(exc.value)
    if "all_gather_quantization: got 'int4'" in message:
        assert "'none'" in str(exc.value) and "'int8_estimate'" in str(exc.value)

