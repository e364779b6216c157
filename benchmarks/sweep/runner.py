"""Benchmark runs: sweeps of configs x link rates x CPU quotas on the emulated cluster.

Each run is one ``launchers/local_cluster.py`` invocation of
``python -m benchmarks.sweep.worker`` (train_lm plus memory / interface counters) on
every host, in a folder of its own::

    <out>/runs/<run id>/config.json        the generated DeepSpeed config
                        cluster.json       hosts, exit codes, interface counters (launcher)
                        host<i>.log        each host's output
                        worker_rank<r>.json per-step records, peak RSS (worker)
                        train.jsonl        train_lm's per-step log (rank 0)
                        telemetry.jsonl.rank<r>  one record per round (ds_acco modes)

:func:`parse_run` turns such a folder into one result row; :func:`run_sweep` runs a
sweep and writes ``results.json`` and ``results.csv``.

Throughput: ``tokens_per_s`` in a row is the *steady-state* rate, the sum over ranks
of micro-batches computed per second (times tokens per micro-batch) between the
first optimizer step after warmup and bootstrap and the last step, from the
worker's per-step wall-clock records, leaving out stalled steps (longer than 3x the
median step: another process took the CPU; counted in ``stalled_steps``). The
unfiltered rate over the same window is ``window_tokens_per_s``. train_lm's own summary figure
(``summary_tokens_per_s``: all tokens over the slowest rank's training time) is kept
next to it; in short runs it also counts the warmup steps and the ranks' start-up
skew (a rank that reaches the loop first waits for the other in its first step).
``steps_per_s`` is the steady-state optimizer steps per second.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import platform
import subprocess
import sys
import time
from typing import Optional

from benchmarks import results_file
from benchmarks.cluster.system import netns_available

from .commands import REPO, is_torchft, launch_command, prepare_run
from .load_gate import LoadGate, foreign_runnable, loadavg
from .parse import parse_run, read_json
from .parse_fsdp import parse_fsdp_run
from .parse_torchft import parse_torchft_run
from .shared_launch import execute_group, groups
from .specs import RunSpec, Sweep, spec_of


def parse_any(spec: RunSpec, run_dir: str, rc: int, wall_s: float, load: Optional[dict]) -> dict:
    """The result row of a finished run, by its front end."""
    parse = parse_fsdp_run if spec.workload.frontend == "fsdp" else parse_run
    if is_torchft(spec):
        parse = parse_torchft_run
    return parse(spec, run_dir, rc, wall_s, load)


def rows_of(spec: RunSpec, row: dict) -> list[dict]:
    """A run's row, then the same row under each part the run also stands for (``RunSpec.also``)."""
    return [row] + [dict(copy.deepcopy(row), id=a.run_id, scenario=a.scenario, run_of=row["id"])
                    for a in spec.aliases()]


def execute(spec: RunSpec, out_dir: str, *, netns: bool, timeout_s: float) -> tuple[str, int, float]:
    """Run one spec to completion (bounded by ``timeout_s``); returns (run dir, exit code, seconds)."""
    run_dir, config_path = prepare_run(spec, out_dir)
    cmd = launch_command(spec, run_dir, config_path, netns=netns, timeout_s=timeout_s)
    with open(os.path.join(run_dir, "command.txt"), "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.monotonic()
    with open(os.path.join(run_dir, "launcher.log"), "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        samples = []
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout_s + 60:
                    raise subprocess.TimeoutExpired(cmd, timeout_s + 60)
                samples.append(foreign_runnable(sample_s=1.0, interval_s=0.2, exclude_tree=proc.pid))
                time.sleep(1.0)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            proc.terminate()  # the launcher tears its cluster down on SIGTERM
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            rc = 124  # the launcher's own --timeout should have fired first
    with open(os.path.join(run_dir, "foreign_load.json"), "w", encoding="utf-8") as f:
        json.dump(samples, f)
    return run_dir, rc, time.monotonic() - t0


# --------------------------------------------------------------------------- output


CSV_FIELDS = ("id", "scenario", "config", "rate", "hosts", "cpu_quota", "ok", "steps", "train_s", "tokens_per_s",
              "summary_tokens_per_s",
              "steps_per_s", "comm_hidden_pct", "wait_s", "wait_frac", "comm_frac", "final_train_loss", "val_loss",
              "peak_rss_mb", "train_rss_mb", "iface_tx_bytes_per_step", "iface_tx_peak_bytes_per_step",
              "ring_bytes_sent_per_step", "peak_round_bytes",
              "steady_step_s", "mean_counts_per_commit", "qdisc_drops", "wall_s", "load1", "foreign_runnable",
              "cpu_probe_ms", "run_of")


def _rounded(obj, digits: int = 5):
    """Floats to ``digits`` significant digits (measurements are not more precise), recursively."""
    if isinstance(obj, float):
        return float(f"{obj:.{digits}g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v, digits) for v in obj]
    return obj


def write_outputs(result: dict, out_dir: str) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    json_path = results_file.save(out_dir, _rounded(result), separators=(",", ":"), default=str)
    csv_path = os.path.join(out_dir, "results.csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in result["runs"]:
            flat = dict(row)
            flat["cpu_quota"] = ";".join(f"{k}={v:g}" for k, v in (row.get("cpu_quota") or {}).items())
            load = row.get("load") or {}
            flat["load1"] = (load.get("loadavg") or [None])[0]
            flat["foreign_runnable"] = load.get("foreign_runnable")
            flat["cpu_probe_ms"] = load.get("cpu_probe_ms")
            for k, v in flat.items():
                if isinstance(v, float):
                    flat[k] = f"{v:.6g}"
            w.writerow(flat)
    return json_path, csv_path


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:  # the installed versions, without importing the libraries (seconds of CPU) in the sweep's process
        from importlib.metadata import version

        info.update({name: version(name) for name in ("torch", "deepspeed", "transformers")})
    except Exception:  # noqa: BLE001 - informational only
        pass
    try:
        info["git_rev"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                         text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def run_sweep(sweep: Sweep, out_dir: str, *, netns: bool, gate: LoadGate, progress: bool = True,
              log=print, previous: Optional[dict] = None, retries: int = 1, jobs: int = 1) -> dict:
    """Run every spec of ``sweep``; returns (and writes, after every run) the result document.

    ``previous`` (``--resume``): its finished runs are kept, also those outside this sweep's plan (a resume with
    fewer configs or links than the folder holds must not drop them).

    With a load gate, a run during which other processes were runnable (mean > 0.5,
    sampled every second) is measured again, up to ``retries`` times while the gate's
    waiting budget lasts; every attempt's load is kept in the row's ``attempts``.

    ``jobs > 1`` runs that many launches at once, with no load gate: only for the
    smoke sweep, whose numbers are not measurements. A sweep with ``shared_launches``
    (the smoke sweep) goes that way whatever ``jobs``: one launch per link.
    """
    from tqdm import tqdm

    from benchmarks.report.analysis import analyse

    result = {"sweep": sweep.name, "description": sweep.description, "netns": netns, "machine": machine_info(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": []}
    if previous:  # --resume: keep finished runs
        done = {r["id"]: r for r in previous.get("runs", []) if r.get("ok")}
    else:
        done = {}
    planned = {s.run_id for s in sweep.runs} | {a.run_id for s in sweep.runs for a in s.aliases()}
    result["runs"] = [r for r in done.values() if r["id"] not in planned]  # a narrower plan loses no finished run
    t_sweep = time.monotonic()
    if jobs > 1 or sweep.shared_launches:
        return _run_parallel(sweep, out_dir, netns=netns, jobs=jobs, result=result, done=done, t_sweep=t_sweep)
    bar = tqdm(sweep.runs, unit="run", disable=not progress, dynamic_ncols=True, file=sys.stderr)
    for spec in bar:
        bar.set_postfix_str(spec.run_id, refresh=True)
        if spec.run_id in done:
            result["runs"].extend(rows_of(spec, done[spec.run_id]))
            continue
        attempts = []
        for attempt in range(1 + max(0, retries)):
            load = gate.wait()
            run_dir, rc, wall = execute(spec, out_dir, netns=netns, timeout_s=sweep.timeout_s)
            load["after"] = list(loadavg())
            during = read_json(os.path.join(run_dir, "foreign_load.json")) or []
            load["foreign_during_mean"] = round(sum(during) / len(during), 2) if during else None
            attempts.append({"exit_code": rc, "wall_s": round(wall, 1), **load})
            busy = gate.max_load is not None and (load["foreign_during_mean"] or 0) > 0.5
            if not busy or gate.waited_s >= gate.budget_s:
                break
            bar.write(f"[bench] {spec.run_id}: other processes were runnable during the run "
                      f"(mean {load['foreign_during_mean']}); measuring it again")
        row = parse_any(spec, run_dir, rc, wall, load)
        row["attempts"] = attempts
        result["runs"].extend(rows_of(spec, row))
        tps = row.get("tokens_per_s")
        bar.write(f"[bench] {spec.run_id}: exit {rc}, {wall:.0f}s, tokens/s "
                  f"{'-' if tps is None else f'{tps:.0f}'}, load {load['loadavg'][0]:.2f}")
        if not row["ok"]:
            bar.write(f"[bench] {spec.run_id} FAILED; logs in {run_dir}\n{row.get('error_tail', '')[-1200:]}")
        result["analysis"] = analyse(result["runs"])
        result["sweep_wall_s"] = round(time.monotonic() - t_sweep, 1)
        result["load_wait_s"] = round(gate.waited_s, 1)
        write_outputs(result, out_dir)
    bar.close()
    result["analysis"] = analyse(result["runs"])
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    result["sweep_wall_s"] = round(time.monotonic() - t_sweep, 1)
    result["load_wait_s"] = round(gate.waited_s, 1)
    write_outputs(result, out_dir)
    return result


def _run_parallel(sweep: Sweep, out_dir: str, *, netns: bool, jobs: int, result: dict, done: dict,
                  t_sweep: float) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.report.analysis import analyse

    def one(spec: RunSpec) -> dict:
        if spec.run_id in done:
            return done[spec.run_id]
        load = {"loadavg": list(loadavg()), "foreign_runnable": None, "quiet": None, "waited_s": 0.0,
                "parallel_jobs": jobs}
        run_dir, rc, wall = execute(spec, out_dir, netns=netns, timeout_s=sweep.timeout_s)
        return parse_any(spec, run_dir, rc, wall, load)

    def shared(specs: list[RunSpec]) -> list[dict]:
        load = {"loadavg": list(loadavg()), "foreign_runnable": None, "quiet": None, "waited_s": 0.0,
                "parallel_jobs": jobs, "shared_launch": specs[0].run_id}
        done_here = execute_group(specs, out_dir, netns=netns, timeout_s=sweep.timeout_s)
        return [parse_any(spec, run_dir, rc, wall, load) for spec, (run_dir, rc, wall) in zip(specs, done_here)]

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        if sweep.shared_launches:  # the smoke sweep: one launch per link (benchmarks.sweep.shared_launch)
            todo = [s for s in sweep.runs if s.run_id not in done]
            rows = {r["id"]: r for part in pool.map(shared, groups([s for s in todo if not is_torchft(s)]))
                    for r in part}
            peer = [s for s in todo if is_torchft(s)]  # torchft's script is not train_lm: a launch of its own
            rows.update((s.run_id, row) for s, row in zip(peer, pool.map(one, peer)))
            result["runs"] += [r for s in sweep.runs for r in rows_of(s, done.get(s.run_id) or rows[s.run_id])]
        else:
            result["runs"] += [r for s, row in zip(sweep.runs, pool.map(one, sweep.runs)) for r in rows_of(s, row)]
    result["analysis"] = analyse(result["runs"])
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    result["sweep_wall_s"] = round(time.monotonic() - t_sweep, 1)
    result["load_wait_s"] = 0.0
    write_outputs(result, out_dir)
    return result


def default_netns() -> bool:
    return netns_available()


def reparse(out_dir: str) -> dict:
    """Re-read every run folder of ``out_dir/results.json`` with the current parsing and analysis code."""
    from benchmarks.report.analysis import analyse

    result = results_file.load(out_dir)
    rows = []
    for row in result["runs"]:
        spec = spec_of(row)
        run_dir = os.path.join(os.path.abspath(out_dir), "runs", row.get("run_of") or spec.run_id)
        new = parse_any(spec, run_dir, row["exit_code"], row["wall_s"], row.get("load"))
        new["pinned"] = row.get("pinned", False)
        if row.get("run_of"):
            new["run_of"] = row["run_of"]
        rows.append(new)
    result["runs"] = rows
    result["analysis"] = analyse(rows)
    write_outputs(result, out_dir)
    return result
