"""Which fragment synchronises after which inner step: ``t mod H == p * H // P``.

Kept apart from the engine because the tests, the reference rules and the engine all need
the same answer, and it is arithmetic a reader should be able to check at a glance.
"""

from __future__ import annotations

from typing import Optional


def sync_offset(fragment: int, fragments: int, sync_every: int) -> int:
    """``p · H / P`` rounded down: fragment ``p`` syncs at inner steps ``t ≡ offset (mod H)``."""
    return fragment * sync_every // fragments


def sync_fragment(step: int, fragments: int, sync_every: int) -> Optional[int]:
    """The fragment ``p`` with ``step mod H == sync_offset(p, P, H)``, or None (also for ``step < 1``).

    ``step`` is the count of inner steps ``after_inner_step`` has just reached; ``H >= P``, so offsets are distinct.
    """
    if step < 1:
        return None
    r = step % sync_every
    for p in range(fragments):
        if sync_offset(p, fragments, sync_every) == r:
            return p
    return None
