"""The nested blocks of the ``"acco"`` config: telemetry, checkpoints, preemption, auto, streaming.

Validated like the top level (why pydantic: :mod:`ds_acco.config.schema`). Each field's docstring is its documentation.
"""

from __future__ import annotations

import os
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Block(BaseModel):
    # strict: a JSON config says true/false and numbers; "3" or 0.0 for a flag is a mistake, not a value
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


class TelemetryConfig(_Block):
    """Per-round measurements (compute, wait, round time, bytes, counts)."""

    enabled: bool = True
    """Record one :class:`ds_acco.telemetry.RoundRecord` per round."""
    log_every: int = Field(default=0, ge=0)
    """Log a summary line every this many commits on rank 0 (0: never)."""
    jsonl_path: Optional[str] = None
    """If set, every rank appends its round records to ``<jsonl_path>.rank<r>``."""
    keep_last: int = Field(default=10_000, ge=1)
    """How many round records stay in memory; older ones are dropped (sums are kept)."""

    @field_validator("jsonl_path")
    @classmethod
    def _writable(cls, path: Optional[str]) -> Optional[str]:
        # The file is first opened at the end of the first round: check its folder now.
        if path is not None:
            check_writable_folder(path)
        return path


class CheckpointConfig(_Block):
    """How checkpoints are saved and loaded (saves are always verified, see ``ds_acco.checkpoint.manifest``)."""

    fsync: bool = True
    """Flush every file of a save to stable storage before the manifest that vouches for it (then the
    manifest, the tag's rename and ``latest``), so a tag that looks complete is complete after a node
    crash or a power loss. Off: faster on local disks; a crash can then leave a tag whose files fail
    verification, and the load names the previous complete tag."""

    salvage: bool = False
    """Load a damaged or partial ds_acco checkpoint anyway, dropping the parts that fail
    verification where the rest can stand without them (per-rank round or streaming
    state, or an unreadable manifest); a WARNING names what was dropped. Off: any bad
    file fails every rank before training."""

    weights_only: bool = True
    """Unpickle checkpoint files with torch's restricted unpickler (tensors, containers, numbers and the
    few classes DeepSpeed's ZeRO-1 files hold), so a file crafted to run code on load fails instead,
    naming the file and the class. False: ``torch.load(weights_only=False)``, which runs whatever code a
    file names: only for checkpoints from a source you trust."""

    signing_key_file: Optional[str] = None
    """Sign every save's manifest (HMAC-SHA256) with the bytes of this file (at least 32), and refuse,
    before any file is parsed, a checkpoint not signed with it. None: the file named by
    ``$DS_ACCO_CHECKPOINT_KEY_FILE``, if set; else saves are unsigned."""

    on_save_error: Literal["raise", "continue"] = "raise"
    """A save that cannot be written (a full disk, a failing file system): every rank gets the same
    message, ``latest`` stays on the last complete tag and the partial tag is removed; then ``raise``
    stops the job, ``continue`` logs the error and training goes on (the next save tries again)."""


class PreemptionConfig(_Block):
    """What a SIGTERM does: the notice SLURM, Kubernetes and the launchers give before they kill a job."""

    enabled: bool = True
    """Catch SIGTERM (on any rank) and stop every rank at the next round boundary, within
    ``acco.timeout_s``. False: Python's default, the signalled process dies at once and its peers
    fail at their next collective."""
    checkpoint_dir: Optional[str] = None
    """Save a checkpoint into this folder at the stop, before exiting (it resumes exactly under the
    fixed policy). None: stop without saving."""
    exit_code: int = Field(default=143, ge=1, le=255)
    """The status every rank exits with after a stop: 143 (128 + SIGTERM) by default, what schedulers
    read as "terminated by a signal", so they requeue or restart the job."""

class AutoConfig(_Block):
    """How ``mode: "auto"`` chooses between ``sync`` and ``acco`` (and, with ``policy: "auto"``, acco's policy; see
    ``ds_acco.rounds.auto.mode``).

    Why a model and not a trial of each mode: a trial of ``acco`` costs little, but a trial's loss says nothing after a
    few steps; the time a step takes does. The choice compares seconds per nominal step (``G`` micro-batches per worker)
    measured in the running mode with those predicted for the other one from the same measurements, charges ``acco`` the
    loss cost of its delay, and switches only for a clear gain."""

    measure_steps: int = Field(default=1, ge=1)
    """Synchronous steps measured before the first choice (which comes after ``max(warmup_steps,
    measure_steps)`` steps). One suffices: step 1's compute is timed from the end of its first micro-batch
    (which holds start-up), its round is paced from a probe of the link (``ds_acco.comm.link_pacing``), and a
    choice in sync gathers every rank's figures once its round is over.
    More steps give medians over more samples (up to 3)."""
    check_every: int = Field(default=20, ge=1)
    """Steps between two choices after the first: a link that slows or a worker that falls behind
    changes the answer. A switch into a mode not run before is checked sooner, once it is measured
    (``ds_acco.rounds.auto.mode.CONFIRM_AFTER``)."""
    acco_step_penalty: float = Field(default=0.10, ge=0.0, le=1.0)
    """The extra steps ACCO's one-step delay costs to reach the same loss, as a fraction (0.10: ACCO is
    charged 10% more time per step): acco fixed's steps bought about 10% less loss than sync's on the
    benchmarks' real-compute bed (about 4% with sync steps for the learning-rate warm-up; docs/benchmarks-history.md),
    and ds_configs/auto_lowbit.json charges 0.05. Set 0 where your runs show no penalty; charge more where your peak
    learning rate is higher than the one your figure was measured at: at twice the benchmarks' rate acco fixed's final
    loss trailed sync's by several times as much (docs/long-runs.md, the second machine's learning-rate check)."""
    switch_margin: float = Field(default=0.05, ge=0.0, lt=1.0)
    """Switch only when the other mode is predicted faster by at least this fraction (no flapping
    between two modes that cost the same)."""
    streaming: bool = False
    """Let auto switch the job to Streaming DiLoCo (configured by the ``streaming`` block) where the best
    gradient mode costs at least 1.35x a step's bare compute to a loss (``ds_acco.rounds.auto.choice.STREAMING_HINT``;
    1.2x the bare compute at half the batch where streaming would run there, ``STREAMING_HINT_HALF``): there no
    gradient round hides, and streaming's fragment rounds do. Off unless set, because from the switch
    on every rank keeps a full copy of the optimizer state (ZeRO stage 0's memory). Needs fp32 parameters, and
    DeepSpeed ZeRO-1 or ``ds_acco.plain.build(..., model=)``. One-way: auto does not choose again after it.
    Auto may also start streaming (and nothing else) before the first round (gloo, ``G >= 2``) and, where
    ``warmup_steps`` outlasts ``measure_steps``, after ``measure_steps``: streaming has no delay to warm up."""


class StreamingConfig(_Block):
    """Streaming DiLoCo (``mode: "streaming"``); see ``docs/algorithms.md``, section streaming."""

    fragments: int = Field(default=1, ge=1)
    """``P``: parameter fragments (groups of whole layers), synchronised one at a time."""
    sync_every: int = Field(default=100, ge=1)
    """``H``: inner steps between two synchronisations of the same fragment; fragment
    ``p`` syncs at inner steps ``t`` with ``t mod H == p * H // P`` (``t >= 1``)."""
    overlap_steps: int = Field(default=0, ge=0)
    """``tau``: inner steps between a fragment's launch and the merge of its result
    (0: the training thread waits for the round). Must be below ``H / P``."""
    alpha: float = Field(default=0.5, ge=0.0, le=1.0)
    """Merge weight: ``θ_i ← alpha · θ_i + (1 − alpha) · θ_g`` (0: take the global parameters)."""
    outer_lr: float = Field(default=0.7, gt=0.0)
    """Learning rate of the outer Nesterov SGD on the global parameters."""
    outer_momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Momentum of the outer Nesterov SGD (0: plain SGD)."""
    quantize: Literal["int8", "none"] = "int8"
    """Pseudo-gradient reduce-scatter payload: blockwise int8 or fp32."""
    all_gather_dtype: Literal["bf16", "int8", "fp32"] = "bf16"
    """Wire dtype of the all-gather of the updated global fragment."""
    fragment_modules: Optional[list[list[str]]] = None
    """Which layers form each fragment, by qualified name (as ``model.named_modules()`` or
    ``model.named_parameters()`` spell them, relative to the model passed to DeepSpeed):
    one list per fragment, ``fragments`` lists, every trainable parameter in exactly
    one. None: the default split (consecutive blocks of the model's layer stack)."""

    @model_validator(mode="after")
    def _schedule(self) -> "StreamingConfig":
        P, H, tau = self.fragments, self.sync_every, self.overlap_steps
        if H < P:
            raise ValueError(
                f"acco.streaming.sync_every: got {H}; must be >= acco.streaming.fragments ({P}) so that "
                "every fragment gets its own sync step in each window of sync_every inner steps"
            )
        if self.fragment_modules is not None and len(self.fragment_modules) != P:
            raise ValueError(
                f"acco.streaming.fragment_modules: got {len(self.fragment_modules)} lists; allowed: one list of "
                f"module names per fragment, acco.streaming.fragments = {P}"
            )
        if tau * P >= H:
            raise ValueError(
                f"acco.streaming.overlap_steps: got {tau}; allowed: 0 <= overlap_steps < sync_every / fragments "
                f"= {H}/{P} = {H / P:g}, so that at most one fragment is in flight"
            )
        return self


def check_writable_folder(path: str) -> None:
    """Create ``path``'s folder if needed; raise ``ValueError`` unless a file can be written there."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"its folder {folder} cannot be created ({exc.strerror}); allowed: a path in a "
                         "writable folder") from None
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        raise ValueError(f"{'it is a folder' if os.path.isdir(path) else f'{folder} is not writable'}; "
                         "allowed: a file path in a writable folder")
