"""The GPU bench (``benchmarks.gpu_overlap``, ``benchmarks/gpu_check.sh``) on the CPU, and the trace reading it uses.

CI has no GPU, so ``benchmarks.gpu_overlap`` refuses to run here; its run-and-parse step is the same on the CPU.
One tiny DeepSpeed run, profiled over two acco steps, serves both the parse test and the profile test (a profile
changes the run's timings, not its rounds); the baseline-library run is a second process, as it must be.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from benchmarks import gpu_overlap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = argparse.Namespace(model_size="tiny", seq_len=32, micro_batch=2, grad_accum=4, steps=8, warmup=3)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """Proves what no pooled job can: the bench's own ``examples.train_lm`` process (a world of one on a port of its
    own), three sync steps, then rounds in flight, with a torch profile of steps 6 and 7, read back from its files."""
    out = tmp_path_factory.mktemp("overlap")
    row = gpu_overlap.run_one("acco_lowbit_int4_fixed", str(out), 0, ARGS, profile="5:7")
    assert row["rc"] == 0, (out / "acco_lowbit_int4_fixed_r0_profiled.log").read_text()[-3000:]
    return row


def test_gpu_overlap_bench_parses_a_real_run_on_the_cpu(profiled, tmp_path):
    """CI has no GPU, so ``benchmarks.gpu_overlap`` refuses to run here; its run-and-parse step is the same on
    the CPU: one tiny DeepSpeed run with three sync steps, then rounds in flight, read back from its records.
    Proves what no pooled job can: the bench's own subprocess and the files it leaves (``profiled``)."""
    row = profiled
    # sync steps one round each, acco steps two (estimate and commit), and the next estimate is in flight at the end
    assert row["rounds"] == 3 + 2 * 5 + 1
    assert row["rounds_sync"] == 3 - 2 and row["rounds_overlapped"] == 2 * 5 + 1 - 2  # the first two of each left out
    assert row["in_flight_ratio"] == pytest.approx(row["compute_ms_per_mb_overlapped"] / row["compute_ms_per_mb_sync"])
    assert 0 < row["final_loss"] < 10 and row["s_per_step_late"] > 0
    assert "| acco_lowbit_int4_fixed | this | 0 |" in gpu_overlap.table([row])
    assert gpu_overlap.main(["--out", str(tmp_path / "refused")]) == 2  # no CUDA device here


def test_gpu_overlap_profiles_a_run_and_finds_its_rounds_on_the_cpu(profiled):
    """``--profile A:B``: the run's torch profile (every thread) and what it says of the rounds. On the CPU there
    are no streams and no launches; the round thread's bursts and operations are the same code's. Proves what no
    pooled job can: a profile of a whole training process, every thread, written by ``train_lm``."""
    from benchmarks.report.round_trace import describe

    prof = profiled["profile"]
    assert 3 <= prof["rounds"] <= 6  # two acco steps: two rounds each, joined where they touch
    assert prof["ops_per_round"] > 20 and prof["round_ms"] > 0
    assert prof["launches_per_round"] is None and prof["compute_stream_busy"] is None  # no GPU here
    assert 0 < prof["training_ops_busy"][1] <= 1
    assert "rounds of host work" in describe(prof) and "compute stream busy: n/a" in describe(prof)


@pytest.fixture(scope="module")
def beside(tmp_path_factory):
    """The baseline-library run and ``gpu_check.sh``, side by side: neither times anything on the CPU."""
    tmp = tmp_path_factory.mktemp("beside")
    base, run = tmp / "base", tmp / "run"
    shutil.copytree(os.path.join(gpu_overlap.REPO, "ds_acco"), base / "ds_acco",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(base / "ds_acco" / "__init__.py", "a", encoding="utf-8") as f:
        f.write('\nprint("ds_acco from the baseline folder", flush=True)\n')
    run.mkdir()
    args = argparse.Namespace(model_size="tiny", seq_len=32, micro_batch=2, grad_accum=4, steps=2, warmup=1)
    with ThreadPoolExecutor(1) as pool:
        check = pool.submit(subprocess.run, ["bash", os.path.join(REPO, "benchmarks", "gpu_check.sh"),
                                             str(tmp / "check")], capture_output=True, text=True, timeout=300)
        row = gpu_overlap.run_one("acco_fixed", str(run), 0, args, baseline=str(base))
        return row, run, check.result().returncode, tmp / "check"


def test_gpu_overlap_runs_a_baseline_library_beside_this_one(beside):
    """``--baseline DIR``: the same script with another ``ds_acco/`` (here a copy that says so when imported).
    Proves what no pooled job can: a fresh interpreter whose ``ds_acco`` is the baseline folder's."""
    row, run, _, _ = beside
    log = (run / "acco_fixed_r0_baseline.log").read_text()
    assert row["rc"] == 0 and row["tree"] == "baseline", log[-3000:]
    assert "ds_acco from the baseline folder" in log
    assert row["rounds"] == 1 + 2 + 1  # the sync step, the acco step's two rounds, the estimate in flight
    assert "| acco_fixed | baseline | 0 |" in gpu_overlap.table([row])


def test_gpu_check_runs_the_cuda_tests_and_the_bench_and_fails_without_a_gpu(beside):
    """``benchmarks/gpu_check.sh``: one command for a lent GPU; on the CPU both parts run and say why they
    measure nothing, and the script exits non-zero (the bench refuses without CUDA). Proves what no pooled job
    can: the script itself, its nested pytest and its exit status."""
    _, _, rc, out = beside
    assert rc == 1
    assert re.search(r"\d+ skipped", (out / "test_cuda.log").read_text())
    assert "no CUDA device here" in (out / "overlap.log").read_text()


def test_round_trace_reads_the_streams_busy_share(tmp_path):
    """The figures from a small Chrome trace written by hand: a round thread (the one issuing ``c10d::``), a
    compute stream busy 3 of the round's 10 ms and 16 of the other 20."""
    import gzip
    import json

    from benchmarks.report.round_trace import summarize

    x = lambda tid, cat, name, ts, dur: {"ph": "X", "tid": tid, "cat": cat, "name": name, "ts": ts, "dur": dur}
    ev = [x(1, "cpu_op", "aten::mm", 0, 30_000),                                    # the training thread
          x(2, "cpu_op", "c10d::allgather_", 10_000, 2_000), x(2, "cpu_op", "aten::mul_", 12_000, 1_000),
          x(2, "cpu_op", "aten::add_", 16_000, 4_000), x(2, "cuda_runtime", "cudaLaunchKernel", 16_100, 100),
          x(7, "kernel", "gemm", 0, 8_000), x(7, "kernel", "gemm", 14_000, 3_000), x(7, "kernel", "gemm", 21_000, 8_000),
          x(9, "kernel", "mul", 12_500, 500)]                                        # the round's stream
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    s = summarize(str(path))
    assert s["rounds"] == 1 and s["round_ms"] == pytest.approx(10.0)
    assert s["ops_per_round"] == 3 and s["launches_per_round"] == 1
    assert s["compute_stream_busy"] == pytest.approx((0.3, 0.8))


def test_train_lm_refuses_a_bad_profile_window(capsys):
    from examples.train_lm import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--deepspeed_config", "ds_configs/acco_fixed.json", "--profile-steps", "6:4"])
    assert "expected 0 <= A < B" in capsys.readouterr().err
    assert parse_args(["--deepspeed_config", "ds_configs/acco_fixed.json", "--profile-steps", "2:4"]).profile_steps == (2, 4)
    with pytest.raises(SystemExit):  # a window past the run's end would never be written
        parse_args(["--deepspeed_config", "ds_configs/acco_fixed.json", "--steps", "3", "--profile-steps", "2:4"])
    assert "after --steps 3" in capsys.readouterr().err


