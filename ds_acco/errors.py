"""Layer 0: every exception ds_acco raises on purpose, in one place every layer may import.

Each subclasses the built-in a caller would catch anyway (``ValueError``, ``RuntimeError``, ``TimeoutError``,
``SystemExit``), so code written for stock DeepSpeed or FSDP keeps working; the message always names the field, the
value or the file, and what to do. Imports nothing of ds_acco.
"""


class AccoConfigError(ValueError):
    """A value in the ``"acco"`` block is wrong; the message says which and why."""


class AccoRoundError(RuntimeError):
    """A round failed on the communication thread; raised in the training thread."""


class AccoTimeoutError(AccoRoundError, TimeoutError):
    """A round, or the start-up of the process group, did not finish within ``acco.timeout_s``."""


class CheckpointError(RuntimeError):
    """A ds_acco checkpoint failed verification; the message names the files and what to do."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file names a class a load does not unpickle (:mod:`ds_acco.checkpoint.safe_load`; nothing of it
    ran); ``type_name`` is the class (None: unknown)."""

    def __init__(self, path: str, type_name: str | None, detail: str = ""):
        what = f"an object of type {type_name}" if type_name else f"something it cannot unpickle ({detail})"
        super().__init__(f"ds_acco: {path} holds {what}, which a checkpoint load does not unpickle: loading it "
                         "would run code the file names. If the file comes from a source you trust, set "
                         "acco.checkpoint.weights_only: false to load it as torch.load(weights_only=False) would")
        self.type_name = type_name


class CheckpointSaveError(CheckpointError):
    """A save failed on some rank (a full disk, a write error): every rank raises it with the same message, and the
    tag was abandoned (:mod:`ds_acco.checkpoint.save_failure`)."""


class AccoPreempted(SystemExit):
    """Every rank stops at the same round boundary after a SIGTERM; the process exits with ``code``
    (:mod:`ds_acco.comm.stop_signal`)."""
