"""Layer 0: every exception ds_acco raises on purpose, in one place every layer may import.

Each is a subclass of the built-in a caller would catch anyway (``ValueError`` for bad
input, ``RuntimeError`` for a failed round or checkpoint, ``TimeoutError`` for a round
that outlived ``acco.timeout_s``), so code written for stock DeepSpeed or FSDP keeps
working; the message always names the field, the value or the file, and what to do.

Imports nothing of ds_acco.
"""


class AccoConfigError(ValueError):
    """A value in the ``"acco"`` block is wrong; the message says which and why."""


class AccoRoundError(RuntimeError):
    """A round failed on the communication thread; raised in the training thread."""


class AccoTimeoutError(AccoRoundError, TimeoutError):
    """A round, or the start-up of the process group, did not finish within ``acco.timeout_s``."""


class CheckpointError(RuntimeError):
    """A ds_acco checkpoint failed verification; the message names the files and what to do."""
