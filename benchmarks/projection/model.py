"""The equations: bytes as ds_acco puts them on the wire, a collective's time on a node's link, each method's step.

Why these terms and no others: a data-parallel step is compute plus whatever of a round compute does not hide, and a
round is bytes over the slowest link it crosses, a latency per algorithm step, and a host and device cost; ACCO and
streaming trade some of that for a convergence penalty, which :mod:`.grid` applies to turn seconds per step into
time to a loss. Everything here is a pure function of its inputs (:mod:`.fit` supplies the constants).

Notation: ``P`` parameters, ``N`` ranks (one per GPU or CPU host), ``g`` ranks per node, ``M = N / g`` nodes,
``c`` a micro-batch's compute, ``G`` micro-batches per rank per step (sync's batch), ``k`` the compute slowdown
with a round in flight, ``B`` a node's link in bytes/s (rate x efficiency / 8), ``a`` the latency per algorithm
step, ``h`` a round's fixed host cost and ``e`` its cost per element of the buffer (on a GPU: the device's passes
over it, bytes per element / HBM bandwidth; on a CPU bed: quantisation, sums and copies on the core).

A collective over a buffer of ``S`` bytes, on one node's link (each direction; nodes hold consecutive ranks):

=====================  ====================================  =========================================
pattern                bytes, ``flat`` (one group: today)    bytes, ``hierarchical`` (what-if)
=====================  ====================================  =========================================
ring (RS or AG)        ``(N-1)/N S``  (one ring edge leaves   ``(M-1)/M S`` (reduced inside the node
                       each node)                             first, over NVLink, left out)
all-to-all             ``g (N-g)/N S`` (every rank's rows     ``(M-1)/M S``
                       for the other nodes' ranks)
replica all-reduce     ``2 (M-1)/M S`` (torchft: each rank all-reduces its ``S/g`` shard over the M replica
                       groups, one per node)
=====================  ====================================  =========================================

and takes ``bytes / B + steps x a`` (ring and all-to-all ``N-1`` steps flat, ``M-1`` hierarchical; all-reduce
``2(M-1)``). What ds_acco runs today (:mod:`ds_acco.comm.collectives`, :mod:`ds_acco.comm.int8_collectives`): one
process group over every rank; an exact reduce-scatter is NCCL's ring (on gloo an all-to-all and a local sum, the
same bytes at ``g = 1``); a low-bit reduce-scatter is an all-to-all of quantised rows (int8 sums cannot be reduced
along a ring); every all-gather is a ring. So on 8-GPU nodes a flat low-bit reduce-scatter puts ``8 (N-8)/N`` of its
buffer on the node's link, 8 times a ring's.

A round: ``R = h + e P_round + sum of its collectives``. Per method (``W = G/2 k c``, half a step's compute):

=========================  =============================================================================
sync fp32                  ``G c + R(fp32 RS ring + fp32 AG ring)``: ZeRO-1, the fair baseline
sync low-bit               ``G c + R(int8 RS all-to-all + int8 delta AG ring)``, error feedback
acco fixed                 ``max(W, R_est) + max(W, R_commit)``: two rounds a step, each under half the
                           compute; estimate int4, commit int8 (the shipped preset)
acco adaptive              each round lands when it is done: a rank computes ``m = ceil(R / (k c))``
                           micro-batches (1 to ``max_micro_batches_per_round``) under it; a commit holds
                           ``m_est + m_commit`` per rank, so its batch follows the link
streaming (ds_acco)        ``G c + e_inner P + (F/H) (max(0, R_frag - tau G c) + (k-1) min(R_frag, tau G c))``:
                           a fragment (``P/F``) every ``H/F`` inner steps, int8 RS all-to-all + bf16 AG,
                           merged ``tau`` steps later; every rank a full replica and inner optimizer
torchft DiLoCo             ``G c + e_inner P/g + R_allreduce(P, fp32) / H``: blocking, replica group = node
torchft Streaming DiLoCo   as streaming, fragments' fp32 replica all-reduce, inner optimizer sharded in the node
=========================  =============================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from ds_acco.numerics.quantization import DEFAULT_BLOCK_SIZE

FLAT, HIERARCHICAL = "flat", "hierarchical"


def wire_bytes(dtype: str, block: int = DEFAULT_BLOCK_SIZE) -> float:
    """Bytes per element on the wire as ds_acco packs it: fp32 4, bf16 2; a low-bit row carries one fp32 scale per
    ``block`` elements beside the payload (1 byte int8, half a byte int4; ``int8_collectives``' wire rows, whose
    padding to 4 bytes is left out)."""
    payload = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
    if dtype not in payload:
        raise ValueError(f"dtype: got {dtype!r}; allowed: {', '.join(payload)}")
    return payload[dtype] + (4.0 / block if dtype in ("int8", "int4") else 0.0)


@dataclass(frozen=True)
class Link:
    """A node's link to the others (each direction) and how the ranks are grouped on it."""

    bit_s: float
    efficiency: float = 1.0
    """The share of ``bit_s`` a collective achieves (fitted on the beds: :mod:`.fit`)."""
    hop_s: float = 0.0
    """Latency per algorithm step (a ring's hop, an all-to-all's exchange)."""
    gpus_per_node: int = 1
    topology: str = FLAT

    @property
    def bytes_s(self) -> float:
        return self.bit_s * self.efficiency / 8


@dataclass(frozen=True)
class Costs:
    """What a round and a step cost beyond the wire and the compute."""

    round_host_s: float = 0.0
    """``h``: a round's fixed cost (launches, the count all-gather, Python)."""
    round_s_per_elem: float = 0.0
    """``e``: a round's cost per element of the model (device passes; on a CPU bed the core's arithmetic)."""
    inner_s_per_elem: float = 0.0
    """A full inner optimizer step per element it updates (streaming's replicas; ZeRO-1's is inside its round)."""
    slowdown: float = 1.0
    """``k``: compute per micro-batch with a round in flight over without one."""


@dataclass(frozen=True)
class Schedule:
    """Streaming's schedule and the adaptive policy's cap: the shipped preset's (``auto_lowbit_streaming.json``)."""

    fragments: int = 4
    sync_every: int = 40
    overlap_steps: int = 2
    max_micro_batches_per_round: int = 16

    @classmethod
    def from_preset(cls, acco: dict) -> "Schedule":
        """The schedule an ``acco`` config block sets (the defaults above are the shipped preset's; a test keeps
        them equal, so the copy cannot drift)."""
        s = acco.get("streaming") or {}
        d = cls()
        return cls(s.get("fragments", d.fragments), s.get("sync_every", d.sync_every),
                   s.get("overlap_steps", d.overlap_steps),
                   acco.get("max_micro_batches_per_round", d.max_micro_batches_per_round))


@dataclass(frozen=True)
class Job:
    """The model and the batch on ``workers`` ranks; ``micro_batch_s`` per rank (one value: all alike)."""

    params: float
    workers: int
    micro_batch_s: tuple
    grad_accum: int

    def c(self, rank: int) -> float:
        return self.micro_batch_s[rank % len(self.micro_batch_s)]

    @property
    def c_max(self) -> float:
        return max(self.micro_batch_s)

    @property
    def compute_s(self) -> float:
        """A step's compute: sync's batch on the slowest rank."""
        return self.grad_accum * self.c_max


@dataclass(frozen=True)
class Step:
    """One method's optimizer step: its seconds, its batch (micro-batches over all ranks) and its rounds."""

    method: str
    seconds: float
    micro_batches: float
    rounds_s: tuple
    node_bytes: float
    """Bytes per step on one node's link (each direction)."""

    @property
    def per_micro_batch(self) -> float:
        return self.seconds / self.micro_batches


def _nodes(n: int, link: Link) -> tuple[int, float]:
    g = max(1, min(link.gpus_per_node, n))
    return g, n / g


def node_bytes(pattern: str, buffer_bytes: float, n: int, link: Link) -> float:
    """Bytes one node's link carries for a collective over ``buffer_bytes`` (the module's table)."""
    g, m = _nodes(n, link)
    if m <= 1:
        return 0.0
    if pattern == "replica_all_reduce":
        return 2 * (m - 1) / m * buffer_bytes
    if pattern not in ("ring", "all_to_all"):
        raise ValueError(f"pattern: got {pattern!r}; allowed: 'ring', 'all_to_all', 'replica_all_reduce'")
    if link.topology == HIERARCHICAL:
        return (m - 1) / m * buffer_bytes
    if link.topology != FLAT:
        raise ValueError(f"topology: got {link.topology!r}; allowed: {FLAT!r}, {HIERARCHICAL!r}")
    return (n - 1) / n * buffer_bytes if pattern == "ring" else g * (n - g) / n * buffer_bytes


def algorithm_steps(pattern: str, n: int, link: Link) -> float:
    g, m = _nodes(n, link)
    if m <= 1:
        return 0.0
    if pattern == "replica_all_reduce":
        return 2 * (m - 1)
    return (m - 1) if link.topology == HIERARCHICAL else (n - 1)


ROUNDS = {
    "fp32": (("ring", "fp32"), ("ring", "fp32")),
    "int8": (("all_to_all", "int8"), ("ring", "int8")),
    "int4": (("all_to_all", "int4"), ("ring", "int4")),
    "fragment": (("all_to_all", "int8"), ("ring", "bf16")),
    "replica_fp32": (("replica_all_reduce", "fp32"),),
}
"""A round's collectives, (pattern, wire dtype): sync fp32, a low-bit commit, an int4 estimate, a streaming fragment
(int8 pseudo-gradients, bf16 all-gather), torchft's fp32 all-reduce of pseudo-gradients."""


def round_node_bytes(kind: str, elements: float, n: int, link: Link) -> float:
    return sum(node_bytes(p, elements * wire_bytes(d), n, link) for p, d in ROUNDS[kind])


def round_s(kind: str, elements: float, n: int, link: Link, costs: Costs) -> float:
    """``R = h + e x elements + sum over the round's collectives of (bytes / B + steps x a)``."""
    wire = sum(node_bytes(p, elements * wire_bytes(d), n, link) / link.bytes_s + algorithm_steps(p, n, link) * link.hop_s
               for p, d in ROUNDS[kind])
    return costs.round_host_s + costs.round_s_per_elem * elements + wire


def rank_bytes(kind: str, elements: float, n: int) -> float:
    """Bytes one rank sends in a round by ds_acco's ring model (``ds_acco.rounds.group_buffers.round_bytes``)."""
    return sum((n - 1) / n * elements * wire_bytes(d) for _, d in ROUNDS[kind])


def sync_step(job: Job, link: Link, costs: Costs, kind: str = "fp32", name: str = "sync_fp32") -> Step:
    r = round_s(kind, job.params, job.workers, link, costs)
    return Step(name, job.compute_s + r, job.workers * job.grad_accum, (r,),
                round_node_bytes(kind, job.params, job.workers, link))


def acco_fixed_step(job: Job, link: Link, costs: Costs) -> Step:
    est, commit = (round_s(k, job.params, job.workers, link, costs) for k in ("int4", "int8"))
    half = job.grad_accum / 2 * costs.slowdown * job.c_max
    return Step("acco_fixed", max(half, est) + max(half, commit), job.workers * job.grad_accum, (est, commit),
                sum(round_node_bytes(k, job.params, job.workers, link) for k in ("int4", "int8")))


def _adaptive_phase(r: float, job: Job, costs: Costs, cap: int) -> tuple[float, float]:
    """(seconds, micro-batches over all ranks) of one adaptive round: the slowest rank computes until the round is
    done, every rank as many micro-batches as fit in that time (at least one, at most ``cap``)."""
    slow = costs.slowdown * job.c_max
    seconds = max(r, min(cap, max(1, math.ceil(r / slow - 1e-9))) * slow)
    counts = [min(cap, max(1, math.ceil(seconds / (costs.slowdown * job.c(i)) - 1e-9))) for i in range(job.workers)]
    return seconds, float(sum(counts))


def acco_adaptive_step(job: Job, link: Link, costs: Costs, schedule: Schedule = Schedule()) -> Step:
    rounds = tuple(round_s(k, job.params, job.workers, link, costs) for k in ("int4", "int8"))
    phases = [_adaptive_phase(r, job, costs, schedule.max_micro_batches_per_round) for r in rounds]
    return Step("acco_adaptive", sum(s for s, _ in phases), sum(m for _, m in phases), rounds,
                sum(round_node_bytes(k, job.params, job.workers, link) for k in ("int4", "int8")))


def streaming_step(job: Job, link: Link, costs: Costs, schedule: Schedule = Schedule(), kind: str = "fragment",
                   inner_shards: int = 1, name: str = "streaming") -> Step:
    """A fragment round every ``H / F`` inner steps, waited for ``tau`` steps after its launch; with ``fragments =
    1`` and ``tau = 0`` DiLoCo's blocking sync every ``H`` steps. ``inner_shards``: the ranks one replica's inner
    optimizer is sharded over (torchft's replica group: a node)."""
    compute = job.compute_s + costs.inner_s_per_elem * job.params / inner_shards
    elements = job.params / schedule.fragments
    r = round_s(kind, elements, job.workers, link, costs)
    hidden = schedule.overlap_steps * job.compute_s
    per_round = max(0.0, r - hidden) + (costs.slowdown - 1) * min(r, hidden)
    every = schedule.sync_every / schedule.fragments
    return Step(name, compute + per_round / every, job.workers * job.grad_accum, (r,),
                round_node_bytes(kind, elements, job.workers, link) / every)


def torchft_steps(job: Job, link: Link, costs: Costs, schedule: Schedule = Schedule()) -> tuple[Step, Step]:
    """torchft DiLoCo (one fragment, no overlap) and Streaming DiLoCo (the same schedule as ds_acco's streaming):
    fp32 pseudo-gradients all-reduced over the replica groups, one per node."""
    g = max(1, min(link.gpus_per_node, job.workers))
    diloco = Schedule(1, schedule.sync_every, 0, schedule.max_micro_batches_per_round)
    return (streaming_step(job, link, costs, diloco, "replica_fp32", g, "torchft_diloco"),
            streaming_step(job, link, costs, schedule, "replica_fp32", g, "torchft_streaming"))


METHODS = ("sync_fp32", "sync_lowbit", "acco_fixed", "acco_adaptive", "streaming", "torchft_diloco",
           "torchft_streaming")
LABELS = {"sync_fp32": "sync fp32", "sync_lowbit": "sync low-bit", "acco_fixed": "acco fixed",
          "acco_adaptive": "acco adaptive", "streaming": "streaming", "torchft_diloco": "torchft DiLoCo",
          "torchft_streaming": "torchft Streaming DiLoCo"}


def steps(job: Job, link: Link, costs: Costs, schedule: Schedule = Schedule(),
          methods: Sequence[str] = METHODS) -> dict[str, Step]:
    """Every method's step for one job on one link."""
    ft = torchft_steps(job, link, costs, schedule)
    make: dict[str, Callable[[], Step]] = {
        "sync_fp32": lambda: sync_step(job, link, costs),
        "sync_lowbit": lambda: sync_step(job, link, costs, "int8", "sync_lowbit"),
        "acco_fixed": lambda: acco_fixed_step(job, link, costs),
        "acco_adaptive": lambda: acco_adaptive_step(job, link, costs, schedule),
        "streaming": lambda: streaming_step(job, link, costs, schedule),
        "torchft_diloco": lambda: ft[0], "torchft_streaming": lambda: ft[1],
    }
    return {m: make[m]() for m in methods}


def state_bytes(method: str, params: float, n: int, gpus_per_node: int) -> float:
    """Bytes of training state per rank (activations left out): ZeRO-1 with bf16 parameters and accumulators (6 P +
    16 P/N; ds_acco sync + 2 P/N, acco + 6 P/N: ``benchmarks.memory.model``); ds_acco streaming holds an fp32
    replica, its gradients and inner Adam (16 P), the fp32 anchor (4 P) and the global shard and outer momentum
    (8 P/N, docs/memory.md); torchft shards a replica's fp32 state and the outer copy over its node (24 P/g)."""
    p = float(params)
    if method in ("torchft_diloco", "torchft_streaming"):
        return 24 * p / max(1, min(gpus_per_node, n))
    if method == "streaming":
        return 20 * p + 8 * p / n
    extra = {"sync_fp32": 2, "sync_lowbit": 2, "acco_fixed": 6, "acco_adaptive": 6}[method]
    return 6 * p + (16 + extra) * p / n
