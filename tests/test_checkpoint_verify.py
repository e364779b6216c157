"""Damaged or incomplete checkpoints never train: every case refused on every rank, by file name.

The DeepSpeed and streaming damage matrices run in one launch of the real ``deepspeed``
launcher (tests/scripts/checkpoint_damage_script.py: each rank calls the real
``load_checkpoint`` on every damaged copy, then resumes the intact checkpoint); the
same launch ends by loading a damaged copy without catching, so it must exit non-zero,
every rank having raised before its first step. The FSDP front end's matrix and the round trips on 1, 2
and 3 ranks run on the pooled gloo workers of tests/dist_harness.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from ds_acco.checkpoint.manifest import HASH, MANIFEST, clean_partials, file_digest, read_manifest
from tests import checkpoint_workloads as C
from tests.dist_harness import run_distributed
from tests.helpers import REPO, launch_deepspeed

SCRIPT = os.path.join(REPO, "tests", "scripts", "checkpoint_damage_script.py")


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    out = tmp_path_factory.mktemp("damage")
    result = launch_deepspeed(SCRIPT, "--out", str(out))
    missing = [r for r in range(2) if not (out / f"rank{r}.json").exists()]
    if missing:
        pytest.fail(f"ranks {missing} wrote no results:\n{result.stdout[-5000:]}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return result, ranks, out


def _assert_all_refused(cases: dict, rank: int) -> None:
    assert len(cases) >= 8
    for case, seen in cases.items():
        assert seen["refused"], (rank, case, seen["message"])
        assert seen["names_file"], (rank, case, seen["message"])
        assert seen["steps_unchanged"], (rank, case)
        assert seen["state_unchanged"], (rank, case)  # module, masters and moments as before the refused load
        assert seen["names_earlier"], (rank, case, seen["message"])  # an earlier complete tag exists


@pytest.mark.parametrize("front", ["acco", "streaming"])
def test_every_damaged_deepspeed_checkpoint_is_refused_on_every_rank(matrix, front):
    _, ranks, _ = matrix
    for r, got in enumerate(ranks):
        _assert_all_refused(got[front]["cases"], r)
    # both ranks raised the same message, whichever rank's file was bad
    for case in ranks[0][front]["cases"]:
        assert ranks[0][front]["cases"][case]["message"] == ranks[1][front]["cases"][case]["message"], case
    names = " ".join(ranks[0][front]["cases"])
    for needle in ("overwrite mp_rank_00", "truncate", "empty", "delete acco_", "delete manifest", "edit manifest",
                   "latest names a partial tag"):
        assert needle in names
    if front == "acco":
        for r in (0, 1):
            assert f"overwrite zero_pp_rank_{r}_mp_rank_00_optim_states.pt" in names
            assert f"overwrite acco_round_state_dp_rank_{r}.pt" in names
    # the loader itself raised on the scrambled model file (each rank parses it first, while it is hashed): the
    # refusal still names the file on every rank, chained to the loader's error
    for r, got in enumerate(ranks):
        assert got[front]["cases"]["scramble the head of mp_rank_00_model_states.pt"]["cause"], r
    msg = ranks[0][front]["cases"]["overwrite mp_rank_00_model_states.pt"]["message"]
    assert f"expected {HASH}" in msg and f"found {HASH}" in msg and "resume from" in msg and "global_step" in msg


@pytest.mark.parametrize("front", ["acco", "streaming"])
def test_intact_checkpoint_resumes_bit_identically_after_the_refusals(matrix, front):
    _, ranks, _ = matrix
    assert all(got[front]["exact_resume"] for got in ranks)
    # its manifest says the save found the masters and moments finite: the load does not sum them again
    assert all(got[front]["summed_at_load"] == 0 for got in ranks)


def test_salvage_drops_the_damaged_round_state_and_says_so(matrix):
    _, ranks, _ = matrix
    salvage = ranks[0]["acco"]["salvage"]
    assert len(salvage["warnings"]) == 1, salvage["warnings"]
    assert "salvage is on: dropped ['acco_round_state_dp_rank_0.pt']" in salvage["warnings"][0]
    assert all(got["acco"]["salvage"]["trained"] for got in ranks)


def test_stock_zero1_checkpoint_loads_with_one_warning(matrix):
    _, ranks, _ = matrix
    stock = ranks[0]["acco"]["stock"]
    assert stock["steps"] == 2
    assert len(stock["warnings"]) == 1, stock["warnings"]
    assert "not verified" in stock["warnings"][0] and "not the trajectory" in stock["warnings"][0]
    assert ranks[1]["acco"]["stock"]["warnings"] == []  # one WARNING per job, from rank 0


def test_damaged_checkpoint_fails_every_rank_under_the_launcher(matrix):
    """The launch's last load does not catch: non-zero exit, the same error noted by each rank, no step."""
    result, _, out = matrix
    assert result.returncode != 0, result.stdout[-4000:]
    assert "TRAINING STARTED" not in result.stdout
    errors = [(out / f"rank{r}.err").read_text() for r in range(2)]
    assert errors[0] == errors[1], errors
    assert f"acco_round_state_dp_rank_1.pt: expected {HASH}" in errors[0]


def test_fsdp_damage_matrix_and_exact_resume(tmp_path):
    got = run_distributed(C.fsdp_job, 2, out=str(tmp_path), timeout=240)
    for r, res in enumerate(got):
        _assert_all_refused(res["cases"], r)
        assert res["exact_resume"], r
        assert MANIFEST in res["files"] and ".metadata" in res["files"]
        assert res["finite_at_save"] is True and res["summed_at_load"] == 0, res
    for case in got[0]["cases"]:
        assert got[0]["cases"][case]["message"] == got[1]["cases"][case]["message"], case


def test_stock_fsdp2_checkpoint_loads_with_one_warning(tmp_path):
    """Saved by stock FSDP2 + DCP (torch's recipe, no ds_acco): loads unverified, warns once, trains on."""
    got = run_distributed(C.stock_fsdp2_job, 2, out=str(tmp_path), timeout=120)
    assert MANIFEST not in got[0]["files"]
    assert len(got[0]["warnings"]) == 1, got[0]["warnings"]
    assert got[1]["warnings"] == []  # one WARNING per job, from rank 0
    warning = got[0]["warnings"][0]
    for needle in ("stock FSDP2 checkpoint", "not verified", "'app.model.*' and 'app.optim.*'", "at step 2",
                   "rounds bootstrap afresh", "not the trajectory"):
        assert needle in warning, warning
    for r in got:
        assert r["commits"] == 2 and r["params_equal"]
        assert len(r["losses"]) >= 8 and all(math.isfinite(v) for v in r["losses"]), r["losses"]
        assert r["disabled"] == {"commits": 2, "params_equal": True}  # "enabled": false loads it too


@pytest.mark.parametrize("world", [1, 3])
def test_verified_round_trip_on_one_and_three_ranks(world):
    ds = run_distributed(C.deepspeed_round_trip, world, timeout=240)
    assert all(r["exact_resume"] for r in ds)
    # the save found the masters and moments finite, so the verified load does not sum them again
    assert ds[0]["finite_at_save"] is True and all(r["summed_at_load"] == 0 for r in ds), ds
    # a moment saved inf: the manifest says so, latest keeps naming the good tag, and an explicit load sums
    # (1 at the save, 1 at the load) and every rank refuses it, naming the good tag to resume from
    assert ds[0]["bad_finite_at_save"] is False
    assert ds[0]["latest_after_bad"] == ds[0]["good_tag"]
    for r in ds:
        assert r["bad_sums"] == 2, r
        assert r["bad_refusal"] and "non-finite" in r["bad_refusal"], r
        assert f"rank {world - 1}'s optimizer state 0 exp_avg_sq: expected finite values" in r["bad_refusal"], r
        assert f"{r['good_tag']} instead" in r["bad_refusal"], r
    assert ds[0]["listed"] == sorted([C.MODEL] + [C.OPTIM.format(r=r) for r in range(world)]
                                     + [C.ROUND.format(r=r) for r in range(world)])


def test_ranges_are_shared_out_evenly_and_a_damaged_range_refuses_on_every_rank(tmp_path):
    got = run_distributed(C.range_share_job, 2, folder=str(tmp_path / "tag"), timeout=60)
    full = 5 << 20
    for when in ("saved_units", "load_units"):
        units = [set(r[when]) for r in got]
        assert not units[0] & units[1], when  # each range hashed once ...
        shared = {u for u in units[0] | units[1] if u[0] == "shared.bin"}
        assert len(shared) == 6 and sum(u[2] for u in shared) == full + 10, when  # ... and every range hashed
        bytes_by_rank = [sum(u[2] for u in r) for r in units]
        assert abs(bytes_by_rank[0] - bytes_by_rank[1]) <= 1 << 20, (when, bytes_by_rank)  # within one range
    # on load, each rank hashes its own file and half of the file both read
    assert {u[0] for u in got[0]["load_units"]} == {"shared.bin", "own0.bin"}
    assert {u[0] for u in got[1]["load_units"]} == {"shared.bin", "own1.bin"}
    assert got[0]["intact"] is None and got[1]["intact"] is None
    _, index, nbytes = got[0]["victim"]
    for r in got:  # the last rank hashed the damaged range; both refuse with the same message
        assert r["damaged"] == got[0]["damaged"]
        assert f"shared.bin: expected {HASH}" in r["damaged"]
        assert f"over bytes {index << 20}-{(index << 20) + nbytes}" in r["damaged"], r["damaged"]
        assert r["format1_intact"] is None, r["format1_intact"]
        assert f"own1.bin: expected {HASH}" in r["format1_damaged"] and "over bytes" not in r["format1_damaged"]


def test_files_are_flushed_before_the_manifest_that_vouches_for_them(tmp_path):
    """checkpoint.fsync (default): every file, then the folders' entries, then the manifest, then its entry."""
    got = run_distributed(C.flush_order_job, 1, folder=str(tmp_path / "tag"), timeout=60)[0]
    durable, fast = got[True], got[False]
    for run in (durable, fast):
        assert run["bad"] is None and run["digests_match"] and run["hashed"] == ["a.pt", "c.pt", "sub/b.pt"]
    events = durable["events"]
    at = events.index(("replace", MANIFEST))
    flushed_before = {path for kind, path in events[:at] if kind == "fsync"}
    assert {"a.pt", "sub/b.pt", "c.pt", ".", "sub"} <= flushed_before, events
    assert events[at + 1:] == [("fsync", ".")], events  # the manifest's own entry
    assert fast["events"] == [("replace", MANIFEST)]  # fsync off: page cache only


def test_crashed_save_debris_is_reported_and_removed(tmp_path, caplog):
    (tmp_path / "global_step4").mkdir()
    (tmp_path / "global_step6.partial").mkdir()
    (tmp_path / "global_step6.partial" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (tmp_path / "global_step2.old123").mkdir()
    with caplog.at_level("WARNING", logger="ds_acco"):
        clean_partials(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["global_step4"]
    assert sum("did not finish" in r.getMessage() for r in caplog.records) == 2
    # an FSDP2 save cleans only its own folder's debris: the folder may hold other things
    for name in ("step8.partial", "step8.old77", "step10.partial", "notes.partial"):
        (tmp_path / name).mkdir()
    clean_partials(str(tmp_path), "step8")
    assert sorted(os.listdir(tmp_path)) == ["global_step4", "notes.partial", "step10.partial"]


def test_manifest_seal_and_hashes(tmp_path):
    import zlib

    data = os.urandom(3 << 20)
    (tmp_path / "f.bin").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    assert file_digest(str(tmp_path / "f.bin"), "crc32") == f"{zlib.crc32(data):08x}"
    assert file_digest(str(tmp_path / "empty"), "crc32") == "00000000"
    if HASH == "xxh3_64":
        import xxhash

        assert file_digest(str(tmp_path / "f.bin")) == xxhash.xxh3_64_hexdigest(data)
    with pytest.raises(ValueError, match="unknown hash 'md5'"):
        file_digest(str(tmp_path / "f.bin"), "md5")
    assert read_manifest(str(tmp_path)) == (None, "missing")
    (tmp_path / MANIFEST).write_text("{not json")
    assert "unreadable" in read_manifest(str(tmp_path))[1]


def test_config_values_that_used_to_fail_late_fail_at_start_up(tmp_path):
    """ds_acco.initialize validates the block before any process-group work (one fresh interpreter)."""
    code = (
        "import sys, ds_acco, torch.distributed as dist\n"
        "from tests import ds_workloads as D, workloads as W\n"
        "for block in eval(sys.argv[1]):\n"
        "    try:\n"
        "        ds_acco.initialize(model=W.make_model(), model_parameters=W.make_model().parameters(),\n"
        "                           config=D.ds_config(4, block))\n"
        "    except ds_acco.AccoConfigError as e:\n"
        "        print('REFUSED', dist.is_initialized(), str(e).replace(chr(10), ' '))\n"
    )
    cases = [({"timeout_s": 1e15}, "acco.timeout_s: got 1000000000000000.0", "1 <= timeout_s <= 604800"),
             ({"timeout_s": 1e-4}, "acco.timeout_s: got 0.0001", "1 <= timeout_s <= 604800"),
             ({"telemetry": {"jsonl_path": "/proc/none/x.jsonl"}}, "acco.telemetry.jsonl_path: got '/proc/none",
              "writable folder")]
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code, repr([c[0] for c in cases])], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(lines) == len(cases), proc.stdout + proc.stderr[-3000:]
    for line, (_, field, allowed) in zip(lines, cases):
        assert line.startswith("REFUSED False") and field in line and allowed in line, line
    jsonl = tmp_path / "new" / "dir" / "rounds.jsonl"
    from ds_acco import parse_acco_config

    parse_acco_config({"telemetry": {"jsonl_path": str(jsonl)}})
    assert jsonl.parent.is_dir()  # created at validation, so the first round can write


def test_non_finite_loaded_moments_fail_every_rank():
    got = run_distributed(C.finite_check_job, 2, timeout=60)
    for bad in ("nan", "inf"):
        assert got[0][bad] == got[1][bad], bad
        assert "rank 1's exp_avg_sq: expected finite values, found inf/NaN" in got[0][bad]
        assert "global_step7" in got[0][bad]


def test_agreement_with_a_peer_that_never_joins_fails_within_the_timeout(tmp_path):
    got = run_distributed(C.agreement_timeout_job, 2, folder=str(tmp_path), timeout=60)
    assert got[1]["message"] is None
    assert "could not agree" in got[0]["message"] and "acco.timeout_s=1s" in got[0]["message"], got[0]["message"]
    assert 0.9 < got[0]["seconds"] < 10, got[0]["seconds"]


def test_a_pickle_that_runs_code_is_refused_on_every_rank_and_never_runs(matrix):
    """Model, optimizer or round-state file replaced by a pickle that would ``touch`` a marker: refused by
    size, or (manifest rewritten to match) by the restricted unpickler, naming the file and the class."""
    _, ranks, _ = matrix
    cases = ranks[0]["trust"]["unsigned"]
    assert len(cases) == 6
    for r, got in enumerate(ranks):
        for case, seen in got["trust"]["unsigned"].items():
            assert seen["refused"] and seen["names_file"], (r, case, seen["message"])
            assert seen["steps_unchanged"] and seen["state_unchanged"], (r, case)
            assert seen["message"] == cases[case]["message"], (r, case)  # the same refusal on every rank
            if "rewritten manifest" in case:
                assert "posix.system" in seen["message"] and "acco.checkpoint.weights_only" in seen["message"], seen
    assert ranks[0]["trust"]["markers"] == []  # no case ran the command


def test_signed_checkpoints_refuse_forgeries_before_parsing_and_load_when_intact(matrix):
    _, ranks, _ = matrix
    for r, got in enumerate(ranks):
        signed = got["trust"]["signed"]
        assert set(signed) == {"a changed byte in mp_rank_00_model_states.pt", "signature removed", "wrong key",
                               "pickle in zero_pp_rank_1_mp_rank_00_optim_states.pt and a rewritten manifest",
                               "unsigned checkpoint"}
        for case, seen in signed.items():
            assert seen["refused"] and seen["names_file"], (r, case, seen["message"])
            assert seen["cause"] is None, (r, case)  # refused by the check, before any loader raised
            assert seen["message"] == ranks[0]["trust"]["signed"][case]["message"], (r, case)
            assert "global_step" in seen["message"], seen["message"]  # names the tag
        assert got["trust"]["good_signed_steps"] == 1, got["trust"]["good_signed_steps"]
    assert ranks[0]["trust"]["markers"] == []
