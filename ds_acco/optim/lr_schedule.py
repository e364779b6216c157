"""How far a commit moves the learning-rate schedule: one step, or the tokens it committed.

A schedule is written for a token budget: ``S`` optimizer steps of ``G`` micro-batches per worker on ``N`` workers.
Under the fixed policy every commit covers exactly ``G × N`` micro-batches, so one scheduler step per commit is that
budget. Under the adaptive policy a commit covers however many micro-batches the workers finished while the round was in
flight (on a fast link about half of ``G × N``), so stepping once per commit would run the schedule out early. There the
schedule follows tokens: it is at nominal step ``floor(committed micro-batches / (G × N))``, and a commit advances it by
as many steps as it crossed (several, or none). Skipped commits (non-finite gradients) move nothing, as in stock
DeepSpeed.
"""

from __future__ import annotations


class LrScheduleClock:
    """Counts committed micro-batches and says how many scheduler steps each commit earns: one, or with
    ``by_tokens`` (the adaptive policy) as many multiples of ``micro_batches_per_step`` (``G × N``) as it crossed."""

    def __init__(self, micro_batches_per_step: int, by_tokens: bool):
        self.per_step = int(micro_batches_per_step)
        self.by_tokens = by_tokens
        self.committed_micro_batches = 0
        self.nominal_steps = 0

    def advances(self, micro_batches: int) -> int:
        """Scheduler steps due for one applied commit of ``micro_batches`` (all ranks together)."""
        self.committed_micro_batches += int(micro_batches)
        if not self.by_tokens:
            self.nominal_steps += 1
            return 1
        due = self.committed_micro_batches // self.per_step
        steps, self.nominal_steps = due - self.nominal_steps, due
        return steps

    def state_dict(self) -> dict:
        return {"committed_micro_batches": self.committed_micro_batches, "nominal_steps": self.nominal_steps}

    def load_state_dict(self, state: dict | None, commits: int) -> None:
        """Restore; a state saved before this clock existed counts one nominal step per commit."""
        if state is None:
            self.committed_micro_batches, self.nominal_steps = commits * self.per_step, commits
            return
        self.committed_micro_batches = int(state["committed_micro_batches"])
        self.nominal_steps = int(state["nominal_steps"])
