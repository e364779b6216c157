"""One switch for the tests that need auto with ``auto.streaming`` to stream whatever this machine measures.

Why one place: the thresholds it zeroes (``STREAMING_HINT`` and, at half the batch, ``STREAMING_HINT_HALF``) and the
look before the first round it turns off are auto's own; three launch scripts each patching them missed the second
threshold once, when it was added.
"""

from __future__ import annotations

import contextlib

from ds_acco.rounds.auto import choice as auto_choice, mode as auto_mode


@contextlib.contextmanager
def forced_streaming(on: bool = True):
    """Auto switches to streaming at its first choice after ``measure_steps`` (not before the first round, where it
    would hang on whether loopback's probe gave a rate); everything put back after, for a pooled worker's next job.
    ``on`` False: a no-op, so a caller's plan can say per case."""
    hints = auto_choice.STREAMING_HINT, auto_choice.STREAMING_HINT_HALF
    look_first = auto_mode.AutoMode.__dict__["look_first"]
    if on:
        auto_choice.STREAMING_HINT = auto_choice.STREAMING_HINT_HALF = 0.0
        auto_mode.AutoMode.look_first = lambda self: False
    try:
        yield
    finally:
        auto_choice.STREAMING_HINT, auto_choice.STREAMING_HINT_HALF = hints
        auto_mode.AutoMode.look_first = look_first
