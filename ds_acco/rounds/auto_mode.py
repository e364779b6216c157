"""``mode: "auto"``: run ``sync`` or ``acco`` (and with ``policy: "auto"`` fixed or adaptive), whichever the
measurements say reaches a loss sooner.

Why a model of the step, not a trial of each mode: a few steps' loss says nothing about
which mode trains faster, but the time a step takes is measured exactly, and the two
modes' step times follow from the same two figures. With ``c`` the compute of one
micro-batch (the slowest worker's), ``R`` the time of one round on the wire and ``G``
micro-batches per worker per step:

* ``sync`` computes, then communicates: ``G·c + R`` per step;
* ``acco`` (fixed policy) overlaps two rounds of ``G/2`` micro-batches with their
  communication: ``2·max(G/2·c', R)``, where ``c' = k·c`` is the compute of a micro-batch
  while a round is in flight (the communication thread shares the core on a CPU; ``k`` is
  measured once ``acco`` has run, 1 before);
* ``acco`` (adaptive policy) ends a round at the first micro-batch boundary after its
  communication ends, every worker contributing what it computed meanwhile: ``2·T`` per
  ``2·Σ T/c'_r`` micro-batches with ``T = max_r max(c'_r, R + c'_r/2)`` (:data:`LANDING`),
  scaled to ``G`` micro-batches per worker.

The running mode's step is *measured* (wall time between two commits, per ``G·N``
micro-batches committed); only the other mode's is predicted, with the round time scaled by
the *wire factor*: in ``acco`` a round shares the core with compute (its CPU work, ds_acco's
quantisation and sums and the network stack's, competes with the training thread) and takes
longer than the same round in ``sync`` (1.55x on a one-core host at 100 Mbit/s), which the
factor measures across the first switch (1 before). ``acco`` is charged
``auto.acco_step_penalty`` for the extra steps its one-step delay costs to reach the same
loss, and a switch needs a gain of ``auto.switch_margin``. Every rank computes the same choice from the
same integers, so no rank disagrees: in acco the figures ride the count all-gather each round already
makes (:mod:`ds_acco.rounds.round_work`); in sync the choice comes after the step's round, and one tiny
all-gather brings every rank's figures including it (:meth:`AutoMode.gathered`), so the first choice
can come after step 1. When ``R`` exceeds the whole compute of a step, ``acco`` cannot hide it and
``sync`` wins; when ``R`` is tiny, hiding it is not worth the penalty; between the two,
``acco`` wins. Where even the best of them costs :data:`STREAMING_HINT` times a step's bare compute,
``acco.auto.streaming`` switches the job to streaming (:mod:`ds_acco.rounds.streaming_switch`).

With ``policy: "auto"`` both acco policies are candidates. The adaptive policy commits fewer
micro-batches per step, and a smaller batch may buy as much loss per step: each candidate's
time to a loss is its seconds per ``G·N`` micro-batches times ``1 + B/B_noise``, with ``B`` its
micro-batches per committed step and ``B_noise`` the gradient noise scale measured from the
rounds (:mod:`ds_acco.rounds.noise_scale`; per sample alone before it is measured; per committed
step when it measures 0, the model's limit: a larger batch is not free there). While
acco runs, its measured step calibrates the other policy's prediction (the model's error is
shared), and a near tie goes to the fixed policy, which is deterministic. ``policy:
"adaptive"`` prices sync's full batches against adaptive's the same way.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from ds_acco.config import AccoConfig

from .noise_scale import NoiseScale

logger = logging.getLogger("ds_acco")

SYNC, ACCO, STREAMING = "sync", "acco", "streaming"
FIGURES = 5
"""Integers each rank adds to a round's all-gather: µs per micro-batch without and with a round in
flight, µs per round on the wire in the running mode, µs per nominal step measured in the running mode,
and the wire factor in thousandths (0: not measured yet)."""
LANDING = 0.5
"""Where in a micro-batch an adaptive round lands, on average (0: at its end, 1: at its start): the swap waits for
the micro-batch under way. Half, since rounds and micro-batches jitter by more than the gap: with real compute a round
of ``x`` micro-batches committed ``x + 0.5`` within 0.15 (BENCHMARKS.md, "Auto's adaptive prediction"). With sleeps
this undercounts by up to half a micro-batch, until adaptive runs and its committed batch is measured."""
STREAMING_HINT = 1.35
"""Where the best gradient mode costs this many times a step's bare compute (``G`` micro-batches, a full batch, priced
to a loss as the candidates are: delay penalty and batch in), no gradient round hides and streaming, whose fragment
rounds do, is the faster mode: with ``acco.auto.streaming`` the job switches to it, otherwise the line points to it.
Between the ratios where streaming won (1.39-1.79 at 25 Mbit/s) and lost (0.71-1.30 at 100 Mbit/s; BENCHMARKS.md,
"Streaming against auto, four seeds")."""
_WINDOW = 3  # medians of the last few samples: one slow step (a checkpoint, a GC pause) does not decide


@dataclass
class Choice:
    mode: str
    figures: dict
    line: str
    policy: Optional[str] = None
    """The acco policy to run (or the one priced best, when ``mode`` is sync)."""


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
        self._mode = SYNC
        self._mb_since_swap = 0
        self._skip = 0
        self._first: Optional[list] = []
        """The job's first interval: the ends of its micro-batches (None once it is over). Its first micro-batch
        holds start-up (first forward, allocations; +13% on the real-compute bed), so that interval's compute is
        timed from the end of the first micro-batch to the end of the last."""
        self._last_commit: Optional[tuple[float, int]] = None

    def micro_batch(self) -> None:
        self._mb_since_swap += 1
        if self._first is not None:
            self._first.append(self._clock())

    def enter(self, mode: str) -> None:
        """A new mode (or acco policy) runs from now: its round and step figures start afresh (not its compute;
        the wire factor is measured across a change of mode only)."""
        if self.rounds and mode != self._mode:
            self._across = statistics.median(self.rounds)
        self._mode = mode
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
            self._skip -= 1
        else:
            if mbs > 0:
                self.compute[self._mode].append(compute_s / mbs)
            self.rounds.append(round_s)
            if self._across is not None and len(self.rounds) == _WINDOW:
                before, now_s = self._across, statistics.median(self.rounds)
                if before > 0 and now_s > 0:
                    self.wire_factor = now_s / before if self._mode == ACCO else before / now_s
                self._across = None
        if committed is None:
            return
        if self._last_commit is not None:
            t, done = self._last_commit
            if committed > done:
                self.steps.append((now - t) * self.per_step / (committed - done))
                self.batches.append(committed - done)
        self._last_commit = (now, committed)

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
        return [us(self.compute[SYNC]), us(self.compute[ACCO]), us(self.rounds), us(self.steps),
                int(round(self.wire_factor * 1000))]


def choose(figures: Sequence[Sequence[int]], current: str, config: AccoConfig, G: int, step: int,
           policy: Optional[str] = None, noise: Optional[float] = None,
           batch: Optional[float] = None, estimate_fraction: float = 1.0, streaming: bool = False,
           noise_measured: bool = True) -> Optional[Choice]:
    """The mode to run from ``figures`` (one row of :data:`FIGURES` per rank); None while they do not suffice.

    ``policy``: the acco policy running (``current == "acco"``); ``noise``: the gradient noise scale in
    micro-batches (:mod:`ds_acco.rounds.noise_scale`; None: not measured, or ``inf``: batches are then priced per
    sample; 0: below what the rounds resolve, priced per committed step, the model's limit);
    ``batch``: micro-batches per step measured in the running mode (the adaptive policy's varies);
    ``estimate_fraction``: an estimate round's bytes over a commit's (``acco.estimate_quantization``); round
    times are commit rounds' (the timer scales estimates up by it); ``streaming``: ``acco.auto.streaming``, the
    job may switch to streaming where the chosen gradient mode costs :data:`STREAMING_HINT` or more;
    ``noise_measured``: False where ``noise`` is the small-noise limit taken before two rounds measured it."""
    N = len(figures)
    # compute per micro-batch with a round in flight over without, from ranks that measured both
    interference = max((r[1] / r[0] for r in figures if r[0] > 0 and r[1] > 0), default=1.0)
    # a job resumed in acco has no sync figure: its acco one bounds it
    c_sync_s = [(r[0] or r[1]) / 1e6 for r in figures]
    c_acco_s = [(r[1] or r[0] * interference) / 1e6 for r in figures]
    R = max(r[2] for r in figures) / 1e6  # in the running mode
    measured = max(r[3] for r in figures) / 1e6
    wire = max((r[4] for r in figures if len(r) > 4), default=0) / 1e3 or 1.0
    if min(c_sync_s) <= 0 or (measured <= 0 and current != SYNC):
        return None
    if measured <= 0:  # a choice after the first step: one commit, no interval between two yet
        measured = G * max(c_sync_s) + R
    auto, full = config.auto, float(G * N)
    running = (SYNC, None) if current == SYNC else (ACCO, policy or _policies(config)[0])
    # seconds per nominal step (G·N micro-batches) and micro-batches per committed step, for each candidate
    step_s = {(SYNC, None): measured if current == SYNC else G * max(c_sync_s) + R / wire}
    batches = {(SYNC, None): full}
    R_acco = R * wire if current == SYNC else R
    predicted = {p: _predict_acco(c_acco_s, R_acco, G, config, p, estimate_fraction) for p in _policies(config)}
    # in acco, the running policy's measured step calibrates the other's prediction
    calibration = measured / predicted[running[1]][0] if current == ACCO and running[1] in predicted else 1.0
    for p, (t, b) in predicted.items():
        step_s[(ACCO, p)] = measured if (ACCO, p) == running else t * calibration
        batches[(ACCO, p)] = batch if (ACCO, p) == running and batch else b
    priced = noise is not None and noise != float("inf")

    def price(seconds: float, batch: float) -> float:  # to a loss, up to a constant: times the samples a batch needs
        if not priced:
            return seconds
        if noise > 0:
            return seconds * (1.0 + batch / noise)
        return seconds * batch / full  # noise below what the rounds resolve: every batch needs the same steps

    def score(c) -> float:
        return price(step_s[c], batches[c]) * (1.0 + auto.acco_step_penalty if c[0] == ACCO else 1.0)

    best = min(step_s, key=score)
    if best == (ACCO, "adaptive") and (ACCO, "fixed") in step_s and \
            score((ACCO, "fixed")) <= score(best) * (1.0 + auto.switch_margin):
        best = (ACCO, "fixed")  # a near tie goes to the fixed policy: deterministic, and exact to the rules
    chosen = best if score(best) < score(running) * (1.0 - auto.switch_margin) else running
    acco_c = chosen if chosen[0] == ACCO else min((c for c in step_s if c[0] == ACCO), key=score)
    k = max(c_acco_s) / max(c_sync_s)
    ratio = score(chosen) / price(G * max(c_sync_s), full)
    runs = STREAMING if streaming and ratio >= STREAMING_HINT else chosen[0]
    figs = {"step": step, "compute_ms": 1e3 * max(c_sync_s), "in_flight_factor": k, "round_ms": 1e3 * R,
            "wire_factor": wire, "sync_step_ms": 1e3 * step_s[(SYNC, None)], "acco_step_ms": 1e3 * step_s[acco_c],
            "acco_charged_ms": 1e3 * step_s[acco_c] * (1.0 + auto.acco_step_penalty),
            "was": current, "runs": runs, "policy": acco_c[1], "world_size": N,
            "noise_scale": noise, "noise_measured": noise_measured, "streaming_ratio": ratio,
            "candidates": {f"{m} {p}" if p else m: {
                "step_ms": 1e3 * step_s[c], "batch": batches[c], "score_ms": 1e3 * score(c)}
                for c in step_s for m, p in [c]}}
    line = _line(figs, G, current, running, chosen, step_s, batches, score, auto.acco_step_penalty,
                 several=len(predicted) > 1, streaming=streaming)
    return Choice(runs, figs, line, acco_c[1])


def _policies(config: AccoConfig) -> tuple:
    return ("fixed", "adaptive") if config.policy == "auto" else (config.policy,)


def _line(figs: dict, G: int, current: str, running: tuple, chosen: tuple, step_s: dict, batches: dict, score,
          penalty: float, several: bool, streaming: bool) -> str:
    """The INFO line of a choice: the figures it was made from, each candidate measured or predicted."""
    first = figs["step"] == 0  # the look before the first round: only compute measured
    how = {c: "measured" if c == running and not first else "predicted" for c in step_s}
    wire, noise = figs["wire_factor"], figs["noise_scale"]
    acco = ", ".join(f"acco {c[1]} {1e3 * step_s[c]:.1f} ms ({how[c]}; {1e3 * step_s[c] * (1 + penalty):.1f} ms "
                     f"with the {penalty:.0%} delay penalty)" for c in step_s if c[0] == ACCO)
    name = lambda c: f"{c[0]} {c[1]}" if c[1] and several else c[0]  # noqa: E731
    when, where = ("before the first round", "predicted from a probe of the link") if first else \
        (f"at step {figs['step']}", f"in {current}")
    line = (f"ds_acco auto {when}: compute {figs['compute_ms']:.1f} ms per micro-batch "
            f"(x{figs['in_flight_factor']:.2f} with a round in flight), round {figs['round_ms']:.1f} ms {where} "
            f"({f'x{wire:.2f} in acco' if current == SYNC else f'x{1 / wire:.2f} in sync'}); "
            f"per step of {G} micro-batches: sync {figs['sync_step_ms']:.1f} ms ({how[(SYNC, None)]}), {acco}")
    if noise is not None:
        shown = f"{noise:.1f}" if noise >= 1 or noise == 0 or noise != noise else f"{noise:.2g}"  # 0.04 is not 0
        scale = f"{shown} micro-batches" if figs["noise_measured"] else "not measured yet, taken as small"
        line += f"; gradient noise scale {scale}, so per step to a loss (delay penalty in) " + \
            ", ".join(f"{name(c) if c[0] == SYNC else f'{c[0]} {c[1]}'} {batches[c]:.1f} micro-batches per step: "
                      f"{1e3 * score(c):.1f} ms" for c in step_s)
    if figs["runs"] == STREAMING:
        line += f": runs streaming (was {name(running)}; {name(chosen)} is the best gradient mode)"
    else:
        line += f": runs {name(chosen)}" + ("" if chosen == running else f" (was {name(running)})")
    if figs["streaming_ratio"] >= STREAMING_HINT:
        compute_ms, sync_round_ms = G * figs["compute_ms"], figs["round_ms"] / (1.0 if current == SYNC else wire)
        why = (f"a round is {sync_round_ms / compute_ms:.1f}x a step's compute, more than any gradient round can hide"
               if chosen[0] == SYNC and sync_round_ms >= compute_ms else
               f"a step of {name(chosen)} costs {figs['streaming_ratio']:.2f}x its bare compute to a loss")
        if streaming:
            line += (f"; {why}: streaming syncs one fragment at a time behind compute, so the job runs it from here "
                     "to the end (acco.auto.streaming; auto does not choose again)")
        else:
            line += (f"; {why}: mode 'streaming' syncs one fragment at a time behind compute and may reach a loss "
                     "sooner on this link (set acco.auto.streaming to let auto switch to it; it keeps a full copy "
                     "of the optimizer state per rank)")
    return line


def _predict_acco(c: Sequence[float], R: float, G: int, config: AccoConfig, policy: str,
                  estimate_fraction: float = 1.0) -> tuple[float, float]:
    """Seconds per nominal step and micro-batches committed per step of ``acco`` under ``policy``
    (``R``: a commit round's time; an estimate's is ``estimate_fraction`` of it)."""
    full = float(G * len(c))
    rounds = (estimate_fraction * R, R)
    if policy == "fixed":
        return sum(max(G / 2 * max(c), r) for r in rounds), full
    cap = config.max_micro_batches_per_round or float("inf")
    seconds = made = 0.0
    for r in rounds:
        # a worker swaps at the first micro-batch boundary after its round lands, on average half a micro-batch
        # later (:data:`LANDING`), at least one micro-batch after it launched; the last to swap sets the round's
        # length, the others computing until then
        T = max(min(max(ci, r + LANDING * ci), cap * ci) for ci in c)
        seconds += T
        made += sum(min(max(1.0, T / ci), cap) for ci in c)
    return seconds * full / made, made


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
        self.noise = NoiseScale() if config.policy != "fixed" else None
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
        self.choices: list[dict] = []
        """Every choice's figures, in order (for telemetry, tests and benchmarks)."""
        self._retry = False
        self.streaming_refused = False
        """Set when a switch to streaming found too little memory on some rank: streaming is not offered again."""

    def look_first(self) -> bool:
        """Whether to probe the link behind step 1's compute and look before the first round
        (:func:`ds_acco.rounds.streaming_switch.look_before_first_round`): with ``auto.streaming`` only (the look
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
        yet), rather than ``check_every`` steps later."""
        return self._retry or step == self.early or \
            (step >= self.first and (step - self.first) % self.config.auto.check_every == 0)

    def gathered(self, submit, coll, device, figures: Optional[list[int]] = None) -> list:
        """Every rank's figures now (``figures``, by default the timer's), one row per rank, in one tiny all-gather on
        the communication thread: a choice in sync comes after its round (see the module docstring)."""
        local = torch.tensor(self.timer.local() if figures is None else figures, dtype=torch.int64, device=device)
        return submit("auto figures", lambda handle: coll.all_gather_small(local).cpu().tolist()).wait()

    def after_round(self, record, outcome, *, now: float, committed: Optional[int]) -> None:
        """Feed one swapped-in round: its times to the timer, its norms to the noise scale."""
        # the count all-gather is where a round waits for the slowest peer: not the link's time
        wire_s = outcome.round_s - record.stage_s.get("count all-gather", 0.0)
        if record.kind == "estimate":
            wire_s /= self.estimate_fraction  # the commit round it stands for
        self.timer.swap(compute_s=record.compute_s, round_s=wire_s, now=now, committed=committed)
        if self.noise is not None and outcome.noise is not None and not outcome.skipped:
            self.noise.add(outcome.noise[0], outcome.counts, outcome.noise[1])

    def decide(self, figures: Optional[list], state, step: int) -> str:
        """The mode (and, under ``policy: "auto"``, the acco policy) to run after ``step``: sets them on the engine's
        ``state`` and returns the mode (unchanged while the figures do not suffice); logs the figures."""
        running = state.policy if state.mode == ACCO else None
        noise = self.noise.value() if self.noise else None
        assumed = noise is None and self.noise is not None and step < self.first
        if assumed:  # a look inside the warm-up, before two rounds measured it: its small limit (see self.early)
            noise = 0.0
        choice = choose(figures, state.mode, self.config, self.G, step, policy=running, noise=noise,
                        batch=self.timer.batch(), estimate_fraction=self.estimate_fraction,
                        streaming=self.config.auto.streaming and not self.streaming_refused,
                        noise_measured=not assumed) if figures else None
        self._retry = choice is None and step > 0  # (the look before the first round is not retried)
        if choice is None:
            return state.mode
        if step < self.first and choice.mode != STREAMING:  # a look inside the warm-up: sync until it ends
            logger.debug("%s (inside the warm-up: only streaming may start before step %d)", choice.line, self.first)
            return state.mode
        self.choices.append(choice.figures)
        if self.rank == 0:
            logger.info(choice.line)
        if choice.mode != STREAMING and (choice.mode != state.mode or (choice.mode == ACCO and
                                                                       choice.policy != state.policy)):
            self.timer.enter(choice.mode)  # (streaming's steps are not timed: auto does not choose after it)
        state.mode = choice.mode
        if choice.mode == ACCO:
            state.policy = choice.policy
        return choice.mode
