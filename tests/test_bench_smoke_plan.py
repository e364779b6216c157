"""The smoke sweep's plan (one ZeRO-1 run standing for three parts, a slow host slower than a loaded machine) and
how a shared launch reports each of its runs, without launching anything: the launch itself is
tests/test_bench_smoke.py's sweep."""

from __future__ import annotations

import dataclasses
import json

from benchmarks.sweep import plans, shared_launch
from benchmarks.sweep.parse import parse_run
from benchmarks.sweep.specs import RunSpec


def test_smoke_plan_shares_only_the_same_run():
    """Runs merge only where a stock config would train the same steps, tokens and validations on the same hosts."""
    sweep = plans.build_sweep("smoke", netns=True, root=True)
    assert sweep.shared_launches and len(sweep.runs) == 9
    (z,) = [r for r in sweep.runs if r.also]
    assert (z.run_id, z.also) == ("time_to_loss-zero1-unshaped-2h", ("bandwidth", "streaming"))
    assert [a.run_id for a in z.aliases()] == ["bandwidth-zero1-unshaped-2h", "streaming-zero1-unshaped-2h"]
    wl = z.workload
    other = [RunSpec("bandwidth", "zero1", dataclasses.replace(wl, steps=3, max_tokens=0)),
             RunSpec("bandwidth", "zero1", dataclasses.replace(wl, steps=4, max_tokens=0)),  # a step more
             RunSpec("bandwidth", "zero1", dataclasses.replace(wl, steps=3, max_tokens=0, eval_every_tokens=0)),
             RunSpec("bandwidth", "zero1", dataclasses.replace(wl, steps=3, max_tokens=0), hosts=1),
             RunSpec("bandwidth", "sync", wl), RunSpec("streaming", "sync", wl)]  # ds_acco: the cap may matter
    assert [(r.run_id, r.also) for r in plans.share_runs([z] + other[1:] + other[:1])] == [
        (z.run_id, ("bandwidth",))] + [(r.run_id, ()) for r in other[1:]]
    assert [len(g) for g in shared_launch.groups(sweep.runs)] == [9]  # one link: one launch
    delays = {r.run_id: r.workload.compute_delay_ms for r in sweep.runs if r.scenario in ("slow_host", "alone")}
    assert delays == {"slow_host-acco_adaptive-unshaped-2h-delay": "0,200", "alone-zero1-unshaped-1h-host0": "0,200",
                      "alone-zero1-unshaped-1h-host1": "200"}  # host 0 alone is rank 0: no delay
    full = plans.build_sweep("full", netns=True, root=True)
    assert full.shared_launches is False and not any(r.also for r in full.runs)


def test_a_shared_launch_reports_each_run_by_its_own_hosts(tmp_path):
    """Exit codes and seconds from each host's ``exit_rank<r>.json``; a run the launch never reached fails with the
    launch's code; ``cluster.json`` has the run's own hosts and the worker's interface bytes."""
    launch = {"netns": True, "hosts": [{"index": i, "ip": f"10.77.0.{i + 1}", "iface": "eth0", "exit_code": 3,
                                        "delta": {"tx_bytes": 10 ** 9}} for i in range(2)]}
    wl = plans.build_sweep("smoke", netns=True, root=True).runs[0].workload
    specs = [RunSpec("bandwidth", "zero1", wl), RunSpec("bandwidth", "acco_adaptive", wl),
             RunSpec("alone", "zero1", wl, hosts=1, note="host0")]
    exits = [[(0, 1.5), (0, 2.5)], [(0, 1.0), (3, 0.5)], []]  # the second run failed on host 1: the last never ran
    dirs = []
    for spec, codes in zip(specs, exits):
        d = tmp_path / spec.run_id
        d.mkdir()
        for r, (code, wall) in enumerate(codes):
            (d / f"exit_rank{r}.json").write_text(json.dumps({"exit_code": code, "wall_s": wall}))
            (d / f"worker_rank{r}.json").write_text(json.dumps({"iface_start": [100, 50], "iface_end": [350, 60]}))
        dirs.append(str(d))
    got = [shared_launch._finish_run(s, d, "L", launch, 3, 40.0) for s, d in zip(specs, dirs)]
    assert got == [(dirs[0], 0, 2.5), (dirs[1], 3, 1.0), (dirs[2], 3, 40.0)]
    first, last = (json.loads((tmp_path / s.run_id / "cluster.json").read_text()) for s in (specs[0], specs[2]))
    assert first["shared_launch"] == "L" and first["netns"] is True
    assert [(h["ip"], h["exit_code"], h["delta"]) for h in first["hosts"]] == [
        ("10.77.0.1", 0, {"tx_bytes": 250, "rx_bytes": 10}), ("10.77.0.2", 0, {"tx_bytes": 250, "rx_bytes": 10})]
    assert [(h["ip"], h["exit_code"], h["delta"]) for h in last["hosts"]] == [("10.77.0.1", None, {})]
    row = parse_run(specs[2], dirs[2], 3, 40.0)
    assert row["ok"] is False and row["exit_code"] == 3 and row["netns"] is True
    assert shared_launch.main(["a", "b"]) == 2  # usage


def test_a_steps_tokens_come_from_its_rounds_else_the_scripts_count(tmp_path):
    """A commit's tokens are its rounds' counts; a step no gradient round made (a streaming phase's inner step, which
    auto may run at half the batch) takes the training script's own count, not the nominal batch."""
    wl = plans.build_sweep("smoke", netns=True, root=True).runs[0].workload
    spec = RunSpec("time_to_loss", "auto_lowbit_int4_streaming", wl)
    per_mb = wl.micro_batch * wl.seq_len
    nominal = per_mb * wl.grad_accum * spec.hosts
    steps = [{"step": s, "t": float(s), "loss": 3.0, "train_s": float(s), "micro_batch_index": s,
              "tx_bytes": -1} for s in (1, 2, 3)]
    for r in range(spec.hosts):
        (tmp_path / f"worker_rank{r}.json").write_text(json.dumps({"steps": steps, "summary": {"steps": 3},
                                                                        "peak_rss_kb": 2, "baseline_rss_kb": 1}))
        (tmp_path / f"telemetry.jsonl.rank{r}").write_text(json.dumps(
            {"index": 0, "kind": "commit", "mode": "sync", "counts": [wl.grad_accum] * spec.hosts,
             "waited_s": 0.0, "round_s": 0.1, "compute_s": 0.1, "bytes_sent": 1, "stage_s": {}}) + "\n")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(dict(s, tokens=nominal + (s["step"] - 1) * nominal // 2))
                                                  + "\n" for s in steps) + json.dumps({"tokens": 0}) + "\n")
    row = parse_run(spec, str(tmp_path), 0, 10.0)
    assert [c["tokens"] for c in row["curve"]] == [nominal, 3 * nominal // 2, 2 * nominal]
