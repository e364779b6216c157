"""Benchmark runs: sweeps of configs x link rates x CPU quotas on the emulated cluster.

Each run is one ``launchers/local_cluster.py`` invocation of
``python -m ds_acco.bench.worker`` (train_lm plus memory / interface counters) on
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
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from . import configs as cfgs
from .cluster import format_rate, netns_available, parse_rate

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
    configs = list(configs or cfgs.CONFIGS)
    bad = [c for c in configs if c not in cfgs.CONFIGS]
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
    desc = f"sweep {name}: {len(runs)} runs, " + ("network namespaces" if netns else
                                                   "loopback (no namespaces: unshaped only)")
    return Sweep(name, desc, runs, timeout_s=timeout)


SWEEP_NAMES = ("smoke", "full")
PARTS = ("bandwidth", "slow_host", "slow_host_small", "memory", "convergence")
DEFAULT_PARTS = ("bandwidth", "slow_host", "memory", "convergence")


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
    cmd += ["--", python, "-m", "ds_acco.bench.worker", "--out", run_dir, "--"]
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
                           max_micro_batches_per_round=wl.max_micro_batches_per_round)
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


# --------------------------------------------------------------------------- parsing


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read_jsonl(path: str) -> list[dict]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def _finite(x) -> Optional[float]:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _tail_text(path: str, n: int = 1500) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def tokens_by_step(rounds: list[dict], tokens_per_micro_batch: int) -> dict[int, int]:
    """Global tokens consumed by the updates up to each commit, from one rank's round records."""
    out, cum, commits = {}, 0, 0
    for r in sorted(rounds, key=lambda r: r["index"]):
        cum += sum(r["counts"])
        if r["kind"] == "commit":
            commits += 1
            out[commits] = cum * tokens_per_micro_batch
    return out


def parse_run(spec: RunSpec, run_dir: str, rc: int, wall_s: float, load: Optional[dict] = None) -> dict:
    """One result row (plus curves) from a finished run's folder; missing pieces become None."""
    wl = spec.workload
    tokens_per_mb = wl.micro_batch * wl.seq_len
    nominal_tokens_per_step = tokens_per_mb * wl.grad_accum * spec.hosts
    cluster = _read_json(os.path.join(run_dir, "cluster.json")) or {}
    workers = [_read_json(os.path.join(run_dir, f"worker_rank{r}.json")) for r in range(spec.hosts)]
    rounds = [_read_jsonl(os.path.join(run_dir, f"telemetry.jsonl.rank{r}")) for r in range(spec.hosts)]
    summary = (workers[0] or {}).get("summary") or {}
    row: dict = {
        "id": spec.run_id, "scenario": spec.scenario, "config": spec.config, "label": cfgs.LABELS[spec.config],
        "hosts": spec.hosts, "rate": format_rate(parse_rate(spec.rate)), "rate_bit_s": parse_rate(spec.rate),
        "cpu_quota": {f"host{i}": q for i, q in spec.cpu_quota}, "pinned": bool(spec.cpus), "note": spec.note,
        "workload": dataclasses.asdict(wl), "nominal_tokens_per_step": nominal_tokens_per_step,
        "exit_code": rc, "wall_s": round(wall_s, 2), "load": load, "netns": cluster.get("netns"),
        "ok": rc == 0 and bool(summary),
    }
    if not row["ok"]:
        logs = [os.path.join(run_dir, f"host{i}.log") for i in range(spec.hosts)] + [os.path.join(run_dir, "launcher.log")]
        row["error_tail"] = "\n".join(f"== {os.path.basename(p)}\n{_tail_text(p)}" for p in logs)

    m = re.search(r"GPT \(([\d.]+)M params\)", _tail_text(os.path.join(run_dir, "host0.log"), 10 ** 6))
    row["params"] = int(float(m.group(1)) * 1e6) if m else None
    steps = summary.get("steps")
    train_s = _finite(summary.get("train_s"))
    row.update(
        steps=steps, train_s=train_s, tokens=summary.get("tokens"),
        tokens_per_s=_finite(summary.get("tokens_per_s")),
        steps_per_s=(steps / train_s) if steps and train_s else None,
        final_train_loss=_finite(summary.get("final_train_loss")), val_loss=_finite(summary.get("val_loss")),
        comm_hidden_pct=_finite(summary.get("comm_hidden_pct")),
    )

    # ---- per rank: memory, local throughput, waits, interface bytes
    ranks = []
    for r, (w, rr) in enumerate(zip(workers, rounds)):
        w = w or {}
        recs = w.get("steps") or []
        d: dict = {"rank": r}
        if w:
            d.update(peak_rss_mb=w["peak_rss_kb"] / 1024, baseline_rss_mb=w["baseline_rss_kb"] / 1024,
                     train_rss_mb=(w["peak_rss_kb"] - w["baseline_rss_kb"]) / 1024, import_s=w.get("import_s"))
        if recs:
            last = recs[-1]
            d["micro_batches"] = last.get("micro_batch_index")
            if train_s and d["micro_batches"]:
                d["local_tokens_per_s"] = d["micro_batches"] * tokens_per_mb / train_s
            # steady state: from the step after warmup and bootstrap to the last one
            k0 = max(1, min(wl.warmup_steps + 2, last["step"] - 1))
            first = next((x for x in recs if x["step"] >= k0), None)
            if first is not None and last["step"] > first["step"] and last["t"] > first["t"]:
                window = [x for x in recs if x["step"] >= first["step"]]
                n = last["step"] - first["step"]
                d["steady_from_step"] = first["step"]
                d["window_tokens_per_s"] = ((last["micro_batch_index"] - first["micro_batch_index"]) * tokens_per_mb
                                            / (last["t"] - first["t"]))
                # Steps more than 3x the median step are stalls (another process took the CPU, a
                # page-fault storm): left out of the steady rate, and counted.
                deltas = [(b["t"] - a["t"], b["micro_batch_index"] - a["micro_batch_index"])
                          for a, b in zip(window, window[1:])]
                med = statistics.median(dt for dt, _ in deltas)
                kept = [(dt, mb) for dt, mb in deltas if dt <= 3 * med]
                d["stalled_steps"] = len(deltas) - len(kept)
                d["steady_step_s"] = sum(dt for dt, _ in kept) / len(kept)
                d["steady_tokens_per_s"] = sum(mb for _, mb in kept) * tokens_per_mb / sum(dt for dt, _ in kept)
                if first["tx_bytes"] >= 0 and row["netns"]:
                    d["iface_tx_bytes_per_step"] = (last["tx_bytes"] - first["tx_bytes"]) / n
                    d["iface_rx_bytes_per_step"] = (last["rx_bytes"] - first["rx_bytes"]) / n
        if rr:
            waited = sum(x["waited_s"] for x in rr)
            round_s = sum(x["round_s"] for x in rr)
            # steady state: the overlapped rounds (warmup's sync steps left out), all rounds for sync
            steady_rounds = [x for x in rr if x["mode"] != "sync"] or rr
            steady_rounds = steady_rounds[1:] or steady_rounds  # the first holds start-up/bootstrap time
            st_wait = sum(x["waited_s"] for x in steady_rounds)
            st_busy = st_wait + sum(x["compute_s"] for x in steady_rounds)
            d.update(rounds=len(rr), waited_s=waited, round_s=round_s,
                     compute_s=sum(x["compute_s"] for x in rr), steady_waited_s=st_wait,
                     wait_frac=st_wait / st_busy if st_busy > 0 else None,
                     hidden_pct=100.0 * max(0.0, 1 - waited / round_s) if round_s > 0 else None)
            commits = [x for x in rr if x["kind"] == "commit"]
            overlapped = [x for x in rr if x["mode"] != "sync"]
            steady = overlapped or rr
            n_commits = sum(1 for x in steady if x["kind"] == "commit") or 1
            d["ring_bytes_sent_per_step"] = sum(x["bytes_sent"] for x in steady) / n_commits
            d["mean_counts_per_commit"] = sum(sum(x["counts"]) for x in steady) / n_commits
            sync_commits = [x for x in commits if x["mode"] == "sync"]
            if len(sync_commits) > 1:  # the first one also holds the time from engine start-up to the loop
                d["sync_compute_s_per_step"] = statistics.median(x["compute_s"] for x in sync_commits[1:])
        ranks.append(d)
    row["ranks"] = ranks
    h = (cluster.get("hosts") or [])
    row["iface_total_tx_bytes"] = [x.get("delta", {}).get("tx_bytes") for x in h] if row["netns"] else None
    row["qdisc_drops"] = sum(x.get("delta", {}).get("qdisc_drops", 0) for x in h) if row["netns"] else None

    def mean(key):
        vals = [d[key] for d in ranks if d.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    steady = [d.get("steady_tokens_per_s") for d in ranks]
    row["steady_tokens_per_s"] = sum(steady) if steady and all(v is not None for v in steady) else None
    row["summary_tokens_per_s"] = row["tokens_per_s"]
    if row["steady_tokens_per_s"] is not None:
        row["tokens_per_s"] = row["steady_tokens_per_s"]  # the headline figure; see module docstring
    row["peak_rss_mb"] = max((d["peak_rss_mb"] for d in ranks if "peak_rss_mb" in d), default=None)
    row["train_rss_mb"] = max((d["train_rss_mb"] for d in ranks if "train_rss_mb" in d), default=None)
    row["wait_s"] = mean("waited_s")
    row["wait_frac"] = mean("wait_frac")
    row["iface_tx_bytes_per_step"] = mean("iface_tx_bytes_per_step")
    row["ring_bytes_sent_per_step"] = mean("ring_bytes_sent_per_step")
    row["steady_step_s"] = mean("steady_step_s")
    row["stalled_steps"] = max((d.get("stalled_steps", 0) for d in ranks), default=0)
    window = [d.get("window_tokens_per_s") for d in ranks]
    row["window_tokens_per_s"] = sum(window) if window and all(v is not None for v in window) else None
    if row["steady_step_s"]:
        row["steps_per_s"] = 1.0 / row["steady_step_s"]
    row["mean_counts_per_commit"] = mean("mean_counts_per_commit")

    # ---- curves (rank 0): loss vs step/tokens/time, validation points, round timeline
    tok = tokens_by_step(rounds[0], tokens_per_mb) if rounds and rounds[0] else {}
    curve = []
    for x in (workers[0] or {}).get("steps") or []:
        s = x["step"]
        curve.append({"step": s, "tokens": tok.get(s, s * nominal_tokens_per_step), "train_s": x.get("train_s"),
                      "loss": _finite(x.get("loss")), "val_loss": _finite(x.get("val_loss"))})
    if curve and row["val_loss"] is not None:
        curve[-1]["final_val_loss"] = row["val_loss"]
    row["curve"] = curve
    row["tokens_last_step"] = curve[-1]["tokens"] if curve else None
    row["timeline"] = [[{k: x[k] for k in ("index", "kind", "mode", "counts", "compute_s", "round_s", "waited_s")}
                        for x in rr] for rr in rounds]
    return row


# --------------------------------------------------------------------------- output


CSV_FIELDS = ("id", "scenario", "config", "rate", "hosts", "cpu_quota", "ok", "steps", "train_s", "tokens_per_s",
              "summary_tokens_per_s",
              "steps_per_s", "comm_hidden_pct", "wait_s", "wait_frac", "comm_frac", "final_train_loss", "val_loss",
              "peak_rss_mb", "train_rss_mb", "iface_tx_bytes_per_step", "ring_bytes_sent_per_step",
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
            during = _read_json(os.path.join(run_dir, "foreign_load.json")) or []
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
