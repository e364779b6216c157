"""What a sweep runs: the workload every compared config shares, one run's spec, a named sweep."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from benchmarks.cluster.units import format_rate, parse_rate


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
    """Streaming configs: H instead of :data:`benchmarks.sweep.configs.STREAMING_BLOCK`'s (short smoke runs)."""
    max_tokens: int = 0
    """train_lm ``--max-tokens``: stop at this many committed tokens (0: at ``steps``)."""
    eval_every_tokens: int = 0
    """train_lm ``--eval-every-tokens`` (0: validate by ``eval_every`` steps only)."""
    frontend: str = "deepspeed"
    """``deepspeed`` (``examples.train_lm`` under :mod:`benchmarks.sweep.worker`) or ``fsdp``
    (``examples.train_lm_fsdp --shard-blocks``, one ``fully_shard`` unit per block)."""
    lr_schedule: str = ""
    """``""``: the templates' WarmupLR (warm-up, then constant); ``decay`` or ``cosine``: warm-up, then decayed to the
    end of ``lr_total_steps`` (:func:`benchmarks.sweep.configs.make_config`), as a real run's rate is."""
    lr_total_steps: int = 0
    """Nominal optimizer steps the decayed schedule spans (the token budget over ``micro_batch x grad_accum x seq_len x
    hosts``): every config of a sweep ends its schedule at the same token count."""


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
    mtu: Optional[int] = None
    """Every link's MTU (None: 1500); set sweep-wide by ``python -m benchmarks run --mtu``."""
    delay: Optional[str] = None
    """Every link's one-way latency (``25ms``; None: none), set sweep-wide by ``python -m benchmarks run --delay``:
    real inter-site links have tens of milliseconds, and a round's collectives pay them per piece."""
    also: tuple = ()
    """Other scenarios (parts) this run stands for: the same run, its row repeated under each with ``run_of``
    naming this one (:func:`benchmarks.sweep.plans.share_runs`)."""

    def aliases(self) -> list["RunSpec"]:
        """This run as each part of :attr:`also` names it."""
        return [replace(self, scenario=s, also=()) for s in self.also]

    @property
    def run_id(self) -> str:
        parts = [self.scenario, self.config, format_rate(parse_rate(self.rate)), f"{self.hosts}h"]
        parts += [f"h{i}q{q:g}" for i, q in self.cpu_quota]
        if self.note:
            parts.append(self.note)
        if self.mtu:
            parts.append(f"mtu{self.mtu}")
        if self.delay:
            parts.append(f"lat{self.delay}")
        return "-".join(parts)


@dataclass
class Sweep:
    name: str
    description: str
    runs: list[RunSpec] = field(default_factory=list)
    timeout_s: float = 600.0
    shared_launches: bool = False
    """Runs on the same links share one launch, a forked process per run (:mod:`benchmarks.sweep.shared_launch`):
    for the smoke sweep, whose figures are not measurements."""


def spec_of(row: dict) -> RunSpec:
    """The :class:`RunSpec` a result row was made from (CPU pinning is not part of a row)."""
    rate = None if row["rate"] == "unshaped" else row["rate"]
    quota = tuple((int(k.replace("host", "")), float(v)) for k, v in (row.get("cpu_quota") or {}).items())
    return RunSpec(row["scenario"], row["config"], Workload(**row["workload"]), hosts=row["hosts"], rate=rate,
                   cpu_quota=quota, note=row.get("note", ""), delay=row.get("delay"))
