"""Modes, policies and round kinds as ``str`` enums: each member *is* its string, so JSON, checkpoints and telemetry
hold the strings they always held, while code compares members, which a typo cannot be. A new mode starts here."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """``acco.mode``, and what ``mode: "auto"`` runs now."""

    SYNC = "sync"
    DPU = "dpu"
    ACCO = "acco"
    AUTO = "auto"
    STREAMING = "streaming"


class Policy(StrEnum):
    """``acco.policy``: when an overlapped round ends."""

    FIXED = "fixed"
    ADAPTIVE = "adaptive"
    AUTO = "auto"


class Kind(StrEnum):
    """What a gradient round applies: acco's lookahead (``estimate``) or an optimizer step (``commit``)."""

    ESTIMATE = "estimate"
    COMMIT = "commit"
