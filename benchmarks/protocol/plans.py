"""The long-run protocol's parts: a decayed learning rate over a long budget, every honest alternative, each
bed's configs on an unshaped link as well (the link's cost), and 2, 4 and 8 workers on a light sleep bed.

Why these parts: every earlier time-to-loss run was 45-100 steps at a constant rate after warm-up, where ACCO's
one-step delay costs most, on 2 workers. Here the rate warms up and decays to the end of the budget as in real
training, so whether the delay penalty fades shows; and the same configs run unshaped, so a config's seconds on
the shaped link over its seconds unshaped say how much of the link it hides. One part per bed, so that a bed and
a seed make one sweep folder (:mod:`benchmarks.protocol.driver` runs them all):

=========================  ======================================================================================
``long_real``              real compute (the 3.3 M-parameter GPT, one core per host), 100 nominal steps;
                           unshaped, 100 and 25 Mbit/s (the unshaped runs serve both shaped links)
``long_real_slow_host``    the same with host 1 at half speed (a 50% CPU quota; without root a longer sleep);
                           unshaped and 100 Mbit/s
``long_sleep``             the sleep bed (tiny GPT, 30 ms sleep per micro-batch), 300 nominal steps; unshaped
                           and 100 Mbit/s
``workers_sleep_<N>``      the light sleep bed (:func:`sleep_workload` ``light``) at N = 2, 4 and 8 hosts, 300 steps
``workers_sleep_4_slow``   4 hosts, the last at half speed (twice its sleep per micro-batch)
``workers_real_4``         real compute at 4 hosts, only where the machine has a core per host
=========================  ======================================================================================

Why a light bed for the workers: the sleep bed's micro-batch (4 x 128 tokens) takes about 29 ms of CPU beside its
30 ms sleep, so 8 hosts on 2 cores need 4 cores: the 8-host runs measured the cores, not the link (a smoke run: a
step's compute 0.83 s at 8 hosts against 0.47 s at 2 on the same loaded machine). At 2 x 64 tokens a micro-batch
takes about 9 ms of CPU; with an 80 ms sleep 8 hosts use under one core. Workers scale weakly: every worker keeps
the bed's micro-batches per step, so the token budget (and the tokens per nominal step) grow with the hosts while
the nominal steps and the schedule's steps stay the same. Run ids carry the bed in their note (``long-real``,
``long-workers-8h``, ...): :func:`benchmarks.report.repeats.bed_of` and
:mod:`benchmarks.report.long_runs` keep beds apart by it. Every run has the scenario ``time_to_loss``, so the
existing time-to-loss tables and plots read them too.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

from benchmarks.cluster.units import parse_rate
from benchmarks.sweep import configs as cfgs
from benchmarks.sweep.specs import RunSpec, Workload

SCENARIO = "time_to_loss"
LONG = ("zero1", "zero1_overlap", "sync", "sync_lowbit", "sync_lowbit_half", "acco_lowbit_int4_fixed",
        "acco_lowbit_int4_adaptive", "acco_lowbit_int4_fixed_half", "streaming_int8", "streaming_int8_half",
        "auto_lowbit_int4", "auto_lowbit_int4_streaming")
"""Every honest alternative that configs.py holds: stock ZeRO-1 with and without overlap_comm, sync fp32 (the fair
baseline), sync low-bit at the bed's batch and at half of it (about the adaptive policy's commits), acco fixed and
adaptive with the shipped preset's int4 estimates, acco fixed at half the batch (the overlap where the smaller batch
pays), streaming at the bed's batch and at half of it (the batch auto with streaming may run), the two shipped
auto presets."""
WORKERS = ("sync", "sync_lowbit", "acco_lowbit_int4_fixed", "acco_lowbit_int4_adaptive", "auto_lowbit_int4",
           "streaming_int8")
"""The workers comparison's configs: the baseline whose loss is the target, sync low-bit, the overlap at sync's
batch and adaptive, auto, streaming."""
TORCHFT = ("torchft_diloco", "torchft_streaming_diloco", "torchft_diloco_half")
"""The external peer (DiLoCo at half the batch too: the batch auto with streaming may run); they join every bed's
list once configs.py defines them (:func:`torchft_configs`)."""
REAL_STEPS, SLEEP_STEPS = 100, 300
"""Nominal steps of the budgets (the issue's minimum on each bed)."""
SCHEDULE = "decay"
"""WarmupDecayLR: the templates' linear warm-up (10 steps), then linear to 0 at the end of the budget."""
PARTS = ("long_real", "long_real_slow_host", "long_sleep", "workers_sleep_2", "workers_sleep_4", "workers_sleep_8",
         "workers_sleep_4_slow", "workers_real_4")
SLEEP_DELAY_MS = 30
WORKERS_DELAY_MS = 80
"""The light sleep bed's sleep per micro-batch: about 10 times its CPU work (see the module's docstring)."""
REAL_SLOW_DELAY_MS = 250
"""Without root (no CPU quota), host 1 of the real bed sleeps this long per micro-batch instead, as
:func:`benchmarks.sweep.plans._real_compute_runs` does."""


def torchft_configs() -> tuple:
    """The torchft configs configs.py defines now (in ``CONFIGS`` or a ``TORCHFT_CONFIGS`` tuple)."""
    known = tuple(cfgs.CONFIGS) + tuple(getattr(cfgs, "TORCHFT_CONFIGS", ()))
    return tuple(c for c in TORCHFT if c in known)


def _pins(hosts: int, pin: bool) -> tuple:
    n = os.cpu_count() or 1
    return tuple((i, (i % n,)) for i in range(hosts)) if pin else ()


def real_workload(hosts: int = 2, steps: Optional[int] = None) -> Workload:
    """The real-compute bed of ``_real_compute_runs`` (8 x 4 micro-batches of 128 tokens per host), its budget
    ``steps`` nominal steps long, the rate decayed over it, 20 validations along it (every 5 nominal steps)."""
    steps = steps or REAL_STEPS
    nominal = 8 * 4 * 128 * hosts
    return Workload(model_size="small", seq_len=128, micro_batch=8, grad_accum=4, steps=100_000, warmup_steps=2,
                    eval_batches=4, max_micro_batches_per_round=8, max_tokens=steps * nominal,
                    eval_every_tokens=max(1, steps // 20) * nominal, lr_schedule=SCHEDULE, lr_total_steps=steps)


def sleep_workload(hosts: int = 2, steps: Optional[int] = None, slow_last: bool = False, light: bool = False
                   ) -> Workload:
    """The sleep bed of ``_time_to_loss_runs`` (tiny GPT, 4 x 4 micro-batches of 128 tokens per host, 30 ms sleep
    each), 30 validations along the budget (every 10 steps). ``light``: the workers' bed, 4 micro-batches of 2 x 64
    tokens with an 80 ms sleep each; ``slow_last``: the last host sleeps twice as long."""
    steps = steps or SLEEP_STEPS
    mb, seq, sleep = (2, 64, WORKERS_DELAY_MS) if light else (4, 128, SLEEP_DELAY_MS)
    nominal = mb * 4 * seq * hosts
    delay = ",".join([str(sleep)] * (hosts - 1) + [str(2 * sleep)]) if slow_last else str(sleep)
    return Workload(model_size="tiny", seq_len=seq, micro_batch=mb, grad_accum=4, steps=100_000, warmup_steps=2,
                    compute_delay_ms=delay, eval_batches=8, max_micro_batches_per_round=16, max_tokens=steps * nominal,
                    eval_every_tokens=max(1, steps // 30) * nominal, lr_schedule=SCHEDULE, lr_total_steps=steps)


def _for_config(wl: Workload, config: str) -> Workload:
    """A torchft config runs examples/train_lm_torchft.py on the same workload."""
    return dataclasses.replace(wl, frontend="torchft") if config in TORCHFT else wl


def long_runs(parts: set, configs: Optional[Sequence[str]], rates: Optional[Sequence[str]], steps: Optional[int],
              netns: bool, root: bool, pin: bool) -> tuple[list[RunSpec], list[str]]:
    """The runs of the long parts among ``parts``, and a note per part this machine cannot run.

    ``rates`` replaces each part's links (``unshaped`` is the unshaped one); without namespaces only unshaped runs
    are possible. ``configs`` replaces each part's configs.
    """
    runs, notes = [], []
    every = list(configs) if configs else list(LONG + torchft_configs())
    few = list(configs) if configs else list(WORKERS)

    def links(default: Sequence[Optional[str]]) -> list[Optional[str]]:
        wanted = [None if r in (None, "unshaped") else r for r in (list(rates) if rates else default)]
        return [r for r in wanted if netns or r is None or parse_rate(r) is None]

    def add(wl: Workload, wanted: list, rate_list: list, hosts: int = 2, quota: tuple = (), note: str = "") -> None:
        for rate in links(rate_list):
            runs.extend(RunSpec(SCENARIO, c, _for_config(wl, c), hosts=hosts, rate=rate, cpu_quota=quota,
                                cpus=_pins(hosts, pin), note=note) for c in wanted)

    if "long_real" in parts:
        add(real_workload(2, steps), every, [None, "100mbit", "25mbit"], note="long-real")
    if "long_real_slow_host" in parts:
        wl = real_workload(2, steps)
        if root:
            add(wl, every, [None, "100mbit"], quota=((1, 50.0),), note="long-real")
        else:
            add(dataclasses.replace(wl, compute_delay_ms=f"0,{REAL_SLOW_DELAY_MS}"), every, [None, "100mbit"],
                note="long-real-delay")
    if "long_sleep" in parts:
        add(sleep_workload(2, steps), every, [None, "100mbit"], note="long-sleep")
    for part, hosts, slow in (("workers_sleep_2", 2, False), ("workers_sleep_4", 4, False),
                              ("workers_sleep_8", 8, False), ("workers_sleep_4_slow", 4, True)):
        if part in parts:
            add(sleep_workload(hosts, steps, slow, light=True), few, [None, "100mbit"], hosts=hosts,
                note=f"long-workers-{hosts}h" + ("-slow" if slow else ""))
    if "workers_real_4" in parts:
        if (os.cpu_count() or 1) < 4:
            notes.append(f"workers_real_4 skipped: 4 hosts need a core each, this machine has {os.cpu_count()}")
        else:
            add(real_workload(4, steps), few, [None, "100mbit"], hosts=4, note="long-real-4h")
    return runs, notes
