"""Per-round measurements and the running "communication hidden" figure.

A round's communication is hidden to the extent the training thread did not wait for it:
``hidden = 1 - waited / round_time``, summed over rounds. In sync mode the training thread waits for the whole round, so
it reads ~0%; in acco adaptive it should read ~100%.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Optional


DRAIN_STAGE = "gradients ready"
"""A round's first stage on a GPU: the device finishing the kernels the training thread queued before the launch.
The host runs ahead of the device (by a whole micro-batch where the device is the bottleneck), so this wait is the
micro-batches' compute, not the round's: where the training thread blocked on it (sync), it belongs to compute."""


def device_compute_s(compute_s: float, waited_s: float, stage_s: dict) -> float:
    """The training thread's compute since the previous swap, with the device's share of its wait added back: in
    sync on a GPU the host's figure alone misses the last micro-batch's kernels (an H200 bed read a round in
    flight as 1.2x compute per micro-batch this way, 1.01x counted whole; docs/gpu.md)."""
    return compute_s + min(waited_s, stage_s.get(DRAIN_STAGE, 0.0))


@dataclass
class RoundRecord:
    """What one round did and cost, seen from this rank."""

    index: int
    """Round number on this rank (0-based; equal on every rank)."""
    kind: str
    """``commit`` or ``estimate``."""
    mode: str
    """Mode the round ran in (``sync`` during warmup)."""
    step: int
    """Commits completed before this round."""
    counts: list[int]
    """Micro-batches each rank contributed (rank order)."""
    compute_s: float = 0.0
    """Training-thread seconds between the previous swap and the start of the wait."""
    round_s: float = 0.0
    """Seconds the round took on the communication thread."""
    waited_s: float = 0.0
    """Seconds the training thread blocked on this round."""
    bytes_sent: int = 0
    bytes_received: int = 0
    grad_norm: float = float("nan")
    """Global L2 norm of the mean gradient before clipping (nan when skipped)."""
    skipped: bool = False
    """True when non-finite gradients made every rank skip this update."""
    lr: float = float("nan")
    stage_s: dict = field(default_factory=dict)
    """Communication-thread seconds per stage ("count all-gather", "reduce-scatter",
    "shard step", "all-gather"; on a GPU :data:`DRAIN_STAGE` first): where a round's time goes, next to
    ``bytes_sent``."""
    stage_cpu_s: dict = field(default_factory=dict)
    """The communication thread's CPU seconds per stage (quantisation, sums, the shard step): on
    a CPU host it shares the cores with compute, so this is what a round takes from compute."""
    nominal_step: int = 0
    """The learning-rate schedule's position after this round: one per commit under the fixed
    policy, committed micro-batches / (G × N) under the adaptive one."""

    @property
    def hidden(self) -> float:
        if self.round_s <= 0:
            return 1.0
        return max(0.0, 1.0 - self.waited_s / self.round_s)


@dataclass
class Telemetry:
    """Keeps the last ``keep_last`` records and running sums over all of them."""

    keep_last: int = 10_000
    jsonl_path: Optional[str] = None
    records: deque = field(default_factory=deque)
    total_round_s: float = 0.0
    total_waited_s: float = 0.0
    total_compute_s: float = 0.0
    total_bytes_sent: int = 0
    total_bytes_received: int = 0
    peak_round_bytes: int = 0
    """The most bytes one round sent (a whole gradient round, or one streaming fragment)."""
    rounds: int = 0
    skipped_steps: int = 0
    commits: int = 0
    nominal_steps: int = 0

    def add(self, record: RoundRecord) -> None:
        self.records.append(record)
        while len(self.records) > self.keep_last:
            self.records.popleft()
        self.rounds += 1
        self.total_round_s += record.round_s
        self.total_waited_s += record.waited_s
        self.total_compute_s += record.compute_s
        self.total_bytes_sent += record.bytes_sent
        self.total_bytes_received += record.bytes_received
        self.peak_round_bytes = max(self.peak_round_bytes, record.bytes_sent)
        self.skipped_steps += int(record.skipped and record.kind == "commit")
        self.commits += int(record.kind == "commit")
        self.nominal_steps = record.nominal_step
        if self.jsonl_path:
            with open(self.jsonl_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(record)) + "\n")

    @property
    def hidden_fraction(self) -> float:
        """``1 - waited / round time`` over every round so far (1.0 before any round)."""
        if self.total_round_s <= 0:
            return 1.0
        return max(0.0, 1.0 - self.total_waited_s / self.total_round_s)

    def last(self) -> Optional[RoundRecord]:
        return self.records[-1] if self.records else None

    def summary(self) -> dict:
        return {
            "rounds": self.rounds,
            "comm_hidden_pct": round(100.0 * self.hidden_fraction, 2),
            "round_s": round(self.total_round_s, 4),
            "waited_s": round(self.total_waited_s, 4),
            "compute_s": round(self.total_compute_s, 4),
            "bytes_sent": self.total_bytes_sent,
            "peak_round_bytes": self.peak_round_bytes,
            "bytes_received": self.total_bytes_received,
            "skipped_steps": self.skipped_steps,
            "commits": self.commits,
            "nominal_steps": self.nominal_steps,
        }

    def format_line(self, record: RoundRecord) -> str:
        norm = "skip" if record.skipped else (f"{record.grad_norm:.3g}" if not math.isnan(record.grad_norm) else "-")
        # a streaming round syncs a fragment: its counts are inner steps since that fragment's last sync
        what = (f"{record.counts[0]} steps since its last sync" if record.kind == "fragment" else
                f"nominal {record.nominal_step} mb/rank {record.counts}")
        drain = record.stage_s.get(DRAIN_STAGE)  # on a GPU: say how much of the round was the device's compute
        return (
            f"[ds_acco] round {record.index} {record.kind:8s} step {record.step} {what} "
            f"compute {device_compute_s(record.compute_s, record.waited_s, record.stage_s) * 1e3:.1f}ms "
            f"round {record.round_s * 1e3:.1f}ms "
            + ("" if drain is None else f"(gradients ready after {drain * 1e3:.1f}ms) ")
            + "waited "
            f"{record.waited_s * 1e3:.1f}ms sent {record.bytes_sent / 2**20:.2f}MiB "
            + ("" if record.kind == "fragment" else f"|g| {norm} ")
            + f"hidden {100 * record.hidden:.0f}% (running {100 * self.hidden_fraction:.1f}%)"
        )
