"""Benchmark runs: sweeps of configs x link rates x CPU quotas on the emulated cluster.

Each run is one ``launchers/local_cluster.py`` invocation of
``python -m benchmarks.worker`` (train_lm plus memory / interface counters) on
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

import csv
import dataclasses
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from . import configs as cfgs
from .cluster import format_rate, netns_available, parse_rate
from .parse import parse_run, read_json

REPO = cfgs.REPO
LAUNCHER = os.path.join(REPO, "launchers", "local_cluster.py")


# --------------------------------------------------------------------------- what to run


@dataclass(frozen=True)
class Workload:
    """Everything that must be equal across the configs a sweep compares."""

    model_size: str = "tiny"
    seq_len: int = 128
    micro_batch: int = 4
    grad_accum: int = 4
    steps: int = 30
    warmup_steps: int = 2
    compute_delay_ms: str = "0"
    """train_lm ``--compute-delay-ms``: a sleep per micro-batch (a list gives rank r the r-th value)."""
    eval_every: int = 0
    eval_batches: int = 8
    seed: int = 0
    max_micro_batches_per_round: Optional[int] = None
    streaming_sync_every: Optional[int] = None
    """Streaming configs: H instead of :data:`benchmarks.configs.STREAMING_BLOCK`'s (short smoke runs)."""
    max_tokens: int = 0
    """train_lm ``--max-tokens``: stop at this many committed tokens (0: at ``steps``)."""
    eval_every_tokens: int = 0
    """train_lm ``--eval-every-tokens`` (0: validate by ``eval_every`` steps only)."""


@dataclass(frozen=True)
class RunSpec:
    scenario: str
    """``bandwidth``, ``slow_host``, ``alone``, ``slow_host_small``, ``alonesmall``, ``memory`` or ``convergence``."""
    config: str
    workload: Workload
    hosts: int = 2
    rate: Optional[str] = None
    cpu_quota: tuple = ()
    """``((host index, percent of one CPU), ...)``."""
    cpus: tuple = ()
    """``((host index, (cpu, ...)), ...)``; empty: not pinned."""
    note: str = ""

    @property
    def run_id(self) -> str:
        parts = [self.scenario, self.config, format_rate(parse_rate(self.rate)), f"{self.hosts}h"]
        parts += [f"h{i}q{q:g}" for i, q in self.cpu_quota]
        if self.note:
            parts.append(self.note)
        return "-".join(parts)


@dataclass
class Sweep:
    name: str
    description: str
    runs: list[RunSpec] = field(default_factory=list)
    timeout_s: float = 600.0


def _pins(hosts: int, pin: bool, first_cpu: int = 0) -> tuple:
    if not pin:
        return ()
    n = os.cpu_count() or 1
    return tuple((i, ((first_cpu + i) % n,)) for i in range(hosts))


def build_sweep(name: str, *, netns: bool, root: bool, pin: Optional[bool] = None,
                configs: Optional[Sequence[str]] = None, rates: Optional[Sequence[str]] = None,
                only: Optional[Sequence[str]] = None, steps: Optional[int] = None) -> Sweep:
    """The runs of a named sweep, adapted to what this machine can do.

    Without namespaces only unshaped (loopback) runs are possible; without root the
    slow host is emulated by a longer ``--compute-delay-ms`` instead of a CPU quota.
    """
    if name not in SWEEP_NAMES:
        raise ValueError(f"sweep: got {name!r}; allowed: {', '.join(SWEEP_NAMES)}")
    smoke = name == "smoke"
    pin = (not smoke and (os.cpu_count() or 1) >= 2) if pin is None else pin
    only_configs = list(configs) if configs else None
    streaming_configs = list(configs or cfgs.STREAMING_COMPARISON)
    configs = list(configs or cfgs.DEFAULT_CONFIGS)
    bad = [c for c in set(configs + streaming_configs) if c not in cfgs.CONFIGS]
    if bad:
        raise ValueError(f"configs: unknown {bad}; allowed: {', '.join(cfgs.CONFIGS)}")
    parts = set(only or DEFAULT_PARTS)
    unknown = parts - set(PARTS)
    if unknown:
        raise ValueError(f"only: unknown part(s) {sorted(unknown)}; allowed: {', '.join(PARTS)}")
    runs: list[RunSpec] = []

    if smoke:
        bw = Workload(model_size="tiny", seq_len=32, micro_batch=2, grad_accum=2, steps=3, warmup_steps=1,
                      eval_batches=2)
        bw_configs = [c for c in configs if c in ("zero1", "acco_adaptive")] or configs[:2]
        bw_rates = list(rates) if rates else [None]
        slow_cfgs = [c for c in bw_configs if c != "zero1"] or bw_configs[:1]
        slow_wl = small_wl = bw
        root = False  # a CPU quota would slow the throttled host's imports too: use the delay fallback
        memory_wl = None
        conv = None
        timeout = 240.0
    else:
        bw = Workload(model_size="tiny", seq_len=128, micro_batch=4, grad_accum=4, steps=steps or 30,
                      warmup_steps=2, compute_delay_ms="30", max_micro_batches_per_round=16)
        bw_configs = configs
        bw_rates = list(rates) if rates else [None, "100mbit", "25mbit", "10mbit"]
        slow_cfgs = [c for c in ("zero1", "acco_adaptive", "acco_fixed", "dpu") if c in configs]
        # Real compute (no sleep): a CPU quota slows CPU work only. The tiny model keeps the
        # rounds' own CPU work (sums, shard step, copies) small next to the compute; the
        # optional part slow_host_small shows what happens when it is not.
        slow_wl = Workload(model_size="tiny", seq_len=128, micro_batch=4, grad_accum=4, steps=steps or 30,
                           warmup_steps=2, max_micro_batches_per_round=16)
        small_wl = Workload(model_size="small", seq_len=64, micro_batch=4, grad_accum=4, steps=steps or 16,
                            warmup_steps=2, max_micro_batches_per_round=16)
        memory_wl = Workload(model_size="medium", seq_len=32, micro_batch=1, grad_accum=4, steps=4,
                             warmup_steps=1, eval_batches=2)
        conv = Workload(model_size="small", seq_len=128, micro_batch=4, grad_accum=4, steps=steps or 150,
                        warmup_steps=2, eval_every=25, eval_batches=16, max_micro_batches_per_round=16)
        timeout = 900.0

    if "bandwidth" in parts:
        for rate in bw_rates:
            if rate is not None and parse_rate(rate) is not None and not netns:
                continue  # loopback cannot shape; the sweep says so in its description
            for c in bw_configs:
                runs.append(RunSpec("bandwidth", c, bw, rate=rate, cpus=_pins(2, pin)))
    for part, wl, cfg_list, suffix in (("slow_host", slow_wl, slow_cfgs, ""),
                                       ("slow_host_small", small_wl, ["zero1", "acco_adaptive"], "small")):
        if part not in parts:
            continue
        if root:
            quota = ((1, 50.0),)
            slow, note = wl, suffix
        else:  # no cgroups: rank 1 sleeps longer per micro-batch instead
            quota = ()
            slow = dataclasses.replace(wl, compute_delay_ms="0,20")
            note = "-".join(filter(None, [suffix, "delay"]))
        for c in cfg_list:
            runs.append(RunSpec(part, c, slow, cpu_quota=quota, cpus=_pins(2, pin), note=note))
        runs.append(RunSpec("alone" + suffix, "zero1", slow, hosts=1, cpus=_pins(1, pin, 0),
                            note="-".join(filter(None, [suffix, "host0"]))))
        if root:
            runs.append(RunSpec("alone" + suffix, "zero1", slow, hosts=1, cpu_quota=((0, 50.0),),
                                cpus=_pins(1, pin, 1), note="-".join(filter(None, [suffix, "host1"]))))
        else:
            runs.append(RunSpec("alone" + suffix, "zero1", dataclasses.replace(slow, compute_delay_ms="20"),
                                hosts=1, cpus=_pins(1, pin, 1), note="-".join(filter(None, [suffix, "host1"]))))
    if "memory" in parts and memory_wl is not None:
        for c in configs:
            runs.append(RunSpec("memory", c, memory_wl, cpus=_pins(2, pin)))
    if "convergence" in parts and conv is not None:
        for c in [c for c in ("zero1", "acco_fixed", "acco_adaptive", "dpu") if c in configs]:
            runs.append(RunSpec("convergence", c, conv, cpus=_pins(2, pin)))
    if "streaming" in parts:
        runs.extend(_streaming_runs(smoke, streaming_configs, rates, steps, netns, pin))
    if "time_to_loss" in parts:
        runs.extend(_time_to_loss_runs(smoke, only_configs, rates, steps, netns, pin))
    desc = f"sweep {name}: {len(runs)} runs, " + ("network namespaces" if netns else
                                                   "loopback (no namespaces: unshaped only)")
    return Sweep(name, desc, runs, timeout_s=timeout)


SWEEP_NAMES = ("smoke", "full")
def _streaming_runs(smoke: bool, configs: Sequence[str], rates: Optional[Sequence[str]], steps: Optional[int],
                    netns: bool, pin: bool) -> list[RunSpec]:
    """Streaming DiLoCo against ZeRO-1 (fp32 and bf16) and acco on one slow link, with loss curves.

    Every config sees the same tokens per optimizer (inner) step; the tiny model's four
    layers make four fragments (benchmarks.configs.STREAMING_BLOCK).
    """
    wanted = [c for c in cfgs.STREAMING_COMPARISON if c in configs]
    if smoke:  # H = P = 4: a fragment round at every step
        wl = Workload(model_size="tiny", seq_len=32, micro_batch=2, grad_accum=2, steps=3, warmup_steps=1,
                      eval_batches=2, streaming_sync_every=4)
        return [RunSpec("streaming", c, wl, cpus=_pins(2, pin)) for c in wanted if c in ("zero1", "streaming_int8")]
    wl = Workload(model_size="tiny", seq_len=128, micro_batch=4, grad_accum=4, steps=steps or 200, warmup_steps=2,
                  compute_delay_ms="30", eval_every=25, eval_batches=16)
    rate = (list(rates) if rates else ["25mbit"])[0] if netns else None
    return [RunSpec("streaming", c, wl, rate=rate, cpus=_pins(2, pin)) for c in wanted]


def _time_to_loss_runs(smoke: bool, configs: Optional[Sequence[str]], rates: Optional[Sequence[str]],
                       steps: Optional[int], netns: bool, pin: bool) -> list[RunSpec]:
    """Every config trains the same token budget on the same link; see :mod:`benchmarks.time_to_loss`.

    On the slow links (25 and 10 Mbit/s) every config of :data:`~benchmarks.configs.TIME_TO_LOSS`
    runs; on the fast ones the ones whose rounds can matter there (ZeRO-1 fp32/bf16, sync low-bit,
    acco adaptive and both low-bit acco policies), to keep the part under an hour.
    """
    if smoke:
        wl = Workload(model_size="tiny", seq_len=32, micro_batch=2, grad_accum=2, steps=1000, warmup_steps=1,
                      eval_batches=2, max_tokens=3 * 2 * 2 * 32 * 2, eval_every_tokens=2 * 2 * 32 * 2,
                      max_micro_batches_per_round=4)
        return [RunSpec("time_to_loss", c, wl, cpus=_pins(2, pin)) for c in (configs or ("zero1", "acco_lowbit_adaptive"))]
    nominal = 4 * 4 * 128 * 2  # micro-batch x accumulation x seq x 2 hosts: tokens per optimizer step
    wl = Workload(model_size="tiny", seq_len=128, micro_batch=4, grad_accum=4, steps=100_000, warmup_steps=2,
                  compute_delay_ms="30", eval_batches=8, max_micro_batches_per_round=16,
                  max_tokens=(steps or 100) * nominal, eval_every_tokens=10 * nominal)
    fast = ("zero1", "zero1_bf16", "sync_lowbit", "acco_adaptive", "acco_lowbit_fixed", "acco_lowbit_adaptive")
    runs = []
    for rate in (list(rates) if rates else [None, "100mbit", "25mbit", "10mbit"]):
        if rate is not None and parse_rate(rate) is not None and not netns:
            continue
        slow = rate is not None and parse_rate(rate) is not None and parse_rate(rate) <= 25e6
        wanted = configs or (cfgs.TIME_TO_LOSS if slow else fast)
        runs.extend(RunSpec("time_to_loss", c, wl, rate=rate, cpus=_pins(2, pin)) for c in wanted)
    return runs


PARTS = ("bandwidth", "slow_host", "slow_host_small", "memory", "convergence", "streaming", "time_to_loss")
DEFAULT_PARTS = ("bandwidth", "slow_host", "memory", "convergence", "streaming", "time_to_loss")


# --------------------------------------------------------------------------- machine load


def loadavg() -> tuple[float, float, float]:
    with open("/proc/loadavg", encoding="ascii") as f:
        a, b, c = f.read().split()[:3]
    return float(a), float(b), float(c)


def foreign_runnable(sample_s: float = 2.0, interval_s: float = 0.1, exclude_tree: Optional[int] = None) -> float:
    """Mean number of runnable processes over ``sample_s`` that are not this process (or its run).

    The 1-minute load average still counts a benchmark run that just ended for a
    minute afterwards; this says whether *someone else* is using the CPUs right now.
    ``exclude_tree``: a launcher pid whose hosts (each in a session of its own, led by
    a child of the launcher) are ours too.
    """
    me = os.getpid()
    ours = {me}
    if exclude_tree is not None:
        ours.add(exclude_tree)
    n, total = 0, 0
    deadline = time.monotonic() + sample_s
    while time.monotonic() < deadline:
        running = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) in ours:
                continue
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            if stat[0] != b"R":
                continue
            if exclude_tree is not None and _is_ours(int(pid), ours, stat):
                continue
            running += 1
        total += running
        n += 1
        time.sleep(interval_s)
    return max(0.0, total / max(n, 1))


def _is_ours(pid: int, ours: set, stat: list) -> bool:
    """True when ``pid`` descends from a pid in ``ours`` (walks parent links; sessions of the hosts)."""
    seen = 0
    ppid = int(stat[1])
    while ppid > 1 and seen < 32:
        if ppid in ours:
            return True
        try:
            with open(f"/proc/{ppid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return False


class LoadGate:
    """Waits before each run until the machine is quiet, within an overall waiting budget.

    Quiet: the 1-minute load average is below ``max_load``, or (our own just-finished
    run still weighs on the average) fewer than 0.5 foreign threads are runnable.
    """

    def __init__(self, max_load: Optional[float], budget_s: float = 1200.0, poll_s: float = 30.0, log=print):
        self.max_load, self.budget_s, self.poll_s, self.log = max_load, budget_s, poll_s, log
        self.waited_s = 0.0

    def wait(self) -> dict:
        start = time.monotonic()
        if self.max_load is None:  # not gating: just record the load
            return {"loadavg": list(loadavg()), "foreign_runnable": None, "quiet": None, "waited_s": 0.0}
        while True:
            load = loadavg()
            foreign = foreign_runnable()
            quiet = self.max_load is None or load[0] < self.max_load or foreign < 0.5
            spent = self.waited_s + (time.monotonic() - start)
            if quiet or spent >= self.budget_s:
                self.waited_s = spent
                return {"loadavg": list(load), "foreign_runnable": round(foreign, 2), "quiet": quiet,
                        "waited_s": round(time.monotonic() - start, 1)}
            self.log(f"[bench] load {load[0]:.2f} (foreign runnable {foreign:.1f}); waiting {self.poll_s:.0f}s "
                     f"(waited {spent:.0f}/{self.budget_s:.0f}s so far)")
            time.sleep(self.poll_s)


# --------------------------------------------------------------------------- running


def train_args(wl: Workload, config_path: str, run_dir: str) -> list[str]:
    return ["--deepspeed_config", config_path, "--model-size", wl.model_size, "--seq-len", str(wl.seq_len),
            "--steps", str(wl.steps), "--eval-every", str(wl.eval_every), "--eval-batches", str(wl.eval_batches),
            "--seed", str(wl.seed), "--compute-delay-ms", wl.compute_delay_ms,
            "--max-tokens", str(wl.max_tokens), "--eval-every-tokens", str(wl.eval_every_tokens),
            "--log-jsonl", os.path.join(run_dir, "train.jsonl"), "--no-progress"]


def launch_command(spec: RunSpec, run_dir: str, config_path: str, *, netns: bool, timeout_s: float,
                   python: str = sys.executable) -> list[str]:
    cmd = [python, LAUNCHER, "--hosts", str(spec.hosts), "--quiet", "--log-dir", run_dir,
           "--stats-json", os.path.join(run_dir, "cluster.json"), "--timeout", str(int(timeout_s))]
    if not netns:
        cmd.append("--no-netns")
    if spec.rate and parse_rate(spec.rate) is not None:
        cmd += ["--rate", spec.rate]
    for i, q in spec.cpu_quota:
        cmd += ["--cpu-quota", f"host{i}={q:g}"]
    for i, cpus in spec.cpus:
        cmd += ["--cpus", f"host{i}={':'.join(map(str, cpus))}"]
    cmd += ["--", python, "-m", "benchmarks.worker", "--out", run_dir, "--"]
    return cmd + train_args(spec.workload, config_path, run_dir)


def prepare_run(spec: RunSpec, out_dir: str) -> tuple[str, str]:
    run_dir = os.path.join(os.path.abspath(out_dir), "runs", spec.run_id)
    os.makedirs(run_dir, exist_ok=True)
    for name in os.listdir(run_dir):  # a re-run starts clean (jsonl files append)
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    wl = spec.workload
    cfg = cfgs.make_config(spec.config, micro_batch=wl.micro_batch, grad_accum=wl.grad_accum,
                           warmup_steps=wl.warmup_steps, telemetry_jsonl=os.path.join(run_dir, "telemetry.jsonl"),
                           max_micro_batches_per_round=wl.max_micro_batches_per_round,
                           streaming_sync_every=wl.streaming_sync_every)
    cfgs.validate(cfg)
    config_path = os.path.join(run_dir, "config.json")
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    return run_dir, config_path


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
              "steady_step_s", "mean_counts_per_commit", "qdisc_drops", "wall_s", "load1", "foreign_runnable")


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
    json_path = os.path.join(out_dir, "results.json")
    with open(json_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(_rounded(result), f, separators=(",", ":"), default=str)
    os.replace(json_path + ".tmp", json_path)
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
            for k, v in flat.items():
                if isinstance(v, float):
                    flat[k] = f"{v:.6g}"
            w.writerow(flat)
    return json_path, csv_path


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        import deepspeed
        import torch
        import transformers

        info.update(torch=torch.__version__, deepspeed=deepspeed.__version__, transformers=transformers.__version__)
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

    With a load gate, a run during which other processes were runnable (mean > 0.5,
    sampled every second) is measured again, up to ``retries`` times while the gate's
    waiting budget lasts; every attempt's load is kept in the row's ``attempts``.

    ``jobs > 1`` runs that many launches at once, with no load gate: only for the
    smoke sweep, whose numbers are not measurements.
    """
    from tqdm import tqdm

    from .analysis import analyse

    result = {"sweep": sweep.name, "description": sweep.description, "netns": netns, "machine": machine_info(),
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": []}
    if previous:  # --resume: keep finished runs
        done = {r["id"]: r for r in previous.get("runs", []) if r.get("ok")}
    else:
        done = {}
    t_sweep = time.monotonic()
    if jobs > 1:
        return _run_parallel(sweep, out_dir, netns=netns, jobs=jobs, result=result, done=done, t_sweep=t_sweep)
    bar = tqdm(sweep.runs, unit="run", disable=not progress, dynamic_ncols=True, file=sys.stderr)
    for spec in bar:
        bar.set_postfix_str(spec.run_id, refresh=True)
        if spec.run_id in done:
            result["runs"].append(done[spec.run_id])
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
        row = parse_run(spec, run_dir, rc, wall, load)
        row["attempts"] = attempts
        result["runs"].append(row)
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

    from .analysis import analyse

    def one(spec: RunSpec) -> dict:
        if spec.run_id in done:
            return done[spec.run_id]
        load = {"loadavg": list(loadavg()), "foreign_runnable": None, "quiet": None, "waited_s": 0.0,
                "parallel_jobs": jobs}
        run_dir, rc, wall = execute(spec, out_dir, netns=netns, timeout_s=sweep.timeout_s)
        return parse_run(spec, run_dir, rc, wall, load)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        result["runs"] = list(pool.map(one, sweep.runs))
    result["analysis"] = analyse(result["runs"])
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    result["sweep_wall_s"] = round(time.monotonic() - t_sweep, 1)
    result["load_wait_s"] = 0.0
    write_outputs(result, out_dir)
    return result


def default_netns() -> bool:
    return netns_available()


def spec_of(row: dict) -> RunSpec:
    """The :class:`RunSpec` a result row was made from (CPU pinning is not part of a row)."""
    rate = None if row["rate"] == "unshaped" else row["rate"]
    quota = tuple((int(k.replace("host", "")), float(v)) for k, v in (row.get("cpu_quota") or {}).items())
    return RunSpec(row["scenario"], row["config"], Workload(**row["workload"]), hosts=row["hosts"], rate=rate,
                   cpu_quota=quota, note=row.get("note", ""))


def reparse(out_dir: str) -> dict:
    """Re-read every run folder of ``out_dir/results.json`` with the current parsing and analysis code."""
    from .analysis import analyse

    with open(os.path.join(out_dir, "results.json"), encoding="utf-8") as f:
        result = json.load(f)
    rows = []
    for row in result["runs"]:
        spec = spec_of(row)
        run_dir = os.path.join(os.path.abspath(out_dir), "runs", spec.run_id)
        new = parse_run(spec, run_dir, row["exit_code"], row["wall_s"], row.get("load"))
        new["pinned"] = row.get("pinned", False)
        rows.append(new)
    result["runs"] = rows
    result["analysis"] = analyse(rows)
    write_outputs(result, out_dir)
    return result
