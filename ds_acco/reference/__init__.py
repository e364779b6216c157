"""Layer 4, reference: the update rules of ``docs/algorithms.md`` as single-process code.

The executable specification the tests compare every engine against: plain tensors, one process, no communication and no
buffer tricks, so that a reader can check it line by line against the rules.

May import: torch only (nothing of ds_acco: the spec must not share a bug with the code).
"""

from ds_acco.reference.rules import ReferenceRun, reference_schedule, reference_trajectory

__all__ = ["ReferenceRun", "reference_schedule", "reference_trajectory"]
