"""The buffers and collective plans one parameter group's rounds need, decided once, in one place.

Every buffer is ``O(P / N)`` but for a rank-major packed group's send and gather buffers (model-sized); the
analytic memory model (``benchmarks``' ``memory``) and tests/test_memory_accounting.py count them to the byte, so a
buffer exists exactly in the case its field says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from ds_acco.comm.chunked_cast import ChunkedCastReduceScatter
from ds_acco.comm.collectives import RoundCollectives
from ds_acco.comm.int8_collectives import Int8DeltaAllGather, Int8ReduceScatter
from ds_acco.config import AccoConfig
from ds_acco.config.names import Kind, Mode
from ds_acco.layout.sharded_group import ShardedGroup


@dataclass(frozen=True)
class CollectivePlan:
    """One group's collectives for one kind of round, chosen once at build: a round runs them without asking."""

    reduce_scatter: Callable[[RoundCollectives, torch.Tensor, bool], None]
    """``(coll, send, acco)``: the sum of every rank's ``send`` into this rank's fp32 shard (``acco``: the round is
    acco's commit, which sends on what an int4 estimate lost)."""
    all_gather: Callable[[RoundCollectives, torch.Tensor, torch.Tensor, torch.Tensor], None]
    """``(coll, full, base, part)``: every rank's new shard ``part`` into ``full`` (a low-bit delta is taken from
    ``base``, the parameters every rank held at launch)."""
    delta: bool  # the all-gather sends a low-bit delta (from fp32 values where any group is narrower)


@dataclass
class KeptEstimate:
    """What an estimate round leaves its commit beyond the kept shards: their micro-batches, any non-finite."""

    count: int = 0
    nonfinite: bool = False


@dataclass
class GroupBuffers:
    """One group's round buffers; ``None`` where the group's case does not need one."""

    shard32: torch.Tensor  # this rank's fp32 gradient shard: the reduce-scatter's sum, then the mean stepped on
    rs_out: torch.Tensor
    """Where the reduce-scatter writes: ``shard32`` itself, or a comm-dtype shard when an fp32/16-bit payload
    other than fp32 is reduced unchunked (then copied into ``shard32``)."""
    comm_scratch: Optional[torch.Tensor]  # packed groups: the rank-major send buffer (the accumulator, cast)
    gather_scratch: Optional[torch.Tensor]
    """Packed groups: the rank-major all-gather output (the send buffer itself when the dtypes agree: it is
    free by then)."""
    cast_rs: Optional[ChunkedCastReduceScatter]  # unpacked groups, payload dtype != accumulator's: cast in chunks
    publish_packed: Optional[torch.Tensor]
    """Packed groups: a packed group's slice of the landing buffer is in another layout than its shard, so it
    publishes into a shard-sized buffer of its own."""
    int8_rs: Optional[Int8ReduceScatter]  # comm_quantization "int8" (with its error-feedback residual)
    kept: Optional[torch.Tensor]  # mode acco: the estimate's reduced shard (see the note in rounds/round_work.py)
    delta_ag: Optional[Int8DeltaAllGather]  # all_gather_quantization other than "none"
    est_rs: Optional[Int8ReduceScatter]  # estimate_quantization "int4": the estimate's reduce-scatter...
    est_ag: Optional[Int8DeltaAllGather]  # ...and all-gather
    est_residual: Optional[torch.Tensor]
    """``estimate_quantization: "int4"``: what this rank's int4 estimate lost (accumulator-sized, in its dtype),
    added to the commit's reduce-scatter input so the commit steps on the full sum."""
    publish32: Optional[torch.Tensor]
    """Int8-delta all-gathers with any group not in fp32: every group publishes fp32 values (the delta is taken
    from the fp32 result, not from its compute-dtype rounding)."""
    plans: dict[str, CollectivePlan] = field(default_factory=dict)  # by kind of round
    gather_compute: Optional[Callable[[RoundCollectives, torch.Tensor, torch.Tensor], None]] = None
    """``(coll, full, part)``: the exact all-gather of every rank's shard into a compute buffer (a packed group's
    through its gather buffer)."""

    @property
    def step_scratch(self) -> Optional[torch.Tensor]:
        """A shard-sized fp32 buffer that nothing reads during the shard step (a delta all-gather's, which it
        fills only after): the optimizer's lookahead and step run over the whole shard in it, in a few
        operations, instead of chunk by chunk in scratch of their own. None without a low-bit all-gather."""
        ag = self.delta_ag if self.delta_ag is not None else self.est_ag
        return None if ag is None else ag.scratch


class RoundBuffers(list):
    """Every group's :class:`GroupBuffers`, in the groups' order, and the state they carry from round to round: the
    kept estimate, what an int4 estimate lost, the int8 residuals (a checkpoint's part: :mod:`ds_acco.rounds.state`)."""

    def __init__(self, buffers: Sequence[GroupBuffers]):
        super().__init__(buffers)
        self.estimate = KeptEstimate()

    def state_dict(self) -> dict:
        lost = [b.est_residual for b in self if b.est_residual is not None]
        return {"kept": [b.kept.clone() for b in self if b.kept is not None], "kept_count": self.estimate.count,
                "kept_nonfinite": self.estimate.nonfinite,
                "estimate_residuals": [t.clone() for t in lost] if any(bool(t.any()) for t in lost) else None,
                "residuals": [b.int8_rs.residual.clone() if b.int8_rs.residual is not None else None for b in self]
                if self[0].int8_rs is not None else None}

    def load_state_dict(self, saved: dict) -> None:
        """Put :meth:`state_dict` back; what it does not hold (or an earlier release did not save) starts at zero."""
        self.reset()
        for b, kept in zip([b for b in self if b.kept is not None], saved["kept"]):
            b.kept.copy_(kept)
        for b, residual in zip([b for b in self if b.est_residual is not None], saved.get("estimate_residuals") or []):
            b.est_residual.copy_(residual)
        for b, residual in zip([b for b in self if b.int8_rs is not None], saved.get("residuals") or []):
            if b.int8_rs.residual is not None and residual is not None:
                b.int8_rs.residual.copy_(residual)
        self.estimate = KeptEstimate(saved["kept_count"], saved["kept_nonfinite"])

    def reset(self) -> None:
        for b in self:
            for t in (b.kept, b.est_residual):
                if t is not None:
                    t.zero_()
            if b.int8_rs is not None:
                b.int8_rs.reset_error_feedback()
        self.estimate = KeptEstimate()


def build_group_buffers(groups: Sequence[ShardedGroup], config: AccoConfig, accum: torch.dtype, comm: torch.dtype,
                        world_size: int, device: torch.device) -> RoundBuffers:
    """Allocate every group's round buffers for this config."""
    int8 = config.comm_quantization == "int8"  # the int8 exchange reads any dtype, sums in fp32
    int4 = config.estimate_quantization == "int4"
    delta = config.all_gather_quantization != "none" or int4
    publish32 = delta and any(g.flat.dtype != torch.float32 for g in groups)
    block = config.quantization_block_size
    out = []
    for g in groups:
        packed = g.packing is not None
        shard32 = torch.zeros(g.layout.shard_numel, dtype=torch.float32, device=device)
        # the chunked cast (comm != accum, unpacked groups) sums into fp32 itself
        rs_out = shard32 if comm == torch.float32 or int8 or (comm != accum and not packed) else torch.empty(
            shard32.numel(), dtype=comm, device=device)
        comm_scratch = g.layout.new_buffer(g.flat, accum if int8 else comm) if packed else None
        out.append(GroupBuffers(
            shard32=shard32,
            rs_out=rs_out,
            comm_scratch=comm_scratch,
            gather_scratch=None if not packed else comm_scratch if comm_scratch.dtype == g.flat.dtype
            else g.layout.new_buffer(g.flat),
            cast_rs=None if comm == accum or int8 or packed else ChunkedCastReduceScatter(
                g.layout.padded_numel, world_size, comm, device),
            publish_packed=torch.empty(g.layout.shard_numel, dtype=g.flat.dtype, device=device) if packed else None,
            int8_rs=Int8ReduceScatter(g.layout.padded_numel, world_size, block_size=block,
                                      error_feedback=config.error_feedback, device=device) if int8 else None,
            kept=torch.zeros_like(shard32) if config.mode in (Mode.ACCO, Mode.AUTO) else None,
            delta_ag=Int8DeltaAllGather(g.layout.shard_numel, world_size, block_size=block, device=device)
            if config.all_gather_quantization != "none" else None,
            est_rs=Int8ReduceScatter(g.layout.padded_numel, world_size, block_size=block, device=device, bits=4)
            if int4 else None,
            est_ag=Int8DeltaAllGather(g.layout.shard_numel, world_size, block_size=block, device=device, bits=4)
            if int4 else None,
            est_residual=torch.zeros(g.layout.padded_numel, dtype=accum, device=device) if int4 else None,
            publish32=torch.empty_like(shard32) if publish32 else None,
        ))
        _plan(g, out[-1], config.all_gather_quantization)
    return RoundBuffers(out)


def _plan(g: ShardedGroup, b: GroupBuffers, all_gather_quantization: str) -> None:
    """Choose group ``g``'s collectives for each kind of round, once (:class:`CollectivePlan`)."""
    def converted(coll, send):  # reduced in the comm dtype, then widened into the fp32 shard
        coll.reduce_scatter_sum(b.rs_out, send)
        b.shard32.copy_(b.rs_out)

    rs = b.int8_rs if b.int8_rs is not None else b.cast_rs
    reduce = (lambda coll, send: rs(coll, b.shard32, send)) if rs is not None else converted \
        if b.rs_out is not b.shard32 else lambda coll, send: coll.reduce_scatter_sum(b.shard32, send)

    def sent_on(coll, send, acco):
        if acco:  # acco's commit: what this rank's int4 estimate lost goes on with the commit's gradients
            send.add_(b.est_residual)
            b.est_residual.zero_()
        reduce(coll, send)

    def gather_compute(coll, full, part):
        if g.packing is None:
            coll.all_gather(full, part)
        else:
            coll.all_gather(b.gather_scratch, part)
            g.packing.unpack(b.gather_scratch, full)

    plain = lambda coll, send, acco: reduce(coll, send)  # noqa: E731
    exact = lambda coll, full, base, part: gather_compute(coll, full, part)  # noqa: E731
    q, int4 = all_gather_quantization, b.est_rs is not None
    b.gather_compute = gather_compute
    delta_ag, est_ag = (b.delta_ag, b.est_ag) if g.packing is None else map(_packed_delta(g, b), (b.delta_ag, b.est_ag))
    b.plans[Kind.COMMIT] = CollectivePlan(sent_on if int4 else plain, delta_ag if q == "int8" else exact, q == "int8")
    b.plans[Kind.ESTIMATE] = CollectivePlan(
        (lambda coll, send, acco: b.est_rs(coll, b.shard32, send, residual_out=b.est_residual)) if int4 else plain,
        est_ag if int4 else delta_ag if q != "none" else exact, int4 or q != "none")


def _packed_delta(g: ShardedGroup, b: GroupBuffers) -> Callable:
    """A low-bit delta all-gather for a rank-major packed group (FSDP2), whose shard ``r`` is not a slice of the
    param-major compute buffers: the delta must be taken against the base in the shard's own (rank-major) layout.

    No buffer of its own: the landing buffer ``full`` holds nothing yet, so the base is packed into it, the delta
    all-gather lands in the gather buffer (free once the reduce-scatter sent), and that is unpacked into ``full``:
    one model-sized copy more than the exact all-gather, bit for bit the values every rank computes alike."""
    def wrap(ag):
        if ag is None:
            return None

        def gather(coll, full, base, part):
            ag(coll, b.gather_scratch, g.packing.pack(base, full), part)
            g.packing.unpack(b.gather_scratch, full)
        return gather
    return wrap


def round_bytes(buffers: Sequence[GroupBuffers], groups: Sequence[ShardedGroup], world_size: int,
                comm: torch.dtype) -> tuple[int, int]:
    """Bytes this rank sends in an estimate round and in a commit round (ring model): ``mode: "auto"`` predicts
    acco's two rounds from a sync round's time with their ratio, and a round's time from a probe of the link
    before any round ran (an estimate without ``estimate_quantization`` is a commit's size)."""
    n = world_size - 1
    commit = 0
    for g, b in zip(groups, buffers):
        commit += b.int8_rs.bytes_per_call if b.int8_rs is not None else \
            n * g.layout.shard_numel * torch.empty(0, dtype=comm).element_size()
        commit += b.delta_ag.bytes_per_call if b.delta_ag is not None else \
            n * g.layout.shard_numel * g.flat.element_size()
    if not buffers or buffers[0].est_rs is None:
        return commit, commit
    return sum(b.est_rs.bytes_per_call + b.est_ag.bytes_per_call for b in buffers), commit
