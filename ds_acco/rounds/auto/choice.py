"""``mode: "auto"``: run ``sync`` or ``acco`` (and with ``policy: "auto"`` fixed or adaptive), whichever the
measurements say reaches a loss sooner.

Why a model of the step, not a trial of each mode: a few steps' loss says nothing about which mode trains faster, but
the time a step takes is measured exactly, and the two modes' step times follow from the same two figures. With ``c``
the compute of one micro-batch (the slowest worker's), ``R`` the time of one round on the wire and ``G`` micro-batches
per worker per step:

* ``sync`` computes, then communicates: ``G·c + R`` per step;
* ``acco`` (fixed policy) overlaps two rounds of ``G/2`` micro-batches with their communication: ``2·max(G/2·c', R)``,
  where ``c' = k·c`` is the compute of a micro-batch while a round is in flight (the communication thread shares the
  core on a CPU; ``k`` is measured across a switch, 1 before ``acco`` has run, and the mode not running takes
  its compute from the running mode's, through ``k``: :attr:`~ds_acco.rounds.auto.mode.StepTimer.in_flight_factor`);
* ``acco`` (adaptive policy) ends a round at the first micro-batch boundary after its communication ends, every worker
  contributing what it computed meanwhile: ``2·T`` per ``2·Σ T/c'_r`` micro-batches with
  ``T = max_r max(c'_r, R + c'_r/2)`` (:data:`LANDING`), scaled to ``G`` micro-batches per worker.

The running mode's step is *measured* (wall time between two commits, per ``G·N`` micro-batches committed); only the
other mode's is predicted, with the round time scaled by the *wire factor*: in ``acco`` a round shares the core with
compute (its CPU work, ds_acco's quantisation and sums and the network stack's, competes with the training thread) and
takes longer than the same round in ``sync`` (1.55x on a one-core host at 100 Mbit/s), which the factor measures across
the first switch (1 before). ``acco`` is charged ``auto.acco_step_penalty`` for the extra steps its one-step delay costs
to reach the same loss, and a switch needs a gain of ``auto.switch_margin``. Every rank computes the same choice from
the same integers, so no rank disagrees: in acco the figures ride the count all-gather each round already makes
(:mod:`ds_acco.rounds.round_work`); in sync the choice comes after the step's round, and one tiny all-gather brings
every rank's figures including it (:meth:`AutoMode.gathered`), so the first choice can come after step 1. When ``R``
exceeds the whole compute of a step, ``acco`` cannot hide it and ``sync`` wins; when ``R`` is tiny, hiding it is not
worth the penalty; between the two, ``acco`` wins. Where even the best of them costs :data:`STREAMING_HINT` times a
step's bare compute (:data:`STREAMING_HINT_HALF` times it at half the batch, where streaming would run there),
``acco.auto.streaming`` switches the job to streaming
(:meth:`ds_acco.streaming.phase.PhaseFactory.enter`), its inner steps at the configured batch or at half of it,
whichever the noise scale prices best (:func:`streaming_batch`).

With ``policy: "auto"`` both acco policies are candidates. The adaptive policy commits fewer micro-batches per step, and
a smaller batch may buy as much loss per step: each candidate's time to a loss is its seconds per ``G·N`` micro-batches
times the samples its batch ``B`` (micro-batches per committed step) needs to a loss at the learning rate now
(:func:`samples_to_loss`, from the gradient noise scale measured from the rounds,
:mod:`ds_acco.rounds.auto.noise_scale`; per sample alone before it is measured; per committed step when it measures 0,
the model's limit: a larger batch is not free there). While acco runs, its measured step
calibrates the other policy's prediction (the model's error is shared), and a near tie goes to the simpler candidate
(:data:`SIMPLEST_FIRST`: sync before acco, the fixed policy before the adaptive one). Once adaptive has run, its
measured commits over the model's (``batch_scale``) scale the commits predicted for it later: on real compute with
one host at half speed the model gave 8-9 micro-batches a commit where adaptive committed 7, and priced by the noise
scale that larger batch kept a job in sync for up to 120 steps.
``policy: "adaptive"`` prices sync's full batches against adaptive's the same way. Where the batch may change, sync
at half the accumulation is a candidate, and under ``policy: "auto"`` acco fixed at half the accumulation too
(:data:`HALF`): its step is the fixed policy's with ``G/2``, hiding the round that half-batch sync pays twice per
nominal step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ds_acco.config import AccoConfig
from ds_acco.config.names import Mode, Policy

SYNC, ACCO, STREAMING = Mode.SYNC, Mode.ACCO, Mode.STREAMING
HALF = "half"
"""Half the accumulation (commits of ``G/2`` micro-batches per worker): sync there is a candidate wherever the policy
may change the batch (the adaptive policy's commits are about half of ``G·N`` micro-batches on a fast link, so sync at
that batch is its honest control), and acco fixed there, rounds of ``G/4``, under ``policy: "auto"`` with ``G`` a
multiple of 4 (where a smaller batch buys more loss per sample, the round that sync at half the batch sends twice as
often is the one to hide)."""
FIGURES = 5
"""Integers each rank adds to a round's all-gather: µs per micro-batch without and with a round in
flight (the mode not running: the running mode's through the in-flight factor, once measured), µs per round on the
wire in the running mode, µs per nominal step measured in the running mode,
and the wire factor in thousandths (0: not measured yet)."""
LANDING = 0.5
"""Where in a micro-batch an adaptive round lands, on average (0: at its end, 1: at its start): the swap waits for
the micro-batch under way. Half, since rounds and micro-batches jitter by more than the gap: with real compute a round
of ``x`` micro-batches committed ``x + 0.5`` within 0.15 (BENCHMARKS.md, "Auto's adaptive prediction"). With sleeps
this undercounts by up to half a micro-batch, until adaptive runs and its committed batch is measured."""
BATCH_SCALE_BOUNDS = (0.5, 2.0)
"""How far a measured batch may scale the model's prediction (``batch_scale``): a window of a few commits, not a
new model; a ratio outside these says the conditions changed, not the model."""
STREAMING_HINT = 1.35
"""Where the best gradient mode costs this many times a step's bare compute (``G`` micro-batches, a full batch, priced
to a loss as the candidates are: delay penalty and batch in), no gradient round hides and streaming, whose fragment
rounds do, is the faster mode: with ``acco.auto.streaming`` the job switches to it, otherwise the line points to it.
Placed between the ratios where streaming won (1.39-1.79 at 25 Mbit/s) and lost (0.71-1.30 at 100 Mbit/s;
BENCHMARKS.md, "Streaming against auto, four seeds"). Where streaming would run at half the batch
(:func:`streaming_batch`), its bare compute is priced at that batch and the threshold is :data:`STREAMING_HINT_HALF`."""
STREAMING_HINT_HALF = 1.2
"""The same threshold against streaming's bare compute at half the batch. Placed between the ratios auto's checks read
on the long runs (docs/long-runs.md) where streaming at half the batch was the fastest config (1.22-1.49 on real
compute at 100 Mbit/s after the first check, about 3 at 25 Mbit/s) or close to it, ahead of the modes auto ran
(1.21-1.41 with one host at half speed), and where it tied them (0.99-1.12 on the sleep bed, whose compute is off the
CPU: there a round in flight does not slow compute, so the overlap hides every round for free)."""


SIMPLEST_FIRST = ((SYNC, None), (SYNC, HALF), (ACCO, Policy.FIXED), (ACCO, HALF), (ACCO, Policy.ADAPTIVE))
"""Among candidates within ``auto.switch_margin`` of the best, the first here runs: sync is exact and has no delay
to misprice, the fixed policy is deterministic, and a prediction of a mode not yet run is the one that errs (on real
compute at 100 Mbit/s auto took adaptive at steps where its model put it 0-4% ahead of sync at half the batch, and
the runs then measured half-batch sync level with it, or ahead)."""


@dataclass
class Choice:
    mode: str
    figures: dict
    line: str
    policy: Optional[str] = None
    """The acco policy to run (or the one priced best, when ``mode`` is sync)."""
    sync_half: bool = False
    """Sync runs at half the accumulation (commits of ``G/2`` micro-batches per worker)."""
    acco_half: bool = False
    """Acco fixed runs at half the accumulation (rounds of ``G/4`` micro-batches per worker)."""
    streaming_half: bool = False
    """Streaming's inner steps take half the accumulation (``G/2`` micro-batches per worker;
    :func:`streaming_batch`)."""

    @property
    def half(self) -> bool:
        """Whether the mode that runs takes half the accumulation (its own flag of the three)."""
        return {SYNC: self.sync_half, ACCO: self.acco_half, STREAMING: self.streaming_half}[self.mode]


def samples_to_loss(batch: float, noise: float, rate: float, configured: float) -> float:
    """Samples (micro-batches) to a loss with commits of ``batch`` micro-batches, up to a constant: ``noise`` the
    gradient noise scale (micro-batches, > 0), ``rate`` the learning rate over its peak, ``configured`` the batch the
    peak rate was set for (``G·N``). Infinite where the model says a step of that batch gains nothing at this rate.

    Auto changes the batch and keeps the rate, so the price of a batch is McCandlish et al.'s at a fixed rate (2018,
    "An Empirical Model of Large-Batch Training", appendix A), not their ``1 + B/B_noise``, which holds where each
    batch runs at its own best rate. A step of ``B`` at the rate ``ε`` gains ``ε|G|²(1 - a(1 + B_noise/B))``, with
    ``a = ε/(2ε_max)``; samples to a loss are then ``B / (1 - a(1 + B_noise/B))``. The peak rate is taken as the one
    best for the configured batch, ``a = 1/(2(1 + B_noise/B₀))`` (the upper end: a rate set lower gives a smaller
    ``a``), and ``a`` falls with the rate. Early in training, where the scale is a fraction of a micro-batch, or as a
    schedule decays the rate, every batch costs about per committed step: half-batch sync needed 0.48-0.56 of
    full-batch sync's tokens to every loss on both long-run beds (docs/long-runs.md), where their ``1 + B/B_noise``
    with the scale measured late in those runs (2-8 micro-batches) would have said 0.6-0.75, and moved auto to the
    adaptive policy's larger commits, which then needed more tokens to every loss than the half batch."""
    a = rate / (2.0 * (1.0 + noise / configured))
    gain = 1.0 - a * (1.0 + noise / batch)
    return batch / gain if gain > 0 else float("inf")


def choose(figures: Sequence[Sequence[int]], current: str, config: AccoConfig, G: int, step: int,
           policy: Optional[str] = None, noise: Optional[float] = None,
           batch: Optional[float] = None, estimate_fraction: float = 1.0, streaming: bool = False,
           noise_measured: bool = True, penalty: Optional[float] = None,
           sync_half: Optional[bool] = None, penalty_note: str = "", noise_note: str = "",
           batch_scale: Optional[dict] = None, rate: float = 1.0,
           acco_half: Optional[bool] = None) -> Optional[Choice]:
    """The mode to run from ``figures`` (one row of :data:`FIGURES` per rank); None while they do not suffice.

    ``policy``: the acco policy running (``current == "acco"``), or :data:`HALF` where sync (or acco fixed) runs at
    half the accumulation; ``noise``: the gradient noise scale in micro-batches
    (:mod:`ds_acco.rounds.auto.noise_scale`; None: not measured, or ``inf``: batches are then priced per sample; 0:
    below what the rounds resolve, priced per committed step, the model's limit); ``batch``: micro-batches per step
    measured in the running mode (the adaptive policy's varies); ``estimate_fraction``: an estimate round's bytes
    over a commit's (``acco.estimate_quantization``); round times are commit rounds' (the timer scales estimates up
    by it); ``streaming``: ``acco.auto.streaming``, the job may switch to streaming where the chosen gradient mode
    costs :data:`STREAMING_HINT` (:data:`STREAMING_HINT_HALF` against streaming at half the batch) or more;
    ``noise_measured``: False where ``noise`` is the small-noise limit taken before two rounds measured it;
    ``penalty``: acco's delay penalty now (None: ``acco.auto.acco_step_penalty``; :meth:`AutoMode.penalty`);
    ``sync_half``: whether sync at half the accumulation is a candidate (None: where the policy may change the
    batch, as the adaptive policy does, and ``G`` is even); ``penalty_note``/``noise_note``: how the penalty and the
    noise scale were taken, for the line; ``batch_scale``: per acco policy, its measured micro-batches per commit
    over the model's when it last ran (:meth:`AutoMode.decision`), applied to the model's commits for it while it
    does not run; ``rate``: the learning rate over its peak (:func:`samples_to_loss`); ``acco_half``: whether acco
    fixed at half the accumulation is a candidate (None: under ``policy: "auto"`` with ``G`` a multiple of 4)."""
    N = len(figures)
    # compute per micro-batch with a round in flight over without, from ranks that measured both; 1 before any did,
    # not a typical slowdown: it is measured only across a switch, and a prior that overprices acco would keep a job
    # whose compute a round does not slow in sync for good (an optimistic guess is corrected CONFIRM_AFTER later)
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
    penalty = auto.acco_step_penalty if penalty is None else penalty
    halves = half_candidates(config, G)
    sync_half = halves[0] if sync_half is None else sync_half
    acco_half = halves[1] if acco_half is None else acco_half
    running = (SYNC, HALF if policy == HALF else None) if current == SYNC else (ACCO, policy or _policies(config)[0])
    # seconds per nominal step (G·N micro-batches) and micro-batches per committed step, for each candidate; sync at
    # half the accumulation sends the same round twice per nominal step
    R_sync = R if current == SYNC else R / wire
    step_s = {(SYNC, None): G * max(c_sync_s) + R_sync}
    batches = {(SYNC, None): full}
    if sync_half or running == (SYNC, HALF):
        step_s[(SYNC, HALF)], batches[(SYNC, HALF)] = G * max(c_sync_s) + 2 * R_sync, full / 2
    if current == SYNC:
        step_s[running] = measured
        batches[running] = batch if running == (SYNC, HALF) and batch else batches[running]
    R_acco = R * wire if current == SYNC else R
    predicted = {p: _predict_acco(c_acco_s, R_acco, G, config, p, estimate_fraction) for p in _policies(config)}
    if acco_half or running == (ACCO, HALF):  # per G/2·N micro-batches: twice that per nominal step
        t, b = _predict_acco(c_acco_s, R_acco, G // 2, config, Policy.FIXED, estimate_fraction)
        predicted[HALF] = (2 * t, b)
        predicted = {p: predicted[p] for p in sorted(predicted, key=lambda p: SIMPLEST_FIRST.index((ACCO, p)))}
    # in acco, the running candidate's measured step calibrates the others' predictions
    calibration = measured / predicted[running[1]][0] if current == ACCO and running[1] in predicted else 1.0
    scaled = {p: x for p, x in (batch_scale or {}).items() if p in predicted and (ACCO, p) != running and x != 1.0}
    for p, (t, b) in predicted.items():
        step_s[(ACCO, p)] = measured if (ACCO, p) == running else t * calibration
        batches[(ACCO, p)] = batch if (ACCO, p) == running and batch else b * scaled.get(p, 1.0)
    priced = noise is not None and noise != float("inf")

    def price(seconds: float, batch: float) -> float:  # to a loss, up to a constant: times the samples a batch needs
        if not priced:
            return seconds
        if noise > 0:
            return seconds / full * samples_to_loss(batch, noise, rate, full)
        return seconds * batch / full  # noise below what the rounds resolve: every batch needs the same steps

    def score(c) -> float:
        return price(step_s[c], batches[c]) * (1.0 + penalty if c[0] == ACCO else 1.0)

    # a near tie goes to the simplest candidate (:data:`SIMPLEST_FIRST`)
    least = min(score(c) for c in step_s)
    best = min((c for c in step_s if score(c) <= least * (1.0 + auto.switch_margin)), key=SIMPLEST_FIRST.index)
    chosen = best if score(best) < score(running) * (1.0 - auto.switch_margin) else running
    acco_c = chosen if chosen[0] == ACCO else min((c for c in step_s if c[0] == ACCO), key=score)
    k = max(c_acco_s) / max(c_sync_s)
    # streaming at the batch it would run (half where half-batch sync is a candidate and priced cheaper), its
    # fragment rounds hidden: a nominal step costs its bare compute
    bare = G * max(c_sync_s)
    s_half = bool(sync_half) and streaming_batch(price, bare, full) < full
    ratio = score(chosen) / price(bare, full / 2 if s_half else full)
    hint = STREAMING_HINT_HALF if s_half else STREAMING_HINT
    runs = STREAMING if streaming and ratio >= hint else chosen[0]
    streaming_half = runs == STREAMING and s_half
    figs = {"step": step, "compute_ms": 1e3 * max(c_sync_s), "in_flight_factor": k, "round_ms": 1e3 * R,
            "wire_factor": wire, "sync_step_ms": 1e3 * step_s[(SYNC, None)], "acco_step_ms": 1e3 * step_s[acco_c],
            "acco_charged_ms": 1e3 * step_s[acco_c] * (1.0 + penalty), "penalty": penalty,
            "sync_half": chosen == (SYNC, HALF), "switch_margin": auto.switch_margin, "penalty_scaled": penalty_note,
            "noise_note": noise_note, "predicted_batches": {p: b for p, (t, b) in predicted.items()},
            "batch_scale": scaled,
            "acco_half": chosen == (ACCO, HALF),
            "was": current, "runs": runs, "streaming_half": streaming_half, "policy": _policy(acco_c),
            "world_size": N,
            "noise_scale": noise, "noise_measured": noise_measured, "rate_share": rate, "streaming_ratio": ratio,
            "streaming_hint": hint, "streaming_priced_half": s_half,
            "candidates": {f"{m} {'fixed half' if c == (ACCO, HALF) else p}" if p else m: {
                "step_ms": 1e3 * step_s[c], "batch": batches[c], "score_ms": 1e3 * score(c)}
                for c in step_s for m, p in [c]}}
    line = _line(figs, G, current, running, chosen, step_s, batches, score, penalty,
                 several=len(predicted) > 1, streaming=streaming)
    return Choice(runs, figs, line, _policy(acco_c), sync_half=chosen == (SYNC, HALF),
                  acco_half=chosen == (ACCO, HALF), streaming_half=streaming_half)


def streaming_batch(price, compute_s: float, full: float) -> float:
    """Micro-batches per inner step for streaming, given half the accumulation is a candidate: ``full`` or half of
    it, whichever ``price`` (a candidate's seconds per nominal step and batch to a loss) says reaches a loss sooner.

    Streaming hides its fragment rounds behind compute at either batch, so a nominal step costs its bare compute
    (``compute_s``) at both, and its batch is priced as the gradient modes' are, from the noise scale: where a smaller
    batch buys more loss per sample, inner steps of ``G/2`` reach a loss sooner (half-batch sync needed about half the
    tokens of full-batch sync to every loss on the long runs, docs/long-runs.md). A tie keeps the configured batch."""
    return full / 2 if price(compute_s, full / 2) < price(compute_s, full) else full


def half_candidates(config: AccoConfig, G: int) -> tuple[bool, bool]:
    """Whether sync, and acco fixed, at half the accumulation are candidates: where the policy may change the batch
    (as adaptive does) and ``G`` splits (``G/2`` per sync step; ``G/4`` per acco round, under ``policy: "auto"``)."""
    return config.policy != Policy.FIXED and G % 2 == 0, config.policy == Policy.AUTO and G % 4 == 0


def _policies(config: AccoConfig) -> tuple:
    return (Policy.FIXED, Policy.ADAPTIVE) if config.policy == Policy.AUTO else (config.policy,)


def _policy(candidate: tuple) -> str:
    """An acco candidate's policy (at half the accumulation, the fixed one)."""
    return Policy.FIXED if candidate[1] == HALF else candidate[1]


def _name(c: tuple, several: bool) -> str:
    """A candidate as the line says it."""
    if c[1] == HALF:
        return "sync at half the batch" if c[0] == SYNC else "acco fixed at half the batch"
    return f"{c[0]} {c[1]}" if c[1] and several else c[0]


def _line(figs: dict, G: int, current: str, running: tuple, chosen: tuple, step_s: dict, batches: dict, score,
          penalty: float, several: bool, streaming: bool) -> str:
    """The INFO line of a choice: the figures it was made from, each candidate measured or predicted."""
    first = figs["step"] == 0  # the look before the first round: only compute measured
    how = {c: "measured" if c == running and not first else "predicted" for c in step_s}
    wire, noise = figs["wire_factor"], figs["noise_scale"]
    acco = ", ".join(f"{_name(c, True)} {1e3 * step_s[c]:.1f} ms ({how[c]}; {1e3 * step_s[c] * (1 + penalty):.1f} "
                     f"ms with the {percent(penalty)} delay penalty)" for c in step_s if c[0] == ACCO)
    half = (SYNC, HALF)
    sync = f"sync {figs['sync_step_ms']:.1f} ms ({how[(SYNC, None)]})" + (
        f", sync at half the batch {1e3 * step_s[half]:.1f} ms ({how[half]})" if half in step_s else "")
    name = lambda c: _name(c, several)  # noqa: E731
    when, where = ("before the first round", "predicted from a probe of the link") if first else \
        (f"at step {figs['step']}", f"in {current}")
    line = (f"ds_acco auto {when}: compute {figs['compute_ms']:.1f} ms per micro-batch "
            f"(x{figs['in_flight_factor']:.2f} with a round in flight), round {figs['round_ms']:.1f} ms {where} "
            f"({f'x{wire:.2f} in acco' if current == SYNC else f'x{1 / wire:.2f} in sync'}); "
            f"per step of {G} micro-batches: {sync}, {acco}")
    if figs.get("penalty_scaled"):
        line += f"; delay penalty {percent(penalty)}: {figs['penalty_scaled']}"
    for p, x in figs["batch_scale"].items():
        line += f"; acco {p}'s commits x{x:.2f} the model's, as measured when it last ran"
    if noise is not None:
        shown = f"{noise:.1f}" if noise >= 1 or noise == 0 or noise != noise else f"{noise:.2g}"  # 0.04 is not 0
        scale = (f"{shown} micro-batches" if figs["noise_measured"] else "not measured yet, taken as small") + (
            f" ({figs['noise_note']})" if figs.get("noise_note") else "")
        at = f" at the learning rate's {figs['rate_share']:.2f} of its peak" if figs["rate_share"] < 1 else ""
        line += f"; gradient noise scale {scale}{at}, so per step to a loss (delay penalty in) " + \
            ", ".join(f"{_name(c, c[0] == ACCO or several)} {batches[c]:.1f} micro-batches per step: "
                      + (f"{1e3 * score(c):.1f} ms" if score(c) < float("inf") else
                         "none, its noise outweighs a step at this rate") for c in step_s)
    if figs["runs"] == STREAMING:
        at = f" at half the batch ({G // 2} micro-batches an inner step)" if figs["streaming_half"] else ""
        line += f": runs streaming{at} (was {name(running)}; {name(chosen)} is the best gradient mode)"
    else:
        line += f": runs {name(chosen)}" + ("" if chosen == running else f" (was {name(running)})")
        best = min(step_s, key=score)
        if best != chosen:  # what staying gives up
            line += (f"; {name(best)} would take {score(best) / score(chosen):.2f}x its time to a loss, inside the "
                     f"{percent(figs['switch_margin'])} switch margin")
        elif (alt := min((c for c in step_s if c != chosen), key=score, default=None)) is not None:
            line += f"; the next best, {name(alt)}, would take {score(alt) / score(chosen):.2f}x its time to a loss"
    if figs["streaming_ratio"] >= figs["streaming_hint"]:
        compute_ms, sync_round_ms = G * figs["compute_ms"], figs["round_ms"] / (1.0 if current == SYNC else wire)
        at = " at half the batch" if figs["streaming_priced_half"] else ""
        why = (f"a round is {sync_round_ms / compute_ms:.1f}x a step's compute, more than any gradient round can hide"
               if chosen[0] == SYNC and sync_round_ms >= compute_ms else
               f"a step of {name(chosen)} costs {figs['streaming_ratio']:.2f}x the bare compute{at} to a loss")
        if streaming:
            line += (f"; {why}: streaming syncs one fragment at a time behind compute, so the job runs it from here "
                     "to the end (acco.auto.streaming; auto does not choose again)")
        else:
            line += (f"; {why}: mode 'streaming' syncs one fragment at a time behind compute and may reach a loss "
                     "sooner on this link (set acco.auto.streaming to let auto switch to it; it keeps a full copy "
                     "of the optimizer state per rank)")
    return line


def percent(x: float) -> str:
    return f"{100 * x:.3g}%"


def _predict_acco(c: Sequence[float], R: float, G: int, config: AccoConfig, policy: str,
                  estimate_fraction: float = 1.0) -> tuple[float, float]:
    """Seconds per nominal step and micro-batches committed per step of ``acco`` under ``policy``
    (``R``: a commit round's time; an estimate's is ``estimate_fraction`` of it)."""
    full = float(G * len(c))
    rounds = (estimate_fraction * R, R)
    if policy == Policy.FIXED:
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
