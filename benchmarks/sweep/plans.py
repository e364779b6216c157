"""The named sweeps and their parts: which configs run on which links, hosts and CPU quotas.

``smoke`` is a seconds-long version of every part for CI; ``full`` is what BENCHMARKS.md reports. The long-run
protocol's parts (a decayed rate over long budgets, each bed unshaped too, 4 and 8 workers) are in
:mod:`benchmarks.protocol.plans`; they run in ``full`` only and are in no default.
Every part adapts to the machine: without network namespaces only unshaped (loopback) runs are
possible, and without root a slow host is emulated by a longer per-micro-batch sleep instead of
a CPU quota.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

from benchmarks.cluster.units import parse_delay, parse_rate

from . import configs as cfgs
from benchmarks.protocol.plans import PARTS as LONG_PARTS
from benchmarks.protocol.plans import long_runs, torchft_configs
from .specs import RunSpec, Sweep, Workload


def _pins(hosts: int, pin: bool, first_cpu: int = 0) -> tuple:
    if not pin:
        return ()
    n = os.cpu_count() or 1
    return tuple((i, ((first_cpu + i) % n,)) for i in range(hosts))


def build_sweep(name: str, *, netns: bool, root: bool, pin: Optional[bool] = None,
                configs: Optional[Sequence[str]] = None, rates: Optional[Sequence[str]] = None,
                only: Optional[Sequence[str]] = None, steps: Optional[int] = None,
                mtu: Optional[int] = None, seed: Optional[int] = None, delay: Optional[str] = None) -> Sweep:
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
    known = cfgs.CONFIGS + cfgs.FSDP_CONFIGS + tuple(c for c in torchft_configs() if c not in cfgs.CONFIGS)
    bad = [c for c in set(configs + streaming_configs) if c not in known]
    if bad:
        raise ValueError(f"configs: unknown {bad}; allowed: {', '.join(known)}")
    parts = set(only or (DEFAULT_PARTS + ("fsdp_time_to_loss",) if smoke else DEFAULT_PARTS))
    unknown = parts - set(PARTS)
    if unknown:
        raise ValueError(f"only: unknown part(s) {sorted(unknown)}; allowed: {', '.join(PARTS)}")
    runs: list[RunSpec] = []

    if smoke:  # validation every step's worth of tokens in every part (H = P = 4 for streaming: see there)
        bw = Workload(model_size="tiny", seq_len=32, micro_batch=2, grad_accum=2, steps=3, warmup_steps=1,
                      eval_batches=2, eval_every_tokens=SMOKE_TOKENS_PER_STEP, streaming_sync_every=4)
        bw_configs = [c for c in configs if c in ("zero1", "acco_adaptive")] or configs[:2]
        bw_rates = list(rates) if rates else [None]
        slow_cfgs = [c for c in bw_configs if c != "zero1"] or bw_configs[:1]
        slow_wl = small_wl = bw
        root = False  # a CPU quota would slow the throttled host's imports too: use the delay fallback
        # 10x the full sweep's: on a loaded 2-core machine the other host's micro-batch can take 50 ms
        delay_ms = 200
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
        delay_ms = 20

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
            slow = dataclasses.replace(wl, compute_delay_ms=f"0,{delay_ms}")
            note = "-".join(filter(None, [suffix, "delay"]))
        for c in cfg_list:
            runs.append(RunSpec(part, c, slow, cpu_quota=quota, cpus=_pins(2, pin), note=note))
        runs.append(RunSpec("alone" + suffix, "zero1", slow, hosts=1, cpus=_pins(1, pin, 0),
                            note="-".join(filter(None, [suffix, "host0"]))))
        if root:
            runs.append(RunSpec("alone" + suffix, "zero1", slow, hosts=1, cpu_quota=((0, 50.0),),
                                cpus=_pins(1, pin, 1), note="-".join(filter(None, [suffix, "host1"]))))
        else:
            runs.append(RunSpec("alone" + suffix, "zero1", dataclasses.replace(slow, compute_delay_ms=str(delay_ms)),
                                hosts=1, cpus=_pins(1, pin, 1), note="-".join(filter(None, [suffix, "host1"]))))
    if "memory" in parts and memory_wl is not None:
        for c in configs:
            runs.append(RunSpec("memory", c, memory_wl, cpus=_pins(2, pin)))
    if "convergence" in parts and conv is not None:
        for c in [c for c in ("zero1", "acco_fixed", "acco_adaptive", "dpu") if c in configs]:
            runs.append(RunSpec("convergence", c, conv, cpus=_pins(2, pin)))
    if "streaming" in parts:
        runs.extend(_streaming_runs(smoke, streaming_configs, rates, steps, netns, pin, bw))
    if "time_to_loss" in parts:
        runs.extend(_time_to_loss_runs(smoke, only_configs, rates, steps, netns, pin, bw))
    if parts & {"time_to_loss_real", "time_to_loss_real_slow_host"}:
        runs.extend(_real_compute_runs(smoke, only_configs, rates, steps, netns, root, pin, parts))
    if parts & {"fsdp", "fsdp_slow_host"}:
        runs.extend(_fsdp_runs(smoke, only_configs, rates, steps, netns, root, pin, parts))
    if "fsdp_time_to_loss" in parts:
        runs.extend(_fsdp_time_to_loss_runs(smoke, only_configs, rates, steps, netns, pin))
    notes = []
    if parts & set(LONG_PARTS):  # benchmarks.protocol.plans: a decayed rate over a long budget, each bed unshaped too
        if smoke:
            raise ValueError(f"only: the long parts ({', '.join(sorted(parts & set(LONG_PARTS)))}) run in sweep "
                             "'full' (--steps makes them short)")
        more, notes = long_runs(parts, only_configs, rates, steps, netns, root, pin)
        runs.extend(more)
        timeout = max(timeout, LONG_TIMEOUT_S)
    if smoke:
        runs = share_runs(runs)
    if mtu is not None:
        if not netns:
            raise ValueError(f"mtu: got {mtu}; an MTU needs network namespaces (this run is on loopback)")
        runs = [dataclasses.replace(r, mtu=mtu) for r in runs]
    if delay is not None:
        if not netns or not parse_delay(delay):
            raise ValueError(f"delay: got {delay!r}; allowed: a positive latency such as 25ms, with network "
                             "namespaces" + ("" if netns else " (this run is on loopback)"))
        runs = [dataclasses.replace(r, delay=delay) for r in runs]
    if seed is not None:
        if seed < 0:
            raise ValueError(f"seed: got {seed}; allowed: an integer >= 0")
        runs = [dataclasses.replace(r, workload=dataclasses.replace(r.workload, seed=seed)) for r in runs]
    desc = f"sweep {name}: {len(runs)} runs, " + ("network namespaces" if netns else
                                                   "loopback (no namespaces: unshaped only)")
    desc += f", MTU {mtu}" if mtu else ""
    desc += f", {delay} one way" if delay else ""
    desc += f", seed {seed}" if seed is not None else ""
    desc += ", one launch per link (a forked process per run)" if smoke else ""
    desc += "".join(f"; {n}" for n in notes)
    return Sweep(name, desc, runs, timeout_s=timeout, shared_launches=smoke)


SWEEP_NAMES = ("smoke", "full")
LONG_TIMEOUT_S = 2400.0
"""A long part's run may take this long: sync fp32's 100 steps at 25 Mbit/s alone take about 11 minutes."""
SMOKE_TOKENS_PER_STEP = 2 * 2 * 32 * 2
"""Micro-batch x accumulation x sequence x 2 hosts: the smoke workload's tokens per optimizer step."""


def _as_run(spec: RunSpec) -> tuple:
    """What a stock (constant-batch) run does: its cluster, config, and workload with the budget in steps and
    the knobs only ds_acco reads (adaptive cap, streaming period) dropped."""
    wl = spec.workload
    per_step = wl.micro_batch * wl.grad_accum * wl.seq_len * spec.hosts
    steps = min(wl.steps, -(-wl.max_tokens // per_step)) if wl.max_tokens else wl.steps
    wl = dataclasses.replace(wl, steps=steps, max_tokens=0, max_micro_batches_per_round=None,
                             streaming_sync_every=None)
    return spec.config, spec.hosts, spec.rate, spec.cpu_quota, spec.cpus, spec.note, spec.mtu, spec.delay, wl


def share_runs(runs: list[RunSpec]) -> list[RunSpec]:
    """One run where parts ask for the same one: a stock config whose runs in several parts would train the same
    steps on the same tokens, validating at the same points, on the same cluster (the smoke sweep's ZeRO-1 run
    of bandwidth, streaming and time to loss). The run kept is the one with a token budget (time to loss reads
    it); its row is repeated for the others' parts (:attr:`RunSpec.also`)."""
    same: dict = {}
    for spec in runs:
        same.setdefault(_as_run(spec) if spec.config in cfgs.STOCK else spec.run_id, []).append(spec)
    out = []
    for group in same.values():
        primary = next((s for s in group if s.workload.max_tokens), group[0])
        out.append(dataclasses.replace(primary, also=tuple(s.scenario for s in group if s is not primary)))
    return out


def _streaming_runs(smoke: bool, configs: Sequence[str], rates: Optional[Sequence[str]], steps: Optional[int],
                    netns: bool, pin: bool, smoke_wl: Workload) -> list[RunSpec]:
    """Streaming DiLoCo against ZeRO-1 (fp32 and bf16) and acco on one slow link, with loss curves.

    Every config sees the same tokens per optimizer (inner) step; the tiny model's four
    layers make four fragments (benchmarks.sweep.configs.STREAMING_BLOCK).
    """
    wanted = [c for c in cfgs.STREAMING_COMPARISON if c in configs]
    if smoke:  # H = P = 4: a fragment round at every step
        return [RunSpec("streaming", c, smoke_wl, cpus=_pins(2, pin)) for c in wanted
                if c in ("zero1", "streaming_int8")]
    wl = Workload(model_size="tiny", seq_len=128, micro_batch=4, grad_accum=4, steps=steps or 200, warmup_steps=2,
                  compute_delay_ms="30", eval_every=25, eval_batches=16)
    rate = (list(rates) if rates else ["25mbit"])[0] if netns else None
    return [RunSpec("streaming", c, wl, rate=rate, cpus=_pins(2, pin)) for c in wanted]


def _time_to_loss_runs(smoke: bool, configs: Optional[Sequence[str]], rates: Optional[Sequence[str]],
                       steps: Optional[int], netns: bool, pin: bool, smoke_wl: Workload) -> list[RunSpec]:
    """Every config trains the same token budget on the same link; see :mod:`benchmarks.report.time_to_loss`.

    On the slow links (25 and 10 Mbit/s) every config of :data:`~benchmarks.sweep.configs.TIME_TO_LOSS`
    runs; on the fast ones the ones whose rounds can matter there (ZeRO-1 fp32/bf16, sync low-bit,
    acco adaptive and both low-bit acco policies), to keep the part under an hour.
    """
    if smoke:  # a budget of 3 steps' tokens
        wl = dataclasses.replace(smoke_wl, steps=1000, max_tokens=3 * SMOKE_TOKENS_PER_STEP,
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


REAL_COMPUTE = ("zero1", "sync", "sync_lowbit", "sync_lowbit_half", "acco_lowbit_fixed", "acco_lowbit_adaptive",
                "auto_lowbit", "streaming_int8")
"""The configs of the real-compute time-to-loss bed (one host at half speed: all but zero1 and streaming)."""


def _real_compute_runs(smoke: bool, configs: Optional[Sequence[str]], rates: Optional[Sequence[str]],
                       steps: Optional[int], netns: bool, root: bool, pin: bool, parts: set) -> list[RunSpec]:
    """Time to loss with real compute: no sleep, the 3.3 M-parameter GPT, so the communication thread's CPU
    work (int8 quantisation, sums, the shard step) competes with compute for each host's one core, as on a
    CPU cluster. At 100 Mbit/s a low-bit round (3.2 MiB) takes about a third of a step's compute; at 25
    Mbit/s more than the whole of it. Run ids end in ``-real`` (``-real-h1q50``: host 1 at half speed), so
    :mod:`benchmarks.report.repeats` keeps the beds apart; the target is ZeRO-1's final validation loss
    (``sync``'s where ZeRO-1 did not run: ds_acco sync reproduces ZeRO-1 step for step)."""
    nominal_steps = steps or 45
    if smoke:
        wl = Workload(model_size="tiny", seq_len=32, micro_batch=2, grad_accum=2, steps=1000, warmup_steps=1,
                      eval_batches=2, max_tokens=3 * 2 * 2 * 32 * 2, eval_every_tokens=2 * 2 * 32 * 2)
        return [RunSpec("time_to_loss", c, wl, cpus=_pins(2, pin), note="real")
                for c in (configs or ("sync", "auto_lowbit"))]
    nominal = 8 * 4 * 128 * 2
    wl = Workload(model_size="small", seq_len=128, micro_batch=8, grad_accum=4, steps=100_000, warmup_steps=2,
                  eval_batches=4, max_micro_batches_per_round=8, max_tokens=nominal_steps * nominal,
                  eval_every_tokens=5 * nominal)
    runs = []
    for rate in (list(rates) if rates else ["100mbit", "25mbit"]):
        if rate is not None and parse_rate(rate) is not None and not netns:
            continue
        if "time_to_loss_real" in parts:
            runs.extend(RunSpec("time_to_loss", c, wl, rate=rate, cpus=_pins(2, pin), note="real")
                        for c in (configs or REAL_COMPUTE))
        if "time_to_loss_real_slow_host" in parts:
            slow = wl if root else dataclasses.replace(wl, compute_delay_ms="0,250")
            quota = ((1, 50.0),) if root else ()
            wanted = configs or [c for c in REAL_COMPUTE if c not in ("zero1", "streaming_int8")]
            runs.extend(RunSpec("time_to_loss", c, slow, rate=rate, cpu_quota=quota, cpus=_pins(2, pin),
                                note="real" if root else "real-delay") for c in wanted)
    return runs


def _fsdp_runs(smoke: bool, configs: Optional[Sequence[str]], rates: Optional[Sequence[str]], steps: Optional[int],
               netns: bool, root: bool, pin: bool, parts: set) -> list[RunSpec]:
    """The FSDP2 front end against stock FSDP2: every config on every link (part ``fsdp``), and one host at
    half speed on the unshaped link with no sleep (part ``fsdp_slow_host``)."""
    wanted = [c for c in (configs or cfgs.FSDP_CONFIGS) if c in cfgs.FSDP_CONFIGS]
    if smoke:
        wl = Workload(model_size="tiny", seq_len=32, micro_batch=2, grad_accum=2, steps=6, warmup_steps=2,
                      eval_every=3, eval_batches=2, frontend="fsdp")  # past the steady-state window's first step
        return [RunSpec("fsdp", c, wl, cpus=_pins(2, pin)) for c in wanted if c in ("fsdp_stock", "fsdp_acco_adaptive")]
    wl = Workload(model_size="tiny", seq_len=128, micro_batch=4, grad_accum=4, steps=steps or 16, warmup_steps=2,
                  compute_delay_ms="30", eval_every=4, eval_batches=4, frontend="fsdp")
    runs = []
    if "fsdp" in parts:
        for rate in (list(rates) if rates else [None, "100mbit", "25mbit", "10mbit"]):
            if rate is not None and parse_rate(rate) is not None and not netns:
                continue
            runs.extend(RunSpec("fsdp", c, wl, rate=rate, cpus=_pins(2, pin)) for c in wanted)
    if "fsdp_slow_host" in parts:
        slow = dataclasses.replace(wl, compute_delay_ms="0" if root else "0,20")
        quota = ((1, 50.0),) if root else ()
        runs.extend(RunSpec("fsdp_slow_host", c, slow, cpu_quota=quota, cpus=_pins(2, pin),
                            note="" if root else "delay") for c in wanted)
    return runs


def _fsdp_time_to_loss_runs(smoke: bool, configs: Optional[Sequence[str]], rates: Optional[Sequence[str]],
                            steps: Optional[int], netns: bool, pin: bool) -> list[RunSpec]:
    """Time to a loss against stock FSDP2 with the DeepSpeed protocol: the part ``fsdp``'s bed and workload, a token
    budget (the adaptive policy's commits hold more micro-batches), the learning rate decayed over its nominal
    steps, a validation every eighth of it (75% is a validation point). Read by
    :func:`benchmarks.report.fsdp.ttl_collect`."""
    smoke_configs = ("fsdp_stock", "fsdp_acco_adaptive_lowbit")
    wanted = [c for c in (configs or (smoke_configs if smoke else cfgs.FSDP_TIME_TO_LOSS)) if c in cfgs.FSDP_CONFIGS]
    nominal_steps = 6 if smoke else (steps or FSDP_TTL_STEPS)  # smoke: past the steady-state window's first step
    # smoke: adaptive commits at most a nominal step (G = 2 a rank), so the 6 validations fall however slow a round
    per_step = (2 * 2 * 32 if smoke else 4 * 4 * 128) * 2  # micro-batch x accumulation x seq x 2 hosts
    wl = Workload(model_size="tiny", seq_len=32 if smoke else 128, micro_batch=2 if smoke else 4,
                  grad_accum=2 if smoke else 4, steps=100_000, warmup_steps=2, eval_batches=2 if smoke else 8,
                  compute_delay_ms="0" if smoke else "30", frontend="fsdp", max_tokens=nominal_steps * per_step,
                  eval_every_tokens=max(1, nominal_steps // 8) * per_step, lr_schedule="decay",
                  lr_total_steps=nominal_steps, max_micro_batches_per_round=2 if smoke else None)
    runs = []
    for rate in ([None] if smoke else (list(rates) if rates else ["100mbit", "25mbit"])):
        if rate is not None and parse_rate(rate) is not None and not netns:
            continue
        runs.extend(RunSpec("fsdp_time_to_loss", c, wl, rate=rate, cpus=_pins(2, pin)) for c in wanted)
    return runs


FSDP_TTL_STEPS = 64
"""Nominal steps of the FSDP time-to-loss budget (a multiple of 8: validations at every eighth)."""
PARTS = ("bandwidth", "slow_host", "slow_host_small", "memory", "convergence", "streaming", "time_to_loss",
         "time_to_loss_real", "time_to_loss_real_slow_host", "fsdp", "fsdp_slow_host", "fsdp_time_to_loss") + LONG_PARTS
DEFAULT_PARTS = ("bandwidth", "slow_host", "memory", "convergence", "streaming", "time_to_loss")
