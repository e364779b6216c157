"""Whether a saved engine state fits this job, and which fields of the ``"acco"`` block differ.

A resume under a changed block, or ranks started with different blocks, must say *what* differs
(saved vs now, or rank by rank), not two fingerprints.
"""

from __future__ import annotations

from typing import Any, Mapping

from ds_acco.errors import AccoConfigError


def check_saved_state_fits(state: Mapping[str, Any], mine: Mapping[str, Any], what: str, advice: str) -> None:
    """Raise unless a saved engine state was written by a job like this one.

    Args:
        state: the saved state dict; holds every key of ``mine``.
        mine: this job's values (config fingerprint, world size, buffer sizes, ...).
        what: what was saved, for the message ("the ACCO round state").
        advice: what the user can do instead.
    """
    theirs = {key: state.get(key) for key in mine}
    if theirs != dict(mine):
        raise AccoConfigError(f"{what} in this checkpoint does not fit this job: saved {theirs}, now {dict(mine)}. "
                              f"{advice}")


def no_preemption_dir(config, front_end: str):
    """Refuse ``acco.preemption.checkpoint_dir`` where a front end has no checkpoint files to write."""
    folder = config.preemption.checkpoint_dir
    if folder:
        raise AccoConfigError(f"acco.preemption.checkpoint_dir: got {folder!r}; {front_end} writes no checkpoint "
                              "files. Allowed: null (pass on_stop= to save your own state where every rank stops)")
    return config
