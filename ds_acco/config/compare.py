"""Whether a saved engine state fits this job, and which fields of the ``"acco"`` block differ.

A resume under a changed block, or ranks started with different blocks, must say *what* differs
(saved vs now, or rank by rank), not two fingerprints.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ds_acco.errors import AccoConfigError


def flatten(tree: Mapping[str, Any], prefix: str) -> dict:
    """``{"prefix.a.b": leaf}`` of a nested mapping."""
    out: dict = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``"acco.policy: saved 'fixed', now 'adaptive'"`` for each field that differs (absent: its default then)."""
    return [f"{k}: saved {saved.get(k)!r}, now {now.get(k)!r}" for k in sorted(set(saved) | set(now))
            if saved.get(k) != now.get(k)]


def rank_differences(blocks: Sequence[Mapping[str, Any]]) -> list[str]:
    """``"acco.policy: rank 0 'fixed', rank 1 'adaptive'"`` for each field on which the ranks disagree."""
    keys = sorted({k for b in blocks for k in b})
    return [f"{k}: " + ", ".join(f"rank {r} {b.get(k)!r}" for r, b in enumerate(blocks)) for k in keys
            if len({repr(b.get(k)) for b in blocks}) > 1]


def carry_on_changes(saved: Mapping[str, Any], identity: Mapping[str, Any], block: Mapping[str, Any],
                     fixed: Sequence[str] = ()) -> list[str]:
    """The ``acco`` fields that differ from a saved state's, when only they differ (``identity``'s other
    entries, world size and layout, equal) and none of them is in ``fixed``: the front end may then carry
    the state on under the new block. Empty: the same block, or a state :func:`check_saved_state_fits`
    must judge (and refuse, naming the fields)."""
    if saved.get("fingerprint") == identity["fingerprint"] or saved.get("block") is None:
        return []
    if any(saved.get(k) != v for k, v in identity.items() if k != "fingerprint"):
        return []
    changed = differences(saved["block"], block)
    return [] if any(line.split(":")[0] in fixed for line in changed) else changed


def check_saved_state_fits(state: Mapping[str, Any], mine: Mapping[str, Any], what: str, advice: str,
                           block: Optional[Mapping[str, Any]] = None) -> None:
    """Raise unless the saved engine ``state`` holds this job's values ``mine`` (config fingerprint, world size,
    buffer sizes, ...); the message says ``what`` was saved ("the ACCO round state") and ends with ``advice``.
    With ``block`` (this job's :meth:`AccoConfig.compared_fields`) and the saved ones (``state["block"]``, saved
    since this release) it names the fields that differ instead of two fingerprints."""
    theirs = {key: state.get(key) for key in mine}
    if theirs == dict(mine):
        return
    named = differences(state["block"], block) if block is not None and state.get("block") is not None else []
    if named:
        rest = {k: (theirs[k], mine[k]) for k in mine if k != "fingerprint" and theirs[k] != mine[k]}
        detail = "; ".join(named + [f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in rest.items()])
    else:
        detail = f"saved {theirs}, now {dict(mine)}"
    raise AccoConfigError(f"{what} in this checkpoint does not fit this job: {detail}. {advice}")


def no_preemption_dir(config, front_end: str):
    """Refuse ``acco.preemption.checkpoint_dir`` where a front end has no checkpoint files to write."""
    folder = config.preemption.checkpoint_dir
    if folder:
        raise AccoConfigError(f"acco.preemption.checkpoint_dir: got {folder!r}; {front_end} writes no checkpoint "
                              "files. Allowed: null (pass on_stop= to save your own state where every rank stops)")
    return config
