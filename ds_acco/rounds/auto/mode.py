"""``mode: "auto"``, the engine's side: the step timer, when a choice is due, and applying the choice.

What auto chooses and why (the model of a step, the candidates, their prices to a loss) is
:mod:`ds_acco.rounds.auto.choice`; this module feeds it this job's figures (measured on the engine's clock),
the gradient noise scale (:mod:`ds_acco.rounds.auto.noise_scale`) and acco's delay penalty now
(:meth:`AutoMode.penalty`), and hands the engine what it chose as a value (:class:`Decision`), which the engine
applies at the boundary the choice was made for.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ds_acco.config import AccoConfig
from ds_acco.config.names import Kind, Policy
from ds_acco.telemetry.records import DRAIN_STAGE, device_compute_s

from .choice import ACCO, BATCH_SCALE_BOUNDS, FIGURES, HALF, STREAMING, SYNC, choose, percent
from .noise_scale import NoiseScale

logger = logging.getLogger("ds_acco")

_WINDOW = 3  # medians of the last few samples: one slow step (a checkpoint, a GC pause) does not decide
CONFIRM_AFTER = _WINDOW + 2
"""Commits after a switch into a candidate this job has not run yet until auto chooses again, on that candidate's
measured figures, rather than ``check_every`` steps later: the switch was priced on a prediction (before acco has run,
on a CPU without the compute a round in flight takes from a micro-batch: x1.2-1.8 on the real-compute bed), and a
wrong one would hold for ``check_every`` steps (on real compute at 100 Mbit/s the first choice's acco adaptive steps
left the job about ten steps behind sync at half the batch for the rest of the run). Two more than the timer's window:
the first commit after a switch starts its clock and the next ``_WINDOW`` fill it. Once per candidate: after that
every candidate's figures come from a run of it (or a model calibrated on one), and a second early look could flap."""


class StepTimer:
    """This rank's figures, fed by the engine at every swap (training thread only); ``clock`` stamps the ends of
    micro-batches (the engine's)."""

    def __init__(self, G: int, world_size: int, clock: Callable[[], float] = time.perf_counter):
        self.per_step = G * world_size
        self._clock = clock
        self.compute = {SYNC: deque(maxlen=_WINDOW), ACCO: deque(maxlen=_WINDOW)}
        self.rounds, self.steps, self.batches = (deque(maxlen=_WINDOW) for _ in range(3))
        self.wire_factor = 0.0
        """The module docstring's wire factor (0: not measured): measured across a switch (the old mode's last
        window against the new mode's first), then kept: a link that changes later moves both modes' rounds alike."""
        self._across: Optional[float] = None
        """The old mode's median round just before a switch, until the new mode's first window fills."""
        self.in_flight_factor = 0.0
        """Compute per micro-batch with a round in flight over without (0: not measured), measured across a switch
        as the wire factor is, then applied to the running mode's compute to give the other mode's. The other
        mode's own window is as old as its last run: on the slow-host bed, compute that slowed while half-batch
        sync ran (490 -> 610 ms a micro-batch) left acco priced at its compute of 150 steps before, and auto
        switched into acco fixed at half the batch, predicted faster than it then was."""
        self._across_compute: Optional[float] = None
        self._fresh = 0  # compute samples of the running mode since it started running
        self._mode = SYNC
        self._mb_since_swap = 0
        self._skip = 0
        self._first: Optional[list] = []
        """The job's first interval: the ends of its micro-batches (None once it is over). Its first micro-batch
        holds start-up (first forward, allocations; +13% on the real-compute bed), so that interval's compute is
        timed from the end of the first micro-batch to the end of the last."""
        self._last_commit: Optional[tuple[float, int]] = None
        self._cold: Optional[bool] = None
        """True while the job's first round is the only one in the window (None before it ends). That round sets up
        what later ones reuse (NCCL builds its connections lazily; on a link with latency TCP starts slow and the
        pacer's pieces start small: 1.91 s against 0.55-0.70 s for the next rounds at 100 Mbit/s, 25 ms one way),
        so it stands for the rounds only until a second one ends. Read as a round, it kept auto's first look in
        sync for ``check_every`` steps."""

    def micro_batch(self) -> None:
        self._mb_since_swap += 1
        if self._first is not None:
            self._first.append(self._clock())

    def enter(self, mode: str) -> None:
        """A new mode (or acco policy) runs from now: its round and step figures start afresh (not its compute;
        the wire factor is measured across a change of mode only)."""
        if self.rounds and mode != self._mode:
            self._across = statistics.median(self.rounds)
        if mode != self._mode:
            fresh = list(self.compute[self._mode])[-self._fresh:] if self._fresh else []
            self._across_compute = statistics.median(fresh) if fresh else None  # (the first switch: 1-2 samples)
            self._fresh = 0
        self._mode = mode
        self._cold = False
        for window in (self.rounds, self.steps, self.batches):
            window.clear()
        self._skip = 1
        self._last_commit = None

    def swap(self, *, compute_s: float, round_s: float, committed: Optional[int], now: float) -> None:
        """One swap: ``compute_s`` since the previous swap; ``committed`` is the total of micro-batches
        committed so far when this swap was a commit (None for an estimate)."""
        mbs, self._mb_since_swap = self._mb_since_swap, 0
        if self._first is not None:
            ends, self._first = self._first, None
            mbs, compute_s = len(ends) - 1, (ends[-1] - ends[0] if ends else 0.0)
        if self._skip:
            # a swap without micro-batches is the old mode's last round, waited for at the switch: the skip is for
            # the new mode's first interval (leaving acco on the slow-host bed, that commit took it, and sync's
            # first two steps, 20% slower than the rest, read an in-flight factor of 1.04 where it was 1.26)
            if mbs > 0:
                self._skip -= 1
        else:
            if mbs > 0:
                self.compute[self._mode].append(compute_s / mbs)
                self._fresh += 1
                self._measure_in_flight_factor()
            if self._cold:
                self.rounds.clear()
            self._cold = self._cold is None
            self.rounds.append(round_s)
            if self._across is not None and len(self.rounds) == _WINDOW:
                self.wire_factor = self._acco_over_sync(self._across, self.rounds) or self.wire_factor
                self._across = None
        if committed is None:
            return
        if self._last_commit is not None:
            t, done = self._last_commit
            if committed > done:
                self.steps.append((now - t) * self.per_step / (committed - done))
                self.batches.append(committed - done)
        self._last_commit = (now, committed)

    def _measure_in_flight_factor(self) -> None:
        """Once the new mode's compute window is its own, the factor across the switch (the old mode's last window
        against it: minutes apart at most, where the two windows' own ages may differ by the whole run)."""
        if self._across_compute is None or self._fresh != _WINDOW:
            return
        self.in_flight_factor = self._acco_over_sync(self._across_compute, self.compute[self._mode]) \
            or self.in_flight_factor
        self._across_compute = None

    def _acco_over_sync(self, before: float, window) -> float:
        """A figure in acco over the same in sync, across the switch into the running mode: ``before`` the old
        mode's median, ``window`` the new mode's first (0 where either is not positive)."""
        now_s = statistics.median(window)
        if before <= 0 or now_s <= 0:
            return 0.0
        return now_s / before if self._mode == ACCO else before / now_s

    def first_compute(self) -> Optional[float]:
        """Seconds per micro-batch in the job's first interval so far, its first micro-batch left out (None
        before two micro-batches ended, or once the interval is over)."""
        ends = self._first
        return (ends[-1] - ends[0]) / (len(ends) - 1) if ends and len(ends) > 1 else None

    def batch(self) -> Optional[float]:
        """Micro-batches committed per step in the running mode (the same on every rank: counts are gathered)."""
        return float(statistics.median(self.batches)) if self.batches else None

    def local(self) -> list[int]:
        def us(xs) -> int:
            return int(round(statistics.median(xs) * 1e6)) if xs else 0
        sync_c, acco_c, k = us(self.compute[SYNC]), us(self.compute[ACCO]), self.in_flight_factor
        if k > 0 and self._fresh >= _WINDOW:  # the other mode's compute follows the running mode's
            if self._mode == ACCO:
                sync_c = int(round(acco_c / k))
            else:
                acco_c = int(round(sync_c * k))
        return [sync_c, acco_c, us(self.rounds), us(self.steps), int(round(self.wire_factor * 1000))]


@dataclass(frozen=True)
class Decision:
    """What auto chose at a step: the mode to run from there, acco's policy, and the micro-batches per worker a
    step commits (0: ``G``; ``G/2`` at half the accumulation: sync, acco fixed, or streaming's inner steps)."""

    mode: str
    policy: Optional[str]
    step_quota: int

    def apply(self, state) -> str:
        """Set it on a ``RoundState`` (streaming keeps acco's policy; the phase reads the quota when it is built)."""
        state.mode = self.mode
        if self.mode == ACCO:
            state.policy = self.policy
        state.step_quota = self.step_quota
        return self.mode


class AutoMode:
    """The engine's side of ``mode: "auto"``: its timer, the noise scale, when a choice is due, the choices made."""

    def __init__(self, config: AccoConfig, G: int, world_size: int, rank: int, estimate_fraction: float = 1.0,
                 commit_bytes: int = 0, clock: Callable[[], float] = time.perf_counter):
        self.config, self.G, self.rank = config, G, rank
        self.estimate_fraction = estimate_fraction
        """An estimate round's bytes over a commit's: below 1 with ``acco.estimate_quantization: "int4"``."""
        self.commit_bytes = commit_bytes
        """Bytes this rank sends in a commit round: with the probed link rate, a round's time before one ran."""
        self.probe = None
        """The link probe running behind step 1's compute (:meth:`look_first`), then None."""
        self.timer = StepTimer(G, world_size, clock)
        self.noise = NoiseScale() if config.policy != Policy.FIXED else None
        """The gradient noise scale, where a policy with smaller batches is a candidate (None otherwise)."""
        self.first = max(config.warmup_steps, config.auto.measure_steps)
        self.early = config.auto.measure_steps if config.auto.streaming and config.auto.measure_steps < self.first \
            else None
        """With ``auto.streaming``, a look after ``measure_steps`` inside the warm-up: the warm-up keeps acco's
        one-step delay away from the first steps, but streaming has none and may start at once where no gradient
        round hides. Such a look switches to streaming or leaves the job in sync until the first choice. Before the
        noise scale has had its two rounds, the look takes it as small (the bench measured 0-3 micro-batches against
        batches of 4-16): priced per sample, adaptive's large commits on a slow link would look free and no look
        could ever start streaming."""
        self.batch_scale: dict[str, float] = {}
        """Per acco policy, its measured micro-batches per commit over the model's at the last choice made while it
        ran (:func:`ds_acco.rounds.auto.choice.choose`'s ``batch_scale``; not checkpointed: a resume measures again)."""
        self.choices: list[dict] = []
        """Every choice's figures, in order (for telemetry, tests and benchmarks)."""
        self._retry = False
        self._ran: set = set()
        """The candidates this job has run (mode, acco policy or half accumulation): a switch into another one is
        checked again after :data:`CONFIRM_AFTER` commits."""
        self._confirm: Optional[int] = None
        self._peak_lr = 0.0
        self.streaming_refused = False
        """Set when a switch to streaming found too little memory on some rank: streaming is not offered again."""

    def look_first(self) -> bool:
        """Whether to probe the link behind step 1's compute and look before the first round
        (:class:`ds_acco.rounds.schedules.SyncSchedule`): with ``auto.streaming`` only (the look
        starts streaming or nothing) and ``G >= 2`` (compute is timed from the end of the first micro-batch)."""
        return self.config.auto.streaming and self.G >= 2 and not self.streaming_refused

    def first_figures(self, rate: Optional[float]) -> list[int]:
        """This rank's figures before the first round (:data:`FIGURES`): step 1's compute per micro-batch and a
        commit round's bytes at the probed ``rate`` (zeros without one: the link was too fast to time; a choice
        then waits for measured figures). The rate is the agreed pieces' own, headers and per-call costs in; a
        round's quantisation and sums are left out (at 25 Mbit/s: 1.19-1.32 s for rounds of 1.24 s; BENCHMARKS.md)."""
        c = self.timer.first_compute()
        if not rate or not c:
            return [0] * FIGURES
        return [int(round(c * 1e6)), 0, int(round(self.commit_bytes / rate * 1e6)), 0, 0]

    def due(self, step: int) -> bool:
        """Whether the step that ends with commit ``step`` is one where the mode is chosen: on schedule, or
        the step after one whose figures did not suffice (a resume just before a check has not measured a step
        yet), rather than ``check_every`` steps later; and :data:`CONFIRM_AFTER` commits after a switch into a candidate
        not run before."""
        return self._retry or step == self.early or step == self._confirm or \
            (step >= self.first and (step - self.first) % self.config.auto.check_every == 0)

    def gathered(self, submit, coll, device, figures: Optional[list[int]] = None) -> list:
        """Every rank's figures now (``figures``, by default the timer's), one row per rank, in one tiny all-gather on
        the communication thread: a choice in sync comes after its round (see the module docstring)."""
        local = torch.tensor(self.timer.local() if figures is None else figures, dtype=torch.int64, device=device)
        return submit("auto figures", lambda handle: coll.all_gather_small(local).cpu().tolist()).wait()

    def after_round(self, record, outcome, *, now: float, committed: Optional[int]) -> None:
        """Feed one swapped-in round: its times to the timer, its norms to the noise scale."""
        # the count all-gather is where a round waits for the slowest peer, and on a GPU the round first waits for
        # the device to finish the micro-batches: neither is the link's time; the device's share of the training
        # thread's wait is compute (sync's own, or the in-flight factor would read that share as acco's cost)
        stages = record.stage_s
        wire_s = outcome.round_s - stages.get("count all-gather", 0.0) - stages.get(DRAIN_STAGE, 0.0)
        if record.kind == Kind.ESTIMATE:
            wire_s /= self.estimate_fraction  # the commit round it stands for
        self.timer.swap(compute_s=device_compute_s(record.compute_s, record.waited_s, stages), round_s=wire_s,
                        now=now, committed=committed)
        if self.noise is not None and outcome.noise is not None and not outcome.skipped:
            self.noise.add(outcome.noise[0], outcome.counts, outcome.noise[1])

    def rate_share(self, lr: Optional[float]) -> float:
        """The learning rate over the highest it has been (1 while it climbs or holds, or where no rate is known):
        a step's size now against the one the configured penalty stands for, and the rate a batch is priced at
        (:func:`ds_acco.rounds.auto.choice.samples_to_loss`)."""
        if lr is None or lr != lr or lr < 0:
            return 1.0
        self._peak_lr = max(self._peak_lr, lr)
        return 1.0 if self._peak_lr <= 0 or lr >= self._peak_lr else lr / self._peak_lr

    def penalty(self, lr: Optional[float]) -> tuple[float, str]:
        """Acco's delay penalty now, and how it was taken (for the line): ``acco.auto.acco_step_penalty`` times
        :meth:`rate_share`. The one-step delay applies each update to parameters one step older; what that costs is
        the change of the gradient over one step, which scales with the step's size. So while the rate climbs or
        holds (warm-up, a constant rate) the penalty is the configured one, and as a schedule decays the rate to a
        fraction of its peak the penalty falls with it (None: no rate known)."""
        base, factor = self.config.auto.acco_step_penalty, self.rate_share(lr)
        if factor >= 1.0:
            return base, ""
        return base * factor, (f"acco.auto.acco_step_penalty {percent(base)} x the learning rate at {factor:.2f} of "
                               "its peak (the one-step delay costs in proportion to the step)")

    def decision(self, figures: Optional[list], state, step: int, lr: Optional[float] = None) -> Optional[Decision]:
        """The mode (and, under ``policy: "auto"``, the acco policy; in sync, the full or half accumulation) to run
        after ``step``, from every rank's ``figures`` and the round ``state`` running now; None while the figures do not
        suffice (or inside the warm-up, where only streaming may start). Logs the figures and starts the timer's figures
        afresh for a new mode; ``state`` is read, never changed. ``lr``: the learning rate now (:meth:`penalty`)."""
        running = _candidate(state.mode, state.policy, state.step_quota)[1]
        summary = self.noise.summary() if self.noise else None
        noise, note = (summary["value"], _noise_note(summary)) if summary else (None, "")
        assumed = noise is None and self.noise is not None and step < self.first
        if assumed:  # a look inside the warm-up, before two rounds measured it: its small limit (see self.early)
            noise = 0.0
        penalty, penalty_note = self.penalty(lr)
        choice = choose(figures, state.mode, self.config, self.G, step, policy=running, noise=noise,
                        batch=self.timer.batch(), estimate_fraction=self.estimate_fraction,
                        streaming=self.config.auto.streaming and not self.streaming_refused,
                        noise_measured=not assumed, penalty=penalty, penalty_note=penalty_note,
                        noise_note=note, batch_scale=self.batch_scale, rate=self.rate_share(lr)) if figures else None
        self._retry = choice is None and step > 0  # (the look before the first round is not retried)
        if choice is None:
            return None
        self._calibrate_batch(running if state.mode == ACCO and running != HALF else None,
                              choice.figures["predicted_batches"])
        if step < self.first and choice.mode != STREAMING:  # a look inside the warm-up: sync until it ends
            logger.debug("%s (inside the warm-up: only streaming may start before step %d)", choice.line, self.first)
            return None
        self.choices.append(choice.figures)
        if self.rank == 0:
            logger.info(choice.line)
        quota = self.G // 2 if choice.half else 0
        self._ran.add(_candidate(state.mode, state.policy, state.step_quota))
        new = _candidate(choice.mode, choice.policy, quota)
        if choice.mode != STREAMING and new != _candidate(state.mode, state.policy, state.step_quota):
            self.timer.enter(choice.mode)  # (streaming's steps are not timed: auto does not choose after it)
            every = self.config.auto.check_every
            if new not in self._ran and CONFIRM_AFTER < every - (step - self.first) % every:  # before the next check
                self._confirm = step + CONFIRM_AFTER
        return Decision(choice.mode, choice.policy, quota)

    def _calibrate_batch(self, policy: Optional[str], predicted: dict) -> None:
        """Keep the running acco policy's measured commits over the model's (see ``batch_scale``)."""
        batch, model = self.timer.batch(), predicted.get(policy)
        if batch and model:
            low, high = BATCH_SCALE_BOUNDS
            self.batch_scale[policy] = min(max(batch / model, low), high)

    def start_probe(self, submit, coll) -> None:
        """Probe the link on the communication thread, behind the rest of step 1's compute: the look reads it."""
        self.probe = submit("link probe", lambda handle: coll.probe_link())

    def wait_probe(self) -> Optional[float]:
        """The link probe's rate, once it is over (None where none ran); training-thread collectives come after it."""
        if self.probe is None:
            return None
        handle, self.probe = self.probe, None
        return handle.wait()

    def refuse_streaming(self) -> None:  # some rank has not the memory streaming needs: sync, and never again
        self.streaming_refused = True
        self.timer.enter(SYNC)


def _candidate(mode: str, policy: Optional[str], step_quota: int) -> tuple:
    """What a state runs, as a candidate of :func:`ds_acco.rounds.auto.choice.choose` (streaming: its own)."""
    if mode == STREAMING:
        return (mode, None)
    half = HALF if step_quota else None
    return (mode, half or policy) if mode == ACCO else (mode, half)


def _noise_note(summary: dict) -> str:
    """How the noise scale was taken, for the line (:mod:`ds_acco.rounds.auto.noise_scale`)."""
    if summary["value"] == float("inf"):
        return ""
    interval = f"{summary['low']:.2g}-{summary['high']:.2g} over {summary['rounds']} rounds"
    if summary["resolved"]:
        return f"between {interval}"
    return f"measured {summary['measured']:.2g}, not resolved from zero ({interval}): priced at the upper end"
