"""Smoke tests of the emulated cluster (launchers/local_cluster.py) and the benchmark runner.

The cluster tests need root and iproute2 (network namespaces, tc, cgroup v1 cpu);
they are skipped elsewhere. The benchmark smoke sweep runs everywhere: on
namespaces when it can, else on loopback (``python -m benchmarks`` falls back by
itself). It runs tiny-model train_lm jobs on 2 hosts for 3 steps, every benchmark
path once (bandwidth runs, a slow host with the hosts alone, streaming, time to
loss, the FSDP2 front end, the memory and convergence tables from those runs, all
plots), once for the module, and the tests below assert on the numbers in its
outputs, not just on files existing. The GPU bench's CPU checks are in
tests/test_bench_smoke_gpu.py, the smoke plan's shared runs and launch in
tests/test_bench_smoke_plan.py, the benchmark's pure parts in tests/test_bench_parts.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.cluster import system
from benchmarks.report import plots

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "launchers", "local_cluster.py")
NETNS = system.netns_available()
CGROUP = NETNS and os.path.isfile(os.path.join(system.CPU_CGROUP_ROOT, "cpu.cfs_quota_us"))
needs_netns = pytest.mark.skipif(not NETNS, reason="needs root and iproute2 (ip, tc)")

# Rank 1 streams NBYTES to rank 0 over the emulated link; rank 0 prints the rate it received.
TRANSFER = r"""
import os, socket, time
rank, addr, port = int(os.environ["RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1
n = 3_000_000
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((addr, port)); s.listen(1)
    c, _ = s.accept(); got, t0 = 0, None
    while got < n:
        b = c.recv(1 << 20)
        if not b: break
        t0 = t0 or time.time(); got += len(b)
    print("RATE_BIT_S", got * 8 / (time.time() - t0), os.environ["GLOO_SOCKET_IFNAME"], os.environ["WORLD_SIZE"])
    c.sendall(b"k")
else:
    for _ in range(100):
        try: c = socket.create_connection((addr, port)); break
        except OSError: time.sleep(0.05)
    c.sendall(b"x" * n); c.recv(1)
"""


def _leftovers(pid: int) -> list[str]:
    tag = f"{system.PREFIX}_{pid}_"
    names = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
             if n.startswith(tag)]
    if os.path.isdir(system.CPU_CGROUP_ROOT):
        names += [n for n in os.listdir(system.CPU_CGROUP_ROOT) if n.startswith(tag)]
    return names


# --------------------------------------------------------------------------- the cluster (root)


@needs_netns
@pytest.mark.alone  # a rate through tc, timed: another test's load would read as the link's
def test_cluster_shapes_links_and_tears_down(tmp_path):
    """Proves what no pooled job can: the launcher's namespaces, shaped veths, MTU and cgroups, and their removal."""
    stats = tmp_path / "stats.json"
    args = [sys.executable, LAUNCHER, "--hosts", "2", "--rate", "20mbit", "--quiet", "--log-dir", str(tmp_path),
            "--stats-json", str(stats), "--timeout", "60", "--mtu", "9000"]
    if CGROUP:
        args += ["--cpu-quota", "host1=50"]
    proc = subprocess.run(args + ["--", sys.executable, "-c", TRANSFER], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    line = (tmp_path / "host0.log").read_text()
    m = re.search(r"RATE_BIT_S (\S+) eth0 2", line)
    assert m, line
    rate = float(m.group(1))
    # the payload crosses at the shaped rate: not above it (tbf's burst is small next to 3 MB), and not far
    # below (a link that is not shaped as asked, or a transfer that waits on something else)
    assert 0.6 * 20e6 < rate < 1.1 * 20e6, f"received {rate / 1e6:.1f} Mbit/s over a 20mbit link"
    st = json.loads(stats.read_text())
    assert [h["exit_code"] for h in st["hosts"]] == [0, 0]
    assert st["hosts"][1]["delta"]["tx_bytes"] >= 3_000_000  # the interface counters saw the payload
    # jumbo frames: the payload crossed in packets larger than the default MTU allows
    assert st["mtu"] == 9000 and st["hosts"][1]["delta"]["tx_bytes"] / st["hosts"][1]["delta"]["tx_packets"] > 3000
    assert [h["ip"] for h in st["hosts"]] == ["10.77.0.1", "10.77.0.2"]
    if CGROUP:
        assert st["hosts"][1]["cpu_quota_pct"] == 50.0
    owner = int(os.path.basename(st["hosts"][0]["netns"]).split("_")[1])
    assert _leftovers(owner) == [], "namespaces or cgroups left behind"


@needs_netns
def test_cluster_failure_and_signal_teardown(tmp_path):
    """Proves what no pooled job can: the launcher's exit status and teardown when a host fails or it is signalled."""
    # a failing host stops the others and its exit status comes back
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, LAUNCHER, "--hosts", "2", "--quiet", "--log-dir", str(tmp_path), "--",
                           "bash", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; sleep 60'],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and time.monotonic() - t0 < 30, proc.stderr
    # SIGTERM mid-run: everything is torn down, 128 + 15 comes back
    args = [sys.executable, LAUNCHER, "--hosts", "2", "--rate", "10mbit", "--quiet", "--log-dir", str(tmp_path)]
    if CGROUP:
        args += ["--cpu-quota", "host0=30"]
    p = subprocess.Popen(args + ["--", "sleep", "61.25"], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not _leftovers(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers(p.pid), "the cluster never came up"
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert _leftovers(p.pid) == []
    assert subprocess.run(["pgrep", "-f", "^sleep 61.25$"], capture_output=True).returncode != 0, "host left running"


# --------------------------------------------------------------------------- the benchmark smoke sweep

UNIFORM = math.log(257)
"""Cross-entropy of a uniform guess over the byte vocabulary (BENCHMARKS.md: "losses below the uniform 5.55")."""


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """Proves what no pooled job can: ``python -m benchmarks run`` end to end, launches through the real launcher
    on namespaces (or loopback), train_lm and train_lm_fsdp on 2 hosts and 1, then its outputs."""
    out = tmp_path_factory.mktemp("smoke") / "bench"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--sweep", "smoke", "--out", str(out),
                           "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    print(f"bench smoke sweep: {time.monotonic() - t0:.1f}s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    return out, result, {r["id"]: r for r in result["runs"]}


def test_bench_smoke_sweep(smoke):
    """Every part's runs, each in a process of its own, all in one launch (``benchmarks.sweep.shared_launch``).
    Proves what no pooled job can: the sweep's CLI, the launcher and the run folders it leaves (``smoke``)."""
    out, result, runs = smoke
    expected = {("bandwidth", "zero1", 2), ("bandwidth", "acco_adaptive", 2), ("slow_host", "acco_adaptive", 2),
                ("alone", "zero1", 1), ("streaming", "zero1", 2), ("streaming", "streaming_int8", 2),
                ("time_to_loss", "zero1", 2), ("time_to_loss", "acco_lowbit_adaptive", 2),
                ("fsdp_time_to_loss", "fsdp_stock", 2), ("fsdp_time_to_loss", "fsdp_acco_adaptive_lowbit", 2)}
    assert {(r["scenario"], r["config"], r["hosts"]) for r in runs.values()} == expected
    assert len(runs) == 11 and all(r["ok"] for r in runs.values()), [r.get("error_tail") for r in runs.values()]
    # one ZeRO-1 run stands for three parts (the same steps, tokens and validations); its rows say so
    z = "time_to_loss-zero1-unshaped-2h"
    for alias in ("bandwidth-zero1-unshaped-2h", "streaming-zero1-unshaped-2h"):
        assert runs[alias]["run_of"] == z and {k: v for k, v in runs[alias].items() if k not in (
            "id", "scenario", "run_of", "comm_frac")} == {k: v for k, v in runs[z].items() if k not in (
                "id", "scenario", "comm_frac")}
    assert sorted(os.listdir(out / "runs")) == sorted(i for i, r in runs.items() if "run_of" not in r)
    assert os.listdir(out / "launches") == [z]
    for i, r in runs.items():  # each run its own process, forked after the imports, on its own hosts
        cluster = json.loads((out / "runs" / r.get("run_of", i) / "cluster.json").read_text())
        assert cluster["shared_launch"] == z and len(cluster["hosts"]) == r["hosts"], i
        assert all(d["import_s"] < 1 for d in r.get("ranks", [])), i
    csv = (out / "results.csv").read_text().splitlines()
    assert len(csv) == 1 + len(runs) and csv[0].startswith("id,scenario,config")


def test_smoke_bandwidth_memory_and_slow_host(smoke):
    _, result, runs = smoke
    for r in (r for r in runs.values() if r["scenario"] not in ("time_to_loss", "fsdp_time_to_loss")):
        assert _finite_positive(r["tokens_per_s"]) and _finite_positive(r["summary_tokens_per_s"]), r["id"]
        assert r["steps"] == 3 and _finite_positive(r["steps_per_s"])
        assert math.isfinite(r["final_train_loss"]) and 0 < r["val_loss"] < UNIFORM, r["id"]
        assert all(_finite_positive(d["peak_rss_mb"]) and d["peak_rss_mb"] >= d["baseline_rss_mb"] for d in r["ranks"])
        assert [c["step"] for c in r["curve"]] == [1, 2, 3]
        assert r["params"] == pytest.approx(220_000, rel=0.05)
    acco = next(r for r in runs.values() if r["scenario"] == "bandwidth" and r["config"] == "acco_adaptive")
    zero1 = next(r for r in runs.values() if r["scenario"] == "bandwidth" and r["config"] == "zero1")
    assert 0 <= acco["comm_hidden_pct"] <= 100 and zero1["comm_hidden_pct"] is None
    assert acco["ring_bytes_sent_per_step"] > 0 and len(acco["timeline"]) == 2 and acco["timeline"][0]
    for d in acco["ranks"]:  # where the host's core went (parse._cpu_share)
        # BENCHMARKS.md measured 34-36 ms of communication-thread CPU a round for the 3.3 M-parameter model; the
        # smoke sweep's 0.22 M take a few
        assert 0 < d["comm_thread_cpu_s_per_round"] < 0.036 and d["preempted_per_step"] >= 0, d
        assert _finite_positive(d["compute_s_per_mb_overlapped"]), d
        assert 0 <= d["gloo_cpu_s_per_step"] < 1.0, d  # gloo's own threads (clock ticks: 0 in 3 tiny steps)
    if result["netns"]:
        assert zero1["iface_tx_bytes_per_step"] > 0 and acco["iface_tx_bytes_per_step"] > 0
    slow = next(r for r in runs.values() if r["scenario"] == "slow_host")
    assert slow["ranks"][0]["micro_batches"] > slow["ranks"][1]["micro_batches"]  # rank 1 sleeps 200 ms a batch
    a = result["analysis"]
    assert _finite_positive(a["slow_host"]["alone_host0_tokens_per_s"])
    assert {m["config"] for m in a["memory"]} == {"zero1", "acco_adaptive"}
    assert any(t["target"].startswith("slow host") and t["value"] is not None for t in a["targets"])


def test_smoke_streaming(smoke):
    """H = P = 4: fragments 1, 2, 3 sync at steps 1, 2, 3; one fragment's bytes at a time."""
    _, result, runs = smoke
    stream = next(r for r in runs.values() if r["config"] == "streaming_int8")
    assert 0 < stream["peak_round_bytes"] < stream["ring_bytes_sent_per_step"] * 3
    table = {e["config"]: e for e in result["analysis"]["streaming"]}
    assert set(table) == {"zero1", "streaming_int8"}
    if result["netns"]:  # a step moves one fragment (at most a third of the parameters, BENCHMARKS.md) at int8's
        # 0.25x of fp32's interface bytes; the documented 0.0059x is H = 40's one round in ten steps
        assert 0 < table["streaming_int8"]["iface_tx_bytes_per_step_vs_zero1"] < 0.25 / 3


def test_smoke_time_to_loss_and_repeats(smoke, tmp_path):
    """A token budget of 3 nominal steps (768 tokens), validation every step's worth; then the repeats summary of
    the sweep and a copy of it whose ZeRO-1 run took twice the seconds."""
    from benchmarks.report import repeats
    from benchmarks.report.time_to_loss import table as ttl_table

    out, result, runs = smoke
    (block,) = result["analysis"]["time_to_loss"].values()
    assert block["target"] == runs["time_to_loss-zero1-unshaped-2h"]["val_loss"] and block["zero1_s"] > 0
    by = {e["config"]: e for e in block["entries"]}
    assert by["zero1"]["steps"] == 3 and by["zero1"]["seconds_to_target"] <= by["zero1"]["train_s"]
    lowbit = runs["time_to_loss-acco_lowbit_adaptive-unshaped-2h"]
    assert lowbit["tokens_last_step"] >= 768 and 1 <= lowbit["steps"] <= 3
    assert sum(1 for c in lowbit["curve"] if c.get("val_loss") is not None) >= 1
    slower = json.loads((out / "results.json").read_text())
    for r in (r for r in slower["runs"] if r["id"] == "time_to_loss-zero1-unshaped-2h"):
        r["train_s"] *= 2
        for c in r["curve"]:
            c.update({k: 2 * c[k] for k in ("train_s", "val_train_s") if c.get(k) is not None})
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.json").write_text(json.dumps(slower))
    summary = repeats.summarize(repeats.collect([str(out), str(tmp_path / "b")]))
    rows = {r["config"]: r for r in summary["sleep unshaped"]["rows"]}
    (again,) = ttl_table(result["runs"]).values()  # the final-loss seconds, from the same rows
    final = {e["config"]: e["seconds_to_target"] for e in again["entries"]}
    lb, row, z = final["acco_lowbit_adaptive"], rows["acco_lowbit_adaptive"], rows["zero1"]
    assert row["seconds_final"] == [lb, lb]  # the final-loss target is the time-to-loss table's
    assert row["seconds"][0] == row["seconds"][1] and row["spread_s"] in (0, None)
    a = z["seconds"][0]  # ZeRO-1 reaches the loss it had at 3/4 of its budget before its end
    assert 0 < a < final["zero1"] and z["seconds"][1] == pytest.approx(2 * a)
    assert z["seconds_final"] == pytest.approx([final["zero1"], 2 * final["zero1"]])
    assert z["median_s"] == pytest.approx(1.5 * a) and z["spread_s"] == pytest.approx(a)
    assert row["vs_zero1"] == (None if row["median_s"] is None else pytest.approx(row["median_s"] / (1.5 * a)))


def test_smoke_fsdp_time_to_loss(smoke):
    """The FSDP2 front end through the same driver with the DeepSpeed protocol: a budget of 6 nominal steps' tokens,
    the rate decayed over them (WarmupDecayLR in the job file train_lm_fsdp reads), a validation every step, rounds
    (int4 estimates) only for ds_acco, and the report's seconds to stock's losses from the rows."""
    from benchmarks.report.fsdp import ttl_collect, ttl_summary, ttl_table

    out, result, runs = smoke
    stock, lowbit = runs["fsdp_time_to_loss-fsdp_stock-unshaped-2h"], runs[
        "fsdp_time_to_loss-fsdp_acco_adaptive_lowbit-unshaped-2h"]
    for r in (stock, lowbit):
        # adaptive commits hold at most a nominal step (the smoke's cap), so a busy machine leaves the validations
        assert _finite_positive(r["tokens_per_s"]) and len(r["evals"]) >= 5, r["id"]
        assert all(0 < e["val_loss"] < UNIFORM for e in r["evals"]), r["evals"]
        cfg = json.loads((out / "runs" / r["id"] / "config.json").read_text())
        sched = cfg["scheduler"]
        assert sched["type"] == "WarmupDecayLR" and sched["params"]["total_num_steps"] == 6
        assert cfg["acco"].get("max_micro_batches_per_round") == (2 if r is lowbit else None)
    assert stock["steps"] == 6 and len(stock["evals"]) == 6  # 6 steps of G micro-batches: the budget, 1 val each
    assert "collectives_per_step" in stock
    rank0 = json.loads((out / "runs" / lowbit["id"] / "fsdp_rank0.json").read_text())
    assert rank0["summary"]["nominal_steps"] >= 6 and lowbit["rounds_per_step"] > 0  # by the schedule's tokens
    block = ttl_summary(ttl_collect([result]))["unshaped"]
    assert set(block["configs"]) == {"fsdp_stock", "fsdp_acco_adaptive_lowbit"}
    st = block["configs"]["fsdp_stock"]
    assert st["seconds_vs_stock"] == 1.0 and 0 < st["seconds_final_median"] <= stock["evals"][-1]["train_s"]
    assert "refused on FSDP2" in ttl_table({"unshaped": block})


def test_smoke_plots_and_the_plot_command(smoke, tmp_path, capsys):
    """Plots from the run, and again through ``python -m benchmarks plot`` (its ``main``, in this process)."""
    from benchmarks.__main__ import main

    out, _, _ = smoke
    for name in plots.PLOTS:
        assert (out / name).stat().st_size > 5000, name
    replot = tmp_path / "replot"
    assert main(["plot", str(out / "results.json"), "--out", str(replot)]) == 0
    assert sorted(os.listdir(replot)) == sorted(plots.PLOTS) and all(
        (replot / n).stat().st_size > 5000 for n in plots.PLOTS)
    assert sorted(capsys.readouterr().out.split()) == sorted(str(replot / n) for n in plots.PLOTS)
